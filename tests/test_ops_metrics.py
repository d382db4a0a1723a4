"""Metrics on a real local SparkSession: every number checked against the ground truth.

The data directory holds generated history (tests/ops_sample.py) of which part is archived
by a compaction stopped right after its first commit, so that some copies are both archived
and still live (the metrics must count them once), plus rejection counts recorded by the
router's recorder, some old enough to be archived. The report is produced through the
command line entry (`relay ops metrics`) and its JSON is compared with counts computed
here, independently, from the generator's records.
"""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from broker.rejections import RejectionLog
from cli.main import main as relay_main
from ops.compact import CompactOptions, compact
from ops.live import INDEX_SCHEMA, REJECTION_SCHEMA
from ops.metrics import _spark_schema, dead_letters, depth, latency, rejections, write_outputs
from ops.spark_session import spark_session
from sdk.paths import UNROUTABLE, Home
from tests.ops_sample import Spec, generate
from workers.records import State

pytestmark = pytest.mark.spark

DAY = 86_400_000
NOW = 1_795_000_000_000
OLD, RECENT = NOW - 40 * DAY, NOW - 2 * DAY  # rejection minutes: archived, live


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def report():
    spark = spark_session()  # shared with the other ops test modules of this process
    root = Path(tempfile.mkdtemp(prefix="relay-"))
    home = Home(root)
    records = generate(home, NOW, Spec(copies=2500, endpoints=3, seed=21))
    log = RejectionLog(home.root / "rejections.db")
    for i in range(30):
        log.record(OLD + i * 1000, "rate_limited", "*", "relay.agent.noisy")
    for i in range(5):
        log.record(RECENT + i, "backpressure", records[0].endpoint, "relay.agent.noisy")
    for i in range(4):
        log.record(RECENT + 61_000 * i, "circuit_open", records[0].endpoint, "relay.agent.b")
    log.close()

    # A compaction that dies after its first commit: 200 copies archived and still live.
    def crash(name: str) -> None:
        if name == "ops.compact.after_commit":
            raise Crash

    mp = pytest.MonkeyPatch()
    mp.setattr("ops.compact.fault_point", crash)
    with pytest.raises(Crash):
        compact(spark, CompactOptions(home=home, now_ms=NOW, batch_rows=200))
    mp.undo()
    # ... and one that archives the old rejection counts (and its own batch) properly,
    # with a retention that leaves part of the history live
    compact(spark, CompactOptions(home=home, now_ms=NOW, done_retention_ms=20 * DAY))

    out = root / "reports"
    code = relay_main(["--home", str(root), "ops", "metrics", "--out", str(out), "--quiet"])
    assert code == 0
    [json_path] = out.glob("metrics-*.json")
    [html_path] = out.glob("metrics-*.html")
    yield records, json.loads(json_path.read_text()), html_path.read_text()
    shutil.rmtree(root, ignore_errors=True)


def test_totals_count_every_copy_once_whether_live_or_archived(report):
    records, doc, _ = report
    states = Counter(str(r.state) for r in records)
    assert doc["totals"]["copies"] == len(records)
    assert doc["totals"]["messages"] == len({r.id for r in records})
    assert doc["totals"]["byState"] == {s: states[s] for s in ("new", "claimed", "done", "failed")}
    assert doc["totals"]["bytes"] == sum(r.size for r in records)
    assert doc["sources"]["archived"] > 0 and doc["sources"]["live"] > 0
    assert doc["sources"]["archived"] + doc["sources"]["live"] - doc["sources"]["overlap"] == len(
        records
    )


def test_volume_over_time_by_subject_sender_and_endpoint(report):
    records, doc, _ = report
    assert doc["bucket"] == "day"
    by_day = Counter(r.created_at // DAY * DAY for r in records)
    assert {v["bucket"]: v["copies"] for v in doc["volume"]} == dict(by_day)
    assert {s["subject"]: s["copies"] for s in doc["bySubject"]} == dict(
        Counter(r.subject for r in records)
    )
    ids_by_sender: dict[str, set] = {}
    for r in records:
        ids_by_sender.setdefault(r.sender, set()).add(r.id)
    assert {s["sender"]: s["messages"] for s in doc["bySender"]} == {
        k: len(v) for k, v in ids_by_sender.items()
    }
    for row in doc["byEndpoint"]:
        mine = [r for r in records if r.endpoint == row["endpoint"]]
        assert row["copies"] == len(mine)
        assert row["done"] == sum(r.state is State.DONE for r in mine)
        assert row["failed"] == sum(r.state is State.FAILED for r in mine)


def test_latency_percentiles_from_stored_to_done(report):
    records, doc, _ = report
    latencies = np.array(
        [r.finished_at - r.stored_at for r in records if r.state is State.DONE], dtype=float
    )
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    lat = doc["latency"]
    assert lat["count"] == len(latencies)
    assert lat["p50"] == pytest.approx(p50) and lat["p95"] == pytest.approx(p95)
    assert lat["p99"] == pytest.approx(p99) and lat["max"] == latencies.max()
    assert sum(b["count"] for b in lat["histogram"]) == len(latencies)
    for row in doc["byEndpoint"]:
        mine = [
            r.finished_at - r.stored_at
            for r in records
            if r.endpoint == row["endpoint"] and r.state is State.DONE
        ]
        if mine:
            assert row["p95"] == pytest.approx(np.percentile(mine, 95))


def test_dead_letters_and_rejections_by_reason(report):
    records, doc, _ = report
    codes = Counter(r.reason_code for r in records if r.state is State.FAILED)
    assert {c["code"]: c["count"] for c in doc["deadLetters"]["byCode"]} == dict(codes)
    by_reason = {(r["reason"], r["source"]): r["count"] for r in doc["rejections"]["byReason"]}
    expected = {("rate_limited", "router"): 30, ("backpressure", "router"): 5}
    expected[("circuit_open", "router")] = 4
    for code in ("no_match", "access_denied", "hop_limit", "ttl_expired"):
        expected[(code, "dead_letter")] = codes[code]
    assert by_reason == expected


def test_endpoint_depth_now_is_the_live_waiting_and_claimed(report):
    records, doc, _ = report
    for row in doc["depth"]:
        mine = [r for r in records if r.endpoint == row["endpoint"]]
        assert row["waiting"] == sum(r.state is State.NEW for r in mine)
        assert row["claimed"] == sum(r.state is State.CLAIMED for r in mine)
    assert UNROUTABLE not in {d["endpoint"] for d in doc["depth"]}
    assert {d["subject"] for d in doc["depth"]} == {
        r.subject for r in records if r.endpoint != UNROUTABLE
    }


def test_the_html_report_is_self_contained_with_plots_and_tables(report):
    _, doc, page = report
    assert page.count('<img src="data:image/png;base64,') == 5
    assert "http://" not in page and "https://" not in page  # nothing fetched from outside
    for subject in (s["subject"] for s in doc["bySubject"]):
        assert subject in page
    assert page.count("<table>") >= 6


def test_the_report_files_are_owner_only(report, tmp_path):
    _, doc, _ = report
    for path in write_outputs(doc, tmp_path / "reports"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_the_stages_run_over_views_made_by_hand():
    """Each stage of `collect` queries the views and nothing else, so three copies and
    one rejection count made here are enough to check one: no data directory needed."""
    spark = spark_session()
    copies = [
        # in COLUMNS order: id, endpoint, subject, sender, state, created_at, stored_at,
        # claimed_at, finished_at, reason, reason_code, size, parent_id, deliveries
        ("A", "e1", "s.one", "x", "done", 0, 1000, 1010, 1100, None, None, 10, None, 1),
        ("B", "e1", "s.one", "x", "new", 0, 2000, None, None, None, None, 10, None, 0),
        (
            "C",
            "e2",
            "s.two",
            "y",
            "failed",
            0,
            3000,
            None,
            3000,
            "no",
            "access_denied",
            10,
            None,
            0,
        ),
    ]
    live = spark.createDataFrame(copies, schema=_spark_schema(spark, INDEX_SCHEMA))
    live.createOrReplaceTempView("live")
    live.selectExpr("*", "'live' AS source").createOrReplaceTempView("messages")
    counts = [(60_000, "rate_limited", "*", "x", 3)]
    spark.createDataFrame(
        counts, schema=_spark_schema(spark, REJECTION_SCHEMA)
    ).createOrReplaceTempView("rejections")

    subjects = {"e1": "s.one", "e2": "s.two", "e3": "s.three"}
    assert [
        (d["endpoint"], d["waiting"], d["oldestWaitingAgeMs"])
        for d in depth(spark, subjects, now=5000)
    ] == [("e1", 1, 3000), ("e3", 0, None), ("e2", 0, None)]
    lat = latency(spark)
    assert (lat["count"], lat["p50"], lat["max"]) == (1, 100.0, 100)
    dead = dead_letters(spark, top=10)
    assert dead["byCode"] == [{"code": "access_denied", "count": 1}]
    rejected = rejections(spark, dead["byCode"], width=3_600_000, top=10)
    assert rejected["total"] == 4
    assert [(r["reason"], r["source"]) for r in rejected["byReason"]] == [
        ("rate_limited", "router"),
        ("access_denied", "dead_letter"),
    ]
    assert rejected["overTime"] == [{"bucket": 0, "reason": "rate_limited", "count": 3}]
