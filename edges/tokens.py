"""Bearer tokens: how the edges (the HTTP gateway, MCP over HTTP) tell who is asking.

A token belongs to an identity of auth.json (a ``keys`` entry), which keeps only its
SHA-256 (``"tokens": ["sha256:<hex>"]``, or ``{"hash", "expires"}`` for one that
expires; broker/auth.py). An edge verifies the token here, then acts for its identity
through its own connection, naming that identity on every request (``actingFor``;
broker/delegation.py): the router judges each request by that identity's rights.

`TokenBook` is pure (time is an argument); `AuthFile` re-reads auth.json when it changes,
and holds the one rule both edges admit a request by (`AuthFile.admit`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker.auth import AuthPolicy, Identity, key_user
from sdk.errors import RelayError

log = logging.getLogger("relay.tokens")

TOKEN_PREFIX = "relay_"
HASH_PREFIX = "sha256:"

NO_TOKEN = "a bearer token is needed (Authorization: Bearer <token>): auth.json lists tokens"
NO_TOKEN_LEFT = (
    "a bearer token is needed: this server serves by token, and still does now that no "
    "token is left in auth.json (restart it to serve without tokens)"
)
BAD_TOKEN = "unknown, expired or revoked bearer token"


def now_ms() -> int:
    """The time tokens expire by (unix ms)."""
    return time.time_ns() // 1_000_000


def new_token() -> str:
    """A fresh bearer token: 256 random bits, with a prefix that says what it is."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What auth.json keeps of a token (never the token itself)."""
    return HASH_PREFIX + hashlib.sha256(token.encode("utf-8")).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class TokenRefused(Exception):
    """A request an edge answers ``401``: the token it showed, or its lack of one, serves
    nobody. The message says which."""


@dataclass(frozen=True, slots=True)
class Bearer:
    """The identity a verified token belongs to."""

    user: str  # its user id, what a request names in actingFor: "key:<z85>"
    identity: Identity

    @property
    def name(self) -> str:
        return self.identity.name


class TokenBook:
    """The tokens auth.json lists, by hash."""

    def __init__(self, policy: AuthPolicy | None = None) -> None:
        self._grants = [
            (grant.digest.encode(), grant, Bearer(key_user(key), identity))
            for key, identity in (policy.keys.items() if policy else ())
            for grant in identity.tokens
        ]
        self.users = frozenset(bearer.user for _, _, bearer in self._grants)

    @property
    def configured(self) -> bool:
        """Whether auth.json lists any token, expired or not: then every request needs one."""
        return bool(self._grants)

    def verify(self, token: str, now_ms: int) -> Bearer | None:
        """The identity of a token listed and not expired, else None. Every listed hash
        is compared, in constant time, whichever matches."""
        digest = token_hash(token).encode()
        found = None
        for stored, grant, bearer in self._grants:
            if hmac.compare_digest(stored, digest) and grant.valid_at(now_ms):
                found = bearer
        return found

    def still_good(self, user: str, now_ms: int) -> bool:
        """Whether ``user`` still has a token that is good now (else the edge lets go of
        what it holds for it)."""
        return any(b.user == user and g.valid_at(now_ms) for _, g, b in self._grants)


@dataclass
class AuthFile:
    """auth.json as last read, re-read when it changes: `relay auth` replaces the file
    (a new inode), an editor may rewrite it (mtime, size)."""

    path: Path
    owner_uid: int
    stamp: tuple[int, int, int] | None = None
    book: TokenBook = field(default_factory=TokenBook)
    # Why the file was refused when no good one had been read: nobody is served then,
    # not even the owner without a token (the file may have listed tokens).
    refused: str | None = None
    # Whether it has listed a token since this process first read it: an edge serving by
    # token then keeps asking for one when none is left (removed, file deleted) rather
    # than fall back to serving anyone with its own rights.
    by_token: bool = False

    def refresh(self) -> TokenBook:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self.stamp, self.book, self.refused = None, TokenBook(), None
            return self.book
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self.stamp:
            return self.book
        try:
            policy = AuthPolicy.from_json(json.loads(self.path.read_text()), self.owner_uid)
        except (OSError, ValueError, RelayError) as exc:
            # As the router does: a broken file changes nothing; the last good one holds.
            log.error("auth.json refused, keeping the tokens read before: %s", exc)
            if self.stamp is None or self.refused is not None:
                self.refused = str(exc)
            self.stamp = stamp
            return self.book
        self.stamp, self.refused, self.book = stamp, None, TokenBook(policy)
        self.by_token = self.by_token or self.book.configured
        return self.book

    def admit(self, token: str | None, now_ms: int) -> Bearer | None:
        """Whom a request showing ``token`` (None: no token) acts for: the token's
        identity, or None when it needs none because auth.json has listed no token since
        this process first read it (the edge serves it as itself, within its own checks).
        `TokenRefused` otherwise. Fails closed: once serving by token, a request without
        one stays refused when the last token is removed or auth.json deleted, rather
        than fall back to the edge's own (the owner's) rights; a token shown is always
        verified, never ignored."""
        book = self.refresh()
        if self.refused is not None:
            raise TokenRefused(f"auth.json is refused, so nobody is served: {self.refused}")
        if token is None:
            if self.by_token:
                raise TokenRefused(NO_TOKEN if book.configured else NO_TOKEN_LEFT)
            return None
        bearer = book.verify(token, now_ms)
        if bearer is None:
            raise TokenRefused(BAD_TOKEN)
        return bearer
