"""Delivery faults found from the outside (issue 15), each through real processes: a
wildcard consumer of several backlogs, stray connections to a shard's socket, writers
that are starting or restarting, a refused rules file that is removed."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pytest
import zmq

from sdk import wire
from sdk.errors import Unavailable
from sdk.paths import shard_of
from sdk.subjects import endpoint_hash
from sdk.types import AccessRule, RuleAction
from tests.harness import ROOT, Broker, wait_for

pytestmark = pytest.mark.integration

SENDER = "relay.fault.cli"


def _boxes(count: int) -> list[str]:
    return [f"relay.fault.box{i}" for i in range(count)]


def _publish_backlog(client, boxes: list[str], each: int) -> dict[str, list[str]]:
    """``each`` messages waiting in each box, from a sender of its own (the default rate
    limit is 100 a minute per sender)."""
    for box in boxes:
        client.register_endpoint(box)
    return {
        box: [client.publish(box, i, sender=f"{SENDER}{n}").message_id for i in range(each)]
        for n, box in enumerate(boxes)
    }


def _consume_all(client, pattern: str, expected: dict[str, list[str]], **options) -> None:
    """Subscribe to pattern, wait for every expected message, check order per endpoint."""
    got: dict[str, list[str]] = defaultdict(list)
    client.subscribe(pattern, lambda e: got[e.subject].append(e.id), **options)
    total = sum(map(len, expected.values()))
    wait_for(
        lambda: sum(map(len, got.values())) == total,
        30,
        what=f"{total} messages (got {sum(map(len, got.values()))})",
    )
    assert dict(got) == expected  # each once, in order per endpoint


@pytest.mark.parametrize(("endpoints", "each"), [(4, 100), (16, 63)])
def test_a_wildcard_consumer_drains_the_backlogs_of_every_endpoint(broker, endpoints, each):
    client = broker.client(timeout=30)
    expected = _publish_backlog(client, _boxes(endpoints), each)
    _consume_all(broker.client(), "relay.fault.*", expected)


def test_a_wildcard_consumer_drains_backlogs_kept_across_a_restart(broker):
    expected = _publish_backlog(broker.client(), _boxes(4), 100)
    broker.stop()
    broker.start()
    _consume_all(broker.client(), "relay.fault.*", expected)


def test_the_endpoints_of_a_wildcard_consumer_take_turns(broker):
    client = broker.client()
    boxes = _boxes(4)
    _publish_backlog(client, boxes, 10)
    order: list[str] = []
    client.subscribe("relay.fault.*", lambda e: order.append(e.subject), credit=4)
    wait_for(lambda: len(order) == 40, what="the 40 messages")
    assert len(set(order[:4])) == 4  # one of each before a second of any


STRAY_KINDS = [zmq.PULL, zmq.DEALER, zmq.PUSH, zmq.SUB, zmq.REQ]


def _stray(address: str, kind: int) -> zmq.Socket:
    """A socket of the wrong kind connected to address, once the connection is made."""
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    connected = sock.get_monitor_socket(zmq.EVENT_CONNECTED)
    sock.connect(address)
    assert connected.poll(10_000), f"no connection to {address}"
    sock.disable_monitor()
    connected.close(0)
    if kind == zmq.DEALER:  # the one kind a ROUTER talks to: a frame that is no hello
        sock.setsockopt(zmq.SNDTIMEO, 10_000)
        sock.send(b"junk")
    return sock


@pytest.mark.parametrize("kind", STRAY_KINDS, ids=lambda k: zmq.SocketType(k).name)
def test_a_stray_connection_to_a_shard_socket_neither_steals_nor_takes_the_writer_down(
    broker, kind
):
    client = broker.client()
    subjects = [f"relay.fault.box{i}" for i in range(8)]
    for subject in subjects:
        client.register_endpoint(subject)
    on_shard_1 = [s for s in subjects if shard_of(endpoint_hash(s), 2) == 1]
    stray = _stray(broker.home.shard_address(1), kind)
    # While it is connected: a PUSH socket would give it its turn of the deliveries.
    for subject in on_shard_1 * 5:
        assert client.publish(subject, 1, sender=SENDER).delivered_to == 1
    stray.close(0)
    for sock in [_stray(broker.home.shard_address(1), kind) for _ in range(3)]:
        sock.close(0)
    # The router sees the disconnects within these publishes (no event to wait on).
    for subject in on_shard_1 * 10:
        assert client.publish(subject, 2, sender=SENDER).delivered_to == 1
    writers = client.status()["writers"]
    assert [w["state"] for w in writers] == ["up", "up"]
    assert writers[1]["pid"] == broker.procs["writer1"].pid


def test_a_publish_before_the_writers_are_up_waits_for_them():
    broker = Broker(shards=2)
    try:
        broker.start()
        client = broker.client()
        subjects = _boxes(4)
        for subject in subjects:
            client.register_endpoint(subject)
        broker.stop()
        broker.start_router()
        client = wait_for(lambda: _connected(broker), what="the router to answer")
        assert {w["state"] for w in client.status()["writers"]} == {"starting"}
        shown = broker.relay("status").stdout
        assert "shard 0: starting, shard 1: starting" in shown
        futures = [client.publish_async(s, 1, sender=SENDER) for s in subjects]
        for shard in range(2):
            broker.start_writer(shard)
        results = [f.result(30) for f in futures]
        assert [(r.delivered_to, r.rejected) for r in results] == [(1, ())] * 4
    finally:
        broker.cleanup()


def _connected(broker: Broker):
    try:
        return broker.client(timeout=30)
    except Unavailable:
        return None


def test_a_publish_waits_for_a_restarting_writer(broker):
    client = broker.client(timeout=30)
    subject = "relay.fault.box0"
    info = client.register_endpoint(subject)
    name = f"writer{shard_of(info.hash, 2)}"
    broker.kill(name)
    wait_for(
        lambda: "down" in [w["state"] for w in client.status()["writers"]],
        what="the router to see the writer gone",
    )
    future = client.publish_async(subject, 1, sender=SENDER)
    broker.start_writer(int(name[-1]))
    assert future.result(30).delivered_to == 1


def test_a_writer_that_never_comes_back_fails_the_publish_after_the_deadline(broker):
    client = broker.client(timeout=30)
    subject = "relay.fault.box0"
    info = client.register_endpoint(subject)
    broker.kill(f"writer{shard_of(info.hash, 2)}")
    result = client.publish(subject, 1, sender=SENDER)  # waits the 10 s deadline
    assert result.delivered_to == 0
    assert result.rejected == ((info.hash, "unavailable"),)
    assert "did not come up within 10 s" in result.details[info.hash]
    assert not client.dead_letters()  # never stored later either


def test_relay_up_says_ready_only_once_every_writer_is_up(tmp_path):
    home = tmp_path / "h"
    up = subprocess.Popen(
        [sys.executable, "-m", "cli", "--home", str(home), "up", "--shards", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = ""
        while not line.startswith("relay up: ready"):
            line = up.stdout.readline()
            assert line, "relay up ended without saying ready"
        status = subprocess.run(
            [sys.executable, "-m", "cli", "--home", str(home), "status", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert status.returncode == 0, status.stderr
        assert '"state": "starting"' not in status.stdout
        assert status.stdout.count('"state": "up"') == 2
    finally:
        up.terminate()
        up.wait(20)


def test_removing_a_refused_rules_file_brings_back_the_rules_last_applied(broker):
    client = broker.client()
    allowed, denied = "relay.fault.box0", "relay.fault.box1"
    for subject in (allowed, denied):
        client.register_endpoint(subject)
    client.add_rule(AccessRule(SENDER, denied, RuleAction.DENY, priority=5))
    path = broker.home.access_rules_file
    path.write_text("[{not json")
    wait_for(lambda: "access-rules.json" in client.status()["fileErrors"], what="the refusal")
    problem = client.status()["fileErrors"]["access-rules.json"]
    assert "removed" in problem and "control.db" in problem  # it says what to do
    assert client.publish(allowed, 1, sender=SENDER).delivered_to == 0  # denies everything
    path.unlink()
    wait_for(lambda: not client.status()["fileErrors"], what="the refusal to be lifted")
    assert client.publish(allowed, 2, sender=SENDER).delivered_to == 1
    assert client.publish(denied, 3, sender=SENDER).delivered_to == 0  # the rule holds


@pytest.mark.parametrize(
    "frames",
    [[b"hello", b"\xc1"], [b"hello", wire.packb([1, 2, "pid"])], [b"hello", wire.packb(7)]],
    ids=["not-msgpack", "pid-not-int", "not-a-list"],
)
def test_a_malformed_hello_on_a_shard_socket_is_dropped(broker, frames):
    client = broker.client()
    subject = next(
        f"relay.fault.box{i}"
        for i in range(8)
        if shard_of(endpoint_hash(f"relay.fault.box{i}"), 2) == 1
    )
    client.register_endpoint(subject)
    stray = _stray(broker.home.shard_address(1), zmq.DEALER)
    stray.send_multipart(frames)
    for _ in range(10):  # the router reads the stray's frames within these
        assert client.publish(subject, 1, sender=SENDER).delivered_to == 1
    stray.close(0)
    assert [w["state"] for w in client.status()["writers"]] == ["up", "up"]
    assert broker.procs["router"].poll() is None
