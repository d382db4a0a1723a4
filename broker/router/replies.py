"""Replies on their way to clients, in order per client. Pure: the loop sends them.

Every reply waits here until the end of the loop's pass (or until a push to the same
client, which must not overtake a reply queued before it: a subscribe's answer reaches
its client before the backlog it announces). A client that asked for batches
(hello/ping ``"batch": true``) gets its replies of one pass in as few frames as the
batch limit allows; any other client gets one frame per reply.
"""

from __future__ import annotations

from collections.abc import Iterator

from sdk import wire


class Replies:
    def __init__(self) -> None:
        self._waiting: dict[bytes, list[bytes]] = {}  # client -> reply bodies, in order

    def add(self, client: bytes, body: bytes) -> None:
        self._waiting.setdefault(client, []).append(body)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def clients(self) -> list[bytes]:
        return list(self._waiting)

    def take(self, client: bytes, *, batches: bool) -> Iterator[bytes]:
        """The frames that carry what waits for ``client``, removed from here."""
        bodies = self._waiting.pop(client, None)
        if not bodies:
            return iter(())
        if not batches:
            return iter(bodies)
        return (frame for _, frame in wire.frames(bodies))
