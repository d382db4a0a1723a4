"""What the router does when its writers answer, come, go, or do not answer in time.

Each function updates the units (writer jobs, ledger, reliability, replies) and returns
the messages to push to clients as data (`Show`, `HandOut`); the loop pushes them. A
publish is answered once each of its copies is durable or failed; a copy whose answer
never comes (the writer went away, or the deadline passed) is ``unavailable``, never
"delivered": it may be durable all the same.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from broker.router.context import Context, now_ms
from broker.router.jobs import WRITER_DEADLINE_MS, Job
from sdk import wire
from sdk.errors import Unavailable, from_code
from sdk.paths import shard_of
from workers import protocol as proto

log = logging.getLogger("relay.router")


class Show(NamedTuple):
    """A message now durable in new/ or cur/: for the observers of its endpoint."""

    id: str
    endpoint: str
    data: bytes


class HandOut(NamedTuple):
    """A message claimed for a subscription (None: for nobody any more): push it, as
    its hand-out number ``deliveries``. ``sender``: its "from", when the router knows
    it without reading the file (a copy it just stored claimed); None: read it there."""

    sub: int | None
    id: str
    endpoint: str
    data: bytes
    deliveries: int = 1
    sender: str | None = None


Push = Show | HandOut


def stored(ctx: Context, rows: list[proto.Stored], now: int) -> list[Push]:
    pushes: list[Push] = []
    observed = ctx.consumers.observing  # once a frame: usually nobody, and no Show built
    for row in rows:
        job = ctx.jobs.pending.get(row.token)
        copy = job.copies.get(row.endpoint) if job is not None else None
        if job is None or copy is None or row.endpoint in job.outcomes:
            # Answered late: the publisher had its answer already (deadline passed, or
            # the writer's disconnect was seen first), but the copy may be durable all
            # the same.
            if row.stored_at is None:
                ctx.ledger.store_failed(row.id, row.endpoint)
            else:
                ctx.ledger.stored_late(row.id, row.endpoint, claimed=row.target == proto.TARGET_CUR)
            continue
        if row.stored_at is None:
            ctx.ledger.store_failed(row.id, row.endpoint)
        elif row.target == proto.TARGET_CUR:
            sub_id = ctx.ledger.copy_settled(row.id, row.endpoint)
            if observed:
                pushes.append(Show(row.id, row.endpoint, copy.data))
            pushes.append(HandOut(sub_id, row.id, row.endpoint, copy.data, 1, job.sender))
        elif copy.dead is None:
            ctx.ledger.copy_settled(row.id, row.endpoint)
            if observed:
                pushes.append(Show(row.id, row.endpoint, copy.data))
            ctx.ledger.stored_new(row.id, row.endpoint)
        # A relayed copy the endpoint had already is delivered, and the endpoint's
        # ledger knows it from its first store.
        durable = row.stored_at is not None or row.code == proto.ALREADY_STORED
        if row.code == proto.ID_CONFLICT:  # the endpoint is fine: the sender is not
            ctx.reliability.never_tried(copy)
        else:
            ctx.reliability.outcome(copy, success=durable, now=now)
        # A copy not stored always says why (its code); "" only to keep the type whole.
        job.outcomes[row.endpoint] = None if durable else (row.code or "", row.message or "")
        _answered(ctx, row.token, job)
    return pushes


def ingested(ctx: Context, file: proto.Ingested, data: bytes | None) -> list[Push]:
    """A file another program dropped into new/ (the writer indexed it)."""
    ctx.ledger.stored_new(file.id, file.endpoint)
    return [Show(file.id, file.endpoint, data)] if data is not None else []


def claimed(ctx: Context, claim: proto.Claimed, data: bytes | None) -> list[Push]:
    if claim.code is not None and claim.code != "already_claimed":
        log.warning(
            "claim of %s/%s failed: %s %s", claim.endpoint, claim.id, claim.code, claim.message
        )
    ok, unchanged = claim.code is None, claim.code == "storage_error"
    if ctx.ledger.claimed(claim.sub, claim.id, claim.endpoint, ok=ok, unchanged=unchanged):
        return [HandOut(claim.sub, claim.id, claim.endpoint, data or b"", claim.deliveries)]
    return []


def replied(ctx: Context, reply: proto.Reply) -> None:
    dead = ctx.ledger.dead_letter_done(reply.token)
    if dead is not None:
        if reply.ok:
            log.warning(
                "%s/%s is a dead letter: handed out %d times, its consumer gone each time",
                dead.endpoint,
                dead.id,
                dead.deliveries,
            )
        return
    put_back = ctx.ledger.put_back_done(reply.token, ok=reply.ok)
    if put_back is not None:
        if not reply.ok and reply.result.get("code") != "invalid_state":  # never left new/
            log.warning("%s/%s not put back: %s", put_back[1], put_back[0], reply.result)
        return
    job = ctx.jobs.pending.get(reply.token)
    if job is None:  # answered already (its deadline passed): its effect still counts
        on_reply = ctx.jobs.late_reply(reply.token, reply.shard)
        if on_reply is not None and reply.ok:
            on_reply(reply.result)
        return
    job.answered_by.add(reply.shard)
    if reply.ok:
        if job.on_reply is not None:
            job.on_reply(reply.result)
        job.results.append(reply.result)
    else:
        result = reply.result
        job.error = from_code(result.get("code", "internal"), result.get("message", ""))
    _answered(ctx, reply.token, job)


def copies_not_taken(ctx: Context, shard: int, items: list[proto.DeliveryHeader]) -> None:
    """Copies an up writer did not take (its queue is full): failed now. Not a failure
    of their endpoints (the breakers do not count them)."""
    reason = f"writer for shard {shard} is not taking work (its queue is full)"
    for header in items:
        ctx.ledger.copy_abandoned(header.id, header.endpoint, sent=False)
        job = ctx.jobs.pending.get(header.token)
        if job is not None and job.awaits(header.endpoint):
            ctx.reliability.never_tried(job.copies[header.endpoint])
            job.outcomes[header.endpoint] = ("unavailable", reason)
            _answered(ctx, header.token, job)


def writer_gone(ctx: Context, shard: int) -> None:
    """A writer went away: what it had not confirmed will never be confirmed.

    Publishes and operations it held are answered `unavailable` (a copy's outcome is
    unknown: it may be durable, so never "delivered"); the answers of an operation's
    other writers, still to come, keep their effect (`WriterJobs.late`). Claims it
    held may or may not have happened: their credit comes back now, and each message
    is put back (cur/ -> new/; refused harmlessly if it never left new/) by the next
    writer, before any claim of its (`writer_up`), so none stays claimed for nobody.
    The put-backs it held are sent again then too.
    """
    log.warning("writer for shard %d disconnected", shard)
    error = f"writer for shard {shard} stopped before confirming"
    for job in ctx.jobs.writer_gone(shard):  # an operation: it fails as a whole
        ctx.replies.add(job.client, wire.error_body(job.rid, Unavailable(error)))
    for token, job in ctx.jobs.on_shard(shard):  # publishes
        for endpoint, copy in job.copies.items():
            if job.awaits(endpoint) and shard_of(endpoint, ctx.shards) == shard:
                job.outcomes[endpoint] = ("unavailable", error)
                ctx.reliability.never_tried(copy)
                _answered(ctx, token, job)
    ctx.ledger.writer_gone(shard)


def writer_up(ctx: Context, shard: int) -> list[list[bytes]]:
    """A writer said hello: what waits in its mailboxes' new/ (the truth) becomes their
    queues, read before anything is sent to it; then the work kept for it goes out,
    put-backs before any claim (a put-back after a claim of the same message would take
    it back from its consumer). Returns the operations to send it now; its copies join
    this pass's outgoing ones."""
    ctx.ledger.writer_up(shard)
    _adopt_orphans(ctx, shard)
    ops, copies = ctx.jobs.unpark(shard)
    for header, data in copies:
        ctx.ledger.storing(header.id, header.endpoint)
        ctx.jobs.queue_copy(shard, header, data)
    return ops


def _adopt_orphans(ctx: Context, shard: int) -> None:
    """Claims in the shard's cur/ that nobody holds as far as the router knows (it
    restarted since they were handed out): their holders have one session timeout to
    come back and say so (`resume`), then they are handed out again. Those a session
    named already (its client said hello before this writer) are its, not orphans,
    and not counted in the log line."""
    unknown = [
        claim
        for claim in ctx.indexes.claimed_on(shard)
        if not ctx.ledger.holds_claim(claim[0], claim[1])
    ]
    orphans = ctx.consumers.add_orphans(unknown, now_ms()) if unknown else 0
    if orphans:
        log.info(
            "shard %d: %d claims in cur/ that no session named; handed out again unless "
            "their holders name them within %d ms",
            shard,
            orphans,
            ctx.consumers.session_timeout_ms,
        )


def sweep(ctx: Context, now: int) -> None:
    """Answer what the writers did not answer in time; end silent sessions."""
    expired = False
    for token, job in ctx.jobs.due(now):
        expired = True
        if not job.is_publish:  # an operation fails as a whole
            ctx.jobs.outlive(token, job)
            ctx.jobs.forget(token)
            error = Unavailable(_timed_out(ctx, job.shards))
            ctx.replies.add(job.client, wire.error_body(job.rid, error))
            continue
        # A publish: the copies stored are delivered, the others unavailable.
        for endpoint, copy in job.copies.items():
            if endpoint in job.outcomes:
                continue
            shard = shard_of(endpoint, ctx.shards)
            sent = ctx.writers.is_up(shard)
            if sent:  # a writer that does not answer: a failure
                ctx.reliability.outcome(copy, success=False, now=now)
            else:  # kept for a writer that never came: not its endpoint's fault
                ctx.reliability.never_tried(copy)
            job.outcomes[endpoint] = ("unavailable", _timed_out(ctx, {shard}))
            ctx.ledger.copy_abandoned(job.message_id, endpoint, sent=sent)
        for node in job.remote:  # the bridge did not confirm: JetStream may have it or not
            late = f"the bridge did not confirm the copy for node {node} within the deadline"
            job.outcomes.setdefault(f"@{node}", ("unavailable", late))
        ctx.replies.add(job.client, ctx.jobs.finish(token, job))  # forgets it
    if expired:
        ctx.jobs.drop_parked_of_finished()
    ctx.reliability.prune(now)


def _timed_out(ctx: Context, shards: set[int]) -> str:
    waited = f"{WRITER_DEADLINE_MS / 1000:g} s"
    down = sorted(s for s in shards if not ctx.writers.is_up(s))
    if down:
        named = ", ".join(f"{s} ({ctx.writers.state(s)})" for s in down)
        return f"writer for shard {named} did not come up within {waited}; is it running?"
    named = ", ".join(str(s) for s in sorted(shards)) or "?"
    return f"writer for shard {named} did not confirm within {waited}"


def _answered(ctx: Context, token: int, job: Job) -> None:
    reply = ctx.jobs.answered(token, job)
    if reply is not None:
        ctx.replies.add(*reply)
