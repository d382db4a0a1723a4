"""Behaviours of the sync SDK client (sdk/client.py) against real router and writer processes.

Messaging through the broker is covered by tests/test_broker_*.py; these are about the
client itself: its lifecycle, pipelining, threads and flow control.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from broker.config import DEFAULT_CONFIG
from sdk import subscription as subscription_module
from sdk import wire
from sdk.client import connect
from sdk.errors import InvalidMessage, Unavailable
from sdk.ids import new_id
from sdk.subscription import Delivery, SubscriptionWorker
from sdk.transport import HEARTBEAT_S, ping_interval
from sdk.types import Envelope, Signal, SignalType, StandardPayload
from tests.harness import StandIn, depth, wait_for
from tests.test_types import make_envelope

pytestmark = pytest.mark.integration

A = "relay.agent.demo.a"
B = "relay.agent.demo.b"
SENDER = "relay.agent.demo.cli"


def in_new(maildir: str) -> list[str]:
    return sorted(name.split(",")[0] for name in os.listdir(os.path.join(maildir, "new")))


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("relay-client")]


def test_context_manager_closes_cleanly_and_a_closed_client_is_unavailable(broker):
    watcher = broker.client()
    watcher.register_endpoint(A)
    threads_before = set(client_threads())
    with connect(broker.home.root) as client:
        client.subscribe(A, lambda envelope: None)
        client.on_signal(A, lambda subject, sig: None)
        # A session of the harness's readiness probe whose `bye` timed out (a loaded
        # machine) may still count: it ends after 5 s of silence.
        wait_for(lambda: watcher.status()["clients"] == 2, what="only these two sessions")
        assert watcher.status()["subscriptions"] == 1
    # `bye` ended the session at once: no subscription waits for the 5 s silence
    status = watcher.status()
    assert status["clients"] == 1 and status["subscriptions"] == 0
    wait_for(lambda: set(client_threads()) <= threads_before, what="the client's threads")
    with pytest.raises(Unavailable, match="closed"):
        client.status()
    with pytest.raises(Unavailable, match="closed"):
        client.publish(A, 1, sender=SENDER)
    with pytest.raises(Unavailable, match="closed"):
        client.publish_async(A, 1, sender=SENDER)
    client.close()  # closing twice is harmless


def test_two_hundred_publishes_in_flight_resolve_with_distinct_ids_in_order(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    client.set_config({"rateLimit": {"enabled": False}})  # 200 from one sender at once
    futures = [client.publish_async(A, i, sender=SENDER) for i in range(200)]
    results = [f.result(30) for f in futures]
    ids = [r.message_id for r in results]
    assert len(set(ids)) == 200
    assert ids == sorted(ids), "ids increase in the order the publishes were sent"
    assert all(r.delivered_to == 1 and r.rejected == () for r in results)
    assert in_new(info.maildir_path) == ids
    assert depth(client, A) == 200


def test_unsubscribe_stops_deliveries_and_later_messages_wait_in_new(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    got: list[Envelope] = []
    unsubscribe = client.subscribe(A, got.append)
    first = client.publish(A, "before", sender=SENDER).message_id
    wait_for(lambda: client.trace(first)["copies"][0]["state"] == "done", what="the ack")
    unsubscribe()
    assert client.status()["subscriptions"] == 0
    later = [client.publish(A, i, sender=SENDER).message_id for i in range(3)]
    assert in_new(info.maildir_path) == later
    assert depth(client, A) == 3
    assert [c["state"] for m in later for c in client.trace(m)["copies"]] == ["new"] * 3
    assert [e.id for e in got] == [first]
    unsubscribe()  # a second call does nothing
    # nothing was lost: a new subscription gets the backlog
    client.subscribe(A, got.append)
    wait_for(lambda: len(got) == 4, what="the backlog")
    assert [e.id for e in got] == [first, *later]


def test_a_slow_handler_does_not_block_requests_from_the_same_client(broker):
    client = broker.client(timeout=5)
    client.register_endpoint(A)
    client.register_endpoint(B)
    entered, release = threading.Event(), threading.Event()
    replies: list = []

    def slow(envelope: Envelope) -> None:
        # the handler thread itself can make requests: replies do not go through it
        replies.append(client.reply(envelope, "ack-ish", sender=A))
        entered.set()
        release.wait(30)

    client.subscribe(A, slow)
    try:
        client.publish(A, "work", sender=SENDER, reply_to=B)
        assert entered.wait(10), "the handler started"
        assert replies[0].delivered_to == 1
        # while the handler blocks, the same client keeps publishing and asking
        results = [client.publish(B, i, sender=SENDER, timeout=5) for i in range(5)]
        assert all(r.delivered_to == 1 for r in results)
        assert depth(client, B) == 6  # the reply and the five
        assert client.pending(A)[0]["state"] == "claimed"
    finally:
        release.set()
    wait_for(lambda: client.pending(A) == [], what="the slow handler's ack")


def test_credit_bounds_the_messages_a_blocked_subscription_holds(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    started, release = threading.Event(), threading.Event()
    handled: list[int] = []

    def blocked(envelope: Envelope) -> None:
        started.set()
        release.wait(30)
        handled.append(envelope.payload)

    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(6)]
    client.subscribe(A, blocked, credit=2)
    try:
        assert started.wait(10)
        claimed = wait_for(
            lambda: len(client.pending(A)) == 2 and client.pending(A), what="two claimed"
        )
        assert sorted(p["id"] for p in claimed) == ids[:2]
        # more publishes do not get past the credit either
        ids += [client.publish(A, i, sender=SENDER).message_id for i in range(6, 8)]
        assert sorted(p["id"] for p in client.pending(A)) == ids[:2]
        assert in_new(info.maildir_path) == ids[2:]
        assert depth(client, A) == 6
        assert handled == []
    finally:
        release.set()
    wait_for(lambda: len(handled) == 8, what="every message once released")
    assert handled == list(range(8))
    wait_for(lambda: client.pending(A) == [] and depth(client, A) == 0, what="all acked")


def test_standard_payload_is_published_as_its_wire_dict(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    payload = StandardPayload(
        content="hello",
        sender_name="Frontend",
        attachments=("/tmp/report.pdf",),
        performative="request",
        correlation_id="c-1",
        platform_data={"slack": {"ts": "1.2"}},
    )
    wire = {
        "content": "hello",
        "senderName": "Frontend",
        "attachments": ["/tmp/report.pdf"],
        "performative": "request",
        "correlationId": "c-1",
        "platformData": {"slack": {"ts": "1.2"}},
    }
    got: list[Envelope] = []
    client.subscribe(A, got.append)
    message_id = client.publish(A, payload, sender=SENDER, reply_to=SENDER).message_id
    wait_for(lambda: got, what="the message")
    assert got[0].payload == wire == payload.to_wire()
    assert StandardPayload.from_wire(got[0].payload) == payload
    # replies convert it the same way
    answer = client.reply(got[0], StandardPayload("thanks"), sender=A)
    letters = client.dead_letters()  # SENDER has no endpoint: the reply is unroutable
    assert [d["id"] for d in letters] == [answer.message_id]
    assert letters[0]["envelope"]["payload"] == {"content": "thanks"}
    # and the message file holds the wire dict
    wait_for(lambda: client.trace(message_id)["copies"][0]["state"] == "done", what="the ack")
    [name] = os.listdir(os.path.join(info.maildir_path, "cur"))
    with open(os.path.join(info.maildir_path, "cur", name), "rb") as f:
        assert json.load(f)["payload"] == wire


def test_an_unencodable_value_is_refused_before_sending_and_the_client_goes_on(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    with pytest.raises(InvalidMessage, match=r"\['payload'\]\['x'\] cannot.*'object'") as err:
        client.publish(A, {"x": object()}, sender=SENDER)
    assert err.value.code == "invalid_message"
    signal = Signal(SignalType.PROGRESS, "busy", A, 1, data={"done": {1, 2}})
    for wait in (True, False):  # with and without a round trip
        with pytest.raises(InvalidMessage, match=r"\['data'\]\['done'\] cannot.*'set'"):
            client.signal(A, signal, sender=SENDER, wait=wait)
    with pytest.raises(InvalidMessage, match=r"\['rateLimit'\]\['maxPerWindow'\] cannot"):
        client.set_config({"rateLimit": {"maxPerWindow": 2**64}})
    # nothing reached the broker, and the same client goes on
    good = client.publish(A, {"x": 1}, sender=SENDER)
    assert good.delivered_to == 1
    assert in_new(info.maildir_path) == [good.message_id]
    assert client.get_config()["rateLimit"]["maxPerWindow"] == 100


def test_a_bad_item_in_a_run_of_signals_costs_only_itself(broker):
    client = broker.client()
    seen: list[str] = []
    client.on_signal("relay.agent.demo.*", lambda _subject, signal: seen.append(signal.state))
    good = [Signal(SignalType.TYPING, state, A, 1).to_wire() for state in ("a", "b")]
    run = wire.encode_signal_run(A, [wire.packb(good[0]), wire.packb(7), wire.packb(good[1])])
    client._signals.dispatch(run)  # as the signal thread does with a message that arrived
    assert seen == ["a", "b"]


@pytest.fixture
def slow_acks(monkeypatch):
    """Answers wait a minute for their deadline: only their count, or close(), sends them."""
    monkeypatch.setattr(subscription_module, "ACK_DELAY_S", 60.0)


def pending_ids(client) -> list[str]:
    return [p["id"] for p in client.pending(A)]


class _Recorder:
    """Stands in for the subscriptions a worker answers through: records order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._answers_waiting: set = set()

    def send_request(self, op: str, **fields) -> None:
        self.events.append(f"{op} {fields['id']}")

    def wake_for_answers(self) -> None:
        pass  # no I/O thread here: only the worker answers

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None:
        pass

    def answers_waiting(self, worker, waiting: bool) -> None:
        (self._answers_waiting.add if waiting else self._answers_waiting.discard)(worker)

    def follow(self, worker) -> bool:
        return False  # no socket here: the worker waits on its queue

    def stop_following(self, worker) -> None:
        pass


def _worker_after_burst(subscribe_result: dict, burst: int) -> list[str]:
    """A worker whose queue already holds ``burst`` messages when it starts."""
    recorder = _Recorder()

    def handler(envelope: Envelope) -> None:
        recorder.events.append(f"handled {envelope.payload}")

    worker = SubscriptionWorker(recorder, handler, "consume", {})
    for n in range(burst):
        envelope = make_envelope(id=new_id(), payload=f"m{n}")
        worker.queue.put(Delivery(1, f"m{n}", "3f0c5bd2a1e4", envelope.to_json()))
    worker.subscribed(subscribe_result)
    worker.stop()
    worker.thread.join(5)
    assert not worker.thread.is_alive()
    return recorder.events


def test_answers_to_a_burst_leave_together_a_quarter_of_the_credit_at_a_time(slow_acks):
    # With the delay out of the way, only the count decides here.
    events = _worker_after_burst({"sub": 1, "credit": 16}, burst=6)
    handled = [f"handled m{n}" for n in range(6)]
    acks = [f"ack m{n}" for n in range(6)]
    assert events == handled[:4] + acks[:4] + handled[4:] + acks[4:]


@pytest.mark.parametrize("result", [{"sub": 1}, {"sub": 1, "credit": 3}])
def test_without_room_to_wait_each_message_is_answered_at_once(result):
    """An older router (no credit in the reply) or credit under 4: no answer waits."""
    events = _worker_after_burst(result, burst=3)
    assert events == [e for n in range(3) for e in (f"handled m{n}", f"ack m{n}")]


def test_the_subscribe_reply_says_the_credit_granted(broker):
    sock = broker.raw_dealer()
    try:
        default = DEFAULT_CONFIG["limits"]["defaultCredit"]
        for rid, fields, credit in ((1, {"credit": 7}, 7), (2, {}, default)):
            sock.send_multipart(wire.encode_request("subscribe", rid, pattern=A, **fields))
            reply = wire.decode_incoming(sock.recv_multipart())
            assert reply.ok and reply.result["credit"] == credit
    finally:
        sock.close(0)


def test_close_sends_the_answers_of_messages_already_handled(broker, slow_acks):
    """Answers wait a few ms to leave together; closing the client sends them first."""
    watcher = broker.client()
    watcher.register_endpoint(A)
    handled = []
    client = broker.client()
    client.subscribe(A, lambda envelope: handled.append(envelope.id))
    ids = [watcher.publish(A, n, sender=SENDER).message_id for n in range(5)]
    wait_for(lambda: len(handled) == 5, what="five messages handled")
    client.close()
    # Unanswered, they would stay claimed by the ended session, listed as pending.
    wait_for(lambda: watcher.pending(A) == [], what="the five acks")
    assert sorted(handled) == sorted(ids)


def test_answers_leave_within_the_delay_while_the_handler_is_busy_with_a_slow_message(broker):
    """The I/O thread sends what waited ACK_DELAY_S; a slow handler does not hold it."""
    watcher = broker.client()
    watcher.register_endpoint(A)
    release, handled = threading.Event(), []

    def handler(envelope: Envelope) -> None:
        handled.append(envelope.id)
        if len(handled) == 2:
            release.wait(30)

    client = broker.client()
    client.subscribe(A, handler)
    first, second = (watcher.publish(A, n, sender=SENDER).message_id for n in range(2))
    try:
        wait_for(lambda: len(handled) == 2, what="the second message in its handler")
        wait_for(
            lambda: pending_ids(watcher) == [second],
            what="the first message acked meanwhile",
        )
    finally:
        release.set()
    wait_for(lambda: watcher.pending(A) == [], what="the second acked once handled")
    assert handled == [first, second]


def test_closing_the_client_from_a_handler_answers_what_was_handled_before(broker, slow_acks):
    watcher = broker.client()
    watcher.register_endpoint(A)
    client = broker.client()
    seen = []

    def handler(envelope: Envelope) -> None:
        seen.append(envelope.id)
        if len(seen) == 3:
            client.close()

    client.subscribe(A, handler)
    ids = [watcher.publish(A, n, sender=SENDER).message_id for n in range(3)]
    wait_for(lambda: len(seen) == 3, what="three messages handled")
    # The third was still in its handler when the client closed: it stays held.
    wait_for(
        lambda: pending_ids(watcher) == [ids[2]],
        what="the first two acked, the third pending",
    )


def test_answers_leave_while_a_caller_holds_the_client_lock(broker):
    """The I/O thread sends due answers without the client's lock, which a caller
    blocked on the full queue to the I/O thread may hold (a deadlock otherwise)."""
    watcher = broker.client()
    watcher.register_endpoint(A)
    client = broker.client()
    handled = []
    client.subscribe(A, lambda envelope: handled.append(envelope.id))
    with client._transport._lock:  # the handler thread cannot send a thing meanwhile
        message_id = watcher.publish(A, 1, sender=SENDER).message_id
        wait_for(
            lambda: handled == [message_id] and watcher.pending(A) == [],
            what="the message handled and acked by the I/O thread",
        )


def test_a_heartbeat_answered_during_unsubscribe_does_not_bring_it_back(broker):
    """The model test's finding: a heartbeat reply that lists the router's subscriptions
    without this one, read before unsubscribe() forgot it, renewed it for good."""
    client = broker.client()
    client.register_endpoint(A)
    unsubscribe = client.observe(A, lambda envelope: None)
    (worker,) = client._subscriptions.workers.values()
    real_call = client._transport.call

    def call(op, **fields):
        result = real_call(op, **fields)
        if op == "unsubscribe":  # the router dropped it; a heartbeat says so now
            client._subscriptions.router_holds(set())
            # What the heartbeat's thread does:
            client._subscriptions.renew([(worker, worker.renewals)])
        return result

    client._subscriptions._connection = StandIn(client._transport, call=call)
    unsubscribe()
    assert client.status()["subscriptions"] == 0
    assert not client._subscriptions.workers


def test_subscriptions_renewed_after_a_router_restart_keep_their_own_handlers(broker):
    """The model test's finding: the new router's ids were stored beside old ids not yet
    renewed, so renewing one overwrote another (its handler never ran again)."""
    client, other = broker.client(), broker.client()
    for subject in (A, B):
        client.register_endpoint(subject)
    got: dict[str, list[str]] = {A: [], B: []}
    client.subscribe(A, lambda e: got[A].append(e.id))  # sub 1
    client.subscribe(B, lambda e: got[B].append(e.id))  # sub 2
    other.observe(B, lambda e: None)  # sub 3
    for c in (client, other):  # the test renews, in its order, not their heartbeats
        c._transport._consumer = StandIn(c._subscriptions, router_holds=lambda subs: None)
    broker.kill("router")
    broker.start_router()
    broker.wait_ready()
    # The other client renews first and takes id 1; then this one: A gets 2, while B's
    # worker still sits under its old id 2.
    other._subscriptions.renew([(w, w.renewals) for w in other._subscriptions.workers.values()])
    client._subscriptions.renew([(w, w.renewals) for w in client._subscriptions.workers.values()])
    assert client.status()["subscriptions"] == 3
    ids = {s: client.publish(s, 1, sender=SENDER).message_id for s in (A, B)}
    wait_for(lambda: got == {A: [ids[A]], B: [ids[B]]}, what=f"both handlers (got {got})")


def test_two_renewals_of_one_loss_subscribe_once(broker):
    """Two heartbeats that both find a subscription lost start two renewals; the one
    that runs second, after the first has renewed it, must not subscribe it again."""
    client = broker.client()
    client.register_endpoint(A)
    # The test plays the heartbeats.
    client._transport._consumer = StandIn(client._subscriptions, router_holds=lambda subs: None)
    client.subscribe(A, lambda e: None)
    broker.kill("router")
    broker.start_router()
    broker.wait_ready()
    lost = [(w, w.renewals) for w in client._subscriptions.workers.values()]
    client._subscriptions.renew(lost)
    client._subscriptions.renew(lost)  # the second heartbeat's thread, late
    assert client.status()["subscriptions"] == 1
    assert len(client._subscriptions.workers) == 1


def test_hello_and_ping_say_the_session_timeout_the_client_pings_within(broker):
    client = broker.client()
    assert client.server["sessionTimeoutMs"] == DEFAULT_CONFIG["delivery"]["sessionTimeoutMs"]
    client.set_config({"delivery": {"sessionTimeoutMs": 1500}})
    assert client._call("ping")["sessionTimeoutMs"] == 1500


@pytest.mark.parametrize(
    ("timeout_ms", "every_s"),
    [(5000, HEARTBEAT_S), (4000, HEARTBEAT_S), (1000, 0.25), (100, 0.05), (None, HEARTBEAT_S)],
)
def test_a_client_pings_four_times_per_session_timeout_below_four_seconds(timeout_ms, every_s):
    assert ping_interval(timeout_ms) == every_s
