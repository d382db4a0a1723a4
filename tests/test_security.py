"""Authentication and sender identity through real processes (docs/security.md).

ipc://: libzmq reports the peer's uid to the router's ZAP handler, checked against
auth.json. tcp://: CURVE, only listed public keys. Either way the connection's
credentials decide which ``from`` subjects it may use and whether it may run operator
commands.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from sdk import wire
from sdk.curve import create_certificate
from sdk.errors import NotAuthorized, SenderNotAllowed
from sdk.subjects import endpoint_hash
from sdk.types import AccessRule, RuleAction, Signal, SignalType
from tests.harness import Broker, depth, signals_flowing, wait_for

pytestmark = pytest.mark.integration

PROJ_A = "relay.agent.projA"


def write_auth(broker: Broker, data: dict) -> None:
    """Atomically, as an editor or `relay auth` does (the router watches the directory)."""
    tmp = broker.home.root / ".auth.json.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, broker.home.auth_file)


def refused(call) -> bool:
    try:
        call()
    except SenderNotAllowed:
        return True
    return False


@pytest.fixture
def tcp_broker():
    """A broker on tcp:// with two client keys: an admin and projA (its own senders)."""
    with Broker.on_tcp([("ops", [">"], True), ("projA", [f"{PROJ_A}.>"], False)]) as b:
        yield b


def test_a_listed_curve_key_publishes_as_its_senders_only(tcp_broker):
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    client.register_endpoint(f"{PROJ_A}.inbox")
    result = client.publish(f"{PROJ_A}.inbox", {"n": 1}, sender=f"{PROJ_A}.worker")
    assert result.delivered_to == 1
    with pytest.raises(SenderNotAllowed, match=r"projA may not send as relay\.agent\.other"):
        client.publish(f"{PROJ_A}.inbox", {"n": 2}, sender="relay.agent.other")
    status = tcp_broker.client().status()
    assert sum(e["depth"] for e in status["endpoints"]) == 1


def test_a_key_receives_only_the_endpoints_it_may_consume(tcp_broker):
    """projA may send as relay.agent.projA.>, so (no 'consumes') it receives only those
    endpoints: subscribe, observe, pending and dead letters alike."""
    ops = tcp_broker.client()
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    other = "relay.agent.other.inbox"
    ops.register_endpoint(other)
    client.register_endpoint(f"{PROJ_A}.inbox")

    def refuse_some(envelope) -> None:
        if envelope.payload == "nack me":
            raise ValueError("refused")

    client.subscribe(f"{PROJ_A}.>", refuse_some)
    client.observe(f"{PROJ_A}.*", lambda envelope: None)
    for pattern in (other, ">", "relay.agent.*.inbox", "relay.agent.>"):
        with pytest.raises(NotAuthorized, match="projA' may not receive messages of"):
            client.subscribe(pattern, lambda envelope: None)
        with pytest.raises(NotAuthorized, match=r"may receive relay\.agent\.projA\.>"):
            client.observe(pattern, lambda envelope: None)
    with pytest.raises(NotAuthorized, match="may not receive"):
        client.pending(other)
    assert client.pending(f"{PROJ_A}.inbox") == []
    # Dead letters (no endpoint matched): projA reads its own only, the operator all.
    ops.publish("relay.agent.other.nobody", "not yours", sender="relay.agent.ops")
    client.publish(f"{PROJ_A}.nobody", "mine", sender=f"{PROJ_A}.worker")
    assert [d["subject"] for d in client.dead_letters()] == [f"{PROJ_A}.nobody"]
    # Filtered before the limit: the older letter, not its own, does not fill the page.
    assert [d["subject"] for d in client.dead_letters(limit=1)] == [f"{PROJ_A}.nobody"]
    with pytest.raises(NotAuthorized, match="may not receive"):
        client.dead_letters(endpoint_hash(other))
    assert client.dead_letters(endpoint_hash(f"{PROJ_A}.inbox")) == []
    subjects = sorted(d["subject"] for d in ops.dead_letters())
    assert subjects == ["relay.agent.other.nobody", f"{PROJ_A}.nobody"]
    # A dead letter of its own registered endpoint (nacked by its handler) is listed too.
    ops.publish(f"{PROJ_A}.inbox", "nack me", sender="relay.agent.ops")
    wait_for(lambda: len(client.dead_letters()) == 2, what="the nacked message listed")
    assert sorted(d["subject"] for d in client.dead_letters()) == [
        f"{PROJ_A}.inbox",
        f"{PROJ_A}.nobody",
    ]
    # trace: the copies of what it sent or may receive.
    theirs = ops.publish(other, "theirs", sender="relay.agent.ops").message_id
    mine = client.publish(other, "mine", sender=f"{PROJ_A}.worker").message_id
    assert client.trace(theirs)["copies"] == []
    assert [c["subject"] for c in client.trace(mine)["copies"]] == [other]
    assert [c["subject"] for c in ops.trace(theirs)["copies"]] == [other]


def test_narrowing_what_a_key_receives_ends_its_live_subscription(tcp_broker):
    ops = tcp_broker.client()
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    inbox = f"{PROJ_A}.inbox"
    ops.register_endpoint(inbox)
    seen = []
    client.subscribe(inbox, lambda envelope: seen.append(envelope.payload))
    ops.publish(inbox, "before", sender="relay.agent.ops")
    wait_for(lambda: seen == ["before"], what="the first message pushed")

    data = json.loads(tcp_broker.home.auth_file.read_text())
    entry = next(e for e in data["keys"].values() if e["name"] == "projA")
    entry["consumes"] = []  # still admitted, still sends as projA, receives nothing
    write_auth(tcp_broker, data)
    wait_for(
        lambda: "may no longer receive it" in tcp_broker.log("router"),
        what="the subscription ended",
    )
    ops.publish(inbox, "after", sender="relay.agent.ops")
    wait_for(lambda: depth(ops, inbox) == 1, what="the second message waiting in new/")
    assert seen == ["before"]
    with pytest.raises(NotAuthorized, match="may receive nothing"):
        client.subscribe(inbox, lambda envelope: None)


def test_auth_consume_names_what_an_identity_receives(broker):
    result = broker.relay(
        "auth", "allow-uid", "1001", "--sender=relay.agent.b.>", "--consume=relay.agent.>"
    )
    assert result.returncode == 0, result.stderr
    assert "may receive" in result.stdout and "relay.agent.>" in result.stdout
    entry = json.loads(broker.home.auth_file.read_text())["uids"]["1001"]
    assert entry["senders"] == ["relay.agent.b.>"] and entry["consumes"] == ["relay.agent.>"]
    result = broker.relay("auth", "allow-uid", "1002", "--sender=a.b", "--consume=a..b")
    assert result.returncode != 0 and "consumes" in result.stderr
    assert "1002" not in json.loads(broker.home.auth_file.read_text())["uids"]


ADMIN_REQUESTS = {
    "set_config": {"config": {"rateLimit": {"maxPerWindow": 1}}},
    "add_rule": {"rule": {"from": ">", "to": ">", "action": "deny"}},
    "remove_rule": {"from": ">", "to": ">"},
    "unregister": {"subject": f"{PROJ_A}.inbox"},
    "purge_dead_letters": {},
    "rebuild_index": {},
    "compact_remove": {"items": []},
    "complete": {"id": "01JDQ3ZV9R6Q4W1T3M5N7P8K2A", "endpoint": f"{PROJ_A}.inbox"},
    "fail": {"id": "01JDQ3ZV9R6Q4W1T3M5N7P8K2A", "endpoint": f"{PROJ_A}.inbox"},
    "requeue": {"id": "01JDQ3ZV9R6Q4W1T3M5N7P8K2A", "endpoint": f"{PROJ_A}.inbox"},
    "requeue_dead_letters": {"id": "01JDQ3ZV9R6Q4W1T3M5N7P8K2A"},
    # a federation bridge's (docs/federation.md)
    "relay_take": {"node": "a"},
    "relayed": {"parts": []},
    "remote_endpoints": {"node": "b", "subjects": []},
}


def test_every_operator_operation_is_refused_to_a_non_admin_key(tcp_broker):
    from broker.router import ADMIN_OPS

    assert ADMIN_REQUESTS.keys() == ADMIN_OPS
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    for op, fields in ADMIN_REQUESTS.items():
        with pytest.raises(NotAuthorized, match=op):
            client.send_request(op, **fields).result(10)
    assert client.get_config()["rateLimit"]["maxPerWindow"] != 1  # reading is fine


def test_a_restricted_key_registers_and_replies_only_within_its_senders(tcp_broker):
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    client.register_endpoint(f"{PROJ_A}.inbox")
    with pytest.raises(NotAuthorized, match="register endpoints only under"):
        client.register_endpoint("relay.agent.other.inbox")
    with pytest.raises(SenderNotAllowed):
        client.publish(f"{PROJ_A}.inbox", 1, sender=f"{PROJ_A}.me", reply_to="relay.agent.victim")


def test_a_restricted_key_cannot_send_anonymous_or_broker_signals(tcp_broker):
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    typing = Signal(SignalType.TYPING, "active", f"{PROJ_A}.inbox", 0)
    with pytest.raises(SenderNotAllowed, match="must name its 'from'"):
        client.signal(f"{PROJ_A}.inbox", typing)
    receipt = Signal(SignalType.DELIVERY_RECEIPT, "done", f"{PROJ_A}.inbox", 0)
    with pytest.raises(NotAuthorized, match="from the broker only"):
        client.signal(f"{PROJ_A}.inbox", receipt, sender=f"{PROJ_A}.me")
    client.signal(f"{PROJ_A}.inbox", typing, sender=f"{PROJ_A}.me")  # its own: fine


def test_an_unknown_curve_key_is_refused_at_the_handshake(tcp_broker, tmp_path):
    create_certificate(tmp_path, "stranger")
    # NotAuthorized, not the Unavailable a missed deadline gives: told by the handshake.
    with pytest.raises(NotAuthorized, match="refused this connection's handshake"):
        tcp_broker.client(key_file=tmp_path / "stranger.key_secret", timeout=30)
    assert "unknown CURVE key" in tcp_broker.log("router")


def test_a_client_without_a_key_cannot_talk_to_a_tcp_broker(tcp_broker):
    with pytest.raises(NotAuthorized):
        tcp_broker.client(key_file=None, timeout=30)


def test_signals_flow_over_curve(tcp_broker):
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    signals_flowing(client, f"{PROJ_A}.inbox", sender=f"{PROJ_A}.me")


def test_removing_a_key_revokes_the_open_connection_and_its_signals(tcp_broker):
    admin = tcp_broker.client()
    client = tcp_broker.client(key_file=tcp_broker.home.keys / "projA.key_secret")
    subject = f"{PROJ_A}.inbox"
    signals_flowing(client, subject, sender=f"{PROJ_A}.me")
    seen: list[str] = []
    client.on_signal(subject, lambda _subject, signal: seen.append(signal.state))
    result = tcp_broker.relay("auth", "remove", "projA")
    assert result.returncode == 0, result.stderr

    def revoked() -> bool:
        try:
            client.list_endpoints()
        except NotAuthorized as exc:
            assert "are not admitted" in str(exc)  # the open connection, not a reconnect
            return True
        return False

    wait_for(revoked, 10, what="the removed key to be refused")
    # Its signal connection was dropped and cannot come back: the admin's probes, which
    # the admin sees arrive, never reach it.
    probes: list[str] = []
    admin.on_signal(subject, lambda _subject, signal: probes.append(signal.state))
    wait_for(
        lambda: (
            admin.signal(subject, Signal(SignalType.PRESENCE, "after", subject, 0))
            or len(probes) >= 3
        ),
        10,
        interval=0.05,
        what="the admin's probes",
    )
    assert "after" not in seen


def test_the_owners_senders_can_be_restricted_and_it_applies_at_once(broker):
    client = owner_restricted_to_a(broker)
    assert client.publish("relay.agent.a.inbox", "ok", sender="relay.agent.a.me").delivered_to
    with pytest.raises(SenderNotAllowed):
        typing = Signal(SignalType.TYPING, "active", "relay.agent.a.inbox", 0)
        client.signal("relay.agent.a.inbox", typing, sender="relay.agent.b.x")
    with pytest.raises(NotAuthorized):
        client.add_rule(AccessRule("relay.agent.b.>", "relay.agent.a.>", RuleAction.DENY))


def owner_restricted_to_a(broker: Broker):
    """A client of the owner, once auth.json keeps the owner to relay.agent.a.>."""
    client = broker.client()
    client.register_endpoint("relay.agent.a.inbox")
    write_auth(broker, {"uids": {str(os.getuid()): {"senders": ["relay.agent.a.>"]}}})
    wait_for(
        lambda: refused(lambda: client.publish("relay.agent.a.inbox", 1, sender="relay.b.x")),
        10,
        what="auth.json to apply",
    )
    return client


def test_deleting_auth_json_returns_to_owner_only_defaults(broker):
    client = owner_restricted_to_a(broker)
    broker.home.auth_file.unlink()
    wait_for(
        lambda: not refused(lambda: client.publish("relay.agent.a.inbox", 2, sender="relay.b.x")),
        10,
        what="the deletion to apply",
    )


def test_a_broken_auth_file_keeps_the_last_good_policy(broker):
    client = owner_restricted_to_a(broker)
    (broker.home.auth_file).write_text("{not json")
    wait_for(lambda: "auth.json refused" in broker.log("router"), 10, what="the refusal in the log")
    assert refused(lambda: client.publish("relay.agent.a.inbox", 2, sender="relay.b.x"))


# ---------------------------------------------------------------- other local users

NOBODY = 65534


def _hello_as(uid: int, address: str, *requests: list[bytes]) -> list[str]:
    """In a forked child running as ``uid``: send each request, report each outcome."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own context, its own uid, nothing of the parent's
        outcomes = []
        try:
            os.setgid(uid)
            os.setuid(uid)
            ctx = zmq.Context()
            dealer = ctx.socket(zmq.DEALER)
            dealer.linger = 0
            dealer.connect(address)
            for request in requests:
                dealer.send_multipart(request)
                if not dealer.poll(3000):
                    # A refused handshake answers nothing, now or later: one wait is
                    # enough (an attempt inside a wait_for costs 3 s, not 3 s a request).
                    outcomes += ["no reply"] * (len(requests) - len(outcomes))
                    break
                reply = wire.decode_incoming(dealer.recv_multipart())
                outcomes.append("ok" if reply.ok else reply.error.code)
            dealer.close()
            ctx.term()
        finally:
            os.write(write_end, json.dumps(outcomes).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def shared_socket_broker():
    """A broker whose client socket sits in a directory other users can traverse."""
    shared = Path(tempfile.mkdtemp(prefix="relay-shared-"))  # not under pytest's 0700 tree
    os.chmod(shared, 0o711)
    address = f"ipc://{shared}/router.sock"
    try:
        with Broker(
            shards=1, router_args=["--address", address], client_options={"address": address}
        ) as b:
            yield b
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another uid needs root")
def test_another_local_user_is_refused_unless_allowed_and_then_limited_to_its_senders(
    shared_socket_broker,
):
    broker = shared_socket_broker
    address = broker.client_options["address"]
    socket_file = address[len("ipc://") :]
    assert os.stat(socket_file).st_mode & 0o777 == 0o600  # only the owner, by default
    os.chmod(socket_file, 0o666)  # even when reachable, ZAP is a second wall
    broker.client().register_endpoint("relay.agent.nobody.inbox")
    hello = wire.encode_request("hello", 1)

    assert _hello_as(NOBODY, address, hello) == ["no reply"]
    wait_for(
        lambda: "uid 65534 is not in the allow-list" in broker.log("router"),
        10,
        what="the refusal in the router's log",
    )

    result = broker.relay("auth", "allow-uid", str(NOBODY), "--sender=relay.agent.nobody.>")
    assert result.returncode == 0, result.stderr
    own = wire.encode_request(
        "publish",
        2,
        subject="relay.agent.nobody.inbox",
        payload=1,
        **{"from": "relay.agent.nobody.a"},
    )
    forged = wire.encode_request(
        "publish", 3, subject="relay.agent.nobody.inbox", payload=2, **{"from": "relay.agent.root"}
    )
    wait_for(
        lambda: (
            _hello_as(NOBODY, address, hello, own, forged) == ["ok", "ok", "sender_not_allowed"]
        ),
        10,
        what="uid 65534 to be admitted with its own senders only",
    )


@pytest.fixture
def no_umask() -> Iterator[None]:
    """Processes started meanwhile create files with exactly the mode they ask for: a
    file left to the default mode shows as 0666, not hidden by a umask of 022 or 077."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_lock_files_are_owner_only_whatever_the_umask(no_umask, broker):  # no_umask first
    lock_files = sorted(broker.home.run.glob("*.lock"))
    names = ["router.lock", "start.lock", "writer-0.lock", "writer-1.lock"]
    assert [p.name for p in lock_files] == names
    for path in lock_files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_the_async_sdk_connects_with_a_curve_key(tcp_broker):
    from sdk import aio

    async def publish() -> int:
        async with aio.connect(
            tcp_broker.home.root,
            **{
                **tcp_broker.client_options,
                "key_file": tcp_broker.home.keys / "projA.key_secret",
            },
        ) as client:
            await client.register_endpoint(f"{PROJ_A}.inbox")
            result = await client.publish(f"{PROJ_A}.inbox", {"n": 1}, sender=f"{PROJ_A}.w")
            with pytest.raises(SenderNotAllowed):  # acting as projA, not as the owner
                await client.publish(f"{PROJ_A}.inbox", {"n": 2}, sender="relay.agent.other")
            return result.delivered_to

    assert asyncio.run(publish()) == 1
