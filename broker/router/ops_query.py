"""Operations that only read: endpoints, rules, configuration, status, and the
messages the indexes know (trace, dead letters, pending). Each shows a connection only
what its rights let it receive or what it sent (auth.json)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from broker.router.consumers import Session
from broker.router.context import Context, check_receives, may_receive, now_ms
from broker.router.indexes import record_wire
from broker.router.requests import DeadLetters, Empty, PendingOf, Trace
from sdk import edge_state
from sdk.errors import RelayError
from sdk.paths import UNROUTABLE
from sdk.types import EndpointInfo
from workers.index import MAX_QUERY_LIMIT
from workers.records import MessageRecord, State


def endpoints(ctx: Context, session: Session, req: Empty, rid: int) -> Any:
    return {"endpoints": _endpoints_status(ctx)}


def _endpoints_status(ctx: Context) -> list[dict[str, Any]]:
    claimed = ctx.consumers.claimed_per_endpoint()
    return [_endpoint_status(ctx, info, claimed) for info in ctx.directory.sorted()]


def _endpoint_status(
    ctx: Context, info: EndpointInfo, claimed: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    load = ctx.reliability.pressure_of(ctx.ledger.depth(info.hash))
    held, oldest = claimed.get(info.hash, (0, None))
    return {
        **ctx.endpoint_wire(info),
        "depth": load.depth,  # waiting to be handed out
        "claimed": held,  # handed out, not answered yet
        "oldestClaimedAt": oldest,  # ms, or None
        "pressure": load.ratio,
        "breaker": ctx.reliability.describe(info.hash, now_ms()),
    }


def list_rules(ctx: Context, session: Session, req: Empty, rid: int) -> Any:
    return {"rules": [r.to_wire() for r in ctx.settings.rules.rules]}


def get_config(ctx: Context, session: Session, req: Empty, rid: int) -> Any:
    return ctx.config


def status(ctx: Context, session: Session, req: Empty, rid: int) -> Any:
    return {
        "router": {
            "pid": os.getpid(),
            "startedAt": ctx.about["startedAt"],
            "address": ctx.about["address"],
            "signals": ctx.about["signals"],
        },
        "shards": ctx.shards,
        "writers": ctx.writers.status(),
        "clients": len(ctx.consumers.sessions),
        "subscriptions": len(ctx.consumers.subs),
        "pendingRequests": len(ctx.jobs.pending),
        "endpoints": _endpoints_status(ctx),
        "unroutable": ctx.indexes.count(State.FAILED, UNROUTABLE),
        "fileErrors": dict(ctx.settings.file_errors),
        "federation": ctx.federation.status(now_ms()),
        # What edge processes (relay http) say of themselves in run/ (sdk/edge_state.py).
        "edges": [s.to_wire() for s in edge_state.read_all(ctx.home)],
    }


def trace(ctx: Context, session: Session, req: Trace, rid: int) -> Any:
    # The copies of what it sent, or may receive (a failed copy's reason is a
    # handler's error text, which may quote the message).
    who = session.who

    def visible(r: MessageRecord) -> bool:
        return may_receive(session, r.subject) or bool(who and who.may_send_as(r.sender))

    shown = [r for r in ctx.indexes.copies_of(req.id) if visible(r)]
    replies = [r for r in ctx.indexes.replies_to(req.id) if visible(r)]
    return {
        "id": req.id,
        "copies": [_traced(ctx, r) for r in sorted(shown, key=lambda r: r.endpoint)],
        # The conversation: what answers this message (each copy), oldest first.
        "replies": [
            {"id": r.id, "endpoint": r.endpoint, "subject": r.subject, "from": r.sender}
            for r in replies
        ],
    }


def _traced(ctx: Context, record: MessageRecord) -> dict[str, Any]:
    """A copy in a trace: its index row, and the dead letters it was requeued from
    (its file's "requeues", oldest first; workers/dead_letters.py `redrive`)."""
    wire = _wire(ctx, record)
    wire["requeues"] = []
    with contextlib.suppress(RelayError, OSError, ValueError):
        history = json.loads(ctx.indexes.read_copy(record)).get("requeues")
        if isinstance(history, list):
            wire["requeues"] = history
    return wire


def dead_letters(ctx: Context, session: Session, req: DeadLetters, rid: int) -> Any:
    if req.id is not None:  # one message's: by key, however many dead letters there are
        return {"items": [_with_file(ctx, r) for r in _dead_copies(ctx, session, req)]}
    endpoint = ctx.directory.resolve(req.endpoint)
    subject = ctx.directory.subject_of(endpoint) if endpoint is not None else None
    if subject is not None:
        check_receives(session, subject)
    if subject is not None or may_receive(session, ">"):
        records = ctx.indexes.query(state=State.FAILED, endpoint=endpoint, limit=req.limit)
    else:
        records = _dead_letters_received(ctx, session, endpoint, req.limit)
    return {"items": [_with_file(ctx, r) for r in records]}


def _dead_copies(ctx: Context, session: Session, req: DeadLetters) -> list[MessageRecord]:
    """The dead letters of one message (``req.id``), in the endpoint asked for if any,
    that this connection may receive."""
    endpoint = ctx.directory.resolve(req.endpoint) if req.endpoint is not None else None
    return [
        r
        for r in ctx.indexes.copies_of(req.id)
        if r.state is State.FAILED
        and (endpoint is None or r.endpoint == endpoint)
        and may_receive(session, r.subject)
    ][: req.limit]


def _dead_letters_received(
    ctx: Context, session: Session, endpoint: str | None, limit: int
) -> list[MessageRecord]:
    """The dead letters of an identity with restricted rights: those of each endpoint
    it may receive (an index lookup each), and of the unroutable ones (``endpoint``
    `UNROUTABLE` or None) those sent to a subject it may receive, looked for among
    the first MAX_QUERY_LIMIT of each shard (a bound on what one request reads)."""
    failed = State.FAILED.value
    mine = (
        []
        if endpoint is not None
        else [h for h, i in ctx.directory.by_hash.items() if may_receive(session, i.subject)]
    )
    found: list[MessageRecord] = []
    with ctx.indexes.open() as indexes:
        for index in indexes:
            for endpoint_hash in mine:
                found += index.query(state=failed, endpoint=endpoint_hash, limit=limit)[0]
            unroutable, _ = index.query(state=failed, endpoint=UNROUTABLE, limit=MAX_QUERY_LIMIT)
            found += [r for r in unroutable if may_receive(session, r.subject)]
    found.sort(key=lambda r: (r.id, r.endpoint))
    return found[:limit]


def pending(ctx: Context, session: Session, req: PendingOf, rid: int) -> Any:
    info = ctx.directory.require(req.subject)
    check_receives(session, info.subject)
    records = ctx.indexes.query(state=State.CLAIMED, endpoint=info.hash, limit=req.limit)
    return {"items": [_with_file(ctx, r) for r in records]}


def _wire(ctx: Context, record: MessageRecord) -> dict[str, Any]:
    return record_wire(record, ctx.directory.subject_of(record.endpoint))


def _with_file(ctx: Context, record: MessageRecord) -> dict[str, Any]:
    return ctx.indexes.with_file(record, _wire(ctx, record))
