"""CPU per publish of each broker process at 100 in flight, beside floor (e).

``python -m bench.process_cpu [--rounds N] [--shards N] [--label L] [--workload W]``
starts a broker (2 shards unless told) and floor (e) (bench/floors.py `RawPipeline`),
then, per round, runs (e)'s 100-in-flight publishes and Relay's (the broker bench's row,
bench/relay_broker.py) and prints one JSON line: both rates, their ratio, and the CPU µs
per publish of the router, each writer and the benchmark's own process: ``cpu`` in
clock ticks (/proc/<pid>/task/*/stat: about 3 µs per publish over a round of 3,000),
split into user and system time and per thread in ``threads``; ``cpu_exact`` the same
totals from the scheduler's nanosecond run times (/proc/<pid>/task/*/schedstat), which
a tick's rounding does not blur; ``e_cpu_exact`` the same for (e)'s processes.
``--workload handler`` runs the publish -> handler rows at 1,000 messages/s instead
(Relay's and (e)'s, interleaved as above): their p50s, and the CPU per message of each
process of both. To compare two trees, run it in each in turn (A B A B ...), as
docs/performance.md ("The router's and writers' CPU per publish") did.
"""

from __future__ import annotations

import argparse
import json
import os

from bench.common import base_dir, remove_when_done
from bench.floors import RawPipeline
from bench.relay_broker import RelayBroker
from bench.workload import OFFERED_RATE, OFFERED_SECONDS, PIPELINED_N

Ticks = dict[str, tuple[int, int]]  # "thread name:tid" -> (utime, stime)


def thread_ticks(pid: int) -> Ticks:
    ticks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as stat:
            # The command name (field 2) may hold spaces; the fields after it do not.
            fields = stat.read().rpartition(")")[2].split()
        with open(f"/proc/{pid}/task/{tid}/comm") as comm:
            name = comm.read().strip()
        ticks[f"{name}:{tid}"] = (int(fields[11]), int(fields[12]))
    return ticks


def run_ns(pid: int) -> int:
    """The nanoseconds on a CPU of a process's threads, from the scheduler's count."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as schedstat:
            total += int(schedstat.read().split()[0])
    return total


def per_publish(before: Ticks, after: Ticks, count: int) -> dict[str, list[float]]:
    """µs [user, system] per publish, by thread name (threads of one name summed)."""
    tick_us = 1_000_000 / os.sysconf("SC_CLK_TCK")
    used: dict[str, list[float]] = {}
    for thread, (user, system) in after.items():
        user0, system0 = before.get(thread, (0, 0))
        name = thread.rpartition(":")[0]
        total = used.setdefault(name, [0.0, 0.0])
        total[0] += (user - user0) * tick_us / count
        total[1] += (system - system0) * tick_us / count
    return {name: [round(u, 1), round(s, 1)] for name, (u, s) in used.items() if u or s}


def run_ns_of(pids: dict[str, int]) -> dict[str, int]:
    return {name: run_ns(pid) for name, pid in pids.items()}


def us_per_message(before: dict[str, int], after: dict[str, int], count: int) -> dict[str, float]:
    """µs on a CPU per message, by process, between two `run_ns_of` counts."""
    return {name: round((after[name] - before[name]) / 1000 / count, 1) for name in before}


def pipeline_pids(pipeline: RawPipeline) -> dict[str, int]:
    names = ["middle"] + [f"writer-{w}" for w in range(len(pipeline.children) - 1)]
    return {name: child.pid for name, child in zip(names, pipeline.children, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--workload", choices=["in_flight", "handler"], default="in_flight")
    args = parser.parse_args()
    base = base_dir()
    pipeline = RawPipeline(base)
    relay = RelayBroker(args.shards, base / f"home-{args.shards}")
    pids = {name: proc.pid for name, proc in relay.broker.procs.items()}
    pids["bench"] = os.getpid()
    e_pids = {**pipeline_pids(pipeline), "bench": os.getpid()}
    handler = args.workload == "handler"
    count = int(OFFERED_RATE * OFFERED_SECONDS) if handler else PIPELINED_N
    try:
        for round_no in range(args.rounds):
            e_before = run_ns_of(e_pids)
            floor = pipeline.handler()["p50"] if handler else pipeline.pipelined()["rate"]
            e_exact = us_per_message(e_before, run_ns_of(e_pids), count)
            before = {name: thread_ticks(pid) for name, pid in pids.items()}
            ns_before = run_ns_of(pids)
            if handler:
                figure = relay.handler_latency()["p50"]
            else:
                figure = relay.in_flight(PIPELINED_N, relay.spread, 1)["rate"]
            ns_after = run_ns_of(pids)
            after = {name: thread_ticks(pid) for name, pid in pids.items()}
            threads = {name: per_publish(before[name], after[name], count) for name in pids}
            cpu = {
                name: round(sum(u + s for u, s in used.values()), 1)
                for name, used in threads.items()
            }
            figures = {"label": args.label, "round": round_no, "relay": round(figure)}
            figures.update({"e": round(floor), "ratio": round(figure / floor, 3)})
            exact = us_per_message(ns_before, ns_after, count)
            figures.update({"load": os.getloadavg()[0], "cpu": cpu, "cpu_exact": exact})
            figures["e_cpu_exact"] = e_exact
            figures["threads"] = threads
            print(json.dumps(figures), flush=True)
    finally:
        relay.cleanup()
        pipeline.close()
        remove_when_done(base)


if __name__ == "__main__":
    main()
