"""The Python client: `connect()` returns a `Client` speaking docs/protocol.md.

`Client` holds the methods callers call and composes the objects that each own one
concern: the connection (sdk/transport.py: the I/O thread, the sockets, the requests
in flight and their deadlines, the session and what this client holds), the
subscriptions (sdk/subscriptions.py, each one's handler thread in
sdk/subscription.py), the `on_signal` handlers (sdk/signal_handlers.py) and the reply
inboxes of `request` (sdk/replies.py). A message `fetch` hands out answers itself
(sdk/message.py). Each subscription's handler runs on its own thread, in the order
messages arrive, off the socket thread: a slow handler never blocks replies, and an
exception in a handler nacks that message (the reason is the exception) instead of
killing the client. The client pings once a second (more often when the router's session
timeout is under 4 s) so the router knows it is alive (a silent client's session ends
after 5 s by default: its subscriptions, and its right to ack).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import zmq

from sdk import subjects
from sdk.curve import CurveKeys, client_keys
from sdk.errors import (
    InvalidMessage,
    LimitExceeded,
    RelayError,
    Timeout,
    from_code,
)
from sdk.message import Message
from sdk.paths import Home
from sdk.quiet import Full
from sdk.replies import ReplyInbox
from sdk.signal_handlers import SignalHandler, SignalHandlers
from sdk.subscription import Handler
from sdk.subscriptions import Subscriptions
from sdk.transport import Transport
from sdk.types import (
    AccessRule,
    Budget,
    EndpointInfo,
    Envelope,
    PublishResult,
    Signal,
    StandardPayload,
)

DEFAULT_TIMEOUT = 10.0
QUIET_SIGNALS_LIMIT = 10_000  # signals sent with wait=False waiting to leave; more wait


class Client:
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
        self._transport = Transport(
            address,
            timeout=timeout,
            ctx=ctx,
            curve=curve,
            quiet_limit=QUIET_SIGNALS_LIMIT,
            acting_for=acting_for,
        )
        self._subscriptions = Subscriptions(self._transport)
        self._signals = SignalHandlers(self._transport)
        self._inboxes: dict[str, ReplyInbox] = {}  # sender -> this client's reply inbox
        self._inboxes_lock = threading.Lock()
        self.server = self._transport.open(self._subscriptions, self._signals.arrived)

    @property
    def address(self) -> str:
        return self._transport.address

    @property
    def timeout(self) -> float:
        """The deadline of a request that names none, in seconds."""
        return self._transport.timeout

    def send_request(self, op: str, *, timeout: float | None = None, **fields: Any) -> Future:
        """Send one request of the protocol (docs/protocol.md); the future holds its
        result or the typed error (a Timeout after ``timeout``, default the client's)."""
        return self._transport.send_request(op, timeout=timeout, **fields)

    def wait(self, future: Future, op: str) -> Any:
        """A request's result within the client's timeout, or a typed error."""
        return self._transport.wait(future, op)

    def _call(self, op: str, *, timeout: float | None = None, **fields: Any) -> Any:
        return self._transport.call(op, timeout=timeout, **fields)

    def _wait(self, future: Future, op: str, timeout: float | None = None) -> Any:
        return self._transport.wait(future, op, timeout)

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
        fields = _publish_fields(subject, payload, sender, reply_to, budget, parent_id)
        return self._transport.send_request(
            "publish", timeout=timeout, convert=PublishResult.from_wire, sent_here=True, **fields
        )

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
        fields = _publish_fields(subject, payload, sender, reply_to, budget, None)
        # A call, not a future: alone in flight, the caller reads its own reply.
        return PublishResult.from_wire(self._call("publish", timeout=timeout, **fields))

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
        return self._transport.send_request(
            "ingest",
            timeout=timeout,
            convert=PublishResult.from_wire,
            node=node,
            subjects=list(subjects),
            envelope=envelope.to_wire(),
        )

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
        return self._subscriptions.subscribe(handler, mode, fields, confirm=confirm)

    def fetch(
        self, pattern: str, *, batch: int = 10, wait: float = 0.0, ack_wait: float | None = None
    ) -> list[Message]:
        """Claim up to ``batch`` messages waiting for the endpoints ``pattern`` matches,
        oldest first per endpoint, endpoints taking turns. Returns as soon as one is
        claimed, or empty after ``wait`` seconds. Each is held by this client until it
        calls ``ack()``, ``nack(reason)`` (both confirmed), or ``ack_wait`` seconds pass
        without an answer or ``in_progress()``; if the client dies first, it is handed
        out again."""
        fields = _fetch_fields(pattern, batch, wait, ack_wait)
        # A call, not a future: alone in flight, the caller reads its own reply.
        reply = self._call("fetch", timeout=self.timeout + wait, **fields)
        return self._held_messages(reply["messages"], fields.get("ackWait"))

    def fetch_async(
        self, pattern: str, *, batch: int = 10, wait: float = 0.0, ack_wait: float | None = None
    ) -> Future:
        """`fetch` without waiting; the future resolves to the list of messages."""
        fields = _fetch_fields(pattern, batch, wait, ack_wait)
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
            self._transport.holding(envelope.id, item["endpoint"], envelope.deliveries, ack_wait_ms)
            messages.append(Message(envelope, item["endpoint"], self._transport))
        return messages

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
        self._transport.send_quietly("signal", timeout, **fields)

    def on_signal(self, pattern: str, handler: SignalHandler) -> Callable[[], None]:
        """Call handler(subject, signal) for each signal whose subject matches pattern."""
        # Runs of signals (one message for many) from a broker that offers them:
        # docs/protocol.md, "signal".
        runs = self.server.get("signalRuns") is True
        return self._signals.add(pattern, handler, address=self.server["signals"], runs=runs)

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

    def requeue_dead_letters(
        self,
        endpoint_hash: str | None = None,
        *,
        message_id: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> dict[str, Any]:
        """Operators: put dead letters back in their endpoints' new/ under their own ids,
        to be handed out again (deliveries counted afresh). ``message_id``: that
        message's (in ``endpoint_hash`` if given; refused with the error, e.g.
        ``TtlExpired``, when its one dead letter may not be requeued); else up to
        ``limit`` (at most 200) of one endpoint's, oldest first, after the id ``after``.
        Returns ``{"requeued": [{id, endpoint}], "refused": [{id, endpoint, code,
        message}], "more": bool, "after": id or None}``: with ``more``, pass ``after``
        to go on (docs/protocol.md, "requeue_dead_letters")."""
        fields: dict[str, Any] = {"limit": limit}
        for name, value in (("endpoint", endpoint_hash), ("id", message_id), ("after", after)):
            if value is not None:
                fields[name] = value
        return self._call("requeue_dead_letters", **fields)

    def purge_dead_letters(self, endpoint_hash: str | None = None) -> int:
        fields: dict[str, Any] = {} if endpoint_hash is None else {"endpoint": endpoint_hash}
        return self._call("purge_dead_letters", **fields)["purged"]

    def rebuild_index(self) -> int:
        return self._call("rebuild_index", timeout=max(self.timeout, 120))["messages"]

    def add_rule(self, rule: AccessRule) -> AccessRule:
        return AccessRule.from_wire(self._call("add_rule", rule=rule.to_wire()))

    def remove_rule(self, from_pattern: str, to_pattern: str) -> bool:
        fields: dict[str, Any] = {"from": from_pattern, "to": to_pattern}
        return bool(self._call("remove_rule", **fields)["removed"])

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
        if self._transport.closed:
            return
        alive = self._transport.alive
        self._subscriptions.close(answer=alive)  # what was handled is answered before "bye"
        for inbox in self._inboxes.values() if alive else ():
            # Its endpoint goes (its mailbox and mail stay on disk), so that inboxes of
            # clients long gone do not pile up in the endpoint list.
            with contextlib.suppress(RelayError):
                self._call("unregister", subject=inbox.subject, timeout=min(self.timeout, 5.0))
        if alive:
            with contextlib.suppress(RelayError):
                self._call("bye", timeout=min(self.timeout, 5.0))
        self._signals.close()
        self._transport.close()

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


def _publish_fields(
    subject: str,
    payload: Any,
    sender: str,
    reply_to: str | None,
    budget: Budget | None,
    parent_id: str | None,
) -> dict[str, Any]:
    """The fields of a ``publish`` request."""
    if isinstance(payload, StandardPayload):
        payload = payload.to_wire()
    fields: dict[str, Any] = {"subject": subject, "from": sender, "payload": payload}
    if reply_to is not None:
        fields["replyTo"] = reply_to
    if budget is not None:
        fields["budget"] = budget.to_wire()
    if parent_id is not None:
        fields["parentId"] = parent_id
    return fields


def _fetch_fields(pattern: str, batch: int, wait: float, ack_wait: float | None) -> dict[str, Any]:
    """The fields of a ``fetch`` request."""
    fields: dict[str, Any] = {
        "pattern": subjects.validate(pattern, wildcards=True),
        "batch": batch,
        "wait": _ms(wait, "wait", minimum=0),
    }
    if ack_wait is not None:
        fields["ackWait"] = _ms(ack_wait, "ack_wait")
    return fields
