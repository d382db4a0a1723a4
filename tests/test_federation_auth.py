"""Federation under per-node NATS identities (docs/federation.md, "Identities: who may
relay for whom"): a three-server cluster that knows an admin (who makes the bucket,
streams and consumers with `relay bridge --setup`), node a as an nkey and node b as a
user with a password, each with exactly the permissions edges/bridge_names.permissions
gives; two Relay homes whose auth.json says which senders each origin node may relay.
NATS ties a stream subject's origin to the user who published it, and the far router
ties the origin to its senders: one node cannot speak for another's agents."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nkeys
import pytest
from nats.js.api import ConsumerConfig

from edges import bridge_names as names
from sdk.ids import new_id
from sdk.types import Envelope, Signal, SignalType, default_budget
from tests.harness import ROOT, Broker, wait_for
from tests.nats_cluster import NatsCluster
from tests.test_federation_nats import A_AGENT, B_AGENT, Node, meet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REFUSED = "ERROR bridge a: NATS refused this node's credentials (authorization violation)"


def nkey_user(directory: Path, name: str) -> tuple[Path, str]:
    """A new user nkey: the file holding its seed (what `--nkey` takes), its public key
    (what the server's configuration names)."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path = directory / f"{name}.nk"
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return path, nkeys.from_seed(bytearray(seed)).public_key.decode()


@dataclass(frozen=True)
class Users:
    dir: Path
    admin_password: str
    a_seed: Path
    a_public: str
    b_password: str

    @classmethod
    def create(cls) -> Users:
        directory = Path(tempfile.mkdtemp(prefix="relay-nkeys-"))
        a_seed, a_public = nkey_user(directory, "a")
        return cls(directory, secrets.token_hex(8), a_seed, a_public, secrets.token_hex(8))

    def authorization(self) -> dict[str, Any]:
        return {
            "users": [
                {"user": "admin", "password": self.admin_password},  # every right
                {"nkey": self.a_public, "permissions": names.permissions("a")},
                {"user": "b", "password": self.b_password, "permissions": names.permissions("b")},
            ]
        }

    def admin(self) -> dict[str, str]:
        return {"user": "admin", "password": self.admin_password}


def relays(node: str, patterns: list[str]) -> dict[str, Any]:
    """An auth.json whose owner (the tests, the bridge) may relay for node's patterns."""
    return {
        "uids": {str(os.getuid()): {"senders": [">"], "admin": True, "relays": {node: patterns}}}
    }


def setup(node: Node, cluster: NatsCluster, users: Users) -> None:
    admin_urls = ",".join(cluster.urls_as("admin", users.admin_password))
    args = ["bridge", "--setup", "--nats", admin_urls, "--node", node.name, "--replicas", "3"]
    result = node.broker.relay(*args, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.fixture
def secured() -> Iterator[tuple[NatsCluster, Users, Node, Node]]:
    users = Users.create()
    cluster = NatsCluster(authorization=users.authorization(), admin=users.admin()).start()
    started: list[Node] = []
    try:
        a = Node(
            "a",
            cluster,
            "relay.agent.a.>",
            options=["--nkey", str(users.a_seed)],
            auth=relays("b", ["relay.agent.b.>"]),
        )
        started.append(a)
        b = Node(
            "b",
            cluster,
            "relay.agent.b.>",
            nats=cluster.urls_as("b", users.b_password),
            auth=relays("a", ["relay.agent.a.>"]),
        )
        started.append(b)
        for node in started:
            setup(node, cluster, users)
        a.client.register_endpoint(A_AGENT)
        b.client.register_endpoint(B_AGENT)
        meet(cluster, a, b)
        yield cluster, users, a, b
    finally:
        for node in started:
            node.broker.cleanup()
        cluster.stop()
        shutil.rmtree(users.dir, ignore_errors=True)


class NatsAs:
    """A NATS connection of the test's own, as a node's user or the admin, with what the
    server refused it (permissions violations come back asynchronously)."""

    def __init__(self, cluster: NatsCluster, **options: Any) -> None:
        self.cluster, self.options = cluster, options
        self.errors: list[str] = []
        self.loop = asyncio.new_event_loop()

    def __enter__(self) -> NatsAs:
        async def error(exc: Exception) -> None:
            self.errors.append(str(exc))

        self.nc = self.run(nats.connect(self.cluster.urls, error_cb=error, **self.options))
        self.js = self.nc.jetstream(timeout=5)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.run(self.nc.close())
        self.loop.close()

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def refused(self, coroutine: Any) -> Exception | None:
        """What a request the server should refuse raised, None if it went through."""
        try:
            self.run(coroutine)
        except Exception as exc:  # a timeout: a refused request is never answered
            return exc
        return None


def part(sender: str) -> tuple[str, bytes]:
    """A stream message as a's router would hand it to a's bridge: (id, encoded)."""
    now = int(time.time() * 1000)
    envelope = Envelope(
        id=new_id(),
        subject=B_AGENT,
        sender=sender,
        reply_to=None,
        budget=default_budget(now),
        created_at=now,
        payload={"content": "by hand"},
    )
    return envelope.id, names.encode_part({"subjects": [B_AGENT], "envelope": envelope.to_wire()})


def stored_on(node: Node, message_id: str) -> bool:
    return any(c["endpointSubject"] == B_AGENT for c in node.client.trace(message_id)["copies"])


def as_a(cluster: NatsCluster, users: Users) -> NatsAs:
    return NatsAs(cluster, nkeys_seed=str(users.a_seed), inbox_prefix=names.inbox_prefix("a"))


def test_with_per_node_users_a_message_and_a_signal_from_a_reach_b(secured):
    _, users, a, b = secured
    got: list[Envelope] = []
    b.client.subscribe(B_AGENT, got.append)
    result = a.client.publish(B_AGENT, {"content": "ping"}, sender=A_AGENT)
    assert dict(result.remote) == {"b": (B_AGENT,)}
    wait_for(lambda: got, 30, what="a's message on b")
    assert (got[0].id, got[0].sender) == (result.message_id, A_AGENT)

    seen: list[Signal] = []
    b.client.on_signal(B_AGENT, lambda _subject, signal: seen.append(signal))
    typing = Signal(SignalType.TYPING, "active", B_AGENT, 0)
    wait_for(
        lambda: a.client.signal(B_AGENT, typing, sender=A_AGENT) or seen,
        30,
        interval=0.2,
        what="a's signal on b",
    )
    assert seen[0].data == {"relayedFrom": "a"}
    # every right the bridges used is in the permissions (a missing one is logged), and
    # b's password, in its URLs, is neither logged nor shown
    for node in (a, b):
        assert "NATS refused" not in node.broker.log("bridge")
    assert users.b_password not in b.broker.log("bridge")
    assert users.b_password not in b.broker.relay("status").stdout


def test_node_as_user_cannot_put_a_message_in_bs_stream_as_origin_c(secured):
    cluster, users, _, b = secured
    forged, body = part(sender="relay.agent.c.carol")
    with as_a(cluster, users) as nc:
        headers = {"Nats-Msg-Id": forged}
        assert nc.refused(nc.js.publish("relay.fed.b.from.c", body, headers=headers))
        # nor through JetStream: a push consumer delivers to any subject its creator
        # names, whatever that user may publish to (nats-server issue 8274)
        config = ConsumerConfig(deliver_subject="relay.fed.b.from.c")
        assert nc.refused(nc.js.add_consumer(names.stream_of("a"), config))
        wait_for(lambda: len(nc.errors) >= 2, 10, what="the permissions violations")
        assert 'violation for publish to "relay.fed.b.from.c"' in nc.errors[0].lower()
        assert "$js.api.consumer.create.relay_a" in nc.errors[1]  # nats-py lowercases it
        # what a may do, it can: as itself, for its own agent
        honest, body = part(sender=A_AGENT)
        nc.run(nc.js.publish("relay.fed.b.from.a", body, headers={"Nats-Msg-Id": honest}))
    wait_for(lambda: stored_on(b, honest), 30, what="a's own message on b")
    with NatsAs(cluster, **users.admin()) as admin:
        info = admin.run(admin.js.stream_info("RELAY_b", subjects_filter="relay.fed.b.>"))
    assert info.state.subjects == {"relay.fed.b.from.a": 1}
    assert not stored_on(b, forged)


def test_a_sender_outside_as_relays_is_refused_on_b_and_settled_not_stored(secured):
    cluster, users, _, b = secured
    message_id, body = part(sender="relay.agent.b.bob")  # a speaking for b's own agent
    with as_a(cluster, users) as nc:
        nc.run(nc.js.publish("relay.fed.b.from.a", body, headers={"Nats-Msg-Id": message_id}))

    with NatsAs(cluster, **users.admin()) as admin:

        def settled() -> bool:  # b's bridge took it and termed it: none pending or unacked
            info = admin.run(admin.js.consumer_info("RELAY_b", names.consumer_of("b")))
            return info.delivered.stream_seq == 1 and not info.num_pending + info.num_ack_pending

        wait_for(settled, 30, interval=0.2, what="b's bridge to settle the message")
    assert "ingest from a: " in b.broker.log("bridge")
    assert "may not relay messages of relay.agent.b.bob from node a" in b.broker.log("bridge")
    assert not stored_on(b, message_id)


def test_a_bridge_whose_credentials_nats_refuses_logs_it_and_keeps_trying():
    users = Users.create()
    cluster = NatsCluster(authorization=users.authorization(), admin=users.admin()).start()
    broker = Broker(shards=1)
    try:
        broker.start()
        stranger, _ = nkey_user(users.dir, "stranger")  # a well-formed seed NATS never saw
        wrong = ",".join(cluster.urls_as("b", "not-" + users.b_password))
        for name, nats_urls, options in (
            ("wrong-password", wrong, []),
            ("unknown-nkey", ",".join(cluster.urls), ["--nkey", str(stranger)]),
        ):
            args = ["bridge", "--nats", nats_urls, "--node", "a", *options]
            broker.start_process(name, *args)
        for name in ("wrong-password", "unknown-nkey"):
            wait_for(lambda n=name: REFUSED in broker.log(n), 60, what=f"{name}: the refusal")
            assert broker.procs[name].poll() is None  # still trying, as for a cluster down
        assert "not-" + users.b_password not in broker.log("wrong-password")
    finally:
        broker.cleanup()
        cluster.stop()
        shutil.rmtree(users.dir, ignore_errors=True)


@pytest.mark.parametrize(
    "option, content, expected",
    [
        ("--nkey", None, "--nkey {path}: No such file or directory"),
        ("--nkey", b"SUAnotaseed\n", "--nkey {path}: not an nkey seed"),
        ("--creds", None, "--creds {path}: No such file or directory"),
        ("--creds", b"user = x\n", "--creds {path}: not a NATS .creds file"),
        ("--tls-ca", b"not a certificate\n", "--tls-ca {path}: no certificate in it"),
    ],
    ids=["nkey-missing", "nkey-malformed", "creds-missing", "creds-malformed", "ca-malformed"],
)
def test_a_credentials_file_the_bridge_cannot_use_is_a_one_line_error(
    tmp_path, option, content, expected
):
    path = tmp_path / "secret"
    if content is not None:
        path.write_bytes(content)
    bridge = ["bridge", "--nats", "nats://127.0.0.1:1", "--node", "a", option, str(path)]
    result = subprocess.run(
        [sys.executable, "-m", "cli", "--home", str(tmp_path / "home"), *bridge],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == f"relay bridge: {expected.format(path=path)}\n"
    assert "SUAnotaseed" not in result.stderr


def test_the_permissions_in_docs_federation_are_those_the_bridges_run_under():
    page = (ROOT / "docs" / "federation.md").read_text()
    block = page.split("authorization {", 1)[1].split("```", 1)[0]
    publish, subscribe = block.split("publish: { allow: [")[1].split("subscribe: { allow: [")
    assert re.findall(r'"([^"]+)"', publish) == names.permissions("a")["publish"]["allow"]
    assert re.findall(r'"([^"]+)"', subscribe) == names.permissions("a")["subscribe"]["allow"]
