"""One typed request per operation, checked once, where it is decoded.

A client's request arrives as a msgpack map (docs/protocol.md); `decode` turns its
fields into one of the records below or raises the error a client should see
(``invalid_message``, ``invalid_subject``, ``endpoint_not_found``), so an operation
works on fields it can trust. What needs the router's state to check (sender rights,
registered endpoints, limits from the configuration) is the operation's business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker.redrive import MAX_PER_REQUEST
from sdk.errors import EndpointNotFound, InvalidMessage
from sdk.ids import check_id, is_id
from sdk.paths import is_mailbox_name
from sdk.subjects import validate
from sdk.types import AccessRule, Envelope, Signal

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


MAX_HOLDING = 10_000  # claims a client may name as its own in one hello


@dataclass(frozen=True, slots=True)
class Hello:
    batch: bool  # replies of one pass batched into as few frames as possible
    session: str | None = None  # the token of the client's earlier session
    # (id, endpoint, deliveries, ack deadline ms or None) of each claim it holds
    holding: tuple[tuple[str, str, int, int | None], ...] = ()

    @classmethod
    def decode(cls, body: Body) -> Hello:
        session = _optional_text(body, "session")
        holding = body.get("holding") or []
        if not isinstance(holding, list) or len(holding) > MAX_HOLDING:
            raise InvalidMessage(
                f"request field 'holding' must be a list of at most {MAX_HOLDING} "
                "[id, endpoint, deliveries]"
            )
        held = []
        for item in holding:
            if not isinstance(item, list) or len(item) not in (3, 4):
                raise InvalidMessage(
                    "each of 'holding' must be [id, endpoint, deliveries] or [id, endpoint, "
                    "deliveries, ackWait]"
                )
            message_id, endpoint, deliveries, *rest = item
            fields = {"id": message_id, "endpoint": endpoint, "deliveries": deliveries}
            fields["ackWait"] = rest[0] if rest else None
            held.append(
                (
                    check_id(message_id),
                    _mailbox(fields),
                    _int(fields, "deliveries", minimum=1),
                    _ack_wait(fields),
                )
            )
        return cls(body.get("batch") is True, session, tuple(held))


class Publish(NamedTuple):
    """A NamedTuple, unlike the other requests: built for every publish, and a third
    of a frozen dataclass's cost (broker/publish.py, `Copy`)."""

    subject: str  # wildcards allowed: every endpoint it matches
    sender: str
    reply_to: str | None
    payload: Any
    parent_id: str | None  # a reply: the message it answers, whose budget it carries
    budget: Any  # the client's budget (wire form), clamped by the operation
    republished_from: str | None = None  # a dead letter's id: this publishes it again

    @classmethod
    def decode(cls, body: Body) -> Publish:
        subject = _subject(body, wildcards=True)
        sender = _text(body, "from")
        reply_to = _optional_text(body, "replyTo")
        if "payload" not in body:
            raise InvalidMessage("request field 'payload' is missing")
        parent = body.get("parentId")
        parent_id = None if parent is None else check_id(parent, "parentId")
        again = body.get("republishedFrom")
        republished_from = None if again is None else check_id(again, "republishedFrom")
        return cls(
            subject, sender, reply_to, body["payload"], parent_id, body.get("budget"),
            republished_from,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SubjectOnly:
    """unregister."""

    subject: str

    @classmethod
    def decode(cls, body: Body) -> SubjectOnly:
        return cls(_subject(body))


@dataclass(frozen=True, slots=True)
class Register:
    subject: str
    shared: bool | None  # None: as it is (node-local for a new endpoint)

    @classmethod
    def decode(cls, body: Body) -> Register:
        shared = body.get("shared")
        if shared is not None and not isinstance(shared, bool):
            raise InvalidMessage(f"request field 'shared' must be a boolean, got {shared!r:.40}")
        return cls(_subject(body), shared)


@dataclass(frozen=True, slots=True)
class Subscribe:
    pattern: str
    mode: str
    credit: int | None  # None: the configured default
    ack_wait: int | None = None  # ms a message may be held unanswered; None: forever

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
        return cls(pattern, mode, credit, _ack_wait(body))


def _ack_wait(body: Body) -> int | None:
    return None if body.get("ackWait") is None else _int(body, "ackWait", minimum=1)


MAX_FETCH_WAIT_MS = 300_000


@dataclass(frozen=True, slots=True)
class Fetch:
    pattern: str
    batch: int  # at most this many messages
    wait: int  # ms to wait for one when none waits
    ack_wait: int | None

    @classmethod
    def decode(cls, body: Body) -> Fetch:
        pattern = _subject(body, "pattern", wildcards=True)
        batch = _int(body, "batch", 10, minimum=1)
        wait = _int(body, "wait", 0, minimum=0)
        if wait > MAX_FETCH_WAIT_MS:
            raise InvalidMessage(f"request field 'wait' must be at most {MAX_FETCH_WAIT_MS} ms")
        return cls(pattern, batch, wait, _ack_wait(body))


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    sub: int

    @classmethod
    def decode(cls, body: Body) -> Unsubscribe:
        return cls(_int(body, "sub"))


# Not frozen, and its own __init__, compiled: one per answer (sdk/wire.py `Request`).
@dataclass(slots=True, init=False)
class Finish:
    """ack, nack, complete, fail, requeue: one message of one mailbox."""

    id: str
    endpoint: str  # the mailbox hash
    reason: str | None  # nack, fail: why (at most 1000 characters kept)
    deliveries: int | None  # the hand-out answered; None: whichever is held
    code: str | None  # nack: the dead letter's code (default "nack")

    def __init__(
        self,
        id: str,
        endpoint: str,
        reason: str | None,
        deliveries: int | None = None,
        code: str | None = None,
    ) -> None:
        self.id = id
        self.endpoint = endpoint
        self.reason = reason
        self.deliveries = deliveries
        self.code = code

    @classmethod
    def decode(cls, body: Body) -> Finish:
        message_id = check_id(body.get("id"))
        endpoint = _mailbox(body)
        reason = body.get("reason") or None
        if reason is not None and not isinstance(reason, str):
            raise InvalidMessage("request field 'reason' must be a string")
        deliveries = None if body.get("deliveries") is None else _int(body, "deliveries", minimum=1)
        code = _optional_text(body, "code")
        if code is not None and not _CODE_RE.fullmatch(code):
            raise InvalidMessage(f"request field 'code' must match {_CODE_RE.pattern}")
        return cls(message_id, endpoint, reason and reason[:1000], deliveries, code)


_CODE_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")


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
    id: str | None = None  # only the dead letters of this message

    @classmethod
    def decode(cls, body: Body) -> DeadLetters:
        message_id = None if body.get("id") is None else check_id(body.get("id"))
        return cls(body.get("endpoint"), _limit(body), message_id)


@dataclass(frozen=True, slots=True)
class RequeueDeadLetters:
    """One message's dead letters (``id``, in ``endpoint`` if given), or up to ``limit``
    of one endpoint's, in id order after ``after``."""

    endpoint: Any  # as in DeadLetters
    limit: int
    id: str | None = None
    after: str | None = None

    @classmethod
    def decode(cls, body: Body) -> RequeueDeadLetters:
        message_id = None if body.get("id") is None else check_id(body.get("id"))
        after = None if body.get("after") is None else check_id(body.get("after"), "after")
        if message_id is None and body.get("endpoint") is None:
            raise InvalidMessage("requeue_dead_letters needs an 'id' or an 'endpoint'")
        limit = _limit(body, maximum=MAX_PER_REQUEST)
        return cls(body.get("endpoint"), limit, message_id, after)


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


MAX_NODE_SUBJECTS = 10_000  # endpoints of one node in one request


@dataclass(frozen=True, slots=True)
class Ingest:
    """A message relayed from another node by a federation bridge (docs/federation.md):
    stored under its own id, with the budget it travelled with, on the local endpoints
    named in ``subjects``."""

    node: str  # the origin node, one subject token (the NATS subject it came on says it)
    subjects: tuple[str, ...]  # concrete endpoint subjects on this node
    envelope: Envelope  # id, from, replyTo, budget, createdAt, payload as published

    @classmethod
    def decode(cls, body: Body) -> Ingest:
        return cls(
            _node(body), _subjects(body), Envelope.from_wire(body.get("envelope"), path="envelope")
        )


def _node(body: Body) -> str:
    node = _text(body, "node")
    if "." in node or not node:
        raise InvalidMessage(f"request field 'node' must be one subject token, got {node!r:.40}")
    return validate(node)


def _subjects(body: Body, *, at_least: int = 1) -> tuple[str, ...]:
    subjects = body.get("subjects")
    if not isinstance(subjects, list) or not at_least <= len(subjects) <= MAX_NODE_SUBJECTS:
        raise InvalidMessage(
            f"request field 'subjects' must be a list of {at_least}..{MAX_NODE_SUBJECTS} subjects"
        )
    return tuple(dict.fromkeys(_subject({"s": s}, "s") for s in subjects))


@dataclass(frozen=True, slots=True)
class RemoteEndpoints:
    """A bridge tells its router every endpoint another node advertises."""

    node: str
    subjects: tuple[str, ...]  # the node's full list; empty: it advertises none

    @classmethod
    def decode(cls, body: Body) -> RemoteEndpoints:
        return cls(_node(body), _subjects(body, at_least=0))


@dataclass(frozen=True, slots=True)
class RelayTake:
    """A bridge asks for remote parts to publish to JetStream (held while none wait)."""

    node: str  # the local node's name in the federation
    limit: int
    # what the bridge sees, for `status`: the NATS server it is connected to and the
    # cluster's servers, and each node's lag (messages its consumer has not acked)
    cluster: dict[str, Any] | None = None

    @classmethod
    def decode(cls, body: Body) -> RelayTake:
        cluster = body.get("cluster")
        if cluster is not None and not (
            isinstance(cluster, dict)
            and isinstance(cluster.get("server"), str)
            and isinstance(cluster.get("servers", []), list)
            and isinstance(cluster.get("lag", {}), dict)
            and all(isinstance(v, int) for v in cluster.get("lag", {}).values())
        ):
            raise InvalidMessage(
                "request field 'cluster' must be {server, servers: [url], lag: {node: int}}"
            )
        return cls(_node(body), _limit(body, 100, 1000), cluster)


@dataclass(frozen=True, slots=True)
class Relayed:
    """A bridge's answer for remote parts: [token, node, error or None] each."""

    parts: tuple[tuple[int, str, str | None], ...]

    @classmethod
    def decode(cls, body: Body) -> Relayed:
        parts = body.get("parts")
        if not isinstance(parts, list) or len(parts) > 1000:
            raise InvalidMessage("request field 'parts' must be a list of at most 1000 parts")
        checked = []
        for part in parts:
            if not (
                isinstance(part, list | tuple)
                and len(part) == 3
                and isinstance(part[0], int)
                and isinstance(part[1], str)
                and (part[2] is None or isinstance(part[2], str))
            ):
                raise InvalidMessage(f"relayed part {part!r:.80} is not [token, node, error]")
            checked.append((part[0], part[1], part[2] and part[2][:1000]))
        return cls(tuple(checked))
