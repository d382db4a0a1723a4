"""The broker bench's table as data: each row a `Comparison` of one Relay figure with
the floor or the Relay figure it is set beside, and the goal it must meet, if any.

A figure is named by the contender that measured it and the figure's name in what the
contender returned (`Figure`): bench/bench_broker.py interleaves the contenders and
checks, before it measures, that every contender named here is one it runs. The floors
(a)-(e) are measured by bench/floors.py, the Relay side by bench/relay_broker.py,
bench/relay_signals.py and bench/pull_and_ask.py; docs/performance.md reads the
figures.

The list keeps the order the table has always printed, so that a run reads beside the
earlier ones in docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.common import Figures, Row
from bench.floors import PIPE_WRITERS
from bench.workload import (
    DRAIN_N,
    ENDPOINTS,
    FANOUT,
    FETCH_BATCH,
    FETCH_BIG_BATCH,
    INFLIGHT,
    OFFERED_RATE,
    PUSH_CREDIT,
    RAW_BATCH,
    REQUEST_THREADS,
    SHARD_COUNTS,
    SIGNAL_NO_REPLY_N,
)

FS = "{fs}"  # stands in a label for the filesystem type of the bench's disk


@dataclass(frozen=True)
class Figure:
    """One figure of one contender: ``measured[contender][name]``."""

    contender: str
    name: str = "rate"

    def of(self, measured: dict[str, Figures]) -> float:
        return measured[self.contender][self.name]


@dataclass(frozen=True)
class Floor:
    """What a Relay figure is set beside: its name in the table, and the figure."""

    label: str
    figure: Figure


@dataclass(frozen=True)
class Goal:
    """A goal in words, and the test of a row's figures (Relay's, its floor's, and the
    messages it lost) that says whether it was met; a goal with no test is said, not
    judged."""

    words: str
    test: Callable[[float, float | None, float], bool] | None = None

    def met(self, relay: float, floor: float | None, lost: float) -> bool | None:
        return None if self.test is None else self.test(relay, floor, lost)


def at_most_times(factor: float, of: str) -> Goal:
    """Relay's figure (a latency) at most ``factor`` times its floor's."""
    return Goal(f"<= {factor:g}x {of}", lambda relay, floor, _: relay <= factor * _given(floor))


def at_least_times(factor: float, of: str) -> Goal:
    """Relay's figure (a rate) at least ``factor`` times its floor's."""
    return Goal(f">= {factor:g}x {of}", lambda relay, floor, _: relay >= factor * _given(floor))


def at_least_share(share: float, of: str, *, lost_at_most: float = float("inf")) -> Goal:
    """Relay's figure (a rate) at least ``share`` of its floor's; with ``lost_at_most``,
    a rate bought by losing more messages than that does not count."""
    return Goal(
        f">= {share:.0%} of {of}",
        lambda relay, floor, lost: relay >= share * _given(floor) and lost <= lost_at_most,
    )


def at_most(limit: float, words: str) -> Goal:
    """Relay's figure at most ``limit``, whatever its floor (``words`` says it with its
    unit)."""
    return Goal(f"<= {words}", lambda relay, _floor, _lost: relay <= limit)


def _given(floor: float | None) -> float:
    if floor is None:
        raise ValueError("a goal relative to a floor needs the floor's figure")
    return floor


@dataclass(frozen=True)
class Comparison:
    """One row of the table. ``label`` may hold `FS`; ``lost`` counts messages lost on
    the way (signals are ephemeral), named in the row's metric when there were any."""

    label: str
    unit: str
    relay: Figure
    floor: Floor | None = None
    goal: Goal | None = None
    lost: Figure | None = None

    def figures(self) -> list[Figure]:
        """Every figure this row reads."""
        floor = [] if self.floor is None else [self.floor.figure]
        lost = [] if self.lost is None else [self.lost]
        return [self.relay, *floor, *lost]

    def row(self, measured: dict[str, Figures], fs: str) -> Row:
        relay = self.relay.of(measured)
        floor = None if self.floor is None else self.floor.figure.of(measured)
        lost = 0.0 if self.lost is None else self.lost.of(measured)
        label = self.label.replace(FS, fs) + (f", {lost:.0f} lost" if lost else "")
        return Row(
            label,
            relay,
            self.unit,
            "" if self.floor is None else self.floor.label,
            floor,
            "" if self.goal is None else self.goal.words,
            None if self.goal is None else self.goal.met(relay, floor, lost),
        )


def table(comparisons: list[Comparison], measured: dict[str, Figures], fs: str) -> list[Row]:
    return [comparison.row(measured, fs) for comparison in comparisons]


# --------------------------------------------------------------------------- the floors

A_RATE = Floor("(a) write+fsync+rename+dir fsync, one at a time", Figure("raw_single"))
A_P50 = Floor("(a) p50", Figure("raw_single", "p50"))
A_P99 = Floor("(a) p99", Figure("raw_single", "p99"))
B_RATE = Floor(f"(b) batched by {RAW_BATCH}: syncfs + 1 dir fsync", Figure("raw_batched"))
B_FILES = Floor(f"{B_RATE.label} (per file)", Figure("raw_batched"))
C_P50 = Floor("(c) DEALER/ROUTER round trip p50", Figure("raw_rt", "p50"))
C_RATE = Floor("(c) DEALER/ROUTER, 1 in flight", Figure("raw_rt"))
C_PIPELINED = Floor(f"(c) DEALER/ROUTER, {INFLIGHT} in flight", Figure("raw_rt_pipelined"))
D_RATE = Floor("(d) PUB/SUB", Figure("raw_pubsub"))
E_P50 = Floor("(e) the architecture, no Relay code: p50", Figure("pipeline_single", "p50"))
E_PIPELINED = Floor(
    f"(e) the architecture, no Relay code, {INFLIGHT} in flight", Figure("pipeline_pipelined")
)
E_HANDLER_P50 = Floor(
    "(e) store claimed, push, ack per message: p50", Figure("pipeline_handler", "p50")
)

# The goals of issue 27, "Relay's own cost" (docs/performance.md): what Relay adds to
# the architecture's floor (e), halved.
PUBLISH_1_P50_GOAL = at_most_times(1.4, "(e) p50")
PUBLISH_100_GOAL = at_least_times(0.75, "(e)")
HANDLER_P50_GOAL = at_most_times(1.6, "(e) p50")
ROUTER_CPU_GOAL = at_most(40, "40 us")
ISSUE_27_GOALS = (PUBLISH_1_P50_GOAL, PUBLISH_100_GOAL, HANDLER_P50_GOAL, ROUTER_CPU_GOAL)


def _shards(k: int) -> str:
    return f"{k} shard{'s' if k > 1 else ''}"


BIGGEST = max(SHARD_COUNTS)  # the broker the fan-out, reliability and pull rows use


# --------------------------------------------------------------------------- the rows


def _the_floor() -> list[Comparison]:
    """(e) beside (a) and (b): when it is above 2x, so is anything built this way."""
    return [
        Comparison(
            "(e) the architecture, no Relay code, 1 in flight: p50", "us", E_P50.figure, A_P50
        ),
        Comparison(
            f"(e) the architecture, no Relay code, {INFLIGHT} in flight",
            "msg/s",
            E_PIPELINED.figure,
            B_RATE,
        ),
    ]


def _publishes(k: int) -> list[Comparison]:
    """Durable publishes on a broker of ``k`` shards: 1 in flight to one endpoint, 100 in
    flight over 8 endpoints spread over the shards."""
    single, pipelined = f"single_{k}", f"pipelined_{k}"
    one = f"publish, 1 in flight, {_shards(k)}"
    hundred = f"publish, {INFLIGHT} in flight, {ENDPOINTS} endpoints, {_shards(k)}"
    rows = [
        Comparison(f"{one} ({FS})", "msg/s", Figure(single), A_RATE),
        Comparison(f"{one}: p50", "us", Figure(single, "p50"), A_P50, at_most_times(2, "(a) p50")),
        Comparison(f"{one}: p99", "us", Figure(single, "p99"), A_P99),
        Comparison(f"{one}: p50", "us", Figure(single, "p50"), E_P50, PUBLISH_1_P50_GOAL),
        Comparison(f"{one}: p50", "us", Figure(single, "p50"), C_P50),
        Comparison(hundred, "msg/s", Figure(pipelined), B_RATE, at_least_share(0.8, "(b)")),
        Comparison(hundred, "msg/s", Figure(pipelined), C_PIPELINED),
        Comparison(
            f"router CPU per publish, {INFLIGHT} in flight, {ENDPOINTS} endpoints, {_shards(k)}",
            "us",
            Figure(pipelined, "router_cpu"),
            goal=ROUTER_CPU_GOAL,
        ),
    ]
    if k == PIPE_WRITERS:  # (e) has as many writers as this broker has shards
        rows.append(Comparison(hundred, "msg/s", Figure(pipelined), E_PIPELINED, PUBLISH_100_GOAL))
    return rows


def _reliability_fanout_memory() -> list[Comparison]:
    """On the biggest broker: the reliability checks' cost, a wildcard fan-out (copies
    stored, beside (b) which counts files), and the router's memory (no floor; `--only
    soak` measures drift over time)."""
    shards = _shards(BIGGEST)
    flat = Goal("flat (see soak)")
    return [
        Comparison(
            f"publish, {INFLIGHT} in flight, {shards}, reliability on",
            "msg/s",
            Figure(f"pipelined_{BIGGEST}"),
            Floor("same, rate limit + breakers + backpressure off", Figure("unguarded")),
            at_least_share(0.9, "off"),
        ),
        Comparison(
            f"fan-out to {FANOUT} endpoints, {INFLIGHT} in flight, {shards}: copies stored",
            "copy/s",
            Figure("fanout"),
            B_FILES,
        ),
        Comparison(f"router RSS at start, {shards}", "MiB", Figure("rss", "start"), goal=flat),
        Comparison(f"router RSS after the run, {shards}", "MiB", Figure("rss", "after"), goal=flat),
    ]


def _handler(k: int) -> list[Comparison]:
    """Publish -> a push subscription's handler at an offered rate, on ``k`` shards."""
    handler, what = f"handler_{k}", f"publish -> handler @ {OFFERED_RATE:,}/s, {_shards(k)}"
    return [
        Comparison(f"{what}: p50", "us", Figure(handler, "p50"), A_P50, at_most(1000, "1 ms")),
        Comparison(f"{what}: p99", "us", Figure(handler, "p99"), A_P99),
        Comparison(f"{what}: p50", "us", Figure(handler, "p50"), E_HANDLER_P50, HANDLER_P50_GOAL),
    ]


def _pull_and_ask() -> list[Comparison]:
    """fetch + confirmed acks beside push consumption, and request beside publish, on
    the biggest broker (bench/pull_and_ask.py)."""
    shards = _shards(BIGGEST)
    drain = f"drain {DRAIN_N:,} waiting, {shards}"
    push = Floor(
        f"the same drained by subscribe (push, credit {PUSH_CREDIT})", Figure("drain_push")
    )
    push_cpu = Floor("router CPU per message drained by push", Figure("drain_push", "router_cpu"))
    handler_p50 = Floor(
        f"publish -> handler @ {OFFERED_RATE:,}/s: p50", Figure(f"handler_{BIGGEST}", "p50")
    )
    publish_p50 = Floor("publish, 1 in flight: p50", Figure(f"single_{BIGGEST}", "p50"))
    publish_p99 = Floor("publish, 1 in flight: p99", Figure(f"single_{BIGGEST}", "p99"))
    fetch_ack = f"publish -> fetch(wait) -> ack(), 1 at a time, {shards}"
    request = f"request -> reply, 1 at a time, {shards}"
    threads = REQUEST_THREADS
    return [
        Comparison(
            f"{drain}, subscribe (push, credit {PUSH_CREDIT}), acks durable",
            "msg/s",
            push.figure,
        ),
        *(
            Comparison(f"{drain}, {how}", "msg/s", Figure(contender), push)
            for contender, how in (
                ("drain_fetch_ack", f"fetch(batch={FETCH_BATCH}) + ack() each"),
                ("drain_fetch_async", f"fetch(batch={FETCH_BATCH}) + ack_async() all, then wait"),
                (
                    "drain_fetch_async_big",
                    f"fetch(batch={FETCH_BIG_BATCH}) + ack_async() all, then wait",
                ),
            )
        ),
        Comparison(
            f"router CPU per message drained, fetch(batch={FETCH_BATCH}) + ack() each",
            "us",
            Figure("drain_fetch_ack", "router_cpu"),
            push_cpu,
        ),
        Comparison(
            f"router CPU per message drained, fetch(batch={FETCH_BIG_BATCH}) + ack_async()",
            "us",
            Figure("drain_fetch_async_big", "router_cpu"),
            push_cpu,
        ),
        Comparison(
            f"publish -> fetch(wait) answered, 1 at a time, {shards}: p50",
            "us",
            Figure("fetch_rt", "fetch_p50"),
            handler_p50,
        ),
        Comparison(f"{fetch_ack}: p50", "us", Figure("fetch_rt", "p50"), handler_p50),
        Comparison(f"{fetch_ack}: p50", "us", Figure("fetch_rt", "p50"), publish_p50),
        Comparison(f"{fetch_ack}: p99", "us", Figure("fetch_rt", "p99"), publish_p99),
        Comparison(f"{request}: p50", "us", Figure("request", "p50"), publish_p50),
        Comparison(f"{request}: p99", "us", Figure("request", "p99"), publish_p99),
        Comparison(
            f"request -> reply, {threads} threads of one client, {shards}",
            "req/s",
            Figure("request_threaded"),
            Floor(f"publish, {threads} threads of one client", Figure("publish_threaded")),
        ),
        Comparison(
            f"router CPU per request, {threads} threads, {shards}",
            "us",
            Figure("request_threaded", "router_cpu"),
            Floor(
                f"router CPU per publish, {threads} threads",
                Figure("publish_threaded", "router_cpu"),
            ),
        ),
    ]


def _signals(k: int) -> list[Comparison]:
    """Signals to a second client's on_signal, beside raw PUB/SUB (d); client.signal()
    in a loop beside a raw round trip (c)."""
    shards, pipelined, no_reply = _shards(k), f"signals_{k}", f"signals_no_reply_{k}"
    return [
        Comparison(
            f"signals to on_signal, {INFLIGHT} in flight, {shards}",
            "sig/s",
            Figure(pipelined),
            D_RATE,
            at_least_share(0.5, "(d)"),
            lost=Figure(pipelined, "lost"),
        ),
        Comparison(
            f"signals to on_signal, signal(wait=False), {shards}",
            "sig/s",
            Figure(no_reply),
            D_RATE,
            at_least_share(0.5, "(d)", lost_at_most=SIGNAL_NO_REPLY_N / 100),
            lost=Figure(no_reply, "lost"),
        ),
        Comparison(
            f"client.signal() in a loop, {shards}", "req/s", Figure(f"signal_sync_{k}"), C_RATE
        ),
    ]


COMPARISONS: list[Comparison] = [
    *_the_floor(),
    *(row for k in SHARD_COUNTS for row in _publishes(k)),
    *_reliability_fanout_memory(),
    *(row for k in SHARD_COUNTS for row in _handler(k)),
    *_pull_and_ask(),
    *(row for k in SHARD_COUNTS for row in _signals(k)),
]


def goal_rows() -> list[Comparison]:
    """The rows that carry a goal of issue 27 (bench/goals.py measures only these)."""
    return [c for c in COMPARISONS if any(c.goal is goal for goal in ISSUE_27_GOALS)]


def contenders_named(comparisons: list[Comparison]) -> set[str]:
    """Every contender whose figures the rows read."""
    return {figure.contender for c in comparisons for figure in c.figures()}
