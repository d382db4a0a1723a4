"""A client's connection to its router: the one owner of the ZeroMQ sockets, the I/O
thread, the requests in flight with their deadlines, and the session.

Calling threads hand requests to the I/O thread through an inproc socket
(`send_request`) and wait on a future with a deadline (`wait`). The I/O thread owns the
sockets (a DEALER to the router, a SUB for signals): it forwards what callers queued, as
batch frames when the broker takes them, takes replies and pushed messages, pings every
`HEARTBEAT_S`, and fails requests past their deadline or refused at the handshake. What
is not the reply to a request it hands up through a small interface, `Consumer` (pushed
messages, the subscriptions the router holds, answers whose delay passed), and a sink
for signal messages.

One exception, for latency (docs/architecture.md, "The SDK client, inside"): a
synchronous call with nothing else in flight (`call`) takes the DEALER itself, sends
its request and reads the socket until its reply comes, dispatching whatever else
arrives meanwhile as the I/O thread would (leader/follower). Whoever uses the DEALER
holds `_dealer_lock`, and reads the socket until it is empty before letting go: the
socket's descriptor, which the I/O thread polls instead of the socket, signals only a
change. The I/O thread polls it only when something may arrive that no caller reads
(`_watch`), so that a reply wakes the caller alone. When it needs the socket a caller
holds (requests queued, a ping, answers due, a refused handshake, close), it rings a
pipe (`_wanted`) and the caller lets go at once, then waits for its reply like any
other caller.

A second kind of thread reads the DEALER the same way: a subscription's handler thread
waiting for its next message (`follow`, a `Follower`), so that a pushed message reaches
its handler with no hand-off from the I/O thread. It lets go while its handler runs
and, when the I/O thread wants the socket, until the I/O thread is done (`_io_free`).
While its handler runs, the I/O thread does not watch the socket for that
subscription's pushes (`_lent_to`): they wait, unread, for the handler thread to come
back, so that a steady consumer's pushes wake its handler thread alone.

The session is the transport's too: the hello's token and the hand-outs this client
holds (sdk/holdings.py). When a heartbeat's reply names another session (the router
restarted, or ended a silent session), it says hello again with both, so that what the
client holds stays its own.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message

from sdk import wire
from sdk.curve import CurveKeys
from sdk.errors import NotAuthorized, RelayError, Timeout, Unavailable
from sdk.holdings import Holdings
from sdk.quiet import QuietSignals
from sdk.sockets import (
    NOBLOCK,
    POLLIN,
    PollItem,
    poll_item,
    ready_in,
    recv_parts,
    send_parts,
    waiting,
)

log = logging.getLogger("relay.client")

HEARTBEAT_S = 1.0  # the longest gap between pings


def ping_interval(session_timeout_ms: Any) -> float:
    """Seconds between pings: at most a second, and four within the router's session
    timeout when it is shorter (a late ping must not end a live session)."""
    if not isinstance(session_timeout_ms, int) or session_timeout_ms <= 0:
        return HEARTBEAT_S
    return min(HEARTBEAT_S, max(0.05, session_timeout_ms / 4000))


IO_POLL_MS = 200  # the I/O thread's longest sleep
FOLLOW_POLL_MS = 1000  # a follower's longest sleep (told to stop or let go: at once)
IO_MOMENT_S = 0.05  # the longest a follower waits for the I/O thread to let go
# A request sent without waiting goes out on its caller's thread while fewer than this
# many await replies: at a paced rate it skips a hand-off (at 1,000/s, 2-10 are in
# flight as the disk allows: 4 left most of them to the I/O thread on a slow minute);
# pipelined, the I/O thread batches what callers queue (one frame for many).
SENT_HERE_IN_FLIGHT = 16
# After a request sent without waiting, the I/O thread watches the DEALER this long even
# with nothing in flight: the next one then needs no ring to have it read its reply, a
# wake-up of the I/O thread at the moment the request leaves (`_poll_dealer`).
WATCH_AFTER_SENT_S = 0.1
# A refusal, not a connection cut mid-handshake (NO_DETAIL: a router restarting).
_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_numbers = itertools.count(1)  # names each transport's inproc socket uniquely

Request = tuple[str, dict[str, Any]]  # an operation and its fields
ReplyHook = Callable[[Any], None]  # called on the I/O thread with a request's result
SignalSink = Callable[[list[list[bytes]]], None]  # messages of the signals socket


class Consumer(Protocol):
    """What the I/O thread hands to the client's subscriptions (on that thread)."""

    def pushed(self, push: wire.Push) -> None:
        """A message pushed for a subscription."""

    def expects_pushes(self, besides: object = None) -> bool:
        """Messages may be pushed to us (a subscription lives or is being made) for a
        subscription other than ``besides`` (a follower's: `Follower.subscription`)."""

    def router_holds(self, subs: set[int]) -> None:
        """A heartbeat's reply: the ids of the subscriptions the router holds for us."""

    def answers_due(self, now: float, send: Callable[[list[Request]], None]) -> float | None:
        """Send, through ``send``, the answers whose delay passed; returns when the next
        waiting one is due (monotonic), None when none waits."""


class Follower(Protocol):
    """A subscription's handler thread that reads the DEALER itself while it waits for
    its next message (`Transport.follow`; sdk/subscription.py's worker)."""

    @property
    def subscription(self) -> object:
        """What it is to `Consumer.expects_pushes`: pushes for it wait for it."""

    def has_next(self) -> bool:
        """A message waits for its handler (dispatched to its queue)."""

    def stopping(self) -> bool:
        """It was told to stop (its bell rang)."""

    def bell_fd(self) -> int:
        """A descriptor that becomes readable when it is told to stop."""

    def answers_due(self, now: float, send: Callable[[list[Request]], None]) -> float | None:
        """Send, through ``send``, its answers whose delay passed; returns when the next
        waiting one is due, None when none waits (`Consumer.answers_due`, for it alone)."""


class Transport:
    """The sockets, the I/O thread, the requests in flight and the session."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float,
        ctx: zmq.Context | None = None,
        curve: CurveKeys | None = None,
        quiet_limit: int,
        acting_for: str | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout  # a request's deadline unless it says another
        self._curve = curve
        # Every request names the identity it acts for (a delegate's connection:
        # docs/security.md, "Delegation"); empty: the connection's own identity.
        self._acting: dict[str, str] = {"actingFor": acting_for} if acting_for else {}
        self._ctx = ctx or zmq.Context.instance()
        self._rids = itertools.count(1)
        self._futures: dict[int, Future] = {}
        self._deadlines: dict[int, float] = {}  # rid -> time.monotonic() deadline
        self._on_reply: dict[int, ReplyHook] = {}  # rid -> run on the I/O thread first
        self._lock = threading.Lock()  # sends to the I/O thread; never taken by it
        # Whoever holds it may use the DEALER: the I/O thread, or a caller leading (`call`).
        self._dealer_lock = threading.Lock()
        # Rung by the I/O thread when it waits for the DEALER a caller holds.
        self._wanted = Bell()
        # Rung by a caller that lets go of the DEALER while the I/O thread does not poll
        # it (`_io_blind`) and something may come that nobody else reads: the I/O
        # thread then looks again whether to poll it (`_poll_dealer`).
        self._look = Bell()
        self._io_blind = False
        self._sent_lately_until = 0.0  # time.monotonic(): watched until (`_poll_dealer`)
        # Set with a ring of `_look` by a caller that let go with a message unread
        # (`_let_go_unread`): the I/O thread reads the DEALER when it looks.
        self._io_reads = False
        # The follower (a subscription's handler thread) that lent the DEALER while its
        # handler runs and reads it again after: the I/O thread does not watch the
        # socket for its pushes meanwhile (`follow`, `_watch`).
        self._lent_to: Follower | None = None
        # Clear while the I/O thread holds the DEALER or waits for it (a moment: a send,
        # a read); a follower that finds the socket taken waits for it (`follow`).
        self._io_free = threading.Event()
        self._io_free.set()
        self._holding = HoldingDealer(self)
        self._ping_out = False  # a ping's reply is awaited (by the I/O thread)
        self._queued = 0  # items callers put on the inproc queue (under _lock)
        self._taken = 0  # items the I/O thread took from it (by it alone)
        self._closed = False
        outbox_addr = f"inproc://relay-client-{next(_numbers)}"
        self._outbox_in = self._ctx.socket(zmq.PULL)
        self._outbox_in.bind(outbox_addr)
        self._outbox = self._ctx.socket(zmq.PUSH)
        self._outbox.setsockopt(zmq.LINGER, 0)
        self._outbox.connect(outbox_addr)
        self._quiet = QuietSignals(quiet_limit)  # signal(wait=False), not yet sent
        self._requests_sent = 0  # closes the open segment of quiet signals (sdk/quiet.py)
        self._refused: NotAuthorized | None = None  # the broker refused our handshake
        self._batch_limit = 1  # requests per frame; the broker's hello may raise it
        self.holdings = Holdings()
        self.session: str | None = None  # the hello's token, named to resume
        self._ping_every = HEARTBEAT_S  # the hello's and pings' sessionTimeoutMs set it
        self._resuming = threading.Lock()
        self._consumer: Consumer
        self._signals: SignalSink
        self._io = threading.Thread(target=self._io_loop, name="relay-client-io", daemon=True)
        self._io_ready = threading.Event()

    # ------------------------------------------------------------------ calling threads

    def open(self, consumer: Consumer, signals: SignalSink) -> dict[str, Any]:
        """Start the I/O thread and say hello; returns the router's hello (closed and a
        typed error when none comes)."""
        self._consumer, self._signals = consumer, signals
        self._io.start()
        self._io_ready.wait(5)
        try:
            server = self.call("hello", client=_client_name(), batch=True)
        except RelayError as exc:
            self.close()
            if not isinstance(exc, Timeout) or self._refused:
                raise self._refused or exc from None
            raise Unavailable(
                f"broker unavailable at {self.address}: no answer within {self.timeout:g} s "
                "(is `relay up` running for this home?)"
            ) from None
        self.session = server.get("session")
        self._ping_every = ping_interval(server.get("sessionTimeoutMs"))
        self._batch_limit = max(1, min(int(server.get("batch", 1)), wire.MAX_BATCH))
        return server

    @property
    def alive(self) -> bool:
        """The I/O thread runs: requests can still leave."""
        return self._io.is_alive()

    @property
    def closed(self) -> bool:
        return self._closed

    def send_request(
        self,
        op: str,
        *,
        timeout: float | None = None,
        on_reply: ReplyHook | None = None,
        convert: Callable[[Any], Any] | None = None,
        sent_here: bool = False,
        **fields: Any,
    ) -> Future:
        """Send one request; the future holds the result or the typed error (a Timeout
        when no reply comes within ``timeout``, default the transport's). ``on_reply``
        runs on the I/O thread with a successful result before anything read after it;
        ``convert``, there too, makes the future's result (`Converting`). With
        ``sent_here``, the caller sends it on the DEALER itself when that is free,
        nothing is queued before it and fewer than SENT_HERE_IN_FLIGHT requests await
        replies: no hand-off to the I/O thread on the way out. Its reply is read by the
        I/O thread, or a thread reading the socket as it does, never by this caller
        (`_let_go_unread`). Not for requests queued back to back, which leave together
        as one batch through the I/O thread."""
        future = Future() if convert is None else Converting(convert)
        here_below = SENT_HERE_IN_FLIGHT if sent_here else 0
        if sent_here:
            self._sent_lately_until = time.monotonic() + WATCH_AFTER_SENT_S
        future, deadline = self._submit(op, timeout, on_reply, fields, future, here_below)
        if deadline is not None:  # sent here: let go of the socket, not read
            self._let_go_unread()
        return future

    def call(self, op: str, *, timeout: float | None = None, **fields: Any) -> Any:
        """One request and its result (or typed error) within the deadline. With nothing
        else in flight or queued, the caller sends it and reads its reply itself."""
        future, deadline = self._submit(op, timeout, None, fields, Future(), 1)
        if deadline is not None:
            self._lead(future, deadline)
        return self.wait(future, op, timeout)

    def _submit(
        self,
        op: str,
        timeout: float | None,
        on_reply: ReplyHook | None,
        fields: dict[str, Any],
        future: Future,
        here_below: int,
    ) -> tuple[Future, float | None]:
        """Register a request and send it: on the DEALER itself when it is free, nothing
        is queued before it and fewer than ``here_below`` requests await replies (1 for
        a caller who will read its reply: none; 0: never), else through the I/O thread.
        Returns its future, and its deadline when the caller holds the DEALER (it must
        let go)."""
        rid = next(self._rids)
        body = wire.encode_request(op, rid, **self._acting, **fields)[1]
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._lock:  # close() takes it too: no send on a closed socket
            if self._closed:
                raise Unavailable("client is closed")
            # Nothing queued before it may be overtaken (signals, requests of this
            # thread); a caller who will read the socket until its reply comes takes
            # no reply that another read awaits (the I/O thread's).
            lead = (
                len(self._futures) < here_below
                and self._queued == self._taken
                and self._dealer_lock.acquire(blocking=False)
            )
            self._futures[rid] = future
            self._deadlines[rid] = deadline
            if on_reply is not None:
                self._on_reply[rid] = on_reply
            self._requests_sent += 1
            if not lead:
                self._outbox.send(b"R" + rid.to_bytes(8, "big") + body)
                self._queued += 1
                return future, None
        # Requests queued from here on wait for the DEALER: this one leaves first.
        try:
            send_parts(self._dealer, [wire.MAGIC, body], NOBLOCK)
        except zmq.ZMQError as exc:  # EAGAIN: the queue to an unreachable broker is full
            self._fail(rid, Unavailable(f"broker at {self.address} unreachable: {exc}"))
            try:
                self._receive()
            finally:
                self._release_dealer()
            return future, None
        return future, deadline

    def _lead(self, future: Future, deadline: float) -> None:
        """(A caller holding the DEALER.) Read it until ``future`` is resolved, its
        deadline passes, or the I/O thread wants the socket; then let go. What arrives
        for others is dispatched as the I/O thread would."""
        try:
            self._receive()  # a reply may have come during the send
            while not future.done() and not self._closed:
                left_ms = math.ceil((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    return
                # Sockets and descriptors: the stub's overloads type it as one or the other.
                ready: list[tuple[Any, int]] = zmq.zmq_poll(
                    [(self._dealer, POLLIN), (self._wanted.r, POLLIN)],
                    min(left_ms, IO_POLL_MS),
                )
                self._receive()  # first: a reply that came with the I/O thread's call
                if any(item == self._wanted.r for item, _ in ready):
                    return
        finally:
            self._release_dealer()

    def follow(self, follower: Follower) -> bool:
        """(A subscription's handler thread, nothing in its queue) Read the DEALER itself
        until a message for it is dispatched to its queue, dispatching what else arrives
        as the I/O thread would, and send its answers when they are due: no thread
        hand-off between the socket and its handler. True when a message (or its stop)
        waits; then it lends the socket while its handler runs (`_lent_to`). When the
        I/O thread wants the socket (a ping, answers due, a request queued) it lets go
        and takes it back once the I/O thread is done. False when another caller holds
        the socket, or something is queued for the I/O thread to send before the answers
        due: the follower then waits on its queue, and the I/O thread reads for it."""
        if self._closed or not self._acquire_as_follower():
            self.stop_following(follower)
            return False
        following, held = False, True
        try:
            self._lent_to = follower
            self._receive()
            poll: list[tuple[Any, int]] = [
                (self._dealer, POLLIN),
                (self._wanted.r, POLLIN),
                (follower.bell_fd(), POLLIN),
            ]
            while not follower.has_next() and not follower.stopping() and not self._closed:
                now = time.monotonic()
                # What callers queued for the I/O thread leaves before the answers
                # (a handler's reply before its ack): leave the answers to it then.
                if self._queued != self._taken:
                    return False
                due = follower.answers_due(now, self._send_answers)
                wait_ms = FOLLOW_POLL_MS if due is None else math.ceil((due - now) * 1000)
                ready: list[tuple[Any, int]] = zmq.zmq_poll(
                    poll, max(1, min(wait_ms, FOLLOW_POLL_MS))
                )
                self._receive()
                if any(item == self._wanted.r for item, _ in ready):
                    self._dealer_lock.release()  # the I/O thread waits for it: awake
                    held = self._acquire_as_follower()
                    if not held:
                        return False
            following = True
            return True
        finally:
            if not following:
                self._lent_to = None
            if held:
                self._release_dealer()
            else:
                self._tell_io_to_look()

    def _acquire_as_follower(self) -> bool:
        """Take the DEALER for a follower: at once, or after the I/O thread, which holds
        it only for a moment, lets go; not while a caller holds it (a fetch that waits
        may hold it for seconds: the follower waits on its queue meanwhile)."""
        # The I/O thread first: taking the lock while it waits for it (it asked, by
        # `_wanted`, and clears that only once it has the lock) would only be asked again.
        if not self._io_free.is_set() and not self._io_free.wait(IO_MOMENT_S):
            return False
        return self._dealer_lock.acquire(blocking=False)

    def stop_following(self, follower: Follower) -> None:
        """(A follower) It waits on its queue from now on, or ends: the I/O thread reads
        the socket for it again."""
        if self._lent_to is follower:
            self._lent_to = None
            self._tell_io_to_look()

    def _send_answers(self, requests: list[Request]) -> None:
        """(The thread holding the DEALER) Send requests whose replies nobody waits for."""
        rids = [next(self._rids) for _ in requests]  # no future: replies are dropped
        bodies = [
            wire.encode_request(op, rid, **self._acting, **fields)[1]
            for rid, (op, fields) in zip(rids, requests, strict=True)
        ]
        self._send(rids, bodies)

    def _let_go_unread(self) -> None:
        """(A caller that sent without waiting) Let go of the DEALER without reading it:
        what came is the I/O thread's to read and dispatch, since a reply read here
        would run its future's callbacks inside this call, on a thread that may hold
        the locks they take. A send may have taken the socket's descriptor's signal of a
        message already there (it signals only a change), so the I/O thread is told
        to read it."""
        try:
            unread = waiting(self._dealer_item)
            if unread:
                self._io_reads = True  # before the release: the I/O thread reads it after
        finally:
            self._release_dealer()
        if unread:
            self._ring_look()

    def _release_dealer(self) -> None:
        """(A caller or a follower) Let go of the DEALER, read empty (or with what waits
        left to the I/O thread, `_let_go_unread`). An I/O thread that does not poll it
        is told to look again if something may come that it must read."""
        self._dealer_lock.release()
        self._tell_io_to_look()  # after the release: _poll_dealer

    def _tell_io_to_look(self) -> None:
        """An I/O thread that does not poll the DEALER (`_io_blind`) looks again whether
        to, if something may come that only it would read (`_watch`)."""
        if self._io_blind and self._watch():
            self._ring_look()

    def _watch(self) -> bool:
        """Something may arrive on the DEALER that no caller reads: a reply awaited, a
        ping's, or a pushed message, except one for the follower that lent the socket
        while its handler runs (`_lent_to`): that waits, unread, until it follows again.
        So a steady consumer's pushes wake its handler thread alone."""
        lent = self._lent_to
        return (
            bool(self._futures)
            or self._ping_out
            or self._consumer.expects_pushes(None if lent is None else lent.subscription)
        )

    def wait(self, future: Future, op: str, timeout: float | None = None) -> Any:
        """The future's result within ``timeout`` (default the transport's), or a typed
        Timeout."""
        limit = self.timeout if timeout is None else timeout
        try:
            return future.result(limit)
        except FutureTimeout:
            raise Timeout(
                f"no reply to {op!r} from the broker at {self.address} within {limit:g} s"
            ) from None

    def send_quietly(self, op: str, timeout: float | None, **fields: Any) -> None:
        """Queue a request sent without a reply (a signal with wait=False); `Full`
        (sdk/quiet.py) when no room came in ``timeout``."""
        body = wire.encode_request(op, 0, reply=False, **self._acting, **fields)[1]
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
            self._queued += 1

    def listen_signals(self, address: str) -> None:
        """Connect the signals socket to the router's."""
        self._to_io(b"C" + address.encode())

    def follow_signals(self, prefix: bytes) -> None:
        """Subscribe the signals socket to a topic prefix."""
        self._to_io(b"S" + prefix)

    def wake(self) -> None:
        """Have the I/O thread, which may sleep up to IO_POLL_MS, ask its consumer when
        answers are due (a handler thread started a batch of them). A pipe, not the
        queue to it: it need not take the DEALER, which a follower may hold."""
        self._ring_look()

    def _ring_look(self) -> None:
        with self._lock:  # close() sets _closed under it before the pipe is closed
            if not self._closed:
                self._look.ring()

    def _to_io(self, item: bytes) -> None:
        with self._lock:
            if not self._closed:
                self._outbox.send(item)
                self._queued += 1

    def holding(
        self, message_id: str, endpoint: str, deliveries: int, ack_wait_ms: int | None
    ) -> None:
        """The router handed us a message: named in a hello until it is answered."""
        self.holdings.holding(message_id, endpoint, deliveries, ack_wait_ms, time.monotonic())

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None:
        self.holdings.answered(message_id, endpoint, deliveries)

    def still_working(self, message_id: str, endpoint: str, deliveries: int) -> None:
        self.holdings.still_working(message_id, endpoint, deliveries, time.monotonic())

    def close(self) -> None:
        """Stop the I/O thread; what still waits for a reply fails `Unavailable`."""
        with self._lock:
            self._closed = True
        self._quiet.close()
        if self._io.ident is not None:
            self._io.join(2)
        else:  # never started: the pipes are ours to close
            self._wanted.close()
            self._look.close()
        self._outbox.close(0)
        for future in list(self._futures.values()):
            if not future.done():
                future.set_exception(Unavailable("client closed"))
        self._futures.clear()

    def _resume(self) -> None:
        """Say hello again to a router that forgot us, naming our session and the
        messages we hold, so that it does not hand them to anyone else."""
        if not self._resuming.acquire(blocking=False):
            return  # under way
        try:
            hello = self.call(
                "hello",
                client=_client_name(),
                batch=True,
                session=self.session,
                holding=self.holdings.named(time.monotonic()),
            )
            self.session = hello.get("session", self.session)
        except RelayError as exc:
            if not self._closed:  # closing meanwhile ends the session anyway
                log.warning("could not resume the session with the broker: %s", exc)
        finally:
            self._resuming.release()

    # ------------------------------------------------------------------ the I/O thread

    def _open_dealer(self) -> tuple[zmq.Socket, zmq.Socket]:
        """A DEALER to the router, and the monitor that reports a refused handshake. The
        I/O thread polls the DEALER's descriptor, not the socket: a caller may be using
        the socket meanwhile (`_lead`)."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            self._curve.apply(dealer)
        refusals = dealer.get_monitor_socket(_REFUSED)
        dealer.connect(self.address)
        self._dealer_item: PollItem = poll_item(dealer)
        self._dealer_fd = dealer.getsockopt(zmq.FD)
        return dealer, refusals

    def _close_dealer(self, dealer: zmq.Socket, refusals: zmq.Socket) -> None:
        dealer.disable_monitor()
        refusals.close(0)
        dealer.close(0)

    def _io_polls(self, refusals: zmq.Socket) -> tuple[list[Any], list[Any]]:
        """What the I/O thread polls while it does not watch the DEALER (`_poll_dealer`),
        and while it does: its descriptor first. Plain lists for ``zmq_poll``: a
        `zmq.Poller` is Python on every poll, register and unregister."""
        others = [
            (self._outbox_in, POLLIN),
            (self._sub, POLLIN),
            (self._look.r, POLLIN),
            (refusals, POLLIN),
        ]
        return others, [(self._dealer_fd, POLLIN), *others]

    def _io_loop(self) -> None:
        self._dealer, refusals = self._open_dealer()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            self._curve.apply(self._sub)
        blind_polls, polls = self._io_polls(refusals)
        self._io_ready.set()
        last_ping = time.monotonic()
        wait_ms = IO_POLL_MS
        try:
            while not self._closed:
                for sock in ready_in(polls if self._poll_dealer() else blind_polls, wait_ms):
                    if sock == self._look.r:
                        self._look.clear()
                        if self._io_reads and not self._dealer_lock.locked():
                            self._io_reads = False
                            with self._holding_dealer():
                                pass  # read it (on letting go)
                    elif sock is self._outbox_in:
                        with self._holding_dealer():
                            self._forward()
                    elif sock is refusals:
                        self._refuse(recv_monitor_message(refusals))
                        # A fresh socket: the refused one would send what it queued
                        # if a later handshake passed, after we reported it failed.
                        self._take_dealer()
                        try:
                            self._close_dealer(self._dealer, refusals)
                            self._dealer, refusals = self._open_dealer()
                            blind_polls, polls = self._io_polls(refusals)
                        finally:
                            self._io_lets_go()
                        break
                    elif sock is self._sub:
                        self._receive_signals()
                    elif not self._dealer_lock.locked():  # the DEALER's descriptor
                        with self._holding_dealer():
                            pass  # read it (on letting go)
                    # else a caller or a follower holds it and reads it: _poll_dealer
                    # stops polling it, and who lets go tells us when to look again.
                # Always, not only while subscribed: a message being handled after an
                # unsubscribe can still be acknowledged only by a live session.
                now = time.monotonic()
                due = self._consumer.answers_due(now, self._send_now)
                # At the interval as it is now, which a pong may have shortened since
                # the last ping (a lower session timeout): not at the one it had then.
                next_ping = last_ping + self._ping_every
                if now >= next_ping:
                    with self._holding_dealer(), contextlib.suppress(zmq.Again):
                        # NOBLOCK: never block the I/O thread
                        self._dealer.send_multipart(
                            wire.encode_request("ping", 0, batch=True), zmq.NOBLOCK
                        )
                        self._ping_out = True
                    last_ping, next_ping = now, now + self._ping_every
                    self._expire(now)
                wake = next_ping if due is None else min(due, next_ping)
                wait_ms = max(1, math.ceil(min(IO_POLL_MS / 1000, wake - now) * 1000))
        finally:
            self._take_dealer()  # a caller leading lets go first
            self._close_dealer(self._dealer, refusals)
            self._sub.close(0)
            self._outbox_in.close(0)
            self._wanted.close()
            self._look.close()

    def _poll_dealer(self) -> bool:
        """Whether to poll the DEALER's descriptor: only when something may arrive that
        no caller reads (`_watch`), so a client that only calls, one call at a time,
        wakes no other thread on its replies. Not while a caller holds the socket
        either: it reads the socket itself, and rings `_look` when it lets go if
        something is left to watch. Blind first, the lock and what to watch read second
        (a caller: its future registered and the lock released first, blind read
        second), so that one of the two sees the other and no arrival goes unread.
        A client that sent without waiting lately (`WATCH_AFTER_SENT_S`) is watched
        anyway: its next such request then leaves without ringing this thread."""
        self._io_blind = True
        quiet = not self._watch() and time.monotonic() >= self._sent_lately_until
        blind = quiet or self._dealer_lock.locked()
        self._io_blind = blind
        return not blind

    def _take_dealer(self) -> None:
        """(I/O thread) Take the DEALER; a caller holding it is told to let go."""
        self._io_free.clear()  # a follower waits for it to be set (_acquire_as_follower)
        if not self._dealer_lock.acquire(blocking=False):
            self._wanted.ring()
            self._dealer_lock.acquire()
            self._wanted.clear()  # nobody else reads it: empty whenever it is free

    def _let_go(self) -> None:
        """Read what waits on the DEALER, then let another thread use it. Its descriptor
        signals only a change, so a socket left with something unread would never wake
        the I/O thread again for what follows."""
        try:
            self._receive()
        finally:
            self._io_lets_go()

    def _io_lets_go(self) -> None:
        self._dealer_lock.release()
        self._io_free.set()

    def _holding_dealer(self) -> HoldingDealer:
        """(I/O thread) The DEALER, for sends and reads, left empty."""
        return self._holding

    def _send_now(self, requests: list[Request]) -> None:
        """Send requests whose replies nobody waits for (answers whose delay passed)
        straight on the DEALER, without the lock: a caller blocked on the full queue to
        this thread may hold it. What callers queued before is forwarded first, so an
        ack never overtakes its handler's reply or publish."""
        with self._holding_dealer():
            while self._forward() == wire.MAX_BATCH:
                pass
            self._send_answers(requests)

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
        self._on_reply.pop(rid, None)
        future = self._futures.pop(rid, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _forward(self) -> int:
        """Move what callers queued to the sockets; returns how many items it took (at
        most wire.MAX_BATCH). Requests queued together leave together, as one batch
        frame when the broker takes batches: under load that is one ZeroMQ message, and
        one reply frame back, for many publishes."""
        rids: list[int] = []
        bodies: list[bytes] = []
        taken = 0
        # As many as callers counted in (each counts its item after sending it), at most
        # a batch: replies and pings get their turn. Counted, not asked per item
        # (`waiting` is a poll, about 2 µs) nor read until zmq.Again (an exception built
        # in Python, about 6 µs): a batch of 20 costs 8 µs so, against 59 and 14 µs.
        for _ in range(min(wire.MAX_BATCH, self._queued - self._taken)):
            try:
                item = self._outbox_in.recv(NOBLOCK)  # one frame: a kind byte, its data
            except zmq.Again:  # counted but not readable yet: the next wake-up takes it
                break
            taken += 1
            self._taken += 1  # under the DEALER's lock: a caller leads only once it is sent
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
                self._sub.connect(item[1:].decode())
            elif kind == b"S":  # subscribe the signal socket to a prefix
                self._sub.setsockopt(zmq.SUBSCRIBE, item[1:])
        self._send(rids, bodies)
        return taken

    def _send(self, rids: list[int], bodies: list[bytes]) -> None:
        """Send request bodies, as batch frames when the broker takes them. What the full
        queue to an unreachable broker refuses fails its futures; what has none (signals
        sent with wait=False: rid 0; answers) is dropped with a log line."""
        for part, body in wire.frames(bodies, self._batch_limit):
            try:
                send_parts(self._dealer, [wire.MAGIC, body], NOBLOCK)
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

    def _receive(self) -> None:
        """(The thread holding the DEALER) Read it until it is empty, dispatching what
        came. Asked first whether a message waits (sdk/sockets.py `waiting`), rather than
        read until `zmq.Again`: pyzmq builds that exception in Python, dearer than the
        question, and this runs at least once each time a thread takes the socket."""
        while waiting(self._dealer_item):
            frames = recv_parts(self._dealer)
            try:
                items = wire.decode_incoming_all(frames)
            except RelayError:
                log.warning("undecodable frames from the broker dropped")
                continue
            for incoming in items:
                self._take(incoming)

    def _take(self, incoming: wire.Reply | wire.Push) -> None:
        if isinstance(incoming, wire.Push):
            self._consumer.pushed(incoming)
            return
        if incoming.rid == 0:  # the heartbeat's (a signal sent without reply has none)
            self._ping_out = False
            if incoming.ok:
                self._heartbeat(incoming.result)
            return
        self._deadlines.pop(incoming.rid, None)
        on_reply = self._on_reply.pop(incoming.rid, None)
        future = self._futures.pop(incoming.rid, None)
        if future is None or future.cancelled():  # the caller gave up on it
            return
        if incoming.ok:
            if on_reply is not None:
                # Before the pushes that follow the reply are read (a subscription's
                # backlog follows its subscribe reply).
                on_reply(incoming.result)
            future.set_result(incoming.result)
        else:
            future.set_exception(incoming.error)

    def _heartbeat(self, pong: Any) -> None:
        """The ping's reply names the session and the subscriptions the router holds for
        us. Another session: the router forgot this client; say hello again (on another
        thread: this is the I/O thread) with what it holds, so that it stays its own."""
        held = pong.get("subs") if isinstance(pong, dict) else None
        if held is None:
            return
        self._ping_every = ping_interval(pong.get("sessionTimeoutMs"))
        token = pong.get("session")
        if token is not None and token != self.session:
            threading.Thread(target=self._resume, daemon=True).start()
        self._consumer.router_holds(set(held))

    def _receive_signals(self) -> None:
        """Hand what arrived to the signal sink, as one item (one wake-up there)."""
        arrived = []
        for _ in range(1000):  # bounded: replies get their turn
            try:
                arrived.append(self._sub.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        if arrived:
            self._signals(arrived)


class Converting(Future):
    """A future whose result is ``convert`` of the reply's, converted by the thread
    that sets it (the I/O thread, or a caller reading its own reply): one future per
    request where a second one, resolved by a callback of the first, cost another
    future, its condition and a callback per publish. What ``convert`` raises is the
    future's exception."""

    def __init__(self, convert: Callable[[Any], Any]) -> None:
        super().__init__()
        self._convert = convert

    def set_result(self, result: Any) -> None:
        try:
            converted = self._convert(result)
        except Exception as exc:
            super().set_exception(exc)
            return
        super().set_result(converted)


class HoldingDealer:
    """``with transport._holding_dealer():`` the I/O thread holds the DEALER, and leaves
    it read empty. One object per transport, made once: the I/O thread enters it at
    each wake-up, and a generator-based context manager is made anew at each use."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def __enter__(self) -> None:
        self._transport._take_dealer()

    def __exit__(self, *exc: object) -> None:
        self._transport._let_go()


class Bell:
    """A pipe one thread rings and another polls: thread-safe, as a ZeroMQ socket is not."""

    def __init__(self) -> None:
        self.r, self._w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self._w, False)

    def ring(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: rung already
            os.write(self._w, b"!")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.r, 4096)

    def close(self) -> None:
        os.close(self.r)
        os.close(self._w)


def _client_name() -> str:
    return f"python-sdk/{os.getpid()}"
