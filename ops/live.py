"""Reading the live store for the ops jobs: the shard indexes, the message files, the
control plane's endpoint names and the router's rejection counts. Read-only, always:
every change to the live store goes through `ops.removal`.

The indexes are read in keyset pages (`MessageIndex.page`), each page its own short
read, so a long job never holds a writer's WAL back. With several index files (one per
shard, and stale ones left from an earlier shard count) the same (id, endpoint) may be
in two of them; the pages are merged in key order and the most advanced state wins, as
`Mailbox.recover` decides between two files of one message.
"""

from __future__ import annotations

import contextlib
import heapq
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import apsw
import pyarrow as pa

from broker.rejections import FILE_NAME as REJECTIONS_FILE
from sdk.paths import Home
from workers.filenames import format_name, parse_name
from workers.index import MessageIndex
from workers.index_sql import COLUMNS
from workers.sqlite import open_db

DAY_MS = 86_400_000
_RANK = {"new": 0, "claimed": 1, "done": 2, "failed": 3}

INDEX_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("endpoint", pa.string()),
        ("subject", pa.string()),
        ("sender", pa.string()),
        ("state", pa.string()),
        ("created_at", pa.int64()),
        ("stored_at", pa.int64()),
        ("claimed_at", pa.int64()),
        ("finished_at", pa.int64()),
        ("reason", pa.string()),
        ("reason_code", pa.string()),
        ("size", pa.int64()),
        ("parent_id", pa.string()),
        ("deliveries", pa.int64()),
    ]
)
assert tuple(INDEX_SCHEMA.names) == COLUMNS
FILE_SCHEMA = INDEX_SCHEMA.append(pa.field("envelope", pa.string()))

REJECTION_SCHEMA = pa.schema(
    [
        ("minute", pa.int64()),
        ("reason", pa.string()),
        ("endpoint", pa.string()),
        ("sender", pa.string()),
        ("count", pa.int64()),
    ]
)


def day_of(ms: int) -> str:
    """The archive partition of a time (UTC day), as Spark's date_format writes it."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def index_paths(home: Home) -> list[Path]:
    """index-<K>.db files, by K."""
    found = []
    for path in home.root.glob("index-*.db"):
        shard = path.stem.removeprefix("index-")
        if shard.isdigit():
            found.append((int(shard), path))
    return [path for _, path in sorted(found)]


@contextlib.contextmanager
def open_indexes(home: Home) -> Iterator[list[MessageIndex]]:
    """Every shard index, read-only; files whose writer has not made the tables yet are
    left out."""
    indexes = []
    try:
        for path in index_paths(home):
            index = MessageIndex(path, readonly=True)
            if index.schema_version == 0:
                index.close()
                continue
            indexes.append(index)
        yield indexes
    finally:
        for index in indexes:
            with contextlib.suppress(apsw.Error):
                index.close()


Page = Callable[[MessageIndex, tuple[str, str], int], list[tuple]]


def _paged(index: MessageIndex, fetch: Page, page_rows: int) -> Iterator[tuple]:
    after = ("", "")
    while True:
        rows = fetch(index, after, page_rows)
        yield from rows
        if len(rows) < page_rows:
            return
        after = (rows[-1][0], rows[-1][1])


def merged_rows(indexes: list[MessageIndex], fetch: Page, page_rows: int = 50_000):
    """Rows of all indexes in (id, endpoint) order, one per key (the most advanced)."""
    streams = [_paged(index, fetch, page_rows) for index in indexes]
    best = None
    for row in heapq.merge(*streams, key=lambda r: (r[0], r[1])):
        if best is not None and (row[0], row[1]) == (best[0], best[1]):
            if _RANK.get(row[4], 0) > _RANK.get(best[4], 0):
                best = row
            continue
        if best is not None:
            yield best
        best = row
    if best is not None:
        yield best


def all_rows(indexes: list[MessageIndex]) -> Iterator[tuple]:
    return merged_rows(indexes, lambda index, after, n: index.page(after, n))


def finished_rows(
    indexes: list[MessageIndex], done_before: int, failed_before: int
) -> Iterator[tuple]:
    """Compaction's candidates: done before ``done_before``, failed before ``failed_before``."""
    return merged_rows(
        indexes, lambda index, after, n: index.finished_page(done_before, failed_before, after, n)
    )


def rows_table(rows: list[tuple], schema: pa.Schema = INDEX_SCHEMA) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.table(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
    )


# ---------------------------------------------------------------------- message files


class FileReader:
    """Reads the files of finished copies for the archive. A done file is found by its
    canonical name from the index (``<id>,C=..[,N=..],D=..:2,S``); cur/ is listed (once per
    endpoint and reader) only when that name misses."""

    def __init__(self, home: Home) -> None:
        self.mailboxes = os.fspath(home.mailboxes)
        self._cur: dict[str, dict[str, str]] = {}

    def read(self, row: tuple) -> bytes | None:
        message_id, endpoint, state = row[0], row[1], row[4]
        base = f"{self.mailboxes}/{endpoint}"
        if state == "failed":
            path = f"{base}/failed/{message_id}"
        else:
            name = format_name(message_id, row[7], row[8], "S", row[13])
            path = f"{base}/cur/{name}"
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            pass
        if state == "failed":
            return None
        name = self._done_names(endpoint).get(message_id)
        if name is None:
            return None
        try:
            with open(f"{base}/cur/{name}", "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _done_names(self, endpoint: str) -> dict[str, str]:
        names = self._cur.get(endpoint)
        if names is None:
            names = {}
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(f"{self.mailboxes}/{endpoint}/cur"):
                    with contextlib.suppress(ValueError):
                        parsed = parse_name(name)
                        if parsed.flags and "S" in parsed.flags:
                            names[parsed.id] = name
            self._cur[endpoint] = names
        return names


# ---------------------------------------------------------------------- control, rejections


def endpoint_subjects(home: Home) -> dict[str, str]:
    """{hash: subject} of the registered endpoints ({} without a control plane)."""
    if not home.control_db.exists():
        return {}
    conn = open_db(home.control_db, readonly=True)
    try:
        return dict(conn.execute("SELECT hash, subject FROM endpoints").fetchall())
    except apsw.SQLError:
        return {}
    finally:
        conn.close()


def rejections_path(home: Home) -> Path:
    return home.root / REJECTIONS_FILE


def read_rejections(home: Home, before_minute: int | None = None) -> list[tuple]:
    """Rows (minute, reason, endpoint, sender, count) of rejections.db, all or those of
    minutes before ``before_minute``."""
    path = rejections_path(home)
    if not path.exists():
        return []
    conn = open_db(path, readonly=True)
    try:
        sql = "SELECT minute, reason, endpoint, sender, count FROM rejections"
        if before_minute is None:
            return conn.execute(sql).fetchall()
        return conn.execute(sql + " WHERE minute < ?", (before_minute,)).fetchall()
    except apsw.SQLError:  # the router has not made the table yet
        return []
    finally:
        conn.close()
