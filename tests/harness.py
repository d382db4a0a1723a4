"""Real broker processes for integration tests: own home, own sockets, no mocks.

`Broker` starts the router and one writer per shard as separate processes (so a test
can kill exactly one of them) under a fresh data directory in /tmp (short, because
ipc:// socket paths are limited to ~107 bytes), and stops them at the end, checking
that none is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import zmq

from sdk.client import Client, connect
from sdk.errors import RelayError
from sdk.paths import Home

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def signals_flowing(
    client: Client, subject: str, timeout: float = 10.0, sender: str | None = None
) -> None:
    """Return once signals on subject reach client: a ZeroMQ subscription takes effect a
    moment after on_signal, so send probe signals until one comes back."""
    from sdk.types import Signal, SignalType

    seen: list[Signal] = []
    stop = client.on_signal(subject, lambda _subject, signal: seen.append(signal))
    probe = Signal(SignalType.PRESENCE, "probe", subject, 0)
    try:
        wait_for(
            lambda: client.signal(subject, probe, sender=sender) or seen,
            timeout,
            interval=0.05,
            what=f"signals on {subject} to flow",
        )
    finally:
        stop()


def park_io_thread(client: Client) -> threading.Event:
    """Hold the client's I/O thread (in a reply's done-callback) until the returned
    event is set, so that what callers queue meanwhile waits in its queue, in order."""
    release, parked = threading.Event(), threading.Event()

    def park(_future: Any) -> None:
        if threading.current_thread().name == "relay-client-io":
            parked.set()
            release.wait(30)

    def parks() -> bool:
        client.send_request("ping").add_done_callback(park)  # runs here if the reply came first
        return parked.wait(1)

    wait_for(parks, what="the I/O thread to park")
    return release


class StandIn:
    """Stands in for ``target`` where a client's parts hold one another: the names in
    ``overrides`` answer as given, every other is the target's. The compiled SDK's
    classes (sdk/compiled.py) refuse a method replaced on an instance, so a test that
    watches or plays one part swaps the reference its neighbour holds instead."""

    def __init__(self, target: Any, **overrides: Any) -> None:
        self._target = target
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def depth(client: Client, subject: str) -> int:
    """How many messages wait in an endpoint's new/, as `status` reports it."""
    return next(e["depth"] for e in client.status()["endpoints"] if e["subject"] == subject)


def write_auth(home: Home, data: dict[str, Any]) -> None:
    """Replace a home's auth.json at once (the router reads it again when it changes)."""
    tmp = home.root / ".auth.json.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, home.auth_file)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> T:
    """Poll predicate until it returns something truthy; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Broker:
    def __init__(
        self,
        shards: int = 2,
        home: Path | None = None,
        env: dict[str, str] | None = None,
        router_args: Sequence[str] = (),
        client_options: dict[str, Any] | None = None,
        router_wrapper: Sequence[str] = (),
    ) -> None:
        self.shards = shards
        self.router_args = list(router_args)
        self.router_wrapper = list(router_wrapper)  # a command the router runs under
        self.client_options = client_options or {}  # connect() keywords: address, key_file
        self.home = Home(home or tempfile.mkdtemp(prefix="relay-"))
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "RELAY_LOG": "INFO", **(env or {})}
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = Path(tempfile.mkdtemp(prefix="relay-logs-"))
        self._clients: list[Client] = []

    @classmethod
    def on_tcp(cls, keys: Sequence[tuple[str, Sequence[str], bool]]) -> Broker:
        """A one-shard broker (not started) on tcp:// for requests and signals, whose
        auth.json lists a CURVE key per (name, sender patterns, admin) in keys/; its own
        clients (readiness, `client()`) use the first key."""
        address = f"tcp://127.0.0.1:{free_port()}"
        broker = cls(
            shards=1,
            router_args=[
                "--address",
                address,
                "--signals-address",
                f"tcp://127.0.0.1:{free_port()}",
            ],
        )
        broker.home.create()
        for name, senders, admin in keys:
            args = ["auth", "add-key", name, *[f"--sender={s}" for s in senders]]
            result = broker.relay(*args, *(["--admin"] if admin else []))
            assert result.returncode == 0, result.stderr
        first = broker.home.keys / f"{keys[0][0]}.key_secret"
        broker.client_options = {"address": address, "key_file": first}
        return broker

    def _spawn(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        cmd = [*wrapper, sys.executable, "-m", "cli", "--home", str(self.home.root), *args]
        self.procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(env or {})}
        )

    def start_process(self, name: str, *args: str) -> None:
        """Another process of this home (an edge: `relay bridge ...`), stopped with it."""
        self._spawn(name, *args)

    def start_router(self) -> None:
        self._spawn(
            "router",
            "router",
            "--shards",
            str(self.shards),
            *self.router_args,
            wrapper=self.router_wrapper,
        )

    def start_writer(self, shard: int, env: dict[str, str] | None = None) -> None:
        self._spawn(
            f"writer{shard}", "writer", "--shard", str(shard), "--shards", str(self.shards), env=env
        )

    def start(self, ready_timeout: float = 20.0) -> Broker:
        self.start_router()
        for shard in range(self.shards):
            self.start_writer(shard)
        self.wait_ready(ready_timeout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(
                        f"{name} exited with {proc.returncode}:\n" + self.log(name)
                    )
            try:
                with connect(self.home.root, timeout=1.0, **self.client_options) as client:
                    status = client.status()
            except RelayError:
                return False
            return all(w["pid"] for w in status["writers"])

        wait_for(ready, timeout, interval=0.05, what="router and writers to be up")

    def client(self, timeout: float = 10.0, **options: Any) -> Client:
        client = connect(self.home.root, timeout=timeout, **{**self.client_options, **options})
        self._clients.append(client)
        return client

    def raw_dealer(self, timeout_ms: int = 10_000) -> zmq.Socket:
        """A bare DEALER on the router's socket, for speaking the protocol by hand;
        the caller closes it. Reads time out after ``timeout_ms`` (zmq.Again)."""
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        sock.connect(self.home.router_address)
        return sock

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        proc.wait(10)

    def stop(self) -> dict[str, int]:
        """SIGTERM every process and wait; returns the exit codes."""
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        codes: dict[str, int] = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
        return codes

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.home.root, ignore_errors=True)
        shutil.rmtree(self.logs, ignore_errors=True)

    def relay(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a `relay` CLI command against this broker."""
        cmd = [sys.executable, "-m", "cli", "--home", str(self.home.root), *args]
        return subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=self.env
        )

    def __enter__(self) -> Broker:
        try:
            return self.start()
        except BaseException:  # __exit__ will not run: leave no process or directory
            self.cleanup()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()
