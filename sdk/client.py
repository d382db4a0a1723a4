"""The Python client: `connect()` returns a `Client` speaking docs/protocol.md.

Threads: one I/O thread owns the ZeroMQ sockets (a DEALER to the router, a SUB for
signals); calling threads hand it requests through an inproc socket and wait on a
future with a deadline (sdk/plumbing.py). Each subscription's handler runs on its own
thread, in the order messages arrive, off the socket thread: a slow handler never
blocks replies, and an exception in a handler nacks that message (the reason is the
exception) instead of killing the client; answers wait up to `ACK_DELAY_S` to leave
several in one frame (sdk/subscription.py). The client pings once a second so the
router knows it is alive (a silent client's session ends after 5 s: its subscriptions,
and its right to ack).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NamedTuple

import zmq

from sdk import subjects, wire
from sdk.curve import CurveKeys, client_keys
from sdk.errors import (
    InvalidMessage,
    LimitExceeded,
    NotAuthorized,
    RelayError,
    Timeout,
    Unavailable,
    from_code,
)
from sdk.message import Message
from sdk.paths import Home
from sdk.plumbing import ClientPlumbing
from sdk.quiet import Full, QuietSignals
from sdk.replies import ReplyInbox
from sdk.subscription import Handler, SubscriptionWorker
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
QUIET_SIGNALS_LIMIT = 10_000  # signals sent with wait=False waiting to leave; more wait
_client_numbers = itertools.count(1)  # names each client's inproc socket uniquely
SignalHandler = Callable[[str, Signal], Any]


class Client(ClientPlumbing):
    """A connection to a Relay broker. Thread-safe; use as a context manager."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ctx: zmq.Context | None = None,
        curve: CurveKeys | None = None,
        acting_for: str | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._curve = curve
        # Every request names the identity it acts for (a delegate's connection:
        # docs/security.md, "Delegation"); empty: the connection's own identity.
        self._acting: dict[str, str] = {"actingFor": acting_for} if acting_for else {}
        self._ctx = ctx or zmq.Context.instance()
        self._rids = itertools.count(1)
        self._futures: dict[int, Future] = {}
        self._deadlines: dict[int, float] = {}  # rid -> time.monotonic() deadline
        self._lock = threading.Lock()
        self._closed = False
        self._subs: dict[int, SubscriptionWorker] = {}
        self._renew_lock = threading.Lock()  # finding which lost workers to renew
        # Workers whose answers wait for their deadline (the I/O thread looks at these).
        self._answers_waiting: set[SubscriptionWorker] = set()
        self._ending = False  # close() has begun: answers leave through it, before "bye"
        self._answers_lock = threading.Lock()  # never held while waiting on anything
        self._pending_subs: dict[int, SubscriptionWorker] = {}  # by subscribe request id
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
        # What the router handed us and we have not answered: (id, endpoint) -> its
        # hand-out. Named in a new hello when the router forgot us (a restart), so that
        # it stays ours; the session token names the session to resume.
        self._held: dict[tuple[str, str], HeldHere] = {}
        self._held_lock = threading.Lock()
        self._session: str | None = None
        self._resuming = threading.Lock()
        self._inboxes: dict[str, ReplyInbox] = {}  # sender -> this client's reply inbox
        self._inboxes_lock = threading.Lock()
        self._io = threading.Thread(target=self._io_loop, name="relay-client-io", daemon=True)
        self._io_ready = threading.Event()
        self._io.start()
        self._io_ready.wait(5)
        try:
            self.server = self._call("hello", client=f"python-sdk/{os.getpid()}", batch=True)
            self._session = self.server.get("session")
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

    # ------------------------------------------------------------------ endpoints

    def register_endpoint(self, subject: str, *, shared: bool | None = None) -> EndpointInfo:
        """Register a mailbox for ``subject`` (idempotent). ``shared=True`` advertises it
        to other nodes through the federation bridge, ``False`` stops that; the default
        leaves a registered endpoint as it is and makes a new one node-local."""
        fields: dict[str, Any] = {"subject": subjects.validate(subject)}
        if shared is not None:
            fields["shared"] = shared
        return EndpointInfo.from_wire(self._call("register", **fields))

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
        timeout: float | None = None,
    ) -> Future:
        """Publish without waiting; the future resolves to a PublishResult (or a
        Timeout after ``timeout`` seconds, default the client's)."""
        if isinstance(payload, StandardPayload):
            payload = payload.to_wire()
        fields: dict[str, Any] = {"subject": subject, "from": sender, "payload": payload}
        if reply_to is not None:
            fields["replyTo"] = reply_to
        if budget is not None:
            fields["budget"] = budget.to_wire()
        if parent_id is not None:
            fields["parentId"] = parent_id
        raw = self.send_request("publish", timeout=timeout, **fields)
        return _publish_result(raw)

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
            subject, payload, sender=sender, reply_to=reply_to, budget=budget, timeout=timeout
        )
        return self._wait(future, "publish", timeout)

    def request(
        self,
        subject: str,
        payload: Any,
        *,
        sender: str,
        timeout: float = 30.0,
        budget: Budget | None = None,
    ) -> Envelope:
        """Publish a request and return its reply: the message whose ``parent_id`` is
        the request's id (the replier calls `reply`). Replies come to this client's
        reply inbox for ``sender`` (sdk/replies.py), made on first use. A request that
        reaches no endpoint is refused at once with its rejection's code (``no_match``,
        ``access_denied``, ...); no reply within ``timeout`` seconds: `Timeout`, and a
        reply that comes later is a dead letter (``late_reply``). A request that
        reaches several endpoints returns the first reply."""
        deadline = time.monotonic() + timeout
        inbox = self._reply_inbox(sender)
        inbox.publishing()
        try:
            result = self.publish(
                subject,
                payload,
                sender=sender,
                reply_to=inbox.subject,
                budget=budget,
                timeout=timeout,
            )
        except BaseException:
            inbox.published(None)
            raise
        reply = inbox.published(result.message_id if result.delivered_to else None)
        if not result.delivered_to:
            raise _refusal(subject, result)
        try:
            return reply.result(max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            inbox.give_up(result.message_id)
            raise Timeout(
                f"no reply to request {result.message_id} on {subject} within {timeout:g} s"
            ) from None

    def _reply_inbox(self, sender: str) -> ReplyInbox:
        """This client's reply inbox for ``sender``: registered and consumed on first use."""
        with self._inboxes_lock:
            inbox = self._inboxes.get(sender)
            if inbox is None:
                inbox = ReplyInbox(subjects.reply_inbox(sender, os.urandom(6).hex()))
                self.register_endpoint(inbox.subject)
                self.subscribe(inbox.subject, inbox.arrived)
                self._inboxes[sender] = inbox
            return inbox

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

    def ingest_async(
        self,
        envelope: Envelope,
        subjects: list[str],
        *,
        node: str,
        timeout: float | None = None,
    ) -> Future:
        """`ingest` without waiting; the future resolves to a PublishResult."""
        raw = self.send_request(
            "ingest",
            timeout=timeout,
            node=node,
            subjects=list(subjects),
            envelope=envelope.to_wire(),
        )
        return _publish_result(raw)

    def ingest(
        self,
        envelope: Envelope,
        subjects: list[str],
        *,
        node: str,
        timeout: float | None = None,
    ) -> PublishResult:
        """Hand in a message relayed from another node (a federation bridge's call,
        docs/federation.md): stored under ``envelope.id`` on the local endpoints named in
        ``subjects``, at most once each however often it is handed in."""
        future = self.ingest_async(envelope, subjects, node=node, timeout=timeout)
        return self._wait(future, "ingest", timeout)

    # ------------------------------------------------------------------ consuming

    def subscribe(
        self,
        pattern: str,
        handler: Handler,
        *,
        credit: int | None = None,
        ack_wait: float | None = None,
        confirm: bool = False,
    ) -> Callable[[], None]:
        """Consume messages of every endpoint matching pattern; returns unsubscribe().

        ``ack_wait`` (seconds): a message the handler has not finished by then is taken
        back and handed out again (default: never, while this client lives).
        ``confirm``: each message's ack (or nack) is confirmed by the router before the
        handler gets the next one, so a message handled is done for sure; it costs a
        round trip and a writer commit per message, where the default lets answers
        leave together within 5 ms (docs/performance.md, "publish -> handler")."""
        return self._subscribe(pattern, handler, "consume", credit, ack_wait, confirm)

    def observe(self, pattern: str, handler: Handler) -> Callable[[], None]:
        """Watch every stored message matching pattern: no claim, no ack."""
        return self._subscribe(pattern, handler, "observe", None, None, False)

    def _subscribe(
        self,
        pattern: str,
        handler: Handler,
        mode: str,
        credit: int | None,
        ack_wait: float | None,
        confirm: bool,
    ) -> Callable[[], None]:
        subjects.validate(pattern, wildcards=True)
        fields: dict[str, Any] = {"pattern": pattern, "mode": mode}
        if credit is not None:
            fields["credit"] = credit
        if ack_wait is not None:
            fields["ackWait"] = _ms(ack_wait, "ack_wait")
        worker = SubscriptionWorker(self, handler, mode, fields, confirm=confirm)
        future = self.send_request("subscribe", before_send=worker, **fields)
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

    def fetch(
        self, pattern: str, *, batch: int = 10, wait: float = 0.0, ack_wait: float | None = None
    ) -> list[Message]:
        """Claim up to ``batch`` messages waiting for the endpoints ``pattern`` matches,
        oldest first per endpoint, endpoints taking turns. Returns as soon as one is
        claimed, or empty after ``wait`` seconds. Each is held by this client until it
        calls ``ack()``, ``nack(reason)`` (both confirmed), or ``ack_wait`` seconds pass
        without an answer or ``in_progress()``; if the client dies first, it is handed
        out again."""
        return self._wait(
            self.fetch_async(pattern, batch=batch, wait=wait, ack_wait=ack_wait),
            "fetch",
            self.timeout + wait,
        )

    def fetch_async(
        self, pattern: str, *, batch: int = 10, wait: float = 0.0, ack_wait: float | None = None
    ) -> Future:
        """`fetch` without waiting; the future resolves to the list of messages."""
        fields: dict[str, Any] = {
            "pattern": subjects.validate(pattern, wildcards=True),
            "batch": batch,
            "wait": _ms(wait, "wait", minimum=0),
        }
        if ack_wait is not None:
            fields["ackWait"] = _ms(ack_wait, "ack_wait")
        raw = self.send_request("fetch", timeout=self.timeout + wait, **fields)
        fetched: Future = Future()

        def convert(done: Future) -> None:
            try:
                items = done.result()["messages"]
                fetched.set_result(self._held_messages(items, fields.get("ackWait")))
            except BaseException as exc:
                fetched.set_exception(exc)

        raw.add_done_callback(convert)
        return fetched

    def _held_messages(self, items: list[dict[str, Any]], ack_wait_ms: int | None) -> list[Message]:
        messages = []
        for item in items:
            envelope = Envelope.from_json(item["data"])
            envelope = dataclasses.replace(envelope, deliveries=item["deliveries"])
            self.holding(envelope.id, item["endpoint"], envelope.deliveries, ack_wait_ms)
            messages.append(Message(envelope, item["endpoint"], self))
        return messages

    def holding(
        self, message_id: str, endpoint: str, deliveries: int, ack_wait_ms: int | None
    ) -> None:
        """The router handed us a message: ours until answered (or its deadline)."""
        with self._held_lock:
            self._held[(message_id, endpoint)] = HeldHere(deliveries, ack_wait_ms, time.monotonic())

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None:
        """Forget a hand-out answered (an earlier one's answer keeps a later one)."""
        with self._held_lock:
            held = self._held.get((message_id, endpoint))
            if held is not None and held.deliveries == deliveries:
                del self._held[(message_id, endpoint)]

    def still_working(self, message_id: str, endpoint: str, deliveries: int) -> None:
        """in_progress() was confirmed: the hand-out's deadline starts again here too."""
        with self._held_lock:
            held = self._held.get((message_id, endpoint))
            if held is not None and held.deliveries == deliveries:
                self._held[(message_id, endpoint)] = held._replace(since=time.monotonic())

    def wait(self, future: Future, op: str) -> Any:
        """A request's result within the client's timeout, or a typed error."""
        return self._wait(future, op)

    def _resume(self) -> None:
        """Say hello again to a router that forgot us, naming our session and the
        messages we hold, so that it does not hand them to anyone else."""
        if not self._resuming.acquire(blocking=False):
            return  # under way
        try:
            now = time.monotonic()
            with self._held_lock:
                # Past its deadline the router may have taken it back: not ours to name.
                holding = [
                    [i, e, h.deliveries, h.ack_wait_ms]
                    for (i, e), h in self._held.items()
                    if h.ack_wait_ms is None or now < h.since + h.ack_wait_ms / 1000
                ]
            hello = self._call(
                "hello",
                client=f"python-sdk/{os.getpid()}",
                batch=True,
                session=self._session,
                holding=holding,
            )
            self._session = hello.get("session", self._session)
        except RelayError as exc:
            log.warning("could not resume the session with the broker: %s", exc)
        finally:
            self._resuming.release()

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
        self,
        subject: str,
        signal: Signal,
        *,
        sender: str | None = None,
        wait: bool = True,
        block: bool = True,
    ) -> None:
        """Publish an ephemeral signal. With ``wait=False`` it is fire and forget: no
        round trip (many leave in one frame), and a refusal (access rule, sender not
        allowed, bad subject) is not reported; when `QUIET_SIGNALS_LIMIT` such signals
        wait to leave, the call waits for room (a `Timeout` after the client's timeout),
        or, with ``block=False`` (for an event loop, which must not wait), is refused
        at once (`LimitExceeded`): signals are at most once anyway."""
        fields = signal_fields(subject, signal, sender)
        if wait:
            self._call("signal", **fields)
            return
        try:
            self._signal_quietly(fields, self.timeout if block else 0)
        except Full as exc:
            if not block:
                raise LimitExceeded(f"signal not sent: {exc}") from None
            raise Timeout(f"signal not sent within {self.timeout:g} s: {exc}") from None

    def _signal_quietly(self, fields: dict[str, Any], timeout: float | None) -> None:
        """Queue a signal sent without a reply; `Full` when no room came in ``timeout``."""
        body = wire.encode_request("signal", 0, reply=False, **self._acting, **fields)[1]
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

    # ------------------------------------------------------------------ administration

    def dead_letters(
        self,
        endpoint_hash: str | None = None,
        *,
        limit: int = 100,
        message_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Dead letters, newest ids last: of one endpoint (hash or subject), or all;
        ``message_id``: only that message's (found by key, however many there are)."""
        fields: dict[str, Any] = {"limit": limit}
        if endpoint_hash is not None:
            fields["endpoint"] = endpoint_hash
        if message_id is not None:
            fields["id"] = message_id
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
        for inbox in self._inboxes.values() if self._io.is_alive() else ():
            # Its endpoint goes (its mailbox and mail stay on disk), so that inboxes of
            # clients long gone do not pile up in the endpoint list.
            with contextlib.suppress(RelayError):
                self._call("unregister", subject=inbox.subject, timeout=min(self.timeout, 5.0))
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


def connect(
    home: str | os.PathLike[str] | None = None,
    *,
    address: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    key_file: str | os.PathLike[str] | None = None,
    server_key: str | os.PathLike[str] | None = None,
    acting_for: str | None = None,
) -> Client:
    """Connect to the broker of a data directory (default $RELAY_HOME or ~/.dork/relay).

    On tcp:// the broker wants CURVE: ``key_file`` is this client's ``.key_secret``
    certificate (default ``$RELAY_KEY_FILE``) and ``server_key`` the broker's public key,
    as Z85 text or a certificate path (default ``$RELAY_SERVER_KEY``, else
    ``<home>/keys/server.key`` when this machine has it).

    ``acting_for``: the user id (``key:<z85>``) of the identity every request of this
    client acts for; the connection's own identity must have the delegation right
    (docs/security.md, "Delegation").
    """
    where = Home(home)
    address = address or where.router_address
    curve = None
    key_file = key_file or os.environ.get("RELAY_KEY_FILE")
    if key_file and address.startswith("tcp://"):  # ipc:// checks the uid instead
        server_key = server_key or os.environ.get("RELAY_SERVER_KEY")
        curve = client_keys(key_file, server_key or where.server_public_key_file)
    return Client(address, timeout=timeout, curve=curve, acting_for=acting_for)


class HeldHere(NamedTuple):
    """A hand-out this client holds: which, its ack deadline (ms), since when (monotonic)."""

    deliveries: int
    ack_wait_ms: int | None
    since: float


def _refusal(subject: str, result: PublishResult) -> RelayError:
    """The typed error of a request that reached no endpoint."""
    if not result.rejected:
        return from_code("no_match", f"no endpoint for {subject}")
    key, reason = result.rejected[0]
    detail = result.details.get(key) or f"{reason} for {subject}"
    return from_code(reason, f"request to {subject} refused: {detail}")


def _ms(seconds: float, name: str, *, minimum: int = 1) -> int:
    """Seconds as the protocol's whole milliseconds."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        raise InvalidMessage(f"{name} must be a number of seconds >= 0, got {seconds!r}")
    return max(minimum, round(seconds * 1000))


def _publish_result(raw: Future) -> Future:
    """A future of the reply to a publish (or ingest), resolving to a PublishResult."""
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
