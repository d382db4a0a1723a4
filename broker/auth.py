"""Who may connect, which sender subjects they may use, who may run operator commands.

Pure: the router's ZAP handler (broker/zap.py) asks `AuthPolicy.admit_uid` /
`admit_key` at each connection's handshake and gives the connection a user id
(``uid:1000``, ``key:<z85 public key>``); libzmq then stamps that user id on every
message the connection sends, and the router asks `AuthPolicy.identity` per request.
Revoking a key or a uid therefore takes effect at the next request, not only at the
next connection.

The policy comes from ``auth.json`` in the data directory::

    {
      "uids": {"1001": {"name": "agent-b", "senders": ["relay.agent.b.>"]}},
      "keys": {"<z85 public key>": {"name": "projA", "senders": ["relay.agent.projA.>"],
                                    "consumes": ["relay.agent.projA.>", "relay.human.>"],
                                    "admin": false}}
    }

A key's entry may also hold ``"tokens"``: the hashes of bearer tokens
(``"sha256:<64 hex>"``, or ``{"hash": "sha256:<64 hex>", "expires": "<ISO 8601 UTC>"}``)
that the edges (edges/tokens.py: HTTP gateway, MCP over HTTP) verify before acting for
that identity. An entry with ``"delegate": true`` may act for other identities, naming
on each request the one it acts for (broker/delegation.py, docs/security.md).

``consumes`` (default: the ``senders`` patterns) bounds the endpoints whose messages an
identity may receive: subscribe to (consume or observe), list as pending, read as dead
letters. The uid that owns the data directory (the owner) is always admitted, with every
right, unless ``uids`` names it: it owns the data directory and could read or write any
mail file directly, so refusing it would protect nothing. Every other uid and every
CURVE key must be listed. Without the file, that is single-user local use as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from sdk.errors import InvalidConfig, RelayError
from sdk.subjects import covers, inbox_sender, matches, validate

AUTH_FILE = "auth.json"
Z85_KEY_LENGTH = 40  # a 32-byte CURVE key in Z85 text


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """A bearer token of an identity, as auth.json keeps it: its hash, never itself."""

    digest: str  # "sha256:<64 hex>"
    expires_ms: int | None = None  # unix ms; None: until removed

    def valid_at(self, now_ms: int) -> bool:
        return self.expires_ms is None or now_ms < self.expires_ms


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    senders: tuple[str, ...]  # subject patterns this identity may publish as
    admin: bool = False  # may change config and rules, purge, complete others' messages
    # endpoint subject patterns whose messages it may receive; None: the senders'
    consumes: tuple[str, ...] | None = None
    # a federation bridge (docs/federation.md): origin node -> the sender patterns that
    # node may relay; None: only the unrestricted operator (the owner) may relay
    relays: Mapping[str, tuple[str, ...]] | None = field(default=None, hash=False)
    # may act for other identities (auth.json "delegate"): broker/delegation.py
    delegate: bool = False
    tokens: tuple[TokenGrant, ...] = ()  # its bearer tokens (keys only)

    def has_token_at(self, now_ms: int) -> bool:
        """Whether one of its tokens is still good: only then may a delegate act for it."""
        return any(t.valid_at(now_ms) for t in self.tokens)

    @property
    def unrestricted(self) -> bool:
        return ">" in self.senders

    @property
    def receives(self) -> tuple[str, ...]:
        return self.senders if self.consumes is None else self.consumes

    def may_send_as(self, sender: str) -> bool:
        if self.unrestricted:  # the common case: no matching at all
            return True
        return any(matches(sender, pattern) for pattern in self.senders)

    def may_consume(self, pattern: str) -> bool:
        """Whether every endpoint ``pattern`` (a subject or a pattern) can match is one
        whose messages this identity may receive: its ``consumes``, and the reply
        inboxes of the senders it may send as."""
        receives = self.receives
        if ">" in receives:
            return True
        return self.owns_inbox(pattern) or any(covers(allowed, pattern) for allowed in receives)

    def owns_inbox(self, subject: str) -> bool:
        """Whether ``subject`` is the reply inbox of a sender this identity may send as."""
        sender = inbox_sender(subject)
        return sender is not None and self.may_send_as(sender)

    def may_relay(self, node: str, sender: str) -> bool:
        """Whether this bridge may hand in messages of ``sender`` coming from ``node``:
        one compromised node cannot speak for another node's agents."""
        if self.relays is None:  # the owner could write the mail files anyway
            return self.unrestricted and self.admin
        patterns = self.relays.get(node, ())
        return self.may_send_as(sender) and any(matches(sender, p) for p in patterns)


def owner_identity() -> Identity:
    # Delegation gives the owner nothing it has not got: acting for a narrower identity
    # only narrows. It is what lets `relay http` and `relay mcp` serve tokens on ipc://.
    return Identity("owner", (">",), admin=True, delegate=True)


def uid_user(uid: int) -> str:
    return f"uid:{uid}"


def key_user(z85_key: str) -> str:
    return f"key:{z85_key}"


class AuthPolicy:
    def __init__(
        self,
        owner_uid: int,
        uids: Mapping[int, Identity] | None = None,
        keys: Mapping[str, Identity] | None = None,
    ) -> None:
        self.owner_uid = owner_uid
        self.uids = dict(uids or {})
        self.uids.setdefault(owner_uid, owner_identity())
        self.keys = dict(keys or {})
        self._by_user = {uid_user(u): i for u, i in self.uids.items()}
        self._by_user.update({key_user(k): i for k, i in self.keys.items()})

    @classmethod
    def from_json(cls, data: Any, owner_uid: int) -> AuthPolicy:
        """Parse auth.json; `InvalidConfig` names the first bad field."""
        if not isinstance(data, dict):
            raise InvalidConfig(f"{AUTH_FILE} must be an object with 'uids' and/or 'keys'")
        unknown = set(data) - {"uids", "keys"}
        if unknown:
            raise InvalidConfig(f"{AUTH_FILE}: unknown field(s) {sorted(unknown)}")
        uids = {
            _uid(raw, f"uids.{raw}"): _identity(entry, f"uids.{raw}")
            for raw, entry in _object(data.get("uids", {}), "uids").items()
        }
        keys = {
            _key(raw, f"keys.{raw}"): _identity(entry, f"keys.{raw}", tokens=True)
            for raw, entry in _object(data.get("keys", {}), "keys").items()
        }
        return cls(owner_uid, uids, keys)

    def admit_uid(self, uid: int) -> str | None:
        """The user id for an ipc peer running as ``uid``, or None to refuse it."""
        return uid_user(uid) if uid in self.uids else None

    def admit_key(self, z85_key: str) -> str | None:
        """The user id for a CURVE client with this public key, or None to refuse it."""
        return key_user(z85_key) if z85_key in self.keys else None

    def identity(self, user: str | None) -> Identity | None:
        """The identity behind a connection's user id; None when it was revoked, and for
        a message without one (every client socket is under ZAP, so that would mean the
        handler was bypassed: refuse rather than guess)."""
        return self._by_user.get(user) if user is not None else None

    @property
    def users(self) -> frozenset[str]:
        return frozenset(self._by_user)

    def next_token_expiry(self, now_ms: int) -> int | None:
        """The earliest time after ``now_ms`` that a token expires, or None: expiry
        changes no file, so the router judges delegated subscriptions again then."""
        return min(
            (
                grant.expires_ms
                for identity in self.keys.values()
                for grant in identity.tokens
                if grant.expires_ms is not None and grant.expires_ms > now_ms
            ),
            default=None,
        )


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidConfig(f"{AUTH_FILE}: {path} must be an object")
    return value


def _uid(raw: str, path: str) -> int:
    if not raw.isdigit():
        raise InvalidConfig(f"{AUTH_FILE}: {path}: a uid is a non-negative integer")
    return int(raw)


def _key(raw: str, path: str) -> str:
    if len(raw) != Z85_KEY_LENGTH:
        raise InvalidConfig(
            f"{AUTH_FILE}: {path}: a CURVE public key is {Z85_KEY_LENGTH} Z85 characters"
        )
    return raw


def _identity(entry: Any, path: str, *, tokens: bool = False) -> Identity:
    entry = _object(entry, path)
    unknown = set(entry) - {
        "name",
        "senders",
        "consumes",
        "admin",
        "relays",
        "delegate",
        *(["tokens"] if tokens else []),
    }
    if unknown:
        raise InvalidConfig(f"{AUTH_FILE}: {path}: unknown field(s) {sorted(unknown)}")
    name = entry.get("name", path)
    if not isinstance(name, str):
        raise InvalidConfig(f"{AUTH_FILE}: {path}.name must be a string")
    admin, delegate = _flag(entry, "admin", path), _flag(entry, "delegate", path)
    senders = _patterns(entry.get("senders"), f"{path}.senders")
    consumes = entry.get("consumes")
    if consumes is not None:
        consumes = _patterns(consumes, f"{path}.consumes")
    grants = _token_grants(entry["tokens"], f"{path}.tokens") if "tokens" in entry else ()
    relays = entry.get("relays")
    if relays is not None:
        relays = {
            node: _patterns(patterns, f"{path}.relays.{node}")
            for node, patterns in _object(relays, f"{path}.relays").items()
        }
    return Identity(
        name, senders, admin, consumes, relays and MappingProxyType(relays), delegate, grants
    )


def _flag(entry: dict[str, Any], name: str, path: str) -> bool:
    value = entry.get(name, False)
    if not isinstance(value, bool):
        raise InvalidConfig(f"{AUTH_FILE}: {path}.{name} must be true or false")
    return value


_HEX = frozenset("0123456789abcdef")


def _token_grants(value: Any, path: str) -> tuple[TokenGrant, ...]:
    """Bearer tokens are kept as ``sha256:<64 lower-case hex>``, or as ``{"hash": that,
    "expires": "<ISO 8601 with its zone>"}`` for one that expires (edges/tokens.py)."""
    shape = (
        f"{AUTH_FILE}: {path} must be a list of 'sha256:<64 hex>' strings or "
        "{'hash': 'sha256:<64 hex>', 'expires': '<ISO 8601 time with zone>'} objects"
    )
    if not isinstance(value, list):
        raise InvalidConfig(shape)
    grants = []
    for item in value:
        digest, expires = (item, None) if isinstance(item, str) else _expiring(item, shape)
        if not (
            isinstance(digest, str)
            and digest.startswith("sha256:")
            and len(digest) == 71
            and set(digest[7:]) <= _HEX
        ):
            raise InvalidConfig(shape)
        grants.append(TokenGrant(digest, expires))
    return tuple(grants)


def _expiring(item: Any, shape: str) -> tuple[Any, int]:
    if not isinstance(item, dict) or set(item) != {"hash", "expires"}:
        raise InvalidConfig(shape)
    return item["hash"], expiry_ms(item["expires"], shape)


def expiry_ms(text: Any, problem: str = "an expiry") -> int:
    """An ISO 8601 time with its zone (``2026-12-27T05:00:00Z``) as unix ms."""
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise InvalidConfig(problem) from None
    if when.tzinfo is None:  # a local time would mean another instant on another host
        raise InvalidConfig(problem)
    return int(when.timestamp() * 1000)


def _patterns(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidConfig(f"{AUTH_FILE}: {path} must be a list of subject patterns")
    try:
        return tuple(validate(s, wildcards=True) for s in value)
    except RelayError as exc:
        raise InvalidConfig(f"{AUTH_FILE}: {path}: {exc}") from None
