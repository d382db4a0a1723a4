"""What the router handed this client and it has not answered yet: its *holdings*.

Kept so that a new hello can name them when the router forgot the client (it
restarted, or ended a silent session): the router then leaves them this client's
instead of handing them out again (docs/protocol.md, "hello"). A hand-out is keyed by
(message id, endpoint) and names which hand-out it is (``deliveries``): the answer to an
earlier hand-out never forgets a later one. Pure: time is an argument.
"""

from __future__ import annotations

import threading
from typing import NamedTuple


class HeldHere(NamedTuple):
    """A hand-out this client holds: which, its ack deadline (ms), since when (monotonic)."""

    deliveries: int
    ack_wait_ms: int | None
    since: float


class Holdings:
    """The hand-outs of one client; thread-safe (the I/O, handler and caller threads)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], HeldHere] = {}
        self._lock = threading.Lock()

    def holding(
        self, message_id: str, endpoint: str, deliveries: int, ack_wait_ms: int | None, now: float
    ) -> None:
        """The router handed us a message: ours until answered (or its deadline)."""
        with self._lock:
            self._held[(message_id, endpoint)] = HeldHere(deliveries, ack_wait_ms, now)

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None:
        """Forget a hand-out answered (an earlier one's answer keeps a later one)."""
        with self._lock:
            held = self._held.get((message_id, endpoint))
            if held is not None and held.deliveries == deliveries:
                del self._held[(message_id, endpoint)]

    def still_working(self, message_id: str, endpoint: str, deliveries: int, now: float) -> None:
        """in_progress() was confirmed: the hand-out's deadline starts again at ``now``."""
        with self._lock:
            held = self._held.get((message_id, endpoint))
            if held is not None and held.deliveries == deliveries:
                self._held[(message_id, endpoint)] = held._replace(since=now)

    def named(self, now: float) -> list[list[object]]:
        """The hello's ``holding`` list: [id, endpoint, deliveries, ackWait] of each
        hand-out still ours at ``now`` (past its deadline the router may have taken it
        back: not ours to name)."""
        with self._lock:
            return [
                [i, e, h.deliveries, h.ack_wait_ms]
                for (i, e), h in self._held.items()
                if h.ack_wait_ms is None or now < h.since + h.ack_wait_ms / 1000
            ]
