"""The message index on real SQLite files: group-commit writes, lookups, pages, counts,
migrations, and the invariant that holds the design together: an index rebuilt from the
Maildir equals the one the writer kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import apsw
import pytest

from sdk.errors import InvalidMessage, StorageError
from sdk.ids import new_id
from workers.filenames import format_name, parse_name
from workers.group_commit import deliver_batch
from workers.index import MessageIndex, rebuild_from_maildir
from workers.index_sql import COLUMNS, MIGRATIONS, SCHEMA_VERSION
from workers.maildir import Mailbox
from workers.records import MessageRecord, State
from workers.scan import ScanRow
from workers.sqlite import migrate, open_db

NOW = 1_764_108_000_000


def record(
    message_id: str | None = None,
    endpoint: str = "aaaaaaaaaaaa",
    *,
    subject: str = "relay.agent.p.backend",
    sender: str = "relay.agent.p.frontend",
    state: State = State.NEW,
    created_at: int = NOW,
    **fields,
) -> MessageRecord:
    return MessageRecord(
        message_id or new_id(),
        endpoint,
        subject,
        sender,
        state,
        created_at,
        fields.pop("stored_at", created_at + 1),
        size=fields.pop("size", 100),
        **fields,
    )


@pytest.fixture
def index(tmp_path: Path):
    idx = MessageIndex(tmp_path / "index-0.db")
    yield idx
    idx.close()


# --------------------------------------------------------------------------- writes, get


def test_write_inserts_rows_and_get_returns_each_fan_out_copy(index: MessageIndex) -> None:
    message_id = new_id()
    copies = [record(message_id, endpoint) for endpoint in ("bbbbbbbbbbbb", "aaaaaaaaaaaa")]
    index.write(inserts=copies)
    assert index.get(message_id) == sorted(copies, key=lambda r: r.endpoint)
    assert index.has(message_id, "aaaaaaaaaaaa")
    assert not index.has(message_id, "cccccccccccc")
    assert index.get(new_id()) == []


def test_claims_dones_fails_and_requeues_move_rows_through_their_states(
    index: MessageIndex,
) -> None:
    a, b, c, d = (record() for _ in range(4))
    index.write(inserts=[a, b, c, d])
    index.write(
        claims=[
            (a.id, a.endpoint, NOW + 1, 2),
            (b.id, b.endpoint, NOW + 2, 1),
            (d.id, d.endpoint, NOW + 3, 1),
        ]
    )
    [ra] = index.get(a.id)
    assert (ra.state, ra.claimed_at, ra.deliveries) == (State.CLAIMED, NOW + 1, 2)
    index.write(
        dones=[(a.id, a.endpoint, NOW + 5)],
        fails=[(b.id, b.endpoint, NOW + 6, "handler raised", "nack", 321, 1)],
        requeues=[(d.id, d.endpoint)],
    )
    index.write(fails=[(c.id, c.endpoint, NOW + 7, "expired", "ttl")])  # no size: kept
    [ra], [rb], [rc], [rd] = (index.get(r.id) for r in (a, b, c, d))
    assert (ra.state, ra.claimed_at, ra.finished_at) == (State.DONE, NOW + 1, NOW + 5)
    assert ra.deliveries == 2  # done keeps the count of the claim it finished
    # a failed row keeps its claim time, as the dead letter's file does, and the
    # hand-outs its deadLetter says (none when not given)
    assert rb == record(
        b.id,
        state=State.FAILED,
        claimed_at=NOW + 2,
        finished_at=NOW + 6,
        reason="handler raised",
        reason_code="nack",
        size=321,
        deliveries=1,
    )
    assert (rc.state, rc.reason_code, rc.size, rc.deliveries) == (State.FAILED, "ttl", 100, 0)
    # back in new/: handed out to nobody now (deliveries_of("new", ...) is 0)
    assert (rd.state, rd.claimed_at, rd.deliveries) == (State.NEW, None, 0)


def test_a_row_keeps_the_parent_id_it_was_inserted_with(index: MessageIndex) -> None:
    parent = new_id()
    reply, other = record(parent_id=parent), record()
    index.write(inserts=[reply, other])
    assert index.get(reply.id)[0].parent_id == parent
    assert index.get(other.id)[0].parent_id is None


def test_a_group_commit_is_one_transaction(index: MessageIndex) -> None:
    kept = record()
    index.write(inserts=[kept])
    # Given a batch whose last row breaks a constraint
    good = record()
    bad = record(state="lost")  # type: ignore[arg-type]
    # When it is written, Then nothing of it is, not even the rows before the bad one
    with pytest.raises(StorageError):
        index.write(inserts=[good, bad], claims=[(kept.id, kept.endpoint, NOW, 1)])
    assert index.all_records() == [kept]


def test_delete_and_delete_finished_before(index: MessageIndex) -> None:
    old_done = record(state=State.DONE, claimed_at=NOW, finished_at=NOW + 10)
    new_done = record(state=State.DONE, claimed_at=NOW, finished_at=NOW + 1000)
    old_failed = record(state=State.FAILED, finished_at=NOW + 10, reason="r", reason_code="c")
    pending = record(state=State.CLAIMED, claimed_at=NOW)
    fresh = record()
    index.write(inserts=[old_done, new_done, old_failed, pending, fresh])
    assert index.delete_finished_before(NOW + 500, states=[State.DONE]) == 1
    assert index.delete_finished_before(NOW + 500) == 1
    assert index.delete([(fresh.id, fresh.endpoint), (new_id(), "zzzzzzzzzzzz")]) == 1
    assert [r.id for r in index.all_records()] == sorted([new_done.id, pending.id])


# --------------------------------------------------------------------------- queries


def test_query_pages_through_every_row_in_id_order(index: MessageIndex) -> None:
    rows = [record(endpoint=e) for _ in range(125) for e in ("aaaaaaaaaaaa", "bbbbbbbbbbbb")]
    index.write(inserts=rows)
    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = index.query(limit=100, after=cursor)
        seen.extend(page)
        pages += 1
        if cursor is None:
            break
    assert pages == 3
    assert seen == sorted(rows, key=lambda r: (r.id, r.endpoint)) == index.all_records()


def test_query_filters_combine_with_pagination(index: MessageIndex) -> None:
    rows = []
    for i in range(60):
        rows.append(
            record(
                endpoint=("aaaaaaaaaaaa", "bbbbbbbbbbbb")[i % 2],
                subject=f"relay.s{i % 3}",
                sender=f"relay.f{i % 4}",
                state=(State.NEW, State.CLAIMED)[i % 5 == 0],
                claimed_at=NOW if i % 5 == 0 else None,
                created_at=NOW + i,
            )
        )
    index.write(inserts=rows)
    filters = {
        "subject": "relay.s1",
        "endpoint": "bbbbbbbbbbbb",
        "sender": "relay.f1",
        "state": State.CLAIMED,
        "since": NOW + 10,
        "until": NOW + 50,
    }
    checks = {
        "subject": lambda r: r.subject == "relay.s1",
        "endpoint": lambda r: r.endpoint == "bbbbbbbbbbbb",
        "sender": lambda r: r.sender == "relay.f1",
        "state": lambda r: r.state is State.CLAIMED,
        "since": lambda r: r.created_at >= NOW + 10,
        "until": lambda r: r.created_at < NOW + 50,
    }
    ordered = sorted(rows, key=lambda r: (r.id, r.endpoint))
    for name, value in filters.items():
        expected = [r for r in ordered if checks[name](r)]
        got, cursor = [], None
        while True:
            page, cursor = index.query(**{name: value}, limit=7, after=cursor)
            got.extend(page)
            if cursor is None:
                break
        assert got == expected, name
    page, _ = index.query(endpoint="aaaaaaaaaaaa", sender="relay.f2", state="new")
    assert page == [
        r
        for r in ordered
        if r.endpoint == "aaaaaaaaaaaa" and r.sender == "relay.f2" and r.state is State.NEW
    ]


@pytest.mark.parametrize(
    "kwargs",
    [{"limit": 0}, {"after": "no-colon"}, {"after": ":aaaaaaaaaaaa"}, {"state": "lost"}],
    ids=["zero-limit", "cursor-without-colon", "cursor-without-id", "unknown-state"],
)
def test_query_rejects_bad_arguments(index: MessageIndex, kwargs: dict) -> None:
    with pytest.raises(InvalidMessage):
        index.query(**kwargs)


def test_count_new_by_endpoint_counts_only_new_rows(index: MessageIndex) -> None:
    index.write(
        inserts=[
            record(endpoint="aaaaaaaaaaaa"),
            record(endpoint="aaaaaaaaaaaa"),
            record(endpoint="aaaaaaaaaaaa", state=State.CLAIMED, claimed_at=NOW),
            record(endpoint="bbbbbbbbbbbb"),
            record(endpoint="cccccccccccc", state=State.DONE, claimed_at=NOW, finished_at=NOW),
        ]
    )
    assert index.count_new_by_endpoint() == {"aaaaaaaaaaaa": 2, "bbbbbbbbbbbb": 1}
    assert index.count(endpoint="aaaaaaaaaaaa", state="new") == 2
    assert index.count(state=State.DONE) == 1
    assert index.count() == 5


def test_count_publishes_counts_a_fan_out_once_and_skips_dead_letters(
    index: MessageIndex,
) -> None:
    # Given one publish fanned out to three endpoints, one publish that only
    # dead-lettered, an older publish, and another sender's publish
    fan_out = new_id()
    dead = new_id()
    index.write(
        inserts=[
            *(record(fan_out, e, sender="relay.alice") for e in ("a" * 12, "b" * 12, "c" * 12)),
            record(
                dead,
                "_unroutable",
                sender="relay.alice",
                state=State.FAILED,
                finished_at=NOW,
                reason="no endpoint matched",
                reason_code="no_match",
            ),
            record(sender="relay.alice", created_at=NOW - 60_000),
            record(sender="relay.bob"),
        ]
    )
    # Then alice made one publish in the window, two counting the older one
    assert index.count_publishes("relay.alice", NOW - 1000) == 1
    assert index.count_publishes("relay.alice", NOW - 60_000) == 2
    assert index.count_publishes("relay.bob", NOW - 1000) == 1
    assert index.count_publishes("relay.carol", 0) == 0


def test_metrics_count_by_state_and_subject(index: MessageIndex) -> None:
    index.write(
        inserts=[
            record(subject="relay.a"),
            record(subject="relay.a", state=State.CLAIMED, claimed_at=NOW),
            record(
                subject="relay.b", state=State.FAILED, finished_at=NOW, reason="r", reason_code="c"
            ),
        ]
    )
    assert index.metrics() == {
        "total": 3,
        "by_state": {"new": 1, "claimed": 1, "done": 0, "failed": 1},
        "by_subject": {"relay.a": 2, "relay.b": 1},
    }


# --------------------------------------------------------------------------- lifecycle


def test_a_fresh_index_is_migrated_and_a_reopened_one_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "index-3.db"
    with MessageIndex(path) as index:
        assert index.schema_version == SCHEMA_VERSION
        row = record()
        index.write(inserts=[row])
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
    # close() checkpointed: the WAL is folded into the database file
    assert not os.path.exists(f"{path}-wal") or os.path.getsize(f"{path}-wal") == 0
    with MessageIndex(path) as index:
        assert index.schema_version == SCHEMA_VERSION
        assert index.all_records() == [row]
        names = {
            name
            for (name,) in index._conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'index'"
            )
        }
        assert {"messages_endpoint_state", "messages_subject"} <= names


def test_a_version_1_index_gains_parent_id_and_deliveries_agreeing_with_its_files(
    tmp_path: Path,
) -> None:
    # Given an index written by a Relay before parentId and deliveries were kept
    path = tmp_path / "index-0.db"
    conn = open_db(path)
    migrate(conn, MIGRATIONS[:1])
    waiting, claimed, done = (
        record(),
        record(state=State.CLAIMED, claimed_at=NOW),
        record(state=State.DONE, claimed_at=NOW, finished_at=NOW + 1),
    )
    for row in (waiting, claimed, done):
        conn.execute(
            f"INSERT INTO messages VALUES ({', '.join('?' * 12)})",
            dataclasses.astuple(row)[:12],
        )
    conn.close()
    # When this Relay opens it
    with MessageIndex(path) as index:
        # Then it is migrated, and each row counts what its file says: a file in cur/
        # was handed out once (no N= then), one in new/ never; no file had a parentId
        assert index.schema_version == SCHEMA_VERSION == 3
        rows = {r.id: r for r in index.all_records()}
        assert rows[waiting.id] == waiting
        assert rows[claimed.id] == dataclasses.replace(claimed, deliveries=1)
        assert rows[done.id] == dataclasses.replace(done, deliveries=1)


def test_an_index_from_a_newer_relay_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "index-0.db"
    MessageIndex(path).close()
    conn = open_db(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StorageError, match="newer"):
        MessageIndex(path)


def test_a_reader_sees_the_writers_commits(tmp_path: Path) -> None:
    path = tmp_path / "index-0.db"
    with MessageIndex(path) as writer:
        reader = MessageIndex(path, readonly=True)
        row = record()
        writer.write(inserts=[row])
        assert reader.get(row.id) == [row]
        with pytest.raises(StorageError):
            reader.write(inserts=[record()])
        reader._conn.close()


def test_rebuild_replaces_every_row_and_keeps_the_indexes(index: MessageIndex) -> None:
    index.write(inserts=[record() for _ in range(5)])
    fresh = [record() for _ in range(3)]
    assert index.rebuild(fresh) == 3
    assert index.all_records() == sorted(fresh, key=lambda r: r.id)
    plan = index._conn.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM messages WHERE subject = ? ORDER BY id", ("x",)
    ).fetchall()
    assert any("messages_subject" in str(step) for step in plan)


def test_a_failed_rebuild_leaves_the_old_rows(index: MessageIndex) -> None:
    old = [record() for _ in range(3)]
    index.write(inserts=old)

    def broken():
        yield record()
        raise apsw.IOError("disk went away")

    with pytest.raises(StorageError):
        index.rebuild(broken())
    assert index.all_records() == old


# --------------------------------------------------------------------------- rebuild equality


def envelope(message_id: str, subject: str, sender: str, created_at: int, **extra) -> bytes:
    return json.dumps(
        {
            "id": message_id,
            "subject": subject,
            "from": sender,
            "replyTo": None,
            "createdAt": created_at,
            "budget": {"hopCount": 0, "maxHops": 5, "ancestorChain": [], "ttl": 0},
            "payload": {"content": "hi " * (len(message_id) % 7)},
            **extra,
        }
    ).encode()


def test_an_index_rebuilt_from_the_maildir_equals_the_one_the_writer_kept(
    tmp_path: Path,
) -> None:
    # Given a writer-like workload applied to both the Maildir and the index
    mailboxes = tmp_path / "mailboxes"
    endpoints = ["0a0a0a0a0a0a", "1b1b1b1b1b1b", "2c2c2c2c2c2c", "_unroutable"]
    boxes = {e: Mailbox.at(mailboxes, e) for e in endpoints}
    for box in boxes.values():
        box.create()
    index = MessageIndex(tmp_path / "index-0.db")
    delivered: list[tuple[str, str]] = []
    parents: list[str] = []  # ids published so far: a later one may answer one
    for batch in range(4):
        items, inserts = [], []
        for n in range(25):
            message_id = new_id()
            created = NOW + batch * 100 + n
            sender = f"relay.sender{n % 3}"
            if n % 12 == 11:  # routed nowhere: a dead letter built by the router
                dead = ("_unroutable", "relay.nobody", "no endpoint matched", "no_match", 0)
            elif n % 12 == 7:  # a consumer's dead letter, written whole (handed out twice)
                dead = (
                    endpoints[0],
                    f"relay.agent.{endpoints[0]}",
                    "died twice",
                    "max_deliveries",
                    2,
                )
            else:
                dead = None
            if dead is not None:
                endpoint, subject, reason, code, deliveries = dead
                letter = {"reason": reason, "code": code, "failedAt": created + 1}
                letter |= {"endpoint": endpoint} | (
                    {"deliveries": deliveries} if deliveries else {}
                )
                data = envelope(message_id, subject, sender, created, deadLetter=letter)
                items.append((boxes[endpoint], message_id, data, "failed"))
                inserts.append(
                    MessageRecord(
                        message_id,
                        endpoint,
                        subject,
                        sender,
                        State.FAILED,
                        created,
                        0,
                        finished_at=created + 1,
                        reason=reason,
                        reason_code=code,
                        size=len(data),
                        deliveries=deliveries,
                    )
                )
                continue
            parent = parents[-1] if n % 4 == 1 and parents else None
            parents.append(message_id)
            for endpoint in endpoints[: 1 + n % 3]:  # fan-out to 1..3 endpoints
                subject = f"relay.agent.{endpoint}"
                extra = {} if parent is None else {"parentId": parent}
                data = envelope(message_id, subject, sender, created, **extra)
                items.append((boxes[endpoint], message_id, data, "new"))
                inserts.append(
                    MessageRecord(
                        message_id,
                        endpoint,
                        subject,
                        sender,
                        State.NEW,
                        created,
                        0,
                        size=len(data),
                        parent_id=parent,
                    )
                )
                delivered.append((message_id, endpoint))
        results = deliver_batch(items)
        assert all(isinstance(r, int) for r in results)
        index.write(
            inserts=[
                dataclasses.replace(r, stored_at=stored_at)
                for r, stored_at in zip(inserts, results, strict=True)
            ]
        )

    # claim some, complete some of those, fail some claimed and some new, requeue one
    claims, dones, fails, requeues = [], [], [], []
    for k, (message_id, endpoint) in enumerate(delivered):
        box = boxes[endpoint]
        if k % 2 == 0:
            name, _ = box.claim(message_id, NOW + 10_000 + k)
            deliveries = 1
            if k % 8 == 2:  # handed out again (its first holder died): N= in the name
                deliveries = 3
                again = format_name(message_id, NOW + 10_000 + k, None, "", deliveries)
                os.rename(f"{box.cur_dir}/{name}", f"{box.cur_dir}/{again}")
                box = Mailbox.at(mailboxes, endpoint)  # finds the renamed claim by scanning
                boxes[endpoint] = box
            claims.append((message_id, endpoint, parse_name(name).claimed_at, deliveries))
            if k % 4 == 0:
                box.complete(message_id, NOW + 20_000 + k)
                dones.append((message_id, endpoint, NOW + 20_000 + k))
            elif k % 6 == 2:
                size = box.fail(message_id, "handler raised", "nack", NOW + 30_000 + k)
                # The dead letter records how often it was handed out.
                at = NOW + 30_000 + k
                fails.append((message_id, endpoint, at, "handler raised", "nack", size, deliveries))
            elif k % 10 == 6:
                box.requeue(message_id)
                requeues.append((message_id, endpoint))
        elif k % 7 == 3:
            size = box.fail(message_id, "ttl passed", "ttl", NOW + 40_000 + k)
            fails.append((message_id, endpoint, NOW + 40_000 + k, "ttl passed", "ttl", size))
    index.write(claims=claims)
    index.write(dones=dones, fails=fails, requeues=requeues)
    kept = index.all_records()
    assert {r.state for r in kept} == set(State)

    # When a fresh index is rebuilt from the Maildir alone
    rebuilt = MessageIndex(tmp_path / "index-rebuilt.db")
    count = rebuild_from_maildir(rebuilt, mailboxes, endpoints)

    # Then it holds exactly the same rows, and answers the same
    assert count == len(kept)
    assert rebuilt.all_records() == kept
    assert rebuilt.metrics() == index.metrics()
    assert rebuilt.count_new_by_endpoint() == index.count_new_by_endpoint()
    assert rebuilt.count_publishes("relay.sender1", 0) == index.count_publishes("relay.sender1", 0)
    # and rebuilding the writer's own index in place changes nothing either
    rebuild_from_maildir(index, mailboxes)
    assert index.all_records() == kept
    index.close()
    rebuilt.close()


def test_a_scan_row_names_the_index_columns_in_order():
    assert ScanRow._fields == COLUMNS
    assert ScanRow._fields == tuple(f.name for f in dataclasses.fields(MessageRecord))
