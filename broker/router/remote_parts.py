"""The remote parts of a publish (docs/federation.md): which copies go to other nodes,
handed to the bridge under the publish's job and answered by its ``relayed``. Pure
functions over the router's units (broker/router/federation.py holds the state).
"""

from __future__ import annotations

from typing import Any

from broker.budget import check_budget
from broker.publish import PublishRequest
from broker.router.context import Context
from broker.router.federation import MAX_QUEUED, RemotePart
from broker.router.jobs import Job
from sdk import wire
from sdk.subjects import endpoint_hash


def plan_remote(
    ctx: Context, request: PublishRequest, now: int, back_to: str | None = None
) -> tuple[dict[str, tuple[str, ...]], list[tuple[str, str, str]]]:
    """The remote parts of a publish: far node -> its endpoint subjects this publish may
    reach, and the remote copies refused here ((endpoint hash, reason, sentence): access
    rules and budgets are checked on the sending node too; no dead letter is kept for
    them, having no mailbox here). ``unavailable`` when no bridge is connected.
    ``back_to``: a reply's way home, the node its parent came from, which has the
    reply's subject whether or not it advertises it (ops_publish, `_reply_route`)."""
    fed = ctx.federation
    if not fed.remote and back_to is None:  # no other node known: no remote part
        return {}, []
    by_node = fed.targets(request.subject, ctx.directory.__contains__)
    if (
        back_to is not None
        and back_to != fed.node
        and request.subject not in by_node.get(back_to, ())
    ):
        by_node.setdefault(back_to, []).append(request.subject)
    parts: dict[str, tuple[str, ...]] = {}
    refused: list[tuple[str, str, str]] = []
    connected = fed.connected(now)
    for node, subjects in by_node.items():
        kept = []
        for subject in subjects:
            key = endpoint_hash(subject)
            decision = ctx.settings.rules.decide(request.sender, subject)
            violation = check_budget(request.budget, subject, now)
            if not decision.allowed:
                refused.append((key, "access_denied", f"access denied for {subject}"))
            elif violation is not None:
                refused.append((key, "budget_exceeded", violation.reason))
            elif not connected:
                refused.append((key, "unavailable", f"no bridge to reach {subject} on {node}"))
            else:
                kept.append(subject)
        if kept:
            parts[node] = tuple(kept)
    return parts, refused


def queue_remote(
    ctx: Context,
    token: int,
    job: Job,
    request: PublishRequest,
    payload: Any,
    parts: dict[str, tuple[str, ...]],
) -> None:
    """Hand each part of a publish to the bridge, under the publish's job."""
    for node, subjects in parts.items():
        job.remote[node] = subjects
        envelope = {
            "id": request.message_id,
            "subject": subjects[0],
            "from": request.sender,
            "replyTo": request.reply_to,
            "budget": request.budget.to_wire(),  # advanced by the far router
            "createdAt": request.created_at,
            "payload": payload,
        }
        if request.subject != subjects[0]:
            envelope["publishedTo"] = request.subject
        if request.parent_id is not None:
            envelope["parentId"] = request.parent_id
        if request.republished_from is not None:
            envelope["republishedFrom"] = request.republished_from
        if not ctx.federation.add(RemotePart(token, node, subjects, envelope)):
            full = f"{MAX_QUEUED} parts already wait for the bridge"
            settle(ctx, token, job, node, ("unavailable", full))


def remote_result(
    result: dict[str, Any],
    job: Job | None,
    refused: list[tuple[str, str, str]],
) -> dict[str, Any]:
    """A PublishResult with the remote parts: ``remote`` lists, by node, the subjects
    whose copy JetStream holds (pending on the far node); a part the bridge did not
    confirm is ``unavailable`` for each of its subjects."""
    remote: dict[str, list[str]] = {}
    failures = list(refused)
    for node, subjects in (job.remote if job else {}).items():
        outcome = job.outcomes.get(f"@{node}") if job else None
        if outcome is None:
            remote[node] = list(subjects)
            result["deliveredTo"] += len(subjects)
        else:
            failures.extend((endpoint_hash(s), outcome[0], outcome[1]) for s in subjects)
    for key, reason, sentence in failures:
        result["rejected"].append([key, reason])
        result["details"][key] = sentence
    if remote:
        result["remote"] = remote
    return result


def answer_held(ctx: Context, now: int) -> None:
    """Answer the bridge's held relay_take when parts came or it was held long enough
    (the loop calls this at the end of each pass and at each sweep)."""
    answer = ctx.federation.answer_held(now, lambda p: alive(ctx, p))
    if answer is not None:
        held, parts = answer
        result = {"parts": [p.to_wire() for p in parts]}
        ctx.replies.add(held.client, wire.ok_body(held.rid, result))


def alive(ctx: Context, part: RemotePart) -> bool:
    job = ctx.jobs.pending.get(part.token)
    return job is not None and job.awaits_node(part.node)


def settle(ctx: Context, token: int, job: Job, node: str, outcome: tuple[str, str] | None) -> None:
    job.outcomes[f"@{node}"] = outcome
    reply = ctx.jobs.answered(token, job)
    if reply is not None:
        ctx.replies.add(*reply)
