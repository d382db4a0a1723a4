"""Whether a dead letter may be requeued: an operator's redrive, back to its endpoint's
new/ under its own id (docs/operations.md, "Requeueing dead letters"). Pure: the
router reads the dead letter's file and passes its JSON and the time.

A requeue skips the publish pipeline (the copy keeps the budget it was delivered with),
so it is offered only for copies that policy let through and a consumer or the ledger
then gave up on (nack, max_deliveries, an operator's fail). A copy that the publish
itself refused (access rules, budget, no endpoint) would be delivered past that refusal:
those are republished (a new publish, checked like any other), never requeued. A copy
whose TTL has passed would die again at once, so it is refused with ``ttl_expired``.
"""

from __future__ import annotations

from typing import Any

from broker.budget import BUDGET_EXHAUSTED, CYCLE_DETECTED, HOP_LIMIT, TTL_EXPIRED
from sdk.errors import EndpointNotFound, InvalidState, RelayError, TtlExpired
from sdk.paths import UNROUTABLE

# Dead-letter codes given at publish time, before any copy was stored in new/.
REFUSED_AT_PUBLISH = frozenset(
    {"no_match", "access_denied", HOP_LIMIT, CYCLE_DETECTED, TTL_EXPIRED, BUDGET_EXHAUSTED}
)

# How many dead letters one request requeues at most (`requeue_dead_letters` limit). The
# writer does them as one batch (workers/dead_letters.py, `redrive_batch`: one flush for
# the files, one fsync per directory, where it was three fsyncs each: 600 fsyncs became
# one syncfs and two fsyncs): 200 took a median 0.2 s here on a loaded machine (0.3 to
# 0.7 s one by one; bench/requeue_cost.py), well inside the 10 s the router waits for a
# writer (broker/router/jobs.py); the shard's other work waits that long at most. The
# bound still keeps that wait short when the disk is slow.
MAX_PER_REQUEST = 200


def refusal(
    letter: Any, message_id: str, endpoint: str, subject: str | None, now_ms: int
) -> RelayError | None:
    """Why the dead letter ``letter`` (its file's JSON) of ``endpoint`` (registered as
    ``subject``, None if it is not) may not be requeued at ``now_ms``; None: it may."""
    where = f"dead letter {message_id} of {subject or endpoint}"
    if endpoint == UNROUTABLE:
        return InvalidState(f"{where} matched no endpoint: republish it instead")
    if subject is None:
        return EndpointNotFound(f"{where}: its endpoint is not registered")
    dead = letter.get("deadLetter") if isinstance(letter, dict) else None
    budget = letter.get("budget") if isinstance(letter, dict) else None
    if not isinstance(dead, dict) or not isinstance(budget, dict) or "raw" in letter:
        return InvalidState(f"{where} is not a message: it cannot be requeued")
    code = dead.get("code")
    if code in REFUSED_AT_PUBLISH:
        return InvalidState(
            f"{where} was refused when published ({code}): requeued, it would pass that "
            "refusal; republish it instead"
        )
    ttl = budget.get("ttl")
    if isinstance(ttl, int) and now_ms > ttl:
        return TtlExpired(
            f"{where} expired {_ago(now_ms - ttl)} ago (its budget's TTL): requeued, it "
            "would die again; republish it for a new budget"
        )
    return None


def _ago(ms: int) -> str:
    seconds = ms // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"
