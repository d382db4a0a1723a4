"""MCP over HTTP for many agents: each session acts as the identity of its bearer token.

Without tokens in auth.json, `relay mcp --http` serves every session as its own
identity (the process's client) and sender (``--as``), as over stdio. Once auth.json
lists a token, every HTTP request needs one (`TokenGate`, else ``401``) for as long as
the server runs, even when no token is left, and a session
acts for that token's identity: the router judges its sends, inbox and rights by that
identity, through the server's own connection naming it on each request (``actingFor``;
broker/delegation.py). Its sender subject is the ``Relay-Sender`` header, or the
identity's one sender when that is a subject without wildcards.

`Agents` keeps one SDK client per identity (made on first use, closed when its tokens
are gone) and one `RelayTools` per identity and sender: its held messages, its reply
inbox (``_INBOX.<sender>.<nonce>``, registered and consumed as that identity, which may
since it may send as the sender). The MCP SDK binds each session to the credential
that opened it (``scope["user"]``): a session cannot be carried on with another
identity's token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.types import ASGIApp, Receive, Scope, Send

from edges.tokens import AuthFile, Bearer, TokenRefused, bearer_token, now_ms, token_hash
from sdk import subjects
from sdk.client import Client
from sdk.errors import InvalidMessage, LimitExceeded, SenderNotAllowed

if TYPE_CHECKING:
    from edges.mcp_server import RelayTools

log = logging.getLogger("relay.mcp")

BEARER = "relay.bearer"  # the ASGI scope key of the verified token's identity
SENDER_HEADER = "relay-sender"
MAX_SENDERS = 32  # sender subjects one identity uses through one server (each has tools)
SWEEP_S = 5.0  # how often identities whose tokens expired are forgotten


class TokenGate:
    """ASGI middleware: once auth.json has listed a token (at start or since), a request
    without a good one gets 401, even after the last token is removed or auth.json is
    deleted (fail closed, `AuthFile.admit`: the rule the HTTP gateway follows too); with
    one, the request carries its identity (``scope[BEARER]``, and ``scope["user"]`` for
    the MCP SDK's session binding)."""

    def __init__(self, app: ASGIApp, auth: AuthFile) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        token = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        try:
            bearer = self.auth.admit(token, now_ms())
        except TokenRefused as refused:
            await _unauthorized(send, str(refused))
            return
        if bearer is None or token is None:  # none needed: the process's own identity
            await self.app(scope, receive, send)
            return
        user = AuthenticatedUser(
            AccessToken(token=token_hash(token), client_id=bearer.user, scopes=[])
        )
        await self.app({**scope, "user": user, BEARER: bearer}, receive, send)


async def _unauthorized(send: Send, message: str) -> None:
    body = json.dumps({"error": {"code": "not_authorized", "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def sender_of(bearer: Bearer, named: str | None) -> str:
    """The sender subject a token's session sends as: the one it names, else its
    identity's only sender pattern when that is a subject. The router judges it."""
    if named:
        return subjects.validate(named)
    senders = bearer.identity.senders
    if len(senders) == 1 and "*" not in senders[0] and ">" not in senders[0].split("."):
        return senders[0]
    raise InvalidMessage(
        f"{bearer.name} may send as {', '.join(senders)}: name the subject to send as in "
        "the Relay-Sender header"
    )


class Agents:
    """The tools of each token identity and sender, next to the owner's."""

    def __init__(
        self,
        owner: RelayTools,
        auth: AuthFile,
        connect_as: Callable[[str], Client],
        make_tools: Callable[[Client, str], RelayTools],
    ) -> None:
        self.owner = owner
        self.auth = auth
        self._connect_as = connect_as  # a client whose requests act for that user id
        self._make_tools = make_tools
        self._clients: dict[str, Client] = {}  # by user id
        self._tools: dict[tuple[str, str], RelayTools] = {}  # by (user id, sender)
        self._lock = anyio.Lock()

    async def for_request(self, request: Any) -> RelayTools:
        """The tools a tool call is carried out with: its token's, else the owner's."""
        scope = getattr(request, "scope", None) or {}
        bearer: Bearer | None = scope.get(BEARER)
        if bearer is None:
            return self.owner
        sender = sender_of(bearer, request.headers.get(SENDER_HEADER))
        if not bearer.identity.may_send_as(sender):  # no tools, no reply inbox for it
            raise SenderNotAllowed(f"{bearer.name} may not send as {sender}")
        await self.forget_revoked()
        async with self._lock:
            tools = self._tools.get((bearer.user, sender))
            if tools is None:
                if sum(user == bearer.user for user, _ in self._tools) >= MAX_SENDERS:
                    raise LimitExceeded(
                        f"{bearer.name} already sends as {MAX_SENDERS} subjects through "
                        "this server: use one of them (Relay-Sender)"
                    )
                client = self._clients.get(bearer.user)
                if client is None:
                    client = await anyio.to_thread.run_sync(self._connect_as, bearer.user)
                    self._clients[bearer.user] = client
                tools = self._make_tools(client, sender)
                self._tools[(bearer.user, sender)] = tools
            return tools

    async def forget_revoked(self) -> None:
        """Close the clients of identities with no good token left (removed, expired):
        what they held is handed out again, their reply inboxes stop consuming. Called
        at each tool call and periodically (`sweep`), so an expired identity's client
        does not wait for a next call that may never come."""
        book, now = self.auth.refresh(), now_ms()
        async with self._lock:
            gone = [u for u in self._clients if not book.still_good(u, now)]
            clients = [self._clients.pop(user) for user in gone]
            for key in [k for k in self._tools if k[0] in gone]:
                del self._tools[key]
        for client in clients:  # each close may take seconds: not under the lock
            await anyio.to_thread.run_sync(client.close)

    async def sweep(self, every_s: float = SWEEP_S) -> None:
        """Forget the identities whose tokens expired or were removed, every ``every_s``
        seconds, until cancelled."""
        while True:
            await anyio.sleep(every_s)
            try:
                await self.forget_revoked()
            except Exception:
                log.exception("forgetting the clients of revoked tokens failed")

    async def close(self) -> None:
        async with self._lock:
            clients, self._clients, self._tools = list(self._clients.values()), {}, {}
        for client in clients:
            await anyio.to_thread.run_sync(client.close)
