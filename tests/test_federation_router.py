"""The sending node's side of federation (docs/federation.md), through real processes.
A bridge is an SDK client speaking remote_endpoints, relay_take and relayed; here the
"JetStream" between two homes is the test itself (`Hop`): what it takes from one router
it ingests into the other, which is the bridge's work minus NATS (tests/
test_federation_nats.py runs the real one)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from sdk.client import Client
from sdk.errors import InvalidConfig, InvalidMessage, RelayError
from sdk.subjects import endpoint_hash, reply_inbox
from sdk.types import Envelope
from tests.harness import Broker, depth, wait_for

pytestmark = pytest.mark.integration

A_AGENT = "relay.agent.a.alice"
B_AGENT = "relay.agent.b.bob"


class Hop:
    """Takes node ``origin``'s remote parts from its router and ingests them into the
    far node's router, then confirms: a bridge with the JetStream leg cut out."""

    def __init__(self, origin: str, source: Client, far: Client, *, confirm: bool = True):
        self.origin, self.source, self.far, self.confirm = origin, source, far, confirm
        self.stop = threading.Event()
        self.taken: list[dict] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                parts = self.source._call("relay_take", node=self.origin, limit=100)["parts"]
            except RelayError:
                continue
            self.taken.extend(parts)
            answers = []
            for part in parts:
                envelope = Envelope.from_wire(part["envelope"])
                self.far.ingest(envelope, part["subjects"], node=self.origin)
                answers.append([part["token"], part["node"], None])
            if answers and self.confirm:
                self.source._call("relayed", parts=answers)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def two() -> Iterator[tuple[Broker, Broker]]:
    a, b = Broker(shards=1), Broker(shards=1)
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.cleanup()
        b.cleanup()


def advertise(router: Client, node: str, *subjects: str) -> None:
    router._call("remote_endpoints", node=node, subjects=list(subjects))


def joined(a: Broker, b: Broker) -> tuple[Client, Client, list[Hop]]:
    """Node a with A_AGENT, node b with B_AGENT, each advertised to the other, and a
    bridge each way."""
    ca, cb = a.client(), b.client()
    ca.register_endpoint(A_AGENT)
    cb.register_endpoint(B_AGENT)
    advertise(ca, "b", B_AGENT)
    advertise(cb, "a", A_AGENT)
    return ca, cb, [Hop("a", ca, cb), Hop("b", cb, ca)]


def test_a_message_reaches_a_consumer_on_another_node_and_its_reply_comes_back(two):
    ca, cb, hops = joined(*two)
    try:
        wait_for(lambda: ca.status()["federation"]["connected"], what="the bridge on a")
        cb.subscribe(B_AGENT, lambda m: cb.reply(m, {"content": "pong"}, sender=B_AGENT))
        answers: list[Envelope] = []
        ca.subscribe(A_AGENT, answers.append)
        result = ca.publish(B_AGENT, {"content": "ping"}, sender=A_AGENT, reply_to=A_AGENT)
        assert result.delivered_to == 1 and result.rejected == ()
        assert dict(result.remote) == {"b": (B_AGENT,)}
        wait_for(lambda: answers, what="the reply from b")
        assert answers[0].payload == {"content": "pong"} and answers[0].sender == B_AGENT
        assert answers[0].parent_id == result.message_id  # kept across the bridge
        # the budget shrank once per delivery, whichever host delivered it
        assert answers[0].budget.hop_count == 2
        assert answers[0].budget.ancestor_chain == (B_AGENT, A_AGENT)
    finally:
        for hop in hops:
            hop.close()


def test_a_reply_goes_back_to_its_parents_node_and_there_only_to_its_reply_to(two):
    """A request's reply inbox is advertised nowhere: b's router sends the reply to the
    node the request came from (its stored copy's relayedFrom), for that address only;
    a publish naming the same parent to another unadvertised subject of a is no_match."""
    ca, cb, hops = joined(*two)
    try:
        wait_for(lambda: cb.status()["federation"]["connected"], what="the bridge on b")
        inbox = reply_inbox(A_AGENT, "0a1b2c")
        for subject in (inbox, "relay.agent.a.private"):
            ca.register_endpoint(subject)  # on a, not advertised
        request = ca.publish(B_AGENT, "ask", sender=A_AGENT, reply_to=inbox)
        (held,) = cb.fetch(B_AGENT, wait=10)
        assert (held.envelope.id, held.envelope.relayed_from) == (request.message_id, "a")
        home = cb.reply(held.envelope, "answer", sender=B_AGENT)
        assert (home.delivered_to, dict(home.remote)) == (1, {"a": (inbox,)})
        (reply,) = ca.fetch(inbox, wait=10)
        assert (reply.envelope.payload, reply.envelope.parent_id) == ("answer", request.message_id)
        assert reply.envelope.relayed_from == "b"
        aside = cb._call(
            "publish",
            subject="relay.agent.a.private",
            payload="psst",
            parentId=request.message_id,
            **{"from": B_AGENT},
        )
        assert (aside["deliveredTo"], aside["rejected"]) == (0, [["*", "no_match"]])
    finally:
        for hop in hops:
            hop.close()


def test_a_loop_across_two_nodes_is_stopped_by_the_budget(two):
    ca, cb, hops = joined(*two)
    seen: list[tuple[str, int]] = []
    replies: list = []

    def bounce(client: Client, me: str):
        def handler(message: Envelope) -> None:
            seen.append((me, message.budget.hop_count))
            replies.append((me, client.reply(message, {"content": "again"}, sender=me)))

        return handler

    try:
        wait_for(lambda: ca.status()["federation"]["connected"], what="the bridge on a")
        ca.subscribe(A_AGENT, bounce(ca, A_AGENT))
        cb.subscribe(B_AGENT, bounce(cb, B_AGENT))
        ca.publish(B_AGENT, {"content": "start"}, sender=A_AGENT, reply_to=A_AGENT)

        # b -> a is delivered (chain [b, a]); a -> b again is refused on a, where the
        # reply is sent: b is in the chain already (checked before anything leaves)
        wait_for(lambda: len(replies) == 2, what="both replies")
        assert seen == [(B_AGENT, 1), (A_AGENT, 2)]
        by = dict(replies)  # b's reply waits for the bridge, so a's may be answered first
        assert by[B_AGENT].delivered_to == 1
        assert by[A_AGENT].rejected == ((endpoint_hash(B_AGENT), "budget_exceeded"),)
        assert "cycle" in by[A_AGENT].details[endpoint_hash(B_AGENT)]
    finally:
        for hop in hops:
            hop.close()


def test_without_a_bridge_a_remote_copy_is_unavailable_at_once(broker):
    client = broker.client()
    client.register_endpoint(A_AGENT)
    advertise(client, "b", B_AGENT)
    result = client.publish("relay.agent.*.*", {}, sender=A_AGENT)
    assert result.delivered_to == 1  # the local copy
    assert result.rejected == ((endpoint_hash(B_AGENT), "unavailable"),)
    assert dict(result.remote) == {}
    assert depth(client, A_AGENT) == 1


def test_a_publish_waits_for_the_bridges_confirmation(broker):
    client = broker.client()
    advertise(client, "b", B_AGENT)
    taken: Future = Future()

    def bridge() -> None:
        parts: list = []
        while not parts:
            parts = client._call("relay_take", node="a", limit=10)["parts"]
        taken.set_result(parts)

    threading.Thread(target=bridge, daemon=True).start()
    wait_for(lambda: client.status()["federation"]["connected"], what="the bridge")
    pending = client.publish_async(B_AGENT, {"n": 1}, sender=A_AGENT)
    (part,) = taken.result(10)
    assert part["node"] == "b" and part["subjects"] == [B_AGENT]
    assert part["envelope"]["budget"]["hopCount"] == 0  # advanced by the far router
    assert not pending.done()  # not before JetStream has it
    client._call("relayed", parts=[[part["token"], "b", None]])
    result = pending.result(10)
    assert result.message_id == part["envelope"]["id"]
    assert result.delivered_to == 1 and dict(result.remote) == {"b": (B_AGENT,)}


def test_a_copy_the_bridge_could_not_relay_is_unavailable(broker):
    client = broker.client()
    advertise(client, "b", B_AGENT)
    stop = threading.Event()

    def failing_bridge() -> None:
        while not stop.is_set():
            parts = client._call("relay_take", node="a", limit=10)["parts"]
            failed = [[p["token"], p["node"], "no JetStream quorum"] for p in parts]
            if failed:
                client._call("relayed", parts=failed)

    thread = threading.Thread(target=failing_bridge, daemon=True)
    thread.start()
    try:
        wait_for(lambda: client.status()["federation"]["connected"], what="the bridge")
        result = client.publish(B_AGENT, {}, sender=A_AGENT)
        assert result.rejected == ((endpoint_hash(B_AGENT), "unavailable"),)
        assert result.details[endpoint_hash(B_AGENT)] == "no JetStream quorum"
    finally:
        stop.set()
        thread.join(5)  # its held relay_take is answered within a second


def test_an_endpoint_is_shared_when_registered_so_or_matched_by_the_config(broker):
    """What the bridge advertises: ``shared`` in the router's endpoint list."""
    client = broker.client()
    client.register_endpoint(A_AGENT)
    client.register_endpoint("relay.agent.a.team.one")

    def shared() -> dict[str, bool]:
        return {e["subject"]: e["shared"] for e in client.status()["endpoints"]}

    assert shared() == {A_AGENT: False, "relay.agent.a.team.one": False}
    assert client.register_endpoint(A_AGENT, shared=True).shared
    client.set_config({"federation": {"shared": ["relay.agent.a.team.>"]}})
    assert shared() == {A_AGENT: True, "relay.agent.a.team.one": True}
    assert not client.register_endpoint(A_AGENT, shared=False).shared
    assert shared()[A_AGENT] is False
    client.close()
    broker.kill("router")
    broker.start_router()
    broker.wait_ready()
    after = broker.client()  # what control.db kept
    assert after.register_endpoint(A_AGENT).shared is False
    assert after.register_endpoint("relay.agent.a.team.one").shared


def test_shared_must_be_a_boolean_and_the_config_patterns_valid(broker):
    client = broker.client()
    with pytest.raises(InvalidMessage, match="'shared' must be a boolean"):
        client._call("register", subject=A_AGENT, shared="yes")
    with pytest.raises(InvalidConfig, match=r"federation\.shared"):
        client.set_config({"federation": {"shared": ["relay..bad"]}})
