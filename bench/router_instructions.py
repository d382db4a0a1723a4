"""The router's instructions per publish and per consumed message, counted by callgrind.

``python -m bench.router_instructions [--workload in_flight|handler] [--count N]
[--rate R] [--shards N] [--out DIR]`` starts a broker (2 shards unless told) whose
router runs under ``valgrind --tool=callgrind`` (writers and clients run natively),
warms it as the broker bench does (bench/relay_broker.py), then counts the router's
instructions over one workload only (``callgrind_control`` switches the count on before
it and dumps it after):

- ``in_flight``: N publishes, 100 in flight, over the bench's 8 endpoints (the router
  CPU row of issue 27);
- ``handler``: N messages published at R per second to an endpoint a subscription
  consumes, each waiting for its handler before the next is due (``handler_latency``
  with the router slowed ~50-fold by valgrind: at R = 20 every message has its passes
  to itself, as at 1,000/s natively: the publish, the writer's "stored", the ack, the
  writer's answer to it).

Prints one JSON line: instructions per publish (or message), the router's loop passes
per publish (counted with the compiled units in use), and the instructions per pass,
from the callgrind file it leaves in DIR (read it with ``callgrind_annotate``).
Instruction counts do not move with the machine's load, so two trees can be compared
with a run or two each.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import base_dir, remove_when_done
from bench.relay_broker import RelayBroker
from bench.workload import PAYLOAD, SENDER

READY_S = 300.0  # the router's start under valgrind takes a minute or more


def callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


# Called once at the end of each pass of the loop (broker/router/loop.py `_end_of_pass`),
# compiled: its calls count the passes (none when the build is not in use).
PASS_MARK = "CPyDef_delivery___Ledger___feed_refilled"


def totals(path: Path) -> tuple[int, int]:
    """(instructions, calls of `PASS_MARK`) of one callgrind dump."""
    text = path.read_text()
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
    instructions = int(found.group(1)) if found else 0
    names: dict[str, str] = {}  # callgrind names a function once, then by its number
    passes = 0
    lines = text.splitlines()
    for n, line in enumerate(lines):
        named = re.match(r"(c?)fn=\((\d+)\)(?: (.*))?", line)
        if named is None:
            continue
        called, ident, name = named.groups()
        if name:
            names[ident] = name
        if called and names.get(ident) == PASS_MARK:  # next: "calls=<count> <target>"
            passes += int(lines[n + 1].split()[0].partition("=")[2])
    return instructions, passes


def consume(relay: RelayBroker, count: int, rate: float) -> None:
    """``count`` messages at ``rate``/s to the consumed endpoint, each seen by the
    handler before the next is published."""
    relay.round += 1
    with relay.lock:
        relay.latencies = []
    for n in range(count):
        due = time.monotonic() + 1 / rate
        payload = {**PAYLOAD, "round": relay.round, "t": time.monotonic_ns()}
        relay.publisher.publish_async(relay.sink, payload, sender=SENDER).result(60)
        deadline = time.monotonic() + 60
        while len(relay.latencies) <= n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"handler saw {len(relay.latencies)}/{n + 1} messages")
            time.sleep(0.001)
        time.sleep(max(0.0, due - time.monotonic()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=("in_flight", "handler"), default="in_flight")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("build/callgrind"))
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    args.out.mkdir(parents=True, exist_ok=True)
    out = (args.out / f"router-{args.workload}-{args.shards}.%p").resolve()
    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    wrapper.append(f"--callgrind-out-file={out}")
    base = base_dir()
    home = base / f"home-{args.shards}"
    relay = RelayBroker(args.shards, home, router_wrapper=wrapper, ready_timeout=READY_S)
    pid = relay.broker.procs["router"].pid
    try:
        time.sleep(1.0)  # the ack of the warm-up's last messages
        callgrind(pid, "--zero")
        callgrind(pid, "--instr=on")
        if args.workload == "in_flight":
            relay.in_flight(args.count, relay.spread, 1)
        else:
            consume(relay, args.count, args.rate)
            time.sleep(0.5)  # the last ack's passes
        callgrind(pid, "--dump=" + args.workload)
        callgrind(pid, "--instr=off")
    finally:
        relay.cleanup()
        remove_when_done(base)
    dump = args.out / f"router-{args.workload}-{args.shards}.{pid}.1"  # the first (only) dump
    instructions, passes = totals(dump)
    figures = {
        "workload": args.workload,
        "shards": args.shards,
        "count": args.count,
        "instructions": instructions,
        "per_message": round(instructions / args.count),
        "passes_per_message": round(passes / args.count, 2),
        "per_pass": round(instructions / passes) if passes else None,
        "file": str(dump),
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
