"""Restart, rebuild, shutdown and bad input, through real processes."""

from __future__ import annotations

import signal

import pytest
import zmq

from sdk import wire
from sdk.client import connect
from sdk.errors import InvalidSubject, LimitExceeded, PayloadTooLarge, Unavailable
from tests.harness import Broker, wait_for
from workers import locks

pytestmark = pytest.mark.integration

A = "relay.agent.demo.a"
B = "relay.agent.demo.b"
SENDER = "relay.agent.demo.cli"


def test_restart_of_the_whole_group_keeps_every_message_and_endpoint(broker):
    client = broker.client()
    for subject in (A, B):
        client.register_endpoint(subject)
    ids = [client.publish("relay.agent.demo.*", i, sender=SENDER).message_id for i in range(10)]
    codes = broker.stop()
    assert all(code == 0 for code in codes.values()), codes
    broker.start()
    client = broker.client()
    assert sorted(e.subject for e in client.list_endpoints()) == [A, B]
    assert [e["depth"] for e in client.status()["endpoints"]] == [10, 10]
    got = []
    client.subscribe(A, lambda e: got.append(e.id))
    wait_for(lambda: len(got) == 10, what="the backlog after restart")
    assert got == ids


def test_a_subscriber_keeps_receiving_across_a_router_restart(broker):
    client = broker.client()
    client.register_endpoint(A)
    got = []
    client.subscribe(A, lambda e: got.append(e.payload))
    broker.kill("router", signal.SIGTERM)
    broker.start_router()
    broker.wait_ready()
    publisher = broker.client()
    publisher.publish(A, "after restart", sender=SENDER)
    wait_for(lambda: got == ["after restart"], what="the renewed subscription to deliver")


def test_rebuilt_index_answers_the_same(broker):
    client = broker.client()
    client.register_endpoint(A)
    client.register_endpoint(B)
    ids = [client.publish("relay.agent.demo.*", i, sender=SENDER).message_id for i in range(6)]
    client.publish("relay.nowhere", 0, sender=SENDER)
    handled = []
    client.subscribe(A, lambda e: handled.append(e.id))
    wait_for(
        lambda: all(client.trace(i)["copies"][0]["state"] == "done" for i in ids),
        what="A's copies done",
    )
    before = {i: client.trace(i) for i in ids}
    letters = client.dead_letters()
    assert client.rebuild_index() == 13
    assert {i: client.trace(i) for i in ids} == before
    assert client.dead_letters() == letters


def test_clean_shutdown_leaves_no_process_and_no_socket():
    broker = Broker(shards=2).start()
    try:
        client = broker.client()
        client.register_endpoint(A)
        client.publish(A, 1, sender=SENDER)
        codes = broker.stop()
        assert codes == {"router": 0, "writer0": 0, "writer1": 0}
        assert [p.name for p in broker.home.run.iterdir() if not p.name.endswith(".lock")] == []
        assert locks.holders(broker.home) == {}  # the lock files stay, held by nobody
        for name in ("index-0.db-wal", "index-1.db-wal"):
            path = broker.home.root / name
            assert not path.exists() or path.stat().st_size == 0, "WAL checkpointed"
    finally:
        broker.cleanup()


def test_client_gets_a_clear_error_when_no_broker_runs(tmp_path):
    with pytest.raises(Unavailable, match="broker unavailable"):
        connect(tmp_path, timeout=0.5)


def test_killed_writers_are_shown_down_and_publishes_succeed_once_they_are_back(broker):
    client = broker.client(timeout=30)
    client.register_endpoint(A)
    broker.kill("writer0")
    broker.kill("writer1")
    wait_for(
        lambda: [w["state"] for w in client.status()["writers"]] == ["down", "down"],
        what="the router to see both writers gone",
    )
    future = client.publish_async(A, 1, sender=SENDER)  # waits for a writer to come
    broker.start_writer(0)
    broker.start_writer(1)
    broker.wait_ready()
    assert future.result(30).delivered_to == 1
    assert client.publish(A, 2, sender=SENDER).delivered_to == 1


def test_a_writer_restart_gives_consumers_their_credit_and_the_backlog_back(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    shard = f"writer{int(info.hash, 16) % 2}"
    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(5)]
    broker.procs[shard].send_signal(signal.SIGSTOP)  # claims queue up at a frozen writer
    got = []
    client.subscribe(A, lambda e: got.append(e.id), credit=5)
    broker.kill(shard)
    broker.start_writer(int(shard[-1]))
    broker.wait_ready()
    wait_for(lambda: sorted(got) == ids, what="the backlog after the writer restart")


def raw_request(broker, *frames: bytes) -> dict:
    sock = broker.raw_dealer(5000)
    try:
        sock.send_multipart(list(frames))
        reply = sock.recv_multipart()
    finally:
        sock.close()
    assert reply[0] == wire.MAGIC
    return wire.unpackb(reply[1])


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([b"garbage"], "malformed_frame"),
        ([wire.MAGIC, b"\xc1\xc1\xc1"], "malformed_frame"),
        ([wire.MAGIC, wire.packb(42)], "malformed_frame"),
        ([wire.MAGIC, wire.packb({"op": "publish"})], "malformed_frame"),
        ([b"RLY9", wire.packb({"op": "ping", "rid": 1})], "unsupported_version"),
        ([wire.MAGIC, wire.packb({"op": "teleport", "rid": 1})], "unknown_operation"),
        (
            [
                wire.MAGIC,
                wire.packb({"op": "publish", "rid": 1, "subject": 7, "from": SENDER, "payload": 1}),
            ],
            "invalid_message",
        ),
        (
            [
                wire.MAGIC,
                wire.packb(
                    {"op": "publish", "rid": 1, "subject": "a..b", "from": SENDER, "payload": 1}
                ),
            ],
            "invalid_subject",
        ),
        (
            [
                wire.MAGIC,
                wire.packb({"op": "publish", "rid": 1, "subject": A, "from": "x y", "payload": 1}),
            ],
            "invalid_subject",
        ),
        (
            [
                wire.MAGIC,
                wire.packb(
                    {
                        "op": "publish",
                        "rid": 1,
                        "subject": A,
                        "from": SENDER,
                        "payload": b"\x00bytes",
                    }
                ),
            ],
            "invalid_message",
        ),
        (
            [
                wire.MAGIC,
                wire.packb(
                    {
                        "op": "publish",
                        "rid": 1,
                        "subject": A,
                        "from": SENDER,
                        "payload": 1,
                        "budget": {"hopCount": "x"},
                    }
                ),
            ],
            "invalid_message",
        ),
        (
            [wire.MAGIC, wire.packb({"op": "subscribe", "rid": 1, "pattern": "a.>.b"})],
            "invalid_subject",
        ),
        (
            [
                wire.MAGIC,
                wire.packb({"op": "ack", "rid": 1, "sub": 1, "id": "nope", "endpoint": "x"}),
            ],
            "invalid_message",
        ),
    ],
    ids=[
        "one-frame",
        "not-msgpack",
        "not-a-map",
        "no-rid",
        "version",
        "unknown-op",
        "subject-type",
        "bad-subject",
        "bad-sender",
        "bytes-payload",
        "bad-budget",
        "bad-pattern",
        "bad-id",
    ],
)
def test_bad_request_gets_an_error_code_and_the_broker_keeps_serving(broker, frames, code):
    reply = raw_request(broker, *frames)
    assert reply["ok"] is False and reply["error"]["code"] == code, reply
    assert reply["error"]["message"]
    client = broker.client()
    client.register_endpoint(A)
    assert client.publish(A, "still here", sender=SENDER).delivered_to == 1


def test_oversized_payload_is_refused_with_the_numbers(broker):
    client = broker.client()
    client.register_endpoint(A)
    with pytest.raises(PayloadTooLarge, match=r"exceeds the 1\.0 MiB limit"):
        client.publish(A, "x" * (1024 * 1024 + 10), sender=SENDER)
    with pytest.raises(InvalidSubject):
        client.publish("relay..x", 1, sender=SENDER)
    assert client.publish(A, "small", sender=SENDER).delivered_to == 1


def test_too_many_subscriptions_from_one_client_are_refused(broker):
    client = broker.client()
    client.set_config({"limits": {"maxSubscriptionsPerClient": 3}})
    for i in range(3):
        client.observe(f"relay.s{i}", lambda e: None)
    with pytest.raises(LimitExceeded, match="limit is 3"):
        client.observe("relay.s9", lambda e: None)


def test_cli_publishes_and_lists(broker):
    assert broker.relay("endpoints", "register", A).returncode == 0
    out = broker.relay("publish", A, '{"content": "hi"}', "--from", SENDER, "--json")
    assert out.returncode == 0, out.stderr
    assert '"deliveredTo": 1' in out.stdout
    listing = broker.relay("endpoints")
    assert A in listing.stdout and " 1" in listing.stdout
    assert row_of(listing.stdout, A)[-1] == "no"  # the SHARED column: node-local
    shared = broker.relay("endpoints", "register", A, "--shared", "--json")
    assert shared.returncode == 0 and '"shared": true' in shared.stdout, shared.stderr
    assert row_of(broker.relay("endpoints").stdout, A)[-1] == "yes"
    bad = broker.relay("publish", "a..b", "x", "--from", SENDER)
    assert bad.returncode == 1 and "invalid_subject" in bad.stderr


def row_of(table: str, subject: str) -> list[str]:
    return next(line.split() for line in table.splitlines() if subject in line)


def test_sigterm_to_router_stops_it_cleanly():
    broker = Broker(shards=1).start()
    try:
        broker.kill("router", signal.SIGTERM)
        assert broker.procs["router"].returncode == 0
    finally:
        broker.cleanup()


def _replies(sock: zmq.Socket, count: int, frames: list[int] | None = None) -> list[wire.Reply]:
    """``count`` replies, however they are framed; ``frames`` collects replies per frame."""
    replies: list[wire.Reply] = []
    while len(replies) < count:
        got = wire.decode_incoming_all(sock.recv_multipart())
        replies += got
        if frames is not None:
            frames.append(len(got))
    return replies


@pytest.fixture
def batching(broker):
    """A raw DEALER that said hello asking for batched replies; its hello reply read."""
    sock = broker.raw_dealer()
    try:
        sock.send_multipart(wire.encode_request("hello", 1, batch=True))
        assert _replies(sock, 1)[0].result["batch"] == wire.MAX_BATCH
        yield sock
    finally:
        sock.close()


def test_a_batch_frame_gets_every_request_answered_under_its_own_rid(batching):
    sock = batching
    bodies = [
        wire.packb({"op": "register", "rid": 2, "subject": "relay.agent.batch.inbox"}),
        wire.packb({"op": "nonsense", "rid": 3}),
        wire.packb(["not", "a", "request"]),
        wire.packb({"op": "ping", "rid": 4}),
    ]
    sock.send_multipart([wire.MAGIC, wire.batch(bodies)])
    per_frame: list[int] = []
    by_rid = {r.rid: r for r in _replies(sock, 4, per_frame)}
    assert max(per_frame) > 1  # answered in batches, as hello asked
    assert by_rid[2].ok and by_rid[4].ok
    assert by_rid[3].error.code == "unknown_operation"
    assert by_rid[0].error.code == "malformed_frame"  # the item that had no rid
    too_many = [wire.packb({"op": "ping", "rid": 5})] * (wire.MAX_BATCH + 1)
    sock.send_multipart([wire.MAGIC, wire.batch(too_many)])
    assert _replies(sock, 1)[0].error.code == "malformed_frame"


def test_bye_in_a_batch_ends_the_session_for_what_follows(batching):
    sock = batching
    bodies = [
        wire.packb({"op": "ping", "rid": 2}),
        wire.packb({"op": "bye", "rid": 3}),
        wire.packb({"op": "subscribe", "rid": 4, "pattern": "relay.>"}),
    ]
    sock.send_multipart([wire.MAGIC, wire.batch(bodies)])
    replies = _replies(sock, 3)
    assert [r.rid for r in replies] == [2, 3, 4]  # in order, none overtaking
    assert replies[0].ok and replies[1].ok
    assert replies[2].error.code == "invalid_state"
