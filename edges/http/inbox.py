"""The HTTP inbox: messages of an endpoint claimed for one identity, held by the gateway
until the HTTP client acks or nacks them.

The router answers a claimed message only through the subscription it was pushed to
(`ack`, `nack`); `complete` and `fail` are operator operations. So an inbox is a set of
consuming subscriptions (credit 1 each) whose handler waits for the HTTP client's
answer: returning acks the message, raising `HttpNack` nacks it with the client's
reason. The router stays the judge of who may consume what (the subscribe is refused
otherwise), and Relay's at-most-once delivery holds: nothing is redelivered by itself.

`INBOX_WINDOW` subscriptions make the window: at most that many messages of one endpoint
are held for one identity at a time; more wait in ``new/`` until some are answered.
Every held message is listed by each inbox read until it is answered, so a client that
crashed after reading reads it again. A message held when the gateway stops stays
claimed (`relay pending`), as with any consumer that went away. An inbox holding
nothing and not read for 300 s (HUB_LINGER_S) is closed: its 16 subscriptions count toward the
router's 256 per connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sdk.aio import AsyncClient
from sdk.subjects import endpoint_hash
from sdk.types import Envelope

INBOX_WINDOW = 16  # messages held per identity and endpoint, at most


class HttpNack(Exception):
    """Raised by an inbox handler: the SDK nacks the message with this as the reason
    (``handler error: HttpNack: <the client's reason>``)."""


@dataclass
class Held:
    envelope: Envelope
    endpoint: str  # the endpoint's hash
    answer: asyncio.Future  # resolved with None (ack) or a reason (nack)

    def to_wire(self) -> dict[str, Any]:
        return {**self.envelope.to_wire(), "endpoint": self.endpoint}


class Inbox:
    def __init__(self, client: AsyncClient, subject: str, window: int = INBOX_WINDOW) -> None:
        self.client = client
        self.subject = subject
        self.window = window
        self.held: dict[str, Held] = {}  # by message id
        self._arrived = asyncio.Event()
        self.last_used = time.monotonic()  # idle inboxes are closed (Session.sweep)
        self._unsubscribes: list[Callable[[], Awaitable[None]]] = []

    async def open(self) -> Inbox:
        for _ in range(self.window):
            self._unsubscribes.append(
                await self.client.subscribe(self.subject, self._hold, credit=1)
            )
        return self

    async def _hold(self, envelope: Envelope) -> None:
        answer = asyncio.get_running_loop().create_future()
        self.held[envelope.id] = Held(envelope, endpoint_hash(envelope.subject), answer)
        self._arrived.set()
        try:
            reason = await answer
        finally:
            self.held.pop(envelope.id, None)
        if reason is not None:
            raise HttpNack(reason)

    async def read(self, limit: int, wait: float) -> list[Held]:
        """Up to ``limit`` held messages, oldest first; waits up to ``wait`` seconds for
        the first when none is held."""
        self.last_used = deadline = time.monotonic() + wait
        while not self.held:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                break
        # Oldest first by id (ULID order, the endpoint's FIFO): the subscriptions' handler
        # threads may hand over two pushes in either order.
        return sorted(self.held.values(), key=lambda h: h.envelope.id)[:limit]

    def idle(self, now: float, linger: float) -> bool:
        """Nothing held and not read for ``linger`` seconds: its subscriptions can go."""
        return not self.held and now - self.last_used > linger

    def find(self, message_id: str) -> Held | None:
        return self.held.get(message_id)

    @staticmethod
    def answer(held: Held, reason: str | None) -> None:
        """Ack (reason None) or nack a held message; the SDK tells the router."""
        if not held.answer.done():
            held.answer.set_result(reason)

    async def close(self) -> None:
        """End the subscriptions; held messages stay claimed (`relay pending`)."""
        unsubscribes, self._unsubscribes = self._unsubscribes, []
        for unsubscribe in unsubscribes:
            await unsubscribe()
