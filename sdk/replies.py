"""The replies of `Client.request`: one reply inbox per client and sender, and the
requests waiting on it.

The inbox is ``_INBOX.<sender>.<nonce>`` (sdk/subjects.py, `reply_inbox`), registered by
the client on its first request as that sender and consumed by it alone: two processes
of one sender each have their own, so neither ever takes the other's replies. A reply is
matched to its request by ``parentId`` (the id of the message it answers; `reply()`
sets it). A reply no request waits for (its request gave up, or it answers something
else) is refused with code ``late_reply``: a dead letter, never handed to a later
request.

A reply can arrive before the publish of its request has been answered (the consumer
is quick); while a request's publish is in flight, a reply nobody waits for yet is kept
for it, and refused once no publish is in flight any more.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from sdk.subscription import Nack
from sdk.types import Envelope

LATE_REPLY = "late_reply"
GAVE_UP_KEPT = 10_000  # requests that timed out, remembered to refuse their replies


class ReplyInbox:
    """The requests of one client and sender waiting for their replies."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self._lock = threading.Lock()
        self._waiting: dict[str, Future] = {}  # request id -> its reply
        self._early: dict[str, Envelope] = {}  # replies that came before their request
        self._publishing = 0  # requests whose publish has not been answered
        self._gave_up: dict[str, None] = {}  # the latest requests that timed out

    def publishing(self) -> None:
        with self._lock:
            self._publishing += 1

    def published(self, request_id: str | None) -> Future:
        """The publish of a request was answered (``request_id`` None: it failed); the
        future of its reply."""
        reply: Future = Future()
        with self._lock:
            self._publishing -= 1
            if request_id is not None:
                early = self._early.pop(request_id, None)
                if early is not None:
                    reply.set_result(early)
                else:
                    self._waiting[request_id] = reply
            if not self._publishing:
                self._early.clear()  # kept for a request that never claimed them
        return reply

    def give_up(self, request_id: str) -> None:
        """The request timed out: a reply that comes now is late."""
        with self._lock:
            self._waiting.pop(request_id, None)
            self._gave_up[request_id] = None
            if len(self._gave_up) > GAVE_UP_KEPT:
                del self._gave_up[next(iter(self._gave_up))]

    def arrived(self, envelope: Envelope) -> None:
        """A message in the inbox (the subscription's handler): hand it to its request,
        or refuse it as late (`Nack`, a dead letter with code ``late_reply``)."""
        parent = envelope.parent_id
        with self._lock:
            waiting = self._waiting.pop(parent, None) if parent else None
            late = parent in self._gave_up
            if waiting is None and parent and self._publishing and not late:
                self._early[parent] = envelope
                return
        if waiting is None:
            raise Nack(
                f"no request waits for a reply to {parent}: it gave up, or never asked",
                code=LATE_REPLY,
            )
        waiting.set_result(envelope)
