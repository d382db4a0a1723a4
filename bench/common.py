"""Shared pieces of the benchmark harness: interleaved rounds, medians, table rows.

These machines are noisy, so every figure is the median of several rounds, and the
rounds of a Relay figure and of its ceiling alternate (A B A B ...) so that a slow
moment of the machine hits both alike. Each row puts Relay beside its ceiling.
"""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Row:
    metric: str  # what was measured, e.g. "trie match, 10k patterns, cached"
    relay: float  # Relay's figure
    unit: str  # "msg/s", "match/s", "us", ...
    ceiling_name: str = ""  # what Relay is set beside, e.g. "linear matcher"
    ceiling: float | None = None
    goal: str = ""  # the goal in words, e.g. ">= 200,000/s"
    met: bool | None = None  # whether the goal was met, when it can be judged

    @property
    def ratio(self) -> float | None:
        if not self.ceiling:
            return None
        return self.relay / self.ceiling

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def interleave(rounds: int, **contenders: Callable[[], float]) -> dict[str, float]:
    """Run each contender once per round, alternating; return the median of each."""
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run_once in contenders.items():
            results[name].append(run_once())
    return {name: statistics.median(values) for name, values in results.items()}


def remove_when_done(path: str | os.PathLike[str]) -> None:
    """Delete a benchmark's files when the whole run is over, not now: on this disk
    (ext4 mounted with discard) a mass delete slows the file creation of the following
    seconds, which would land on the next module's figures (docs/performance.md)."""
    atexit.register(shutil.rmtree, path, True)


def stop_broker(broker) -> None:
    """Stop a tests.harness.Broker, keeping its files for `remove_when_done`."""
    remove_when_done(broker.home.root)
    remove_when_done(broker.logs)
    broker.stop()


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def cpu_us(pid: int) -> float:
    """The CPU time a process has used so far, user and system, all its threads
    (ZeroMQ's I/O threads included), in µs: utime + stime from /proc/<pid>/stat, which
    counts in clock ticks (usually 10 ms each, so measure runs of a second or more)."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name (field 2) may hold spaces; the fields after it do not.
        fields = stat.read().rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) * 1_000_000 / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """The resident set size of a process in MiB, from VmRSS in /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")
