"""Sessions, subscriptions and the choice of consumer: pure, no sockets."""

from __future__ import annotations

from broker.router.consumers import (
    CONSUME,
    FETCH,
    OBSERVE,
    SESSION_TIMEOUT_MS,
    Consumers,
    Released,
)

SUBJECT = "relay.agent.p.a"


def test_message_goes_to_the_consumer_with_fewest_in_hand_and_only_with_credit():
    c = Consumers()
    one = c.subscribe(b"one", "relay.agent.>", CONSUME, credit=2, now_ms=0)
    two = c.subscribe(b"two", SUBJECT, CONSUME, credit=1, now_ms=0)
    picked = []
    for _ in range(3):
        sub = c.pick_consumer(SUBJECT)
        sub.inflight += 1  # the router reserves credit when it sends the claim
        picked.append(sub.id)
    assert sorted(picked) == sorted([one.id, one.id, two.id])
    assert c.pick_consumer(SUBJECT) is None  # all credit used


def test_observers_are_never_picked_as_consumers():
    c = Consumers()
    watcher = c.subscribe(b"w", ">", OBSERVE, credit=1, now_ms=0)
    assert c.pick_consumer(SUBJECT) is None
    assert c.observers(SUBJECT) == [watcher]


def test_settling_gives_credit_back_and_returns_what_was_held_once():
    c = Consumers()
    sub = c.subscribe(b"me", SUBJECT, CONSUME, credit=1, now_ms=0)
    sub.inflight += 1
    c.handed_out(sub, "ID1", "h", "relay.sender", 1, 0)
    assert c.settled(b"me", "ID1", "h").sender == "relay.sender"
    assert sub.inflight == 0
    assert c.settled(b"me", "ID1", "h") is None  # a second ack is refused
    assert c.settled(b"other", "ID1", "h") is None


def test_an_answer_to_an_earlier_hand_out_does_not_settle_a_later_one():
    c = Consumers()
    sub = c.subscribe(b"me", SUBJECT, CONSUME, credit=1, now_ms=0)
    c.handed_out(sub, "ID1", "h", "s", 2, 0)
    assert c.settled(b"me", "ID1", "h", deliveries=1) is None
    assert c.settled(b"me", "ID1", "h", deliveries=2) is not None


def test_silent_sessions_expire_and_take_their_subscriptions_along():
    c = Consumers()
    c.subscribe(b"quiet", SUBJECT, CONSUME, credit=1, now_ms=0)
    c.touch(b"chatty", SESSION_TIMEOUT_MS)
    assert c.expired(SESSION_TIMEOUT_MS + 1) == [b"quiet"]
    c.end_session(b"quiet")
    assert c.pick_consumer(SUBJECT) is None and c.subs == {}


def test_the_session_timeout_is_configurable():
    c = Consumers(session_timeout_ms=60_000)
    c.touch(b"slow", 0)
    assert c.expired(SESSION_TIMEOUT_MS + 1) == []
    assert c.expired(60_001) == [b"slow"]


def test_what_a_gone_client_held_is_released_with_its_hand_out_count():
    c = Consumers()
    sub = c.subscribe(b"me", SUBJECT, CONSUME, credit=2, now_ms=0)
    c.handed_out(sub, "ID2", "h", "s", 3, 0)
    c.handed_out(sub, "ID1", "h", "s", 1, 0)
    c.end_session(b"me")
    assert c.take_released() == [Released("ID1", "h", 1, "gone"), Released("ID2", "h", 3, "gone")]
    assert c.take_released() == []


def test_a_claim_past_its_ack_deadline_is_taken_back_and_in_progress_restarts_the_clock():
    c = Consumers()
    sub = c.subscribe(b"me", SUBJECT, CONSUME, credit=2, now_ms=0, ack_wait=1000)
    sub.inflight = 2
    c.handed_out(sub, "ID1", "h", "s", 1, 0)
    c.handed_out(sub, "ID2", "h", "s", 1, 0)
    assert c.in_progress(b"me", "ID2", "h", 1, now_ms=900) is not None
    assert c.overdue(1001) == 1
    assert c.take_released() == [Released("ID1", "h", 1, "ack_wait")]
    assert sub.inflight == 1  # its credit came back
    assert c.settled(b"me", "ID1", "h", 1) is None  # a late ack is refused
    assert c.overdue(1901) == 1


def test_a_client_that_comes_back_with_its_token_keeps_its_claims():
    c = Consumers()
    first = c.touch(b"conn1", 0, "uid:1")
    sub = c.subscribe(b"conn1", SUBJECT, CONSUME, credit=1, now_ms=0)
    c.handed_out(sub, "ID1", "h", "s", 1, 0)
    second = c.touch(b"conn2", 10, "uid:1")
    assert c.resume(second, first.token, [], 10) == 1
    assert b"conn1" not in c.sessions and c.take_released() == []
    assert second.token == first.token
    assert c.settled(b"conn2", "ID1", "h", 1) is not None


def test_a_token_of_other_credentials_takes_nothing():
    c = Consumers()
    first = c.touch(b"conn1", 0, "uid:1")
    sub = c.subscribe(b"conn1", SUBJECT, CONSUME, credit=1, now_ms=0)
    c.handed_out(sub, "ID1", "h", "s", 1, 0)
    thief = c.touch(b"conn2", 10, "uid:2")
    assert c.resume(thief, first.token, [("ID1", "h", 1, None)], 10) == 0
    assert c.holds(b"conn1", "ID1", "h") is not None


def test_orphans_wait_one_session_timeout_for_their_holder_then_are_released():
    c = Consumers()
    assert c.add_orphans([("ID1", "h", 1), ("ID2", "h", 2)], now_ms=0) == 2
    back = c.touch(b"back", 100, "uid:1")
    # The holder names ID1 as it was handed to it; a wrong count is not its hand-out.
    holding = [("ID1", "h", 1, None), ("ID2", "h", 1, None)]
    assert c.resume(back, "a-token-from-before", holding, 100) == 1
    assert c.overdue(SESSION_TIMEOUT_MS) == 0
    assert c.overdue(SESSION_TIMEOUT_MS + 1) == 1
    assert c.take_released() == [Released("ID2", "h", 2, "orphan")]


def test_an_ack_naming_an_orphans_hand_out_settles_it():
    c = Consumers()
    c.add_orphans([("ID1", "h", 1)], now_ms=0)
    c.touch(b"back", 100)
    assert c.settled(b"back", "ID1", "h") is None  # which hand-out? not said
    assert c.settled(b"back", "ID1", "h", 1) is not None
    assert c.orphans == {}


def test_a_fetch_is_answered_when_its_claims_are_in_or_its_wait_is_over():
    c = Consumers()
    fetch = c.subscribe(b"me", SUBJECT, FETCH, credit=5, now_ms=0)
    fetch.wait_until = 1000
    fetch.inflight = 2  # two claims sent
    assert c.fetches_to_answer(0) == []
    fetch.fetched.append(("ID1", "h", 1, b"{}"))
    assert c.fetches_to_answer(0) == []  # one claim still out
    fetch.fetched.append(("ID2", "h", 1, b"{}"))
    assert c.fetches_to_answer(0) == [fetch]
    empty = c.subscribe(b"me", SUBJECT, FETCH, credit=5, now_ms=0)
    empty.wait_until = 1000
    assert c.fetches_to_answer(999) == [fetch]
    assert c.fetches_to_answer(1000) == [fetch, empty]


def test_a_claim_named_before_its_writer_said_hello_is_taken_on_the_clients_word():
    c = Consumers()
    back = c.touch(b"back", 100, "uid:1")
    holding = [("ID1", "h", 2, 60_000), ("ID2", "h", 1, None)]
    assert c.resume(back, None, holding, 100, unknown=lambda i, e: i == "ID1") == 1
    held = c.holds(b"back", "ID1", "h")
    assert (held.deliveries, held.since, held.ack_wait) == (2, 100, 60_000)
    assert c.add_orphans([("ID1", "h", 2)], now_ms=200) == 0  # the writer's hello
    assert c.orphans == {}  # not an orphan: its holder named it
