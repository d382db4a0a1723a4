"""The message index: one WAL SQLite file per shard (``index-<K>.db``), derived from
the Maildir.

One row per stored copy of a message, keyed by (id, endpoint): a fan-out copy has the
same id in each endpoint's mailbox. Every column can be recomputed from the files (see
`workers.scan.iter_records`), so `rebuild_from_maildir` into an empty index gives the
same rows as the one the writer kept up to date; tests/test_index.py checks exactly that.

The writer changes the index only through `MessageIndex.write`, one transaction per
group commit (docs/design.md invariant 3: a publish is acknowledged once its file is durable
and its row committed). ``synchronous=NORMAL`` (workers.sqlite) means a power cut can
lose the last transactions; the writer rebuilds the index from the Maildir at start, so
nothing is lost that the Maildir kept. The schema and the SQL: workers/index_sql.py.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable, Sequence

import apsw

from sdk.errors import InvalidMessage, StorageError
from workers.index_sql import (
    ALL,
    CLAIM,
    COLUMNS,
    COUNT_ALL,
    COUNT_BY_STATE,
    COUNT_BY_SUBJECT,
    COUNT_NEW_BY_ENDPOINT,
    COUNT_PUBLISHES,
    DELETE,
    DELETE_ALL,
    DONE,
    FAIL,
    FAIL_SIZED,
    FINISHED_PAGE,
    GET,
    HAS,
    INSERT,
    LIST_INDEXES,
    LOAD,
    LOOKUP,
    MIGRATIONS,
    PAGE,
    QUERY_FILTERS,
    RECENT_PUBLISHES,
    REPLIES,
    REQUEUE,
    SCHEMA_VERSION,
    SELECT_ROWS,
)
from workers.records import MessageRecord, State
from workers.scan import InvalidFile, iter_rows, log_invalid
from workers.sqlite import checkpoint_and_close, migrate, open_db, transaction, user_version

# Page cache of one index connection. The default 2 MiB spills during a rebuild of a
# few tens of thousands of rows (index builds sort); 16 MiB keeps them in memory.
CACHE_KIB = 16 * 1024
MAX_QUERY_LIMIT = 10_000  # rows per page of `query`; a larger limit is cut to this

# A record as its row: a tuple in COLUMNS order.
record_row: Callable[[MessageRecord], tuple] = operator.attrgetter(*COLUMNS)


def _fail_statements(fails: Iterable[tuple]) -> list[tuple[str, list[tuple]]]:
    """The FAIL_SIZED and FAIL rows of `MessageIndex.write`'s ``fails``."""
    sized, unsized = [], []
    for fail in fails:
        i, e, at, reason, code, *rest = fail
        if rest:
            size, n = rest if len(rest) == 2 else (rest[0], 0)
            sized.append((at, reason, code, n, size, i, e))
        else:
            unsized.append((at, reason, code, 0, i, e))
    return [(sql, rows) for sql, rows in ((FAIL_SIZED, sized), (FAIL, unsized)) if rows]


def _record(row: Sequence) -> MessageRecord:
    return MessageRecord(
        row[0],
        row[1],
        row[2],
        row[3],
        State(row[4]),
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
    )


def _state_name(state: State | str) -> str:
    try:
        return str(State(state))
    except ValueError:
        raise InvalidMessage(
            f"state must be one of {', '.join(State)}, got {state!r:.40}"
        ) from None


def encode_cursor(message_id: str, endpoint: str) -> str:
    """The page cursor after the row (id, endpoint): ``"<id>:<endpoint>"``."""
    return f"{message_id}:{endpoint}"


def decode_cursor(cursor: str) -> tuple[str, str]:
    message_id, sep, endpoint = cursor.partition(":") if isinstance(cursor, str) else ("", "", "")
    if not sep or not message_id or not endpoint:
        raise InvalidMessage(f"cursor {cursor!r:.60} is not '<id>:<endpoint>'")
    return message_id, endpoint


class MessageIndex:
    """One shard's index. Not shared between threads; one writer, any number of readers
    (other processes, ``readonly=True``)."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.path = os.fspath(path)
        self.readonly = readonly
        try:
            self._conn = open_db(self.path, readonly=readonly)
            # One cursor for every group commit's statements, BEGIN and COMMIT with
            # them: ``Connection.execute`` and ``cursor()`` make a cursor each call, and
            # a cursor made and freed costs about as much as the row it writes
            # (docs/performance.md, "The writer's commit, function by function").
            self._cursor = self._conn.cursor()
            self._conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            if not readonly:
                migrate(self._conn, MIGRATIONS)
        except apsw.Error as exc:
            raise StorageError(f"cannot open index {self.path}: {exc}") from exc
        version = user_version(self._conn)
        if version > SCHEMA_VERSION:
            self._conn.close()
            raise StorageError(
                f"index {self.path} has schema version {version}, newer than this "
                f"Relay's {SCHEMA_VERSION}"
            )

    def __enter__(self) -> MessageIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return user_version(self._conn)

    # ----------------------------------------------------------------- writes

    def write(
        self,
        inserts: Iterable[MessageRecord] = (),
        claims: Iterable[tuple[str, str, int, int]] = (),
        dones: Iterable[tuple[str, str, int]] = (),
        fails: Iterable[tuple] = (),
        requeues: Iterable[tuple[str, str]] = (),
        deletes: Iterable[tuple[str, str]] = (),
        rows: Sequence[Sequence] = (),
    ) -> None:
        """Apply one group commit in ONE transaction, in this order: inserts, claims,
        dones, fails, requeues, deletes (a batch that moves one message twice must
        list its changes so that this order is right, or be split).

        - inserts: MessageRecord (an existing (id, endpoint) row is replaced); rows:
          more inserts, as tuples in COLUMNS order (`record_row`), which is how the
          writer builds its deliveries' rows: no record object per copy
        - claims: (id, endpoint, claimed_at, deliveries): deliveries counts this
          hand-out (1 the first time); dones: (id, endpoint, done_at), the count kept
        - fails: (id, endpoint, failed_at, reason, code[, size[, deliveries]]); size is
          the dead letter's file size that `Mailbox.fail` returns; without it the row
          keeps the old size and differs from a rebuilt one; deliveries is what the
          file's deadLetter records (0, the default, when it records none)
        - requeues, deletes: (id, endpoint); a requeued row counts 0 hand-outs
        """
        # Only the statements that have rows: a group commit holds one or two kinds,
        # and an executemany over nothing still looks its statement up.
        statements: list[tuple[str, Iterable[Sequence]]] = []
        if records := [record_row(record) for record in inserts]:
            statements.append((INSERT, records))
        if rows:
            statements.append((INSERT, rows))
        if claims := [(c, n, i, e) for i, e, c, n in claims]:
            statements.append((CLAIM, claims))
        if dones := [(d, i, e) for i, e, d in dones]:
            statements.append((DONE, dones))
        if fails:
            statements.extend(_fail_statements(fails))
        if requeues := list(requeues):
            statements.append((REQUEUE, requeues))
        if deletes := list(deletes):
            statements.append((DELETE, deletes))
        cursor = self._cursor
        try:
            with transaction(cursor):
                for sql, changed in statements:
                    cursor.executemany(sql, changed)
        except apsw.Error as exc:
            raise StorageError(f"index write failed: {exc}") from exc

    def delete(self, keys: Iterable[tuple[str, str]]) -> int:
        """Remove rows by (id, endpoint); returns how many existed."""
        return self._changing(DELETE, keys)

    def delete_finished_before(
        self, before_ms: int, states: Iterable[State | str] = (State.DONE, State.FAILED)
    ) -> int:
        """Remove finished rows (done/failed by default) whose finished_at < before_ms."""
        wanted = sorted({_state_name(s) for s in states})
        if not wanted:
            return 0
        sql = (
            f"DELETE FROM messages WHERE state IN ({', '.join('?' * len(wanted))}) "
            "AND finished_at < ?"
        )
        return self._changing(sql, [(*wanted, before_ms)])

    def _changing(self, sql: str, rows: Iterable[Sequence]) -> int:
        try:
            with transaction(self._conn):
                before = self._conn.total_changes()
                self._conn.cursor().executemany(sql, rows)
                return self._conn.total_changes() - before
        except apsw.Error as exc:
            raise StorageError(f"index write failed: {exc}") from exc

    def rebuild(self, records: Iterable[MessageRecord]) -> int:
        """Replace every row by ``records`` in one transaction; returns the row count.

        Readers see the old rows until the commit, then the new ones: never a half
        index. The secondary indexes are dropped for the load and built again after
        it, from whatever the schema holds now: building an index over loaded rows is
        about twice as fast as keeping it up to date row by row (bench_storage,
        "rebuild").
        """
        # map, not a generator expression: mypyc builds those at once, and a failure
        # while reading the records must come inside the rebuild's transaction.
        return self.rebuild_rows(map(record_row, records))

    def rebuild_rows(self, rows: Iterable[Sequence]) -> int:
        """`rebuild` from tuples in COLUMNS order (what `scan.iter_rows` yields)."""
        count = 0

        def counted() -> Iterable[Sequence]:
            nonlocal count
            for row in rows:
                count += 1
                yield row

        try:
            with transaction(self._conn):
                indexes = self._conn.execute(LIST_INDEXES).fetchall()
                for name, _ in indexes:
                    self._conn.execute(f'DROP INDEX "{name}"')
                self._conn.execute(DELETE_ALL)
                self._conn.cursor().executemany(LOAD, counted())
                for _, sql in indexes:
                    self._conn.execute(sql)
        except apsw.Error as exc:
            raise StorageError(f"index rebuild failed: {exc}") from exc
        return count

    # ----------------------------------------------------------------- reads

    def get(self, message_id: str) -> list[MessageRecord]:
        """Every stored copy of one message (one per endpoint), by endpoint."""
        return [_record(row) for row in self._conn.execute(GET, (message_id,))]

    def replies_to(self, message_id: str, limit: int = 100) -> list[MessageRecord]:
        """The copies of the messages that answer ``message_id`` (their parentId)."""
        return [_record(row) for row in self._conn.execute(REPLIES, (message_id, limit))]

    def has(self, message_id: str, endpoint: str) -> bool:
        return self._conn.execute(HAS, (message_id, endpoint)).fetchone() is not None

    def query(
        self,
        *,
        subject: str | None = None,
        endpoint: str | None = None,
        sender: str | None = None,
        state: State | str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> tuple[list[MessageRecord], str | None]:
        """One page of rows in (id, endpoint) order, and the cursor of the next page.

        ``since``/``until`` bound created_at (unix ms, until exclusive); ``after`` is the
        cursor a previous page returned; ``limit`` is cut to MAX_QUERY_LIMIT. The cursor
        is None on the last page.
        """
        if not isinstance(limit, int) or limit < 1:
            raise InvalidMessage(f"limit must be a positive integer, got {limit!r}")
        limit = min(limit, MAX_QUERY_LIMIT)
        given = {
            "subject": subject,
            "endpoint": endpoint,
            "sender": sender,
            "state": None if state is None else _state_name(state),
            "since": since,
            "until": until,
        }
        where, params = [], []
        for name, fragment in QUERY_FILTERS:
            if given[name] is not None:
                where.append(fragment)
                params.append(given[name])
        if after is not None:
            where.append("(id, endpoint) > (?, ?)")
            params.extend(decode_cursor(after))
        sql = SELECT_ROWS
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id, endpoint LIMIT ?"
        params.append(limit + 1)
        rows = [_record(row) for row in self._conn.execute(sql, params)]
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        return rows, encode_cursor(rows[-1].id, rows[-1].endpoint)

    def all_records(self) -> list[MessageRecord]:
        """Every row, in (id, endpoint) order (for comparisons and tests)."""
        return [_record(row) for row in self._conn.execute(ALL)]

    def count(self, *, endpoint: str | None = None, state: State | str | None = None) -> int:
        """How many rows match (all when no filter): a dead-letter count, a depth."""
        where, params = [], []
        if endpoint is not None:
            where.append("endpoint = ?")
            params.append(endpoint)
        if state is not None:
            where.append("state = ?")
            params.append(_state_name(state))
        sql = COUNT_ALL + (" WHERE " + " AND ".join(where) if where else "")
        return self._conn.execute(sql, params).fetchone()[0]

    def count_new_by_endpoint(self) -> dict[str, int]:
        """Mailbox depth (messages in new/) per endpoint: the router's backpressure seed."""
        return dict(self._conn.execute(COUNT_NEW_BY_ENDPOINT).fetchall())

    def count_publishes(self, sender: str, since_ms: int) -> int:
        """How many publishes ``sender`` made since ``since_ms`` that stored something.

        One per message id however many endpoints it fanned out to; dead letters made
        at publish time (no match, access, budget) are not counted, later consumer
        failures are (the publish was delivered).
        """
        return self._conn.execute(COUNT_PUBLISHES, (sender, since_ms)).fetchone()[0]

    def recent_publishes(self, since_ms: int) -> list[tuple[str, str, int]]:
        """(id, sender, created_at) of every counted publish since ``since_ms``."""
        return self._conn.execute(RECENT_PUBLISHES, (since_ms,)).fetchall()

    def metrics(self) -> dict:
        """``{"total": n, "by_state": {state: n}, "by_subject": {subject: n}}``."""
        by_state = {str(s): 0 for s in State}
        by_state.update(self._conn.execute(COUNT_BY_STATE).fetchall())
        return {
            "total": self._conn.execute(COUNT_ALL).fetchone()[0],
            "by_state": by_state,
            "by_subject": dict(self._conn.execute(COUNT_BY_SUBJECT).fetchall()),
        }

    # ----------------------------------------------------------------- ops (compaction, metrics)

    def lookup(self, message_id: str, endpoint: str) -> MessageRecord | None:
        """The row of one copy, or None."""
        row = self._conn.execute(LOOKUP, (message_id, endpoint)).fetchone()
        return None if row is None else _record(row)

    def page(self, after: tuple[str, str] = ("", ""), limit: int = 50_000) -> list[tuple]:
        """Up to ``limit`` rows (tuples in COLUMNS order) after the key ``after``, in
        (id, endpoint) order. Each page is its own short read, so a reader paging through
        a large index never holds the writer's WAL back for the whole scan."""
        return self._conn.execute(PAGE, (*after, limit)).fetchall()

    def finished_page(
        self,
        done_before: int,
        failed_before: int,
        after: tuple[str, str] = ("", ""),
        limit: int = 50_000,
    ) -> list[tuple]:
        """`page` restricted to compaction's candidates: done copies finished before
        ``done_before`` and dead letters failed before ``failed_before`` (unix ms)."""
        return self._conn.execute(
            FINISHED_PAGE, (done_before, failed_before, *after, limit)
        ).fetchall()

    def compact_storage(self, vacuum_min_free_pages: int) -> dict[str, int | bool]:
        """After compaction deleted rows: checkpoint the WAL into the file (TRUNCATE) and,
        when at least ``vacuum_min_free_pages`` pages are free, VACUUM to give them back
        to the filesystem. VACUUM rewrites the live rows (the writer waits meanwhile), so
        it is worth it only past a threshold. Returns the page counts before and after."""
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = self._conn.execute("PRAGMA page_count").fetchone()[0]
            free = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
            vacuumed = free > 0 and free >= vacuum_min_free_pages
            if vacuumed:
                self._conn.execute("VACUUM")
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            after = self._conn.execute("PRAGMA page_count").fetchone()[0]
        except apsw.Error as exc:
            raise StorageError(f"index checkpoint/vacuum failed: {exc}") from exc
        return {"pages": pages, "freePages": free, "vacuumed": vacuumed, "pagesAfter": after}

    # ----------------------------------------------------------------- lifecycle

    def checkpoint(self) -> None:
        """Fold what the WAL holds into the database file without waiting for readers."""
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def close(self) -> None:
        """Checkpoint (TRUNCATE) and close: a clean stop leaves one file. A reader only
        closes: it cannot checkpoint (SQLite refuses, after ~0.25 ms of trying)."""
        if self.readonly:
            self._conn.close()
        else:
            checkpoint_and_close(self._conn)


def rebuild_from_maildir(
    index: MessageIndex,
    mailboxes_root: str | os.PathLike[str],
    endpoints: Iterable[str] | None = None,
    on_invalid: Callable[[InvalidFile], None] | None = log_invalid,
) -> int:
    """Replace the index's rows by a scan of the given mailboxes (all when None).

    Run `Mailbox.recover` on each first, so that no message is seen in two states.
    Returns the number of rows. Files that are not messages go to ``on_invalid``.
    """
    return index.rebuild_rows(iter_rows(mailboxes_root, endpoints, on_invalid))
