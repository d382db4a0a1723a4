"""The Node.js client (clients/node) against a real broker, with a Python SDK peer.

Runs the client's own node:test suites (unit, the shared vectors, the client against
the broker) and then exchanges messages and signals between Node and Python both ways.
Needs `node` and `npm ci` in clients/node: `make clients` (which `make test` runs) does
both; without them these tests fail, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sdk.subjects import endpoint_hash
from sdk.types import Envelope, Signal, SignalType
from tests.harness import Broker, signals_flowing, wait_for

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "clients" / "node"
SETUP_HINT = "run `make clients` (it runs `npm ci` in clients/node)"


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail(f"node is not installed; the Node client needs Node.js >= 18: {SETUP_HINT}")
    for package in ("zeromq", "@msgpack/msgpack"):
        if not (NODE_DIR / "node_modules" / package / "package.json").exists():
            pytest.fail(f"clients/node/node_modules/{package} is missing: {SETUP_HINT}")
    return path


def node_env(broker: Broker | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    if broker is not None:
        env["RELAY_TEST_HOME"] = str(broker.home.root)
    return env


def run_node_tests(broker: Broker | None, test_file: str, timeout: float = 240) -> None:
    proc = subprocess.run(
        [node(), "--test", "--test-reporter=spec", f"test/{test_file}"],
        cwd=NODE_DIR,
        env=node_env(broker),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"node --test test/{test_file} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )


class Peer:
    """`node test/peer.js ...` running beside the test, its JSON lines read as they come."""

    def __init__(self, broker: Broker, *args: str) -> None:
        self.proc = subprocess.Popen(
            [node(), "test/peer.js", *args],
            cwd=NODE_DIR,
            env=node_env(broker),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def next(self, timeout: float = 15) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"node peer said nothing for {timeout} s") from None
        if line is None:
            raise AssertionError(f"node peer ended: {self.finish()}")
        assert "error" not in line, line
        return line

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 15) -> str:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        return f"exit {self.proc.returncode}; stderr: {stderr}"


def test_node_unit_tests():
    run_node_tests(None, "unit.test.js")


def test_node_runs_the_shared_vectors(broker: Broker):
    run_node_tests(broker, "vectors.test.js")


def test_node_client_against_the_broker(broker: Broker):
    run_node_tests(broker, "client.test.js")


def test_node_publishes_python_consumes_and_acks(broker: Broker):
    python = broker.client()
    python.register_endpoint("relay.interop.python")
    got: list[Envelope] = []
    python.subscribe("relay.interop.python", got.append)

    peer = Peer(
        broker,
        "publish",
        "relay.interop.python",
        "relay.interop.node",
        json.dumps({"content": "from node", "n": [1, 2.5, None, True], "ü": "ü"}),
        "--receipt",
    )
    result = peer.next()["result"]
    assert result["deliveredTo"] == 1 and result["rejected"] == []
    wait_for(lambda: got, what="the Python subscriber to get the message")
    envelope = got[0]
    assert envelope.id == result["messageId"]
    assert envelope.sender == "relay.interop.node"
    assert envelope.reply_to == "relay.interop.node"
    assert envelope.payload == {"content": "from node", "n": [1, 2.5, None, True], "ü": "ü"}
    # The Python subscriber acked it: done, and the Node publisher got the receipt signal.
    wait_for(lambda: python.trace(envelope.id)["copies"][0]["state"] == "done", what="state done")
    receipt = peer.next()["receipt"]
    assert receipt["type"] == "delivery_receipt", receipt
    assert receipt["data"]["messageId"] == envelope.id
    assert receipt["endpointSubject"] == "relay.interop.python"
    peer.finish()
    assert peer.proc.returncode == 0


def test_python_publishes_node_consumes_acks_and_nacks(broker: Broker):
    python = broker.client()
    info = python.register_endpoint("relay.interop.node")
    receipts: list[Signal] = []
    python.on_signal(
        "relay.interop.python",
        lambda _, signal: signal.type is SignalType.DELIVERY_RECEIPT and receipts.append(signal),
    )
    signals_flowing(python, "relay.interop.python")
    # One message waits before Node subscribes (the backlog), two come after.
    first = python.publish("relay.interop.node", {"n": 1}, sender="relay.interop.python")
    peer = Peer(broker, "consume", "relay.interop.*", "3")
    assert peer.next()["ready"]
    second = python.publish(
        "relay.interop.node", {"n": 2, "nack": True}, sender="relay.interop.python"
    )
    third = python.publish("relay.interop.node", {"n": 3}, sender="relay.interop.python")

    seen = [peer.next() for _ in range(3)]
    assert [m["id"] for m in seen] == [first.message_id, second.message_id, third.message_id]
    assert [m["envelope"]["payload"]["n"] for m in seen] == [1, 2, 3]
    assert all(m["endpoint"] == info.hash == endpoint_hash("relay.interop.node") for m in seen)
    assert seen[0]["envelope"]["from"] == "relay.interop.python"
    assert [m["settled"]["state"] for m in seen] == ["done", "failed", "done"]
    peer.finish()
    assert peer.proc.returncode == 0

    states = [python.trace(m["id"])["copies"][0]["state"] for m in seen]
    assert states == ["done", "failed", "done"]
    [letter] = python.dead_letters(info.hash)
    assert letter["id"] == second.message_id
    assert (letter["code"], letter["reason"]) == ("nack", "asked to nack")
    wait_for(lambda: len(receipts) == 2, what="two delivery receipts for the Python sender")
    assert sorted(s.data["messageId"] for s in receipts) == sorted(
        [first.message_id, third.message_id]
    )


def test_node_requests_and_a_python_consumer_replies(broker: Broker):
    """The Node client's request() and the Python SDK agree on the reply-inbox
    convention: replyTo `_INBOX.<sender>.<nonce>`, the reply matched by parentId."""
    python = broker.client()
    python.register_endpoint("relay.interop.python")
    asked: list[Envelope] = []

    def answer(envelope: Envelope) -> None:
        asked.append(envelope)
        python.reply(envelope, {"answer": 42}, sender="relay.interop.python")

    python.subscribe("relay.interop.python", answer)
    peer = Peer(broker, "request", "relay.interop.python", "relay.interop.node", '{"q": 1}')
    reply = peer.next()["reply"]
    assert reply["payload"] == {"answer": 42}
    assert reply["parentId"] == asked[0].id
    assert asked[0].reply_to.startswith("_INBOX.relay.interop.node.")
    peer.finish()
    assert peer.proc.returncode == 0


def test_python_requests_and_a_node_consumer_replies(broker: Broker):
    python = broker.client()
    python.register_endpoint("relay.interop.node")
    peer = Peer(broker, "replier", "relay.interop.node", "1")
    assert peer.next()["ready"]
    reply = python.request("relay.interop.node", "ping", sender="relay.interop.python", timeout=15)
    handled = peer.next()
    assert reply.payload == {"echo": "ping"}
    assert reply.parent_id == handled["id"]
    assert handled["deliveries"] == 1
    peer.finish()
    assert peer.proc.returncode == 0


def test_signals_from_python_to_node(broker: Broker):
    python = broker.client()
    peer = Peer(broker, "signals", "relay.interop.sig.*", "1")
    assert peer.next()["ready"]
    signal = Signal(
        SignalType.PROGRESS, "50%", "relay.interop.sig.node", int(time.time() * 1000), {"step": 5}
    )
    received: list[dict[str, Any]] = []

    def seen() -> bool:
        python.signal("relay.interop.sig.node", signal)  # again until the SUB has joined
        with contextlib.suppress(queue.Empty):
            line = peer.lines.get(timeout=0.2)
            assert line is not None and "error" not in line, line  # a crash fails at once
            received.append(line)
        return bool(received)

    wait_for(seen, 15, what="the Node peer to see a signal")
    assert received[0]["subject"] == "relay.interop.sig.node"
    assert received[0]["signal"] == signal.to_wire()
    peer.finish()
    assert peer.proc.returncode == 0


def test_signals_from_node_to_python(broker: Broker):
    python = broker.client()
    got: list[tuple[str, Signal]] = []
    python.on_signal("relay.interop.>", lambda subject, signal: got.append((subject, signal)))
    peer = Peer(broker, "signal", "relay.interop.python.inbox", "typing", "active", "30")
    wait_for(lambda: got, timeout=15, what="a signal from Node")
    subject, signal = got[0]
    assert subject == "relay.interop.python.inbox"
    assert signal.type is SignalType.TYPING
    assert signal.state == "active"
    assert signal.endpoint_subject == "relay.interop.python.inbox"
    assert isinstance(signal.data["n"], int)
    assert peer.next()["sent"] == 30
    peer.finish()


def test_a_node_consumer_keeps_consuming_across_a_router_restart(broker: Broker):
    broker.client().register_endpoint("relay.interop.restart")
    peer = Peer(broker, "consume", "relay.interop.restart", "2")
    assert peer.next()["ready"]
    first = broker.client().publish("relay.interop.restart", 1, sender="relay.interop.python")
    assert peer.next()["id"] == first.message_id
    broker.kill("router", signal.SIGTERM)
    broker.start_router()
    broker.wait_ready()
    # The router lost the subscription; the Node client's next ping shows it, and it
    # subscribes again.
    second = broker.client().publish("relay.interop.restart", 2, sender="relay.interop.python")
    line = peer.next(timeout=20)
    assert line["id"] == second.message_id
    assert line["settled"] == {"state": "done"}
    peer.finish()
    assert peer.proc.returncode == 0


def test_a_node_client_keeps_what_it_holds_when_the_router_restarts(broker: Broker):
    python = broker.client()
    python.register_endpoint("relay.interop.held")
    python.set_config({"delivery": {"sessionTimeoutMs": 1000}})
    first = python.publish("relay.interop.held", 1, sender="relay.interop.python")
    peer = Peer(broker, "hold", "relay.interop.held")
    assert peer.next() == {"id": first.message_id, "deliveries": 1}
    for name in ("router", "writer0", "writer1"):
        broker.kill(name)
    broker.start_router()  # alone: no writer has said which claims cur/ holds

    def claimed() -> int:
        with contextlib.suppress(Exception):
            endpoints = broker.client().status()["endpoints"]
            return next(e for e in endpoints if e["subject"] == "relay.interop.held")["claimed"]
        return 0

    # Only the Node client's hello, naming its session and what it holds, says so.
    wait_for(claimed, 20, what="the Node client to say it holds the message")
    for shard in range(broker.shards):
        broker.start_writer(shard)
    broker.wait_ready()
    assert python.fetch("relay.interop.held", wait=2.5) == []  # past the session timeout
    peer.say("ack")
    assert peer.next() == {"settled": {"state": "done"}}
    assert python.trace(first.message_id)["copies"][0]["state"] == "done"
    peer.finish()
    assert peer.proc.returncode == 0


def node_script(script: str, *args: str) -> Any:
    """`node -e SCRIPT ARGS...` in clients/node, no broker variables: the JSON of its last
    line of output."""
    proc = subprocess.run(
        [node(), "-e", script, *args],
        cwd=NODE_DIR,
        env=node_env(None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode}):\n{proc.stderr}"
    return json.loads(lines[-1])


ACTING_SCRIPT = """
const relay = require(".");
(async () => {
  const client = await relay.connect({ home: process.argv[1], actingFor: process.argv[2] });
  const codeOf = (promise) => promise.then(() => null, (err) => err.code);
  const own = await client.publish("relay.agent.a.x", 1, { from: "relay.agent.a.x" });
  const other = await codeOf(client.publish("relay.agent.a.x", 2, { from: "relay.agent.b.x" }));
  const config = await codeOf(client.setConfig({ rateLimit: {} }));
  console.log(JSON.stringify({ delivered: own.deliveredTo, other, config }));
  await client.close();
})().catch((err) => { console.log(JSON.stringify({ error: err.code, message: err.message })); });
"""


def test_a_node_client_acting_for_a_token_identity_has_its_rights_only(broker: Broker):
    """`connect({actingFor})`: every request names the identity (docs/protocol.md,
    "Acting for an identity"); the router judges them by its rights, not the owner's."""
    made = broker.relay("auth", "add-token", "agent-a", "--sender", "relay.agent.a.>")
    assert made.returncode == 0, made.stderr
    keys = json.loads(broker.home.auth_file.read_text())["keys"]
    (key,) = [k for k, entry in keys.items() if entry["name"] == "agent-a"]
    broker.client().register_endpoint("relay.agent.a.x")
    assert node_script(ACTING_SCRIPT, str(broker.home.root), f"key:{key}") == {
        "delivered": 1,
        "other": "sender_not_allowed",
        "config": "not_authorized",
    }


CURVE_SCRIPT = """
const relay = require(".");
(async () => {
  const client = await relay.connect({
    address: process.argv[1], keyFile: process.argv[2], serverKey: process.argv[3], timeout: 5000,
  });
  await client.register("relay.agent.nodekey.inbox");
  const me = { from: "relay.agent.nodekey.me" };
  const ok = await client.publish("relay.agent.nodekey.inbox", { n: 1 }, me);
  let refused = null;
  try {
    await client.publish("relay.agent.nodekey.inbox", { n: 2 }, { from: "relay.agent.other" });
  } catch (err) {
    refused = err.code;
  }
  console.log(JSON.stringify({ delivered: ok.deliveredTo, refused }));
  await client.close();
})().catch((err) => { console.log(JSON.stringify({ error: err.code, message: err.message })); });
"""


def test_node_client_talks_curve_to_a_tcp_broker():
    with Broker.on_tcp([("nodekey", ["relay.agent.nodekey.>"], False)]) as broker:
        keys = broker.home.keys
        address = broker.client_options["address"]
        secret, server = str(keys / "nodekey.key_secret"), str(keys / "server.key")
        assert node_script(CURVE_SCRIPT, address, secret, server) == {
            "delivered": 1,
            "refused": "sender_not_allowed",
        }
