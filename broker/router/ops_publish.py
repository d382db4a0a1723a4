"""Operations that send: publish (durable, answered once every copy is stored) and
signal (ephemeral, out at the end of the pass).

A publish is planned by the pure `plan_publish` (broker/publish.py) from the endpoints
its subject reaches, the access rules, and a gate per target (backpressure, then the
circuit breaker, broker/reliability.py). Its copies are queued with the writer jobs;
the loop sends them at the end of the pass, and the answer goes out when the writers
have reported each copy durable or failed.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from broker.budget import clamp
from broker.publish import PublishPlan, PublishRequest, Refusal, encode_payload, plan_publish
from broker.rejections import RATE_LIMITED
from broker.router import remote_parts as remote
from broker.router.consumers import Session
from broker.router.context import (
    DEFERRED,
    Context,
    checked_reply_to,
    checked_sender,
    now_ms,
)
from broker.router.jobs import Job
from broker.router.requests import Publish, SendSignal
from sdk.errors import AccessDenied, NotAuthorized, RelayError, SenderNotAllowed
from sdk.ids import new_id
from sdk.paths import UNROUTABLE, shard_of
from sdk.types import Budget, EndpointInfo, SignalType, default_budget
from workers import protocol as proto

# Signals the router itself emits: a client forging them would mislead every watcher.
ROUTER_SIGNALS = frozenset({SignalType.DELIVERY_RECEIPT, SignalType.BACKPRESSURE})


def publish(ctx: Context, session: Session, req: Publish, rid: int) -> Any:
    now = now_ms()
    sender = checked_sender(session, req.sender)
    # Replies go out under the consumer's name: only to where we may send.
    reply_to = None if req.reply_to is None else checked_reply_to(session, req.reply_to)
    payload_json = encode_payload(req.payload, ctx.config["limits"]["maxPayloadBytes"])
    parent = None if req.parent_id is None else _parent_copy(ctx, req.parent_id, sender)
    budget = _budget(ctx, req, parent, now)
    message_id = new_id(now)
    verdict = ctx.reliability.rate(sender, now)
    if verdict is not None:  # before fan-out; nothing is written
        ctx.rejections.record(now, RATE_LIMITED, "*", sender)
        return {
            "messageId": message_id,
            "deliveredTo": 0,
            "rejected": [["*", "rate_limited"]],
            "mailboxPressure": {},
            "details": {"*": verdict.reason},
        }
    request = PublishRequest(
        message_id, req.subject, sender, reply_to, budget, now, payload_json,
        req.parent_id, req.republished_from,
    )  # fmt: skip

    def gate(target: EndpointInfo) -> tuple[Refusal | None, bool]:
        return target_gate(ctx, target, sender, now)

    local = ctx.directory.targets(req.subject)
    back_to = None if local else _reply_route(parent, req.subject)
    parts, refused = remote.plan_remote(ctx, request, now, back_to)
    if local or not (parts or refused):  # no match anywhere: the _unroutable dead letter
        plan = plan_publish(request, local, ctx.settings.rules, payload_json, now, gate)
    else:
        plan = PublishPlan(())
    if plan.stores_something or parts:
        ctx.reliability.count(sender, now)
    if not plan.writes and not parts:
        return remote.remote_result(publish_result(ctx, message_id, plan, {}), None, refused)
    remote_parts = (req.payload, parts, refused) if parts or refused else None
    return queue_writes(ctx, session, rid, plan, request, now, remote_parts=remote_parts)


def queue_writes(
    ctx: Context,
    session: Session,
    rid: int,
    plan: PublishPlan,
    request: PublishRequest,
    now: int,
    *,
    already: int = 0,
    remote_parts: tuple[Any, dict[str, tuple[str, ...]], list[tuple[str, str, str]]] | None = None,
) -> Any:
    """Queue a plan's copies for the writers under one job, answered (DEFERRED) when each
    is durable or failed. ``already``: copies found stored before (an ingest), counted
    as delivered. An ingest's copies (``request.relayed_from``) are stored by the
    writers only where the id is not stored yet (JetStream may deliver one twice).
    ``remote_parts``: (payload, parts by node, remote copies refused) of a publish that
    reaches other nodes, handed to the bridge under the same job."""
    message_id, sender = request.message_id, request.sender
    payload, parts, refused = remote_parts or (None, {}, [])

    def result(job: Job) -> dict[str, Any]:
        local = publish_result(ctx, message_id, plan, job.outcomes, already=already)
        return remote.remote_result(local, job, refused) if remote_parts else local

    writes = plan.writes
    token, job = ctx.jobs.open(
        session.identity,
        rid,
        len(writes) + len(parts),
        result,
        now,  # not created_at: a relayed message may be old, its deadline is from now
    )
    ctx.jobs.publishing(token, job, message_id, sender)
    remote.queue_remote(ctx, token, job, request, payload, parts)
    for copy in writes:
        shard = shard_of(copy.endpoint, ctx.shards)
        dead = copy.dead
        if dead is not None:
            target = proto.TARGET_FAILED
        elif ctx.ledger.store_target(message_id, copy.endpoint) is not None:
            # A consumer with credit waits and nothing older is in the way: stored
            # straight into cur/, claimed for it.
            target = proto.TARGET_CUR
        else:
            target = proto.TARGET_NEW
        header = proto.delivery_header(
            token,
            message_id,
            copy.endpoint,
            copy.subject,
            sender,
            request.created_at,
            target,
            dead.reason if dead else None,
            dead.code if dead else None,
            dead.failed_at if dead else None,
            request.relayed_from,
            request.parent_id,
        )
        job.copies[copy.endpoint] = copy
        job.shards.add(shard)
        ctx.jobs.queue_copy(shard, header, copy.data)
    return DEFERRED


def _budget(ctx: Context, req: Publish, parent: dict[str, Any] | None, now: int) -> Budget:
    """The budget a publish travels with. Budgets never grow: a reply naming its
    parent (``parentId``) sent by the endpoint the parent was delivered to carries
    the parent's stored budget, whatever the client sent; any other client budget is
    clamped to the configured maxima; none at all gets the defaults."""
    if parent is not None:
        with contextlib.suppress(RelayError, KeyError, TypeError):
            return Budget.from_wire(parent["budget"])
    if req.budget is None:
        return default_budget(now)
    return clamp(Budget.from_wire(req.budget), now, ctx.config["budget"])


def _parent_copy(ctx: Context, message_id: str, endpoint_subject: str) -> dict[str, Any] | None:
    """The parent's copy delivered to the replier's endpoint (its file's JSON), found
    through its index row: one lookup and one read, never a listing of cur/ (the
    router's loop must not do I/O that grows with history). None when there is none:
    the sender is not an endpoint the parent reached, or the copy was compacted."""
    info = ctx.directory.by_subject.get(endpoint_subject)
    if info is None:
        return None
    record = next((r for r in ctx.indexes.copies_of(message_id) if r.endpoint == info.hash), None)
    if record is None:
        return None
    try:
        parent = json.loads(ctx.indexes.read_copy(record))
    except (RelayError, OSError, ValueError):
        return None
    return parent if isinstance(parent, dict) else None


def _reply_route(parent: dict[str, Any] | None, subject: str) -> str | None:
    """The node a reply goes back to when no endpoint here has its subject: the node
    its parent was relayed from, if the reply goes to the parent's own ``replyTo``
    (a request's reply inbox on that node, which no directory lists;
    docs/federation.md, "Replies across hosts"). Only that address: a parent does not
    open a way to any other endpoint of its node."""
    if parent is None or parent.get("replyTo") != subject:
        return None
    origin = parent.get("relayedFrom")
    return origin if isinstance(origin, str) else None


def target_gate(
    ctx: Context, target: EndpointInfo, sender: str, now: int
) -> tuple[Refusal | None, bool]:
    """Backpressure, then the circuit breaker, for one target of a publish."""
    depth = ctx.ledger.depth(target.hash)
    refusal, probe, signals = ctx.reliability.gate(target.hash, target.subject, sender, depth, now)
    for subject, signal_ in signals:
        ctx.signals.add(subject, signal_.to_wire())
    if refusal is not None:
        ctx.rejections.record(now, refusal.reason, target.hash, sender)
    return refusal, probe


def publish_result(
    ctx: Context,
    message_id: str,
    plan: PublishPlan,
    outcomes: dict[str, tuple[str, str] | None],
    *,
    already: int = 0,
) -> dict[str, Any]:
    delivered, rejected, details, pressure = already, [], {}, {}
    ratio, depth = ctx.reliability.pressure_ratio, ctx.ledger.depth
    for copy in plan.copies:
        endpoint = copy.endpoint
        failure = outcomes.get(endpoint)
        if copy.delivered:
            rejection = None if failure is None else (endpoint, *failure)
        else:
            rejection = copy.rejection
        if rejection is None:
            delivered += 1
        else:
            rejected.append([rejection[0], rejection[1]])
            details[rejection[0]] = rejection[2]
        if endpoint != UNROUTABLE:
            pressure[endpoint] = ratio(depth(endpoint))
    return {
        "messageId": message_id,
        "deliveredTo": delivered,
        "rejected": rejected,
        "mailboxPressure": pressure,
        "details": details,
    }


def signal(ctx: Context, session: Session, req: SendSignal, rid: int) -> Any:
    who = session.who
    if req.sender is None and not (who and who.unrestricted):
        raise SenderNotAllowed("a signal from a restricted identity must name its 'from'")
    if req.signal["type"] in ROUTER_SIGNALS and not (who and who.admin):
        raise NotAuthorized(f"{req.signal['type']} signals come from the broker only")
    if req.sender is not None:
        decision = ctx.settings.rules.decide(checked_sender(session, req.sender), req.subject)
        if not decision.allowed:
            raise AccessDenied(f"signals from {req.sender} to {req.subject} are denied by a rule")
    ctx.signals.add(req.subject, req.signal)
    return {}
