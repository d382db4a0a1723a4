"""Faults through real processes: killed writers and routers, damaged indexes, garbage frames.

The claim under test everywhere: a publish acknowledged as delivered is durable (its file
in new/, its index row) whatever is killed afterwards, and nothing half-written shows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk import wire
from sdk.errors import RelayError, Timeout
from sdk.ids import new_id
from sdk.subjects import endpoint_hash
from tests.harness import Broker
from workers import faults
from workers import protocol as proto
from workers.writer import BEFORE_INDEX_COMMIT, shard_of

pytestmark = pytest.mark.integration

SENDER = "relay.agent.fault.sender"
ENDPOINTS = [f"relay.agent.fault.e{i}" for i in range(6)]
UNLIMITED = {"rateLimit": {"enabled": False}, "backpressure": {"maxMailboxSize": 10**6}}


def burst_client(broker: Broker, timeout: float):
    """A client of the broker with ENDPOINTS registered and no rate limit in the way."""
    client = broker.client(timeout=timeout)
    for subject in ENDPOINTS:
        client.register_endpoint(subject)
    client.set_config(UNLIMITED)
    return client


def burst(client, count: int, on_result, in_flight: int = 200) -> list[Future]:
    """Publish count messages over the endpoints, at most in_flight unanswered at once."""
    slots = threading.Semaphore(in_flight)
    futures = []

    def done(future: Future) -> None:
        slots.release()
        on_result(future)

    for n in range(count):
        if not slots.acquire(timeout=30):
            break  # the broker stopped answering: what was sent is checked below
        future = client.publish_async(ENDPOINTS[n % len(ENDPOINTS)], n, sender=SENDER)
        future.add_done_callback(done)
        futures.append(future)
    return futures


def assert_durable(broker: Broker, client, futures: list[Future]) -> int:
    """Every publish acknowledged as delivered is in new/ and in the index."""
    acknowledged = 0
    for n, future in enumerate(futures):
        try:
            result = future.result(30)
        except RelayError:
            continue  # an error, not silence: allowed
        if result.delivered_to != 1:
            continue
        acknowledged += 1
        h = endpoint_hash(ENDPOINTS[n % len(ENDPOINTS)])
        path = broker.home.mailbox(h) / "new" / result.message_id
        assert path.exists(), f"acknowledged {result.message_id} is not in new/"
        [copy] = client.trace(result.message_id)["copies"]
        assert copy["state"] == "new"
    for subject in ENDPOINTS:  # nothing partial is visible
        new = broker.home.mailbox(endpoint_hash(subject)) / "new"
        for name in os.listdir(new):
            json.loads((new / name).read_bytes())
    return acknowledged


def test_killing_a_writer_mid_burst_loses_no_acknowledged_publish(broker):
    client = burst_client(broker, timeout=30)
    answered = []
    killed = threading.Event()

    def on_result(_future):
        answered.append(1)
        if len(answered) == 150 and not killed.is_set():
            killed.set()
            os.kill(broker.procs["writer0"].pid, signal.SIGKILL)

    futures = burst(client, 3000, on_result)
    for future in futures:
        future.exception(30)  # every publish gets an answer: no silence
    assert killed.is_set()
    broker.procs["writer0"].wait(10)
    broker.start_writer(0)
    broker.wait_ready()
    acknowledged = assert_durable(broker, client, futures)
    assert 150 <= acknowledged < 3000


WRITER_STEPS = [
    faults.AFTER_TMP_WRITE,  # files in tmp/, nothing flushed
    faults.AFTER_SYNC,  # files flushed, not yet renamed into new/
    faults.AFTER_RENAME,  # visible in new/, the renames not yet durable
    faults.AFTER_DIR_SYNC,  # durable in new/, not yet indexed
    BEFORE_INDEX_COMMIT,  # durable and every other change of the commit made
]


@pytest.mark.parametrize("step", WRITER_STEPS)
def test_a_writer_killed_between_two_steps_loses_no_acknowledged_publish(broker, step):
    client = burst_client(broker, timeout=30)
    before = burst(client, 300, lambda _future: None)  # acknowledged by both writers
    assert all(f.result(30).delivered_to == 1 for f in before)
    # The next writer of shard 0 kills itself (SIGKILL) the first time it reaches step.
    broker.kill("writer0", signal.SIGTERM)
    broker.start_writer(0, env={"RELAY_FAULT": step})
    broker.wait_ready()
    during = burst(client, 600, lambda _future: None)
    for future in during:
        # Every publish gets an answer from the broker, not the client's own deadline.
        assert not isinstance(future.exception(30), Timeout)
    assert broker.procs["writer0"].wait(10) == -signal.SIGKILL  # it died at the step
    assert any(f.result().rejected for f in during if not f.exception())  # shard 0 refused
    broker.start_writer(0)  # no fault armed: recovery, then service
    broker.wait_ready()
    assert any(shard_of(endpoint_hash(s), 2) == 0 for s in ENDPOINTS), "the test needs shard 0"
    assert assert_durable(broker, client, before) == len(before)  # both shards, all of it
    assert assert_durable(broker, client, during) > 0  # shard 1 kept serving throughout
    for subject in ENDPOINTS:
        mailbox = broker.home.mailbox(endpoint_hash(subject))
        assert os.listdir(mailbox / "tmp") == []  # nothing half-written left behind
        # What the killed commit made durable but never confirmed is there, whole, and
        # indexed: the restarted writer adopted it.
        for name in os.listdir(mailbox / "new"):
            [copy] = client.trace(name)["copies"]
            assert copy["state"] == "new"


def test_killing_the_router_mid_burst_loses_no_acknowledged_publish(broker):
    client = burst_client(broker, timeout=5)
    answered = []

    def on_result(_future):
        answered.append(1)
        if len(answered) == 150:
            os.kill(broker.procs["router"].pid, signal.SIGKILL)

    futures = burst(client, 3000, on_result)
    for future in futures:
        future.exception(30)  # answered, or a Timeout: an error, not a hang
    broker.procs["router"].wait(10)
    broker.start_router()
    broker.wait_ready()
    checker = broker.client()
    acknowledged = assert_durable(broker, checker, futures)
    assert acknowledged >= 150


@pytest.mark.parametrize("damage", ["deleted", "garbage", "truncated"])
def test_a_damaged_index_is_rebuilt_from_the_maildir_at_start(damage):
    broker = Broker(shards=1).start()
    try:
        client = broker.client()
        client.register_endpoint(ENDPOINTS[0])
        ids = [client.publish(ENDPOINTS[0], i, sender=SENDER).message_id for i in range(5)]
        broker.stop()
        index = broker.home.index_db(0)
        if damage == "deleted":
            index.unlink()
        elif damage == "garbage":
            index.write_bytes(b"this is not a database" * 100)
        else:
            index.write_bytes(index.read_bytes()[:1000])
        broker.start()
        client = broker.client()
        assert [client.trace(i)["copies"][0]["state"] for i in ids] == ["new"] * 5
        if damage != "deleted":
            assert "is unusable" in broker.log("writer0")
    finally:
        broker.cleanup()


ADVERSARIAL_BODIES = [
    b"\x91" * 100_000 + b"\xc0",  # 100,000 nested one-element arrays
    b"\xdd\xff\xff\xff\xff",  # an array that claims 2^32 - 1 items
    b"\xdf\xff\xff\xff\xff",  # a map that claims 2^32 - 1 pairs
    b"\xdb\xff\xff\xff\xff",  # a 4 GiB string, missing
    wire.packb(
        {"op": "publish", "rid": 1, "subject": "a.b", "from": "c.d", "payload": "x" * 2**21}
    ),
    wire.packb({"op": "publish", "rid": 1, "subject": "a.\x00.b", "from": "c.d", "payload": 1}),
    wire.packb({"op": "publish", "rid": 1, "subject": "..", "from": "../../x", "payload": 1}),
    wire.packb({"op": "subscribe", "rid": 1, "pattern": ">", "credit": 10**9}),
    wire.packb({"op": "ack", "rid": 1, "id": "../../../etc/passwd", "endpoint": "../.."}),
    wire.packb({"op": "publish", "rid": 1, "subject": "a.b", "from": "c.d", "payload": [[[[]]]]}),
    wire.packb([1, 2, 3]),
    wire.packb({"op": "publish", "rid": 2**64 - 1}),
]

frame = st.one_of(
    st.binary(max_size=64),
    st.just(wire.MAGIC),
    st.sampled_from(ADVERSARIAL_BODIES),
    st.builds(
        wire.packb,
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**64 - 1)
            | st.text(max_size=20)
            | st.binary(max_size=20),
            lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=5),
            max_leaves=20,
        ),
    ),
    st.builds(
        lambda op, body: wire.packb({"op": op, "rid": 1, **body}),
        st.sampled_from(sorted(wire.OPERATIONS)),
        st.dictionaries(
            st.sampled_from(
                [
                    "subject",
                    "from",
                    "payload",
                    "pattern",
                    "id",
                    "endpoint",
                    "sub",
                    "rule",
                    "config",
                    "signal",
                    "budget",
                    "limit",
                    "items",
                    "credit",
                    "mode",
                ]
            ),
            st.one_of(
                st.none(),
                st.integers(-(2**63), 2**63),
                st.text(max_size=30),
                st.just("../../etc/passwd"),
                st.just("a\x00b"),
                st.lists(st.text(max_size=5), max_size=3),
            ),
            max_size=6,
        ),
    ),
)


def replies_due(frames: list[bytes]) -> int:
    """One reply per request: a well-framed batch (an array of 1..MAX_BATCH items) holds
    as many requests as items, anything else counts as one."""
    if len(frames) == 2 and frames[0] == wire.MAGIC:
        try:
            body = wire.unpackb(frames[1])
        except Exception:
            return 1
        if isinstance(body, list) and 0 < len(body) <= wire.MAX_BATCH:
            return len(body)
    return 1


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests=st.lists(st.lists(frame, min_size=1, max_size=3), min_size=1, max_size=10))
def test_garbage_frames_get_one_reply_each_and_the_broker_keeps_serving(fuzz_broker, requests):
    broker, sock = fuzz_broker
    for frames in requests:
        sock.send_multipart(frames)
        answered = 0
        while answered < replies_due(frames):  # RCVTIMEO: a missing reply fails the test
            reply = sock.recv_multipart()
            assert reply[0] == wire.MAGIC
            answered += len(wire.decode_incoming_all(reply))
        assert answered == replies_due(frames)
    client = broker.client()
    client.register_endpoint(ENDPOINTS[0])
    assert client.publish(ENDPOINTS[0], "still serving", sender=SENDER).delivered_to == 1
    client.close()
    assert os.listdir(broker.home.root.parent) == [broker.home.root.name]  # nothing beside it
    ours = ("run", "mailboxes", "control.db", "rejections.db", "index-")
    outside = [p for p in os.listdir(broker.home.root) if not p.startswith(ours)]
    assert outside == [], f"unexpected files in the home: {outside}"
    for mailbox in (broker.home.mailboxes).iterdir():  # only Maildir folders inside
        assert {p.name for p in mailbox.iterdir()} <= {"tmp", "new", "cur", "failed"}


def test_a_flood_of_subscriptions_is_bounded_and_the_broker_keeps_serving(fuzz_broker):
    broker, sock = fuzz_broker
    codes = []
    for rid in range(1, 1001):
        sock.send_multipart(wire.encode_request("subscribe", rid, pattern=f"flood.{rid}"))
        reply = wire.decode_incoming(sock.recv_multipart())
        codes.append("ok" if reply.ok else reply.error.code)
    limit = broker.client().get_config()["limits"]["maxSubscriptionsPerClient"]
    assert codes.count("ok") <= limit
    assert codes[limit:] == ["limit_exceeded"] * (1000 - limit)
    client = broker.client()
    client.register_endpoint(ENDPOINTS[1])
    assert client.publish(ENDPOINTS[1], "still serving", sender=SENDER).delivered_to == 1


@pytest.fixture(scope="module")
def fuzz_broker():
    sandbox = Path(tempfile.mkdtemp(prefix="relay-fuzz-"))  # holds the home and nothing else
    try:
        with Broker(shards=1, home=sandbox / "home") as broker:
            broker.client().set_config({"rateLimit": {"enabled": False}})
            sock = broker.raw_dealer()
            try:
                yield broker, sock
            finally:
                sock.close()
        assert all(p.returncode == 0 for p in broker.procs.values()), "a process crashed"
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)


def test_a_copy_stored_claimed_whose_index_commit_failed_goes_back_to_new(shard_writer):
    writer, results = shard_writer
    endpoint = endpoint_hash("relay.agent.demo.a")
    mailbox = writer._watch(endpoint)
    message_id = new_id(int(time.time() * 1000))
    header = proto.DeliveryHeader(
        7,
        message_id,
        endpoint,
        "relay.agent.demo.a",
        "relay.agent.demo.cli",
        0,
        target=proto.TARGET_CUR,
    )
    writer.index._conn.execute("DROP TABLE messages")  # this commit's transaction fails
    writer._process([proto.deliver([(header, b'{"id": "x"}')])])
    # The publisher hears of a failure, and no consumer will: the file is not left
    # claimed by nobody in cur/, it waits in new/ like a message dropped in there.
    kind, rows, _ = proto.decode(wait_for_stored(results))
    assert kind == proto.STORED and rows[0][3] is None and rows[0][4] == "storage_error"
    assert mailbox.list_new() == [message_id]
    assert os.listdir(mailbox.cur_dir) == []


def wait_for_stored(results: zmq.Socket) -> list[bytes]:
    """The first ``stored`` report the writer sends (hello may come first)."""
    while True:
        frames = results.recv_multipart()  # RCVTIMEO bounds the wait
        if frames[0] == proto.STORED:
            return frames
