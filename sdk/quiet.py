"""Signals sent with ``wait=False`` on their way from callers to the client's I/O thread.

A burst costs the I/O thread one wake-up, not one per signal: the signal that opens a
*segment* comes with one marker on the I/O thread's queue, the signals after it join the
segment, and the marker takes the whole segment. A request sent in between closes the
segment (the caller passes the count of requests sent so far), so a signal never
overtakes a request sent before it, nor a request one sent after it.

That order holds because the client adds a signal, and sends its segment's marker, under
the same lock as it sends requests: markers leave in the order their segments opened,
one per segment. The buffer is bounded: when it holds ``limit`` signals a caller waits,
before it takes that lock, for the I/O thread to take some, as a socket send waits for
room. The I/O thread takes only this queue's own lock, never the client's: a caller
blocked on a full socket while holding the client's lock must not be able to stop the
thread that empties that socket.
"""

from __future__ import annotations

import threading
from collections import deque

from sdk.errors import Unavailable


class Full(Exception):
    """No room for another signal within the time the caller allowed."""


class QuietSignals:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._segments: deque[tuple[int, list[bytes]]] = deque()  # (requests sent, bodies)
        self._count = 0
        self._closed = False
        self._changed = threading.Condition()

    def wait_for_room(self, timeout: float | None) -> None:
        """Return when there is room; `Full` if none came within ``timeout`` (0: do not
        wait), `Unavailable` once closed."""
        if self._count < self.limit and not self._closed:
            return  # the common case, without the lock (the limit is not exact anyway)
        with self._changed:
            if not self._changed.wait_for(self._has_room, timeout):
                raise Full(f"{self.limit} signals are waiting to leave")
            if self._closed:
                raise Unavailable("client is closed")

    def add(self, body: bytes, requests_sent: int) -> bool:
        """Queue ``body`` (the caller holds the client's lock); True when it opened a
        segment, whose marker the caller must now send."""
        with self._changed:
            self._count += 1
            if self._segments and self._segments[-1][0] == requests_sent:
                self._segments[-1][1].append(body)
                return False
            self._segments.append((requests_sent, [body]))
            return True

    def take(self) -> list[bytes]:
        """The oldest segment (the I/O thread, for one marker)."""
        with self._changed:
            if not self._segments:
                return []
            _, bodies = self._segments.popleft()
            self._count -= len(bodies)
            self._changed.notify_all()
            return bodies

    def withdraw_last(self) -> None:
        """Drop the segment just opened, whose marker could not be sent (the caller still
        holds the client's lock, so nothing joined it)."""
        with self._changed:
            _, bodies = self._segments.pop()
            self._count -= len(bodies)
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()  # a caller waiting for room gives up

    def _has_room(self) -> bool:
        return self._count < self.limit or self._closed
