"""The HTTP inbox: messages of an endpoint claimed for one identity when it reads, held
by the gateway until the HTTP client acks or nacks them.

The router answers a claimed message only through the subscription it was pushed to
(`ack`, `nack`); `complete` and `fail` are operator operations. So a read opens
consuming subscriptions (credit 1 each) whose handler holds the message and waits for
the HTTP client's answer: returning acks it, raising `HttpNack` nacks it with the
client's reason. The router stays the judge of who may consume what (the subscribe is
refused otherwise), and Relay's at-most-once delivery holds: nothing is redelivered by
itself.

Claims are made only while a read runs, for no more than it asks (``limit``), so an
HTTP client that stops reading leaves the endpoint's later messages to other consumers.
A read opens as many subscriptions as messages wait in ``new/`` (at most the room left
under ``limit``; one when none waits and it may ``wait``), waits until they are pushed
(up to `CLAIM_WAIT_S`, as another consumer may take them first, or ``wait``), and ends
them. A message pushed after that is held too, for the next read.

At most `INBOX_WINDOW` messages of one endpoint are held for one identity at a time.
Every held message is listed by each read until it is answered, so a client that
crashed after reading reads it again. A message held when the gateway stops stays
claimed (`relay pending`), as with any consumer that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sdk.aio import AsyncClient
from sdk.subjects import endpoint_hash
from sdk.types import Envelope

INBOX_WINDOW = 16  # messages held per identity and endpoint, at most
CLAIM_WAIT_S = 1.0  # how long a read waits for the pushes of messages it saw waiting


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
        self.last_used = time.monotonic()  # idle inboxes are forgotten (IdentityConnection.sweep)

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

    async def read(self, limit: int, wait: float, waiting: int) -> list[Held]:
        """Up to ``limit`` messages held for the reader, oldest first, after claiming
        what ``waiting`` (the endpoint's depth) says there is, within ``limit``; with
        none held or waiting, waits up to ``wait`` seconds for a first one."""
        limit = min(limit, self.window)
        room = limit - len(self.held)
        claims = min(room, waiting if waiting else (1 if wait > 0 else 0))
        if claims > 0:
            patience = max(wait, CLAIM_WAIT_S) if waiting else wait
            await self._claim(claims, len(self.held) + claims, patience)
        self.last_used = time.monotonic()
        # Oldest first by id (ULID order, the endpoint's FIFO): the subscriptions' handler
        # threads may hand over two pushes in either order.
        return sorted(self.held.values(), key=lambda h: h.envelope.id)[:limit]

    async def _claim(self, subscriptions: int, enough: int, patience: float) -> None:
        """Subscribe ``subscriptions`` times, wait until ``enough`` are held or
        ``patience`` runs out, and end the subscriptions."""
        unsubscribes: list[Callable[[], Awaitable[None]]] = []
        try:
            for _ in range(subscriptions):
                unsubscribes.append(await self.client.subscribe(self.subject, self._hold, credit=1))
            deadline = time.monotonic() + patience
            while len(self.held) < enough and (left := deadline - time.monotonic()) > 0:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
        finally:
            await asyncio.gather(*(unsubscribe() for unsubscribe in unsubscribes))

    def idle(self, now: float, linger: float) -> bool:
        """Nothing held and not read for ``linger`` seconds: it can be forgotten."""
        return not self.held and now - self.last_used > linger

    def find(self, message_id: str) -> Held | None:
        return self.held.get(message_id)

    @staticmethod
    def answer(held: Held, reason: str | None) -> None:
        """Ack (reason None) or nack a held message; the SDK tells the router."""
        if not held.answer.done():
            held.answer.set_result(reason)
