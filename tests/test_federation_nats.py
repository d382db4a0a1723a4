"""Federation with real servers (docs/federation.md): a three-server NATS cluster with
JetStream on loopback, two Relay homes (each its own router and writers), and a
`relay bridge` process per home. What a publisher was told is delivered arrives on the
far node exactly once, whatever is killed with -9 in the middle."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import nats
import pytest

from edges import bridge_names as names
from sdk.client import Client
from sdk.errors import Timeout
from sdk.subjects import inbox_sender
from sdk.types import Envelope, Signal, SignalType, default_budget
from tests.harness import Broker, wait_for, write_auth
from tests.nats_cluster import NatsCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

A_AGENT = "relay.agent.a.alice"
B_AGENT = "relay.agent.b.bob"
BURST = 300


class Node:
    """A Relay home and its bridge. ``nats``: the bridge's URLs (default: the cluster's,
    no user); ``options``: more `relay bridge` options (credentials); ``auth``: the
    home's auth.json, written before its router starts."""

    def __init__(
        self,
        name: str,
        cluster: NatsCluster,
        share: str | None,
        *,
        nats: Sequence[str] = (),
        options: Sequence[str] = (),
        auth: dict[str, Any] | None = None,
    ) -> None:
        self.name, self.cluster, self.share = name, cluster, share
        self.nats = ",".join(nats or cluster.urls)
        self.options = list(options)
        self.broker = Broker(shards=2)
        if auth is not None:
            write_auth(self.broker.home.create(), auth)
        self.broker.start()
        self.client = self.broker.client()
        self.client.set_config({"rateLimit": {"enabled": False}})  # bursts from one sender

    def start_bridge(self) -> None:
        self.broker.start_process(
            "bridge",
            "bridge",
            "--nats",
            self.nats,
            "--node",
            self.name,
            *(["--share", self.share] if self.share else []),
            "--replicas",
            "3",
            *self.options,
        )

    def kill_bridge(self) -> None:
        self.broker.kill("bridge")

    def knows(self, node: str) -> bool:
        federation = self.client.status()["federation"]
        return federation["connected"] and federation["remoteEndpoints"].get(node, 0) > 0


def meet(cluster: NatsCluster, a: Node, b: Node) -> None:
    """Start both bridges; wait until each router knows the other node's endpoints."""
    a.start_bridge()
    b.start_bridge()
    try:
        wait_for(lambda: a.knows("b") and b.knows("a"), 90, what="the bridges to meet")
    except AssertionError as exc:
        logs = "\n".join(n.broker.log("bridge")[-2000:] for n in (a, b))
        raise AssertionError(f"{exc}\n{logs}\n{cluster.log(0)}") from None


@pytest.fixture
def nodes() -> Iterator[tuple[NatsCluster, Node, Node]]:
    cluster = NatsCluster().start()
    started: list[Node] = []
    try:
        a = Node("a", cluster, "relay.agent.a.>")
        started.append(a)
        b = Node("b", cluster, None)  # b's endpoint says it is shared, a's bridge does
        started.append(b)
        a.client.register_endpoint(A_AGENT)
        b.client.register_endpoint(B_AGENT, shared=True)
        meet(cluster, a, b)
        yield cluster, a, b
    finally:
        for node in started:
            node.broker.cleanup()
        cluster.stop()


def test_a_message_from_a_reaches_a_consumer_on_b_and_the_reply_comes_back(nodes):
    _, a, b = nodes
    b.client.subscribe(B_AGENT, lambda m: b.client.reply(m, {"content": "pong"}, sender=B_AGENT))
    answers: list[Envelope] = []
    a.client.subscribe(A_AGENT, answers.append)
    result = a.client.publish(B_AGENT, {"content": "ping"}, sender=A_AGENT, reply_to=A_AGENT)
    assert result.delivered_to == 1 and dict(result.remote) == {"b": (B_AGENT,)}
    wait_for(lambda: answers, 30, what="the reply from b")
    assert answers[0].payload == {"content": "pong"}
    assert answers[0].budget.ancestor_chain == (B_AGENT, A_AGENT)


def test_a_request_from_a_gets_the_reply_of_an_endpoint_on_b(nodes):
    _, a, b = nodes
    b.client.subscribe(B_AGENT, lambda m: b.client.reply(m, {"re": m.payload}, sender=B_AGENT))
    reply = a.client.request(B_AGENT, "ping", sender=A_AGENT, timeout=60)
    assert (reply.payload, reply.sender) == ({"re": "ping"}, B_AGENT)
    assert inbox_sender(reply.subject) == A_AGENT  # stored in a's reply inbox, on a
    request_id = reply.parent_id
    assert reply.budget.ancestor_chain == (B_AGENT, reply.subject)
    assert [c["endpointSubject"] for c in b.client.trace(request_id)["copies"]] == [B_AGENT]


def test_a_reply_from_b_after_the_request_gave_up_is_a_late_reply_dead_letter_on_a(nodes):
    _, a, b = nodes
    with pytest.raises(Timeout):
        a.client.request(B_AGENT, "first", sender=A_AGENT, timeout=5)
    (first,) = b.client.fetch(B_AGENT, wait=60)
    b.client.reply(first.envelope, "too late", sender=B_AGENT)
    first.ack()
    dead = wait_for(
        lambda: [d for d in a.client.dead_letters() if d["code"] == "late_reply"],
        60,
        what="the late reply's dead letter on a",
    )
    assert len(dead) == 1
    b.client.subscribe(B_AGENT, lambda m: b.client.reply(m, {"second": m.payload}, sender=B_AGENT))
    reply = a.client.request(B_AGENT, "again", sender=A_AGENT, timeout=60)
    assert reply.payload == {"second": "again"}


def publish_as(cluster: NatsCluster, node: str, body: bytes, headers: dict[str, str]) -> None:
    """Put a message into b's stream as node ``node``'s bridge would (no users here)."""

    async def publish() -> None:
        nc = await nats.connect(cluster.urls)
        try:
            await nc.jetstream(timeout=10).publish(
                f"relay.fed.b.from.{node}", body, headers=headers
            )
        finally:
            await nc.close()

    asyncio.run(publish())


def test_an_id_b_has_from_a_relayed_by_another_node_is_refused_there_and_said(nodes):
    """De-duplication across hosts is by (origin node, id): node c relaying an id b
    holds from a is no redelivery of a's message. b keeps a's copy and refuses c's
    (id_conflict), and its bridge says so; JetStream does not drop c's message for the
    id a used either, since a's part carried no de-duplication id."""
    cluster, a, b = nodes
    result = a.client.publish(B_AGENT, {"content": "from a"}, sender=A_AGENT)
    assert dict(result.remote) == {"b": (B_AGENT,)}
    wait_for(lambda: stored_on_b(b, result.message_id), 30, what="a's message on b")
    now = int(time.time() * 1000)
    envelope = Envelope(
        result.message_id, B_AGENT, "relay.agent.c.carol", None, default_budget(now), now, "c"
    )
    body = names.encode_part({"subjects": [B_AGENT], "envelope": envelope.to_wire()})
    publish_as(cluster, "c", body, {"Nats-Msg-Id": result.message_id})
    wait_for(lambda: "id_conflict" in b.broker.log("bridge"), 30, what="b's bridge to say")
    assert f"ingest of {result.message_id} from c: ack (id_conflict" in b.broker.log("bridge")
    (held,) = b.client.fetch(B_AGENT, wait=10)
    assert (held.envelope.payload, held.envelope.relayed_from) == ({"content": "from a"}, "a")


def test_a_loop_from_a_to_b_and_back_is_stopped_by_the_budget(nodes):
    _, a, b = nodes
    replies: list = []

    def bounce(client: Client, me: str):
        def handler(message: Envelope) -> None:
            replies.append((me, client.reply(message, {"content": "again"}, sender=me)))

        return handler

    a.client.subscribe(A_AGENT, bounce(a.client, A_AGENT))
    b.client.subscribe(B_AGENT, bounce(b.client, B_AGENT))
    a.client.publish(B_AGENT, {"content": "start"}, sender=A_AGENT, reply_to=A_AGENT)
    wait_for(lambda: len(replies) == 2, 30, what="both replies")
    by = dict(replies)
    assert by[B_AGENT].delivered_to == 1
    assert by[A_AGENT].rejected[0][1] == "budget_exceeded"


def burst(client: Client, n: int, during: threading.Event | None = None) -> list[Future]:
    """n publishes from a to b, 100 in flight at most; ``during`` is set halfway."""
    futures: list[Future] = []
    for i in range(n):
        if i == n // 2 and during is not None:
            during.set()
        while sum(not f.done() for f in futures[-100:]) >= 100:
            futures[-100].exception(30)  # wait for the oldest of the window
        futures.append(client.publish_async(B_AGENT, {"n": i}, sender=A_AGENT))
    return futures


def acknowledged(futures: list[Future]) -> set[str]:
    """The ids whose publisher heard that JetStream has the copy for b."""
    ids = set()
    for future in futures:
        try:
            result = future.result(30)
        except Exception:
            continue  # unavailable / timeout: no promise was made
        if result.remote.get("b"):
            ids.add(result.message_id)
    return ids


def received_on_b(b: Node) -> list[str]:
    got: list[str] = []
    b.client.subscribe(B_AGENT, lambda m: got.append(m.id), credit=100)
    return got


def burst_with_a_kill(a: Node, b: Node, kill) -> tuple[set[str], list[str]]:
    """A burst from a to b with ``kill`` done halfway; the ids acknowledged as remote,
    and the ids b's consumer received (filling in as they arrive)."""
    got = received_on_b(b)
    halfway = threading.Event()
    killer = threading.Thread(target=lambda: halfway.wait(60) and kill())
    killer.start()
    futures = burst(a.client, BURST, halfway)
    killer.join(60)
    return acknowledged(futures), got


def stored_on_b(b: Node, message_id: str) -> bool:
    return any(c["endpointSubject"] == B_AGENT for c in b.client.trace(message_id)["copies"])


def all_once(b: Node, acked: set[str], got: list[str]) -> None:
    """Every acknowledged message is stored on b (its index has the copy; what the
    consumer was handed is not the test: on a loaded machine a consumer's session can
    time out and leave what was pushed to it pending), and none reached b twice."""
    stored: set[str] = set()

    def all_stored() -> bool:
        stored.update(m for m in acked - stored if stored_on_b(b, m))
        return stored == acked

    wait_for(all_stored, 120, what=f"every acknowledged message stored on b ({len(acked)})")
    assert len(got) == len(set(got)), "a message was stored twice on b"


def test_kill_9_of_a_nats_server_mid_burst_loses_no_acknowledged_message(nodes):
    cluster, a, b = nodes
    acked, got = burst_with_a_kill(a, b, lambda: cluster.kill(0))

    def gets_through() -> bool:  # two servers of three keep the R3 stream going
        result = a.client.publish(B_AGENT, {"after": "the kill"}, sender=A_AGENT)
        if result.remote.get("b"):
            acked.add(result.message_id)
        return bool(result.remote.get("b"))

    wait_for(gets_through, 60, what="JetStream to take messages with two servers of three")
    all_once(b, acked, got)


def test_kill_9_of_the_far_bridge_mid_burst_and_its_catch_up(nodes):
    _, a, b = nodes
    acked, got = burst_with_a_kill(a, b, b.kill_bridge)
    assert len(acked) == BURST  # a's bridge and JetStream were up all along
    b.start_bridge()  # the durable consumer hands over what b missed, redeliveries too
    all_once(b, acked, got)


def test_kill_9_of_the_sending_bridge_mid_burst_loses_no_acknowledged_message(nodes):
    _, a, b = nodes
    acked, got = burst_with_a_kill(a, b, a.kill_bridge)
    all_once(b, acked, got)


def test_a_node_that_was_down_shows_its_lag_and_catches_up_when_it_returns(nodes):
    _, a, b = nodes
    got = received_on_b(b)
    b.kill_bridge()
    futures = [a.client.publish_async(B_AGENT, {"n": i}, sender=A_AGENT) for i in range(20)]
    acked = acknowledged(futures)
    assert len(acked) == 20  # JetStream holds them for b

    def lag_of_b() -> int:
        return a.client.status()["federation"]["lag"].get("b", -1)

    wait_for(lambda: lag_of_b() >= 20, 30, what="b's lag, as a's bridge sees it")
    shown = a.broker.relay("status").stdout
    assert "bridge: node a, connected to NATS 127.0.0.1:" in shown and "b 2" in shown
    b.start_bridge()
    all_once(b, acked, got)
    wait_for(lambda: lag_of_b() == 0, 30, what="b's lag back to nothing")


def test_a_signal_for_an_endpoint_on_b_crosses_over_core_nats(nodes):
    _, a, b = nodes
    seen: list[Signal] = []
    b.client.on_signal(B_AGENT, lambda _subject, signal: seen.append(signal))
    typing = Signal(SignalType.TYPING, "active", B_AGENT, 0)

    def arrived() -> bool:  # subscriptions on both sides take effect a moment later
        a.client.signal(B_AGENT, typing, sender=A_AGENT)
        return bool(seen)

    wait_for(arrived, 30, interval=0.2, what="a's signal on b")
    assert (seen[0].type, seen[0].state) == (SignalType.TYPING, "active")
    assert seen[0].data == {"relayedFrom": "a"}  # and so never forwarded again


def test_a_node_forgotten_leaves_the_directory_with_the_messages_waiting_for_it(nodes):
    cluster, a, b = nodes
    urls = ",".join(cluster.urls)

    def forget() -> subprocess.CompletedProcess:
        return a.broker.relay("bridge", "--nats", urls, "--forget", "b", "--json", timeout=60)

    refused = forget()
    assert refused.returncode == 2 and "is running" in refused.stderr
    b.kill_bridge()
    result = a.client.publish(B_AGENT, {"n": 1}, sender=A_AGENT)
    assert dict(result.remote) == {"b": (B_AGENT,)}  # it waits in b's stream
    done: list[subprocess.CompletedProcess] = []
    # once b's directory keys are no longer fresh (names.LIVE_MS after its last put)
    wait_for(lambda: done.append(forget()) or done[-1].returncode == 0, 90, what="forget")
    tries = "\n".join(f"{d.returncode}: {d.stderr[-600:]}" for d in done)
    assert json.loads(done[-1].stdout) == {
        "node": "b",
        "endpoints": [B_AGENT],
        "dropped": 1,
    }, tries
    wait_for(lambda: "b" not in a.client.status()["federation"]["remoteEndpoints"], 30)
    after = a.client.publish(B_AGENT, {"n": 2}, sender=A_AGENT)
    assert after.delivered_to == 0 and not after.remote  # no copy for a node that is gone
    wait_for(lambda: "b" not in a.client.status()["federation"]["lag"], 30, what="b's lag gone")
