"""Relay across two hosts (docs/federation.md), beside local Relay and plain JetStream,
in one run on one machine: a three-server NATS cluster on loopback (R3 streams), two
Relay homes (2 shards each) and their `relay bridge` processes.

- publish -> handler latency at 100 msg/s (p50/p99, ms): a on a's endpoint (local),
  a -> b (cross-node); the payload carries the send time, the handler reads the clock
  (one machine, one clock);
- throughput with 100 publishes in flight, measured until the last handler ran
  (msg/s): local and cross-node;
- plain JetStream on the same cluster: publish -> PubAck at 100 msg/s (p50/p99, ms) and
  with 100 acks in flight (msg/s), on an R3 file stream.

Everything shares two cores: the figures are for comparison within the run.
``python -m bench --only federation`` or ``python -m bench.bench_federation``.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future

from bench.common import Row
from tests.harness import Broker, wait_for
from tests.nats_cluster import NatsCluster

LOCAL, REMOTE, SENDER = "relay.agent.a.local", "relay.agent.b.remote", "relay.agent.a.bench"
RATE_N = 500  # messages at 100 msg/s
FLOOD_N = 2000  # messages with 100 in flight
INFLIGHT = 100


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Nodes:
    def __init__(self) -> None:
        self.cluster = NatsCluster().start()
        self.a, self.b = Broker(shards=2).start(), Broker(shards=2).start()
        self.ca, self.cb = self.a.client(timeout=30), self.b.client(timeout=30)
        for client in (self.ca, self.cb):
            client.set_config({"rateLimit": {"enabled": False}})
        self.ca.register_endpoint(LOCAL)
        self.cb.register_endpoint(REMOTE)
        urls = ",".join(self.cluster.urls)
        for broker, node in ((self.a, "a"), (self.b, "b")):
            broker.start_process(
                "bridge", "bridge", "--nats", urls, "--node", node, "--share", "relay.>"
            )
        wait_for(self._met, 60, what="the bridges to meet")
        self.seen: dict[str, list[float]] = {LOCAL: [], REMOTE: []}
        self.ca.subscribe(LOCAL, self._handler(LOCAL), credit=INFLIGHT)
        self.cb.subscribe(REMOTE, self._handler(REMOTE), credit=INFLIGHT)

    def _met(self) -> bool:
        fed = self.ca.status()["federation"]
        return fed["connected"] and fed["remoteEndpoints"].get("b", 0) > 0

    def _handler(self, subject: str):
        seen = self.seen[subject]

        def handle(message) -> None:
            seen.append((time.monotonic_ns() - message.payload["t"]) / 1e6)

        return handle

    def at_rate(self, subject: str, n: int = RATE_N, rate: float = 100.0) -> list[float]:
        seen = self.seen[subject]
        seen.clear()
        start = time.monotonic()
        for i in range(n):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the sender, not waiting for an event
            self.ca.publish_async(subject, {"t": time.monotonic_ns()}, sender=SENDER)
        wait_for(lambda: len(seen) >= n, 120, what=f"{n} handled on {subject}")
        return list(seen)

    def flood(self, subject: str, n: int = FLOOD_N) -> float:
        seen = self.seen[subject]
        seen.clear()
        futures: list[Future] = []
        start = time.monotonic()
        for _ in range(n):
            if len(futures) >= INFLIGHT:
                futures[-INFLIGHT].result(30)
            futures.append(self.ca.publish_async(subject, {"t": 0}, sender=SENDER))
        wait_for(lambda: len(seen) >= n, 300, interval=0.01, what=f"{n} handled on {subject}")
        return n / (time.monotonic() - start)

    def close(self) -> None:
        self.a.cleanup()
        self.b.cleanup()
        self.cluster.stop()


async def _jetstream(urls: list[str]) -> tuple[list[float], float]:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(urls)
    js = nc.jetstream(timeout=30, publish_async_max_pending=INFLIGHT)
    await js.add_stream(
        StreamConfig(
            name="BENCHFED", subjects=["benchfed.>"], storage=StorageType.FILE, num_replicas=3
        )
    )
    payload = b"x" * 300  # about a Relay envelope
    latencies = []
    start = time.monotonic()
    for i in range(RATE_N):
        delay = start + i / 100.0 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.monotonic_ns()
        await js.publish("benchfed.rate", payload)
        latencies.append((time.monotonic_ns() - t) / 1e6)
    start = time.monotonic()
    for _ in range(FLOOD_N):
        await js.publish_async("benchfed.flood", payload)
    await js.publish_async_completed()
    rate = FLOOD_N / (time.monotonic() - start)
    await nc.close()
    return latencies, rate


def rows(rounds: int = 1) -> list[Row]:
    nodes = Nodes()
    try:
        nodes.at_rate(LOCAL, 50)  # warm-up
        nodes.at_rate(REMOTE, 50)
        local = nodes.at_rate(LOCAL)
        remote = nodes.at_rate(REMOTE)
        local_rate = nodes.flood(LOCAL)
        remote_rate = nodes.flood(REMOTE)
        js_latency, js_rate = asyncio.run(_jetstream(nodes.cluster.urls))
    finally:
        nodes.close()
    js50, js99 = _pct(js_latency, 0.5), _pct(js_latency, 0.99)
    return [
        Row("publish->handler p50 at 100 msg/s, local", _pct(local, 0.5), "ms"),
        Row("publish->handler p99 at 100 msg/s, local", _pct(local, 0.99), "ms"),
        Row("publish->handler p50 at 100 msg/s, a->b", _pct(remote, 0.5), "ms",
            "JetStream R3 publish->PubAck p50", js50),
        Row("publish->handler p99 at 100 msg/s, a->b", _pct(remote, 0.99), "ms",
            "JetStream R3 publish->PubAck p99", js99),
        Row("throughput, 100 in flight, local", local_rate, "msg/s"),
        Row("throughput, 100 in flight, a->b", remote_rate, "msg/s",
            "JetStream R3 publish, 100 acks in flight", js_rate),
    ]  # fmt: skip


if __name__ == "__main__":
    for row in rows():
        print(row)
