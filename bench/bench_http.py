"""The HTTP + SSE gateway (`relay http`) beside the Python SDK, in the same run.

- publishes per second over HTTP, 32 keep-alive connections each with one request in
  flight (32 in flight), beside the SDK's `publish_async` with 32 in flight;
- delivery latency at an offered 100 msg/s, from just before the publish call to the
  moment the message arrives: an SSE observe stream beside an SDK ``observe`` handler,
  and an SSE consume stream beside an SDK ``subscribe`` handler (p50, p99).

A real broker (router + 2 writers on a real disk) and a real `relay http` process; the
HTTP client is a few lines of asyncio speaking HTTP/1.1 by hand, so that on a 2-CPU
machine the load generator costs as little as it can (httpx costs more per request than
the gateway does). Every figure is the median of ``rounds`` interleaved rounds.

    python -m bench --only http [--rounds N]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from bench.common import (
    Row,
    base_dir,
    interleave_figures,
    percentile,
    rate,
    remove_when_done,
    stop_broker,
)
from bench.workload import spread_subjects
from sdk.types import Envelope

SUBJECT = "relay.agent.httpbench"
SENDER = f"{SUBJECT}.producer"
PAYLOAD = {"content": "x" * 300, "performative": "inform"}
CONNECTIONS = 32
PUBLISH_N = 3000  # per round, for HTTP and for the SDK
ENDPOINTS = 8
OFFERED_RATE = 100  # msg/s, for the latencies
LATENCY_N = 300  # messages per latency round (3 s at 100 msg/s)


# ---------------------------------------------------------------------- a tiny HTTP client


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def _post(port: int, path: str, body: bytes) -> bytes:
    head = (  # the Host the gateway listens as (edges/http/guard.py)
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _publisher(port: int, requests: list[bytes], count: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for n in range(count):
            writer.write(requests[n % len(requests)])
            status, body = await _read_response(reader)
            if status != 200 or json.loads(body)["deliveredTo"] != 1:
                raise RuntimeError(f"publish over HTTP failed: {status} {body[:200]!r}")
    finally:
        writer.close()


async def _http_publish(port: int, requests: list[bytes], total: int) -> float:
    each = total // CONNECTIONS
    t0 = time.perf_counter()
    await asyncio.gather(*(_publisher(port, requests, each) for _ in range(CONNECTIONS)))
    return rate(each * CONNECTIONS, time.perf_counter() - t0)


class SseReader:
    """An SSE stream read on its own thread; ``latencies`` gets, per message, the time from
    the ``sent`` its payload carries (time.monotonic: one clock for the whole machine)."""

    def __init__(self, port: int, query: str) -> None:
        self.latencies: list[float] = []
        self.ready = threading.Event()
        self._sock = socket.create_connection(("127.0.0.1", port))
        request = f"GET /api/stream?{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        self._sock.sendall(request.encode())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("the SSE stream did not open")

    def _read(self) -> None:
        with contextlib.suppress(OSError), self._sock.makefile("rb") as lines:
            for line in lines:
                if line.startswith(b"retry:"):  # the stream's subscription is in place
                    self.ready.set()
                elif line.startswith(b"data: "):
                    arrived = time.monotonic()
                    self.latencies.append(arrived - json.loads(line[6:])["payload"]["sent"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)


# ---------------------------------------------------------------------- the contenders


class HttpBench:
    def __init__(self, base: Path) -> None:
        from tests.harness import Broker, free_port

        self.broker = Broker(shards=2, home=base / "home-http")
        self.proc: subprocess.Popen | None = None
        try:
            self.broker.start()
            self.sdk = self.broker.client(timeout=30)
            self.sdk.set_config(
                {"rateLimit": {"maxPerWindow": 10**9}, "backpressure": {"maxMailboxSize": 10**9}}
            )
            self.spread = spread_subjects(ENDPOINTS, 2)
            self.observed, self.consumed = f"{SUBJECT}.observed", f"{SUBJECT}.consumed"
            for subject in [*self.spread, self.observed, self.consumed]:
                self.sdk.register_endpoint(subject)
            self.port = free_port()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli", "--home", str(self.broker.home.root),
                 "http", "--listen", f"127.0.0.1:{self.port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self._wait_up()
        except BaseException:
            self.close()
            raise
        self.requests = [
            _post(
                self.port,
                "/api/publish",
                json.dumps({"subject": s, "from": SENDER, "payload": PAYLOAD}).encode(),
            )
            for s in self.spread
        ]

    def _wait_up(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/status") as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("relay http did not come up")

    def http_publish(self) -> dict[str, float]:
        return {"rate": asyncio.run(_http_publish(self.port, self.requests, PUBLISH_N))}

    def sdk_publish(self) -> dict[str, float]:
        window: list[Future] = []
        t0 = time.perf_counter()
        for n in range(PUBLISH_N):
            if len(window) >= CONNECTIONS:
                window.pop(0).result(30)
            subject = self.spread[n % len(self.spread)]
            window.append(self.sdk.publish_async(subject, PAYLOAD, sender=SENDER))
        for future in window:
            future.result(30)
        return {"rate": rate(PUBLISH_N, time.perf_counter() - t0)}

    def _offer(self, subject: str, latencies: Callable[[], list[float]]) -> dict[str, float]:
        """Publish LATENCY_N messages at OFFERED_RATE; the latencies as they were seen."""
        before = len(latencies())
        t0 = time.monotonic()
        for n in range(LATENCY_N):
            pause = t0 + n / OFFERED_RATE - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self.sdk.publish(subject, {**PAYLOAD, "sent": time.monotonic()}, sender=SENDER)
        deadline = time.monotonic() + 10
        while len(latencies()) - before < LATENCY_N and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = latencies()[before:]
        if len(seen) < LATENCY_N:
            raise RuntimeError(f"only {len(seen)} of {LATENCY_N} messages arrived")
        us = [x * 1e6 for x in seen]
        return {"p50": statistics.median(us), "p99": percentile(us, 99)}

    def sse_latency(self, mode: str) -> dict[str, float]:
        subject = self.observed if mode == "observe" else self.consumed
        reader = SseReader(self.port, f"pattern={subject}&mode={mode}&signals=false")
        try:
            return self._offer(subject, lambda: reader.latencies)
        finally:
            reader.close()

    def sdk_latency(self, mode: str) -> dict[str, float]:
        subject = self.observed if mode == "observe" else self.consumed
        latencies: list[float] = []

        def handler(envelope: Envelope) -> None:
            latencies.append(time.monotonic() - envelope.payload["sent"])

        watch = self.sdk.observe if mode == "observe" else self.sdk.subscribe
        stop = watch(subject, handler)
        try:
            return self._offer(subject, lambda: latencies)
        finally:
            stop()

    def close(self) -> None:
        try:
            if self.proc is not None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            stop_broker(self.broker)


def rows(rounds: int = 3) -> list[Row]:
    base = base_dir()
    bench: HttpBench | None = None
    try:
        bench = HttpBench(base)
        m = interleave_figures(
            rounds,
            {
                "http_publish": bench.http_publish,
                "sdk_publish": bench.sdk_publish,
                "sse_observe": lambda: bench.sse_latency("observe"),
                "sdk_observe": lambda: bench.sdk_latency("observe"),
                "sse_consume": lambda: bench.sse_latency("consume"),
                "sdk_consume": lambda: bench.sdk_latency("consume"),
            },
        )
    finally:
        if bench is not None:
            bench.close()
        remove_when_done(base)
    return _table(m)


def _table(m: dict[str, dict[str, float]]) -> list[Row]:
    out = [
        Row(
            f"HTTP publish, {CONNECTIONS} connections",
            m["http_publish"]["rate"],
            "msg/s",
            f"SDK publish_async, {CONNECTIONS} in flight",
            m["sdk_publish"]["rate"],
        )
    ]
    for mode, sdk_name in (
        ("observe", "SDK observe handler"),
        ("consume", "SDK subscribe handler"),
    ):
        for q in ("p50", "p99"):
            out.append(
                Row(
                    f"SSE {mode} delivery at {OFFERED_RATE} msg/s: {q}",
                    m[f"sse_{mode}"][q],
                    "us",
                    f"{sdk_name}: {q}",
                    m[f"sdk_{mode}"][q],
                )
            )
    return out


if __name__ == "__main__":
    from bench.__main__ import table

    print(table(rows(int(sys.argv[1]) if len(sys.argv) > 1 else 3)))
