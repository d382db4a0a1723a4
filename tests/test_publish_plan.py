"""The publish pipeline as a pure function: targets, checks in order, file bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.budget import advance
from broker.publish import PublishRequest, encode_copy, encode_payload, plan_publish
from broker.rules import RuleSet
from sdk.errors import InvalidMessage, PayloadTooLarge
from sdk.paths import UNROUTABLE
from sdk.subjects import endpoint_hash
from sdk.types import AccessRule, Envelope, RuleAction, default_budget, parse_message_file

NOW = 1_764_108_000_000
A, B = "relay.agent.p.a", "relay.agent.p.b"
SENDER = "relay.agent.p.sender"


def endpoint(subject: str):
    from sdk.types import EndpointInfo

    return EndpointInfo(subject, endpoint_hash(subject), f"/m/{endpoint_hash(subject)}", NOW)


def request(subject=A, payload=None, **budget):
    return PublishRequest(
        "01JDQ3ZV9R6Q4W1T3M5N7P8K2A",
        subject,
        SENDER,
        None,
        default_budget(NOW, **budget),
        NOW,
        payload if payload is not None else {"content": "hi"},
    )


def plan(req, targets, rules=(), **kwargs):
    payload = encode_payload(req.payload, 1 << 20)
    return plan_publish(req, targets, RuleSet(rules), payload, NOW, **kwargs)


def test_delivered_copy_carries_the_advanced_budget_and_parses_as_an_envelope():
    [copy] = plan(request(), [endpoint(A)]).copies
    envelope = Envelope.from_json(copy.data)
    assert copy.dead is None and envelope.subject == A
    assert envelope.budget.hop_count == 1 and envelope.budget.ancestor_chain == (A,)
    assert envelope.budget.call_budget_remaining == 9
    assert envelope.payload == {"content": "hi"}


def test_no_target_makes_one_unroutable_dead_letter():
    [copy] = plan(request("relay.agent.p.none"), []).copies
    assert copy.endpoint == UNROUTABLE
    assert copy.rejection == ("*", "no_match", "no matching endpoints")
    envelope, dead = parse_message_file(copy.data)
    assert dead.reason == "no matching endpoints" and envelope.subject == "relay.agent.p.none"


def test_access_is_checked_before_the_budget():
    rules = [AccessRule(SENDER, A, RuleAction.DENY)]
    [copy] = plan(request(hop_count=5), [endpoint(A)], rules).copies
    assert copy.dead.code == "access_denied"
    assert copy.rejection[:2] == (endpoint_hash(A), "access_denied")


def test_budget_violation_is_a_dead_letter_with_the_precise_code_and_category():
    [copy] = plan(request(hop_count=5), [endpoint(A)]).copies
    assert (copy.dead.code, copy.dead.reason) == ("hop_limit", "max hops exceeded (5/5)")
    assert copy.rejection == (endpoint_hash(A), "budget_exceeded", "max hops exceeded (5/5)")


def test_fan_out_checks_each_target_on_its_own():
    [to_a, to_b] = plan(
        request("relay.agent.p.*", ancestor_chain=(B,)), [endpoint(A), endpoint(B)]
    ).copies
    assert to_a.dead is None
    assert to_b.dead.code == "cycle_detected"
    assert json.loads(to_a.data)["publishedTo"] == "relay.agent.p.*"


def test_payload_over_the_limit_names_both_sizes():
    with pytest.raises(PayloadTooLarge, match=r"payload of 2\.0 KiB exceeds the 1\.0 KiB limit"):
        encode_payload("x" * 2046, 1024)


# Non-string map keys never get this far: the wire decoder refuses them (strict_map_key).
@pytest.mark.parametrize(
    "payload",
    [b"bytes", {b"k": 1}, float("nan"), {"s": {1, 2}}],
    ids=["bytes", "bytes-key", "nan", "set"],
)
def test_payload_json_cannot_hold_is_refused(payload):
    with pytest.raises(InvalidMessage, match="not JSON-representable"):
        encode_payload(payload, 1 << 20)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    payload=json_values,
    reply_to=st.sampled_from([None, SENDER]),
    published=st.sampled_from([A, "relay.agent.p.*"]),
    parent=st.sampled_from([None, "01JDQ3ZV9R6Q4W1T3M5N7P8K29"]),
    chain=st.lists(st.sampled_from([B, SENDER, "relay.agent.x-y_z"]), max_size=3),
)
def test_spliced_file_equals_the_reference_encoding(payload, reply_to, published, parent, chain):
    """The fast path (payload encoded once, spliced, the budget written out advanced
    into the endpoint) against Envelope.to_json of the copy with `advance`'s budget."""
    req = PublishRequest(
        "01JDQ3ZV9R6Q4W1T3M5N7P8K2A",
        published,
        SENDER,
        reply_to,
        default_budget(NOW, ancestor_chain=chain, hop_count=len(chain)),
        NOW,
        payload,
        parent,
    )
    data = encode_copy(req, A, encode_payload(payload, 1 << 30))
    reference = Envelope(
        "01JDQ3ZV9R6Q4W1T3M5N7P8K2A",
        A,
        SENDER,
        reply_to,
        advance(req.budget, A),
        NOW,
        payload,
        None if published == A else published,
        parent,
    )
    assert data == reference.to_json()


def test_every_copy_of_a_reply_keeps_its_parent_id_dead_letters_too():
    parent = "01JDQ3ZV9R6Q4W1T3M5N7P8K29"
    req = PublishRequest(
        "01JDQ3ZV9R6Q4W1T3M5N7P8K2A", A, SENDER, None, default_budget(NOW), NOW, 1, parent
    )
    delivered = plan(req, [endpoint(A)]).copies
    unroutable = plan(req, []).copies
    for copy in (*delivered, *unroutable):
        assert parse_message_file(copy.data)[0].parent_id == parent


def test_reliability_gate_runs_after_access_and_before_the_budget():
    from broker.publish import Refusal

    asked = []

    def gate(target):
        asked.append(target.subject)
        if target.subject == A:
            return Refusal("backpressure", "backpressure: mailbox full (3/3)"), False
        return None, True

    rules = [AccessRule(SENDER, "relay.agent.p.c", RuleAction.DENY)]
    targets = [endpoint(A), endpoint(B), endpoint("relay.agent.p.c")]
    to_a, to_b, to_c = plan(
        request("relay.agent.p.*", hop_count=5), targets, rules, gate=gate
    ).copies
    assert asked == [A, B]  # the denied target never reaches the gate
    assert to_a.refusal.reason == "backpressure" and to_a.data == b"" and to_a.dead is None
    assert to_b.dead.code == "hop_limit" and to_b.probe  # gate passed, then budget
    assert to_c.dead.code == "access_denied"
