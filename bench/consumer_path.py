"""The SDK's CPU and wake-ups per consumed message, thread by thread, on the path of the
broker bench's handler row (publish -> handler at a fixed rate).

    python -m bench.consumer_path [--rounds N] [--count N] [--rate R]

Starts a broker (2 shards, real processes, a home of its own), a publisher client and a
consumer client in this process, as bench/relay_broker.py's `handler_latency` does:
the publisher calls `publish_async` at ``--rate`` messages/s, the consumer's handler
notes each arrival. Per round of ``--count`` messages it prints, per thread of this
process (the publisher's caller and I/O thread, the consumer's I/O and handler threads,
ZeroMQ's own), the CPU time per message (/proc/self/task/<tid>/schedstat: nanoseconds
on a CPU, not clock ticks) and the voluntary context switches per message (a thread
that blocks, in poll or on a lock, and is woken again: its wake-ups); and what woke
the consumer's threads, counted by wrapping the SDK's functions from outside: pushes
read, answer batches sent (by whom), the replies to answers that nobody waits for, and
the I/O thread told to watch an answers' deadline. Then the handler's p50 (µs from the
publisher's call). With ``--stand-in``, no broker and no publisher: a process that
answers the consumer's requests at once and pushes ``--count`` messages at ``--rate``
per round, so that the figures are the consuming SDK's and ZeroMQ's alone and do not
move with the disk (p50: from the push leaving the stand-in). The events are counted
on pure Python (``RELAY_PURE=1``, the broker's processes too): a compiled class
(sdk/compiled.py) refuses a wrapped method; ``--no-events`` runs what is installed. A
measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __name__ == "__main__" and "--no-events" not in sys.argv:  # before the SDK is imported
    os.environ["RELAY_PURE"] = "1"

import zmq

import sdk.transport as transport
from bench.common import paced, remove_when_done, stand_in_at, stand_in_hello, stop_broker
from sdk import subscription, subscriptions, wire
from sdk.client import Client
from sdk.ids import new_id
from sdk.types import Budget, Envelope
from tests.harness import Broker

SUBJECT, SENDER = "relay.agent.bench.consume", "relay.agent.bench.producer"
PAYLOAD = {"content": "x" * 300, "performative": "inform"}

Sample = dict[int, tuple[int, int]]  # tid -> (ns on a CPU, voluntary switches)


def sample() -> Sample:
    out = {}
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/status") as f:
                switches = next(
                    int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt")
                )
        except (OSError, StopIteration):
            continue
        out[tid] = (ns, switches)
    return out


def thread_names(publisher: Any, consumer: Any) -> dict[int, str]:
    """Native thread ids of this process, named for their role."""
    names = {threading.main_thread().native_id: "publisher: caller (main)"}
    names[publisher._transport._io.native_id] = "publisher: I/O thread"
    names[consumer._transport._io.native_id] = "consumer: I/O thread"
    for worker in consumer._subscriptions.workers.values():
        names[worker.thread.native_id] = "consumer: handler thread"
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        if tid not in names:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[tid] = f"other: {f.read().strip()}"
    return names


def count_events() -> Counter:
    """Counters of what woke the consumer's threads, by wrapping the SDK's functions."""
    events: Counter = Counter()

    def wrap(cls: Any, name: str, key: Any) -> None:
        original = getattr(cls, name)

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            label = key(self, args) if callable(key) else key
            if label:
                events[f"{label} [{threading.current_thread().name}]"] += 1
            return original(self, *args, **kwargs)

        setattr(cls, name, wrapped)

    wrap(subscriptions.Subscriptions, "pushed", "push read")
    wrap(transport.Transport, "wake", "I/O thread told of an answers' deadline")
    wrap(transport.Transport, "_send_now", "answers sent at their deadline")
    wrap(subscription.SubscriptionWorker, "answer", "answer() called")
    wrap(
        transport.Transport,
        "_take",
        lambda self, args: (
            "reply nobody waits for"
            if not isinstance(args[0], transport.wire.Push)
            and args[0].rid
            and args[0].rid not in self._futures
            else ""
        ),
    )
    return events


def stand_in(address: str) -> None:
    """A router for one consumer: answers hello, ping, subscribe and answers at once, and
    on ``bench_push`` (count, rate) replies and then pushes that many messages at that
    rate to the subscription. Runs until killed."""
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(address)
    session = stand_in_hello(address, [1])
    budget = Budget(0, 5, [], 2**62, 10)
    peer, left, every, next_at = b"", 0, 0.0, 0.0
    while True:
        wait_ms = -1 if not left else max(0, int((next_at - time.monotonic()) * 1000))
        if sock.poll(wait_ms):
            peer, _magic, body = sock.recv_multipart()
            requests = wire.unpackb(body)
            many = isinstance(requests, list)
            replies = []
            for r in requests if many else [requests]:
                if r["op"] == "bench_push":  # answered at once: no reply awaited meanwhile
                    left, every, next_at = r["count"], 1 / r["rate"], time.monotonic()
                result = {"sub": 1, "credit": 64} if r["op"] == "subscribe" else session
                replies.append(wire.ok_body(r["rid"], result))
            if replies:
                sock.send_multipart([peer, wire.MAGIC, wire.batch(replies) if many else replies[0]])
        while left and time.monotonic() >= next_at:
            n = left
            payload = {**PAYLOAD, "n": n, "t": time.monotonic_ns()}
            message_id = new_id()
            envelope = Envelope(message_id, SUBJECT, SENDER, None, budget, 0, payload)
            push = wire.encode_push(1, message_id, "3f0c5bd2a1e4", envelope.to_json(), 1)
            sock.send_multipart([peer, *push])
            left -= 1
            next_at += every


def stand_in_round(client: Client, count: int, rate: float, seen: list[int]) -> None:
    client.wait(client.send_request("bench_push", count=count, rate=rate), "push")
    deadline = time.monotonic() + 30 + count / rate
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the last answers and their replies


def run_round(publisher: Any, count: int, rate: float, seen: list[int], t0: dict) -> None:
    futures = []
    for n in paced(count, rate):
        t0[n] = time.monotonic_ns()
        futures.append(publisher.publish_async(SUBJECT, {**PAYLOAD, "n": n}, sender=SENDER))
    for future in futures:
        future.result(30)
    deadline = time.monotonic() + 30
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the last answers and their replies


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.consumer_path", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-events", action="store_true", help="no wrapping: CPU alone")
    parser.add_argument("--stand-in", action="store_true", help="no broker: see above")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="relay-consumer-path-"))
    events = Counter() if args.no_events else count_events()
    t0: dict[int, int] = {}
    seen: list[int] = []
    latencies: list[float] = []

    def on_message(envelope: Any) -> None:
        now = time.monotonic_ns()
        n = envelope.payload["n"]
        seen.append(n)
        sent = envelope.payload.get("t", t0.get(n))
        if sent is not None:
            latencies.append((now - sent) / 1000)

    def measure(publisher: Any, consumer: Any, one_round: Any) -> None:
        names = thread_names(publisher, consumer)
        for round_no in range(args.rounds):
            for kept in (seen, latencies, t0, events):
                kept.clear()
            before = sample()
            one_round()
            after = sample()
            per: dict[str, list[float]] = {}
            for tid, (ns, switches) in after.items():
                ns0, switches0 = before.get(tid, (0, 0))
                total = per.setdefault(names.get(tid, f"other: {tid}"), [0.0, 0.0])
                total[0] += (ns - ns0) / 1000 / args.count
                total[1] += (switches - switches0) / args.count
            figures = {
                "round": round_no,
                "load": os.getloadavg()[0],
                "p50": statistics.median(latencies),
                "cpu_us": {k: round(v[0], 1) for k, v in sorted(per.items()) if v[0] >= 0.05},
                "cpu_total": round(sum(v[0] for v in per.values()), 1),
                "wakes": {k: round(v[1], 2) for k, v in sorted(per.items()) if v[1] >= 0.005},
                "events": {k: round(v / args.count, 3) for k, v in sorted(events.items())},
            }
            print(json.dumps(figures, indent=None if args.json else 1), flush=True)

    if args.stand_in:
        with stand_in_at(home, stand_in) as address:
            consumer = Client(address, timeout=30)
            consumer.subscribe(SUBJECT, on_message)
            stand_in_round(consumer, 300, args.rate, seen)  # warm
            measure(
                consumer, consumer, lambda: stand_in_round(consumer, args.count, args.rate, seen)
            )
            consumer.close()
        return
    broker = Broker(shards=2, home=home)
    broker.start()
    try:
        publisher, consumer = broker.client(timeout=30), broker.client(timeout=30)
        publisher.set_config(
            {"rateLimit": {"maxPerWindow": 10**9}, "backpressure": {"maxMailboxSize": 10**9}}
        )
        publisher.register_endpoint(SUBJECT)
        consumer.subscribe(SUBJECT, on_message)
        run_round(publisher, 300, args.rate, seen, t0)  # warm
        measure(
            publisher,
            consumer,
            lambda: run_round(publisher, args.count, args.rate, seen, t0),
        )
    finally:
        stop_broker(broker)
        remove_when_done(home)


if __name__ == "__main__":
    main()
