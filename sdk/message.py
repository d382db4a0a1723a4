"""A message handed to this client and held until it answers: what `fetch` returns.

It knows how to answer itself (`ack`, `nack`, `in_progress`), each confirmed by the
router: the call returns once the answer is applied (for ack and nack, durable in the
Maildir), and raises `InvalidState` when this hand-out is no longer this client's (it
was answered already, or taken back: its ack deadline passed, or the session ended,
and it was handed out again). It depends on a small interface (`Answering`), not on
the client that made it.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from sdk.types import Envelope


class Answering(Protocol):
    """What a held message needs from its client: send an answer, and forget it."""

    def send_request(self, op: str, **fields: Any) -> Future: ...

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None: ...

    def still_working(self, message_id: str, endpoint: str, deliveries: int) -> None: ...

    def wait(self, future: Future, op: str) -> Any: ...


@dataclass(eq=False)
class Message:
    """A held message: its envelope (``envelope.deliveries`` says which hand-out), the
    endpoint (mailbox hash) it was claimed from, and its answers."""

    envelope: Envelope
    endpoint: str
    _client: Answering = field(repr=False)

    @property
    def id(self) -> str:
        return self.envelope.id

    @property
    def deliveries(self) -> int:
        """How many times it has been handed out, this time included (1 the first)."""
        return self.envelope.deliveries

    def ack(self) -> None:
        """Done: returns once the router has marked it done, durably."""
        self._client.wait(self.ack_async(), "ack")

    def nack(self, reason: str) -> None:
        """Failed: returns once it is a dead letter with ``reason``."""
        self._client.wait(self.nack_async(reason), "nack")

    def in_progress(self) -> None:
        """Still working on it: its ack deadline starts again."""
        self._client.wait(self._answer("in_progress", final=False), "in_progress")

    def ack_async(self) -> Future:
        return self._answer("ack")

    def nack_async(self, reason: str) -> Future:
        return self._answer("nack", reason=reason)

    def in_progress_async(self) -> Future:
        return self._answer("in_progress", final=False)

    def _answer(self, op: str, *, final: bool = True, **fields: Any) -> Future:
        future = self._client.send_request(
            op, id=self.id, endpoint=self.endpoint, deliveries=self.deliveries, **fields
        )
        done = self._client.answered if final else self._client.still_working
        future.add_done_callback(lambda _: done(self.id, self.endpoint, self.deliveries))
        return future
