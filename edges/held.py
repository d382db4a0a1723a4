"""Messages an edge fetched for a client it cannot see, held by id until the client
answers them or their ack deadline passes: what the MCP server's `relay_inbox` and the
HTTP gateway's inbox both keep (docs/mcp.md, docs/http.md).

The router holds the claim; the edge holds the SDK's message (`sdk.message.Message`, or
`sdk.aio.AsyncMessage` for the gateway), which answers itself with a confirmed ack or
nack. This table only remembers which messages a later call may name, by message id
(and endpoint: one message may be held for several endpoints after a fan-out), so
that an agent or an HTTP client answers in a later call. No I/O here; time is an
argument (monotonic seconds).

An agent or an HTTP client can die without the edge seeing it, and the edge lives on,
so it fetches with an ack deadline (`ack_wait`): the router takes back a message not
answered in time and hands it out again. This table forgets it at the same deadline
(counted from a moment after the router's, when the fetch's answer arrived), so it
never lists a message the router has taken back; an answer that races the deadline is
refused by the router (`invalid_state`) and the edge forgets it then.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from sdk.types import Envelope

DEFAULT_ACK_WAIT_S = 300.0  # `relay mcp --ack-wait`, `relay http --ack-wait`


class HeldMessage(Protocol):
    """What the table needs of a message: the SDK's `Message` and `AsyncMessage` fit."""

    @property
    def id(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def envelope(self) -> Envelope: ...

    @property
    def deliveries(self) -> int: ...


M = TypeVar("M", bound=HeldMessage)


@dataclass(slots=True)
class _Entry(Generic[M]):
    message: M
    deadline: float  # monotonic seconds: the router has taken it back by then


class HeldMessages(Generic[M]):
    """The messages held for one client of an edge, by (id, endpoint hash).

    Thread-safe: the MCP server answers tools on worker threads."""

    def __init__(self, ack_wait: float = DEFAULT_ACK_WAIT_S) -> None:
        self.ack_wait = ack_wait
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], _Entry[M]] = {}

    def hold(self, messages: Iterable[M], now: float) -> None:
        """Messages a fetch just handed out: held until answered or ``ack_wait`` passes."""
        with self._lock:
            for message in messages:
                self._held[(message.id, message.endpoint)] = _Entry(message, now + self.ack_wait)

    def all(self, now: float) -> list[M]:
        """Every message still held, oldest first (ULID order)."""
        with self._lock:
            self._expire(now)
            found = [entry.message for entry in self._held.values()]
        return sorted(found, key=lambda m: (m.id, m.endpoint))

    def of(self, subject: str, now: float) -> list[M]:
        """The messages held for the endpoint ``subject``, oldest first."""
        return [m for m in self.all(now) if m.envelope.subject == subject]

    def find(self, message_id: str, endpoint: str | None, now: float) -> list[M]:
        """The held copies of a message; ``endpoint`` (a hash or a subject) narrows
        them to one endpoint's."""
        return [
            m
            for m in self.all(now)
            if m.id == message_id and endpoint in (None, m.endpoint, m.envelope.subject)
        ]

    def forget(self, message: M) -> None:
        """It was answered, or the router said it is no longer held."""
        with self._lock:
            entry = self._held.get((message.id, message.endpoint))
            if entry is not None and entry.message is message:
                del self._held[(message.id, message.endpoint)]

    def _expire(self, now: float) -> None:
        for key in [k for k, entry in self._held.items() if entry.deadline <= now]:
            del self._held[key]
