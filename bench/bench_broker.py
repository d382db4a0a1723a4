"""The broker end to end: real router and writer processes, driven through the SDK,
each figure beside the bare loop or bare socket pattern it is built on, measured in the
same run.

Floors (raw Python, no Relay code; bench/floors.py): (a) one durable file at a time,
(b) the same batched by 100, (c) a DEALER ⇄ ROUTER round trip, (d) PUB → SUB, and
(e) the architecture itself: client → middle → two writers → middle → client, doing only
the durable work. Relay cannot be faster than its own shape.

Relay (bench/relay_broker.py, bench/relay_signals.py, bench/pull_and_ask.py): durable
publish with 1 in flight (one endpoint) and with 100 in flight (8 endpoints spread over
the shards), for 1 and 2 shards, with the router's CPU time per publish during the
100-in-flight run; the same with the reliability checks off; a wildcard publish that fans
out to 10 endpoints; publish → consumer handler latency at an offered 1,000 msg/s; the
router's VmRSS right after the broker is ready and after all rounds ran; signals to a
second client's ``on_signal``; and on the 2-shard broker, ``fetch`` with confirmed acks
beside push consumption and ``request`` -> ``reply`` beside a publish.

The table is bench/comparisons.py: a list of rows, each a Relay figure, what it is set
beside, and its goal. Every figure is the median of ``rounds`` interleaved rounds (all
contenders once per round, Relay beside its floor). The broker homes and the raw files
live on a real disk (``/tmp`` when it is not tmpfs, else ``bench/results/tmp``): fsync
must cost what it costs.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.common import Figures, Row, base_dir, fs_type, interleave_figures, remove_when_done
from bench.comparisons import COMPARISONS, Comparison, contenders_named, table
from bench.floors import RawDisk, RawPipeline, RawZmq
from bench.pull_and_ask import PullAndAsk
from bench.relay_broker import RelayBroker
from bench.relay_signals import RelaySignals
from bench.workload import FETCH_BATCH, FETCH_BIG_BATCH, SHARD_COUNTS

# Taken after every round, not a contender: the router of the broker the fan-out and
# reliability rows used (RelayBroker.rss).
RSS = "rss"


def rows(rounds: int = 3, comparisons: list[Comparison] = COMPARISONS) -> list[Row]:
    """The table's ``comparisons`` (all its rows by default), measured over ``rounds``
    interleaved rounds: only the workloads those rows read are run."""
    needed = contenders_named(comparisons)
    base = base_dir()
    brokers: dict[int, RelayBroker] = {}
    raw_zmq: RawZmq | None = None
    pipeline: RawPipeline | None = None
    try:
        disk = RawDisk(base)
        raw_zmq = RawZmq(base)
        pipeline = RawPipeline(base)
        signals: dict[int, RelaySignals] = {}
        for shards in SHARD_COUNTS:
            brokers[shards] = RelayBroker(shards, base / f"home-{shards}")
            signals[shards] = RelaySignals(brokers[shards])
        biggest = brokers[max(SHARD_COUNTS)]
        pull = PullAndAsk(biggest)
        run = _contenders(disk, raw_zmq, pipeline, brokers, signals, pull)
        missing = needed - run.keys() - {RSS}
        if missing:  # before the long run, not after it
            raise RuntimeError(f"the table reads contenders nobody runs: {sorted(missing)}")
        measured = interleave_figures(rounds, {k: v for k, v in run.items() if k in needed})
        measured[RSS] = {"start": biggest.rss_start, "after": biggest.rss()}
    finally:
        for broker in brokers.values():
            broker.cleanup()
        if raw_zmq is not None:
            raw_zmq.close()
        if pipeline is not None:
            pipeline.close()
        remove_when_done(base)
    return table(comparisons, measured, fs_type(str(base.parent)))


def _contenders(
    disk: RawDisk,
    raw_zmq: RawZmq,
    pipeline: RawPipeline,
    brokers: dict[int, RelayBroker],
    signals: dict[int, RelaySignals],
    pull: PullAndAsk,
) -> dict[str, Callable[[], Figures]]:
    """Every workload by the name the table reads it under, in the order of a round:
    each Relay figure next to its floor, so that a slow moment hits both alike."""
    biggest = brokers[max(SHARD_COUNTS)]
    run: dict[str, Callable[[], Figures]] = {
        "raw_single": disk.single,
        "pipeline_single": pipeline.single,
    }
    for k, b in brokers.items():
        run[f"single_{k}"] = b.publish_single
    run["raw_batched"] = disk.batched
    run["pipeline_pipelined"] = pipeline.pipelined
    for k, b in brokers.items():
        run[f"pipelined_{k}"] = b.publish_pipelined
    run["unguarded"] = biggest.publish_pipelined_unguarded
    run["fanout"] = biggest.publish_fanout
    run["raw_rt"] = raw_zmq.round_trip
    run["raw_rt_pipelined"] = raw_zmq.pipelined
    for k, s in signals.items():
        run[f"signal_sync_{k}"] = s.sync
    run["raw_pubsub"] = raw_zmq.pubsub
    for k, s in signals.items():
        run[f"signals_{k}"] = s.pipelined
        run[f"signals_no_reply_{k}"] = s.no_reply
    run["pipeline_handler"] = pipeline.handler
    for k, b in brokers.items():
        run[f"handler_{k}"] = b.handler_latency
    # Pull and ask beside push consumption and plain publishes, on one broker.
    run["drain_push"] = pull.drain_push
    run["drain_fetch_ack"] = lambda: pull.drain_fetch(FETCH_BATCH, together=False)
    run["drain_fetch_async"] = lambda: pull.drain_fetch(FETCH_BATCH, together=True)
    run["drain_fetch_async_big"] = lambda: pull.drain_fetch(FETCH_BIG_BATCH, together=True)
    run["fetch_rt"] = pull.fetch_round_trip
    run["request"] = pull.request_single
    run["publish_threaded"] = pull.publish_threaded
    run["request_threaded"] = pull.request_threaded
    return run


if __name__ == "__main__":
    from bench.__main__ import table as print_table

    print(print_table(rows()))
