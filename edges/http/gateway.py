"""The gateway's state: who a request acts for, and one SDK client per identity.

The gateway is a client of the router, never a second judge. Each identity it acts for
has its own connection to the router, made with the gateway's own credentials:

- the **owner** (no token; loopback, the data directory's uid, and only while auth.json
  holds no token): the gateway's own connection, as `relay` commands make it (ipc://,
  or tcp:// with ``--key-file``);
- a **token**'s bearer: a connection whose every request names the token's identity
  (``actingFor``, broker/delegation.py), so the router applies that identity's sender,
  receive and operator rights, as for any client. The gateway's own identity needs the
  delegation right (the owner has it); the router may be on ipc:// or tcp://.

Clients are made on first use and kept; one whose identity has no good token left
(removed, or expired) is closed.

Each identity's inbox reads fetch (the SDK's `fetch`, with the gateway's ack deadline)
and the messages they return are held in edges.held until the HTTP client acks or
nacks them by id, with the router's confirmed answers. Claims made for an identity
belong to its connection: docs/security.md, "Delegation".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from edges.held import DEFAULT_ACK_WAIT_S, HeldMessages
from edges.http.credentials import connection_owner, is_loopback
from edges.http.errors import unauthenticated
from edges.http.sse import HUB_LINGER_S, ObserverHub
from edges.tokens import AuthFile, TokenRefused, bearer_token, now_ms
from sdk.aio import AsyncClient, AsyncMessage
from sdk.client import connect
from sdk.errors import EndpointNotFound, InvalidState
from sdk.paths import Home

log = logging.getLogger("relay.http")

OWNER = "owner"
INBOX_WINDOW = 16  # messages held per identity and endpoint, at most


@dataclass(frozen=True, slots=True)
class Principal:
    """Whom a request acts for: the owner, or the identity a token belongs to."""

    name: str
    user: str | None = None  # its user id ("key:<z85>"), named in actingFor; None: owner

    @property
    def id(self) -> str:
        return self.user or OWNER


@dataclass(frozen=True, slots=True)
class Peer:
    """The two ends of the HTTP connection, as the ASGI server reports them."""

    client: tuple[str, int] | None
    server: tuple[str, int] | None


class Gateway:
    """Resolves requests to principals and principals to connected SDK clients."""

    def __init__(
        self,
        home: Home,
        *,
        address: str | None = None,
        key_file: str | None = None,
        server_key: str | None = None,
        timeout: float = 10.0,
        ack_wait: float = DEFAULT_ACK_WAIT_S,
    ) -> None:
        self.home = home
        self.ack_wait = ack_wait
        self.address = address or home.router_address
        self.key_file = key_file
        self.server_key = server_key
        self.timeout = timeout
        self.auth = AuthFile(home.auth_file, home.owner_uid)
        self.auth.refresh()  # started with tokens listed: it serves by token from the first request
        self._sessions: dict[str, IdentityConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------------ who is asking

    def principal(
        self, authorization: str | None, peer: Peer, token: str | None = None
    ) -> Principal:
        """Whom this request acts for; `HttpError` 401 when nobody."""
        try:
            bearer = self.auth.admit(bearer_token(authorization) or token, now_ms())
        except TokenRefused as refused:
            raise unauthenticated(str(refused)) from None
        if bearer is not None:
            return Principal(bearer.name, bearer.user)
        if not self._owner_on_loopback(peer):
            raise unauthenticated(
                "without tokens in auth.json, only the data directory's owner may use the "
                "gateway, over loopback; make a token with `relay auth add-token`"
            )
        return Principal(OWNER)

    def _owner_on_loopback(self, peer: Peer) -> bool:
        if peer.client is None or peer.server is None or not is_loopback(peer.client[0]):
            return False
        return connection_owner(peer.client, peer.server) == self.home.owner_uid

    # ------------------------------------------------------------------ its connection

    async def session(self, principal: Principal) -> IdentityConnection:
        """The connected session acting for ``principal`` (made on first use)."""
        self._forget_revoked()
        found = self._sessions.get(principal.id)
        if found is not None:
            return found
        lock = self._connecting.setdefault(principal.id, asyncio.Lock())
        async with lock:
            found = self._sessions.get(principal.id)
            if found is None:
                sync = await asyncio.to_thread(self._connect, principal)
                found = IdentityConnection(principal, AsyncClient(sync), self.ack_wait)
                self._sessions[principal.id] = found
        return found

    def _connect(self, principal: Principal) -> Any:
        return connect(
            self.home.root,
            address=self.address,
            timeout=self.timeout,
            key_file=self.key_file,
            server_key=self.server_key,
            acting_for=principal.user,
        )

    def _forget_revoked(self) -> None:
        """Close the sessions of identities with no good token left (removed, expired):
        the router would refuse them anyway; this frees their subscriptions and hands
        out again what they held."""
        book, now = self.auth.refresh(), now_ms()
        for pid in [p for p in self._sessions if p != OWNER and not book.still_good(p, now)]:
            session = self._sessions.pop(pid)
            asyncio.get_running_loop().create_task(session.close())

    async def sweep(self, now: float, linger: float = HUB_LINGER_S) -> None:
        """End observer hubs and inboxes that nobody has used for ``linger`` seconds, and
        the connections of identities whose tokens expired meanwhile (with their streams)."""
        self._forget_revoked()
        for session in list(self._sessions.values()):
            await session.sweep(now, linger)

    def sessions(self) -> list[IdentityConnection]:
        return list(self._sessions.values())

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions))


class IdentityConnection:
    """One identity's connection, the messages its inbox reads hold (by id), and its
    observer hubs (by pattern)."""

    def __init__(
        self, principal: Principal, client: AsyncClient, ack_wait: float = DEFAULT_ACK_WAIT_S
    ) -> None:
        self.principal = principal
        self.client = client
        self.held: HeldMessages[AsyncMessage] = HeldMessages(ack_wait)
        self.hubs: dict[str, ObserverHub] = {}
        self._lock = asyncio.Lock()  # one subscribe at a time per session: no duplicates

    async def read(self, subject: str, limit: int, wait: float) -> list[AsyncMessage]:
        """An inbox read: fetch what waits for ``subject``, up to ``limit`` held in all
        (at most `INBOX_WINDOW`); with nothing held or waiting, wait up to ``wait``
        seconds for a first one. Returns every message held for ``subject``, oldest
        first: one read and not answered is listed again."""
        limit = min(limit, INBOX_WINDOW)
        room = limit - len(self.held.of(subject, time.monotonic()))
        if room > 0:
            fetched = await self._fetch(subject, room, 0.0)
            if not fetched and not self.held.of(subject, time.monotonic()):
                await self._check_registered(subject)
                if wait > 0:
                    fetched = await self._fetch(subject, room, wait)
            self.held.hold(fetched, time.monotonic())
        return self.held.of(subject, time.monotonic())[:limit]

    async def _fetch(self, subject: str, batch: int, wait: float) -> list[AsyncMessage]:
        return await self.client.fetch(subject, batch=batch, wait=wait, ack_wait=self.held.ack_wait)

    async def _check_registered(self, subject: str) -> None:
        """A fetch of a subject no endpoint has finds nothing: say which it is."""
        if all(info.subject != subject for info in await self.client.list_endpoints()):
            raise EndpointNotFound(f"endpoint {subject} is not registered")

    async def answer(self, message: AsyncMessage, reason: str | None) -> None:
        """Ack (``reason`` None) or nack a held message; returns once the router has
        applied it, durably. `InvalidState` when the router no longer holds it for us."""
        try:
            if reason is None:
                await message.ack()
            else:
                await message.nack(reason)
        except InvalidState:
            self.held.forget(message)
            raise
        self.held.forget(message)

    async def hub(self, pattern: str) -> ObserverHub:
        async with self._lock:
            if pattern not in self.hubs:
                self.hubs[pattern] = await ObserverHub(self.client, pattern).open()
            hub = self.hubs[pattern]
            if hub.idle_since is not None:  # not swept before the stream attaches
                hub.idle_since = time.monotonic()
            return hub

    async def sweep(self, now: float, linger: float) -> None:
        async with self._lock:  # not while a stream is attaching to the hub it would close
            for pattern, hub in list(self.hubs.items()):
                if hub.idle_for(now) > linger:
                    del self.hubs[pattern]
                    await hub.close()
        self.held.all(now)  # forgets what passed its ack deadline

    async def close(self) -> None:
        """Close the connection: its "bye" ends every subscription at the router at once
        and hands out again what it held unanswered. Not one unsubscribe each: with the
        router already gone (honcho stops all processes together) each would wait out
        its deadline."""
        self.hubs.clear()
        with contextlib.suppress(Exception):
            await self.client.close()
