"""The Python client: `connect()` returns a `Client` speaking docs/protocol.md.

Threads: one I/O thread owns the ZeroMQ sockets (a DEALER to the router, a SUB for
signals); calling threads hand it requests through an inproc socket and wait on a
future with a deadline. Each subscription's handler runs on its own thread, in the
order messages arrive, off the socket thread: a slow handler never blocks replies, and
an exception in a handler nacks that message (the reason is the exception) instead of
killing the client; answers wait up to `ACK_DELAY_S` to leave several in one frame.
The client pings once a second so the router knows it is alive (a silent client's
session ends after 5 s: its subscriptions, and its right to ack).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from sdk import subjects, wire
from sdk.curve import CurveKeys, client_keys
from sdk.errors import InvalidMessage, NotAuthorized, RelayError, Timeout, Unavailable
from sdk.paths import Home
from sdk.quiet import Full, QuietSignals
from sdk.sockets import NOBLOCK, send_parts
from sdk.types import (
    AccessRule,
    Budget,
    EndpointInfo,
    Envelope,
    PublishResult,
    Signal,
    StandardPayload,
)

log = logging.getLogger("relay.client")

DEFAULT_TIMEOUT = 10.0
HEARTBEAT_S = 1.0
IO_POLL_MS = 200  # the I/O thread's longest sleep
ACK_DELAY_S = 0.005  # a handled message's ack may wait this long to leave with others
QUIET_SIGNALS_LIMIT = 10_000  # signals sent with wait=False waiting to leave; more wait
Handler = Callable[[Envelope], Any]
_client_numbers = itertools.count(1)  # names each client's inproc socket uniquely
# A refusal, not a connection cut mid-handshake (NO_DETAIL: a router restarting).
_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
SignalHandler = Callable[[str, Signal], Any]


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message pushed to a subscription, before it is parsed."""

    sub: int
    id: str
    endpoint: str
    data: bytes


class Client:
    """A connection to a Relay broker. Thread-safe; use as a context manager."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ctx: zmq.Context | None = None,
        curve: CurveKeys | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._curve = curve
        self._ctx = ctx or zmq.Context.instance()
        self._rids = itertools.count(1)
        self._futures: dict[int, Future] = {}
        self._deadlines: dict[int, float] = {}  # rid -> time.monotonic() deadline
        self._lock = threading.Lock()
        self._closed = False
        self._subs: dict[int, _SubscriptionWorker] = {}
        # Workers whose answers wait for their deadline (the I/O thread looks at these).
        self._answers_waiting: set[_SubscriptionWorker] = set()
        self._ending = False  # close() has begun: answers leave through it, before "bye"
        self._answers_lock = threading.Lock()  # never held while waiting on anything
        self._pending_subs: dict[int, _SubscriptionWorker] = {}  # by subscribe request id
        self._signal_handlers: dict[int, tuple[str, SignalHandler]] = {}
        self._signal_ids = itertools.count(1)
        self._outbox_addr = f"inproc://relay-client-{next(_client_numbers)}"
        self._outbox_in = self._ctx.socket(zmq.PULL)
        self._outbox_in.bind(self._outbox_addr)
        self._outbox = self._ctx.socket(zmq.PUSH)
        self._outbox.setsockopt(zmq.LINGER, 0)
        self._outbox.connect(self._outbox_addr)
        self._signal_queue: queue.Queue = queue.Queue()
        self._quiet = QuietSignals(QUIET_SIGNALS_LIMIT)  # signal(wait=False), not yet sent
        self._requests_sent = 0  # closes the open segment of quiet signals (sdk/quiet.py)
        self._refused: NotAuthorized | None = None  # the broker refused our handshake
        self._batch_limit = 1  # requests per frame; the broker's hello may raise it
        self._io = threading.Thread(target=self._io_loop, name="relay-client-io", daemon=True)
        self._io_ready = threading.Event()
        self._io.start()
        self._io_ready.wait(5)
        try:
            self.server = self._call("hello", client=f"python-sdk/{os.getpid()}", batch=True)
            self._batch_limit = max(1, min(int(self.server.get("batch", 1)), wire.MAX_BATCH))
        except RelayError as exc:
            self.close()
            if not isinstance(exc, Timeout) or self._refused:
                raise self._refused or exc from None
            raise Unavailable(
                f"broker unavailable at {address}: no answer within {timeout:g} s "
                "(is `relay up` running for this home?)"
            ) from None
        self._signals_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ plumbing

    def _open_dealer(self, poller: zmq.Poller) -> tuple[zmq.Socket, zmq.Socket]:
        """A DEALER to the router, and the monitor that reports a refused handshake."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            self._curve.apply(dealer)
        refusals = dealer.get_monitor_socket(_REFUSED)
        dealer.connect(self.address)
        poller.register(dealer, zmq.POLLIN)
        poller.register(refusals, zmq.POLLIN)
        return dealer, refusals

    @staticmethod
    def _close_dealer(poller: zmq.Poller, dealer: zmq.Socket, refusals: zmq.Socket) -> None:
        for sock in (dealer, refusals):
            poller.unregister(sock)
        dealer.disable_monitor()
        refusals.close(0)
        dealer.close(0)

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        dealer, refusals = self._open_dealer(poller)
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            self._curve.apply(sub)
        self._sub_socket = sub
        poller.register(self._outbox_in, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        self._io_ready.set()
        next_ping = time.monotonic() + HEARTBEAT_S
        wait_ms = IO_POLL_MS
        try:
            while not self._closed:
                for sock, _ in poller.poll(wait_ms):
                    if sock is self._outbox_in:
                        self._forward(self._outbox_in, dealer, sub)
                    elif sock is dealer:
                        self._receive(dealer)
                    elif sock is refusals:
                        self._refuse(recv_monitor_message(refusals))
                        # A fresh socket: the refused one would send what it queued
                        # if a later handshake passed, after we reported it failed.
                        self._close_dealer(poller, dealer, refusals)
                        dealer, refusals = self._open_dealer(poller)
                        break
                    else:
                        self._receive_signals(sub)
                # Always, not only while subscribed: a message being handled after an
                # unsubscribe can still be acknowledged only by a live session.
                now = time.monotonic()
                wait_ms = self._answer_due(now, dealer, sub)
                if now >= next_ping:
                    with contextlib.suppress(zmq.Again):  # never block the I/O thread
                        dealer.send_multipart(
                            wire.encode_request("ping", 0, batch=True), zmq.NOBLOCK
                        )
                    next_ping = now + HEARTBEAT_S
                    self._expire(now)
        finally:
            self._close_dealer(poller, dealer, refusals)
            sub.close(0)
            self._outbox_in.close(0)

    def wake_for_answers(self) -> None:
        """A handler thread started a batch of answers (see `_answers_waiting`): have
        the I/O thread, which may sleep up to IO_POLL_MS, watch its deadline."""
        with self._lock:
            if not self._closed:
                self._outbox.send(b"A")

    def _answer_due(self, now: float, dealer: zmq.Socket, sub: zmq.Socket) -> int:
        """Send the answers that waited their ACK_DELAY_S (their handler thread may be
        busy with a slow message); returns how long the I/O thread may sleep (ms).

        Sent here on the DEALER, not through request(): the I/O thread must never take
        the client's lock, which a caller blocked on the full queue to it may hold. Their
        replies, like those of every answer, are not waited for (no future). What the
        handlers queued before is forwarded first: an ack never overtakes its handler's
        reply or publish. Nothing is taken once close() has begun: it answers itself,
        before "bye"."""
        wait = IO_POLL_MS / 1000
        if not self._answers_waiting:
            return IO_POLL_MS
        with self._answers_lock:  # close() sets _ending under it: no answer after "bye"
            if self._ending:
                return IO_POLL_MS
            due = []
            for worker in list(self._answers_waiting):
                handled, deadline = worker.take_due(now)
                if deadline is not None:
                    wait = min(wait, deadline - now)
                due += handled
            if due:
                while self._forward(self._outbox_in, dealer, sub) == wire.MAX_BATCH:
                    pass
                rids, bodies = [], []
                for delivery, error in due:
                    op, fields = _answer(delivery, error)
                    rids.append(next(self._rids))  # no future: its reply is dropped
                    bodies.append(wire.encode_request(op, rids[-1], **fields)[1])
                self._send(dealer, rids, bodies)
        return max(1, math.ceil(wait * 1000))

    def _expire(self, now: float) -> None:
        """Fail the requests whose deadline passed: no future waits forever, not even
        one nobody calls result() on with a timeout (publish_async)."""
        for rid, deadline in list(self._deadlines.items()):
            if deadline <= now:
                error = f"no reply from the broker at {self.address} within the deadline"
                self._fail(rid, Timeout(error))

    def _refuse(self, event: dict[str, Any]) -> None:
        """The broker refused our credentials (ZAP): fail what waits now, not at the
        deadline. Requests sent later go to a new socket and may succeed (a key added)."""
        how = "refused" if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH else "failed"
        key = "with a CURVE key" if self._curve else "without a key (uid check)"
        self._refused = NotAuthorized(
            f"the broker at {self.address} {how} this connection's handshake {key}; "
            "see auth.json and docs/security.md"
        )
        for rid in list(self._futures):
            self._fail(rid, self._refused)

    def _fail(self, rid: int, error: RelayError) -> None:
        self._deadlines.pop(rid, None)
        self._pending_subs.pop(rid, None)
        future = self._futures.pop(rid, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _forward(self, outbox: zmq.Socket, dealer: zmq.Socket, sub: zmq.Socket) -> int:
        """Move what callers queued to the sockets; returns how many items it took (at
        most wire.MAX_BATCH). Requests queued together leave together, as one batch
        frame when the broker takes batches: under load that is one ZeroMQ message, and
        one reply frame back, for many publishes."""
        rids: list[int] = []
        bodies: list[bytes] = []
        taken = 0
        while taken < wire.MAX_BATCH:  # bounded: replies and pings get their turn
            try:
                item = outbox.recv(zmq.NOBLOCK)  # one frame: a kind byte, then its data
            except zmq.Again:
                break
            taken += 1
            kind = item[:1]
            if kind == b"R":  # a request: 8 bytes of rid, then the body
                rid = int.from_bytes(item[1:9], "big")
                if rid in self._futures:  # not failed already (refused, expired)
                    rids.append(rid)
                    bodies.append(item[9:])
            elif kind == b"Q":  # signals sent with wait=False: one segment of them
                quiet = self._quiet.take()
                rids.extend([0] * len(quiet))
                bodies.extend(quiet)
            elif kind == b"C":  # connect the signal socket
                sub.connect(item[1:].decode())
            elif kind == b"S":  # subscribe the signal socket to a prefix
                sub.setsockopt(zmq.SUBSCRIBE, item[1:])
            # b"A": answers wait; the loop sets its next wake-up by their deadline
        self._send(dealer, rids, bodies)
        return taken

    def _send(self, dealer: zmq.Socket, rids: list[int], bodies: list[bytes]) -> None:
        """Send request bodies, as batch frames when the broker takes them. What the full
        queue to an unreachable broker refuses fails its futures; what has none (signals
        sent with wait=False: rid 0; answers) is dropped with a log line."""
        for part, body in wire.frames(bodies, self._batch_limit):
            try:
                send_parts(dealer, [wire.MAGIC, body], NOBLOCK)
            except zmq.ZMQError as exc:  # EAGAIN
                error = f"broker at {self.address} unreachable: {exc}"
                dropped = 0
                for rid in rids[part.start : part.stop]:
                    if rid in self._futures:
                        self._fail(rid, Unavailable(error))
                    else:
                        dropped += 1
                if dropped:
                    log.warning(
                        "%d signals (wait=False) or acks dropped (acked messages stay held): %s",
                        dropped,
                        error,
                    )

    def _receive(self, dealer: zmq.Socket) -> None:
        while True:
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                items = wire.decode_incoming_all(frames)
            except RelayError:
                log.warning("undecodable frames from the broker dropped")
                continue
            for incoming in items:
                self._take(incoming)

    def _take(self, incoming: wire.Reply | wire.Push) -> None:
        if isinstance(incoming, wire.Push):
            worker = self._subs.get(incoming.sub)
            if worker is not None:
                worker.queue.put(
                    Delivery(incoming.sub, incoming.id, incoming.endpoint, incoming.data)
                )
            return
        self._deadlines.pop(incoming.rid, None)
        future = self._futures.pop(incoming.rid, None) if incoming.rid else Future()
        if future is None or future.cancelled():  # the caller gave up on it
            return
        worker = self._pending_subs.pop(incoming.rid, None)
        if worker is not None and incoming.ok:
            # Registered here, on the I/O thread, before the backlog pushes that
            # follow the reply are read.
            worker.subscribed(incoming.result)
            self._subs[worker.sub] = worker
        if incoming.rid == 0 and incoming.ok:
            self._check_subscriptions(incoming.result)
            return
        if incoming.ok:
            future.set_result(incoming.result)
        else:
            future.set_exception(incoming.error)

    def _check_subscriptions(self, pong: Any) -> None:
        """The heartbeat's reply lists the subscriptions the router holds for us. One of
        ours missing means the router restarted or ended our silent session: subscribe
        again (on another thread: this is the I/O thread)."""
        held = pong.get("subs") if isinstance(pong, dict) else None
        if held is None:
            return
        held = set(held)
        # A copy: handler and renewal threads change the dict meanwhile. An ended worker
        # (unsubscribe() under way) is not lost, whatever the router says.
        lost = [w for sub_id, w in list(self._subs.items()) if sub_id not in held and not w.ended]
        if lost:
            threading.Thread(target=self._renew, args=(lost,), daemon=True).start()

    def _renew(self, workers: list[_SubscriptionWorker]) -> None:
        # Every lost one leaves _subs before any is renewed: the new router's ids may be
        # the old ids of others still waiting (a renewed one must not overwrite them),
        # and a second heartbeat's renewal finds them gone and does nothing.
        workers = [w for w in workers if not w.ended and self._subs.get(w.sub) is w]
        for worker in workers:
            del self._subs[worker.sub]
        for worker in workers:
            log.warning(
                "subscription %s to %r was lost by the broker; subscribing again",
                worker.sub,
                worker.fields["pattern"],
            )
            try:
                self._wait(
                    self.request("subscribe", before_send=worker, **worker.fields), "subscribe"
                )
            except RelayError as exc:
                log.error(
                    "could not renew the subscription to %r: %s", worker.fields["pattern"], exc
                )
                worker.stop()  # it handles and answers what was pushed to it, then ends
                continue
            if worker.ended:
                # Unsubscribed while it was being renewed: end that one too. Messages
                # pushed to it meanwhile reach a stopped worker and stay pending (the
                # window is one subscribe's round trip).
                self._end_at_router(worker)

    def _end_at_router(self, worker: _SubscriptionWorker) -> None:
        sub_id = worker.sub
        with contextlib.suppress(RelayError):
            self._call("unsubscribe", sub=sub_id)
        if self._subs.get(sub_id) is worker:
            del self._subs[sub_id]

    def _receive_signals(self, sub: zmq.Socket) -> None:
        """Hand what arrived to the signal thread, in one queue item (one wake-up)."""
        arrived = []
        for _ in range(1000):  # bounded: replies get their turn
            try:
                arrived.append(sub.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        if arrived:
            self._signal_queue.put(arrived)

    def request(
        self,
        op: str,
        *,
        before_send: _SubscriptionWorker | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> Future:
        """Send one request; the future holds the result or the typed error (a Timeout
        when no reply comes within ``timeout``, default the client's)."""
        rid = next(self._rids)
        future: Future = Future()
        body = wire.encode_request(op, rid, **fields)[1]
        with self._lock:  # close() takes it too: no send on a closed socket
            if self._closed:
                raise Unavailable("client is closed")
            self._futures[rid] = future
            self._deadlines[rid] = time.monotonic() + (self.timeout if timeout is None else timeout)
            if before_send is not None:
                self._pending_subs[rid] = before_send
            self._outbox.send(b"R" + rid.to_bytes(8, "big") + body)
            self._requests_sent += 1
        return future

    def _call(self, op: str, *, timeout: float | None = None, **fields: Any) -> Any:
        return self._wait(self.request(op, timeout=timeout, **fields), op, timeout)

    def _wait(self, future: Future, op: str, timeout: float | None = None) -> Any:
        """The future's result within the deadline, or a typed Timeout."""
        limit = self.timeout if timeout is None else timeout
        try:
            return future.result(limit)
        except FutureTimeout:
            raise Timeout(
                f"no reply to {op!r} from the broker at {self.address} within {limit:g} s"
            ) from None

    # ------------------------------------------------------------------ endpoints

    def register_endpoint(self, subject: str) -> EndpointInfo:
        return EndpointInfo.from_wire(self._call("register", subject=subjects.validate(subject)))

    def unregister_endpoint(self, subject: str) -> bool:
        return bool(self._call("unregister", subject=subjects.validate(subject))["removed"])

    def list_endpoints(self) -> list[EndpointInfo]:
        return [
            EndpointInfo.from_wire({k: v for k, v in e.items() if k != "depth"})
            for e in self._call("endpoints")["endpoints"]
        ]

    # ------------------------------------------------------------------ publishing

    def publish_async(
        self,
        subject: str,
        payload: Any,
        *,
        sender: str,
        reply_to: str | None = None,
        budget: Budget | None = None,
        parent_id: str | None = None,
    ) -> Future:
        """Publish without waiting; the future resolves to a PublishResult."""
        if isinstance(payload, StandardPayload):
            payload = payload.to_wire()
        fields: dict[str, Any] = {"subject": subject, "from": sender, "payload": payload}
        if reply_to is not None:
            fields["replyTo"] = reply_to
        if budget is not None:
            fields["budget"] = budget.to_wire()
        if parent_id is not None:
            fields["parentId"] = parent_id
        raw = self.request("publish", **fields)
        result: Future = Future()

        def convert(done: Future) -> None:
            if result.cancelled():
                return
            try:
                result.set_result(PublishResult.from_wire(done.result()))
            except BaseException as exc:
                result.set_exception(exc)

        raw.add_done_callback(convert)
        return result

    def publish(
        self,
        subject: str,
        payload: Any,
        *,
        sender: str,
        reply_to: str | None = None,
        budget: Budget | None = None,
        timeout: float | None = None,
    ) -> PublishResult:
        future = self.publish_async(
            subject, payload, sender=sender, reply_to=reply_to, budget=budget
        )
        return self._wait(future, "publish", timeout)

    def reply(
        self, envelope: Envelope, payload: Any, *, sender: str, reply_to: str | None = None
    ) -> PublishResult:
        """Answer a message on its replyTo, carrying its budget forward (loops get caught).

        The answer's own replyTo is ``sender`` unless given, so the conversation can go on.
        """
        future = self.reply_async(envelope, payload, sender=sender, reply_to=reply_to)
        return self._wait(future, "publish")

    def reply_async(
        self, envelope: Envelope, payload: Any, *, sender: str, reply_to: str | None = None
    ) -> Future:
        """`reply` without waiting; the future resolves to a PublishResult."""
        if envelope.reply_to is None:
            raise InvalidMessage(f"message {envelope.id} has no replyTo to answer")
        return self.publish_async(
            envelope.reply_to,
            payload,
            sender=sender,
            reply_to=reply_to or sender,
            budget=envelope.budget,
            parent_id=envelope.id,
        )

    # ------------------------------------------------------------------ consuming

    def subscribe(
        self, pattern: str, handler: Handler, *, credit: int | None = None
    ) -> Callable[[], None]:
        """Consume messages of every endpoint matching pattern; returns unsubscribe()."""
        return self._subscribe(pattern, handler, "consume", credit)

    def observe(self, pattern: str, handler: Handler) -> Callable[[], None]:
        """Watch every stored message matching pattern: no claim, no ack."""
        return self._subscribe(pattern, handler, "observe", None)

    def _subscribe(
        self, pattern: str, handler: Handler, mode: str, credit: int | None
    ) -> Callable[[], None]:
        subjects.validate(pattern, wildcards=True)
        fields: dict[str, Any] = {"pattern": pattern, "mode": mode}
        if credit is not None:
            fields["credit"] = credit
        worker = _SubscriptionWorker(self, handler, mode, fields)
        future = self.request("subscribe", before_send=worker, **fields)
        try:
            self._wait(future, "subscribe")
        except Timeout:
            # A late reply must not start a worker nobody can stop.
            self._pending_subs = {r: w for r, w in self._pending_subs.items() if w is not worker}
            raise

        def unsubscribe() -> None:
            if worker.ended:
                return
            # Ended first, so that no heartbeat renews it meanwhile (its reply may list
            # the router's subscriptions without this one before we forget it). Then
            # the router stops pushing (pushes sent before its reply still reach the
            # worker and are handled and acknowledged), then the worker stops. A
            # renewal already under way ends the new one itself (_renew).
            worker.ended = True
            self._end_at_router(worker)  # worker.sub changes if it had to be renewed
            worker.stop()

        return unsubscribe

    def pending(self, subject: str) -> list[dict[str, Any]]:
        """Claimed, unacknowledged messages of an endpoint (a consumer died holding them)."""
        return self._call("pending", subject=subjects.validate(subject))["items"]

    def complete(self, message_id: str, endpoint: str) -> None:
        self._call("complete", id=message_id, endpoint=endpoint)

    def fail(self, message_id: str, endpoint: str, reason: str = "failed by operator") -> None:
        self._call("fail", id=message_id, endpoint=endpoint, reason=reason)

    def requeue(self, message_id: str, endpoint: str) -> None:
        """Return a pending message to new/ so that a consumer gets it again."""
        self._call("requeue", id=message_id, endpoint=endpoint)

    # ------------------------------------------------------------------ signals

    def signal(
        self, subject: str, signal: Signal, *, sender: str | None = None, wait: bool = True
    ) -> None:
        """Publish an ephemeral signal. With ``wait=False`` it is fire and forget: no
        round trip (many leave in one frame), and a refusal (access rule, sender not
        allowed, bad subject) is not reported; when `QUIET_SIGNALS_LIMIT` such signals
        wait to leave, the call waits for room (a `Timeout` after the client's timeout)."""
        fields = signal_fields(subject, signal, sender)
        if wait:
            self._call("signal", **fields)
            return
        try:
            self._signal_quietly(fields, self.timeout)
        except Full as exc:
            raise Timeout(f"signal not sent within {self.timeout:g} s: {exc}") from None

    def _signal_quietly(self, fields: dict[str, Any], timeout: float | None) -> None:
        """Queue a signal sent without a reply; `Full` when no room came in ``timeout``."""
        body = wire.encode_request("signal", 0, reply=False, **fields)[1]
        self._quiet.wait_for_room(timeout)  # not under the lock: the I/O thread frees room
        with self._lock:  # as requests are sent: one order for signals and requests
            if self._closed:
                raise Unavailable("client is closed")
            if not self._quiet.add(body, self._requests_sent):
                return  # the marker of its segment is on its way already
            try:
                self._outbox.send(b"Q")
            except BaseException:
                self._quiet.withdraw_last()  # no marker would ever take it
                raise

    def on_signal(self, pattern: str, handler: SignalHandler) -> Callable[[], None]:
        """Call handler(subject, signal) for each signal whose subject matches pattern."""
        subjects.validate(pattern, wildcards=True)
        key = next(self._signal_ids)
        with self._lock:
            if self._signals_thread is None:
                self._outbox.send(b"C" + self.server["signals"].encode())
                self._signals_thread = threading.Thread(
                    target=self._signal_loop, name="relay-client-signals", daemon=True
                )
                self._signals_thread.start()
            self._signal_handlers[key] = (pattern, handler)
            # Runs of signals (one message for many) from a broker that offers them:
            # docs/protocol.md, "signal".
            runs = wire.SIGNAL_RUN if self.server.get("signalRuns") is True else b""
            self._outbox.send(b"S" + runs + subjects.literal_prefix(pattern).encode())
        return lambda: self._signal_handlers.pop(key, None) and None

    def _signal_loop(self) -> None:
        while not self._closed:
            try:
                arrived = self._signal_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            for frames in arrived:
                self._dispatch_signal(frames)

    def _dispatch_signal(self, frames: list[bytes]) -> None:
        """One message of the signals socket: a subject and the signals sent on it."""
        try:
            subject, bodies = wire.decode_signals(frames)
        except RelayError:
            log.warning("malformed signal message dropped")
            return
        if not subjects.is_valid(subject):
            log.warning("signal message on an invalid subject %.60r dropped", subject)
            return
        handlers = self._signal_handlers
        matched = [(k, h) for k, (p, h) in list(handlers.items()) if subjects.matches(subject, p)]
        if not matched:
            return
        malformed = 0
        for body in bodies:
            try:
                signal = Signal.from_wire(body)
            except RelayError:
                malformed += 1
                continue
            for key, handler in matched:
                if key not in handlers:  # unsubscribed while this run was handled
                    continue
                try:
                    handler(subject, signal)
                except Exception:
                    log.exception("signal handler failed")
        if malformed:
            log.warning("%d malformed signals on %s dropped", malformed, subject)

    # ------------------------------------------------------------------ administration

    def dead_letters(
        self, endpoint_hash: str | None = None, *, limit: int = 100
    ) -> list[dict[str, Any]]:
        fields: dict[str, Any] = {"limit": limit}
        if endpoint_hash is not None:
            fields["endpoint"] = endpoint_hash
        return self._call("dead_letters", **fields)["items"]

    def purge_dead_letters(self, endpoint_hash: str | None = None) -> int:
        fields = {} if endpoint_hash is None else {"endpoint": endpoint_hash}
        return self._call("purge_dead_letters", **fields)["purged"]

    def rebuild_index(self) -> int:
        return self._call("rebuild_index", timeout=max(self.timeout, 120))["messages"]

    def add_rule(self, rule: AccessRule) -> AccessRule:
        return AccessRule.from_wire(self._call("add_rule", rule=rule.to_wire()))

    def remove_rule(self, from_pattern: str, to_pattern: str) -> bool:
        return bool(
            self._call("remove_rule", **{"from": from_pattern, "to": to_pattern})["removed"]
        )

    def list_rules(self) -> list[AccessRule]:
        return [AccessRule.from_wire(r) for r in self._call("list_rules")["rules"]]

    def get_config(self) -> dict[str, Any]:
        return self._call("get_config")

    def set_config(self, partial: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("set_config", config=dict(partial))

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Processes, sessions, and every endpoint with its depth, pressure and breaker."""
        return self._call("status", timeout=timeout)

    def compact_remove(
        self,
        items: list[tuple[str, str]],
        *,
        checkpoint: bool = False,
        vacuum_pages: int = 0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Ops compaction: have the owning writers delete archived (done, failed) copies."""
        return self._call(
            "compact_remove",
            items=[list(i) for i in items],
            checkpoint=checkpoint,
            vacuumPages=vacuum_pages,
            timeout=timeout,
        )

    def trace(self, message_id: str) -> dict[str, Any]:
        return self._call("trace", id=message_id)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        if self._closed:
            return
        # Messages pushed but not yet handled are dropped here: they stay claimed and are
        # listed by pending(), rather than being handled with an ack that cannot go out.
        with self._answers_lock:  # waits for answers the I/O thread is sending
            self._ending = True  # from here it leaves them to us
        for worker in {*self._subs.values(), *self._answers_waiting}:
            worker.stop(discard_queued=True)
            if self._io.is_alive():
                worker.answer()  # what it handled is answered before "bye"
        if self._io.is_alive() and hasattr(self, "server"):
            with contextlib.suppress(RelayError):
                self._call("bye", timeout=min(self.timeout, 5.0))
        self._subs.clear()
        with self._lock:
            self._closed = True
        self._quiet.close()
        self._io.join(2)
        self._outbox.close(0)
        for future in list(self._futures.values()):
            if not future.done():
                future.set_exception(Unavailable("client closed"))
        self._futures.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def signal_fields(subject: str, signal: Signal, sender: str | None) -> dict[str, Any]:
    """The fields of a ``signal`` request."""
    fields: dict[str, Any] = {"subject": subject, "signal": signal.to_wire()}
    if sender is not None:
        fields["from"] = sender
    return fields


class _SubscriptionWorker:
    """Runs one subscription's handler, in order, on its own thread.

    Its answers (ack, nack) wait up to `ACK_DELAY_S` after the first of them to leave
    together, a quarter of the subscription's credit at most: at a steady rate the router
    and the writer then handle several in one pass and one commit instead of one each
    (docs/performance.md, "publish -> handler"). With credit under 4, or a broker that
    does not say the credit, each answer leaves as soon as its message is handled."""

    def __init__(self, client: Client, handler: Handler, mode: str, fields: dict[str, Any]) -> None:
        self.ended = False  # unsubscribe() was called: never renewed
        self.client = client
        self.handler = handler
        self.mode = mode
        self.fields = fields  # the subscribe request, to renew it
        self.sub = 0
        self.answers_together = 1  # set from the subscribe reply's credit
        self.queue: queue.Queue[Delivery | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="relay-handler", daemon=True)
        # Handled, not yet answered, and by when they leave: sent by this thread when a
        # quarter of the credit waits, else by the client's I/O thread at the deadline
        # (this thread may be busy in a slow handler), or by close().
        self._unsent: list[tuple[Delivery, str | None]] = []
        self._deadline = 0.0
        self._unsent_lock = threading.Lock()
        self._answering = threading.Lock()  # held while answer() queues what it took

    def subscribed(self, result: Mapping[str, Any]) -> None:
        """The subscribe reply came (on the I/O thread): start handling."""
        self.sub = result["sub"]
        credit = result.get("credit")
        if isinstance(credit, int):
            self.answers_together = answers_together(credit)
        if self.thread.ident is None:  # a renewed subscription keeps its thread
            self.thread.start()

    def stop(self, *, discard_queued: bool = False) -> None:
        if discard_queued:
            with contextlib.suppress(queue.Empty):
                while True:
                    self.queue.get_nowait()
        self.queue.put(None)

    def _run(self) -> None:
        while (delivery := self.queue.get()) is not None:
            error = self._handle(delivery)
            if self.mode != "consume":
                continue
            with self._unsent_lock:
                first = not self._unsent
                if first:
                    self._deadline = time.monotonic() + ACK_DELAY_S
                    self.client._answers_waiting.add(self)
                self._unsent.append((delivery, error))
                due = len(self._unsent) >= self.answers_together
            if due or time.monotonic() >= self._deadline:  # also while messages queue up
                self.answer()
            elif first:
                self.client.wake_for_answers()
        self.answer()

    def take_due(self, now: float) -> tuple[list[tuple[Delivery, str | None]], float | None]:
        """(I/O thread) The answers whose deadline passed, taken to be sent; otherwise
        none, and the deadline of those waiting (None when none wait)."""
        with self._unsent_lock:  # the same lock as the add in _run: none is missed
            if self._unsent and now < self._deadline:
                return [], self._deadline
            handled, self._unsent = self._unsent, []
            self.client._answers_waiting.discard(self)
        return handled, None

    def answer(self) -> None:
        """Ack or nack each message handled and not yet answered. Queued back to back,
        they usually leave in one frame (a batch, when the broker takes batches). One
        caller at a time, so that close() returns only once the handler thread's answers
        are queued, before its "bye"."""
        with self._answering:
            with self._unsent_lock:
                handled, self._unsent = self._unsent, []
            for delivery, error in handled:
                op, fields = _answer(delivery, error)
                try:
                    self.client.request(op, **fields)
                except RelayError:
                    log.warning("could not acknowledge %s: client closed", delivery.id)

    def _handle(self, delivery: Delivery) -> str | None:
        try:
            envelope = Envelope.from_json(delivery.data)
        except RelayError as exc:
            return f"unreadable message: {exc}"
        try:
            self.handler(envelope)
        except Exception as exc:
            log.warning("handler failed on %s: %r", delivery.id, exc)
            return f"handler error: {type(exc).__name__}: {exc}"[:1000]
        return None


def answers_together(credit: int) -> int:
    """How many answers of a subscription with this credit may wait to leave together."""
    return max(1, credit // 4)


def _answer(delivery: Delivery, error: str | None) -> tuple[str, dict[str, Any]]:
    """The ack of a message handled, or its nack with the handler's error."""
    fields: dict[str, Any] = {"sub": delivery.sub, "id": delivery.id, "endpoint": delivery.endpoint}
    if error is None:
        return "ack", fields
    return "nack", {**fields, "reason": error}


def connect(
    home: str | os.PathLike[str] | None = None,
    *,
    address: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    key_file: str | os.PathLike[str] | None = None,
    server_key: str | os.PathLike[str] | None = None,
) -> Client:
    """Connect to the broker of a data directory (default $RELAY_HOME or ~/.dork/relay).

    On tcp:// the broker wants CURVE: ``key_file`` is this client's ``.key_secret``
    certificate (default ``$RELAY_KEY_FILE``) and ``server_key`` the broker's public key,
    as Z85 text or a certificate path (default ``$RELAY_SERVER_KEY``, else
    ``<home>/keys/server.key`` when this machine has it).
    """
    where = Home(home)
    address = address or where.router_address
    curve = None
    key_file = key_file or os.environ.get("RELAY_KEY_FILE")
    if key_file and address.startswith("tcp://"):  # ipc:// checks the uid instead
        server_key = server_key or os.environ.get("RELAY_SERVER_KEY")
        curve = client_keys(key_file, server_key or where.server_public_key_file)
    return Client(address, timeout=timeout, curve=curve)
