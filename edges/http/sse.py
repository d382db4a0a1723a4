"""Server-sent events: the wire format (pure) and the observers' replay buffer.

An event is ``event: NAME``, ``id: ID`` (messages of observe streams only) and one
``data:`` line of JSON, then a blank line. A comment line (``: keepalive``) every
`KEEPALIVE_S` keeps proxies and browsers from timing the stream out.

Resumption. Observe streams of one identity and pattern share an `ObserverHub`: one
observe subscription to the router and the last `HUB_BUFFER` messages it pushed. A
client reconnecting with ``Last-Event-ID`` (browsers send it by themselves) first gets
what the hub saw after that event, then the live ones. The hub outlives its last stream
by `HUB_LINGER_S`, so a reconnect within that time misses nothing the hub kept; an id
the hub does not hold (too old, or the gateway restarted) yields a ``relay_gap`` event,
then the live stream. Event ids are ``<message id>.<endpoint hash>``: a fan-out stores
one copy per endpoint, each its own event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sdk.aio import AsyncClient
from sdk.subjects import endpoint_hash
from sdk.types import Envelope, Signal, SignalType

KEEPALIVE_S = 15.0
RETRY_MS = 2000  # how long a browser waits before reconnecting
HUB_BUFFER = 1000  # messages an observer hub keeps for resumption
HUB_LINGER_S = 300.0  # how long a hub without streams stays subscribed
LISTENER_LAG = 10_000  # events queued for one slow stream before it is cut (it resumes)

MESSAGE, SIGNAL, BACKPRESSURE, GAP = (
    "relay_message",
    "relay_signal",
    "relay_backpressure",
    "relay_gap",
)


def sse_event(event: str, data: Any, event_id: str | None = None) -> bytes:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False))
    return ("\n".join(lines) + "\n\n").encode()


def sse_comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def sse_retry(ms: int = RETRY_MS) -> bytes:
    return f"retry: {ms}\n\n".encode()


def message_event(envelope: Envelope) -> tuple[str, bytes]:
    """(event id, encoded event) for a message copy."""
    endpoint = endpoint_hash(envelope.subject)
    event_id = f"{envelope.id}.{endpoint}"
    return event_id, sse_event(MESSAGE, {**envelope.to_wire(), "endpoint": endpoint}, event_id)


def signal_event(subject: str, signal: Signal) -> bytes:
    name = BACKPRESSURE if signal.type == SignalType.BACKPRESSURE else SIGNAL
    return sse_event(name, {"subject": subject, **signal.to_wire()})


@dataclass
class Outgoing:
    """One chunk for a stream; ``sent`` (consume streams) resolves once it is written."""

    chunk: bytes
    sent: asyncio.Future | None = None


CUT = Outgoing(b"")  # a stream that fell too far behind ends; its client resumes


class ObserverHub:
    """One observe subscription shared by the streams of one identity and pattern."""

    def __init__(self, client: AsyncClient, pattern: str, buffer: int = HUB_BUFFER) -> None:
        self.client = client
        self.pattern = pattern
        self.events: deque[tuple[str, bytes]] = deque(maxlen=buffer)
        self.listeners: set[asyncio.Queue[Outgoing]] = set()
        self.idle_since: float | None = time.monotonic()
        self._unsubscribe: Callable[[], Awaitable[None]] | None = None

    async def open(self) -> ObserverHub:
        self._unsubscribe = await self.client.observe(self.pattern, self._on_message)
        return self

    async def _on_message(self, envelope: Envelope) -> None:
        event_id, chunk = message_event(envelope)
        self.events.append((event_id, chunk))
        for queue in list(self.listeners):
            if queue.qsize() >= LISTENER_LAG:
                self.detach(queue)
                queue.put_nowait(CUT)
            else:
                queue.put_nowait(Outgoing(chunk))

    def attach(self, last_event_id: str | None) -> tuple[list[bytes], asyncio.Queue[Outgoing]]:
        """What to send first (the replay after ``last_event_id``, or a gap event), and
        the queue of what comes next. No await between the two: nothing falls between."""
        backlog: list[bytes] = []
        if last_event_id:
            ids = [event_id for event_id, _ in self.events]
            if last_event_id in ids:
                backlog = [chunk for _, chunk in list(self.events)[ids.index(last_event_id) + 1 :]]
            else:
                backlog = [sse_event(GAP, {"lastEventId": last_event_id, "kept": len(ids)})]
        queue: asyncio.Queue[Outgoing] = asyncio.Queue()
        self.listeners.add(queue)
        self.idle_since = None
        return backlog, queue

    def detach(self, queue: asyncio.Queue[Outgoing]) -> None:
        self.listeners.discard(queue)
        if not self.listeners:
            self.idle_since = time.monotonic()

    def idle_for(self, now: float) -> float:
        return 0.0 if self.idle_since is None else now - self.idle_since

    async def close(self) -> None:
        if self._unsubscribe is not None:
            unsubscribe, self._unsubscribe = self._unsubscribe, None
            await unsubscribe()
