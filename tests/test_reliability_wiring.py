"""broker.reliability: the policies wired together, without sockets or time."""

from __future__ import annotations

import copy

from broker.config import DEFAULT_CONFIG
from broker.publish import Copy
from broker.reliability import Reliability

A, SUBJECT, SENDER = "aaaaaaaaaaaa", "relay.agent.p.a", "relay.agent.p.s"


def config(**sections):
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    for name, values in sections.items():
        cfg[name].update(values)
    return cfg


def test_a_full_mailbox_refuses_before_the_breaker_is_asked():
    r = Reliability(config(backpressure={"maxMailboxSize": 2}))
    refusal, probe, signals = r.gate(A, SUBJECT, SENDER, 2, now=0)
    assert refusal.reason == "backpressure" and not probe
    assert [(s, sig.state) for s, sig in signals] == [(SENDER, "critical"), (SUBJECT, "critical")]
    assert A not in r.breakers


def test_backpressure_signals_are_throttled_to_one_a_second_per_subject():
    r = Reliability(config(backpressure={"maxMailboxSize": 10}))
    assert len(r.gate(A, SUBJECT, SENDER, 9, now=0)[2]) == 2
    assert r.gate(A, SUBJECT, SENDER, 9, now=999)[2] == []
    assert len(r.gate(A, SUBJECT, SENDER, 9, now=1000)[2]) == 2
    r.prune(5000)
    assert r._signalled == {}


def test_an_open_breaker_refuses_and_a_write_outcome_closes_it_through_a_probe():
    r = Reliability(
        config(circuitBreaker={"failureThreshold": 1, "cooldownMs": 1000, "successToClose": 1})
    )
    r.consumer_outcome(A, success=False, now=0)
    assert r.gate(A, SUBJECT, SENDER, 0, now=10)[0].reason == "circuit_open"
    _, probe, _ = r.gate(A, SUBJECT, SENDER, 0, now=1000)
    assert probe
    r.outcome(Copy(A, SUBJECT, b"", probe=True), success=True, now=1001)
    assert r.describe(A, 1002)["state"] == "closed"


def test_a_probe_never_tried_frees_its_slot_without_counting():
    r = Reliability(config(circuitBreaker={"failureThreshold": 1, "cooldownMs": 1000}))
    r.consumer_outcome(A, success=False, now=0)
    _, probe, _ = r.gate(A, SUBJECT, SENDER, 0, now=1000)
    r.never_tried(Copy(A, SUBJECT, b"", probe=probe))
    assert r.gate(A, SUBJECT, SENDER, 0, now=1001)[1]  # the slot is free again
    assert r.describe(A, 1001)["state"] == "half_open"


def test_disabled_policies_let_everything_through():
    off = {"enabled": False}
    r = Reliability(
        config(
            rateLimit={**off, "maxPerWindow": 0},
            circuitBreaker=off,
            backpressure={**off, "maxMailboxSize": 0},
        )
    )
    assert r.rate(SENDER, 0) is None
    assert r.gate(A, SUBJECT, SENDER, 5, now=0) == (None, False, [])
