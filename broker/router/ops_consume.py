"""Operations of a consuming client: its session (hello, ping, bye), its subscriptions
and fetches, and finishing what it was handed (ack, nack, in_progress), plus the
operator's finishing of a pending message (complete, fail, requeue).

Finishing a message is a writer's job (the rename out of cur/); the credit it gives back
takes the next message at the end of the pass (broker/router/delivery.py).
"""

from __future__ import annotations

from typing import Any

from broker.router import consumers as cons
from broker.router.consumers import Session
from broker.router.context import (
    DEFERRED,
    Context,
    WriterWork,
    check_receives,
    may_receive,
    now_ms,
)
from broker.router.jobs import Job
from broker.router.requests import Empty, Fetch, Finish, Hello, Subscribe, Unsubscribe
from sdk import wire
from sdk.errors import InvalidState, LimitExceeded
from sdk.paths import shard_of
from sdk.types import Signal, SignalType

SERVER_NAME = "relay"


def hello(ctx: Context, session: Session, req: Hello, rid: int) -> Any:
    session.batches = req.batch

    def unknown(message_id: str, endpoint: str) -> bool:
        """A claim of a shard whose writer has not said hello since the router started:
        no orphan was looked for yet, so the client's word is taken (the orphans found
        at the writer's hello leave out what a session holds)."""
        seen = ctx.writers.state(shard_of(endpoint, ctx.shards)) != "starting"
        return not seen and not ctx.ledger.holds_claim(message_id, endpoint)

    mine = [h for h in req.holding if _may_hold(ctx, session, h[1])]
    holding = ctx.consumers.resume(session, req.session, mine, now_ms(), unknown=unknown)
    return {
        "session": session.token,  # present it when connecting again (`resume`)
        "holding": holding,
        "sessionTimeoutMs": ctx.consumers.session_timeout_ms,  # ping at least this often
        "server": SERVER_NAME,
        "version": wire.PROTOCOL_VERSION,
        "signals": ctx.about["signals"],
        "shards": ctx.shards,
        "limits": dict(ctx.config["limits"]),
        "batch": wire.MAX_BATCH,  # requests per frame this broker accepts
        "signalRuns": True,  # subscribe to "+" topics for runs of signals
    }


def _may_hold(ctx: Context, session: Session, endpoint: str) -> bool:
    """A client may say it holds only messages of endpoints it may consume. Of an
    endpoint unregistered meanwhile (its mail stays) the subject is not known here:
    only an identity that may consume everything is taken at its word."""
    subject = ctx.directory.subject_of(endpoint)
    if subject is None:
        return may_receive(session, ">", operator_too=False)
    return may_receive(session, subject, operator_too=False)


def ping(ctx: Context, session: Session, req: Hello, rid: int) -> Any:
    # A router that restarted knows the client only from its next request: pings
    # carry the batch choice too.
    session.batches = session.batches or req.batch
    # The subscriptions this connection holds: a client that finds one of its own
    # missing (router restart, session timeout) knows to subscribe again.
    # The session token: a client that finds another one than its hello gave it knows
    # the router forgot it (a restart, or its session ended) and says hello again.
    # The session timeout: a client pings often enough for it (it may change meanwhile).
    return {
        "now": now_ms(),
        "subs": sorted(session.subs),
        "session": session.token,
        "sessionTimeoutMs": ctx.consumers.session_timeout_ms,
    }


def bye(ctx: Context, session: Session, req: Empty, rid: int) -> Any:
    ctx.consumers.end_session(session.identity)
    return {}


def subscribe(ctx: Context, session: Session, req: Subscribe, rid: int) -> Any:
    limits = ctx.config["limits"]
    check_receives(session, req.pattern, operator_too=False)
    credit = limits["defaultCredit"] if req.credit is None else req.credit
    if credit > limits["maxCredit"]:
        raise LimitExceeded(f"credit {credit} exceeds the maximum of {limits['maxCredit']}")
    if len(session.subs) >= limits["maxSubscriptionsPerClient"]:
        raise LimitExceeded(
            f"this client already has {len(session.subs)} subscriptions; "
            f"the limit is {limits['maxSubscriptionsPerClient']}"
        )
    sub = ctx.consumers.subscribe(
        session.identity, req.pattern, req.mode, credit, now_ms(), req.ack_wait, session.acting
    )
    if req.mode != cons.CONSUME:
        return {"sub": sub.id}
    # The reply goes out first, then the backlog (pushes follow in order).
    ctx.replies.add(session.identity, wire.ok_body(rid, {"sub": sub.id, "credit": credit}))
    ctx.ledger.subscribed(sub, sorted(ctx.directory.matching(req.pattern)))
    return DEFERRED


def fetch(ctx: Context, session: Session, req: Fetch, rid: int) -> Any:
    """Claim up to ``batch`` messages for this client and answer with them: a consuming
    subscription that ends with its answer (`answer_fetches`)."""
    check_receives(session, req.pattern, operator_too=False)
    limit = ctx.config["limits"]["maxCredit"]
    if req.batch > limit:
        raise LimitExceeded(f"batch {req.batch} exceeds the maximum of {limit}")
    now = now_ms()
    sub = ctx.consumers.subscribe(
        session.identity, req.pattern, cons.FETCH, req.batch, now, req.ack_wait, session.acting
    )
    sub.fetch_rid, sub.wait_until = rid, now + req.wait
    ctx.ledger.subscribed(sub, sorted(ctx.directory.matching(req.pattern)))
    return DEFERRED


def answer_fetches(ctx: Context, now: int) -> None:
    """Answer the fetches that are done (`Consumers.fetches_to_answer`): what each was
    handed, held by its client from now on; its subscription ends."""
    for sub in ctx.consumers.fetches_to_answer(now):
        ctx.consumers.unsubscribe(sub.id)
        messages = [
            {"id": message_id, "endpoint": endpoint, "deliveries": deliveries, "data": data}
            for message_id, endpoint, deliveries, data in sub.fetched
        ]
        ctx.replies.add(sub.client, wire.ok_body(sub.fetch_rid, {"messages": messages}))


def in_progress(ctx: Context, session: Session, req: Finish, rid: int) -> Any:
    """The holder is still working on a message: its ack deadline starts again."""
    held = ctx.consumers.in_progress(
        session.identity, req.id, req.endpoint, req.deliveries, now_ms()
    )
    if held is None:
        raise InvalidState(_not_held(req))
    return {"deliveries": held.deliveries}


def _not_held(req: Finish) -> str:
    handout = f" (hand-out {req.deliveries})" if req.deliveries is not None else ""
    return (
        f"message {req.id}{handout} of endpoint {req.endpoint} is not held by this "
        "connection: answered already, never handed to it, or taken back (its ack "
        "deadline passed, or its session ended) and handed out again"
    )


def unsubscribe(ctx: Context, session: Session, req: Unsubscribe, rid: int) -> Any:
    sub = ctx.consumers.subs.get(req.sub)
    if sub is None or sub.client != session.identity:
        raise InvalidState(f"no subscription {req.sub!r:.20} on this connection")
    ctx.consumers.unsubscribe(req.sub)
    return {}


def ack(ctx: Context, session: Session, req: Finish, rid: int) -> Any:
    return _finish(ctx, session, req, "done", operator=False)


def nack(ctx: Context, session: Session, req: Finish, rid: int) -> Any:
    reason = req.reason or "rejected by consumer"
    code = req.code or "nack"
    return _finish(ctx, session, req, "fail", operator=False, reason=reason, code=code)


def complete(ctx: Context, session: Session, req: Finish, rid: int) -> Any:
    return _finish(ctx, session, req, "done", operator=True)


def fail(ctx: Context, session: Session, req: Finish, rid: int) -> Any:
    reason = req.reason or "failed by operator"
    return _finish(ctx, session, req, "fail", operator=True, reason=reason, code="operator")


def requeue(ctx: Context, session: Session, req: Finish, rid: int) -> Any:
    """Return a pending message to new/, to be handed out again (never automatic)."""
    return _finish(ctx, session, req, "requeue", operator=True)


def _finish(
    ctx: Context, session: Session, req: Finish, name: str, *, operator: bool, **args: Any
) -> WriterWork:
    """Mark a claimed message done or failed: a consumer's ack/nack, or an operator's
    complete/fail/requeue of a pending one. Either way the holder's credit comes back."""
    message_id, endpoint = req.id, req.endpoint
    if operator:
        holder = ctx.consumers.holder_of(message_id, endpoint)
        held = ctx.consumers.settled(holder, message_id, endpoint) if holder else None
        ctx.consumers.orphans.pop((message_id, endpoint), None)
        args["claimedOnly"] = True  # an operator finishes pending messages only
    else:
        held = ctx.consumers.settled(session.identity, message_id, endpoint, req.deliveries)
        if held is None:
            raise InvalidState(_not_held(req))
    sender = held.sender if held is not None else None

    def finished(job: Job) -> Any:
        if not operator:  # an ack or a nack teaches the endpoint's breaker
            ctx.reliability.consumer_outcome(endpoint, success=name == "done", now=now_ms())
        if name == "done" and sender:
            _delivery_receipt(ctx, message_id, endpoint, sender)
        # The credit given back takes the next message at the end of this pass.
        return job.results[0]

    def requeued(result: Any) -> None:  # in line again, even on an answer past the deadline
        ctx.ledger.requeued(message_id, endpoint)

    shard = shard_of(endpoint, ctx.shards)
    work = {shard: {"id": message_id, "endpoint": endpoint, **args}}
    return WriterWork(name, work, finished, on_reply=requeued if name == "requeue" else None)


def _delivery_receipt(ctx: Context, message_id: str, endpoint: str, sender: str) -> None:
    """Tell the publisher, on its own subject, that a consumer finished its message
    (when anyone listens to signals at all)."""
    if not ctx.signals.heard:
        return
    subject = ctx.directory.subject_of(endpoint)
    if subject is None or not sender:
        return
    receipt = Signal(
        SignalType.DELIVERY_RECEIPT,
        "done",
        subject,
        now_ms(),
        {"messageId": message_id, "endpoint": endpoint},
    )
    ctx.signals.add(sender, receipt.to_wire())
