"""The real side of the model test: one broker (router + 2 writers), SDK clients in this
process whose pushes are recorded as they arrive, consumers in subprocesses, and the
faults (kills, stray connections). It records; tests/model/model.py judges.

A push is recorded on the client's I/O thread, before its subscription's handler thread
sees it (the client's `_take` is wrapped per instance): what a consumer *holds* is what
was pushed to it, also the messages queued behind a handler that does not return.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from sdk import wire
from sdk.client import Client
from sdk.subjects import endpoint_hash
from sdk.types import Envelope
from tests.harness import ROOT, Broker, wait_for

POOL = ("m.a.e0", "m.a.e1", "m.b.e0", "m.b.e1", "m.c.e0", "m.c.e2")  # shards 1,1,1,0,1,0
HASHES = {subject: endpoint_hash(subject) for subject in POOL}
SUBJECT_OF = {h: s for s, h in HASHES.items()}
HOLD_LIMIT_S = 600.0  # a held handler returns by itself after this (teardown releases it)
# Reliability limits that would refuse publishes the model does not predict: off.
NO_LIMITS = {
    "rateLimit": {"enabled": False},
    "circuitBreaker": {"enabled": False},
    "backpressure": {"enabled": False},
}

# A consumer in another process: records each push as it arrives (one line, one write),
# never answers (its handler blocks), and is killed with SIGKILL by the test.
CONSUMER_SCRIPT = r"""
import os, sys, threading
from sdk import wire
from sdk.client import Client, connect
home, pattern, credit, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
take = Client._take
def _take(self, incoming):
    if isinstance(incoming, wire.Push):
        os.write(fd, f"{incoming.id} {incoming.endpoint}\n".encode())
    take(self, incoming)
Client._take = _take
forever = threading.Event()
client = connect(home)
client.subscribe(pattern, lambda envelope: forever.wait(), credit=credit)
os.write(fd, b"ready\n")
forever.wait()
"""


@dataclass(eq=False)
class Receipt:
    """One push to one subscription."""

    sub: Sub
    id: str
    endpoint: str
    router_epoch: int  # the router process that pushed it (bumped at each router kill)
    order_epoch: int  # its endpoint's order epoch when it arrived (model.py)
    handled: str | None = None  # "ack" / "nack" once the handler finished with it
    handled_epoch: int | None = None
    after_close: bool = False  # the handler finished after its client was closed


@dataclass(eq=False)
class ClientHandle:
    name: str
    client: Client
    closed: bool = False
    subs: list[Sub] = field(default_factory=list)


@dataclass(eq=False)
class Sub:
    """A subscription: consume (ack, nack or hold), observe, or a consumer process."""

    key: int
    pattern: str
    mode: str  # "consume", "observe", "process"
    behaviour: str  # "ack", "nack", "hold" ("hold" for a process, "-" for observe)
    credit: int | None  # asked for; None: the broker's default credit
    granted: int  # credit granted at its last (re)subscription
    router_epoch: int  # router epoch of that (re)subscription
    client: ClientHandle | None = None
    receipts: list[Receipt] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    ended: bool = False
    ended_at: float = 0.0
    unsubscribe: Callable[[], None] | None = None
    proc: subprocess.Popen | None = None
    out: Path | None = None
    windows: list[tuple[int, int | None]] = field(default_factory=list)  # observe: seqs

    @property
    def name(self) -> str:
        where = self.client.name if self.client else "proc"
        credit = "" if self.mode == "observe" else f" credit={self.granted}"
        return f"sub{self.key}({where} {self.mode} {self.pattern} {self.behaviour}{credit})"


class Handler:
    """A subscription's handler: holds until released, then acks; or nacks."""

    def __init__(self, world: World, sub: Sub) -> None:
        self.world, self.sub = world, sub

    def __call__(self, envelope: Envelope) -> None:
        sub = self.sub
        if sub.mode == "observe":
            return
        if sub.behaviour == "hold":
            sub.released.wait(HOLD_LIMIT_S)
        nack = sub.behaviour == "nack"
        self.world.handled(sub, envelope.id, HASHES.get(envelope.subject, "?"), nack)
        if nack:
            raise ValueError(f"model nack {envelope.id}")


class World:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.router_epoch = 0
        self.order_epoch = dict.fromkeys(HASHES.values(), 0)
        self.clients: list[ClientHandle] = []
        self.subs: list[Sub] = []
        self.dropped: list[str] = []  # pushes a client had no subscription for
        self.steps: list[str] = []  # what the machine did, for a failure's report
        self.broker = Broker(shards=2)
        self.tmp = Path(tempfile.mkdtemp(prefix="relay-model-"))
        try:
            self.broker.start()
            self.publishers = [self.broker.client() for _ in range(3)]
            self.checker = self.broker.client()
            self.checker.set_config(NO_LIMITS)
        except BaseException:
            self.broker.cleanup()
            raise

    # ------------------------------------------------------------------ clients

    def open_client(self) -> ClientHandle:
        handle = ClientHandle(f"c{len(self.clients)}", self.broker.client())
        original = handle.client._take

        def take(incoming: Any) -> None:
            if isinstance(incoming, wire.Push):
                self._pushed(handle, incoming)
            original(incoming)

        handle.client._take = take  # type: ignore[method-assign]
        self.clients.append(handle)
        return handle

    def _pushed(self, handle: ClientHandle, push: wire.Push) -> None:
        worker = handle.client._subs.get(push.sub)
        handler = getattr(worker, "handler", None)
        with self.lock:
            if not isinstance(handler, Handler):
                self.dropped.append(
                    f"{push.id}/{push.endpoint} for sub id {push.sub} of {handle.name}"
                )
                return
            sub = handler.sub
            epoch = self.order_epoch.get(push.endpoint, 0)
            sub.receipts.append(Receipt(sub, push.id, push.endpoint, self.router_epoch, epoch))

    def handled(self, sub: Sub, message_id: str, endpoint: str, nack: bool) -> None:
        with self.lock:
            receipt = next(
                (
                    r
                    for r in sub.receipts
                    if r.id == message_id and r.endpoint == endpoint and r.handled is None
                ),
                None,
            )
            if receipt is None:  # the model reports the push as missing
                return
            receipt.handled = "nack" if nack else "ack"
            receipt.handled_epoch = self.router_epoch
            receipt.after_close = sub.client is not None and sub.client.closed

    def close_client(self, handle: ClientHandle) -> None:
        handle.client.close()
        handle.closed = True
        now = time.monotonic()
        for sub in handle.subs:
            if not sub.ended:
                sub.ended, sub.ended_at = True, now
            sub.released.set()  # its handler returns; its answers cannot leave any more

    # ------------------------------------------------------------------ subscriptions

    def _new_sub(
        self, pattern: str, mode: str, behaviour: str, credit: int | None, default: int
    ) -> Sub:
        sub = Sub(
            len(self.subs), pattern, mode, behaviour, credit, credit or default, self.router_epoch
        )
        self.subs.append(sub)
        return sub

    def subscribe(
        self, handle: ClientHandle, pattern: str, behaviour: str, credit: int | None, default: int
    ) -> Sub:
        sub = self._new_sub(pattern, "consume", behaviour, credit, default)
        sub.client = handle
        handle.subs.append(sub)
        sub.unsubscribe = handle.client.subscribe(pattern, Handler(self, sub), credit=credit)
        return sub

    def observe(self, handle: ClientHandle, pattern: str, seq: int) -> Sub:
        sub = self._new_sub(pattern, "observe", "-", None, 0)
        sub.client = handle
        handle.subs.append(sub)
        sub.unsubscribe = handle.client.observe(pattern, Handler(self, sub))
        sub.windows.append((seq, None))
        return sub

    def end(self, sub: Sub) -> None:
        """Unsubscribe (a subscription of a live client)."""
        assert sub.unsubscribe is not None
        sub.unsubscribe()
        sub.ended, sub.ended_at = True, time.monotonic()

    def spawn_consumer(self, pattern: str, credit: int) -> Sub:
        sub = self._new_sub(pattern, "process", "hold", credit, credit)
        sub.out = self.tmp / f"consumer-{sub.key}.txt"
        sub.out.touch()
        args = [
            sys.executable,
            "-c",
            CONSUMER_SCRIPT,
            str(self.broker.home.root),
            pattern,
            str(credit),
            str(sub.out),
        ]
        log = open(self.tmp / f"consumer-{sub.key}.log", "wb")  # noqa: SIM115 - the process's
        sub.proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def ready() -> bool:
            if sub.proc.poll() is not None:
                raise AssertionError(f"consumer process exited: {self.consumer_log(sub)}")
            return b"ready\n" in sub.out.read_bytes()

        wait_for(ready, 15, interval=0.02, what=f"consumer process {sub.name} to subscribe")
        self.read_consumer(sub)
        return sub

    def consumer_log(self, sub: Sub) -> str:
        path = self.tmp / f"consumer-{sub.key}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def read_consumer(self, sub: Sub) -> None:
        """Take the lines a consumer process wrote since the last read as receipts."""
        assert sub.out is not None
        lines = [line for line in sub.out.read_text().split("\n")[:-1] if line != "ready"]
        with self.lock:
            for line in lines[len(sub.receipts) :]:
                message_id, endpoint = line.split(" ")
                epoch = self.order_epoch.get(endpoint, 0)
                sub.receipts.append(Receipt(sub, message_id, endpoint, self.router_epoch, epoch))

    def kill_consumer(self, sub: Sub) -> None:
        assert sub.proc is not None
        sub.proc.send_signal(signal.SIGKILL)
        sub.proc.wait(10)
        self.read_consumer(sub)
        sub.ended, sub.ended_at = True, time.monotonic()

    # ------------------------------------------------------------------ faults

    def restart_writer(self, shard: int, during: Callable[[], Any] | None, delay: float) -> Any:
        """kill -9 writer K and start it again; ``during`` runs on a thread meanwhile."""
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(during())  # type: ignore[misc]
            except BaseException as exc:  # reported by the caller
                outcome.append(exc)

        self.broker.kill(f"writer{shard}")
        thread = threading.Thread(target=run, daemon=True) if during else None
        if thread:
            thread.start()
            time.sleep(delay)
        self.broker.start_writer(shard)
        self.broker.wait_ready()
        if thread:
            thread.join(30)
            assert outcome, "the publish made while the writer was down never returned"
            return outcome[0]
        return None

    def restart_router(self) -> None:
        self.broker.kill("router")
        with self.lock:
            self.router_epoch += 1
        self.broker.start_router()
        self.broker.wait_ready()

    def stray(self, index: int, kind: int, junk: bool, hold: float, *, shards: bool = True) -> str:
        """Connect a socket of ``kind`` to one of run/*.sock, maybe send junk, close it."""
        names = sorted(p.name for p in self.broker.home.run.glob("*.sock"))
        names = [n for n in names if shards or not n.startswith("shard-")]
        name = names[index % len(names)]
        sock = zmq.Context.instance().socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(f"ipc://{self.broker.home.run / name}")
            if junk and kind in (zmq.PUSH, zmq.DEALER, zmq.REQ):
                with contextlib.suppress(zmq.Again):
                    sock.send(b"junk", zmq.NOBLOCK)
            time.sleep(hold)
        finally:
            sock.close(0)
        return name

    # ------------------------------------------------------------------ end

    def close(self) -> None:
        for sub in self.subs:
            sub.released.set()
            if sub.proc is not None and sub.proc.poll() is None:
                sub.proc.kill()
                sub.proc.wait(10)
        for handle in self.clients:
            with contextlib.suppress(Exception):
                handle.client.close()
        self.broker.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of each process's log, for a failure message."""
        parts = []
        for name in self.broker.procs:
            tail = self.broker.log(name).splitlines()[-lines:]
            parts.append(f"--- {name} log (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)
