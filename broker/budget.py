"""Budget checks before every delivery, and the budget of the delivered copy (pure).

A budget only ever shrinks: each delivered copy has one hop more, its endpoint appended
to the ancestor chain and one call less (`advance`), so a chain of agents that keep
replying to each other runs out instead of looping forever.

The checks run in a fixed order: hops, cycle, TTL, call budget; the first that fails is
the verdict. The order matters because a message that is stopped is dead-lettered with
exactly one code, and operators, tests and dashboards read that code: the same message
must get the same code from any router, whatever else is also wrong with it. The order
goes from the most specific diagnosis of a runaway chain to the most general one. A chain
at its hop limit is reported as such even if it also loops; a loop (the target already
handled this conversation) is reported as a cycle even when the message has also
expired, because "A -> B -> A" tells the operator what to fix and "expired" does not;
TTL and call budget are last because they are the backstops that catch everything else
eventually. It is also cheapest first: the hop check is one comparison, and the
linear scan of the chain only runs for a message that still has hops left.

Time is an argument (``now_ms``), so expiry is tested at the exact millisecond:
``now_ms == ttl`` is still valid, ``now_ms == ttl + 1`` is expired.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sdk.types import Budget

HOP_LIMIT = "hop_limit"
CYCLE_DETECTED = "cycle_detected"
TTL_EXPIRED = "ttl_expired"
BUDGET_EXHAUSTED = "budget_exhausted"


@dataclass(frozen=True, slots=True)
class BudgetViolation:
    """Why a delivery is refused: a stable ``code`` (the dead letter's) and a ``reason``."""

    code: str
    reason: str


def check_budget(budget: Budget, endpoint_subject: str, now_ms: int) -> BudgetViolation | None:
    """The first violation delivering ``budget`` to ``endpoint_subject`` would commit."""
    if budget.hop_count >= budget.max_hops:
        return BudgetViolation(
            HOP_LIMIT, f"max hops exceeded ({budget.hop_count}/{budget.max_hops})"
        )
    if endpoint_subject in budget.ancestor_chain:
        return BudgetViolation(
            CYCLE_DETECTED, f"cycle detected: {endpoint_subject} already in chain"
        )
    if now_ms > budget.ttl:
        return BudgetViolation(TTL_EXPIRED, "message expired (TTL)")
    if budget.call_budget_remaining <= 0:
        return BudgetViolation(BUDGET_EXHAUSTED, "call budget exhausted")
    return None


def advance(budget: Budget, endpoint_subject: str) -> Budget:
    """The budget of the copy delivered to ``endpoint_subject`` (after `check_budget`)."""
    return Budget(
        hop_count=budget.hop_count + 1,
        max_hops=budget.max_hops,
        ancestor_chain=(*budget.ancestor_chain, endpoint_subject),
        ttl=budget.ttl,
        call_budget_remaining=budget.call_budget_remaining - 1,
    )


def clamp(budget: Budget, now_ms: int, limits: Mapping[str, int]) -> Budget:
    """A client-supplied budget, cut down to the configured maxima (config ``budget``):
    maxHops, TTL (at most ``maxTtlMs`` from now) and the call budget. Never raised."""
    return replace(
        budget,
        max_hops=min(budget.max_hops, limits["maxHops"]),
        ttl=min(budget.ttl, now_ms + limits["maxTtlMs"]),
        call_budget_remaining=min(budget.call_budget_remaining, limits["maxCallBudget"]),
    )
