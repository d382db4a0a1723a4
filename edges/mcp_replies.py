"""How `relay_send_and_wait` gets its reply.

A request goes out with ``replyTo`` the agent's reply endpoint (``<sender>.replies``),
which one subscription of this server consumes while it runs, and a budget whose TTL
is the end of the wait. A reply made the Relay way (`Client.reply`, `relay_reply`, any
client that answers with the parent's budget) carries that budget on, TTL unchanged,
and the envelope has no other link to its request; so the TTL is the ticket: each
waiting request gets a TTL no other live request of this server has, and the reply
endpoint's handler hands each arrival to the request whose TTL it carries.

What matches no waiting request (a reply made with a fresh budget, or one to a request
whose wait ended just before) is nacked with the reason: a dead letter of the reply
endpoint, where relay_dead_letters shows it. A reply after the TTL is refused by the
router (``ttl_expired``), so the replier learns that nobody waits any more.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, InvalidStateError

from sdk.client import Client
from sdk.types import Envelope


class UnexpectedReply(Exception):
    """Raised in the reply endpoint's handler: the SDK nacks the message with it."""


class Replies:
    """The reply endpoint of one server, and the requests waiting on it by TTL."""

    def __init__(self, client: Client, subject: str) -> None:
        self.subject = subject
        self._client = client
        self._waiting: dict[int, Future] = {}  # request TTL (unix ms) -> its reply
        self._issued: set[int] = set()  # TTLs given out and not yet past: never reused
        self._lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Register the reply endpoint and consume it (once; later calls return)."""
        with self._lock:
            if self._started:
                return
            self._client.register_endpoint(self.subject)
            self._client.subscribe(self.subject, self._route)
            self._started = True

    def ticket(self, ttl: int, now_ms: int) -> tuple[int, Future]:
        """A TTL at most ``ttl`` that no live request of this server carries, and the
        future its reply will resolve. Lowering a TTL is always allowed: budgets only
        shrink. A TTL already past can no longer be delivered, so it may be reused."""
        with self._lock:
            self._issued = {t for t in self._issued if t >= now_ms}
            ttl = free_ttl(ttl, self._issued)
            reply: Future = Future()
            self._issued.add(ttl)
            self._waiting[ttl] = reply
        return ttl, reply

    def forget(self, ttl: int) -> None:
        """The wait for this TTL is over: a reply carrying it is no longer expected."""
        with self._lock:
            self._waiting.pop(ttl, None)

    def _route(self, envelope: Envelope) -> None:
        with self._lock:
            reply = self._waiting.pop(envelope.budget.ttl, None)
        if reply is None or not _resolved(reply, envelope):
            raise UnexpectedReply(
                f"no relay_send_and_wait of this server waits for a reply with TTL "
                f"{envelope.budget.ttl} (its wait ended, or the reply did not carry the "
                "request's budget)"
            )


def _resolved(reply: Future, envelope: Envelope) -> bool:
    """Hand the reply to its waiter; False when the wait was cancelled just now."""
    try:
        reply.set_result(envelope)
    except InvalidStateError:
        return False
    return True


def free_ttl(ttl: int, taken: set[int]) -> int:
    """The latest TTL at most ``ttl`` that is not taken."""
    while ttl in taken:
        ttl -= 1
    return ttl


def now_ms() -> int:
    return time.time_ns() // 1_000_000
