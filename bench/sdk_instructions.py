"""The SDK's instructions per message on the handler row's path, counted by callgrind
against the stand-in brokers, so that the count does not move with load or the disk.

    python -m bench.sdk_instructions [--path publish_async|consume|publish] [--count N]
                                     [--rate R] [--out DIR]

Runs itself again under ``valgrind --tool=callgrind --instr-atstart=no`` (the stand-in
process, started by exec, runs natively). Inside, after a warm-up, ``callgrind_control``
switches the count on for ``--count`` messages and dumps it:

- ``publish_async``: the publisher's side of the handler row (bench/relay_broker.py
  `handler_latency`): `publish_async` at ``--rate`` per second, against
  bench/sdk_path.py's stand-in, which answers each as a stored publish; then every
  future's `PublishResult` is read.
- ``consume``: the consumer's side: bench/consumer_path.py's stand-in pushes ``--count``
  messages at ``--rate``, a subscription's handler notes each; its answers and their
  replies, which nobody waits for.
- ``publish``: a synchronous publish, one in flight (the caller reads its own reply).

The rate is low by default (50/s): under callgrind the SDK runs some fifty times
slower, and at the handler row's 1,000/s messages would arrive in bursts and take
another path than one at a time. Prints one JSON line: instructions of the whole
process (every thread: the SDK's, ZeroMQ's) per message, and the callgrind file (read
it with ``callgrind_annotate``). Instructions are user space only. A measurement:
nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import consumer_path, sdk_path
from bench.common import paced, stand_in_at
from bench.router_instructions import callgrind, totals
from sdk.client import Client

INSIDE = "RELAY_BENCH_UNDER_CALLGRIND"  # set for the run under valgrind: its dump name
WARM = 100
Runner = Callable[[], None]  # the measured messages, sent or consumed


def publish_async(client: Client, count: int, rate: float) -> None:
    futures = []
    for n in paced(count, rate):
        payload = {**sdk_path.PAYLOAD, "n": n, "t": time.monotonic_ns()}
        futures.append(client.publish_async(sdk_path.SUBJECT, payload, sender=sdk_path.SENDER))
    for future in futures:
        future.result(60)


def publish(client: Client, count: int, rate: float) -> None:
    for n in paced(count, rate):
        client.publish(sdk_path.SUBJECT, {**sdk_path.PAYLOAD, "n": n}, sender=sdk_path.SENDER)


def counted(dump: str, run: Runner) -> None:
    """``run()`` with callgrind counting, dumped under ``dump``."""
    pid = os.getpid()
    callgrind(pid, "--zero")
    callgrind(pid, "--instr=on")
    run()
    callgrind(pid, "--dump=" + dump)
    callgrind(pid, "--instr=off")


def workload(path: str, count: int, rate: float, measured: Callable[[Runner], None]) -> None:
    """``path``'s workload against its stand-in: `WARM` messages, then ``count`` more
    run inside ``measured`` (which counts what it wants around the run it is given)."""
    home = Path(tempfile.mkdtemp(prefix="relay-sdk-workload-"))
    if path == "consume":
        seen: list[int] = []
        with stand_in_at(home, consumer_path.stand_in) as address:
            client = Client(address, timeout=120)
            client.subscribe(consumer_path.SUBJECT, lambda envelope: seen.append(1))
            consumer_path.stand_in_round(client, WARM, rate, seen)
            seen.clear()
            measured(lambda: consumer_path.stand_in_round(client, count, rate, seen))
            client.close()
        return
    with stand_in_at(home, sdk_path.stand_in) as address:
        client = Client(address, timeout=120)
        run = publish_async if path == "publish_async" else publish
        run(client, WARM, rate)
        measured(lambda: run(client, count, rate))
        client.close()


def inside(args: argparse.Namespace) -> None:
    workload(args.path, args.count, args.rate, lambda run: counted(args.path, run))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sdk_instructions", description=__doc__)
    parser.add_argument("--path", choices=("publish_async", "consume", "publish"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=Path("build/callgrind"))
    args = parser.parse_args()
    args.path = args.path or "publish_async"
    if os.environ.get(INSIDE):
        inside(args)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    args.out.mkdir(parents=True, exist_ok=True)
    out = (args.out / f"sdk-{args.path}.%p").resolve()
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    command += [f"--callgrind-out-file={out}", sys.executable, "-m", "bench.sdk_instructions"]
    command += ["--path", args.path, "--count", str(args.count), "--rate", str(args.rate)]
    child = subprocess.run(command, env={**os.environ, INSIDE: "1"}, capture_output=True)
    if child.returncode:
        sys.exit(child.stderr.decode(errors="replace")[-3000:])
    dump = args.out / f"sdk-{args.path}.{child_pid(child.stderr)}.1"
    instructions, _ = totals(dump)
    figures = {
        "path": args.path,
        "count": args.count,
        "rate": args.rate,
        "per_message": round(instructions / args.count),
        "file": str(dump),
    }
    print(json.dumps(figures), flush=True)


def child_pid(stderr: bytes) -> int:
    """The pid valgrind names in its log lines (``==1234== ...``)."""
    line = next(line for line in stderr.decode(errors="replace").splitlines() if "==" in line)
    return int(line.split("==")[1])


if __name__ == "__main__":
    main()
