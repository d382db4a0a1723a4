"""The shared protocol vectors (clients/vectors.json), run from Python against a real broker.

The same file is run by the Node client's tests and the C client's tests
(tests/test_clients_node.py, tests/test_clients_c.py); its `format` key says how.
This runner speaks raw ZeroMQ + msgpack, not the SDK, so it checks the protocol as
the document states it; the SDK only turns error replies into its typed errors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgpack
import zmq

from sdk.errors import ERROR_CLASSES, from_code
from tests.harness import Broker

ROOT = Path(__file__).resolve().parent.parent
VECTORS = json.loads((ROOT / "clients" / "vectors.json").read_text())
DOC = (ROOT / "docs" / "protocol.md").read_text()
TYPES = {"$str", "$int", "$num", "$bool", "$map", "$list", "$nil", "$any"}


def frames_of(vector: dict[str, Any]) -> list[bytes]:
    if "request" in vector:
        return [b"RLY1", msgpack.packb(vector["request"], use_bin_type=True)]
    out = []
    for frame in vector["frames"]:
        ((kind, value),) = frame.items()
        if kind == "text":
            out.append(value.encode())
        elif kind == "hex":
            out.append(bytes.fromhex(value))
        elif kind == "msgpack":
            out.append(msgpack.packb(value, use_bin_type=True))
        else:
            raise AssertionError(f"unknown frame kind {kind!r}")
    return out


def mismatch(expected: Any, actual: Any, path: str = "reply") -> str | None:
    """None when actual has the shape expected describes, else where it differs."""
    if isinstance(expected, str) and expected.startswith("$"):
        assert expected in TYPES, f"unknown type {expected} at {path}"
        ok = {
            "$str": isinstance(actual, str),
            "$int": isinstance(actual, int) and not isinstance(actual, bool),
            "$num": isinstance(actual, int | float) and not isinstance(actual, bool),
            "$bool": isinstance(actual, bool),
            "$map": isinstance(actual, dict),
            "$list": isinstance(actual, list),
            "$nil": actual is None,
            "$any": True,
        }[expected]
        return None if ok else f"{path}: expected {expected}, got {actual!r:.80}"
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path}: expected a map, got {actual!r:.80}"
        for key, value in expected.items():
            if key not in actual:
                return f"{path}: key {key!r} missing from {actual!r:.200}"
            problem = mismatch(value, actual[key], f"{path}.{key}")
            if problem:
                return problem
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{path}: expected a list of {len(expected)}, got {actual!r:.200}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            problem = mismatch(e, a, f"{path}[{i}]")
            if problem:
                return problem
        return None
    numbers = all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in (expected, actual)
    )
    if (numbers or type(expected) is type(actual)) and expected == actual:
        return None
    return f"{path}: expected {expected!r}, got {actual!r:.80}"


def read_reply(sock: zmq.Socket, timeout_ms: int = 15_000) -> dict[str, Any]:
    """The next reply on the socket; pushes (messages for a subscription) are skipped."""
    while True:
        if not sock.poll(timeout_ms):
            raise AssertionError(f"no reply within {timeout_ms} ms")
        frames = sock.recv_multipart()
        assert frames[0] == b"RLY1", frames
        body = msgpack.unpackb(frames[1], raw=False)
        if "push" in body:
            assert len(frames) == 3, frames
            continue
        assert len(frames) == 2, frames
        return body


def test_the_vectors_pass_against_a_real_broker(broker: Broker):
    sock = broker.raw_dealer(timeout_ms=-1)  # read_reply bounds its own waits
    failures = []
    try:
        for vector in VECTORS["vectors"]:
            sock.send_multipart(frames_of(vector))
            reply = read_reply(sock)
            problem = mismatch(vector["reply"], reply)
            if problem is None and not vector["reply"]["ok"]:
                error = from_code(reply["error"]["code"], reply["error"]["message"])
                if error.code != vector["reply"]["error"]["code"]:
                    problem = f"typed error has code {error.code}"
            if problem:
                failures.append(f"{vector['name']}: {problem}")
    finally:
        sock.close(0)
    assert not failures, "\n".join(failures)


def test_the_vectors_are_well_formed():
    names = [v["name"] for v in VECTORS["vectors"]]
    assert len(names) == len(set(names)), "vector names must be unique"
    for vector in VECTORS["vectors"]:
        assert ("request" in vector) != ("frames" in vector), vector["name"]
        assert set(vector) <= {"name", "request", "frames", "reply"}, vector["name"]
        frames_of(vector)
        reply = vector["reply"]
        assert isinstance(reply["ok"], bool) and isinstance(reply["rid"], int), vector["name"]
        if not reply["ok"]:
            assert reply["error"]["code"] in ERROR_CLASSES, vector["name"]


def test_every_error_code_a_request_can_cause_has_a_vector():
    table = re.search(r"\| code \| when \|\n\|---\|---\|\n(.*?)\n\n", DOC, re.S).group(1)
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    covered = {v["reply"]["error"]["code"] for v in VECTORS["vectors"] if not v["reply"]["ok"]}
    not_covered = set(VECTORS["not_covered"])
    assert not covered & not_covered
    assert covered | not_covered == documented, (
        f"no vector for {sorted(documented - covered - not_covered)}; "
        f"not in the document: {sorted((covered | not_covered) - documented)}"
    )
