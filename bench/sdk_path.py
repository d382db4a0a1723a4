"""The SDK's own share of a synchronous publish, 1 in flight: what it adds to the same
request on a bare DEALER, and where in the SDK that time goes.

    python -m bench.sdk_path [--rounds N] [--block N] [--stages N] [--stand-in]

Starts a broker (2 shards, real processes, a home of its own). Then, ``--rounds``
times, ``--block`` publishes through `Client.publish` and as many of the same request
(same subject, payload and sender) on a bare DEALER that sends and reads itself: the
median of each and their difference is the SDK's cost (its threads, futures, the
reply's conversion), measured in the same minutes as the broker's own time, and the
CPU time of this process per publish (all its threads: the SDK's and ZeroMQ's). With
``--stand-in``, no broker: a process that answers every request at once, the same
for both (no disk, no policy), so the figures are the SDK's and ZeroMQ's alone and
do not move with the disk. Then
``--stages`` publishes, each after 5 ms of sleep (every thread asleep, as in the
bench's handler row), with timestamps taken by wrapping the SDK's functions from
outside: the median time of each stage (with ``RELAY_PURE=1`` only: a compiled class
refuses a wrapped method, sdk/compiled.py). A measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

import sdk.transport as transport
from bench.common import remove_when_done, stand_in_at, stand_in_hello, stop_broker
from sdk import compiled, wire
from sdk.client import Client
from tests.harness import Broker

SUBJECT, SENDER = "relay.agent.bench.path", "relay.agent.bench.producer"
PAYLOAD = {"content": "x" * 300, "performative": "inform"}
# What the stand-ins answer to a publish: stored, one copy.
STORED = {"messageId": "01JDQ3ZV9R6Q4W1T3M00000000", "deliveredTo": 1, "rejected": []}
STORED |= {"mailboxPressure": {"0123456789ab": 0.001}, "details": {}}
# Marks taken along a publish, in order; a stage ends at its mark and starts at the
# previous one the publish passed (a caller that sends its request itself passes no
# "io_woke").
STAGES = {
    "I/O thread wakes and takes the request (its path only)": "io_woke",
    "the request is sent on the DEALER": "on_dealer",
    "broker: router, writer, router (until the reply is read)": "read",
    "reply decoded, futures resolved": "taken",
    "publish() returns": "caller",
}


def sdk_cost(client: Client, rounds: int, block: int) -> dict[str, float]:
    bare = zmq.Context.instance().socket(zmq.DEALER)
    bare.setsockopt(zmq.LINGER, 0)
    bare.connect(client.address)
    bare.send_multipart(wire.encode_request("hello", 1, client="bench", batch=False))
    bare.recv_multipart()
    fields: dict[str, Any] = {"subject": SUBJECT, "payload": PAYLOAD, "from": SENDER}
    through_sdk: list[float] = []
    on_bare: list[float] = []
    sdk_cpu: list[float] = []
    bare_cpu: list[float] = []
    for n in range(rounds):
        cpu = _cpu_us()
        for _ in range(block):
            t0 = time.perf_counter_ns()
            client.publish(SUBJECT, PAYLOAD, sender=SENDER)
            through_sdk.append((time.perf_counter_ns() - t0) / 1000)
        sdk_cpu.append((_cpu_us() - cpu) / block)
        cpu = _cpu_us()
        for k in range(block):
            t0 = time.perf_counter_ns()
            bare.send_multipart(wire.encode_request("publish", 2 + n * block + k, **fields))
            (reply,) = wire.decode_incoming_all(bare.recv_multipart())
            on_bare.append((time.perf_counter_ns() - t0) / 1000)
            assert isinstance(reply, wire.Reply) and reply.ok, reply
        bare_cpu.append((_cpu_us() - cpu) / block)
    bare.close(0)
    sdk_p50, bare_p50 = statistics.median(through_sdk), statistics.median(on_bare)
    return {
        "sdk p50": sdk_p50,
        "bare p50": bare_p50,
        "SDK's cost": sdk_p50 - bare_p50,
        "sdk CPU per publish (this process)": statistics.median(sdk_cpu),
        "bare CPU per publish (this process)": statistics.median(bare_cpu),
    }


def _cpu_us() -> float:
    """This process's CPU time so far, all threads, µs (in clock ticks: use blocks of
    a hundred publishes or more)."""
    times = os.times()
    return (times.user + times.system) * 1e6


def stages(client: Client, count: int) -> dict[str, float]:
    """Median µs of each stage (see STAGES), by wrapping the transport's functions."""
    marks: dict[str, int] = {}
    now = time.perf_counter_ns

    def mark(cls: Any, name: str, label: str, *, after: bool) -> None:
        original = getattr(cls, name)

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not after:
                marks.setdefault(label, now())
            result = original(self, *args, **kwargs)
            if after:
                marks.setdefault(label, now())
            return result

        setattr(cls, name, wrapped)

    mark(transport.Transport, "_forward", "io_woke", after=False)
    mark(transport.Transport, "_take", "taken", after=True)
    send_parts, decode = transport.send_parts, wire.decode_incoming_all

    def sent(sock: zmq.Socket, parts: Any, flags: int = 0, copy: bool = True) -> None:
        send_parts(sock, parts, flags, copy)
        marks.setdefault("on_dealer", now())

    def read(frames: Any) -> Any:
        marks.setdefault("read", now())
        return decode(frames)

    transport.send_parts = sent  # type: ignore[assignment]
    wire.decode_incoming_all = read  # type: ignore[assignment]
    spans: dict[str, list[float]] = {label: [] for label in STAGES.values()}
    for _ in range(count):
        time.sleep(0.005)
        marks.clear()
        start = now()
        client.publish(SUBJECT, PAYLOAD, sender=SENDER)
        marks["caller"] = now()
        previous = start
        for label in spans:
            if label in marks:
                spans[label].append((marks[label] - previous) / 1000)
                previous = marks[label]
    return {
        f"{name} [{len(spans[label])}]": statistics.median(spans[label])
        for name, label in STAGES.items()
        if spans[label]
    }


def stand_in(address: str) -> None:
    """A router that answers every request at once: hello and ping as a router would
    (batches, a session), anything else as a stored publish. Runs until killed."""
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(address)
    session = stand_in_hello(address, [])
    while True:
        peer, _magic, body = sock.recv_multipart()
        requests = wire.unpackb(body)
        many = isinstance(requests, list)
        replies = [
            wire.ok_body(r["rid"], session if r["op"] in ("hello", "ping") else STORED)
            for r in (requests if many else [requests])
            if r.get("reply", True)
        ]
        if replies:
            sock.send_multipart([peer, wire.MAGIC, wire.batch(replies) if many else replies[0]])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sdk_path", description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--stages", type=int, default=200)
    parser.add_argument("--stand-in", action="store_true", help="no broker: see above")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="relay-sdk-path-"))
    if args.stand_in:
        with stand_in_at(home, stand_in) as address:
            measure(Client(address), args)
        return
    broker = Broker(shards=2, home=home)
    broker.start()
    try:
        client = broker.client()
        client.register_endpoint(SUBJECT)
        measure(client, args)
    finally:
        stop_broker(broker)
        remove_when_done(home)


def measure(client: Client, args: argparse.Namespace) -> None:
    for _ in range(100):  # warm every path
        client.publish(SUBJECT, PAYLOAD, sender=SENDER)
    for name, value in sdk_cost(client, args.rounds, args.block).items():
        print(f"{name:60s} {value:8.1f} µs")
    if args.stages and compiled.in_use():
        # Its classes compiled (sdk/compiled.py), the SDK refuses the wrapped functions.
        print("stages: timed by wrapping the SDK's functions; run with RELAY_PURE=1")
    elif args.stages:
        print("stages, each publish after 5 ms asleep (median):")
        for name, value in stages(client, args.stages).items():
            print(f"  {name:58s} {value:8.1f} µs")
    client.close()


if __name__ == "__main__":
    main()
