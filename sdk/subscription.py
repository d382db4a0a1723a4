"""A subscription's side of the client: the worker that runs its handler on its own
thread, in the order messages arrive, and answers each message (ack, or nack with the
handler's error), several together (`ACK_DELAY_S`, `answers_together`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from sdk.errors import RelayError
from sdk.types import Envelope

log = logging.getLogger("relay.client")

ACK_DELAY_S = 0.005  # a handled message's ack may wait this long to leave with others
Handler = Callable[[Envelope], Any]
Outcome = tuple[str, str] | None  # None: handled; else (reason, code) of its nack


class Nack(Exception):
    """Raised by a handler to refuse its message on purpose: it becomes a dead letter
    with ``reason`` and ``code`` (default "nack"), and nothing is logged."""

    def __init__(self, reason: str, *, code: str = "nack") -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message pushed to a subscription, before it is parsed."""

    sub: int
    id: str
    endpoint: str
    data: bytes
    deliveries: int = 1  # which hand-out: its answer names it


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
        self.queue: queue.Queue[Delivery | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="relay-handler", daemon=True)
        # Handled, not yet answered, and by when they leave: sent by this thread when a
        # quarter of the credit waits, else by the client's I/O thread at the deadline
        # (this thread may be busy in a slow handler), or by close().
        self._unsent: list[tuple[Delivery, Outcome]] = []
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
            if self.confirm:
                self._answer_confirmed(delivery, error)
                continue
            with self._unsent_lock:
                first = not self._unsent
                if first:
                    self._deadline = time.monotonic() + ACK_DELAY_S
                    self.answers.answers_waiting(self, True)
                self._unsent.append((delivery, error))
                due = len(self._unsent) >= self.answers_together
            if due or time.monotonic() >= self._deadline:  # also while messages queue up
                self.answer()
            elif first:
                self.answers.wake_for_answers()
        self.answer()

    def take_due(self, now: float) -> tuple[list[tuple[Delivery, Outcome]], float | None]:
        """(I/O thread) The answers whose deadline passed, taken to be sent; otherwise
        none, and the deadline of those waiting (None when none wait)."""
        with self._unsent_lock:  # the same lock as the add in _run: none is missed
            if self._unsent and now < self._deadline:
                return [], self._deadline
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
        try:
            envelope = Envelope.from_json(delivery.data)
        except RelayError as exc:
            return f"unreadable message: {exc}", "nack"
        if self.mode == "consume":
            envelope = dataclasses.replace(envelope, deliveries=delivery.deliveries)
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
