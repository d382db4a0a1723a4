"""Compaction on a real local SparkSession, over generated history (tests/ops_sample.py).

Given a data directory with done, dead-lettered, new and claimed copies spread over 45
days, compaction must leave the archive holding exactly the finished copies past
retention and the live store (files and index) exactly the rest, whoever removes the
files (the job itself, or a running broker's writers), and a run killed between its
archive write and its removal must, once rerun, have lost nothing and archived nothing
twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import archive as archive_mod
from ops.compact import CompactOptions, compact
from ops.live import all_rows, day_of, open_indexes
from ops.spark_session import spark_session
from sdk.paths import Home
from tests.harness import ROOT, Broker, wait_for
from tests.ops_sample import Spec, endpoint_subject, generate
from workers.records import MessageRecord, State
from workers.scan import iter_records

pytestmark = pytest.mark.spark

DAY = 86_400_000
NOW = 1_795_000_000_000  # fixed: every expectation is computed from it
SPEC = Spec(copies=2400, endpoints=3)


@pytest.fixture(scope="module")
def spark():
    return spark_session()  # one per process, shared with the other ops test modules


@pytest.fixture
def home() -> Iterator[Home]:
    root = Path(tempfile.mkdtemp(prefix="relay-"))  # short: ipc socket paths are bounded
    yield Home(root)
    shutil.rmtree(root, ignore_errors=True)


def split(records: list[MessageRecord], now: int = NOW) -> tuple[set, set]:
    """(archived, live) keys as the retention rules say, computed from the ground truth."""
    archived, live = set(), set()
    for r in records:
        past = (r.state is State.DONE and r.finished_at < now - 7 * DAY) or (
            r.state is State.FAILED and r.finished_at < now - 30 * DAY
        )
        (archived if past else live).add((r.id, r.endpoint))
    return archived, live


def archive_rows(spark, home: Home) -> list:
    path = home.archive / "messages"
    if not path.exists():
        return []
    return spark.read.parquet(str(path)).collect()


def live_keys(home: Home) -> tuple[set, set]:
    """(keys in the indexes, keys with a file in the Maildir)."""
    with open_indexes(home) as indexes:
        indexed = {(r[0], r[1]) for r in all_rows(indexes)}
    on_disk = {(r.id, r.endpoint) for r in iter_records(home.mailboxes)}
    return indexed, on_disk


def check_split(spark, home: Home, records: list[MessageRecord]) -> list:
    expected_archived, expected_live = split(records)
    rows = archive_rows(spark, home)
    keys = [(r.id, r.endpoint) for r in rows]
    assert len(keys) == len(set(keys)), "a copy was archived twice"
    assert set(keys) == expected_archived
    indexed, on_disk = live_keys(home)
    assert indexed == expected_live
    assert on_disk == expected_live
    return rows


def test_compaction_archives_exactly_the_finished_copies_past_retention(spark, home):
    # Given history in every state, and no broker running
    records = generate(home, NOW, SPEC)
    truth = {(r.id, r.endpoint): r for r in records}
    expected, _ = split(records)
    assert 300 < len(expected) < len(records) - 300  # both sides are well populated

    # When compaction runs
    summary = compact(spark, CompactOptions(home=home, now_ms=NOW, vacuum_pages=1))

    # Then the archive holds exactly the finished copies past retention, the store the rest
    rows = check_split(spark, home, records)
    assert summary.removal == "local"
    assert summary.candidates == summary.archived == summary.removed == len(expected)
    assert summary.files_removed == len(expected)
    assert summary.bytes_freed == sum(truth[k].size for k in expected)
    assert summary.skipped == summary.missing_files == summary.already_archived == 0
    assert len(summary.indexes) == 2 and all(i["vacuumed"] for i in summary.indexes)
    # and every archived row carries its envelope, state, reason and timestamps
    for row in rows:
        r = truth[(row.id, row.endpoint)]
        assert (row.subject, row.sender, row.state) == (r.subject, r.sender, str(r.state))
        assert (row.reason, row.reason_code, row.size) == (r.reason, r.reason_code, r.size)
        assert (row.created_at, row.stored_at, row.finished_at) == (
            r.created_at,
            r.stored_at,
            r.finished_at,
        )
        assert row.claimed_at == r.claimed_at
        assert row.day == day_of(r.finished_at)
        assert row.budget.maxHops == 5 and row.budget.ancestorChain == [r.subject]
        assert f'"id":"{r.id}"' in row.envelope and row.run_id == summary.run_id

    # And a second run finds nothing more to do
    again = compact(spark, CompactOptions(home=home, now_ms=NOW))
    assert (again.candidates, again.archived, again.removed) == (0, 0, 0)
    check_split(spark, home, records)


def test_retention_is_configurable(spark, home):
    records = generate(home, NOW, Spec(copies=600, endpoints=2, seed=3))
    opts = CompactOptions(
        home=home, now_ms=NOW, done_retention_ms=20 * DAY, dead_retention_ms=40 * DAY
    )
    compact(spark, opts)
    expected = {
        (r.id, r.endpoint)
        for r in records
        if (r.state is State.DONE and r.finished_at < NOW - 20 * DAY)
        or (r.state is State.FAILED and r.finished_at < NOW - 40 * DAY)
    }
    assert {(r.id, r.endpoint) for r in archive_rows(spark, home)} == expected


def test_the_archive_is_owner_only(spark, home):
    generate(home, NOW, Spec(copies=300, endpoints=2, seed=5))
    compact(spark, CompactOptions(home=home, now_ms=NOW))
    made = [Path(d, n) for d, dirs, files in os.walk(home.archive) for n in dirs + files]
    assert any(p.suffix == ".parquet" for p in made)
    # Parquet, its .crc checksums, the runs' progress files, and the directories
    wide = [f"{oct(stat.S_IMODE(p.stat().st_mode))} {p}" for p in made if p.stat().st_mode & 0o077]
    assert wide == []


class Crash(Exception):
    pass


@pytest.mark.parametrize(
    "point",
    [archive_mod.AFTER_STAGING_WRITE, archive_mod.AFTER_MANIFEST, archive_mod.AFTER_COMMIT],
    ids=["after-staging-write", "after-manifest", "after-commit"],
)
def test_a_run_stopped_at_any_step_then_rerun_loses_nothing_and_archives_nothing_twice(
    spark, home, monkeypatch, point
):
    # Given a run that stops at `point` of its first batch (small batches: several)
    records = generate(home, NOW, Spec(copies=900, endpoints=2, seed=11))

    def crash(name: str) -> None:
        if name == point:
            raise Crash(name)

    monkeypatch.setattr(archive_mod, "fault_point", crash)
    monkeypatch.setattr("ops.compact.fault_point", crash)
    with pytest.raises(Crash):
        compact(spark, CompactOptions(home=home, now_ms=NOW, batch_rows=150))
    indexed, on_disk = live_keys(home)
    assert indexed == on_disk == {(r.id, r.endpoint) for r in records}  # nothing removed yet
    monkeypatch.undo()

    # When it runs again
    summary = compact(spark, CompactOptions(home=home, now_ms=NOW, batch_rows=150))

    # Then every finished copy is archived exactly once and removed
    check_split(spark, home, records)
    expected, _ = split(records)
    assert summary.removed == len(expected)
    if point == archive_mod.AFTER_STAGING_WRITE:
        assert summary.recovered == {"discarded": 1, "completed": 0}
    elif point == archive_mod.AFTER_MANIFEST:
        assert summary.recovered == {"discarded": 0, "completed": 1}
        assert summary.already_archived == 150
    else:
        assert summary.already_archived == 150
    assert not any((home.archive / "_staging").iterdir())


def test_a_compaction_killed_between_archive_write_and_removal_recovers_on_rerun(spark, home):
    # Given a compaction process killed (SIGKILL) right after its first commit
    records = generate(home, NOW, Spec(copies=900, endpoints=2, seed=5))
    expected, _ = split(records)
    env = {**os.environ, "RELAY_FAULT": archive_mod.AFTER_COMMIT}
    cmd = [sys.executable, "ops/compact.py", "--home", str(home.root), "--quiet"]
    cmd += ["--batch-rows", "100000", "--now", str(NOW)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    first = archive_rows(spark, home)
    assert {(r.id, r.endpoint) for r in first} == expected
    indexed, on_disk = live_keys(home)
    assert indexed == on_disk == {(r.id, r.endpoint) for r in records}

    # When it runs again
    summary = compact(spark, CompactOptions(home=home, now_ms=NOW))

    # Then nothing was archived twice and nothing is lost
    assert summary.archived == 0 and summary.already_archived == len(expected)
    assert summary.removed == len(expected)
    rows = check_split(spark, home, records)
    assert len(rows) == len(first)


def test_with_a_broker_running_the_writers_remove_and_live_mail_is_untouched(spark, home):
    # Given history and a running broker (its writers own the mailboxes)
    records = generate(home, NOW, SPEC)
    expected, _ = split(records)
    broker = Broker(shards=2, home=home.root)
    try:
        broker.start()
        client = broker.client()
        waiting = unfinished(client)

        # When compaction runs
        summary = compact(spark, CompactOptions(home=home, now_ms=NOW, vacuum_pages=1))

        # Then the writers removed exactly the archived copies
        assert summary.removal == "broker"
        assert summary.archived == summary.removed == summary.files_removed == len(expected)
        assert len(summary.indexes) == 2
        check_split(spark, home, records)
        # the broker still serves, with the same mail unfinished (waiting or claimed:
        # claims nobody came back for after the start are handed out again meanwhile)
        assert unfinished(client) == waiting

        # And a removal request naming new and claimed copies leaves them alone
        live = [r for r in records if r.state in (State.NEW, State.CLAIMED)][:50]
        result = client._call("compact_remove", items=[[r.id, r.endpoint] for r in live])
        assert result["skipped"] == len(live) and result["files"] == 0
        check_split(spark, home, records)

        # And the router records its reliability rejections for the metrics
        client.set_config({"rateLimit": {"maxPerWindow": 1}})
        subject = endpoint_subject(0)
        results = [client.publish(subject, {"n": i}, sender="relay.agent.burst") for i in range(3)]
        assert [[tuple(x) for x in r.rejected] for r in results] == [
            [],
            [("*", "rate_limited")],
            [("*", "rate_limited")],
        ]

        def recorded() -> int:
            from ops.live import read_rejections

            return sum(row[4] for row in read_rejections(home) if row[1] == "rate_limited")

        assert wait_for(lambda: recorded() == 2, timeout=10, what="rejection counts")
    finally:
        broker.stop()


def unfinished(client) -> dict[str, int]:
    """Per endpoint, the messages waiting or claimed: what compaction must not touch."""
    return {e["hash"]: e["depth"] + e["claimed"] for e in client._call("endpoints")["endpoints"]}
