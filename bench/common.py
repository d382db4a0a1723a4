"""Shared pieces of the benchmark harness: interleaved rounds, medians, percentiles,
table rows, a real disk to measure on, and the per-process figures read from /proc.

These machines are noisy, so every figure is the median of several rounds, and the
rounds of a Relay figure and of its ceiling alternate (A B A B ...) so that a slow
moment of the machine hits both alike. Each row puts Relay beside its ceiling.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sdk import wire

# Figures of one contender's round, by name ("rate", "p50", "router_cpu", ...).
Figures = dict[str, float]


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


def interleave_figures(
    rounds: int, contenders: dict[str, Callable[[], Figures]]
) -> dict[str, Figures]:
    """Each contender once per round, in order; the median of each of its figures."""
    seen: dict[str, dict[str, list[float]]] = {name: {} for name in contenders}
    for _ in range(rounds):
        for name, run_once in contenders.items():
            for key, value in run_once().items():
                seen[name].setdefault(key, []).append(value)
    return {
        name: {key: statistics.median(values) for key, values in figures.items()}
        for name, figures in seen.items()
    }


def paced(count: int, per_second: float) -> Iterator[int]:
    """0 to ``count`` - 1, each at its time of a fixed rate from now (sleeping until
    then; one that is late comes at once): an offered load, as the handler row's."""
    start = time.monotonic()
    for n in range(count):
        delay = start + n / per_second - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield n


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def p50_p99(latencies: list[float]) -> Figures:
    """The median and the 99th percentile of a run's latencies."""
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


def fs_type(path: str) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/mounts)."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                _, mount_point, fstype, *_ = line.split()
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, kind = mount_point, fstype
    except OSError:
        pass
    return kind


def fsync_dir(path: str) -> None:
    """Flush a directory: what makes a rename into it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Set by a runner of several bench processes in turn (bench/trees.py): their
# directories go under it, and it deletes them all once the last run is over.
KEEP_UNDER = "RELAY_BENCH_KEEP_UNDER"


def base_dir() -> Path:
    """A fresh directory on a real disk: under /tmp unless /tmp is tmpfs (or under
    $RELAY_BENCH_KEEP_UNDER, see `remove_when_done`)."""
    if os.environ.get(KEEP_UNDER):
        return Path(tempfile.mkdtemp(prefix="relay-bench-", dir=os.environ[KEEP_UNDER]))
    parent = "/tmp"
    if fs_type(parent) in ("tmpfs", "ramfs"):
        parent = str(Path(__file__).parent / "results" / "tmp")
        os.makedirs(parent, exist_ok=True)
    if fs_type(parent) in ("tmpfs", "ramfs"):
        raise SystemExit(f"{parent} is {fs_type(parent)}: fsync costs nothing there")
    return Path(tempfile.mkdtemp(prefix="relay-bench-", dir=parent))


def remove_when_done(path: str | os.PathLike[str]) -> None:
    """Delete a benchmark's files when the whole run is over, not now: on this disk
    (ext4 mounted with discard) a mass delete slows the file creation of the following
    seconds, which would land on the next module's figures (docs/performance.md). Under
    $RELAY_BENCH_KEEP_UNDER, not even then: the next run's figures would take it."""
    if not os.environ.get(KEEP_UNDER):
        atexit.register(shutil.rmtree, path, True)


@contextlib.contextmanager
def stand_in_at(home: Path, serve: Callable[[str], None]) -> Iterator[str]:
    """A process running ``serve(address)`` in place of a broker, on an ipc:// address
    in ``home``; the address, then the process killed and ``home`` left to
    `remove_when_done`."""
    address = f"ipc://{home}/stand-in.sock"
    spawn = multiprocessing.get_context("spawn")
    process = spawn.Process(target=serve, args=(address,), daemon=True)
    process.start()
    try:
        yield address
    finally:
        process.kill()
        remove_when_done(home)


def stand_in_hello(address: str, subs: list[int]) -> dict[str, object]:
    """What a stand-in broker answers to hello and ping: batches allowed, a session, the
    subscriptions it holds, a signals address beside ``address``."""
    return {
        "session": "stand-in",
        "batch": wire.MAX_BATCH,
        "subs": subs,
        "sessionTimeoutMs": 5000,
        "signals": f"{address}-signals",
    }


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
