"""The C client (clients/c) against a real broker, with a Python SDK peer.

Builds the client (`make -C clients/c`, a no-op when up to date), runs its own test
programs (unit, the shared vectors, the client against the broker), then publishes
and consumes between C and Python both ways through the relay-cli example. Needs a C
compiler, libzmq, msgpack-c and jansson: `make clients` (which `make test` runs)
installs them; without them these tests fail, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from sdk.errors import RelayError
from sdk.subjects import endpoint_hash
from sdk.types import Envelope, Signal, SignalType
from tests.harness import Broker, signals_flowing, wait_for

ROOT = Path(__file__).resolve().parent.parent
C_DIR = ROOT / "clients" / "c"
BUILD = C_DIR / "build"
VECTORS = ROOT / "clients" / "vectors.json"
SETUP_HINT = "run `make clients` (it installs libzmq3-dev, the msgpack-c and jansson -dev packages)"


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    for tool in ("make", "cc", "pkg-config"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed; the C client needs it: {SETUP_HINT}")
    proc = subprocess.run(["make", "-C", str(C_DIR)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"building clients/c failed ({SETUP_HINT}):\n{proc.stdout}\n{proc.stderr}")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BUILD / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout
    )


def cli(broker: Broker, *args: str) -> subprocess.CompletedProcess:
    return run("relay-cli", "--home", str(broker.home.root), *args)


def c_consumer(broker: Broker, pattern: str, *options: str) -> subprocess.Popen:
    """`relay-cli consume` running beside the test, once it says it is subscribed."""
    command = [str(BUILD / "relay-cli"), "--home", str(broker.home.root), "consume", pattern]
    consumer = subprocess.Popen(
        [*command, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert consumer.stdout is not None
        assert json.loads(consumer.stdout.readline())["ready"] is True
    except BaseException:
        consumer.kill()
        consumer.wait()
        raise
    return consumer


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_c_unit_tests():
    assert "0 failed" in check(run("test_client")).stdout


def test_c_client_against_the_broker(broker: Broker):
    assert "0 failed" in check(run("test_client", broker.home.router_address)).stdout


def test_c_runs_the_shared_vectors(broker: Broker):
    proc = check(run("test_vectors", str(VECTORS), broker.home.router_address))
    count = len(json.loads(VECTORS.read_text())["vectors"])
    assert f"{count} passed, 0 failed" in proc.stdout


def test_c_publishes_python_consumes_and_acks(broker: Broker):
    python = broker.client()
    python.register_endpoint("relay.interop.python")
    got: list[Envelope] = []
    python.subscribe("relay.interop.python", got.append)
    receipts: list[Signal] = []
    python.on_signal(
        "relay.interop.c",
        lambda _, signal: signal.type is SignalType.DELIVERY_RECEIPT and receipts.append(signal),
    )
    signals_flowing(python, "relay.interop.c")

    out = check(
        cli(broker, "publish", "relay.interop.python", "from C: ü", "--from", "relay.interop.c")
    )
    result = json.loads(out.stdout)
    assert result["deliveredTo"] == 1 and result["rejected"] == 0
    wait_for(lambda: got, what="the Python subscriber to get the message")
    assert got[0].id == result["messageId"]
    assert got[0].sender == "relay.interop.c"
    assert got[0].payload == {"content": "from C: ü"}
    wait_for(lambda: python.trace(got[0].id)["copies"][0]["state"] == "done", what="done")
    # The ack's delivery receipt is published on the C sender's subject.
    wait_for(lambda: receipts, what="a delivery receipt")
    assert receipts[0].data["messageId"] == got[0].id


def test_python_publishes_c_consumes_acks_and_nacks(broker: Broker):
    python = broker.client()
    info = python.register_endpoint("relay.interop.c")
    sent = [python.publish("relay.interop.c", {"n": 1}, sender="relay.interop.python")]
    consumer = c_consumer(
        broker, "relay.interop.*", "--count", "3", "--wait", "15000", "--nack-if", "please nack"
    )
    try:
        sent.append(
            python.publish(
                "relay.interop.c", {"text": "please nack"}, sender="relay.interop.python"
            )
        )
        sent.append(python.publish("relay.interop.c", {"n": 3}, sender="relay.interop.python"))
        out, err = consumer.communicate(timeout=30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    assert consumer.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [m["id"] for m in lines] == [r.message_id for r in sent]
    assert [m["settled"] for m in lines] == ["ack", "nack", "ack"]
    assert all(m["endpoint"] == info.hash == endpoint_hash("relay.interop.c") for m in lines)
    assert lines[0]["envelope"]["payload"] == {"n": 1}
    assert lines[0]["envelope"]["from"] == "relay.interop.python"
    states = [python.trace(r.message_id)["copies"][0]["state"] for r in sent]
    assert states == ["done", "failed", "done"]
    [letter] = python.dead_letters(info.hash)
    assert (letter["id"], letter["code"], letter["reason"]) == (
        sent[1].message_id,
        "nack",
        "nack-if matched",
    )


def test_c_cli_register_and_typed_errors(broker: Broker):
    assert json.loads(check(cli(broker, "register", "relay.interop.cli")).stdout) == {
        "registered": "relay.interop.cli"
    }
    assert any(e.subject == "relay.interop.cli" for e in broker.client().list_endpoints())
    bad = cli(broker, "register", "relay..cli")
    assert bad.returncode == 1
    assert bad.stderr.startswith("relay-cli: invalid_subject: invalid subject 'relay..cli'")
    with pytest.raises(RelayError):  # the Python SDK agrees
        broker.client().register_endpoint("relay..cli")


def test_c_cli_without_a_broker_fails_clearly(tmp_path: Path):
    proc = run(
        "relay-cli",
        "--home",
        str(tmp_path),
        "--timeout",
        "300",
        "publish",
        "a.b",
        "x",
        "--from",
        "c.d",
    )
    assert proc.returncode == 1
    assert proc.stderr == (
        f"relay-cli: unavailable: broker unavailable at ipc://{tmp_path}/run/router.sock: "
        "no answer within 0.3 s (is `relay up` running for this home?)\n"
    )  # it names the deadline that fired: no stopwatch


def test_a_c_consumer_keeps_consuming_across_a_router_restart(broker: Broker):
    broker.client().register_endpoint("relay.interop.restart")
    consumer = c_consumer(broker, "relay.interop.restart", "--count", "2", "--wait", "20000")
    try:
        first = broker.client().publish("relay.interop.restart", 1, sender="relay.interop.python")
        assert json.loads(consumer.stdout.readline())["id"] == first.message_id
        broker.kill("router", signal.SIGTERM)
        broker.start_router()
        broker.wait_ready()
        # The router lost the subscription; relay_next's ping shows it and it subscribes again.
        second = broker.client().publish("relay.interop.restart", 2, sender="relay.interop.python")
        out, err = consumer.communicate(timeout=30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    assert consumer.returncode == 0, err
    [line] = [json.loads(text) for text in out.splitlines()]
    assert (line["id"], line["settled"]) == (second.message_id, "ack")


def test_c_cli_talks_curve_to_a_tcp_broker():
    with Broker.on_tcp([("ckey", ["relay.interop.>"], False)]) as broker:
        address, keys = broker.client_options["address"], broker.home.keys
        env = {
            **os.environ,
            "RELAY_KEY_FILE": str(keys / "ckey.key_secret"),
            "RELAY_SERVER_KEY": str(keys / "server.key"),
        }

        def register(subject: str) -> subprocess.CompletedProcess:
            command = [str(BUILD / "relay-cli"), "--address", address, "register", subject]
            return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

        assert json.loads(check(register("relay.interop.curve")).stdout) == {
            "registered": "relay.interop.curve"
        }
        env["RELAY_KEY_FILE"] = "/nonexistent.key_secret"
        bad = register("relay.interop.x")
        assert bad.returncode == 1 and "invalid_message: cannot read a CURVE key pair" in bad.stderr
