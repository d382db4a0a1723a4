"""The broker bench's table as data (bench/comparisons.py): the rows read only figures
that the bench's round measures, goals are judged from the figures they name, and the
goals of issue 27 are rows. Nothing here runs a workload: the round is built from
stand-ins whose methods are never called."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bench.bench_broker import RSS, _contenders
from bench.comparisons import (
    COMPARISONS,
    ISSUE_27_GOALS,
    Comparison,
    Figure,
    Floor,
    at_least_share,
    contenders_named,
    goal_rows,
    table,
)
from bench.goals import summary
from bench.trees import compare, pair_order
from bench.workload import SHARD_COUNTS


class _Workloads(SimpleNamespace):
    """Any workload method asked for: a callable that is never run here."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: {}


def _round() -> dict[str, Any]:
    shards = {k: _Workloads() for k in SHARD_COUNTS}
    return _contenders(_Workloads(), _Workloads(), _Workloads(), shards, shards, _Workloads())


def _measured(value: float = 1.0) -> dict[str, dict[str, float]]:
    """Every figure the table reads, at ``value`` (messages lost: none)."""
    measured: dict[str, dict[str, float]] = {}
    for comparison in COMPARISONS:
        for figure in comparison.figures():
            lost = figure.name == "lost"
            measured.setdefault(figure.contender, {})[figure.name] = 0.0 if lost else value
    return measured


def test_every_row_reads_a_workload_that_the_round_runs() -> None:
    assert contenders_named(COMPARISONS) - {RSS} <= _round().keys()


def test_every_workload_of_the_round_is_read_by_a_row() -> None:
    assert _round().keys() <= contenders_named(COMPARISONS)


@pytest.mark.parametrize(
    ("metric", "floor", "goal"),
    [
        (
            "publish, 100 in flight, 8 endpoints, 2 shards",
            "(e) the architecture, no Relay code, 100 in flight",
            ">= 0.75x (e)",
        ),
        (
            "publish, 1 in flight, 2 shards: p50",
            "(e) the architecture, no Relay code: p50",
            "<= 1.4x (e) p50",
        ),
        (
            "publish -> handler @ 1,000/s, 2 shards: p50",
            "(e) store claimed, push, ack per message: p50",
            "<= 1.6x (e) p50",
        ),
        ("router CPU per publish, 100 in flight, 8 endpoints, 2 shards", "", "<= 40 us"),
    ],
    ids=["100-in-flight", "1-in-flight-p50", "handler-p50", "router-cpu"],
)
def test_the_goals_of_issue_27_are_judged_rows(metric: str, floor: str, goal: str) -> None:
    rows = table(COMPARISONS, _measured(), "ext4")
    (row,) = [r for r in rows if (r.metric, r.ceiling_name) == (metric, floor)]
    assert row.goal == goal
    assert row.met is not None


def test_pull_and_ask_rows_stand_beside_push_consumption_and_a_publish() -> None:
    beside = {(r.metric.split(",")[0], r.ceiling_name) for r in table(COMPARISONS, _measured(), "")}
    assert ("drain 1", "the same drained by subscribe (push, credit 64)") in beside
    assert ("publish -> fetch(wait) -> ack()", "publish, 1 in flight: p50") in beside
    assert ("request -> reply", "publish, 1 in flight: p50") in beside


def test_a_goal_relative_to_its_floor_is_judged_on_the_two_figures() -> None:
    row = Comparison(
        "x", "msg/s", Figure("relay"), Floor("floor", Figure("floor")), at_least_share(0.8, "f")
    )
    assert row.row({"relay": {"rate": 80.0}, "floor": {"rate": 100.0}}, "").met is True
    assert row.row({"relay": {"rate": 79.0}, "floor": {"rate": 100.0}}, "").met is False


def test_lost_messages_are_named_in_the_metric_and_past_the_allowance_fail_the_goal() -> None:
    row = Comparison(
        "signals",
        "sig/s",
        Figure("relay"),
        Floor("(d)", Figure("floor")),
        at_least_share(0.5, "(d)", lost_at_most=10),
        lost=Figure("relay", "lost"),
    )
    within = row.row({"relay": {"rate": 60.0, "lost": 10.0}, "floor": {"rate": 100.0}}, "")
    past = row.row({"relay": {"rate": 60.0, "lost": 11.0}, "floor": {"rate": 100.0}}, "")
    assert (within.metric, within.met) == ("signals, 10 lost", True)
    assert (past.metric, past.met) == ("signals, 11 lost", False)


def test_the_goals_run_reads_every_goal_of_issue_27_and_only_those_rows() -> None:
    rows = goal_rows()
    assert {id(c.goal) for c in rows} == {id(goal) for goal in ISSUE_27_GOALS}
    assert len(rows) < len(COMPARISONS)
    assert contenders_named(rows) <= _round().keys()


def test_two_trees_are_judged_on_the_median_of_their_runs() -> None:
    rows = goal_rows()

    # Per run: every row at ratio r (Relay r, floor 1) and, without a floor, at figure 40 r.
    def run(r: float) -> list[dict[str, Any]]:
        return [{"relay": r if c.floor else 40 * r, "ratio": r if c.floor else None} for c in rows]

    runs = {"old": [run(2.0), run(2.0), run(0.1)], "new": [run(0.5), run(0.5), run(9.0)]}
    lines = summary(runs).splitlines()
    (p50_old, p50_new) = lines[1:3]  # the first row: publish 1 in flight p50, <= 1.4x (e)
    assert "ratio 2.00x [0.10-2.00]" in p50_old
    assert p50_old.endswith(": NO") and p50_new.endswith(": yes")


def test_each_tree_runs_second_in_half_the_pairs() -> None:
    # The floor measured second in a pair ran slower (docs/performance.md, "Which run of
    # a pair"): a fixed order would set one tree beside the slower floor every time.
    trees = ["old", "new"]
    seconds = [pair_order(trees, pair)[1] for pair in range(6)]
    assert seconds.count("old") == seconds.count("new") == 3


def test_failed_runs_are_counted_per_tree() -> None:
    rows = goal_rows()
    run = [{"relay": 1.0, "ratio": 1.0 if c.floor else None} for c in rows]
    lines = summary({"old": [run]}, {"new": 2}).splitlines()
    assert lines[-1] == "new: 2 run(s) failed, 0 ran"


def test_two_trees_compared_row_by_row() -> None:
    def run(rate: float, ceiling: float) -> list[dict[str, Any]]:
        return [
            {"metric": "signals", "relay": rate, "unit": "msg/s", "ratio": rate / ceiling},
            {"metric": "cpu", "relay": 50.0, "unit": "us", "ratio": None},
        ]

    runs = {"old": [run(100, 200), run(120, 200), run(90, 200)], "new": [run(80, 100)]}
    lines = compare(runs, {"new": 1}).splitlines()
    assert lines[1] == (
        "signals (msg/s): 100.0 [90.0-120.0] (0.50x ceiling) -> 80.0 [80.0-80.0] "
        "(0.80x ceiling)  new/old 0.80"
    )
    assert lines[2] == "cpu (us): 50.0 [50.0-50.0] -> 50.0 [50.0-50.0]  new/old 1.00"
    assert lines[3] == "new: 1 run(s) failed, 1 ran"
