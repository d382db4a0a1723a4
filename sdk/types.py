"""The frozen value types of Relay and their wire form.

Each type has ``to_wire() -> dict`` (camelCase keys, as in docs/architecture.md) and a
``from_wire(d)`` classmethod that validates: a missing field, a wrong type or an unknown
enum value raises `InvalidMessage` naming the field by its wire path
(``budget.maxHops must be an int, got 'x'``); a malformed subject raises
`InvalidSubject`, prefixed the same way. Booleans are never accepted as numbers. The
keyword ``path`` of ``from_wire`` is the object's place in its parent, used in those
messages; it defaults to the object's usual wire name (``budget``, ``signal``, ``rule``...;
empty for an envelope, the root). The checks themselves are sdk/fields.py.

Decisions:

- Unknown keys are ignored, so an older reader accepts a newer writer's objects (the
  dead-letter file is an envelope plus ``deadLetter``, for instance).
- Constructors do not validate: Python callers are trusted, and the hot path builds many
  `Budget` copies. Everything that crosses a boundary (socket, file) goes through
  ``from_wire``/``from_json``.
- An envelope's ``subject`` is the concrete endpoint subject the copy was delivered to;
  the subject the publisher named (possibly a pattern) is ``publishedTo``.
- The payload is opaque but must be JSON-representable, because the message file is
  JSON: ``from_wire`` checks this (iteratively, so a deeply nested payload cannot blow
  the stack), and a bad payload is refused at the boundary instead of failing in a
  writer.

Nothing here imports the server side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Self

from sdk.errors import InvalidMessage
from sdk.fields import (
    as_mapping,
    check_json_value,
    check_kind,
    dumps_json,
    get_enum,
    get_field,
    get_strings,
    get_subject,
    is_kind,
    label_of,
    loads_json,
    valid_subject,
)
from sdk.ids import check_id
from sdk.subjects import is_valid

DEFAULT_MAX_HOPS = 5
DEFAULT_TTL_MS = 3_600_000
DEFAULT_CALL_BUDGET = 10


# --- Budget --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """The loop guard a message carries; it only ever shrinks (see broker/budget.py)."""

    hop_count: int
    max_hops: int
    ancestor_chain: tuple[str, ...]
    ttl: int  # absolute deadline, unix ms
    call_budget_remaining: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "hopCount": self.hop_count,
            "maxHops": self.max_hops,
            "ancestorChain": list(self.ancestor_chain),
            "ttl": self.ttl,
            "callBudgetRemaining": self.call_budget_remaining,
        }

    @classmethod
    def from_wire(cls, d: object, *, path: str = "budget") -> Self:
        d = as_mapping(d, path)
        chain = get_strings(d, "ancestorChain", path)
        for i, subject in enumerate(chain):
            valid_subject(subject, path, f"ancestorChain[{i}]")
        return cls(
            hop_count=get_field(d, "hopCount", int, path, minimum=0),
            max_hops=get_field(d, "maxHops", int, path, minimum=0),
            ancestor_chain=chain,
            ttl=get_field(d, "ttl", int, path, minimum=0),
            call_budget_remaining=get_field(d, "callBudgetRemaining", int, path, minimum=0),
        )


_BUDGET_OVERRIDES = {
    "hop_count": "hopCount",
    "max_hops": "maxHops",
    "ancestor_chain": "ancestorChain",
    "ttl": "ttl",
    "call_budget_remaining": "callBudgetRemaining",
}


def _optional_id(d: Mapping[str, Any], key: str, path: str) -> str | None:
    value = d.get(key)
    return None if value is None else check_id(value, label_of(path, key))


def default_budget(now_ms: int, **overrides: Any) -> Budget:
    """A fresh budget: 5 hops, TTL one hour from ``now_ms``, 10 calls.

    Overrides are snake_case field names; ``ttl_ms`` is a duration from ``now_ms``,
    ``ttl`` an absolute deadline (not both). The result is validated like a wire budget.
    """
    if not overrides:  # every publish without a budget: nothing to validate
        return Budget(0, DEFAULT_MAX_HOPS, (), now_ms + DEFAULT_TTL_MS, DEFAULT_CALL_BUDGET)
    wire: dict[str, Any] = {
        "hopCount": 0,
        "maxHops": DEFAULT_MAX_HOPS,
        "ancestorChain": [],
        "ttl": now_ms + DEFAULT_TTL_MS,
        "callBudgetRemaining": DEFAULT_CALL_BUDGET,
    }
    if "ttl_ms" in overrides:
        if "ttl" in overrides:
            raise InvalidMessage("budget: give ttl (a deadline) or ttl_ms (a duration), not both")
        ttl_ms = check_kind(overrides.pop("ttl_ms"), int, "budget.ttl_ms", minimum=0)
        wire["ttl"] = now_ms + ttl_ms
    for name, value in overrides.items():
        key = _BUDGET_OVERRIDES.get(name)
        if key is None:
            allowed = ", ".join([*_BUDGET_OVERRIDES, "ttl_ms"])
            raise InvalidMessage(f"unknown budget override {name!r}; known: {allowed}")
        wire[key] = list(value) if isinstance(value, tuple) else value
    return Budget.from_wire(wire)


# --- Envelope and dead letters ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message; its JSON form (`to_json`) is the message file's content."""

    id: str
    subject: str  # the endpoint subject this copy was delivered to
    sender: str  # "from" on the wire
    reply_to: str | None
    budget: Budget
    created_at: int  # unix ms
    payload: Any
    published_to: str | None = None  # the subject/pattern the publisher named, if different
    parent_id: str | None = None  # a reply: the id of the message it answers
    republished_from: str | None = None  # the dead letter's id, when this publishes it again
    # The node this copy was relayed from (docs/federation.md); None: published here.
    # Written by the router that stored it, never taken from a client.
    relayed_from: str | None = None
    # How many times this copy has been handed to a consumer, this time included (1 the
    # first time; 0: not handed out, as in a file or to an observer). Said by the
    # router with each hand-out, never in the file.
    deliveries: int = field(default=0, compare=False)

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "id": self.id,
            "subject": self.subject,
            "from": self.sender,
            "replyTo": self.reply_to,
            "budget": self.budget.to_wire(),
            "createdAt": self.created_at,
            "payload": self.payload,
        }
        if self.published_to is not None:
            wire["publishedTo"] = self.published_to
        if self.parent_id is not None:
            wire["parentId"] = self.parent_id
        if self.republished_from is not None:
            wire["republishedFrom"] = self.republished_from
        if self.relayed_from is not None:
            wire["relayedFrom"] = self.relayed_from
        return wire

    @classmethod
    def from_wire(
        cls, d: object, *, path: str = "", deliveries: int = 0, decoded: bool = False
    ) -> Self:
        """``decoded``: ``d`` comes from `loads_json`, which holds only JSON values, so
        the payload is not walked again."""
        d = as_mapping(d, path)
        if "payload" not in d:
            raise InvalidMessage(f"{label_of(path, 'payload')} is missing")
        payload = d["payload"]
        if not decoded:
            check_json_value(payload, label_of(path, "payload"))
        return cls(
            id=check_id(get_field(d, "id", str, path), label_of(path, "id")),
            subject=get_subject(d, "subject", path),
            sender=get_subject(d, "from", path),
            reply_to=get_subject(d, "replyTo", path, default=None),
            budget=Budget.from_wire(
                get_field(d, "budget", dict, path), path=label_of(path, "budget")
            ),
            created_at=get_field(d, "createdAt", int, path, minimum=0),
            payload=payload,
            published_to=get_subject(d, "publishedTo", path, wildcards=True, default=None),
            parent_id=_optional_id(d, "parentId", path),
            republished_from=_optional_id(d, "republishedFrom", path),
            relayed_from=get_subject(d, "relayedFrom", path, default=None),
            deliveries=deliveries,
        )

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON (non-ASCII kept as is): the message file format."""
        return dumps_json(self.to_wire())

    @classmethod
    def from_json(cls, data: bytes, *, deliveries: int = 0) -> Self:
        """A message file's envelope; ``deliveries``: the hand-out its push named."""
        return cls.from_wire(loads_json(data), deliveries=deliveries, decoded=True)


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """Why and when a message was dead-lettered; ``deadLetter`` in a file in ``failed/``."""

    reason: str  # for people: "max hops exceeded (5/5)"
    code: str  # stable: hop_limit, cycle_detected, no_match, access_denied, nack, ...
    failed_at: int  # unix ms
    endpoint: str  # endpoint hash, or "_unroutable"
    # How many times the copy had been handed to a consumer when it failed; written
    # only when it was (a dead letter made at publish time was never handed out).
    deliveries: int = 0

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "reason": self.reason,
            "code": self.code,
            "failedAt": self.failed_at,
            "endpoint": self.endpoint,
        }
        if self.deliveries:
            wire["deliveries"] = self.deliveries
        return wire

    @classmethod
    def from_wire(cls, d: object, *, path: str = "deadLetter") -> Self:
        d = as_mapping(d, path)
        return cls(
            reason=get_field(d, "reason", str, path),
            code=get_field(d, "code", str, path),
            failed_at=get_field(d, "failedAt", int, path, minimum=0),
            endpoint=get_field(d, "endpoint", str, path),
            deliveries=get_field(d, "deliveries", int, path, default=0, minimum=0),
        )


def dead_letter_json(envelope: Envelope | Mapping[str, Any], info: DeadLetterInfo) -> bytes:
    """The content of a file in ``failed/``: the envelope plus ``deadLetter``.

    Takes a wire dict too, so a message that never became a valid `Envelope` can still
    be kept as it came.
    """
    wire = envelope.to_wire() if isinstance(envelope, Envelope) else dict(envelope)
    wire["deadLetter"] = info.to_wire()
    return dumps_json(wire)


def relayed_from(data: bytes) -> str | None:
    """The node a stored copy was relayed from (its file's ``relayedFrom``); None when
    it was published on this node."""
    wire = loads_json(data)
    origin = wire.get("relayedFrom") if isinstance(wire, dict) else None
    return origin if isinstance(origin, str) else None


def parse_message_file(data: bytes) -> tuple[Envelope, DeadLetterInfo | None]:
    """Read a message file from any Maildir state; the info is set for dead letters."""
    wire = loads_json(data)
    envelope = Envelope.from_wire(wire)
    dead = wire.get("deadLetter")
    return envelope, (None if dead is None else DeadLetterInfo.from_wire(dead))


# --- Signals ---------------------------------------------------------------------------------


class SignalType(StrEnum):
    TYPING = "typing"
    PRESENCE = "presence"
    READ_RECEIPT = "read_receipt"
    DELIVERY_RECEIPT = "delivery_receipt"
    PROGRESS = "progress"
    BACKPRESSURE = "backpressure"


_SIGNAL_TYPES: Mapping[str, SignalType] = {t.value: t for t in SignalType}


@dataclass(frozen=True, slots=True)
class Signal:
    """Ephemeral state ("typing", "backpressure: warning"); never written to disk."""

    type: SignalType
    state: str
    endpoint_subject: str
    timestamp: int  # unix ms
    data: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return _signal_wire(self.type, self.state, self.endpoint_subject, self.timestamp, self.data)

    @classmethod
    def from_wire(cls, d: object, *, path: str = "signal") -> Self:
        return cls(*_signal_fields(d, path))

    @staticmethod
    def checked_wire(d: object, *, path: str = "signal") -> dict[str, Any]:
        """``Signal.from_wire(d).to_wire()`` without building the Signal: what the router
        forwards, checked as `from_wire` checks it and with no field it does not know."""
        return _signal_wire(*_signal_fields(d, path))


def _signal_wire(
    kind: SignalType, state: str, endpoint_subject: str, timestamp: int, data: dict | None
) -> dict[str, Any]:
    wire = {
        "type": str(kind),  # a SignalType, or the plain str a caller built a Signal with
        "state": state,
        "endpointSubject": endpoint_subject,
        "timestamp": timestamp,
    }
    if data is not None:
        wire["data"] = data
    return wire


def _signal_fields(d: object, path: str) -> tuple[SignalType, str, str, int, dict | None]:
    if type(d) is dict:  # the common, valid case in one pass: signals come in bursts
        name = d.get("type")
        kind = _SIGNAL_TYPES.get(name) if type(name) is str else None
        state, subject = d.get("state"), d.get("endpointSubject")
        timestamp, data = d.get("timestamp"), d.get("data")
        if (
            kind is not None
            and type(state) is str
            and type(timestamp) is int
            and timestamp >= 0
            and (data is None or type(data) is dict)
            and type(subject) is str
            and is_valid(subject)
        ):
            return kind, state, subject, timestamp, data
    d = as_mapping(d, path)  # the checks one by one, naming what is wrong
    return (
        get_enum(d, "type", SignalType, path),
        get_field(d, "state", str, path),
        get_subject(d, "endpointSubject", path),
        get_field(d, "timestamp", int, path, minimum=0),
        get_field(d, "data", dict, path, default=None),
    )


# --- Access rules ----------------------------------------------------------------------------


class RuleAction(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class AccessRule:
    """``from`` and ``to`` are patterns; highest priority first, first match wins."""

    from_pattern: str
    to_pattern: str
    action: RuleAction
    priority: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "from": self.from_pattern,
            "to": self.to_pattern,
            "action": str(self.action),
            "priority": self.priority,
        }

    @classmethod
    def from_wire(cls, d: object, *, path: str = "rule") -> Self:
        d = as_mapping(d, path)
        return cls(
            from_pattern=get_subject(d, "from", path, wildcards=True),
            to_pattern=get_subject(d, "to", path, wildcards=True),
            action=get_enum(d, "action", RuleAction, path),
            priority=get_field(d, "priority", int, path, default=0),
        )


# --- Standard payload --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StandardPayload:
    """The payload schema the SDK offers agents; the broker never looks inside a payload.

    ``to_wire`` leaves out fields that are unset (None, no attachments).
    """

    content: str
    sender_name: str | None = None
    channel: str | None = None
    attachments: tuple[str, ...] = ()  # file paths
    performative: str | None = None
    conversation_id: str | None = None
    correlation_id: str | None = None
    platform_data: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"content": self.content}
        for key, value in (
            ("senderName", self.sender_name),
            ("channel", self.channel),
            ("attachments", list(self.attachments) or None),
            ("performative", self.performative),
            ("conversationId", self.conversation_id),
            ("correlationId", self.correlation_id),
            ("platformData", self.platform_data),
        ):
            if value is not None:
                wire[key] = value
        return wire

    @classmethod
    def from_wire(cls, d: object, *, path: str = "payload") -> Self:
        d = as_mapping(d, path)
        return cls(
            content=get_field(d, "content", str, path),
            sender_name=get_field(d, "senderName", str, path, default=None),
            channel=get_field(d, "channel", str, path, default=None),
            attachments=get_strings(d, "attachments", path, default=()),
            performative=get_field(d, "performative", str, path, default=None),
            conversation_id=get_field(d, "conversationId", str, path, default=None),
            correlation_id=get_field(d, "correlationId", str, path, default=None),
            platform_data=get_field(d, "platformData", dict, path, default=None),
        )


# --- Endpoints and publish results -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    subject: str
    hash: str  # first 12 hex chars of sha256(subject): the mailbox directory name
    maildir_path: str
    registered_at: int  # unix ms
    shared: bool = False  # advertised to other nodes by the federation bridge

    def to_wire(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "hash": self.hash,
            "maildirPath": self.maildir_path,
            "registeredAt": self.registered_at,
            "shared": self.shared,
        }

    @classmethod
    def from_wire(cls, d: object, *, path: str = "endpoint") -> Self:
        d = as_mapping(d, path)
        digest = get_field(d, "hash", str, path)
        if len(digest) != 12 or digest.strip("0123456789abcdef"):
            raise InvalidMessage(
                f"{label_of(path, 'hash')} must be 12 lowercase hex characters, got {digest!r:.60}"
            )
        return cls(
            subject=get_subject(d, "subject", path),
            hash=digest,
            maildir_path=get_field(d, "maildirPath", str, path),
            registered_at=get_field(d, "registeredAt", int, path, minimum=0),
            shared=get_field(d, "shared", bool, path, default=False),
        )


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a publish did: copies stored, endpoints refused and why, mailbox pressure.

    ``rejected`` holds ``(endpoint hash, reason)`` pairs (``"*"`` for a whole-publish
    rejection such as rate_limited); ``mailbox_pressure`` maps each touched endpoint hash
    to its depth ratio, 0.0-1.0. Both are made immutable on construction.
    """

    message_id: str
    delivered_to: int
    rejected: tuple[tuple[str, str], ...] = ()
    mailbox_pressure: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    # A sentence per rejected key: "max hops exceeded (5/5)".
    details: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # Copies on other nodes (docs/federation.md), by node: the endpoint subjects whose copy
    # JetStream has acknowledged, pending on that node (counted in delivered_to).
    remote: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "rejected", tuple(tuple(pair) for pair in self.rejected))
        remote = {node: tuple(subjects) for node, subjects in self.remote.items()}
        object.__setattr__(self, "remote", MappingProxyType(remote))
        for name in ("mailbox_pressure", "details"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    def to_wire(self) -> dict[str, Any]:
        return {
            "messageId": self.message_id,
            "deliveredTo": self.delivered_to,
            "rejected": [list(pair) for pair in self.rejected],
            "mailboxPressure": dict(self.mailbox_pressure),
            "details": dict(self.details),
        } | ({"remote": {n: list(s) for n, s in self.remote.items()}} if self.remote else {})

    @classmethod
    def from_wire(cls, d: object, *, path: str = "result") -> Self:
        # Every publish's reply comes through here: the labels of the errors are built
        # only for an error.
        d = as_mapping(d, path)
        rejected = []
        for i, pair in enumerate(get_field(d, "rejected", list, path, default=[])):
            label = f"{label_of(path, 'rejected')}[{i}]"
            if not (isinstance(pair, list | tuple) and len(pair) == 2):
                raise InvalidMessage(f"{label} must be a [hash, reason] pair, got {pair!r:.60}")
            rejected.append(
                (check_kind(pair[0], str, f"{label}[0]"), check_kind(pair[1], str, f"{label}[1]"))
            )
        pressure = _string_keyed(d, "mailboxPressure", float, path)
        details = _string_keyed(d, "details", str, path)
        remote: dict[str, tuple[str, ...]] = {}
        for node, subjects in get_field(d, "remote", dict, path, default={}).items():
            label = label_of(path, "remote")
            check_kind(node, str, f"{label} key")
            remote[node] = tuple(
                check_kind(s, str, f"{label}.{node}[]") for s in check_kind(subjects, list, label)
            )
        return cls(
            message_id=check_id(get_field(d, "messageId", str, path), label_of(path, "messageId")),
            delivered_to=get_field(d, "deliveredTo", int, path, minimum=0),
            rejected=tuple(rejected),
            mailbox_pressure=MappingProxyType({k: float(v) for k, v in pressure.items()}),
            details=MappingProxyType(dict(details)),
            remote=remote,
        )


def _string_keyed(d: Mapping[str, Any], name: str, kind: type, path: str) -> dict[str, Any]:
    """``d[name]``, an object (default empty) of string keys to values of ``kind``."""
    value = get_field(d, name, dict, path, default={})
    for k, v in value.items():
        if type(k) is not str or not is_kind(v, kind):
            label = label_of(path, name)
            check_kind(k, str, f"{label} key")
            check_kind(v, kind, f"{label}.{k}")
    return value
