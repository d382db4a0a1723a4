"""The frozen value types of Relay and their wire form.

Each type has ``to_wire() -> dict`` (camelCase keys, as in docs/architecture.md) and a
``from_wire(d)`` classmethod that validates: a missing field, a wrong type or an unknown
enum value raises `InvalidMessage` naming the field by its wire path
(``budget.maxHops must be an int, got 'x'``); a malformed subject raises
`InvalidSubject`, prefixed the same way. Booleans are never accepted as numbers. The
keyword ``path`` of ``from_wire`` is the object's place in its parent, used in those
messages; it defaults to the object's usual wire name (``budget``, ``signal``, ``rule``...;
empty for an envelope, the root).

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

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Self

from sdk.errors import InvalidMessage, InvalidSubject
from sdk.ids import check_id
from sdk.subjects import is_valid, validate

DEFAULT_MAX_HOPS = 5
DEFAULT_TTL_MS = 3_600_000
DEFAULT_CALL_BUDGET = 10

# --- validation helpers ------------------------------------------------------------------

_MISSING: Any = object()
_KIND_NAMES = {
    int: "an int",
    float: "a number",
    str: "a string",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
}


def _label(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _is(value: object, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:  # "a number": ints are numbers too
        return isinstance(value, int | float)
    return isinstance(value, kind)


def _check(value: Any, kind: type, label: str, *, minimum: int | None = None) -> Any:
    if not _is(value, kind):
        raise InvalidMessage(f"{label} must be {_KIND_NAMES[kind]}, got {value!r:.60}")
    if minimum is not None and value < minimum:
        raise InvalidMessage(f"{label} must be >= {minimum}, got {value!r}")
    return value


def _field(
    d: Mapping[str, Any],
    name: str,
    kind: type,
    path: str,
    *,
    default: Any = _MISSING,
    minimum: int | None = None,
) -> Any:
    """``d[name]`` checked against ``kind``; with a ``default``, missing or null gives it."""
    value = d.get(name, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise InvalidMessage(f"{_label(path, name)} is missing")
        return default
    if type(value) is kind and (minimum is None or value >= minimum):
        return value  # the common case, without building a label
    return _check(value, kind, _label(path, name), minimum=minimum)


def _subject(
    d: Mapping[str, Any],
    name: str,
    path: str,
    *,
    wildcards: bool = False,
    default: Any = _MISSING,
) -> Any:
    value = _field(d, name, str, path, default=default)
    if value is not default:
        _valid_subject(value, path, name, wildcards)
    return value


def _valid_subject(value: str, path: str, name: str, wildcards: bool = False) -> str:
    try:
        return validate(value, wildcards=wildcards)
    except InvalidSubject as err:
        raise InvalidSubject(f"{_label(path, name)}: {err.message}") from None


def _mapping(d: object, path: str) -> Mapping[str, Any]:
    if type(d) is not dict and not isinstance(d, Mapping):  # dict: skip the ABC check
        raise InvalidMessage(f"{path or 'message'} must be an object, got {d!r:.60}")
    return d


def _enum(d: Mapping[str, Any], name: str, enum: type[StrEnum], path: str) -> Any:
    value = _field(d, name, str, path)
    member = enum._value2member_map_.get(value)  # what enum(value) finds, without its cost
    if member is not None:
        return member
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(enum)
        raise InvalidMessage(
            f"{_label(path, name)} must be one of {allowed}; got {value!r:.60}"
        ) from None


def _strings(d: Mapping[str, Any], name: str, path: str, *, default: Any = _MISSING) -> Any:
    items = _field(d, name, list, path, default=default)
    if items is default:
        return default
    for i, item in enumerate(items):
        if type(item) is not str:
            _check(item, str, f"{_label(path, name)}[{i}]")
    return tuple(items)


def _check_json_value(value: object, label: str) -> None:
    """Refuse what JSON cannot hold: non-string keys, bytes, NaN, sets, objects...

    Iterative, and a location is a cheap linked tuple turned into text only for the error,
    so a payload of 100,000 numbers costs no 100,000 label strings.
    """
    stack: list[tuple[object, Any]] = [(value, None)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, str | bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidMessage(f"{_where(label, where)} must be a finite number, got {item}")
        elif isinstance(item, list | tuple):
            stack.extend((v, (where, i)) for i, v in enumerate(item))
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise InvalidMessage(
                        f"{_where(label, where)} keys must be strings, got {k!r:.60}"
                    )
                stack.append((v, (where, k)))
        else:
            raise InvalidMessage(
                f"{_where(label, where)} must be JSON-representable, got {type(item).__name__}"
            )


def _where(label: str, where: Any) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return label + "".join(reversed(keys))


def _dumps(obj: object) -> bytes:
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError) as err:  # UnicodeEncodeError is a ValueError
        raise InvalidMessage(f"message is not JSON-representable: {err}") from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _loads(data: bytes) -> Mapping[str, Any]:
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, TypeError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidMessage(f"message file is not valid JSON: {err}") from None
    return _mapping(obj, "message file")


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
        d = _mapping(d, path)
        chain = _strings(d, "ancestorChain", path)
        for i, subject in enumerate(chain):
            _valid_subject(subject, path, f"ancestorChain[{i}]")
        return cls(
            hop_count=_field(d, "hopCount", int, path, minimum=0),
            max_hops=_field(d, "maxHops", int, path, minimum=0),
            ancestor_chain=chain,
            ttl=_field(d, "ttl", int, path, minimum=0),
            call_budget_remaining=_field(d, "callBudgetRemaining", int, path, minimum=0),
        )


_BUDGET_OVERRIDES = {
    "hop_count": "hopCount",
    "max_hops": "maxHops",
    "ancestor_chain": "ancestorChain",
    "ttl": "ttl",
    "call_budget_remaining": "callBudgetRemaining",
}


def default_budget(now_ms: int, **overrides: Any) -> Budget:
    """A fresh budget: 5 hops, TTL one hour from ``now_ms``, 10 calls.

    Overrides are snake_case field names; ``ttl_ms`` is a duration from ``now_ms``,
    ``ttl`` an absolute deadline (not both). The result is validated like a wire budget.
    """
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
        ttl_ms = _check(overrides.pop("ttl_ms"), int, "budget.ttl_ms", minimum=0)
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
        return wire

    @classmethod
    def from_wire(cls, d: object, *, path: str = "") -> Self:
        d = _mapping(d, path)
        if "payload" not in d:
            raise InvalidMessage(f"{_label(path, 'payload')} is missing")
        payload = d["payload"]
        _check_json_value(payload, _label(path, "payload"))
        return cls(
            id=check_id(_field(d, "id", str, path), _label(path, "id")),
            subject=_subject(d, "subject", path),
            sender=_subject(d, "from", path),
            reply_to=_subject(d, "replyTo", path, default=None),
            budget=Budget.from_wire(_field(d, "budget", dict, path), path=_label(path, "budget")),
            created_at=_field(d, "createdAt", int, path, minimum=0),
            payload=payload,
            published_to=_subject(d, "publishedTo", path, wildcards=True, default=None),
        )

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON (non-ASCII kept as is): the message file format."""
        return _dumps(self.to_wire())

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        return cls.from_wire(_loads(data))


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """Why and when a message was dead-lettered; ``deadLetter`` in a file in ``failed/``."""

    reason: str  # for people: "max hops exceeded (5/5)"
    code: str  # stable: hop_limit, cycle_detected, no_match, access_denied, nack, ...
    failed_at: int  # unix ms
    endpoint: str  # endpoint hash, or "_unroutable"

    def to_wire(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "code": self.code,
            "failedAt": self.failed_at,
            "endpoint": self.endpoint,
        }

    @classmethod
    def from_wire(cls, d: object, *, path: str = "deadLetter") -> Self:
        d = _mapping(d, path)
        return cls(
            reason=_field(d, "reason", str, path),
            code=_field(d, "code", str, path),
            failed_at=_field(d, "failedAt", int, path, minimum=0),
            endpoint=_field(d, "endpoint", str, path),
        )


def dead_letter_json(envelope: Envelope | Mapping[str, Any], info: DeadLetterInfo) -> bytes:
    """The content of a file in ``failed/``: the envelope plus ``deadLetter``.

    Takes a wire dict too, so a message that never became a valid `Envelope` can still
    be kept as it came.
    """
    wire = envelope.to_wire() if isinstance(envelope, Envelope) else dict(envelope)
    wire["deadLetter"] = info.to_wire()
    return _dumps(wire)


def parse_message_file(data: bytes) -> tuple[Envelope, DeadLetterInfo | None]:
    """Read a message file from any Maildir state; the info is set for dead letters."""
    wire = _loads(data)
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
        kind = SignalType._value2member_map_.get(name) if type(name) is str else None
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
    d = _mapping(d, path)  # the checks one by one, naming what is wrong
    return (
        _enum(d, "type", SignalType, path),
        _field(d, "state", str, path),
        _subject(d, "endpointSubject", path),
        _field(d, "timestamp", int, path, minimum=0),
        _field(d, "data", dict, path, default=None),
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
        d = _mapping(d, path)
        return cls(
            from_pattern=_subject(d, "from", path, wildcards=True),
            to_pattern=_subject(d, "to", path, wildcards=True),
            action=_enum(d, "action", RuleAction, path),
            priority=_field(d, "priority", int, path, default=0),
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
        d = _mapping(d, path)
        return cls(
            content=_field(d, "content", str, path),
            sender_name=_field(d, "senderName", str, path, default=None),
            channel=_field(d, "channel", str, path, default=None),
            attachments=_strings(d, "attachments", path, default=()),
            performative=_field(d, "performative", str, path, default=None),
            conversation_id=_field(d, "conversationId", str, path, default=None),
            correlation_id=_field(d, "correlationId", str, path, default=None),
            platform_data=_field(d, "platformData", dict, path, default=None),
        )


# --- Endpoints and publish results -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    subject: str
    hash: str  # first 12 hex chars of sha256(subject): the mailbox directory name
    maildir_path: str
    registered_at: int  # unix ms

    def to_wire(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "hash": self.hash,
            "maildirPath": self.maildir_path,
            "registeredAt": self.registered_at,
        }

    @classmethod
    def from_wire(cls, d: object, *, path: str = "endpoint") -> Self:
        d = _mapping(d, path)
        digest = _field(d, "hash", str, path)
        if len(digest) != 12 or digest.strip("0123456789abcdef"):
            raise InvalidMessage(
                f"{_label(path, 'hash')} must be 12 lowercase hex characters, got {digest!r:.60}"
            )
        return cls(
            subject=_subject(d, "subject", path),
            hash=digest,
            maildir_path=_field(d, "maildirPath", str, path),
            registered_at=_field(d, "registeredAt", int, path, minimum=0),
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "rejected", tuple(tuple(pair) for pair in self.rejected))
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
        }

    @classmethod
    def from_wire(cls, d: object, *, path: str = "result") -> Self:
        d = _mapping(d, path)
        rejected = []
        label = _label(path, "rejected")
        for i, pair in enumerate(_field(d, "rejected", list, path, default=[])):
            if not (isinstance(pair, list | tuple) and len(pair) == 2):
                raise InvalidMessage(
                    f"{label}[{i}] must be a [hash, reason] pair, got {pair!r:.60}"
                )
            rejected.append(
                (_check(pair[0], str, f"{label}[{i}][0]"), _check(pair[1], str, f"{label}[{i}][1]"))
            )
        label = _label(path, "mailboxPressure")
        pressure = {
            _check(k, str, f"{label} key"): float(_check(v, float, f"{label}.{k}"))
            for k, v in _field(d, "mailboxPressure", dict, path, default={}).items()
        }
        label = _label(path, "details")
        details = {
            _check(k, str, f"{label} key"): _check(v, str, f"{label}.{k}")
            for k, v in _field(d, "details", dict, path, default={}).items()
        }
        return cls(
            message_id=check_id(_field(d, "messageId", str, path), _label(path, "messageId")),
            delivered_to=_field(d, "deliveredTo", int, path, minimum=0),
            rejected=tuple(rejected),
            mailbox_pressure=pressure,
            details=details,
        )
