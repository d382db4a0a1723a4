"""sdk.types: wire round trips, validation that names the field, the message file format."""

from __future__ import annotations

import copy
import json
from types import MappingProxyType
from typing import Any

import pytest

from sdk import wire
from sdk.errors import InvalidMessage, InvalidSubject, MalformedFrame
from sdk.fields import loads_json
from sdk.ids import new_id
from sdk.types import (
    DEFAULT_CALL_BUDGET,
    DEFAULT_MAX_HOPS,
    DEFAULT_TTL_MS,
    AccessRule,
    Budget,
    DeadLetterInfo,
    EndpointInfo,
    Envelope,
    PublishResult,
    RuleAction,
    Signal,
    SignalType,
    StandardPayload,
    dead_letter_json,
    default_budget,
    parse_message_file,
)

NOW = 1_764_108_000_123
MSG_ID = new_id(NOW)


def make_budget(**changes: Any) -> Budget:
    fields = {
        "hop_count": 1,
        "max_hops": 5,
        "ancestor_chain": ("relay.agent.p.backend",),
        "ttl": NOW + 3_600_000,
        "call_budget_remaining": 9,
    }
    return Budget(**{**fields, **changes})


def make_envelope(**changes: Any) -> Envelope:
    fields = {
        "id": MSG_ID,
        "subject": "relay.agent.p.backend",
        "sender": "relay.agent.p.frontend",
        "reply_to": "relay.agent.p.frontend",
        "budget": make_budget(),
        "created_at": NOW,
        "payload": {"content": "hello", "n": [1, 2.5, None, True]},
    }
    return Envelope(**{**fields, **changes})


def envelope_wire() -> dict[str, Any]:
    return make_envelope().to_wire()


# --- round trips ---------------------------------------------------------------------------

ROUND_TRIPS = {
    "budget": make_budget(),
    "budget-empty-chain": make_budget(hop_count=0, ancestor_chain=()),
    "envelope": make_envelope(),
    "envelope-no-reply": make_envelope(reply_to=None),
    "envelope-published-to": make_envelope(published_to="relay.agent.*.backend"),
    "envelope-null-payload": make_envelope(payload=None),
    "envelope-parent-id": make_envelope(parent_id=new_id(NOW - 1)),
    "dead-letter-info": DeadLetterInfo("max hops exceeded (5/5)", "hop_limit", NOW, "abcdef012345"),
    "dead-letter-info-deliveries": DeadLetterInfo("x", "max_deliveries", NOW, "abcdef012345", 5),
    "signal": Signal(SignalType.TYPING, "start", "relay.agent.p.backend", NOW),
    "signal-data": Signal(
        SignalType.BACKPRESSURE,
        "warning",
        "relay.agent.p.backend",
        NOW,
        {"pressure": 0.8, "currentSize": 800, "maxMailboxSize": 1000},
    ),
    "rule": AccessRule("relay.agent.>", "relay.agent.*.secret", RuleAction.DENY, 10),
    "rule-default-priority": AccessRule(">", ">", RuleAction.ALLOW),
    "payload-minimal": StandardPayload("hi"),
    "payload-full": StandardPayload(
        content="hi",
        sender_name="Backend",
        channel="general",
        attachments=("/tmp/a.txt", "/tmp/b.png"),
        performative="request",
        conversation_id="conv-1",
        correlation_id="corr-1",
        platform_data={"slack": {"ts": "1.2"}},
    ),
    "endpoint": EndpointInfo(
        "relay.agent.p.backend", "2e7336dc8eba", "/home/x/mb/2e7336dc8eba", NOW
    ),
    "publish-result": PublishResult(
        MSG_ID, 2, (("abcdef012345", "backpressure"),), {"abcdef012345": 1.0, "0123456789ab": 0.25}
    ),
    "publish-result-defaults": PublishResult(MSG_ID, 0),
}


@pytest.mark.parametrize("value", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_from_wire_of_to_wire_gives_the_same_value(value: Any) -> None:
    wire = value.to_wire()
    assert type(value).from_wire(wire) == value


@pytest.mark.parametrize("value", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_wire_form_survives_json(value: Any) -> None:
    wire = json.loads(json.dumps(value.to_wire()))
    assert type(value).from_wire(wire) == value


def test_envelope_wire_keys_are_camel_case_and_from_is_the_sender() -> None:
    wire = make_envelope().to_wire()
    assert set(wire) == {"id", "subject", "from", "replyTo", "budget", "createdAt", "payload"}
    assert wire["from"] == "relay.agent.p.frontend"
    assert wire["budget"] == {
        "hopCount": 1,
        "maxHops": 5,
        "ancestorChain": ["relay.agent.p.backend"],
        "ttl": NOW + 3_600_000,
        "callBudgetRemaining": 9,
    }


def test_envelope_includes_published_to_only_when_set() -> None:
    assert "publishedTo" not in make_envelope().to_wire()
    wire = make_envelope(published_to="relay.>").to_wire()
    assert wire["publishedTo"] == "relay.>"


def test_envelope_includes_parent_id_only_when_set() -> None:
    assert "parentId" not in make_envelope().to_wire()
    parent = new_id(NOW - 1)
    wire = make_envelope(parent_id=parent).to_wire()
    assert wire["parentId"] == parent
    assert Envelope.from_json(make_envelope(parent_id=parent).to_json()).parent_id == parent


def test_envelope_parent_id_must_be_a_message_id() -> None:
    with pytest.raises(InvalidMessage, match="parentId must be a 26-character ULID"):
        Envelope.from_wire({**envelope_wire(), "parentId": "not-an-id"})


def test_dead_letter_info_writes_deliveries_only_when_handed_out() -> None:
    assert "deliveries" not in DeadLetterInfo("r", "nack", NOW, "abcdef012345").to_wire()
    wire = DeadLetterInfo("r", "max_deliveries", NOW, "abcdef012345", 5).to_wire()
    assert wire["deliveries"] == 5


def test_envelope_accepts_missing_reply_to_as_none() -> None:
    wire = envelope_wire()
    del wire["replyTo"]
    assert Envelope.from_wire(wire).reply_to is None


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    wire = envelope_wire()
    wire["futureField"] = 1
    assert Envelope.from_wire(wire) == make_envelope()


def test_other_wire_key_sets() -> None:
    assert set(ROUND_TRIPS["signal-data"].to_wire()) == {
        "type",
        "state",
        "endpointSubject",
        "timestamp",
        "data",
    }
    assert ROUND_TRIPS["rule"].to_wire() == {
        "from": "relay.agent.>",
        "to": "relay.agent.*.secret",
        "action": "deny",
        "priority": 10,
    }
    assert set(ROUND_TRIPS["payload-full"].to_wire()) == {
        "content",
        "senderName",
        "channel",
        "attachments",
        "performative",
        "conversationId",
        "correlationId",
        "platformData",
    }
    assert StandardPayload("hi").to_wire() == {"content": "hi"}
    assert set(ROUND_TRIPS["endpoint"].to_wire()) == {
        "subject",
        "hash",
        "maildirPath",
        "registeredAt",
        "shared",
    }
    assert ROUND_TRIPS["publish-result"].to_wire() == {
        "messageId": MSG_ID,
        "deliveredTo": 2,
        "rejected": [["abcdef012345", "backpressure"]],
        "mailboxPressure": {"abcdef012345": 1.0, "0123456789ab": 0.25},
        "details": {},
    }


def test_enums_are_plain_strings_on_the_wire() -> None:
    assert type(ROUND_TRIPS["signal"].to_wire()["type"]) is str
    assert type(ROUND_TRIPS["rule"].to_wire()["action"]) is str
    assert Signal.from_wire(ROUND_TRIPS["signal"].to_wire()).type is SignalType.TYPING


def test_publish_result_is_immutable_and_hashable() -> None:
    result = PublishResult(MSG_ID, 1, [["abcdef012345", "circuit_open"]], {"abcdef012345": 0.5})
    assert result.rejected == (("abcdef012345", "circuit_open"),)
    assert isinstance(result.mailbox_pressure, MappingProxyType)
    with pytest.raises(TypeError):
        result.mailbox_pressure["x"] = 1.0  # type: ignore[index]
    hash(result)
    assert PublishResult(MSG_ID, 0).mailbox_pressure == {}


def test_publish_result_pressure_ints_become_floats() -> None:
    wire = {"messageId": MSG_ID, "deliveredTo": 1, "rejected": [], "mailboxPressure": {"h": 1}}
    result = PublishResult.from_wire(wire)
    assert result.mailbox_pressure == {"h": 1.0}
    assert type(result.mailbox_pressure["h"]) is float


# --- validation: every error names the field --------------------------------------------------


def _without(d: dict[str, Any], *path: str) -> dict[str, Any]:
    d = copy.deepcopy(d)
    target = d
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return d


def _with(d: dict[str, Any], value: Any, *path: str) -> dict[str, Any]:
    d = copy.deepcopy(d)
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return d


ENVELOPE = envelope_wire()
SIGNAL = ROUND_TRIPS["signal"].to_wire()
RULE = ROUND_TRIPS["rule"].to_wire()
PAYLOAD = ROUND_TRIPS["payload-full"].to_wire()
ENDPOINT = ROUND_TRIPS["endpoint"].to_wire()
RESULT = ROUND_TRIPS["publish-result"].to_wire()
DEAD = ROUND_TRIPS["dead-letter-info"].to_wire()

# (type, wire dict, expected message fragment)
INVALID_MESSAGES = {
    "envelope-missing-id": (Envelope, _without(ENVELOPE, "id"), "id is missing"),
    "envelope-bad-id": (Envelope, _with(ENVELOPE, "nope", "id"), "id must be a 26-character ULID"),
    "envelope-int-subject": (Envelope, _with(ENVELOPE, 7, "subject"), "subject must be a string"),
    "envelope-missing-from": (Envelope, _without(ENVELOPE, "from"), "from is missing"),
    "envelope-missing-budget": (Envelope, _without(ENVELOPE, "budget"), "budget is missing"),
    "envelope-budget-not-object": (
        Envelope,
        _with(ENVELOPE, [], "budget"),
        "budget must be an object",
    ),
    "envelope-missing-payload": (Envelope, _without(ENVELOPE, "payload"), "payload is missing"),
    "envelope-created-at-str": (
        Envelope,
        _with(ENVELOPE, "now", "createdAt"),
        "createdAt must be an int, got 'now'",
    ),
    "envelope-created-at-bool": (
        Envelope,
        _with(ENVELOPE, True, "createdAt"),
        "createdAt must be an int, got True",
    ),
    "envelope-max-hops-str": (
        Envelope,
        _with(ENVELOPE, "x", "budget", "maxHops"),
        "budget.maxHops must be an int, got 'x'",
    ),
    "envelope-hop-count-missing": (
        Envelope,
        _without(ENVELOPE, "budget", "hopCount"),
        "budget.hopCount is missing",
    ),
    "envelope-hop-count-negative": (
        Envelope,
        _with(ENVELOPE, -1, "budget", "hopCount"),
        "budget.hopCount must be >= 0, got -1",
    ),
    "envelope-chain-item": (
        Envelope,
        _with(ENVELOPE, ["a", 3], "budget", "ancestorChain"),
        "budget.ancestorChain[1] must be a string, got 3",
    ),
    "envelope-payload-bytes": (
        Envelope,
        _with(ENVELOPE, {"a": [b"x"]}, "payload"),
        "payload.a[0] must be JSON-representable, got bytes",
    ),
    "envelope-payload-int-key": (
        Envelope,
        _with(ENVELOPE, {1: "x"}, "payload"),
        "payload keys must be strings",
    ),
    "envelope-payload-nan": (
        Envelope,
        _with(ENVELOPE, [float("nan")], "payload"),
        "payload[0] must be a finite number",
    ),
    "envelope-not-a-dict": (Envelope, ["x"], "message must be an object"),
    "budget-float-ttl": (
        Budget,
        _with(ENVELOPE["budget"], 1.5, "ttl"),
        "budget.ttl must be an int, got 1.5",
    ),
    "budget-bool-calls": (
        Budget,
        _with(ENVELOPE["budget"], False, "callBudgetRemaining"),
        "budget.callBudgetRemaining must be an int, got False",
    ),
    "budget-chain-not-list": (
        Budget,
        _with(ENVELOPE["budget"], "a.b", "ancestorChain"),
        "budget.ancestorChain must be a list",
    ),
    "signal-unknown-type": (
        Signal,
        _with(SIGNAL, "dancing", "type"),
        "signal.type must be one of typing, presence, read_receipt",
    ),
    "signal-missing-state": (Signal, _without(SIGNAL, "state"), "signal.state is missing"),
    "signal-data-list": (Signal, _with(SIGNAL, [1], "data"), "signal.data must be an object"),
    "signal-timestamp-str": (
        Signal,
        _with(SIGNAL, "1", "timestamp"),
        "signal.timestamp must be an int",
    ),
    "rule-unknown-action": (
        AccessRule,
        _with(RULE, "maybe", "action"),
        "rule.action must be one of allow, deny; got 'maybe'",
    ),
    "rule-bool-priority": (
        AccessRule,
        _with(RULE, True, "priority"),
        "rule.priority must be an int",
    ),
    "rule-missing-to": (AccessRule, _without(RULE, "to"), "rule.to is missing"),
    "payload-missing-content": (
        StandardPayload,
        _without(PAYLOAD, "content"),
        "payload.content is missing",
    ),
    "payload-attachment-int": (
        StandardPayload,
        _with(PAYLOAD, ["/a", 2], "attachments"),
        "payload.attachments[1] must be a string",
    ),
    "payload-platform-data-str": (
        StandardPayload,
        _with(PAYLOAD, "x", "platformData"),
        "payload.platformData must be an object",
    ),
    "endpoint-bad-hash": (
        EndpointInfo,
        _with(ENDPOINT, "XYZ", "hash"),
        "endpoint.hash must be 12 lowercase hex characters",
    ),
    "endpoint-missing-path": (
        EndpointInfo,
        _without(ENDPOINT, "maildirPath"),
        "endpoint.maildirPath is missing",
    ),
    "result-bad-pair": (
        PublishResult,
        _with(RESULT, [["h"]], "rejected"),
        "result.rejected[0] must be a [hash, reason] pair",
    ),
    "result-pressure-str": (
        PublishResult,
        _with(RESULT, {"h": "high"}, "mailboxPressure"),
        "result.mailboxPressure.h must be a number",
    ),
    "result-delivered-bool": (
        PublishResult,
        _with(RESULT, True, "deliveredTo"),
        "result.deliveredTo must be an int",
    ),
    "dead-letter-missing-code": (
        DeadLetterInfo,
        _without(DEAD, "code"),
        "deadLetter.code is missing",
    ),
}


@pytest.mark.parametrize(
    ("cls", "wire", "expected"), INVALID_MESSAGES.values(), ids=INVALID_MESSAGES.keys()
)
def test_invalid_wire_raises_invalid_message_naming_the_field(
    cls: Any, wire: Any, expected: str
) -> None:
    with pytest.raises(InvalidMessage) as err:
        cls.from_wire(wire)
    assert expected in str(err.value)
    assert err.value.code == "invalid_message"


INVALID_SUBJECTS = {
    "envelope-wildcard-subject": (Envelope, _with(ENVELOPE, "relay.*", "subject"), "subject:"),
    "envelope-bad-from": (Envelope, _with(ENVELOPE, "a..b", "from"), "from:"),
    "envelope-bad-reply-to": (Envelope, _with(ENVELOPE, "a b", "replyTo"), "replyTo:"),
    "envelope-bad-published-to": (
        Envelope,
        _with(ENVELOPE, "a.>.b", "publishedTo"),
        "publishedTo:",
    ),
    "envelope-bad-chain": (
        Envelope,
        _with(ENVELOPE, ["ok", "bad."], "budget", "ancestorChain"),
        "budget.ancestorChain[1]:",
    ),
    "signal-wildcard-endpoint": (
        Signal,
        _with(SIGNAL, "a.>", "endpointSubject"),
        "signal.endpointSubject:",
    ),
    "rule-bad-pattern": (AccessRule, _with(RULE, "a*", "from"), "rule.from:"),
    "endpoint-bad-subject": (EndpointInfo, _with(ENDPOINT, "", "subject"), "endpoint.subject:"),
}


@pytest.mark.parametrize(
    ("cls", "wire", "expected"), INVALID_SUBJECTS.values(), ids=INVALID_SUBJECTS.keys()
)
def test_bad_subject_raises_invalid_subject_naming_the_field(
    cls: Any, wire: Any, expected: str
) -> None:
    with pytest.raises(InvalidSubject) as err:
        cls.from_wire(wire)
    assert str(err.value).startswith(expected)


def test_rule_patterns_accept_wildcards_and_missing_priority_defaults_to_zero() -> None:
    rule = AccessRule.from_wire({"from": "*", "to": "relay.>", "action": "allow"})
    assert rule == AccessRule("*", "relay.>", RuleAction.ALLOW, 0)


def test_long_bad_values_are_truncated_in_the_message() -> None:
    with pytest.raises(InvalidMessage) as err:
        Envelope.from_wire(_with(ENVELOPE, "x" * 10_000, "createdAt"))
    assert len(str(err.value)) < 120


def test_deeply_nested_payload_is_checked_without_recursion() -> None:
    payload: Any = "leaf"
    for _ in range(50_000):
        payload = [payload]
    envelope = Envelope.from_wire(_with(ENVELOPE, payload, "payload"))
    assert envelope.payload is payload


# --- default budget -------------------------------------------------------------------------------


def test_default_budget() -> None:
    assert default_budget(NOW) == Budget(
        0, DEFAULT_MAX_HOPS, (), NOW + DEFAULT_TTL_MS, DEFAULT_CALL_BUDGET
    )
    assert (DEFAULT_MAX_HOPS, DEFAULT_TTL_MS, DEFAULT_CALL_BUDGET) == (5, 3_600_000, 10)


def test_default_budget_overrides() -> None:
    budget = default_budget(NOW, max_hops=2, ttl_ms=1000, call_budget_remaining=3)
    assert budget == Budget(0, 2, (), NOW + 1000, 3)
    assert default_budget(NOW, ttl=NOW + 5).ttl == NOW + 5
    assert default_budget(NOW, ancestor_chain=("a.b",)).ancestor_chain == ("a.b",)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"max_hop": 3}, "unknown budget override 'max_hop'"),
        ({"ttl": NOW, "ttl_ms": 5}, "not both"),
        ({"max_hops": "3"}, "budget.maxHops must be an int"),
        ({"ttl_ms": -1}, "budget.ttl_ms must be >= 0"),
    ],
    ids=["unknown", "ttl-twice", "wrong-type", "negative-ttl"],
)
def test_default_budget_rejects_bad_overrides(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidMessage, match=expected):
        default_budget(NOW, **overrides)


# --- the message file ---------------------------------------------------------------------------


def test_json_file_round_trip_keeps_unicode_readable() -> None:
    envelope = make_envelope(payload={"content": "héllo wörld ✓ 日本語 🚀", "emoji": "👍"})
    data = envelope.to_json()
    assert isinstance(data, bytes)
    assert "日本語 🚀".encode() in data  # not \u-escaped: `cat` shows it
    assert Envelope.from_json(data) == envelope


def test_json_file_is_compact() -> None:
    data = make_envelope(payload={"a": 1}).to_json()
    assert b", " not in data and b": " not in data
    assert json.loads(data)["from"] == "relay.agent.p.frontend"


@pytest.mark.parametrize(
    "data",
    [b"", b"{not json", b"\xff\xfe", b"[1, 2]", b'{"id": NaN}', b"null"],
    ids=["empty", "truncated", "not-utf8", "array", "nan", "null"],
)
def test_malformed_file_raises_invalid_message(data: bytes) -> None:
    with pytest.raises(InvalidMessage):
        Envelope.from_json(data)
    with pytest.raises(InvalidMessage):
        parse_message_file(data)


def test_to_json_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(InvalidMessage, match="not JSON-representable"):
        make_envelope(payload={"x": {1, 2}}).to_json()
    with pytest.raises(InvalidMessage, match="not JSON-representable"):
        make_envelope(payload=float("inf")).to_json()
    with pytest.raises(InvalidMessage, match="not JSON-representable"):
        make_envelope(payload="\ud800").to_json()  # lone surrogate: no UTF-8 for it


def test_dead_letter_file_round_trip() -> None:
    envelope = make_envelope(payload={"content": "ünïcode"})
    info = DeadLetterInfo("cycle detected: relay.a already in chain", "cycle_detected", NOW, "abc")
    data = dead_letter_json(envelope, info)
    assert json.loads(data)["deadLetter"] == {
        "reason": "cycle detected: relay.a already in chain",
        "code": "cycle_detected",
        "failedAt": NOW,
        "endpoint": "abc",
    }
    assert parse_message_file(data) == (envelope, info)


def test_dead_letter_json_accepts_a_wire_dict_and_leaves_it_unchanged() -> None:
    wire = envelope_wire()
    before = copy.deepcopy(wire)
    info = DeadLetterInfo("no endpoint matches", "no_match", NOW, "_unroutable")
    assert parse_message_file(dead_letter_json(wire, info)) == (make_envelope(), info)
    assert wire == before


def test_plain_message_file_has_no_dead_letter_info() -> None:
    envelope = make_envelope()
    assert parse_message_file(envelope.to_json()) == (envelope, None)


def test_dead_letter_info_is_validated_in_a_file() -> None:
    wire = _with(
        envelope_wire(),
        {"reason": "x", "code": "y", "failedAt": "z", "endpoint": "e"},
        "deadLetter",
    )
    with pytest.raises(InvalidMessage, match=r"deadLetter\.failedAt must be an int"):
        parse_message_file(json.dumps(wire).encode())


def test_a_batch_frame_is_the_packed_bodies_as_one_msgpack_array():
    for count in (1, 15, 16, 70_000):
        bodies = [wire.ok_body(i, i) for i in range(count)]
        frame = wire.batch(bodies)
        assert _is_msgpack_array(frame)
        replies = wire.decode_incoming_all([wire.MAGIC, frame])
        assert [r.rid for r in replies] == list(range(count))
    assert not _is_msgpack_array(wire.ok_body(1))


def _is_msgpack_array(body: bytes) -> bool:
    """Whether a packed body is a msgpack array (fixarray, array 16 or array 32)."""
    return bool(body) and (body[0] & 0xF0 == 0x90 or body[0] in (0xDC, 0xDD))


def test_a_signal_message_is_one_signal_or_a_run_of_them():
    one = {"type": "typing", "state": "on"}
    two = [one, {"type": "progress", "state": "50%"}]
    packed = [wire.packb(m) for m in two]
    assert wire.decode_signals(wire.encode_signal("a.b", packed[0])) == ("a.b", [one])
    run = wire.encode_signal_run("a.b", packed)
    assert run[0] == b"+a.b"
    assert wire.decode_signals(run) == ("a.b", two)
    for broken in (
        [b"a.b"],
        [b"a.b", b"\xc1"],
        [b"\xff", wire.packb(one)],
        [b"a", b"b", b"c"],
        [b"+a.b", wire.packb(one)],  # a run is an array
    ):
        with pytest.raises(MalformedFrame):
            wire.decode_signals(broken)


GOOD_SIGNAL = {"type": "typing", "state": "on", "endpointSubject": "a.b", "timestamp": 5}


def test_checked_wire_is_from_wire_then_to_wire_without_the_object():
    good = GOOD_SIGNAL
    for d in (good, {**good, "data": {"n": 1}}, {**good, "data": None}):
        assert Signal.checked_wire(d) == Signal.from_wire(d).to_wire()
    assert "extra" not in Signal.checked_wire({**good, "extra": 1})
    for bad in ({**good, "type": "shouting"}, {**good, "timestamp": -1}, "not a map"):
        with pytest.raises(InvalidMessage):
            Signal.checked_wire(bad)


@pytest.mark.parametrize(
    "change",
    [
        {"type": ["typing"]},  # unhashable: must not break the lookup
        {"type": "shouting"},
        {"state": 1},
        {"timestamp": True},
        {"timestamp": -1},
        {"timestamp": 1.5},
        {"data": [1]},
        {"endpointSubject": "a..b"},
        {"endpointSubject": "a.*"},
    ],
)
def test_a_signal_map_one_field_off_is_refused_with_the_same_error_either_way(change):
    good = GOOD_SIGNAL
    with pytest.raises((InvalidMessage, InvalidSubject)) as from_wire:
        Signal.from_wire({**good, **change})
    with pytest.raises(type(from_wire.value)) as checked:
        Signal.checked_wire({**good, **change})
    assert checked.value.message == from_wire.value.message


@pytest.mark.parametrize("number", [b"1e999", b"-1e999"], ids=["inf", "-inf"])
def test_a_message_file_whose_payload_overflows_a_float_is_refused(number: bytes) -> None:
    """`Envelope.from_json` does not walk the decoded payload again: the decoder itself
    must refuse what JSON cannot hold (a number beyond a float's range reads as inf)."""
    data = make_envelope(payload={"x": 1}).to_json().replace(b'"x":1', b'"x":' + number)
    with pytest.raises(InvalidMessage, match="not a finite number"):
        Envelope.from_json(data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":1,"b":[2.5,"x"]}',  # what Relay writes: read by the scanner alone
        b'  {"a":1}\n',  # whitespace around it: json's decode
        '{"a":"é"}'.encode("utf-16"),  # another encoding: json's decode
        b"{}",
    ],
    ids=["compact", "spaced", "utf-16", "empty"],
)
def test_a_message_file_reads_as_json_loads_reads_it(data: bytes) -> None:
    assert loads_json(data) == json.loads(data)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"a":1}}', "Extra data"),
        (b'{"a":1} x', "Extra data"),
        (b'{"a":', "Expecting value"),
        (b'{"a":NaN}', "NaN is not valid JSON"),
        (b'{"a":"\xff"}', "can't decode byte 0xff"),
        (b"[1]", "must be an object"),
    ],
    ids=["extra-brace", "extra-text", "cut", "nan", "not-utf-8", "a-list"],
)
def test_a_message_file_that_is_not_a_json_object_is_refused_with_json_s_reason(
    data: bytes, error: str
) -> None:
    with pytest.raises(InvalidMessage, match=error):
        loads_json(data)
