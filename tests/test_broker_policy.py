"""Budgets, access rules, dead letters and signals, through real processes."""

from __future__ import annotations

import os
import threading
import time

import pytest
import zmq

from sdk import wire
from sdk.errors import AccessDenied, LimitExceeded
from sdk.paths import UNROUTABLE
from sdk.types import AccessRule, RuleAction, Signal, SignalType, default_budget
from tests.harness import park_io_thread, signals_flowing, wait_for

pytestmark = pytest.mark.integration

A = "relay.agent.demo.a"
B = "relay.agent.demo.b"
SENDER = "relay.agent.demo.cli"
SPAMMER = "relay.agent.spammer"


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.parametrize(
    ("overrides", "code", "reason"),
    [
        ({"hop_count": 5}, "hop_limit", "max hops exceeded (5/5)"),
        ({"ancestor_chain": (A,)}, "cycle_detected", f"cycle detected: {A} already in chain"),
        ({"ttl": 1}, "ttl_expired", "message expired (TTL)"),
        ({"call_budget_remaining": 0}, "budget_exhausted", "call budget exhausted"),
    ],
    ids=["hops", "cycle", "ttl", "calls"],
)
def test_budget_violation_becomes_a_dead_letter_with_its_reason(broker, overrides, code, reason):
    client = broker.client()
    info = client.register_endpoint(A)
    budget = default_budget(now_ms(), **overrides)
    result = client.publish(A, "x", sender=SENDER, budget=budget)
    assert result.delivered_to == 0
    assert result.rejected == ((info.hash, "budget_exceeded"),)
    assert result.details[info.hash] == reason
    [letter] = client.dead_letters(info.hash)
    assert (letter["id"], letter["code"], letter["reason"]) == (result.message_id, code, reason)
    assert os.listdir(os.path.join(info.maildir_path, "new")) == []


def test_reply_chain_between_two_agents_is_stopped_as_a_cycle(broker):
    client = broker.client()
    client.register_endpoint(A)
    info_b = client.register_endpoint(B)
    outcomes = []
    done = threading.Event()

    def agent(me):
        def handle(envelope):
            result = client.reply(envelope, {"from": me}, sender=me)
            outcomes.append(result)
            if result.delivered_to == 0:
                done.set()

        return handle

    client.subscribe(A, agent(A))
    client.subscribe(B, agent(B))
    client.publish(B, "start", sender=A, reply_to=A)
    assert done.wait(20), "the loop was never stopped"
    # B answered A (delivered), A answered B: B is already in the chain.
    last = outcomes[-1]
    assert last.rejected == ((info_b.hash, "budget_exceeded"),)
    assert last.details[info_b.hash] == f"cycle detected: {B} already in chain"


def test_deny_rule_blocks_and_higher_priority_allow_wins(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    client.add_rule(AccessRule("relay.agent.>", A, RuleAction.DENY, priority=1))
    denied = client.publish(A, "x", sender="relay.agent.intruder")
    assert denied.rejected == ((info.hash, "access_denied"),)
    assert client.dead_letters(info.hash)[0]["code"] == "access_denied"
    client.add_rule(AccessRule("relay.agent.friend", A, RuleAction.ALLOW, priority=5))
    assert client.publish(A, "x", sender="relay.agent.friend").delivered_to == 1
    assert client.publish(A, "x", sender="relay.agent.intruder").delivered_to == 0
    assert [r.priority for r in client.list_rules()] == [5, 1]
    assert client.remove_rule("relay.agent.>", A)
    assert client.publish(A, "x", sender="relay.agent.intruder").delivered_to == 1


def test_publish_matching_no_endpoint_is_kept_as_unroutable_dead_letter(broker):
    client = broker.client()
    result = client.publish("relay.agent.nobody", "lost?", sender=SENDER)
    assert result.delivered_to == 0 and result.rejected == (("*", "no_match"),)
    [letter] = client.dead_letters(UNROUTABLE)
    assert letter["id"] == result.message_id
    assert letter["reason"] == "no matching endpoints"
    assert letter["envelope"]["payload"] == "lost?"


def test_dead_letters_are_listed_and_purged(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    for _ in range(3):
        client.publish(A, "x", sender=SENDER, budget=default_budget(now_ms(), ttl=1))
    assert len(client.dead_letters(info.hash)) == 3
    assert client.purge_dead_letters(info.hash) == 3
    assert client.dead_letters(info.hash) == []
    assert os.listdir(os.path.join(info.maildir_path, "failed")) == []


def test_signals_reach_matching_handlers_and_never_touch_disk(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    got, other = [], []
    client.on_signal("relay.agent.demo.*", lambda subject, sig: got.append((subject, sig)))
    client.on_signal("relay.agent.elsewhere", lambda subject, sig: other.append(sig))

    def typing(state):
        return Signal(SignalType.TYPING, state, A, now_ms(), {"who": "me"})

    signals_flowing(client, A)
    got.clear()
    client.signal(A, typing("active"))
    wait_for(lambda: any(s.state == "active" for _, s in got), what="the typing signal")
    subject, sig = next((s, g) for s, g in got if g.state == "active")
    assert subject == A and sig.type == SignalType.TYPING and sig.data == {"who": "me"}
    assert other == []
    for sub in ("tmp", "new", "cur", "failed"):
        assert os.listdir(os.path.join(info.maildir_path, sub)) == []
    assert client.trace(client.publish(A, 1, sender=SENDER).message_id)["copies"]
    status = client.status()
    assert [e["depth"] for e in status["endpoints"]] == [1]  # only the message counts


def test_a_signal_sent_without_waiting_arrives_and_a_refused_one_is_dropped_quietly(broker):
    client = broker.client()
    client.add_rule(AccessRule(SPAMMER, A, RuleAction.DENY, priority=1))
    got = []  # typing signals only: probes of signals_flowing may still be arriving
    client.on_signal(A, lambda _s, sig: sig.type == SignalType.TYPING and got.append(sig.state))
    signals_flowing(client, A)
    # A refused signal (denied by a rule) raises when waited for ...
    with pytest.raises(AccessDenied):
        client.signal(A, Signal(SignalType.TYPING, "waited", A, now_ms()), sender=SPAMMER)
    # ... and without waiting is dropped, with no error for anyone, while the next
    # signal of the same connection, sent the same way, arrives.
    client.signal(A, Signal(SignalType.TYPING, "denied", A, now_ms()), sender=SPAMMER, wait=False)
    client.signal(A, Signal(SignalType.TYPING, "allowed", A, now_ms()), wait=False)
    wait_for(lambda: "allowed" in got, what="the signal sent without waiting")
    assert got == ["allowed"]


def test_the_router_sends_no_reply_to_a_signal_that_asked_for_none(broker):
    sock = broker.raw_dealer()
    try:
        signal = Signal(SignalType.PROGRESS, "50%", A, now_ms()).to_wire()
        sock.send_multipart(wire.encode_request("signal", 1, subject=A, signal=signal, reply=False))
        sock.send_multipart(wire.encode_request("signal", 2, subject="bad..subject", reply=False))
        sock.send_multipart(wire.encode_request("ping", 3))
        # Replies keep the order of requests on one connection: the first is the
        # ping's, so neither signal (good or bad) was answered.
        reply = wire.decode_incoming_all(sock.recv_multipart())
        assert [r.rid for r in reply] == [3]
    finally:
        sock.close()


def test_a_greedy_client_budget_is_clamped_to_the_configured_maxima(broker):
    client = broker.client()
    client.register_endpoint(A)
    got = []
    client.subscribe(A, got.append)
    greedy = default_budget(
        now_ms(), max_hops=1000, call_budget_remaining=10**6, ttl=now_ms() + 10**10
    )
    client.publish(A, "x", sender=SENDER, budget=greedy)
    [envelope] = wait_for(lambda: got, what="the message")
    assert envelope.budget.max_hops == 16
    assert envelope.budget.call_budget_remaining == 100 - 1  # clamped, then one call used
    assert envelope.budget.ttl <= now_ms() + 86_400_000


def test_a_reply_naming_its_parent_carries_the_parents_stored_budget_not_a_fresh_one(broker):
    client = broker.client()
    client.register_endpoint(A)
    client.register_endpoint(B)
    at_b, at_a = [], []
    client.subscribe(B, at_b.append)
    client.subscribe(A, at_a.append)
    client.publish(B, "question", sender=A, reply_to=A)
    [question] = wait_for(lambda: at_b, what="the question at B")
    # B answers with a forged, fresh budget; the router uses the parent's stored one.
    fresh = default_budget(now_ms())
    client.publish_async(A, "answer", sender=B, budget=fresh, parent_id=question.id).result(10)
    [answer] = wait_for(lambda: at_a, what="the answer at A")
    assert answer.budget.hop_count == question.budget.hop_count + 1 == 2
    assert answer.budget.ancestor_chain == (B, A)


def test_a_burst_of_signals_sent_without_waiting_arrives_whole_and_in_order(broker, monkeypatch):
    # A tiny buffer: most sends find it full and must wait for the I/O thread rather
    # than drop a signal.
    monkeypatch.setattr("sdk.client.QUIET_SIGNALS_LIMIT", 3)
    client = broker.client()
    got = []  # progress signals only: probes of signals_flowing may still be arriving
    client.on_signal(
        "relay.agent.demo.*",
        lambda subject, sig: sig.type == SignalType.PROGRESS and got.append((subject, sig.data)),
    )
    signals_flowing(client, A)
    # Runs of five on each subject in turn: each run may leave as one message, and
    # a wildcard subscriber must still see the order they were sent in.
    sent = [(A if n // 5 % 2 else B, {"n": n}) for n in range(1500)]
    for subject, data in sent:
        client.signal(
            subject, Signal(SignalType.PROGRESS, "on", subject, now_ms(), data), wait=False
        )
    wait_for(lambda: len(got) >= len(sent), what="every signal of the burst")
    assert got == sent


def test_a_signal_that_must_not_block_is_refused_at_once_when_no_room_waits(broker, monkeypatch):
    # For an event loop (the federation bridge's): a full queue refuses, never waits.
    monkeypatch.setattr("sdk.client.QUIET_SIGNALS_LIMIT", 1)
    client = broker.client(timeout=30)
    release = park_io_thread(client)  # nothing leaves: the one place stays taken
    try:
        progress = Signal(SignalType.PROGRESS, "on", A, now_ms())
        client.signal(A, progress, wait=False, block=False)
        with pytest.raises(LimitExceeded):  # not Timeout: it did not wait for room
            client.signal(A, progress, wait=False, block=False)
    finally:
        release.set()


def _progress_seen(client) -> list[str]:
    states: list[str] = []  # progress signals only: probes of signals_flowing may still come
    client.on_signal(
        A, lambda _s, sig: sig.type == SignalType.PROGRESS and states.append(sig.state)
    )
    signals_flowing(client, A)
    return states


def test_a_signal_without_reply_never_overtakes_a_request_sent_before_it(broker):
    client = broker.client()
    states = _progress_seen(client)
    release = park_io_thread(client)
    # All three wait in the I/O thread's queue; the middle one is a request.
    client.signal(A, Signal(SignalType.PROGRESS, "1", A, now_ms()), wait=False)
    waited = Signal(SignalType.PROGRESS, "2", A, now_ms()).to_wire()
    request = client.send_request("signal", subject=A, signal=waited)
    client.signal(A, Signal(SignalType.PROGRESS, "3", A, now_ms()), wait=False)
    release.set()
    request.result(10)
    wait_for(lambda: len(states) >= 3, what="the three signals")
    assert states == ["1", "2", "3"]


def test_signals_and_requests_of_one_thread_keep_their_order_while_other_threads_send(broker):
    client, receiver = broker.client(timeout=30), broker.client()
    states = _progress_seen(receiver)
    stop = threading.Event()

    def noise() -> None:  # other threads opening and closing segments all along
        while not stop.is_set():
            client.signal(A, Signal(SignalType.TYPING, "x", A, 0), wait=False)
            client.send_request("ping")

    others = [threading.Thread(target=noise) for _ in range(2)]
    for thread in others:
        thread.start()
    try:
        requests = []
        for n in range(300):  # quiet, request, quiet, request ...: both directions
            client.signal(A, Signal(SignalType.PROGRESS, f"q{n}", A, 0), wait=False)
            waited = Signal(SignalType.PROGRESS, f"r{n}", A, 0).to_wire()
            requests.append(client.send_request("signal", subject=A, signal=waited))
    finally:
        stop.set()
        for thread in others:
            thread.join(10)
    for request in requests:
        request.result(30)
    wait_for(lambda: len(states) >= 600, what="every progress signal")
    assert states == [f"{kind}{n}" for n in range(300) for kind in "qr"]


def test_signals_without_reply_leave_while_a_caller_holds_the_clients_lock(broker):
    # A caller blocked on a full queue to the I/O thread holds the client's lock; the
    # I/O thread must empty that queue without taking the lock, or both wait forever.
    client = broker.client()
    states = _progress_seen(client)
    release = park_io_thread(client)
    client.signal(A, Signal(SignalType.PROGRESS, "sent", A, now_ms()), wait=False)
    with client._transport._lock:
        release.set()
        wait_for(lambda: states == ["sent"], what="the signal, with the client's lock held")


def _raw_subscriber(broker, topic: bytes) -> zmq.Socket:
    """A bare SUB on the signals socket, subscribed to ``topic``, once signals on A
    reach it (its subscription travels asynchronously); the caller closes it."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(broker.home.signals_address)
    client = broker.client()
    probe = Signal(SignalType.PRESENCE, "probe", A, now_ms())
    wait_for(lambda: client.signal(A, probe) or sub.poll(50), what="the SUB to join")
    return sub


def _send_progress_batch(broker, count: int) -> None:
    """``count`` signals on A without reply, in one request frame: one pass of the router."""
    batch = [
        {
            "op": "signal",
            "rid": 0,
            "reply": False,
            "subject": A,
            "signal": Signal(SignalType.PROGRESS, str(n), A, now_ms()).to_wire(),
        }
        for n in range(count)
    ]
    dealer = broker.raw_dealer()
    try:
        dealer.send_multipart([wire.MAGIC, wire.packb(batch)])
    finally:
        dealer.close(linger=1000)


def _progress_messages(sub: zmq.Socket, signals_wanted: int) -> list[tuple[bytes, list]]:
    """(topic, maps) of each message holding progress signals, until that many came
    (probes still arriving are skipped)."""
    got: list[tuple[bytes, list]] = []
    while sum(len(maps) for _, maps in got) < signals_wanted:
        assert sub.poll(10_000), f"only {got} arrived"
        frames = sub.recv_multipart()
        _, maps = wire.decode_signals(frames)
        progress = [m for m in maps if m["type"] == "progress"]
        if progress:
            got.append((frames[0], progress))
    return got


def test_signals_that_follow_each_other_on_a_subject_leave_the_router_as_one_run(broker):
    sub = _raw_subscriber(broker, wire.SIGNAL_RUN + A.encode())
    try:
        _send_progress_batch(broker, 100)
        [(topic, signals)] = _progress_messages(sub, 100)
        assert topic == wire.SIGNAL_RUN + A.encode()
        assert [s["state"] for s in signals] == [str(n) for n in range(100)]
    finally:
        sub.close()


def test_a_version_1_subscriber_gets_each_signal_as_its_own_message(broker):
    sub = _raw_subscriber(broker, A.encode())  # no "+": one signal per message
    try:
        _send_progress_batch(broker, 20)
        got = _progress_messages(sub, 20)
        assert [topic for topic, _ in got] == [A.encode()] * 20
        assert [maps[0]["state"] for _, maps in got] == [str(n) for n in range(20)]
    finally:
        sub.close()


def test_a_client_of_a_router_without_runs_subscribes_to_single_signals(broker):
    client = broker.client()
    client.server = {**client.server, "signalRuns": False}  # as a version 1 router says
    topics: list[bytes] = []
    dispatch = client._signals.dispatch

    def noting_topics(frames: list[bytes]) -> None:
        topics.append(bytes(frames[0]))
        dispatch(frames)

    client._signals.dispatch = noting_topics
    states = _progress_seen(client)
    _send_progress_batch(broker, 20)  # one pass: one run, and the singles it asked for
    wait_for(lambda: len(states) >= 20, what="the signals, one per message")
    assert states == [str(n) for n in range(20)]
    assert not [t for t in topics if t.startswith(wire.SIGNAL_RUN)]
