"""The pure rules of `relay mcp` (edges.mcp_tools): no broker."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from edges.mcp_tools import (
    DEFAULT_INBOX_LIMIT,
    TOOLS,
    carried_budget,
    checked_arguments,
    publish_refusal,
)
from sdk.errors import InvalidMessage
from sdk.types import Budget

A, B, C = "relay.agent.p.a", "relay.agent.p.b", "relay.agent.p.c"


def budget(hops: int, chain: tuple[str, ...], ttl: int, calls: int, max_hops: int = 5) -> Budget:
    return Budget(hops, max_hops, chain, ttl, calls)


def test_the_tool_names_are_designs_and_each_schema_is_a_closed_object() -> None:
    assert [t.name for t in TOOLS] == [
        "relay_send",
        "relay_send_and_wait",
        "relay_inbox",
        "relay_ack",
        "relay_nack",
        "relay_reply",
        "relay_list_endpoints",
        "relay_register_endpoint",
        "relay_unregister_endpoint",
        "relay_dead_letters",
        "relay_trace",
        "relay_signal",
    ]
    for tool in TOOLS:
        assert tool.input_schema["additionalProperties"] is False, tool.name


def test_each_tool_has_an_output_schema_that_is_a_valid_object_schema() -> None:
    for tool in TOOLS:
        Draft202012Validator.check_schema(tool.output_schema)
        assert tool.output_schema["type"] == "object", tool.name  # MCP 2025-06-18, 2025-11-25
        assert "$ref" not in json.dumps(tool.output_schema), tool.name  # hosts resolve none


def test_carried_budget_is_none_when_nothing_is_held() -> None:
    assert carried_budget([]) is None


def test_carried_budget_takes_the_tightest_limits_and_every_chain() -> None:
    held = [budget(1, (A,), 2_000, 9), budget(3, (B, A), 1_000, 4, max_hops=8)]
    assert carried_budget(held) == Budget(3, 5, (A, B), 1_000, 4)


def test_carried_budget_of_one_message_is_its_budget() -> None:
    only = budget(2, (C, A), 5_000, 7)
    assert carried_budget([only]) == only


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"deliveredTo": 1, "rejected": []}, None),
        ({"deliveredTo": 1, "rejected": [["h2", "backpressure"]]}, None),  # fan-out: a result
        ({"deliveredTo": 0, "rejected": []}, None),
        (
            {
                "deliveredTo": 0,
                "rejected": [["h1", "budget_exceeded"]],
                "details": {"h1": "cycle detected"},
            },
            ("budget_exceeded", "cycle detected"),
        ),
        (
            {"deliveredTo": 0, "rejected": [["*", "no_match"]], "details": {}},
            ("no_match", "no match"),
        ),
        (
            {"deliveredTo": 0, "rejected": [["h1", "access_denied"], ["h2", "access_denied"]]},
            ("access_denied", "access denied (and 1 more endpoints refused)"),
        ),
    ],
    ids=["delivered", "partly", "nothing-to-say", "budget", "no-match", "two-refused"],
)
def test_publish_refusal_is_a_publish_that_reached_no_endpoint(result, expected) -> None:
    assert publish_refusal(result) == expected


def test_checked_arguments_fill_in_the_defaults() -> None:
    args = checked_arguments("relay_inbox", {"endpoint": B})
    assert args == {"endpoint": B, "limit": DEFAULT_INBOX_LIMIT, "wait_s": 0}


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("relay_send", {"subject": B}, "'payload' is a required property"),
        ("relay_send", {"subject": B, "payload": 1, "from": A}, "'from' was unexpected"),
        ("relay_inbox", {"endpoint": B, "limit": 51}, "argument 'limit': 51 is greater"),
        ("relay_send_and_wait", {"subject": B, "payload": 1, "timeout_s": 0}, "'timeout_s'"),
        ("relay_ack", {"endpoint": B, "id": "short"}, "argument 'id'"),
    ],
    ids=["missing", "unknown", "too-many", "no-wait", "bad-id"],
)
def test_checked_arguments_name_what_breaks_the_schema(tool, arguments, message) -> None:
    with pytest.raises(InvalidMessage, match=message) as refused:
        checked_arguments(tool, arguments)
    assert str(refused.value).startswith(f"{tool}: ")
