"""The publish pipeline as a pure function: what to store where, and why not elsewhere.

`plan_publish` runs the per-target policies in the declared order and returns a
`PublishPlan`: one `Copy` per target endpoint, each a delivery into ``new/``, a dead
letter into ``failed/`` with its reason, or a refusal that writes nothing. No I/O
happens here; the router sends the plan to the writers. The per-sender rate limit runs
before this, once per publish. Order of the checks, per target endpoint:

1. access rule for (sender, target)      -> dead letter ``access_denied``
2. the router's gate: backpressure, then the circuit breaker
                                         -> refusal ``backpressure`` / ``circuit_open``
                                            (reliability: never a dead letter)
3. budget (hops, cycle, TTL, calls)      -> dead letter ``budget_exceeded`` (its code
                                            says which: hop_limit, cycle_detected, ...)

A publish that matches no endpoint is one dead letter in the ``_unroutable`` mailbox
with code ``no_match``. The file bytes of each copy are built here, by splicing the
payload's JSON, encoded once, into each copy's envelope: a fan-out to ten endpoints
encodes the payload once, not ten times.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from json.encoder import (  # type: ignore[attr-defined]  # not in typeshed
    c_make_encoder,
    encode_basestring,
    encode_basestring_ascii,
)
from typing import Any, NamedTuple

from broker.budget import check_budget
from broker.rules import RuleSet
from sdk.errors import InvalidMessage, PayloadTooLarge
from sdk.paths import UNROUTABLE
from sdk.types import Budget, DeadLetterInfo, EndpointInfo

NO_MATCH_REASON = "no matching endpoints"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A reliability rejection: reported to the publisher, nothing written."""

    reason: str  # backpressure | circuit_open
    detail: str  # "backpressure: mailbox full (1000/1000)"


# Copy, PublishRequest and PublishPlan are built for every publish: NamedTuples, as
# immutable as a frozen dataclass and a third of its cost to build (a frozen dataclass
# sets each field through object.__setattr__: 1.1 against 0.3 µs for PublishRequest;
# `python -m bench.publish_cost`, docs/performance.md "Fewer objects per publish, and mypyc").
class Copy(NamedTuple):
    endpoint: str  # hash, or UNROUTABLE
    subject: str  # endpoint subject (the published subject for UNROUTABLE)
    data: bytes  # the message file (empty for a refusal)
    dead: DeadLetterInfo | None = None  # set when this copy is a dead letter
    refusal: Refusal | None = None  # set when this copy is refused
    probe: bool = False  # a half-open breaker's probe: its write outcome is the probe's

    @property
    def delivered(self) -> bool:
        return self.dead is None and self.refusal is None

    @property
    def rejection(self) -> tuple[str, str, str] | None:
        """(endpoint, reason, detail) the publisher sees, or None for a delivery."""
        key = "*" if self.endpoint == UNROUTABLE else self.endpoint
        if self.refusal is not None:
            return key, self.refusal.reason, self.refusal.detail
        if self.dead is not None:
            return key, _CATEGORY.get(self.dead.code, self.dead.code), self.dead.reason
        return None


# The reasons a PublishResult names are categories; the dead letter keeps the precise code.
_CATEGORY = {
    "hop_limit": "budget_exceeded",
    "cycle_detected": "budget_exceeded",
    "ttl_expired": "budget_exceeded",
    "budget_exhausted": "budget_exceeded",
}


class PublishRequest(NamedTuple):
    message_id: str
    subject: str  # as published; may be a wildcard pattern
    sender: str
    reply_to: str | None
    budget: Budget
    created_at: int
    payload: Any
    parent_id: str | None = None  # a reply: the message it answers (kept in every copy)
    republished_from: str | None = None  # the dead letter this publishes again
    relayed_from: str | None = None  # an ingest: the node it came from (in every copy)


class PublishPlan(NamedTuple):
    copies: tuple[Copy, ...]

    @property
    def stores_something(self) -> bool:
        """Whether any copy goes to a new/ (what the rate limiter counts)."""
        return any(c.delivered for c in self.copies)

    @property
    def writes(self) -> list[Copy]:
        """The copies a writer must store: deliveries and dead letters."""
        return [c for c in self.copies if c.refusal is None]


# The router's per-target reliability gate: (refusal or None, is_probe).
Gate = Callable[[EndpointInfo], tuple[Refusal | None, bool]]


def _open_gate(target: EndpointInfo) -> tuple[Refusal | None, bool]:
    return None, False


# json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False), built
# once: json.dumps with arguments builds a JSONEncoder per call, and JSONEncoder.encode
# builds its C encoder per call (3.4 -> 2.3 µs for the bench's payload). No circular
# check: a payload decoded from msgpack or JSON cannot hold a cycle, and depth is bounded
# by the interpreter's recursion limit either way (RecursionError, as json.dumps).
_payload_chunks = c_make_encoder(
    None,  # markers: no circular check
    json.JSONEncoder().default,  # raises TypeError for what JSON cannot hold
    encode_basestring,  # ensure_ascii=False
    None,  # indent
    ":",
    ",",
    False,  # sort_keys
    False,  # skipkeys
    False,  # allow_nan
)


def encode_payload(payload: Any, max_bytes: int) -> bytes:
    """The payload's JSON, checked against the size limit (the limit is on this form)."""
    try:
        text = "".join(_payload_chunks(payload, 0))
    except (TypeError, ValueError) as err:
        raise InvalidMessage(f"payload is not JSON-representable: {err}") from None
    data = text.encode("utf-8")
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"payload of {_size(len(data))} exceeds the {_size(max_bytes)} limit")
    return data


def _size(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} bytes"


def plan_publish(
    request: PublishRequest,
    targets: Sequence[EndpointInfo],
    rules: RuleSet,
    payload_json: bytes,
    now_ms: int,
    gate: Gate = _open_gate,
) -> PublishPlan:
    """Decide, for each target endpoint, a delivery, a dead letter or a refusal."""
    if not targets:
        unroutable = DeadLetterInfo(NO_MATCH_REASON, "no_match", now_ms, UNROUTABLE)
        data = encode_copy(request, request.subject, payload_json, unroutable)
        return PublishPlan((Copy(UNROUTABLE, request.subject, data, unroutable),))
    copies = []
    for target in targets:
        dead: DeadLetterInfo | None = None
        probe = False
        decision = rules.decide(request.sender, target.subject)
        if not decision.allowed:
            rule = decision.rule
            why = f"access denied by rule {rule.from_pattern} -> {rule.to_pattern}" if rule else ""
            dead = DeadLetterInfo(why or "access denied", "access_denied", now_ms, target.hash)
        else:
            refusal, probe = gate(target)
            if refusal is not None:
                copies.append(Copy(target.hash, target.subject, b"", refusal=refusal))
                continue
            violation = check_budget(request.budget, target.subject, now_ms)
            if violation is not None:
                dead = DeadLetterInfo(violation.reason, violation.code, now_ms, target.hash)
        data = encode_copy(request, target.subject, payload_json, dead)
        copies.append(Copy(target.hash, target.subject, data, dead, None, probe))
    return PublishPlan(tuple(copies))


def _json_str(value: str | None) -> str:
    """``json.dumps(value, ensure_ascii=False)``, without building an encoder."""
    return "null" if value is None else encode_basestring(value)


def _budget_json(budget: Budget, into: str | None = None) -> str:
    """``json.dumps(budget.to_wire(), separators=(",", ":"))``, written out: it is in
    every copy's file, and the generic encoder costs several times this. ``into``: the
    budget of the copy delivered to that endpoint instead (``advance(budget, into)``,
    broker/budget.py), written without building it. The numbers without a format spec:
    ``{n:d}`` goes through int.__format__'s parser, about 0.25 µs a number here, and a
    budget holds plain ints (`Budget.from_wire` refuses bools, which would print as
    ``True``)."""
    chain = ",".join(map(encode_basestring_ascii, budget.ancestor_chain))
    hops, calls = budget.hop_count, budget.call_budget_remaining
    if into is not None:
        step = encode_basestring_ascii(into)
        chain, hops, calls = f"{chain},{step}" if chain else step, hops + 1, calls - 1
    return (
        f'{{"hopCount":{hops},"maxHops":{budget.max_hops},'
        f'"ancestorChain":[{chain}],"ttl":{budget.ttl},'
        f'"callBudgetRemaining":{calls}}}'
    )


def encode_copy(
    request: PublishRequest,
    subject: str,
    payload_json: bytes,
    dead: DeadLetterInfo | None = None,
) -> bytes:
    """One copy's file for the endpoint ``subject``: the same JSON as `Envelope.to_json`
    (plus ``deadLetter``). A delivery carries the request's budget advanced into the
    endpoint; a dead letter (and the ``_unroutable`` one) the budget as it came."""
    into = None if dead is not None else subject
    head = (
        f'{{"id":"{request.message_id}","subject":{_json_str(subject)},'
        f'"from":{_json_str(request.sender)},"replyTo":{_json_str(request.reply_to)},'
        f'"budget":{_budget_json(request.budget, into)},'
        f'"createdAt":{request.created_at},"payload":'
    )
    tail = ""
    if request.subject != subject:
        tail += f',"publishedTo":{_json_str(request.subject)}'
    if request.parent_id is not None:
        tail += f',"parentId":{_json_str(request.parent_id)}'
    if request.republished_from is not None:
        tail += f',"republishedFrom":"{request.republished_from}"'
    if request.relayed_from is not None:
        tail += f',"relayedFrom":{_json_str(request.relayed_from)}'
    if dead is not None:
        tail += f',"deadLetter":{json.dumps(dead.to_wire(), ensure_ascii=False)}'
    return head.encode() + payload_json + (tail + "}").encode()
