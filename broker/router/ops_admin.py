"""Operations that change what everyone sees: endpoints, rules, configuration, and the
writers' maintenance (purge, compaction, index rebuild). All but `register` need
operator rights (the table in broker/router/operations.py says which)."""

from __future__ import annotations

from typing import Any

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
    SetConfig,
)
from broker.router.requests import SubjectOnly as Subject
from sdk.errors import NotAuthorized
from sdk.paths import shard_of
from sdk.types import EndpointInfo
from workers.maildir import Mailbox

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
