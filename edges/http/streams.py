"""One SSE response: messages of a pattern (observe or consume) and its signals.

- ``observe``: the identity's `ObserverHub` for the pattern (shared, resumable).
- ``consume``: a consuming subscription of this stream alone (credit 1). A message is
  acked once its event has been handed to the connection; one the stream could not
  send (the client went away) is nacked with that reason and so becomes a dead letter
  an operator can see and republish. Use the inbox for explicit ack/nack.
- ``signals``: no messages, only signals.

Signals (all but ``mode=...&signals=false``) come from an ``on_signal`` of the pattern:
``relay_backpressure`` for the router's backpressure signals, ``relay_signal`` for the
rest. They are ephemeral: never replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from edges.http import sse
from edges.http.gateway import IdentityConnection
from edges.http.sse import (
    CUT,
    KEEPALIVE_S,
    ObserverHub,
    Outgoing,
    message_event,
    signal_event,
    sse_comment,
    sse_retry,
)
from sdk.types import Envelope, Signal

MODES = ("observe", "consume", "signals")


class StreamClosed(Exception):
    """The SSE client went away before a consumed message was sent to it."""


class Stream:
    def __init__(self, session: IdentityConnection, pattern: str) -> None:
        self.session = session
        self.pattern = pattern
        self.queue: asyncio.Queue[Outgoing] = asyncio.Queue()
        self.backlog: list[bytes] = []
        self.closed = False
        self._unsent: set[asyncio.Future] = set()  # consumed messages not yet written
        self._hub: ObserverHub | None = None
        self._ends: list[Callable[[], Awaitable[None]]] = []

    async def open(self, mode: str, signals: bool, last_event_id: str | None) -> Stream:
        try:
            if mode == "observe":
                self._hub = await self.session.hub(self.pattern)
                self.backlog, self.queue = self._hub.attach(last_event_id)
            elif mode == "consume":
                self._ends.append(
                    await self.session.client.subscribe(self.pattern, self._consume, credit=1)
                )
            if signals or mode == "signals":
                self._ends.append(await self.session.client.on_signal(self.pattern, self._signal))
        except BaseException:
            self.close()
            raise
        return self

    async def _signal(self, subject: str, signal: Signal) -> None:
        if self.closed:
            return
        if self.queue.qsize() >= sse.LISTENER_LAG:
            # Nobody reads: a client too slow, or a response cancelled before its body
            # began (its generator never ran, so its finally will not close us).
            self.close()
            self.queue.put_nowait(CUT)
            return
        self.queue.put_nowait(Outgoing(signal_event(subject, signal)))

    async def _consume(self, envelope: Envelope) -> None:
        if self.closed:
            raise StreamClosed("the SSE stream closed before this message was sent")
        sent = asyncio.get_running_loop().create_future()
        self._unsent.add(sent)
        self.queue.put_nowait(Outgoing(message_event(envelope)[1], sent))
        try:
            await sent  # StreamClosed from close(): the SDK nacks with it
        finally:
            self._unsent.discard(sent)

    async def events(self, keepalive: float = KEEPALIVE_S) -> AsyncIterator[bytes]:
        try:
            yield sse_retry()
            for chunk in self.backlog:
                yield chunk
            while True:
                try:
                    item = await asyncio.wait_for(self.queue.get(), keepalive)
                except TimeoutError:
                    yield sse_comment("keepalive")
                    continue
                if item is CUT:
                    return
                yield item.chunk
                if item.sent is not None and not item.sent.done():
                    item.sent.set_result(None)
        finally:
            self.close()

    def close(self) -> None:
        """Idempotent, and no await: it runs where the response was cancelled."""
        if self.closed:
            return
        self.closed = True
        if self._hub is not None:
            self._hub.detach(self.queue)
        # Also the one being written when the client went away: its handler must end.
        for sent in self._unsent:
            if not sent.done():
                sent.set_exception(StreamClosed("the SSE stream closed before it was sent"))
        ends, self._ends = self._ends, []
        if ends:
            asyncio.get_running_loop().create_task(_end_all(ends))


async def _end_all(ends: list[Callable[[], Awaitable[None]]]) -> None:
    for end in ends:
        with contextlib.suppress(Exception):
            await end()
