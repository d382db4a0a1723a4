"""broker.budget: the checks in their order, at exact boundaries, and the delivered copy."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.budget import BudgetViolation, advance, check_budget
from sdk.types import Budget

NOW = 1_764_108_000_000
TARGET = "relay.agent.p.backend"


def budget(**changes: Any) -> Budget:
    fields = {
        "hop_count": 1,
        "max_hops": 5,
        "ancestor_chain": ("relay.agent.p.frontend",),
        "ttl": NOW + 1000,
        "call_budget_remaining": 9,
    }
    return Budget(**{**fields, **changes})


# (budget changes, now, expected code or None, expected reason)
CASES = {
    "healthy": ({}, NOW, None, None),
    "last-hop-allowed": ({"hop_count": 4}, NOW, None, None),
    "hop-limit": ({"hop_count": 5}, NOW, "hop_limit", "max hops exceeded (5/5)"),
    "hop-over-limit": (
        {"hop_count": 7, "max_hops": 3},
        NOW,
        "hop_limit",
        "max hops exceeded (7/3)",
    ),
    "zero-max-hops": ({"hop_count": 0, "max_hops": 0}, NOW, "hop_limit", "max hops exceeded (0/0)"),
    "cycle": (
        {"ancestor_chain": ("relay.agent.p.frontend", TARGET)},
        NOW,
        "cycle_detected",
        f"cycle detected: {TARGET} already in chain",
    ),
    "ttl-equal-now-valid": ({"ttl": NOW}, NOW, None, None),
    "ttl-one-ms-past": ({"ttl": NOW}, NOW + 1, "ttl_expired", "message expired (TTL)"),
    "last-call-allowed": ({"call_budget_remaining": 1}, NOW, None, None),
    "budget-exhausted": (
        {"call_budget_remaining": 0},
        NOW,
        "budget_exhausted",
        "call budget exhausted",
    ),
    "budget-negative": (
        {"call_budget_remaining": -1},
        NOW,
        "budget_exhausted",
        "call budget exhausted",
    ),
    # Several apply: the first in the order hops, cycle, TTL, call budget wins.
    "all-four-hops-wins": (
        {"hop_count": 5, "ancestor_chain": (TARGET,), "ttl": NOW - 1, "call_budget_remaining": 0},
        NOW,
        "hop_limit",
        "max hops exceeded (5/5)",
    ),
    "cycle-beats-ttl-and-calls": (
        {"ancestor_chain": (TARGET,), "ttl": NOW - 1, "call_budget_remaining": 0},
        NOW,
        "cycle_detected",
        f"cycle detected: {TARGET} already in chain",
    ),
    "ttl-beats-calls": (
        {"ttl": NOW - 1, "call_budget_remaining": 0},
        NOW,
        "ttl_expired",
        "message expired (TTL)",
    ),
}


@pytest.mark.parametrize(("changes", "now", "code", "reason"), CASES.values(), ids=CASES.keys())
def test_check_budget(changes: dict[str, Any], now: int, code: str | None, reason: str | None):
    violation = check_budget(budget(**changes), TARGET, now)
    if code is None:
        assert violation is None
    else:
        assert violation == BudgetViolation(code, reason)


def test_cycle_is_about_the_target_not_other_chain_members() -> None:
    chain = ("relay.agent.p.a", "relay.agent.p.b")
    assert check_budget(budget(ancestor_chain=chain), TARGET, NOW) is None
    # A subject that merely contains the target as a prefix is not a cycle.
    assert check_budget(budget(ancestor_chain=(TARGET + "x",)), TARGET, NOW) is None


def test_advance_changes_exactly_hops_chain_and_call_budget() -> None:
    before = budget()
    after = advance(before, TARGET)
    assert after == Budget(
        hop_count=2,
        max_hops=5,
        ancestor_chain=("relay.agent.p.frontend", TARGET),
        ttl=before.ttl,
        call_budget_remaining=8,
    )
    assert before == budget()  # the original is untouched


def test_a_copy_sent_back_to_an_ancestor_is_a_cycle() -> None:
    delivered = advance(budget(ancestor_chain=()), TARGET)
    assert check_budget(delivered, TARGET, NOW).code == "cycle_detected"


def test_a_chain_of_deliveries_runs_out_of_hops() -> None:
    current = budget(hop_count=0, ancestor_chain=(), call_budget_remaining=100)
    delivered = 0
    for i in range(10):
        target = f"relay.agent.p.n{i}"
        if check_budget(current, target, NOW) is not None:
            break
        current = advance(current, target)
        delivered += 1
    assert delivered == 5
    assert check_budget(current, "relay.agent.p.n9", NOW).code == "hop_limit"


subjects = st.from_regex(r"[a-z]{1,5}(\.[a-z]{1,5}){0,3}", fullmatch=True)
budgets = st.builds(
    Budget,
    hop_count=st.integers(0, 1000),
    max_hops=st.integers(0, 1000),
    ancestor_chain=st.lists(subjects, max_size=6).map(tuple),
    ttl=st.integers(0, 2**53),
    call_budget_remaining=st.integers(-5, 1000),
)


@given(budgets, subjects)
def test_advance_never_grows_the_budget(before: Budget, target: str) -> None:
    after = advance(before, target)
    assert after.max_hops - after.hop_count == before.max_hops - before.hop_count - 1
    assert after.call_budget_remaining == before.call_budget_remaining - 1
    assert after.ttl == before.ttl
    assert after.max_hops == before.max_hops
    assert after.ancestor_chain[: len(before.ancestor_chain)] == before.ancestor_chain
    assert after.ancestor_chain[-1] == target


@given(budgets, subjects, st.integers(0, 2**53))
def test_a_refused_budget_stays_refused_after_advancing(
    before: Budget, target: str, now: int
) -> None:
    # Shrinking only: anything check_budget refuses now, it refuses for any later copy.
    if check_budget(before, target, now) is not None:
        assert check_budget(advance(before, "relay.other"), target, now) is not None


LIMITS = {"maxHops": 16, "maxTtlMs": 86_400_000, "maxCallBudget": 100}


def test_clamp_cuts_a_client_budget_down_to_the_maxima() -> None:
    from broker.budget import clamp

    greedy = Budget(0, 1000, (), NOW + 10 * 86_400_000, 10**6)
    clamped = clamp(greedy, NOW, LIMITS)
    assert (clamped.max_hops, clamped.ttl, clamped.call_budget_remaining) == (
        16,
        NOW + 86_400_000,
        100,
    )


def test_clamp_never_raises_a_budget() -> None:
    from broker.budget import clamp

    modest = Budget(1, 3, ("relay.a",), NOW + 5, 2)
    assert clamp(modest, NOW, LIMITS) == modest
