"""The real side of the model test: one broker (router + 2 writers), SDK clients in this
process whose pushes are recorded as they arrive, fetches and their answers, consumers
in subprocesses, and the faults (kills, silences, restarts, stray connections). It
records, with the time of each thing (time.monotonic(), the same clock in every
process); tests/model/model.py judges.

A push is recorded on the client's I/O thread, before its subscription's handler thread
sees it (the client's `_take` is wrapped per instance): what a consumer *holds* is what
was pushed to it, also the messages queued behind a handler that does not return. Each
hand-out is a `Receipt`, with the `deliveries` the router said (1 the first time).
"""

from __future__ import annotations

import contextlib
import os
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
from sdk.errors import InvalidState
from sdk.message import Message
from sdk.subjects import endpoint_hash, matches
from sdk.types import Envelope
from tests.harness import ROOT, Broker, StandIn, wait_for

POOL = ("m.a.e0", "m.a.e1", "m.b.e0", "m.b.e1", "m.c.e0", "m.c.e2")  # shards 1,1,1,0,1,0
HASHES = {subject: endpoint_hash(subject) for subject in POOL}
SUBJECT_OF = {h: s for s, h in HASHES.items()}
HOLD_LIMIT_S = 600.0  # a held handler returns by itself after this (teardown releases it)
# The broker's delivery.sessionTimeoutMs: a silent client's session ends after this, and
# a claim found in cur/ after a router restart waits this long for its holder. Lower
# than the default 5 s so that sequences wait less; a live client pings every second.
SESSION_MS = int(os.environ.get("RELAY_MODEL_SESSION_MS", "4000"))
MAX_DELIVERIES = 5  # delivery.maxDeliveries at the start of each sequence (the default)
PUSH_LATENCY_S = 1.0  # a push arrives at most this long after the router sent it
# Reliability limits that would refuse publishes the model does not predict: off.
NO_LIMITS = {
    "rateLimit": {"enabled": False},
    "circuitBreaker": {"enabled": False},
    "backpressure": {"enabled": False},
}

# A consumer in another process: records each push as it arrives (one line, one write:
# id, endpoint, deliveries, subscription id, arrival time), never answers (its handler
# blocks), and is killed with SIGKILL by the test. SIGUSR1 silences it: it stops its
# heartbeat (its pings are dropped as if its queue to the router were full) but keeps
# its connection and keeps reading, so the router must end its session after
# delivery.sessionTimeoutMs of silence, and every push it gets is still recorded.
CONSUMER_SCRIPT = r"""
import os, signal, sys, threading, time
# It replaces SDK functions, which the compiled units neither allow nor call through
# their modules (sdk/compiled.py): this process runs the SDK as pure Python.
os.environ["RELAY_PURE"] = "1"
import zmq
from sdk import wire
from sdk.client import connect
from sdk.subscriptions import Subscriptions
home, pattern, credit, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
pushed = Subscriptions.pushed
def _pushed(self, push):
    line = f"{push.id} {push.endpoint} {push.deliveries} {push.sub}"
    os.write(fd, f"{line} {time.monotonic():.6f}\n".encode())
    pushed(self, push)
Subscriptions.pushed = _pushed
silent = threading.Event()
encode = wire.encode_request
def encode_request(op, rid, **fields):
    if op == "ping" and silent.is_set():
        raise zmq.Again()  # the I/O thread drops a ping that would block
    return encode(op, rid, **fields)
wire.encode_request = encode_request
def silence(*_):
    silent.set()
    os.write(fd, b"silent\n")
signal.signal(signal.SIGUSR1, silence)
forever = threading.Event()
client = connect(home)
client.subscribe(pattern, lambda envelope: forever.wait(), credit=credit)
os.write(fd, b"ready\n")
while True:
    forever.wait(0.2)  # the main thread wakes up to run the signal handler
"""


@dataclass(eq=False)
class Receipt:
    """One hand-out of a copy to one consumer: a push to a subscription, or a message a
    fetch returned."""

    sub: Sub
    id: str
    endpoint: str
    deliveries: int  # which hand-out the router said this is (1 the first time)
    at: float  # when it arrived here (time.monotonic())
    router_epoch: int  # the router process that handed it out (bumped at each router kill)
    order_epoch: int  # its endpoint's order epoch when it arrived (model.py)
    # When the router started to hold it for its consumer (its ack deadline counts from
    # there): between these two times. A push left the router shortly before it
    # arrived; a fetched message, between the fetch's call and its return;
    # in_progress() moves it to that call's own window.
    since: tuple[float, float] = (0.0, 0.0)
    handled: str | None = None  # "ack" / "nack" once answered (a handler finished)
    handled_at: float | None = None  # when the handler finished, or the answer returned
    refused_at: float | None = None  # a fetched message's answer was refused here
    refused_how: str | None = None  # which answer: "ack", "nack", "in_progress"
    message: Message | None = None  # a fetched message: answers itself


@dataclass(eq=False)
class ClientHandle:
    name: str
    client: Client
    closed: bool = False
    closing: tuple[float, float] | None = None  # close() called and returned
    subs: list[Sub] = field(default_factory=list)


@dataclass(eq=False)
class Sub:
    """A subscription: consume (ack, nack or hold), observe, or a consumer process."""

    key: int
    pattern: str
    mode: str  # "consume", "observe", "process", "fetch" (one fetch call)
    behaviour: str  # "ack", "nack", "hold" ("hold" for a process and a fetch, "-" observe)
    credit: int | None  # asked for (a fetch: its batch); None: the broker's default credit
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
    ack_wait: float | None = None  # seconds: what it holds longer is taken back
    killed_at: float | None = None  # a consumer process killed with SIGKILL
    silenced: tuple[float, float] | None = None  # its heartbeat stopped (signal, seen)

    @property
    def name(self) -> str:
        where = self.client.name if self.client else "proc"
        credit = "" if self.mode == "observe" else f" credit={self.granted}"
        wait = f" ack_wait={self.ack_wait:g}" if self.ack_wait else ""
        return f"sub{self.key}({where} {self.mode} {self.pattern} {self.behaviour}{credit}{wait})"

    @property
    def stream(self) -> object:
        """Whose order a hand-out counts in: the subscription's, or for a fetch the
        client's (its fetches one after the other)."""
        if self.mode == "fetch" and self.client is not None:
            return ("fetch", self.client.name)
        return self.key


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
        endpoint = HASHES.get(envelope.subject, "?")
        self.world.handled(sub, envelope.id, endpoint, envelope.deliveries, nack)
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
        self.t0 = time.monotonic()  # times in a failure's report count from here
        # Router restarts: (killed, ready again), time.monotonic().
        self.restarts: list[tuple[float, float]] = []
        # Moments a hand-out in flight could be lost unseen (a consumer closed or
        # killed, the router killed): (from, to, the endpoints it could be of (None:
        # all), whose end it was (the client or the consumer process; None: the router)).
        self.lossy: list[tuple[float, float, frozenset[str] | None, Any]] = []
        # delivery.maxDeliveries over time: (since, value).
        self.max_deliveries: list[tuple[float, int]] = [(0.0, MAX_DELIVERIES)]
        self.broker = Broker(shards=2)
        self.tmp = Path(tempfile.mkdtemp(prefix="relay-model-"))
        try:
            self.broker.start()
            self.publishers = [self.broker.client() for _ in range(3)]
            self.checker = self.broker.client()
            self.checker.set_config(
                {
                    **NO_LIMITS,
                    "delivery": {"sessionTimeoutMs": SESSION_MS, "maxDeliveries": MAX_DELIVERIES},
                }
            )
        except BaseException:
            self.broker.cleanup()
            raise

    def clock(self, at: float | None = None) -> str:
        """A time as the failure report shows it: seconds since the sequence began."""
        return f"{(time.monotonic() if at is None else at) - self.t0:7.2f}"

    # ------------------------------------------------------------------ clients

    def open_client(self) -> ClientHandle:
        handle = ClientHandle(f"c{len(self.clients)}", self.broker.client())
        subscriptions = handle.client._subscriptions

        def pushed(push: wire.Push) -> None:
            self._pushed(handle, push)
            subscriptions.pushed(push)

        handle.client._transport._consumer = StandIn(subscriptions, pushed=pushed)
        self.clients.append(handle)
        return handle

    def _receipt(
        self, sub: Sub, message_id: str, endpoint: str, deliveries: int, at: float
    ) -> Receipt:
        """A hand-out arrived (call with the lock held)."""
        epoch = self.order_epoch.get(endpoint, 0)
        receipt = Receipt(sub, message_id, endpoint, deliveries, at, self.router_epoch, epoch)
        receipt.since = (at - PUSH_LATENCY_S, at)
        sub.receipts.append(receipt)
        return receipt

    def _pushed(self, handle: ClientHandle, push: wire.Push) -> None:
        now = time.monotonic()
        worker = handle.client._subscriptions.workers.get(push.sub)
        handler = getattr(worker, "handler", None)
        with self.lock:
            if not isinstance(handler, Handler):
                self.dropped.append(
                    f"{push.id}/{push.endpoint} for sub id {push.sub} of {handle.name}"
                )
                return
            sub = handler.sub
            deliveries = push.deliveries if sub.mode == "consume" else 0
            self._receipt(sub, push.id, push.endpoint, deliveries, now)

    def handled(
        self, sub: Sub, message_id: str, endpoint: str, deliveries: int, nack: bool
    ) -> None:
        now = time.monotonic()
        with self.lock:
            receipt = next(
                (
                    r
                    for r in sub.receipts
                    if (r.id, r.endpoint, r.deliveries) == (message_id, endpoint, deliveries)
                    and r.handled is None
                ),
                None,
            )
            if receipt is None:  # the model reports the push as missing
                return
            receipt.handled = "nack" if nack else "ack"
            receipt.handled_at = now

    def close_client(self, handle: ClientHandle) -> None:
        """close(): the answers of finished handlers leave, then "bye"; the router
        releases what the client still holds."""
        started = time.monotonic()
        handle.client.close()
        ended = time.monotonic()
        handle.closed, handle.closing = True, (started, ended)
        for sub in handle.subs:
            if not sub.ended:
                sub.ended, sub.ended_at = True, ended
            sub.released.set()  # its handler returns; its answers cannot leave any more
        endpoints = frozenset(
            h
            for sub in handle.subs
            if sub.mode in ("consume", "fetch")
            for s, h in HASHES.items()
            if matches(s, sub.pattern)
        )
        with self.lock:
            self.lossy.append((started, ended, endpoints, handle))

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
        self,
        handle: ClientHandle,
        pattern: str,
        behaviour: str,
        credit: int | None,
        default: int,
        ack_wait: float | None = None,
    ) -> Sub:
        sub = self._new_sub(pattern, "consume", behaviour, credit, default)
        sub.client, sub.ack_wait = handle, ack_wait
        handle.subs.append(sub)
        sub.unsubscribe = handle.client.subscribe(
            pattern, Handler(self, sub), credit=credit, ack_wait=ack_wait
        )
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

    def fetch(
        self, handle: ClientHandle, pattern: str, batch: int, wait: float, ack_wait: float | None
    ) -> Sub:
        """One fetch: what it returns is held by the client until answered (`answer`)."""
        sub = self._new_sub(pattern, "fetch", "hold", batch, batch)
        sub.client, sub.ack_wait = handle, ack_wait
        handle.subs.append(sub)
        called = time.monotonic()
        try:
            messages = handle.client.fetch(pattern, batch=batch, wait=wait, ack_wait=ack_wait)
        finally:
            sub.ended = True  # a fetch ends with its answer
            sub.ended_at = time.monotonic()
        returned = time.monotonic()
        with self.lock:
            for message in messages:
                receipt = self._receipt(
                    sub, message.id, message.endpoint, message.deliveries, returned
                )
                receipt.since, receipt.message = (called, returned), message
        return sub

    def answer(self, receipt: Receipt, how: str) -> str:
        """Answer a fetched message (ack, nack, in_progress), confirmed: "ok" or
        "refused" (invalid_state: the hand-out is no longer its client's); other errors
        are raised."""
        message = receipt.message
        assert message is not None
        called = time.monotonic()
        try:
            if how == "ack":
                message.ack()
            elif how == "nack":
                message.nack(f"model nack {message.id}")
            else:
                message.in_progress()
        except InvalidState:
            with self.lock:
                receipt.refused_at, receipt.refused_how = time.monotonic(), how
            return "refused"
        returned = time.monotonic()
        with self.lock:
            if how == "in_progress":
                receipt.since = (called, returned)
            else:
                receipt.handled, receipt.handled_at = how, called
        return "ok"

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
        lines = [
            line.split(" ")
            for line in sub.out.read_text().split("\n")[:-1]
            if line not in ("ready", "silent")
        ]
        with self.lock:
            for message_id, endpoint, deliveries, _, at in lines[len(sub.receipts) :]:
                self._receipt(sub, message_id, endpoint, int(deliveries), float(at))

    def kill_consumer(self, sub: Sub) -> None:
        assert sub.proc is not None
        killed = time.monotonic()
        sub.proc.send_signal(signal.SIGKILL)
        sub.proc.wait(10)
        self.read_consumer(sub)
        if not sub.ended:
            sub.ended, sub.ended_at = True, killed
        sub.killed_at = killed
        endpoints = frozenset(h for s, h in HASHES.items() if matches(s, sub.pattern))
        with self.lock:
            self.lossy.append((killed, time.monotonic(), endpoints, sub))

    def silence_consumer(self, sub: Sub) -> None:
        """Stop a consumer process's heartbeat (SIGUSR1); it stays connected."""
        assert sub.proc is not None and sub.out is not None
        signalled = time.monotonic()
        sub.proc.send_signal(signal.SIGUSR1)
        wait_for(
            lambda: b"silent\n" in sub.out.read_bytes(),  # type: ignore[union-attr]
            10,
            interval=0.01,
            what=f"{sub.name} to go silent",
        )
        sub.silenced = (signalled, time.monotonic())
        sub.ended, sub.ended_at = True, signalled

    # ------------------------------------------------------------------ faults

    def set_max_deliveries(self, value: int) -> None:
        self.checker.set_config({"delivery": {"maxDeliveries": value}})
        with self.lock:
            self.max_deliveries.append((time.monotonic(), value))

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

    def restart_router(self, writers: str | None = None) -> None:
        """kill -9 the router and start it again. ``writers``: restart the writers too,
        "together" with it, or "after_hello": once every open client of this process
        said hello to the new router (the claims it names are then not yet known to
        the router as claims in cur/)."""
        killed = time.monotonic()
        sessions = {h: h.client._transport.session for h in self.clients if not h.closed}
        self.broker.kill("router")
        if writers is not None:
            for shard in range(self.broker.shards):
                self.broker.kill(f"writer{shard}")
        with self.lock:
            self.router_epoch += 1
        self.broker.start_router()
        if writers == "after_hello":
            wait_for(
                lambda: all(h.client._transport.session != old for h, old in sessions.items()),
                15,
                interval=0.02,
                what="every open client to say hello to the new router",
            )
        if writers is not None:
            for shard in range(self.broker.shards):
                self.broker.start_writer(shard)
        self.broker.wait_ready()
        ready = time.monotonic()
        # A push in flight when the router died is lost; consumers that could have
        # been pushed something: the live consuming subscriptions.
        endpoints = frozenset(
            h
            for sub in self.subs
            if sub.mode in ("consume", "process") and not sub.ended
            for s, h in HASHES.items()
            if matches(s, sub.pattern)
        )
        with self.lock:
            self.restarts.append((killed, ready))
            self.lossy.append((killed, ready, endpoints, None))

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
