"""Rate limiter, circuit breaker and backpressure: pure units, time as an argument."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.backpressure import Level, calm, pressure
from broker.breaker import BreakerSettings, BreakerState, CircuitBreaker
from broker.ratelimit import RateLimiter

# --- rate limiter ---------------------------------------------------------------------------


def admit(limiter: RateLimiter, sender: str, now: int) -> bool:
    verdict = limiter.check(sender, now)
    if verdict.allowed:
        limiter.record(sender, now)
    return verdict.allowed


def test_the_limit_admits_exactly_max_per_window_then_refuses_with_the_numbers():
    limiter = RateLimiter(window_secs=60, max_per_window=3)
    assert [admit(limiter, "s", t) for t in (0, 1, 2)] == [True, True, True]
    verdict = limiter.check("s", 3)
    assert not verdict.allowed
    assert verdict.reason == "rate limit exceeded: 3/3 messages in 60s window"


def test_refusal_is_checks_verdict_when_it_refuses_and_none_when_it_admits():
    limiter = RateLimiter(window_secs=60, max_per_window=2)
    for t in (0, 1, 2, 3):
        verdict = limiter.check("s", t)
        assert limiter.refusal("s", t) == (None if verdict.allowed else verdict)
        limiter.record("s", t)


def test_the_window_slides_to_the_millisecond():
    limiter = RateLimiter(window_secs=1, max_per_window=1)
    assert admit(limiter, "s", 1000)
    assert not admit(limiter, "s", 1999)  # 999 ms later: still in the window
    assert admit(limiter, "s", 2000)  # exactly one window later: out of it


def test_senders_have_separate_allowances():
    limiter = RateLimiter(window_secs=60, max_per_window=1)
    assert admit(limiter, "relay.a", 0)
    assert admit(limiter, "relay.b", 0)
    assert not admit(limiter, "relay.a", 1)


def test_longest_matching_prefix_override_wins():
    limiter = RateLimiter(60, 1, {"relay.agent.": 3, "relay.agent.vip.": 5})
    assert limiter.limit_for("relay.agent.x") == 3
    assert limiter.limit_for("relay.agent.vip.y") == 5
    assert limiter.limit_for("relay.tool.z") == 1


def test_zero_limit_refuses_everything():
    assert not RateLimiter(60, 0).check("s", 0).allowed


def test_seeding_restores_the_window_after_a_restart():
    limiter = RateLimiter(window_secs=60, max_per_window=2)
    limiter.seed([("s", 59_000), ("s", 1_000), ("old", 0)])
    assert limiter.check("s", 60_000).count == 2
    assert not limiter.check("s", 60_000).allowed
    assert limiter.check("s", 61_000).count == 1  # the one at 1,000 left the window
    assert limiter.check("old", 60_000).count == 0


def test_reconfiguring_keeps_the_log():
    limiter = RateLimiter(60, 1)
    admit(limiter, "s", 0)
    limiter.configure({"windowSecs": 60, "maxPerWindow": 2, "perSenderOverrides": {}})
    assert admit(limiter, "s", 1) and not admit(limiter, "s", 2)


# --- circuit breaker ------------------------------------------------------------------------

SETTINGS = BreakerSettings(
    failure_threshold=5, cooldown_ms=30_000, half_open_probes=1, success_to_close=2
)


def opened(now: int = 0) -> CircuitBreaker:
    breaker = CircuitBreaker(SETTINGS)
    for _ in range(5):
        breaker.record(False, now)
    return breaker


def test_opens_after_exactly_threshold_consecutive_failures():
    breaker = CircuitBreaker(SETTINGS)
    for _ in range(4):
        breaker.record(False, 0)
    assert breaker.state is BreakerState.CLOSED
    breaker.record(False, 0)
    assert breaker.state is BreakerState.OPEN
    assert breaker.admit(1) == (False, False)


def test_a_success_resets_the_consecutive_count():
    breaker = CircuitBreaker(SETTINGS)
    for _ in range(4):
        breaker.record(False, 0)
    breaker.record(True, 0)
    for _ in range(4):
        breaker.record(False, 0)
    assert breaker.state is BreakerState.CLOSED


def test_cooldown_elapses_to_the_millisecond_and_admits_exactly_one_probe():
    breaker = opened(now=1000)
    assert breaker.admit(30_999) == (False, False)
    assert breaker.admit(31_000) == (True, True)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.admit(31_001) == (False, False)  # one probe in flight is the limit
    breaker.probe_done(True, 31_002)
    assert breaker.admit(31_003) == (True, True)  # the slot is free again
    breaker.probe_done(True, 31_004)
    assert breaker.state is BreakerState.CLOSED


def test_half_open_admits_the_configured_number_of_probes():
    breaker = CircuitBreaker(BreakerSettings(1, 1000, half_open_probes=3, success_to_close=1))
    breaker.record(False, 0)
    assert [breaker.admit(1000)[0] for _ in range(4)] == [True, True, True, False]


def test_a_failed_probe_reopens_for_a_full_cooldown():
    breaker = opened(now=0)
    assert breaker.admit(30_000) == (True, True)
    breaker.probe_done(False, 30_500)
    assert breaker.state is BreakerState.OPEN
    assert breaker.admit(60_499) == (False, False)
    assert breaker.admit(60_500)[0]


# --- backpressure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("depth", "level"),
    [
        (0, Level.OK),
        (79, Level.OK),
        (80, Level.WARNING),
        (99, Level.WARNING),
        (100, Level.CRITICAL),
        (150, Level.CRITICAL),
    ],
    ids=["empty", "below-warning", "at-warning", "below-max", "at-max", "over-max"],
)
def test_levels_at_exact_boundaries(depth, level):
    p = pressure(depth, 100, 0.8)
    assert p.level is level
    assert p.reject == (level is Level.CRITICAL)
    assert 0.0 <= p.ratio <= 1.0


def test_reject_reason_and_signal_data_carry_the_numbers():
    p = pressure(100, 100, 0.8)
    assert p.reason == "backpressure: mailbox full (100/100)"
    assert p.signal_data() == {"pressure": 1.0, "currentSize": 100, "maxMailboxSize": 100}


@given(
    depth=st.integers(0, 2000),
    maximum=st.integers(-1, 1500),
    warning_at=st.floats(0.0, 1.0),
    enabled=st.booleans(),
)
def test_calm_says_what_pressure_says_of_level_ok(depth, maximum, warning_at, enabled):
    """The gate's fast path against the full answer."""
    full = pressure(depth, maximum, warning_at, enabled)
    assert calm(depth, maximum, warning_at, enabled) == (full.level is Level.OK)


def test_max_mailbox_size_zero_rejects_without_dividing_by_zero():
    p = pressure(0, 0, 0.8)
    assert p.ratio == 1.0 and p.reject


def test_disabled_backpressure_never_rejects_but_still_reports_the_ratio():
    p = pressure(500, 100, 0.8, enabled=False)
    assert not p.reject and p.level is Level.OK and p.ratio == 1.0
