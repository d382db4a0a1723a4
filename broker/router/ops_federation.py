"""Operations of a federation bridge (docs/federation.md): the sending node's remote
parts (relay_take, relayed, remote_endpoints, and the publish's remote planning), and
ingest, the far node's side of a message relayed from another host.

An ingest is a publish *with a given id*: the id the message got on its origin node.
JetStream delivers at least once (a bridge killed between the router's answer and its
ack gets the message again), so an ingest is idempotent per endpoint and origin node:
an endpoint whose index already has this id, relayed from the same node, counts as
delivered and is not written again; one whose copy of this id came from elsewhere
refuses it (``id_conflict``: one file per id in a mailbox, and no node may hide
another's message by relaying its id first); an ingest of an id whose copies are
still on their way to the writers is answered ``unavailable`` (the bridge retries
later). Each stored copy says the node it came from (``relayedFrom`` in its file). The
index is the writers' record of what is durable, read here before anything is planned;
a shard whose writer is not up cannot be read that way (its index is rebuilt at the
writer's start), so an ingest that touches it is ``unavailable`` too.

The budget is the one the message travelled with (clamped, never grown) and is checked
and advanced here like any publish's: a loop across hosts is stopped like one inside a
host. Rights: the bridge's identity must be allowed to relay this sender *for this
origin node* (auth.json ``relays``), and the access rules of this node apply again.
The sender's rate limit was applied on its own node and is not counted here.
"""

from __future__ import annotations

from typing import Any

from broker.budget import clamp
from broker.publish import (
    Copy,
    PublishPlan,
    PublishRequest,
    Refusal,
    encode_payload,
    plan_publish,
)
from broker.router.consumers import Session
from broker.router.context import DEFERRED, Context, now_ms
from broker.router.federation import HeldTake
from broker.router.ops_publish import publish_result, queue_writes, target_gate
from broker.router.remote_parts import alive, settle
from broker.router.requests import Ingest, Relayed, RelayTake, RemoteEndpoints
from sdk import wire
from sdk.errors import NotAuthorized, RelayError, SenderNotAllowed, Unavailable
from sdk.paths import UNROUTABLE, shard_of
from sdk.subjects import inbox_sender
from sdk.types import EndpointInfo, relayed_from
from workers.protocol import ID_CONFLICT, ORIGIN_UNKNOWN, id_conflict
from workers.records import MessageRecord


def ingest(ctx: Context, session: Session, req: Ingest, rid: int) -> Any:
    now = now_ms()
    envelope = req.envelope
    _check_relay(session, req.node, envelope.sender)
    if envelope.reply_to is not None:  # a request's reply inbox is its sender's
        _check_relay(session, req.node, inbox_sender(envelope.reply_to) or envelope.reply_to)
    if ctx.jobs.storing(envelope.id):
        raise Unavailable(f"message {envelope.id} is being stored; ask again when it is")
    targets = [ctx.directory.by_subject[s] for s in req.subjects if s in ctx.directory]
    for endpoint in [t.hash for t in targets] or [UNROUTABLE]:
        shard = shard_of(endpoint, ctx.shards)
        if not ctx.writers.is_up(shard):
            raise Unavailable(f"the writer of shard {shard} is not up; ask again later")
    stored = {record.endpoint: record for record in ctx.indexes.copies_of(envelope.id)}
    if not targets and UNROUTABLE in stored:  # its no_match dead letter is made
        unroutable = EndpointInfo(envelope.subject, UNROUTABLE, "", 0)
        _, conflicts, _ = _not_stored(ctx, req.node, [unroutable], stored)
        return publish_result(ctx, envelope.id, PublishPlan(conflicts), {})
    fresh, conflicts, already = _not_stored(ctx, req.node, targets, stored)
    if not fresh and (already or conflicts):
        return publish_result(ctx, envelope.id, PublishPlan(conflicts), {}, already=already)
    payload_json = encode_payload(envelope.payload, ctx.config["limits"]["maxPayloadBytes"])
    request = PublishRequest(
        envelope.id,
        envelope.published_to or envelope.subject,
        envelope.sender,
        envelope.reply_to,
        clamp(envelope.budget, now, ctx.config["budget"]),
        envelope.created_at,
        payload_json,
        envelope.parent_id,
        envelope.republished_from,
        relayed_from=req.node,
    )

    def gate(target: EndpointInfo) -> tuple[Refusal | None, bool]:
        return target_gate(ctx, target, envelope.sender, now)

    plan = plan_publish(request, fresh, ctx.settings.rules, payload_json, now, gate)
    plan = PublishPlan(plan.copies + conflicts)
    if not plan.writes:
        return publish_result(ctx, envelope.id, plan, {}, already=already)
    return queue_writes(ctx, session, rid, plan, request, now, already=already)


def _not_stored(
    ctx: Context, node: str, targets: list[EndpointInfo], stored: dict[str, MessageRecord]
) -> tuple[list[EndpointInfo], tuple[Copy, ...], int]:
    """Which targets to store an ingest's copy in, keyed by (origin node, id): (the
    targets without this id; a refusal ``id_conflict`` for each whose copy of this id
    came from another node, was published here or cannot be read, since a mailbox
    holds one file per id; how many have it from ``node`` already, a redelivery
    counted as delivered).
    Reads the file of each copy found, which only a redelivery or a conflict has."""
    fresh: list[EndpointInfo] = []
    conflicts: list[Copy] = []
    already = 0
    for target in targets:
        record = stored.get(target.hash)
        if record is None:
            fresh.append(target)
            continue
        origin = _origin_of(ctx, record)
        if origin == node:
            already += 1
            continue
        refusal = Refusal(ID_CONFLICT, id_conflict(record.id, node, target.subject, origin))
        conflicts.append(Copy(target.hash, target.subject, b"", refusal=refusal))
    return fresh, tuple(conflicts), already


def _origin_of(ctx: Context, record: MessageRecord) -> str | None:
    """The node a stored copy came from, as its file says; ``ORIGIN_UNKNOWN`` when the
    file cannot be read (compacted meanwhile): no node's copy is then a redelivery, so
    none is counted delivered and dropped unseen."""
    try:
        return relayed_from(ctx.indexes.read_copy(record))
    except (RelayError, OSError, ValueError):
        return ORIGIN_UNKNOWN


def _check_relay(session: Session, node: str, sender: str) -> None:
    who = session.who
    if who is None or not who.may_relay(node, sender):
        name = who.name if who else session.user
        raise SenderNotAllowed(
            f"{name} may not relay messages of {sender} from node {node} (auth.json 'relays')"
        )


# ---------------------------------------------------------------------- the bridge


def relay_take(ctx: Context, session: Session, req: RelayTake, rid: int) -> Any:
    _check_bridge(session)
    fed = ctx.federation
    if fed.bridge not in (None, session.identity) and fed.held is not None:
        raise Unavailable(f"another bridge serves node {fed.node}; one per router")
    _answer_empty(ctx, fed.release())
    fed.node = req.node
    if req.cluster is not None:
        fed.cluster = req.cluster
    parts = fed.take(session.identity, rid, req.limit, now_ms(), lambda p: alive(ctx, p))
    if parts is None:
        return DEFERRED
    return {"parts": [p.to_wire() for p in parts]}


def relayed(ctx: Context, session: Session, req: Relayed, rid: int) -> Any:
    _check_bridge(session)
    for token, node, error in req.parts:
        job = ctx.jobs.pending.get(token)
        if job is None or not job.awaits_node(node):
            continue  # answered unavailable at its deadline meanwhile
        settle(ctx, token, job, node, None if error is None else ("unavailable", error))
    return {}


def remote_endpoints(ctx: Context, session: Session, req: RemoteEndpoints, rid: int) -> Any:
    _check_bridge(session)
    ctx.federation.set_remote(req.node, frozenset(req.subjects))
    return {"node": req.node, "endpoints": len(req.subjects)}


def _answer_empty(ctx: Context, held: HeldTake | None) -> None:
    if held is not None:
        ctx.replies.add(held.client, wire.ok_body(held.rid, {"parts": []}))


def _check_bridge(session: Session) -> None:
    who = session.who
    if who is None or not who.admin:
        raise NotAuthorized("only a federation bridge (operator rights) relays between nodes")
