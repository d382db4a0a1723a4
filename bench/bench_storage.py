"""Storage: the Maildir group commit, the index writes and the index rebuild, each
beside the bare loop it is built on.

Run on a real disk (a temp dir under /work, or $RELAY_BENCH_DIR; never tmpfs, where
fsync is free and every figure would lie). Every round writes into fresh directories:
on this non-journalled ext4, creating files where many were just deleted costs about
1 ms each (docs/design.md, "The disk, measured"), which would swamp what is measured.

- maildir batch delivery: `deliver_batch`, batches of 100 over 4 mailboxes, against
  (a) the bare one-at-a-time loop open/write/fsync/rename/fsync(dir) that it must beat,
  and (b) the bare batched loop write all/syncfs/rename all/fsync each dir, its ceiling.
- index batched inserts: `MessageIndex.write(inserts=...)`, one transaction per 100
  rows, against bare apsw executemany into the same schema and pragmas (goal >= 80 %).
- index rebuild: `rebuild_from_maildir` over ~20,000 files in all four states (warm
  page cache, as right after a writer restart), goal >= 50,000 msg/s; beside it the
  bare scan (open, fstat, read, json.loads; no index) it cannot beat.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Row, fs_type, fsync_dir, interleave, rate, remove_when_done
from sdk.ids import new_id
from workers.group_commit import deliver_batch
from workers.index import MessageIndex, rebuild_from_maildir
from workers.index_sql import MIGRATIONS
from workers.maildir import Mailbox
from workers.records import MessageRecord, State
from workers.sqlite import open_db
from workers.syncfs import HAVE_SYNCFS, syncfs

BATCH = 100
MAILBOXES = 4
DELIVERIES = 1000  # per contender per round: 10 batches
INDEX_ROWS = 10_000  # per contender per round: 100 transactions
REBUILD_FILES = 20_000
NOW = 1_764_108_000_000
_OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC


def bench_dir() -> Path:
    """A directory on a real disk: $RELAY_BENCH_DIR, else /work, else the repo."""
    base = os.environ.get("RELAY_BENCH_DIR") or (
        "/work" if os.path.isdir("/work") else str(Path(__file__).parent.parent)
    )
    if fs_type(base) in ("tmpfs", "ramfs"):
        raise SystemExit(f"{base} is {fs_type(base)}: fsync costs nothing there")
    return Path(tempfile.mkdtemp(prefix="relay-bench-storage-", dir=base))


def envelope(message_id: str, n: int) -> bytes:
    subject = f"relay.agent.bench.e{n % MAILBOXES}"
    return json.dumps(
        {
            "id": message_id,
            "subject": subject,
            "from": "relay.agent.bench.producer",
            "replyTo": None,
            "createdAt": NOW + n,
            "budget": {
                "hopCount": 1,
                "maxHops": 5,
                "ancestorChain": [subject],
                "ttl": NOW + 3_600_000,
                "callBudgetRemaining": 9,
            },
            "payload": {"content": "x" * 300, "performative": "inform"},
        }
    ).encode()


class _Rounds:
    """Fresh directories per round and contender, all under one temp dir."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0

    def mailboxes(self) -> list[Mailbox]:
        self.count += 1
        root = self.base / f"round-{self.count}"
        boxes = [Mailbox.at(root, f"{i:012x}") for i in range(MAILBOXES)]
        for box in boxes:
            box.create()
        return boxes

    def db(self) -> Path:
        self.count += 1
        return self.base / f"index-{self.count}.db"


def _messages(count: int) -> list[tuple[str, bytes]]:
    out = []
    for n in range(count):
        message_id = new_id()
        out.append((message_id, envelope(message_id, n)))
    return out


# --------------------------------------------------------------------------- maildir


def maildir_contenders(rounds: _Rounds) -> dict[str, Callable[[], float]]:
    def relay() -> float:
        boxes, messages = rounds.mailboxes(), _messages(DELIVERIES)
        start = time.perf_counter()
        for first in range(0, DELIVERIES, BATCH):
            items = [
                (boxes[n % MAILBOXES], message_id, data, "new")
                for n, (message_id, data) in enumerate(messages[first : first + BATCH], first)
            ]
            results = deliver_batch(items)
            assert all(isinstance(r, int) for r in results), results[:3]
        return rate(DELIVERIES, time.perf_counter() - start)

    def one_at_a_time() -> float:
        boxes, messages = rounds.mailboxes(), _messages(DELIVERIES)
        start = time.perf_counter()
        for n, (message_id, data) in enumerate(messages):
            box = boxes[n % MAILBOXES]
            tmp = f"{box.tmp_dir}/{message_id}.{n}"
            fd = os.open(tmp, _OPEN_NEW, 0o600)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
            os.rename(tmp, f"{box.new_dir}/{message_id}")
            fsync_dir(box.new_dir)
        return rate(DELIVERIES, time.perf_counter() - start)

    def bare_batched() -> float:
        boxes, messages = rounds.mailboxes(), _messages(DELIVERIES)
        start = time.perf_counter()
        for first in range(0, DELIVERIES, BATCH):
            batch = list(enumerate(messages[first : first + BATCH], first))
            for n, (message_id, data) in batch:
                fd = os.open(f"{boxes[n % MAILBOXES].tmp_dir}/{message_id}", _OPEN_NEW, 0o600)
                os.write(fd, data)
                os.close(fd)
            fd = os.open(boxes[0].tmp_dir, os.O_RDONLY | os.O_DIRECTORY)
            syncfs(fd)
            os.close(fd)
            for n, (message_id, _) in batch:
                box = boxes[n % MAILBOXES]
                os.rename(f"{box.tmp_dir}/{message_id}", f"{box.new_dir}/{message_id}")
            for box in boxes:
                fsync_dir(box.new_dir)
        return rate(DELIVERIES, time.perf_counter() - start)

    return {"relay": relay, "one_at_a_time": one_at_a_time, "bare_batched": bare_batched}


# --------------------------------------------------------------------------- index writes


def _records(count: int) -> list[MessageRecord]:
    return [
        MessageRecord(
            new_id(),
            f"{n % MAILBOXES:012x}",
            f"relay.agent.bench.e{n % MAILBOXES}",
            "relay.agent.bench.producer",
            State.NEW,
            NOW + n,
            NOW + n + 1,
            size=420,
        )
        for n in range(count)
    ]


def index_contenders(rounds: _Rounds) -> dict[str, Callable[[], float]]:
    def relay() -> float:
        records = _records(INDEX_ROWS)
        index = MessageIndex(rounds.db())
        start = time.perf_counter()
        for first in range(0, INDEX_ROWS, BATCH):
            index.write(inserts=records[first : first + BATCH])
        elapsed = time.perf_counter() - start
        index.close()
        return rate(INDEX_ROWS, elapsed)

    def bare() -> float:
        unset = (None, None, None, None)  # claimed_at, finished_at, reason, reason_code
        rows = [
            (
                r.id,
                r.endpoint,
                r.subject,
                r.sender,
                "new",
                r.created_at,
                r.stored_at,
                *unset,
                r.size,
            )
            for r in _records(INDEX_ROWS)
        ]
        conn = open_db(rounds.db())
        conn.execute(MIGRATIONS[0])
        sql = "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        cursor = conn.cursor()
        start = time.perf_counter()
        for first in range(0, INDEX_ROWS, BATCH):
            conn.execute("BEGIN IMMEDIATE")
            cursor.executemany(sql, rows[first : first + BATCH])
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        conn.close()
        return rate(INDEX_ROWS, elapsed)

    return {"relay": relay, "bare": bare}


# --------------------------------------------------------------------------- rebuild


def build_maildir(root: Path) -> list[str]:
    """~REBUILD_FILES files: most new, some claimed, done and failed."""
    boxes = [Mailbox.at(root, f"{i:012x}") for i in range(8)]
    for box in boxes:
        box.create()
    messages = _messages(REBUILD_FILES)
    for first in range(0, REBUILD_FILES, 500):
        items = [
            (boxes[n % 8], message_id, data, "new")
            for n, (message_id, data) in enumerate(messages[first : first + 500], first)
        ]
        deliver_batch(items)
    for n, (message_id, _) in enumerate(messages):
        box = boxes[n % 8]
        if n % 4 == 1:
            box.claim(message_id, NOW + n, sync=False)
            if n % 8 == 1:
                box.complete(message_id, NOW + n + 5, sync=False)
        elif n % 20 == 2:
            box.fail(message_id, "bench", "nack", NOW + n)
    os.sync()
    return [box.endpoint for box in boxes]


def rebuild_contenders(base: Path) -> dict[str, Callable[[], float]]:
    root = base / "rebuild-mailboxes"
    endpoints = build_maildir(root)
    index = MessageIndex(base / "index-rebuild.db")

    def relay() -> float:
        start = time.perf_counter()
        count = rebuild_from_maildir(index, root, endpoints)
        elapsed = time.perf_counter() - start
        assert count == REBUILD_FILES, count
        return rate(count, elapsed)

    def bare_scan() -> float:
        count = 0
        start = time.perf_counter()
        for endpoint in endpoints:
            for sub in ("new", "cur", "failed"):
                directory = f"{root}/{endpoint}/{sub}"
                for name in os.listdir(directory):
                    fd = os.open(f"{directory}/{name}", os.O_RDONLY)
                    st = os.fstat(fd)
                    json.loads(os.read(fd, st.st_size + 1))
                    os.close(fd)
                    count += 1
        return rate(count, time.perf_counter() - start)

    relay()  # warm the page cache and the index file once, as a restarted writer finds them
    return {"relay": relay, "bare_scan": bare_scan}


# --------------------------------------------------------------------------- rows


def rows(rounds: int = 5) -> list[Row]:
    base = bench_dir()
    kind = fs_type(str(base))
    try:
        per_round = _Rounds(base)
        maildir = interleave(rounds, **maildir_contenders(per_round))
        index = interleave(rounds, **index_contenders(per_round))
        rebuild = interleave(rounds, **rebuild_contenders(base))
    finally:
        remove_when_done(base)
    flush = "syncfs" if HAVE_SYNCFS else "os.sync (no syncfs)"
    return [
        Row(
            f"maildir batch delivery, batches of {BATCH} ({kind})",
            maildir["relay"],
            "msg/s",
            "bare write+fsync+rename+dir fsync, one at a time",
            maildir["one_at_a_time"],
            ">= bare one-at-a-time loop",
            maildir["relay"] >= maildir["one_at_a_time"],
        ),
        Row(
            f"maildir batch delivery, batches of {BATCH} ({kind})",
            maildir["relay"],
            "msg/s",
            f"bare batched write+{flush}+rename+dir fsync",
            maildir["bare_batched"],
            "ceiling",
            None,
        ),
        Row(
            f"index batched inserts, {BATCH} rows per transaction",
            index["relay"],
            "rows/s",
            "bare apsw executemany, same schema",
            index["bare"],
            ">= 80% of bare",
            index["relay"] >= 0.8 * index["bare"],
        ),
        Row(
            f"index rebuild from Maildir, {REBUILD_FILES:,} files",
            rebuild["relay"],
            "msg/s",
            "bare scan: open+fstat+read+json.loads",
            rebuild["bare_scan"],
            ">= 50,000 msg/s",
            rebuild["relay"] >= 50_000,
        ),
    ]


if __name__ == "__main__":
    for row in rows():
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        verdict = "" if row.met is None else ("met" if row.met else "NOT met")
        print(
            f"{row.metric:<48} {row.relay:>10,.0f} {row.unit:<6} "
            f"{row.ceiling_name}: {row.ceiling:,.0f} ({ratio})  goal {row.goal} {verdict}"
        )
