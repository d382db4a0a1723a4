"""One typed request per operation, checked once, where it is decoded.

A client's request arrives as a msgpack map (docs/protocol.md); `decode` turns its
fields into one of the records below or raises the error a client should see
(``invalid_message``, ``invalid_subject``, ``endpoint_not_found``), so an operation
works on fields it can trust. What needs the router's state to check (sender rights,
registered endpoints, limits from the configuration) is the operation's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdk.errors import EndpointNotFound, InvalidMessage
from sdk.ids import check_id, is_id
from sdk.paths import is_mailbox_name
from sdk.subjects import validate
from sdk.types import AccessRule, Signal

Body = dict[str, Any]


# ---------------------------------------------------------------------- field readers


def _text(body: Body, name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise InvalidMessage(f"request field {name!r} must be a string, got {value!r:.40}")
    return value


def _optional_text(body: Body, name: str) -> str | None:
    return None if body.get(name) is None else _text(body, name)


def _subject(body: Body, name: str = "subject", *, wildcards: bool = False) -> str:
    return validate(_text(body, name), wildcards=wildcards)


def _int(body: Body, name: str, default: int | None = None, *, minimum: int | None = None) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidMessage(f"request field {name!r} must be an int, got {value!r:.40}")
    if minimum is not None and value < minimum:
        raise InvalidMessage(f"request field {name!r} must be an int >= {minimum}")
    return value


def _limit(body: Body, default: int = 100, maximum: int = 1000) -> int:
    limit = body.get("limit", default)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= maximum:
        raise InvalidMessage(f"request field 'limit' must be an int in 1..{maximum}")
    return limit


def _mailbox(body: Body) -> str:
    endpoint = body.get("endpoint")
    if not isinstance(endpoint, str) or not is_mailbox_name(endpoint):
        raise EndpointNotFound(f"no endpoint {endpoint!r:.60} (give its 12-hex hash)")
    return endpoint


# ---------------------------------------------------------------------- the requests


@dataclass(frozen=True, slots=True)
class Empty:
    """An operation without fields (endpoints, status, list_rules, ...)."""

    @classmethod
    def decode(cls, body: Body) -> Empty:
        return _EMPTY


_EMPTY = Empty()


@dataclass(frozen=True, slots=True)
class Hello:
    batch: bool  # replies of one pass batched into as few frames as possible

    @classmethod
    def decode(cls, body: Body) -> Hello:
        return cls(body.get("batch") is True)


@dataclass(frozen=True, slots=True)
class Publish:
    subject: str  # wildcards allowed: every endpoint it matches
    sender: str
    reply_to: str | None
    payload: Any
    parent_id: str | None  # a reply: the message it answers, whose budget it carries
    budget: Any  # the client's budget (wire form), clamped by the operation

    @classmethod
    def decode(cls, body: Body) -> Publish:
        subject = _subject(body, wildcards=True)
        sender = _text(body, "from")
        reply_to = _optional_text(body, "replyTo")
        if "payload" not in body:
            raise InvalidMessage("request field 'payload' is missing")
        parent = body.get("parentId")
        parent_id = None if parent is None else check_id(parent, "parentId")
        return cls(subject, sender, reply_to, body["payload"], parent_id, body.get("budget"))


@dataclass(frozen=True, slots=True)
class SubjectOnly:
    """register, unregister."""

    subject: str

    @classmethod
    def decode(cls, body: Body) -> SubjectOnly:
        return cls(_subject(body))


@dataclass(frozen=True, slots=True)
class Subscribe:
    pattern: str
    mode: str
    credit: int | None  # None: the configured default

    @classmethod
    def decode(cls, body: Body) -> Subscribe:
        pattern = _subject(body, "pattern", wildcards=True)
        mode = body.get("mode", "consume")
        if mode not in ("consume", "observe"):
            raise InvalidMessage(
                f"request field 'mode' must be 'consume' or 'observe', got {mode!r:.40}"
            )
        credit = body.get("credit")
        if credit is not None and (
            not isinstance(credit, int) or isinstance(credit, bool) or credit < 1
        ):
            raise InvalidMessage(f"request field 'credit' must be a positive int, got {credit!r}")
        return cls(pattern, mode, credit)


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    sub: int

    @classmethod
    def decode(cls, body: Body) -> Unsubscribe:
        return cls(_int(body, "sub"))


@dataclass(frozen=True, slots=True)
class Finish:
    """ack, nack, complete, fail, requeue: one message of one mailbox."""

    id: str
    endpoint: str  # the mailbox hash
    reason: str | None  # nack, fail: why (at most 1000 characters kept)

    @classmethod
    def decode(cls, body: Body) -> Finish:
        message_id = check_id(body.get("id"))
        endpoint = _mailbox(body)
        reason = body.get("reason") or None
        if reason is not None and not isinstance(reason, str):
            raise InvalidMessage("request field 'reason' must be a string")
        return cls(message_id, endpoint, reason and reason[:1000])


@dataclass(frozen=True, slots=True)
class SendSignal:
    subject: str
    signal: dict[str, Any]
    sender: str | None
    reply: bool  # False: no answer at all, a refusal is only logged

    @classmethod
    def decode(cls, body: Body) -> SendSignal:
        subject = _subject(body)
        signal = Signal.checked_wire(body.get("signal"))
        return cls(subject, signal, _optional_text(body, "from"), body.get("reply") is not False)


@dataclass(frozen=True, slots=True)
class DeadLetters:
    endpoint: Any  # a subject or a mailbox hash, resolved by the operation; None: all
    limit: int

    @classmethod
    def decode(cls, body: Body) -> DeadLetters:
        return cls(body.get("endpoint"), _limit(body))


@dataclass(frozen=True, slots=True)
class Purge:
    endpoint: Any  # as in DeadLetters

    @classmethod
    def decode(cls, body: Body) -> Purge:
        return cls(body.get("endpoint"))


MAX_COMPACT_ITEMS = 10_000  # per compact_remove request (~0.5 MB of msgpack)


@dataclass(frozen=True, slots=True)
class CompactRemove:
    items: list[list[str]]  # [id, mailbox hash] pairs
    checkpoint: bool
    vacuum_pages: int

    @classmethod
    def decode(cls, body: Body) -> CompactRemove:
        items = body.get("items", [])
        if not isinstance(items, list) or len(items) > MAX_COMPACT_ITEMS:
            raise InvalidMessage(
                f"request field 'items' must be a list of at most {MAX_COMPACT_ITEMS} "
                "[id, endpoint] pairs"
            )
        for item in items:
            if not (
                isinstance(item, list | tuple)
                and len(item) == 2
                and is_id(item[0])
                and isinstance(item[1], str)
                and is_mailbox_name(item[1])
            ):
                raise InvalidMessage(f"compact_remove item {item!r:.80} is not [id, endpoint]")
        vacuum_pages = _int(body, "vacuumPages", 0, minimum=0)
        return cls([list(i) for i in items], bool(body.get("checkpoint", False)), vacuum_pages)


@dataclass(frozen=True, slots=True)
class PendingOf:
    subject: str
    limit: int

    @classmethod
    def decode(cls, body: Body) -> PendingOf:
        return cls(_subject(body), _limit(body))


@dataclass(frozen=True, slots=True)
class AddRule:
    rule: AccessRule

    @classmethod
    def decode(cls, body: Body) -> AddRule:
        return cls(AccessRule.from_wire(body.get("rule")))


@dataclass(frozen=True, slots=True)
class RemoveRule:
    sender: str
    subject: str

    @classmethod
    def decode(cls, body: Body) -> RemoveRule:
        return cls(_text(body, "from"), _text(body, "to"))


@dataclass(frozen=True, slots=True)
class SetConfig:
    config: dict[str, Any]  # a partial configuration, merged and checked by control.db

    @classmethod
    def decode(cls, body: Body) -> SetConfig:
        partial = body.get("config")
        if not isinstance(partial, dict):
            raise InvalidMessage("request field 'config' must be a map")
        return cls(partial)


@dataclass(frozen=True, slots=True)
class Trace:
    id: str

    @classmethod
    def decode(cls, body: Body) -> Trace:
        return cls(check_id(body.get("id")))
