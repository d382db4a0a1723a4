"""A subscription's side of the client: the worker that runs its handler on its own
thread, in the order messages arrive, and answers each message (ack, or nack with the
handler's error), several together (`ACK_DELAY_S`, `answers_together`). While its queue
is empty the thread reads the client's socket itself (sdk/transport.py, `follow`) and
sends its answers when they are due; the I/O thread does both only while it cannot."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from sdk.errors import RelayError
from sdk.transport import Bell, Request
from sdk.types import Envelope
from sdk.wire import Push

log = logging.getLogger("relay.client")

ACK_DELAY_S = 0.005  # a handled message's ack may wait this long to leave with others
# The I/O thread sends a batch of answers this much after its deadline: a handler
# thread reading the socket then (`_next`) sends it first, on the socket it holds.
IO_GRACE_S = 0.002
# How long a handler thread that could not read the socket itself (another thread
# held it) waits on its queue before it tries again.
FOLLOW_RETRY_S = 0.2
Handler = Callable[[Envelope], Any]
Outcome = tuple[str, str] | None  # None: handled; else (reason, code) of its nack


class Nack(Exception):
    """Raised by a handler to refuse its message on purpose: it becomes a dead letter
    with ``reason`` and ``code`` (default "nack"), and nothing is logged."""

    def __init__(self, reason: str, *, code: str = "nack") -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


# A message pushed to a subscription, before it is parsed: the push as decoded, queued
# as it is (its ``deliveries``, which hand-out it is, is what its answer names).
Delivery = Push


class Answers(Protocol):
    """What a subscription's worker answers through (the client's subscriptions,
    sdk/subscriptions.py): to send answers (and wait for one), to forget a message
    answered, and the I/O thread's watch over answers that wait for their deadline
    while the handler is busy."""

    def send_request(self, op: str, **fields: Any) -> Future: ...

    def wait(self, future: Future, op: str) -> Any: ...

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None: ...

    def answers_waiting(self, worker: SubscriptionWorker, waiting: bool) -> None: ...

    def wake_for_answers(self) -> None: ...

    def follow(self, worker: SubscriptionWorker) -> bool: ...

    def stop_following(self, worker: SubscriptionWorker) -> None: ...

    def answers_due_of(
        self, worker: SubscriptionWorker, now: float, send: Callable[[list[Request]], None]
    ) -> float | None: ...


class SubscriptionWorker:
    """Runs one subscription's handler, in order, on its own thread.

    Its answers (ack, nack) wait up to `ACK_DELAY_S` after the first of them to leave
    together, a quarter of the subscription's credit at most: at a steady rate the router
    and the writer then handle several in one pass and one commit instead of one each
    (docs/performance.md, "publish -> handler"). With credit under 4, or a broker that
    does not say the credit, each answer leaves as soon as its message is handled."""

    def __init__(
        self,
        answers: Answers,
        handler: Handler,
        mode: str,
        fields: dict[str, Any],
        *,
        confirm: bool = False,
    ) -> None:
        self.ended = False  # unsubscribe() was called: never renewed
        self.answers = answers
        self.handler = handler
        self.mode = mode
        self.fields = fields  # the subscribe request, to renew it
        self.sub = 0
        self.renewals = 0  # times subscribed again after the broker lost it
        self.answers_together = 1  # set from the subscribe reply's credit
        # Each answer waits for the router's before the next message is handled: done
        # (or a dead letter) for sure, at one round trip and one commit per message.
        self.confirm = confirm
        # SimpleQueue: its put, get and empty are C, where Queue's are Python under a
        # Condition, each call taking locks the handler path runs per message.
        self.queue: queue.SimpleQueue[Delivery | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="relay-handler", daemon=True)
        # Handled, not yet answered, and by when they leave: sent by this thread when a
        # quarter of the credit waits, else by the client's I/O thread at the deadline
        # (this thread may be busy in a slow handler), or by close().
        self._unsent: list[tuple[Delivery, Outcome]] = []
        self._deadline = 0.0
        self._unsent_lock = threading.Lock()
        self._answering = threading.Lock()  # held while answer() queues what it took
        # While this thread reads the client's socket itself (`_next`), it watches its
        # answers' deadline; when it stops with answers waiting (to run a handler, or
        # to wait on its queue), it tells the I/O thread, once a batch (`_told`).
        self._told = False  # under _unsent_lock
        # Rung by stop(): a follower looks at its queue. A pipe, open while the thread
        # runs (a subscription refused never starts one, and holds no descriptors).
        self._bell: Bell | None = None
        self._bell_lock = threading.Lock()  # stop() never rings a bell closed meanwhile
        self._stop_rung = False

    def subscribed(self, result: Mapping[str, Any]) -> None:
        """The subscribe reply came (on the I/O thread): start handling."""
        self.sub = result["sub"]
        credit = result.get("credit")
        if isinstance(credit, int):
            self.answers_together = answers_together(credit)
        if self.thread.ident is None:  # a renewed subscription keeps its thread
            with self._bell_lock:
                self._bell = Bell()
            self.thread.start()

    def stop(self, *, discard_queued: bool = False) -> None:
        if discard_queued:
            with contextlib.suppress(queue.Empty):
                while True:
                    self.queue.get_nowait()
        self.queue.put(None)
        with self._bell_lock:
            self._stop_rung = True
            if self._bell is not None:
                self._bell.ring()

    def _run(self) -> None:
        try:
            self._handle_all()
        finally:
            self.answers.stop_following(self)
            with self._bell_lock:
                bell, self._bell = self._bell, None
            if bell is not None:
                bell.close()

    def _handle_all(self) -> None:
        while (delivery := self._next()) is not None:
            error = self._handle(delivery)
            if self.mode != "consume":
                continue
            if self.confirm:
                self._answer_confirmed(delivery, error)
                continue
            with self._unsent_lock:
                first = not self._unsent
                if first:
                    self._deadline = time.monotonic() + ACK_DELAY_S
                    self._told = False
                    self.answers.answers_waiting(self, True)
                self._unsent.append((delivery, error))
                due = len(self._unsent) >= self.answers_together
            if due:
                self.answer()
            # Else, at their deadline, this thread sends them if it is reading the
            # socket then (`follow`), else the I/O thread, told by `_tell_io`: so they
            # leave on the socket, not through the queue to the I/O thread.
        self.answer()

    def _next(self) -> Delivery | None:
        """The next message to handle; None: stop. While none waits in the queue, this
        thread reads the client's socket itself when it can (the transport's `follow`:
        no hand-off from the I/O thread), else it waits on the queue for what the I/O
        thread (or another thread reading the socket) dispatches to it."""
        while True:
            # Asked first: a get that finds the queue empty raises, dearer than asking,
            # and it is empty each time this thread has handled what came.
            if not self.queue.empty():
                try:
                    delivery = self.queue.get_nowait()
                except queue.Empty:  # stop() discarded it meanwhile: its None follows
                    continue
                self._tell_io()
                return delivery
            if self._stop_rung or self.answers.follow(self):
                continue
            self._tell_io()
            try:
                return self.queue.get(timeout=FOLLOW_RETRY_S)
            except queue.Empty:
                pass

    def _tell_io(self) -> None:
        """This thread stops watching its answers' deadline (it runs a handler, or
        waits on its queue): the I/O thread is told of answers waiting, once a batch,
        so that a slow handler does not hold back the answers before it."""
        with self._unsent_lock:
            tell = bool(self._unsent) and not self._told
            self._told = self._told or tell
        if tell:
            self.answers.wake_for_answers()

    # ------------------------------------------------------------------ Follower

    @property
    def subscription(self) -> object:
        return self

    def has_next(self) -> bool:
        return not self.queue.empty()

    def stopping(self) -> bool:
        return self._stop_rung

    def bell_fd(self) -> int:
        assert self._bell is not None  # called by its own thread, which runs
        return self._bell.r

    def answers_due(self, now: float, send: Callable[[list[Request]], None]) -> float | None:
        return self.answers.answers_due_of(self, now, send)

    def take_due(
        self, now: float, *, following: bool = False
    ) -> tuple[list[tuple[Delivery, Outcome]], float | None]:
        """The answers whose deadline passed, taken to be sent; otherwise none, and the
        deadline of those waiting (None when none wait). ``following``: the call of
        this worker's thread, reading the socket (`_next`); the I/O thread's deadline
        is `IO_GRACE_S` later, so that the follower, which holds the socket, usually
        sends them and the I/O thread, woken then, finds none."""
        with self._unsent_lock:  # the same lock as the add in _run: none is missed
            deadline = self._deadline + (0.0 if following else IO_GRACE_S)
            if self._unsent and now < deadline:
                return [], deadline
            handled, self._unsent = self._unsent, []
            self.answers.answers_waiting(self, False)
        return handled, None

    def _answer_confirmed(self, delivery: Delivery, error: Outcome) -> None:
        op, fields = answer_of(delivery, error)
        self.answers.answered(delivery.id, delivery.endpoint, delivery.deliveries)
        try:
            self.answers.wait(self.answers.send_request(op, **fields), op)
        except RelayError as exc:  # taken back meanwhile (invalid_state), or closed
            log.warning("%s of %s not confirmed: %s", op, delivery.id, exc)

    def answer(self) -> None:
        """Ack or nack each message handled and not yet answered. Queued back to back,
        they usually leave in one frame (a batch, when the broker takes batches). One
        caller at a time, so that close() returns only once the handler thread's answers
        are queued, before its "bye"."""
        with self._answering:
            with self._unsent_lock:
                handled, self._unsent = self._unsent, []
            for delivery, error in handled:
                op, fields = answer_of(delivery, error)
                self.answers.answered(delivery.id, delivery.endpoint, delivery.deliveries)
                try:
                    self.answers.send_request(op, **fields)
                except RelayError:
                    log.warning("could not acknowledge %s: client closed", delivery.id)

    def _handle(self, delivery: Delivery) -> Outcome:
        deliveries = delivery.deliveries if self.mode == "consume" else 0
        try:
            envelope = Envelope.from_json(delivery.data, deliveries=deliveries)
        except RelayError as exc:
            return f"unreadable message: {exc}", "nack"
        try:
            self.handler(envelope)
        except Nack as refusal:  # on purpose: the nack says it all
            return refusal.reason[:1000], refusal.code
        except Exception as exc:
            log.info("handler nacked %s: %r", delivery.id, exc)  # its choice: not a warning
            return f"handler error: {type(exc).__name__}: {exc}"[:1000], "nack"
        return None


def answers_together(credit: int) -> int:
    """How many answers of a subscription with this credit may wait to leave together."""
    return max(1, credit // 4)


def answer_of(delivery: Delivery, error: Outcome) -> tuple[str, dict[str, Any]]:
    """The ack of a message handled, or its nack with the handler's error."""
    fields: dict[str, Any] = {
        "sub": delivery.sub,
        "id": delivery.id,
        "endpoint": delivery.endpoint,
        "deliveries": delivery.deliveries,
    }
    if error is None:
        return "ack", fields
    reason, code = error
    fields["reason"] = reason
    if code != "nack":
        fields["code"] = code
    return "nack", fields
