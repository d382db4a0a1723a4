"""Fixed sequences through the model test's state machine (tests/model/, docs/testing.md):
one per part of the consumer's contract, so that each is exercised on every run (the
random sequences of tests/test_model_delivery.py reach some only now and then), and the
two router bugs the model found, as expected failures.

Each sequence runs its steps with the machine's own checks after each (the same settle
and model), then asserts that the behaviour it is named for did happen, so that a
sequence cannot pass by doing nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

import tests.model.machine as machine_module
from tests.model.knobs import SKIP
from tests.model.machine import DeliveryMachine
from tests.model.world import Receipt, World

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ALONE = {"backlog": 0, "consumers": [], "processes": []}  # setup with nothing but endpoints


@pytest.fixture(autouse=True)
def outside_hypothesis(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine notes its steps for Hypothesis, which refuses notes outside a test."""
    monkeypatch.setattr(machine_module, "note", lambda text: None)


def play(*steps: tuple[str, dict[str, Any]]) -> World:
    """Run the rules in order, each followed by the machine's settle and check; returns
    the world (its processes stopped) to look at what happened."""
    machine = DeliveryMachine()
    try:
        for rule, arguments in steps:
            getattr(machine, rule)(**arguments)
            machine.settled()
    finally:
        machine.teardown()
    return machine.world


def hand_outs(world: World) -> list[Receipt]:
    return [r for s in world.subs if s.mode != "observe" for r in s.receipts]


def test_what_a_killed_consumer_held_is_handed_out_again_counted() -> None:
    world = play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "processes": [("m.a.e0", 3)]}),
        ("publish", {"publisher": 0, "sender": "s.alice", "to": "m.a.e0", "count": 5}),
        ("kill_consumer", {"which": 0}),
        ("subscribe", {"which": 0, "consumer": ("m.a.e0", "ack", None, None)}),
    )
    assert sorted(r.deliveries for r in hand_outs(world)) == [1] * 5 + [2] * 3


def test_what_a_silent_consumer_held_is_handed_out_after_its_session_timeout() -> None:
    world = play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "processes": [("m.a.e0", 2)]}),
        ("publish", {"publisher": 0, "sender": "s.alice", "to": "m.a.e0", "count": 3}),
        ("silence_consumer", {"which": 0}),
        ("subscribe", {"which": 0, "consumer": ("m.a.e0", "ack", None, None)}),
    )
    assert sorted(r.deliveries for r in hand_outs(world)) == [1, 1, 1, 2, 2]


def test_fetched_messages_past_their_ack_deadline_go_to_the_next_fetch() -> None:
    world = play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "backlog": 3}),
        ("fetch", _fetch(batch=2, ack_wait=0.5)),
        ("fetch", _fetch(batch=5)),
        ("answer", {"which": 0, "how": "ack"}),  # the first fetch's: refused
        ("answer", {"which": 1, "how": "nack"}),  # the second's: a dead letter
        ("answer", {"which": 0, "how": "in_progress"}),
    )
    first, second = (s.receipts for s in world.subs if s.mode == "fetch")
    assert [r.deliveries for r in first] == [1, 1]
    assert all(r.refused_at is not None for r in first)
    assert sorted(r.deliveries for r in second) == [1, 2, 2]


def test_a_message_whose_consumers_keep_dying_ends_as_a_dead_letter() -> None:
    world = play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "backlog": 1}),
        ("set_max_deliveries", {"value": 2}),
        ("spawn_consumer", {"pattern": "m.a.e0", "credit": 1}),
        ("kill_consumer", {"which": 0}),
        ("spawn_consumer", {"pattern": "m.a.e0", "credit": 1}),
        ("kill_consumer", {"which": 0}),
        ("publish", {"publisher": 0, "sender": "s.alice", "to": "m.a.e0", "count": 1}),
        ("fetch", _fetch(then="ack")),  # the rest flows on
    )
    assert [r.deliveries for r in hand_outs(world)] == [1, 2, 1]


def test_a_held_message_past_its_ack_deadline_comes_back_until_max_deliveries() -> None:
    # Each step's settle waits for the hand-out held when it began to pass its deadline
    # (and be handed out again): two more steps see the third hand-out and its end.
    world = play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "consumers": [("m.a.e0", "hold", 1, 1.0)]}),
        ("set_max_deliveries", {"value": 3}),
        ("publish", {"publisher": 0, "sender": "s.alice", "to": "m.a.e0", "count": 1}),
        ("set_default_credit", {"credit": 64}),
        ("set_default_credit", {"credit": 64}),
        ("release", {"which": 0}),
    )
    assert [r.deliveries for r in hand_outs(world)] == [1, 2, 3]  # then a dead letter


def test_claims_of_a_dead_consumer_are_handed_out_after_a_router_restart() -> None:
    world = play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "processes": [("m.a.e0", 2)]}),
        ("publish", {"publisher": 0, "sender": "s.alice", "to": "m.a.e0", "count": 2}),
        ("kill_consumer", {"which": 0}),
        ("restart_router", {"writers": None}),  # it learns of them from cur/: orphans
        ("subscribe", {"which": 0, "consumer": ("m.a.e0", "ack", None, None)}),
    )
    assert sorted(r.deliveries for r in hand_outs(world)) == [1, 1, 2, 2]


def test_a_live_consumer_keeps_what_it_holds_when_writers_come_back_after_its_hello() -> None:
    if "resume_race" in SKIP:
        pytest.skip("RELAY_MODEL_SKIP=resume_race relaxes this expectation")
    play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "consumers": [("m.a.e0", "hold", 1, None)]}),
        ("publish", {"publisher": 0, "sender": "s.alice", "to": "m.a.e0", "count": 1}),
        ("restart_router", {"writers": "after_hello"}),
        ("release", {"which": 0}),
    )


def test_a_fetched_message_keeps_its_ack_deadline_across_a_router_restart() -> None:
    if "resumed_ack_wait" in SKIP:
        pytest.skip("RELAY_MODEL_SKIP=resumed_ack_wait relaxes this expectation")
    play(
        ("setup", {**ALONE, "subjects": ["m.a.e0"], "backlog": 1}),
        ("fetch", _fetch(ack_wait=2.0)),
        ("restart_router", {"writers": None}),
    )


def _fetch(
    batch: int = 1, ack_wait: float | None = None, then: str | None = None
) -> dict[str, Any]:
    return {
        "which": 0,
        "pattern": "m.a.e0",
        "batch": batch,
        "wait": 0.0,
        "ack_wait": ack_wait,
        "then": then,
    }
