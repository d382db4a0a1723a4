"""Operations that change what everyone sees: endpoints, rules, configuration, and the
writers' maintenance (purge, compaction, index rebuild). All but `register` need
operator rights (the table in broker/router/operations.py says which)."""

from __future__ import annotations

import json
from typing import Any

from broker import redrive
from broker.router.consumers import Session
from broker.router.context import Context, WriterWork, now_ms
from broker.router.jobs import Job
from broker.router.requests import (
    AddRule,
    CompactRemove,
    Empty,
    Purge,
    Register,
    RemoveRule,
    RequeueDeadLetters,
    SetConfig,
)
from broker.router.requests import SubjectOnly as Subject
from sdk.errors import MessageNotFound, NotAuthorized, RelayError, from_code
from sdk.paths import shard_of
from sdk.types import EndpointInfo
from workers.index import encode_cursor
from workers.maildir import Mailbox
from workers.records import MessageRecord, State

COMPACT_TOTALS = ("removed", "files", "bytes", "skipped")


def add_endpoint(ctx: Context, info: EndpointInfo) -> None:
    """An endpoint known to the router: its mailbox on disk, its subject routable, its
    queue read from its new/ once its writer is up."""
    Mailbox(ctx.home.mailbox(info.hash), info.hash).create()
    ctx.directory.add(info)
    ctx.ledger.add_endpoint(info.hash, info.subject)


def register(ctx: Context, session: Session, req: Register, rid: int) -> Any:
    who = session.who
    if who is None or not (
        who.admin or who.may_send_as(req.subject) or who.owns_inbox(req.subject)
    ):
        raise NotAuthorized(
            f"{who.name if who else session.user} may register endpoints only under "
            "its own sender patterns (and their reply inboxes)"
        )
    info = ctx.control.register_endpoint(req.subject, now_ms(), shared=req.shared)
    if req.subject in ctx.directory:
        ctx.directory.update(info)  # shared or not, as asked
        return {**ctx.endpoint_wire(info), "created": False}
    add_endpoint(ctx, info)
    created = {**ctx.endpoint_wire(info), "created": True}
    shard = shard_of(info.hash, ctx.shards)
    if not ctx.writers.is_up(shard):
        return created  # a writer adopts every mailbox of its shard at start
    # Reply once the writer watches the new mailbox, so a file dropped into its new/
    # right after register() returns is noticed.
    args = {"endpoint": info.hash, "subject": req.subject}
    return WriterWork("watch", {shard: args}, lambda job: created)


def unregister(ctx: Context, session: Session, req: Subject, rid: int) -> Any:
    removed = ctx.control.unregister_endpoint(req.subject)
    info = ctx.directory.remove(req.subject)
    if info is not None:
        ctx.ledger.remove_endpoint(info.hash)
    # The mailbox and everything in it stays: unread mail and dead letters are kept.
    return {"removed": removed}


def add_rule(ctx: Context, session: Session, req: AddRule, rid: int) -> Any:
    return ctx.settings.add_rule(req.rule).to_wire()


def remove_rule(ctx: Context, session: Session, req: RemoveRule, rid: int) -> Any:
    return {"removed": ctx.settings.remove_rule(req.sender, req.subject)}


def set_config(ctx: Context, session: Session, req: SetConfig, rid: int) -> Any:
    config = ctx.settings.set_config(req.config)
    ctx.configure()
    return config


def purge_dead_letters(ctx: Context, session: Session, req: Purge, rid: int) -> Any:
    endpoint = ctx.directory.resolve(req.endpoint)
    shards = [shard_of(endpoint, ctx.shards)] if endpoint else range(ctx.shards)
    return WriterWork(
        "purge",
        {shard: {"endpoint": endpoint} for shard in shards},
        lambda job: {"purged": sum(r["purged"] for r in job.results)},
    )


def requeue_dead_letters(ctx: Context, session: Session, req: RequeueDeadLetters, rid: int) -> Any:
    """An operator's redrive: dead letters back to their endpoints' new/ under their own
    ids (the writers rewrite the files), then into the endpoints' queues where their ids
    put them, as if found in new/ at start. Those `broker.redrive` refuses stay dead
    letters, each with its code; one message asked for by id is refused with its error."""
    letters, more = _dead_letters_asked(ctx, req)
    now = now_ms()
    refused: list[dict[str, Any]] = []
    by_shard: dict[int, list[list[str]]] = {}
    for record in letters:
        try:
            letter = json.loads(ctx.indexes.read_copy(record))
        except (RelayError, OSError, ValueError):
            letter = None  # gone meanwhile, or unreadable: the writer says which
        subject = ctx.directory.subject_of(record.endpoint)
        error = redrive.refusal(letter, record.id, record.endpoint, subject, now)
        if error is not None:
            if req.id is not None and len(letters) == 1:
                raise error
            refused.append({"id": record.id, "endpoint": record.endpoint, **error.to_wire()})
            continue
        item = [record.id, record.endpoint]
        by_shard.setdefault(shard_of(record.endpoint, ctx.shards), []).append(item)
    after = letters[-1].id if more else None

    def in_line(result: dict[str, Any]) -> None:
        """Each writer's requeued messages into their queues, by id: on its answer,
        even one that comes after the request was answered at its deadline."""
        for message_id, endpoint in result["requeued"]:
            ctx.ledger.requeued(message_id, endpoint)

    def answer(job: Job | None) -> dict[str, Any]:
        requeued: list[dict[str, str]] = []
        for result in job.results if job is not None else ():
            requeued += [{"id": i, "endpoint": e} for i, e in result["requeued"]]
            refused.extend(result["refused"])
        if req.id is not None and not requeued and len(refused) == 1:
            raise from_code(refused[0]["code"], refused[0]["message"])
        requeued.sort(key=lambda r: (r["id"], r["endpoint"]))
        return {"requeued": requeued, "refused": refused, "more": more, "after": after}

    if not by_shard:
        return answer(None)
    args = {shard: {"items": items} for shard, items in by_shard.items()}
    return WriterWork("redrive", args, answer, on_reply=in_line)


def _dead_letters_asked(ctx: Context, req: RequeueDeadLetters) -> tuple[list[MessageRecord], bool]:
    """The dead letters a requeue names, oldest first, and whether more remain: the
    copies of one message (in one endpoint, if given), or one endpoint's page."""
    endpoint = ctx.directory.resolve(req.endpoint)
    if req.id is not None:
        copies = [
            r
            for r in ctx.indexes.copies_of(req.id)
            if r.state is State.FAILED and endpoint in (None, r.endpoint)
        ]
        if not copies:
            where = f" in {req.endpoint}" if req.endpoint is not None else ""
            raise MessageNotFound(f"no dead letter {req.id}{where}")
        return copies[: req.limit], len(copies) > req.limit
    assert endpoint is not None  # the request needs an id or an endpoint
    cursor = None if req.after is None else encode_cursor(req.after, endpoint)
    with ctx.indexes.open(endpoint) as indexes:  # the endpoint's shard: one index
        for index in indexes:
            page, rest = index.query(
                state=State.FAILED.value, endpoint=endpoint, limit=req.limit, after=cursor
            )
            return page, rest is not None
    return [], False


def compact_remove(ctx: Context, session: Session, req: CompactRemove, rid: int) -> Any:
    """Ops compaction (docs/ops.md): the owning writers delete archived copies.

    ``items`` is ``[[id, endpoint], ...]``; each writer removes only done and failed
    files. With ``checkpoint`` every writer, items or not, then checkpoints its index
    and vacuums it past ``vacuumPages`` free pages.
    """
    by_shard: dict[int, list[list[str]]] = {}
    for item in req.items:
        by_shard.setdefault(shard_of(item[1], ctx.shards), []).append(item)
    shards = range(ctx.shards) if req.checkpoint else sorted(by_shard)
    if not shards:
        return dict.fromkeys(COMPACT_TOTALS, 0)
    args = {
        shard: {
            "items": by_shard.get(shard, []),
            "checkpoint": req.checkpoint,
            "vacuumPages": req.vacuum_pages,
        }
        for shard in shards
    }
    return WriterWork("compact_remove", args, _compact_totals)


def _compact_totals(job: Job) -> dict[str, Any]:
    total: dict[str, Any] = dict.fromkeys(COMPACT_TOTALS, 0)
    for result in job.results:
        for key in COMPACT_TOTALS:
            total[key] += result[key]
        if "index" in result:
            total.setdefault("indexes", []).append(result["index"])
    return total


def rebuild_index(ctx: Context, session: Session, req: Empty, rid: int) -> Any:
    return WriterWork(
        "rebuild",
        {shard: {} for shard in range(ctx.shards)},
        lambda job: {"messages": sum(r["messages"] for r in job.results)},
    )
