"""Sessions, subscriptions and the choice of consumer: pure, no sockets."""

from __future__ import annotations

from broker.router.consumers import CONSUME, OBSERVE, SESSION_TIMEOUT_MS, Consumers

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


def test_settling_gives_credit_back_and_returns_the_sender_once():
    c = Consumers()
    sub = c.subscribe(b"me", SUBJECT, CONSUME, credit=1, now_ms=0)
    sub.inflight += 1
    c.handed_out(sub, "ID1", "h", "relay.sender")
    assert c.settled(b"me", "ID1", "h") == "relay.sender"
    assert sub.inflight == 0
    assert c.settled(b"me", "ID1", "h") is None  # a second ack is refused
    assert c.settled(b"other", "ID1", "h") is None


def test_silent_sessions_expire_and_take_their_subscriptions_along():
    c = Consumers()
    c.subscribe(b"quiet", SUBJECT, CONSUME, credit=1, now_ms=0)
    c.touch(b"chatty", SESSION_TIMEOUT_MS)
    assert c.expired(SESSION_TIMEOUT_MS + 1) == [b"quiet"]
    c.end_session(b"quiet")
    assert c.pick_consumer(SUBJECT) is None and c.subs == {}


def test_unacked_messages_survive_the_end_of_a_session_as_pending_not_requeued():
    c = Consumers()
    sub = c.subscribe(b"me", SUBJECT, CONSUME, credit=1, now_ms=0)
    sub.inflight += 1
    c.handed_out(sub, "ID1", "h", "relay.sender")
    session = c.end_session(b"me")
    assert session.unacked == {("ID1", "h"): (sub.id, "relay.sender")}
