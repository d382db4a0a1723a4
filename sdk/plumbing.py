"""The plumbing under a `Client` (sdk/client.py): requests from calling threads to the
I/O thread, the I/O thread, and the signal thread.

Calling threads hand requests to the I/O thread through an inproc socket (`request`)
and wait on a future with a deadline (`_wait`). The I/O thread alone owns the ZeroMQ
sockets (a DEALER to the router, a SUB for signals): it forwards what callers queued,
as batch frames when the broker takes them, takes replies and pushed messages, pings
every `HEARTBEAT_S` and renews the subscriptions the router no longer holds, fails
requests past their deadline or refused at the handshake, and sends the answers of
subscriptions that waited their `ACK_DELAY_S`. The signal thread calls the
`on_signal` handlers.

`ClientPlumbing` is the part of `Client` that does this; `Client.__init__` sets the
state it shares with the calling threads (annotated below).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from sdk import subjects, wire
from sdk.curve import CurveKeys
from sdk.errors import NotAuthorized, RelayError, Timeout, Unavailable
from sdk.quiet import QuietSignals
from sdk.sockets import NOBLOCK, send_parts
from sdk.subscription import Delivery, SubscriptionWorker, answer_of
from sdk.types import Signal

log = logging.getLogger("relay.client")

HEARTBEAT_S = 1.0
IO_POLL_MS = 200  # the I/O thread's longest sleep
# A refusal, not a connection cut mid-handshake (NO_DETAIL: a router restarting).
_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class ClientPlumbing:
    """Requests, the I/O thread and the signal thread of a `Client`."""

    # Set by Client.__init__; see there what each holds.
    address: str
    timeout: float
    _curve: CurveKeys | None
    _acting: dict[str, str]
    _ctx: zmq.Context
    _rids: Any  # itertools.count
    _futures: dict[int, Future]
    _deadlines: dict[int, float]
    _lock: threading.Lock
    _closed: bool
    _subs: dict[int, SubscriptionWorker]
    _answers_waiting: set[SubscriptionWorker]
    _ending: bool
    _answers_lock: threading.Lock
    _pending_subs: dict[int, SubscriptionWorker]
    _signal_handlers: dict[int, tuple[str, Any]]
    _outbox_in: zmq.Socket
    _outbox: zmq.Socket
    _signal_queue: queue.Queue
    _quiet: QuietSignals
    _requests_sent: int
    _refused: NotAuthorized | None
    _batch_limit: int
    _io_ready: threading.Event

    # ------------------------------------------------------------------ the I/O thread

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

    def answers_waiting(self, worker: SubscriptionWorker, waiting: bool) -> None:
        """A worker's answers wait for their deadline (the I/O thread watches it), or no
        longer do. Called under the worker's lock, never the client's."""
        if waiting:
            self._answers_waiting.add(worker)
        else:
            self._answers_waiting.discard(worker)

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
                    self.answered(delivery.id, delivery.endpoint, delivery.deliveries)
                    op, fields = answer_of(delivery, error)
                    rids.append(next(self._rids))  # no future: its reply is dropped
                    bodies.append(wire.encode_request(op, rids[-1], **self._acting, **fields)[1])
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
                delivery = Delivery(
                    incoming.sub, incoming.id, incoming.endpoint, incoming.data, incoming.deliveries
                )
                if worker.mode == "consume":
                    ack_wait = worker.fields.get("ackWait")
                    self.holding(delivery.id, delivery.endpoint, delivery.deliveries, ack_wait)
                worker.queue.put(delivery)
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
        token = pong.get("session")
        if token is not None and token != self._session:
            # The router forgot this client (it restarted, or ended the session):
            # say hello again with the claims it holds, so they stay its own.
            threading.Thread(target=self._resume, daemon=True).start()
        held = set(held)
        # A copy: handler and renewal threads change the dict meanwhile. An ended worker
        # (unsubscribe() under way) is not lost, whatever the router says.
        lost = [
            (w, w.renewals)
            for sub_id, w in list(self._subs.items())
            if sub_id not in held and not w.ended
        ]
        if lost:
            threading.Thread(target=self._renew, args=(lost,), daemon=True).start()

    def _renew(self, lost: list[tuple[SubscriptionWorker, int]]) -> None:
        """Subscribe again for each worker found lost at its ``renewals`` count."""
        # Every lost one leaves _subs before any is renewed: the new router's ids may be
        # the old ids of others still waiting (a renewed one must not overwrite them).
        # Under the lock, and only if not renewed since it was found lost: two renewals
        # of one loss (two heartbeats' threads) must not subscribe it twice.
        with self._renew_lock:
            workers = [
                w
                for w, renewals in lost
                if not w.ended and w.renewals == renewals and self._subs.get(w.sub) is w
            ]
            for worker in workers:
                worker.renewals += 1
                del self._subs[worker.sub]
        for worker in workers:
            log.warning(
                "subscription %s to %r was lost by the broker; subscribing again",
                worker.sub,
                worker.fields["pattern"],
            )
            try:
                self._wait(
                    self.send_request("subscribe", before_send=worker, **worker.fields), "subscribe"
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

    def _end_at_router(self, worker: SubscriptionWorker) -> None:
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

    # ------------------------------------------------------------------ calling threads

    def send_request(
        self,
        op: str,
        *,
        before_send: SubscriptionWorker | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> Future:
        """Send one request; the future holds the result or the typed error (a Timeout
        when no reply comes within ``timeout``, default the client's)."""
        rid = next(self._rids)
        future: Future = Future()
        body = wire.encode_request(op, rid, **self._acting, **fields)[1]
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
        return self._wait(self.send_request(op, timeout=timeout, **fields), op, timeout)

    def _wait(self, future: Future, op: str, timeout: float | None = None) -> Any:
        """The future's result within the deadline, or a typed Timeout."""
        limit = self.timeout if timeout is None else timeout
        try:
            return future.result(limit)
        except FutureTimeout:
            raise Timeout(
                f"no reply to {op!r} from the broker at {self.address} within {limit:g} s"
            ) from None

    # ------------------------------------------------------------------ signal thread

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
