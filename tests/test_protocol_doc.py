"""Every example in docs/protocol.md decodes with the real codec, so the document cannot rot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from broker.router.requests import Publish
from sdk import wire
from sdk.errors import ERROR_CLASSES
from sdk.types import Envelope, PublishResult

DOC = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
BLOCKS = re.findall(r"```(request|reply|push|json)\n(.*?)```", DOC, re.S)


def examples(kind: str) -> list[dict]:
    return [json.loads(body) for k, body in BLOCKS if k == kind]


def test_the_document_has_examples_of_every_kind():
    assert examples("request") and examples("reply") and examples("push")


@pytest.mark.parametrize("example", examples("request"), ids=lambda e: f"{e['op']}-{e['rid']}")
def test_request_example_decodes(example):
    request = wire.decode_request([wire.MAGIC, wire.packb(example)])
    assert request.rid == example["rid"]
    if example["op"] != "teleport":  # the document's example of an unknown operation
        assert request.op in wire.OPERATIONS


def test_every_operation_is_documented_with_a_heading_and_an_example():
    documented = {e["op"] for e in examples("request")}
    assert documented >= wire.OPERATIONS
    for op in wire.OPERATIONS:
        assert re.search(rf"^### .*\b{op}\b", DOC, re.M), f"no section for {op}"


@pytest.mark.parametrize("example", examples("reply"), ids=lambda e: f"rid-{e['rid']}")
def test_reply_example_decodes(example):
    reply = wire.decode_incoming([wire.MAGIC, wire.packb(example)])
    assert isinstance(reply, wire.Reply)
    assert reply.ok == example["ok"]
    if not reply.ok:
        assert reply.error.code == example["error"]["code"]
    elif "messageId" in (example.get("result") or {}):
        PublishResult.from_wire(example["result"])


def test_push_example_decodes():
    for example in examples("push"):
        push = wire.decode_incoming([wire.MAGIC, wire.packb(example), b"{}"])
        assert isinstance(push, wire.Push) and push.sub == example["sub"]


def test_the_envelope_examples_decode_and_one_is_a_reply_naming_its_parent():
    envelopes = [Envelope.from_wire(e) for e in examples("json")]
    assert envelopes and any(e.parent_id is not None for e in envelopes)
    for example in examples("request"):
        if example["op"] == "publish" and "parentId" in example:
            assert Publish.decode(example).parent_id == example["parentId"]
            break
    else:
        raise AssertionError("no publish example names a parentId")


def test_every_error_code_in_the_table_exists_in_the_taxonomy():
    table = re.search(r"\| code \| when \|\n\|---\|---\|\n(.*?)\n\n", DOC, re.S).group(1)
    codes = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert set(codes) <= set(ERROR_CLASSES)
    server_codes = set(ERROR_CLASSES) - {"timeout", "not_found"}
    assert server_codes <= set(codes), f"undocumented: {server_codes - set(codes)}"
