"""The asyncio flavour of the SDK: the methods of `sdk.client.Client`, as coroutines.

A thin adapter over the thread-based sync client, which keeps the protocol::

    async with connect() as client:            # or: client = await connect()
        await client.register_endpoint("relay.agent.me")
        unsubscribe = await client.subscribe("relay.agent.me", handle)
        await client.publish("relay.agent.you", {"content": "hi"}, sender="relay.agent.me")
        await unsubscribe()

How each call waits, without blocking the event loop:

- `publish` and `reply` await the sync client's request future (`asyncio.wrap_future`):
  any number may be in flight at once, no thread each.
- Every other call runs the sync method in `asyncio.to_thread`; they are round trips to
  the router, for setup and administration.
- A deadline passed raises `sdk.errors.Timeout`, as in the sync client. Cancelling an
  awaiting task abandons the wait, not the request: the broker still carries it out.

Handlers given to `subscribe`, `observe` and `on_signal` may be plain functions or
coroutine functions (anything returning an awaitable). A coroutine runs on the event loop
that called `subscribe`; a plain function runs on the client's handler thread, as with
the sync client. Either way one subscription's messages are handled one at a time, in
order, and a handler that raises nacks its message (the reason is the exception).

`subscribe`, `observe` and `on_signal` return an *async* unsubscribe: ``await
unsubscribe()``. Close the client (``async with``) before its event loop ends; a client
whose loop has closed closes itself at its next coroutine delivery, leaving that message
claimed (see `pending`) rather than nacking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import Awaitable, Callable, Generator, Mapping
from concurrent.futures import Future
from typing import Any

from sdk.client import DEFAULT_TIMEOUT, Client, signal_fields
from sdk.client import connect as _connect
from sdk.errors import Timeout, Unavailable
from sdk.message import Message
from sdk.quiet import Full
from sdk.types import AccessRule, Budget, EndpointInfo, Envelope, PublishResult, Signal

Unsubscribe = Callable[[], Awaitable[None]]


class AsyncClient:
    """A connection to a Relay broker for asyncio code; wraps a sync `Client`."""

    def __init__(self, client: Client) -> None:
        self.sync = client  # the underlying sync client, for what has no coroutine here
        self.server: dict[str, Any] = client.server  # the router's hello

    # ------------------------------------------------------------------ plumbing

    async def _wait(self, future: Future, op: str, timeout: float | None) -> Any:
        limit = self.sync.timeout if timeout is None else timeout
        waiting = asyncio.wrap_future(future)
        # asyncio.wait never cancels what it waits for: cancelling the sync client's
        # future would make its I/O thread fail when the reply arrives.
        done, _ = await asyncio.wait({waiting}, timeout=limit)
        if not done:
            waiting.add_done_callback(_consume)
            raise Timeout(f"no reply to {op!r} from the broker within {limit:g} s")
        return waiting.result()

    def _bridge(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """A sync handler for the sync client, running coroutines on the caller's loop."""
        loop = asyncio.get_running_loop()

        def call(*args: Any) -> Any:
            outcome = handler(*args)
            if not inspect.isawaitable(outcome):
                return outcome
            coroutine = _awaited(outcome)
            try:
                future = asyncio.run_coroutine_threadsafe(coroutine, loop)
            except RuntimeError:  # the loop has closed and this client outlived it
                coroutine.close()
                if inspect.iscoroutine(outcome):
                    outcome.close()
                self.sync.close()
                raise Unavailable("the event loop of this client has closed") from None
            return future.result()

        return call

    # ------------------------------------------------------------------ endpoints

    async def register_endpoint(self, subject: str, *, shared: bool | None = None) -> EndpointInfo:
        return await asyncio.to_thread(self.sync.register_endpoint, subject, shared=shared)

    async def unregister_endpoint(self, subject: str) -> bool:
        return await asyncio.to_thread(self.sync.unregister_endpoint, subject)

    async def list_endpoints(self) -> list[EndpointInfo]:
        return await asyncio.to_thread(self.sync.list_endpoints)

    # ------------------------------------------------------------------ publishing

    async def publish(
        self,
        subject: str,
        payload: Any,
        *,
        sender: str,
        reply_to: str | None = None,
        budget: Budget | None = None,
        timeout: float | None = None,
    ) -> PublishResult:
        future = self.sync.publish_async(
            subject, payload, sender=sender, reply_to=reply_to, budget=budget, timeout=timeout
        )
        return await self._wait(future, "publish", timeout)

    async def request(
        self,
        subject: str,
        payload: Any,
        *,
        sender: str,
        timeout: float = 30.0,
        budget: Budget | None = None,
    ) -> Envelope:
        """`Client.request` as a coroutine: the reply whose ``parent_id`` is the
        request's id (a thread waits for it, not the event loop)."""
        return await asyncio.to_thread(
            self.sync.request, subject, payload, sender=sender, timeout=timeout, budget=budget
        )

    async def reply(
        self, envelope: Envelope, payload: Any, *, sender: str, reply_to: str | None = None
    ) -> PublishResult:
        """Answer a message on its replyTo, carrying its budget forward (loops get caught)."""
        future = self.sync.reply_async(envelope, payload, sender=sender, reply_to=reply_to)
        return await self._wait(future, "publish", None)

    async def ingest(
        self,
        envelope: Envelope,
        subjects: list[str],
        *,
        node: str,
        timeout: float | None = None,
    ) -> PublishResult:
        """A message relayed from another node (docs/federation.md), stored once."""
        future = self.sync.ingest_async(envelope, subjects, node=node, timeout=timeout)
        return await self._wait(future, "ingest", timeout)

    # ------------------------------------------------------------------ consuming

    async def subscribe(
        self,
        pattern: str,
        handler: Callable[[Envelope], Any],
        *,
        credit: int | None = None,
        ack_wait: float | None = None,
        confirm: bool = False,
    ) -> Unsubscribe:
        """Consume messages of every endpoint matching pattern; returns async unsubscribe."""
        sync = await asyncio.to_thread(
            self.sync.subscribe,
            pattern,
            self._bridge(handler),
            credit=credit,
            ack_wait=ack_wait,
            confirm=confirm,
        )
        return _async_unsubscribe(sync)

    async def fetch(
        self, pattern: str, *, batch: int = 10, wait: float = 0.0, ack_wait: float | None = None
    ) -> list[AsyncMessage]:
        """`Client.fetch` as a coroutine; each message's answers are coroutines too."""
        future = self.sync.fetch_async(pattern, batch=batch, wait=wait, ack_wait=ack_wait)
        held = await self._wait(future, "fetch", self.sync.timeout + wait)
        return [AsyncMessage(message, self) for message in held]

    async def observe(self, pattern: str, handler: Callable[[Envelope], Any]) -> Unsubscribe:
        """Watch every stored message matching pattern: no claim, no ack."""
        sync = await asyncio.to_thread(self.sync.observe, pattern, self._bridge(handler))
        return _async_unsubscribe(sync)

    async def pending(self, subject: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.sync.pending, subject)

    async def complete(self, message_id: str, endpoint: str) -> None:
        await asyncio.to_thread(self.sync.complete, message_id, endpoint)

    async def fail(
        self, message_id: str, endpoint: str, reason: str = "failed by operator"
    ) -> None:
        await asyncio.to_thread(self.sync.fail, message_id, endpoint, reason)

    # ------------------------------------------------------------------ signals

    async def signal(
        self, subject: str, signal: Signal, *, sender: str | None = None, wait: bool = True
    ) -> None:
        """As `Client.signal`; with ``wait=False`` it returns without a round trip, and
        waits off the event loop while the client's buffer of them is full (queueing
        itself may block the loop briefly, as `publish_async` may)."""
        if not wait:
            try:  # queued for the I/O thread: no need to leave the loop ...
                self.sync._signal_quietly(signal_fields(subject, signal, sender), timeout=0)
                return
            except Full:  # ... unless it must wait for room
                pass
        await asyncio.to_thread(self.sync.signal, subject, signal, sender=sender, wait=wait)

    async def on_signal(self, pattern: str, handler: Callable[[str, Signal], Any]) -> Unsubscribe:
        """Call handler(subject, signal) for each matching signal; returns async unsubscribe."""
        stop = self.sync.on_signal(pattern, self._bridge(handler))  # does not wait on the broker

        async def unsubscribe() -> None:
            stop()

        return unsubscribe

    # ------------------------------------------------------------------ administration

    async def dead_letters(
        self, endpoint_hash: str | None = None, *, limit: int = 100, message_id: str | None = None
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(
            self.sync.dead_letters, endpoint_hash, limit=limit, message_id=message_id
        )

    async def requeue_dead_letters(
        self,
        endpoint_hash: str | None = None,
        *,
        message_id: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> dict[str, Any]:
        return await asyncio.to_thread(
            self.sync.requeue_dead_letters,
            endpoint_hash,
            message_id=message_id,
            limit=limit,
            after=after,
        )

    async def purge_dead_letters(self, endpoint_hash: str | None = None) -> int:
        return await asyncio.to_thread(self.sync.purge_dead_letters, endpoint_hash)

    async def rebuild_index(self) -> int:
        return await asyncio.to_thread(self.sync.rebuild_index)

    async def add_rule(self, rule: AccessRule) -> AccessRule:
        return await asyncio.to_thread(self.sync.add_rule, rule)

    async def remove_rule(self, from_pattern: str, to_pattern: str) -> bool:
        return await asyncio.to_thread(self.sync.remove_rule, from_pattern, to_pattern)

    async def list_rules(self) -> list[AccessRule]:
        return await asyncio.to_thread(self.sync.list_rules)

    async def get_config(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.get_config)

    async def set_config(self, partial: Mapping[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.set_config, partial)

    async def status(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.status)

    async def trace(self, message_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.trace, message_id)

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncMessage:
    """A message `AsyncClient.fetch` handed out: `sdk.message.Message` with coroutine
    answers, each confirmed by the router."""

    def __init__(self, message: Message, client: AsyncClient) -> None:
        self.message = message
        self._client = client

    @property
    def envelope(self) -> Envelope:
        return self.message.envelope

    @property
    def endpoint(self) -> str:
        return self.message.endpoint

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def deliveries(self) -> int:
        return self.message.deliveries

    async def ack(self) -> None:
        await self._client._wait(self.message.ack_async(), "ack", None)

    async def nack(self, reason: str) -> None:
        await self._client._wait(self.message.nack_async(reason), "nack", None)

    async def in_progress(self) -> None:
        await self._client._wait(self.message.in_progress_async(), "in_progress", None)


class Connecting:
    """What `connect` returns: await it for a client, or ``async with`` it."""

    def __init__(self, home: str | os.PathLike[str] | None, **options: Any) -> None:
        self._home, self._options = home, options
        self._client: AsyncClient | None = None

    async def _open(self) -> AsyncClient:
        sync = await asyncio.to_thread(_connect, self._home, **self._options)
        return AsyncClient(sync)

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncClient:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()


def connect(
    home: str | os.PathLike[str] | None = None,
    *,
    address: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    key_file: str | os.PathLike[str] | None = None,
    server_key: str | os.PathLike[str] | None = None,
) -> Connecting:
    """Connect to the broker of a data directory (default $RELAY_HOME or ~/.dork/relay).

    ``client = await connect()`` or ``async with connect() as client``; raises
    `sdk.errors.Unavailable` when no broker answers within ``timeout`` seconds.
    ``key_file`` and ``server_key``: CURVE on tcp://, as for `sdk.client.connect`.
    """
    return Connecting(
        home, address=address, timeout=timeout, key_file=key_file, server_key=server_key
    )


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _async_unsubscribe(sync: Callable[[], None]) -> Unsubscribe:
    async def unsubscribe() -> None:
        await asyncio.to_thread(sync)

    return unsubscribe


def _consume(future: asyncio.Future) -> None:
    """Retrieve a late outcome nobody waits for, so asyncio does not log it as lost."""
    with contextlib.suppress(BaseException):
        future.exception()


__all__ = ["AsyncClient", "Connecting", "connect"]
