"""Relay's broker driven through the SDK: publishes and a consumer's handler, on real
router and writer processes (tests/harness.py) in a home of their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Figures, cpu_us, p50_p99, rate, rss_mib, stop_broker
from bench.workload import (
    ENDPOINTS,
    FANOUT,
    FANOUT_N,
    INFLIGHT,
    OFFERED_RATE,
    OFFERED_SECONDS,
    PAYLOAD,
    PIPELINED_N,
    SENDER,
    SINGLE_N,
    SUBJECT,
    WARMUP,
    spread_subjects,
)


def check_delivered(result: Any, copies: int = 1) -> None:
    """A PublishResult stored for ``copies`` endpoints and refused by none, or an error:
    a figure bought by dropping messages does not count."""
    if result.delivered_to != copies or result.rejected:
        raise RuntimeError(f"publish not delivered to {copies}: {result}")


class RelayBroker:
    """One broker (router + N writers), a publisher and a consumer client, and the
    publish workloads on them: 1 in flight, 100 in flight (with and without the
    reliability checks), a wildcard fan-out, and publish -> handler at an offered rate.
    Rate limiting and backpressure stay enabled with limits the bench cannot reach, so
    their checks are on the measured path; every publish must come back delivered."""

    def __init__(
        self,
        shards: int,
        home: Path,
        *,
        router_wrapper: Sequence[str] = (),
        ready_timeout: float = 20.0,
    ) -> None:
        """``router_wrapper``: a command to run the router under (bench/router_instructions.py
        runs it under callgrind), with ``ready_timeout`` seconds to come up."""
        from tests.harness import Broker  # real processes, its own home

        self.shards = shards
        self.broker = Broker(shards=shards, home=home, router_wrapper=router_wrapper)
        self.round = 0
        self.lock = threading.Lock()
        try:
            self.broker.start(ready_timeout)
            self.rss_start = self.rss()  # right after the router and writers are ready
            self._setup()
        except BaseException:
            stop_broker(self.broker)
            raise

    def _setup(self) -> None:
        self.publisher = self.broker.client(timeout=30)
        self.receiver = self.broker.client(timeout=30)
        self.publisher.set_config(
            {"rateLimit": {"maxPerWindow": 10**9}, "backpressure": {"maxMailboxSize": 10**9}}
        )
        self.single = f"{SUBJECT}.single"
        self.spread = spread_subjects(ENDPOINTS, self.shards)
        self.sink = f"{SUBJECT}.sink"
        self.fan = [f"{SUBJECT}.fan.e{n}" for n in range(FANOUT)]
        self.fan_pattern = f"{SUBJECT}.fan.*"  # a wildcard publish: every endpoint it matches
        for subject in [self.single, self.sink, *self.spread, *self.fan]:
            self.publisher.register_endpoint(subject)

        self.latencies: list[float] = []
        self.receiver.subscribe(self.sink, self._on_message)
        # Warm every path once (imports, caches, SQLite pages) before measuring.
        self.publish_single(WARMUP)
        self.publish_pipelined(WARMUP)
        self.publish_fanout(WARMUP)

    def rss(self) -> float:
        """The router process's VmRSS, MiB."""
        return rss_mib(self.broker.procs["router"].pid)

    def _on_message(self, envelope: Any) -> None:
        now = time.monotonic_ns()
        payload = envelope.payload
        if payload.get("round") == self.round:
            with self.lock:
                self.latencies.append((now - payload["t"]) / 1000)

    def publish_single(self, count: int = SINGLE_N) -> Figures:
        publish, latencies = self.publisher.publish, []
        start = time.perf_counter()
        for _ in range(count):
            t0 = time.perf_counter_ns()
            result = publish(self.single, PAYLOAD, sender=SENDER)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
            check_delivered(result)
        elapsed = time.perf_counter() - start
        return {"rate": rate(count, elapsed), **p50_p99(latencies)}

    def publish_pipelined(self, count: int = PIPELINED_N) -> Figures:
        """Publishes/s, and the router's CPU µs per publish over the same run (its whole
        process: the loop and ZeroMQ's I/O threads; counted in 10 ms clock ticks)."""
        router = self.broker.procs["router"].pid
        before = cpu_us(router)
        result = self.in_flight(count, self.spread, 1)
        return {**result, "router_cpu": (cpu_us(router) - before) / count}

    def publish_fanout(self, count: int = FANOUT_N) -> Figures:
        """Wildcard publishes reaching FANOUT endpoints each; rate = copies stored/s."""
        result = self.in_flight(count, [self.fan_pattern], FANOUT)
        return {"rate": result["rate"] * FANOUT}

    def in_flight(self, count: int, targets: list[str], copies: int) -> Figures:
        """``count`` publishes over ``targets`` in turn, INFLIGHT at a time; publishes/s."""
        slots = threading.Semaphore(INFLIGHT)
        done = threading.Event()
        errors: list[BaseException] = []
        finished = [0]
        lock = threading.Lock()

        def on_done(future: Any) -> None:
            try:
                check_delivered(future.result(), copies)
            except BaseException as exc:
                errors.append(exc)
            slots.release()
            with lock:  # the I/O thread, or this one when the future is already done
                finished[0] += 1
                if finished[0] == count:
                    done.set()

        publish_async = self.publisher.publish_async
        start = time.perf_counter()
        for n in range(count):
            slots.acquire()
            publish_async(targets[n % len(targets)], PAYLOAD, sender=SENDER).add_done_callback(
                on_done
            )
        if not done.wait(60):
            raise RuntimeError(f"only {finished[0]}/{count} publishes answered within 60 s")
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        return {"rate": rate(count, elapsed)}

    def publish_pipelined_unguarded(self) -> Figures:
        """The same run with rate limits, breakers and backpressure all disabled."""
        off = {s: {"enabled": False} for s in ("rateLimit", "circuitBreaker", "backpressure")}
        on = {s: {"enabled": True} for s in off}
        self.publisher.set_config(off)
        try:
            return self.publish_pipelined()
        finally:
            self.publisher.set_config(on)

    def handler_latency(self) -> Figures:
        """Publish at a fixed offered rate; the consumer's handler notes each arrival."""
        self.round += 1
        with self.lock:
            self.latencies = []
        count = int(OFFERED_RATE * OFFERED_SECONDS)
        futures = []
        start = time.monotonic()
        for n in range(count):
            delay = start + n / OFFERED_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            payload = {**PAYLOAD, "round": self.round, "t": time.monotonic_ns()}
            futures.append(self.publisher.publish_async(self.sink, payload, sender=SENDER))
        for future in futures:
            check_delivered(future.result(30))
        deadline = time.monotonic() + 30
        while len(self.latencies) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"handler saw {len(self.latencies)}/{count} messages")
            time.sleep(0.01)
        with self.lock:
            latencies = list(self.latencies)
        return p50_p99(latencies)

    def cleanup(self) -> None:
        stop_broker(self.broker)
