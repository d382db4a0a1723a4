"""The MCP tools of `relay mcp`, as data: names, one-line descriptions, JSON schemas of
their arguments and of their results (``outputSchema``: a result is also returned as
``structuredContent``, MCP 2025-06-18 and later, beside the JSON text).

No I/O here. The names and parameters are public (docs/design.md, "The public
surface"; compatible with DorkOS's tools, so an agent prompted for one works with the
other); edges.mcp_server carries them out.
This module also holds the pure rules the server applies around them: argument
checking, how a result and a refusal read, and the budget an agent's message carries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from sdk.errors import InvalidMessage
from sdk.types import Budget

MAX_INBOX_LIMIT = 50
DEFAULT_INBOX_LIMIT = 10
DEFAULT_WAIT_S = 30.0
MAX_WAIT_S = 600.0  # an MCP host's own request timeout is usually shorter
MAX_INBOX_WAIT_S = 60.0
SIGNAL_TYPES = ["typing", "presence", "read_receipt", "progress"]  # the broker sends the rest


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


def _schema(properties: dict[str, Any], required: Iterable[str] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_SUBJECT = {"type": "string", "minLength": 1, "maxLength": 256}
_ID = {"type": "string", "minLength": 26, "maxLength": 26, "description": "a message id (ULID)"}
_PAYLOAD = {"description": 'any JSON value, e.g. {"content": "..."}'}


def _subject(what: str) -> dict[str, Any]:
    return {**_SUBJECT, "description": what}


# ---------------------------------------------------------------------- results
# Each output schema is one self-contained document (hosts resolve a $ref only inside
# it). Objects list what a host may rely on as required and stay open: a newer Relay may
# add fields.


def _result(properties: dict[str, Any], required: Iterable[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else list(required),
    }


_TEXT = {"type": "string"}
_COUNT = {"type": "integer", "minimum": 0}
_ENVELOPE = _result(
    {
        "id": {"type": "string"},
        "subject": _TEXT,
        "from": _TEXT,
        "replyTo": {"type": ["string", "null"]},
        "budget": {"type": "object"},
        "createdAt": _COUNT,
        "payload": {"description": "any JSON value"},
        "parentId": {"type": "string", "description": "a reply: the id of the message it answers"},
    },
    ["id", "subject", "from", "replyTo", "budget", "createdAt", "payload"],
)
_DELIVERIES = {
    "type": "integer",
    "minimum": 1,
    "description": "how many times it has been handed out, this time included (1 the first)",
}
_PUBLISHED = _result(
    {
        "messageId": {"type": "string"},
        "deliveredTo": {**_COUNT, "description": "how many endpoints stored a copy"},
        "rejected": {
            "type": "array",
            "items": {"type": "array", "items": _TEXT, "description": "[endpoint, reason]"},
        },
        "mailboxPressure": {"type": "object", "additionalProperties": {"type": "number"}},
        "details": {"type": "object", "additionalProperties": _TEXT},
    }
)
_COPIES = {"type": "array", "items": _result({"id": _TEXT, "endpoint": _TEXT, "state": _TEXT})}
_ANSWERED = _result(
    {
        "id": _TEXT,
        "endpoint": _TEXT,
        "answer": {"enum": ["ack", "nack"]},
        "state": {"enum": ["done", "failed"], "description": "the message's state now"},
        "deliveries": _DELIVERIES,
    }
)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "relay_send",
        "Send a message to a subject (or a pattern, to every endpoint it matches); "
        "replies go to your own subject unless reply_to names another.",
        _schema(
            {
                "subject": _subject("where to: relay.agent.<project>.<name>, or a pattern"),
                "payload": _PAYLOAD,
                "reply_to": _subject("where replies should go (default: your own subject)"),
            },
            ["subject", "payload"],
        ),
        _PUBLISHED,
    ),
    ToolSpec(
        "relay_send_and_wait",
        "Send a request to a subject and wait up to timeout_s seconds for its reply; "
        "returns the reply message (a reply that comes later is a dead letter).",
        _schema(
            {
                "subject": _subject("the endpoint that should answer"),
                "payload": _PAYLOAD,
                "timeout_s": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": MAX_WAIT_S,
                    "default": DEFAULT_WAIT_S,
                    "description": "seconds to wait for the reply",
                },
            },
            ["subject", "payload"],
        ),
        _result({"requestId": _TEXT, "reply": _ENVELOPE}),
    ),
    ToolSpec(
        "relay_inbox",
        "Claim up to limit messages waiting for an endpoint and return them; then "
        "relay_reply if asked, and relay_ack (done) or relay_nack (failed) each one "
        "before its ack deadline (then it goes to another reader).",
        _schema(
            {
                "endpoint": _subject("the endpoint subject whose messages to read"),
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_INBOX_LIMIT,
                    "default": DEFAULT_INBOX_LIMIT,
                },
                "wait_s": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_INBOX_WAIT_S,
                    "default": 0,
                    "description": "when nothing waits, wait this long for a first message",
                },
            },
            ["endpoint"],
        ),
        _result(
            {
                "messages": {
                    "type": "array",
                    "items": {
                        **_ENVELOPE,
                        "properties": {**_ENVELOPE["properties"], "deliveries": _DELIVERIES},
                        "required": [*_ENVELOPE["required"], "deliveries"],
                    },
                },
                "stillHeld": {"type": "array", "items": _TEXT},
            }
        ),
    ),
    ToolSpec(
        "relay_ack",
        "Acknowledge a message you read with relay_inbox: it is done.",
        _schema(
            {"endpoint": _subject("the endpoint it was read from"), "id": _ID}, ["endpoint", "id"]
        ),
        _ANSWERED,
    ),
    ToolSpec(
        "relay_nack",
        "Reject a message you read with relay_inbox: it becomes a dead letter with your reason.",
        _schema(
            {
                "endpoint": _subject("the endpoint it was read from"),
                "id": _ID,
                "reason": {"type": "string", "minLength": 1, "maxLength": 1000},
            },
            ["endpoint", "id", "reason"],
        ),
        {**_ANSWERED, "properties": {**_ANSWERED["properties"], "reason": _TEXT}},
    ),
    ToolSpec(
        "relay_reply",
        "Reply to a message you read with relay_inbox (sent to its replyTo, carrying its "
        "budget so loops stop); relay_ack the message afterwards.",
        _schema({"id": _ID, "payload": _PAYLOAD}, ["id", "payload"]),
        _PUBLISHED,
    ),
    ToolSpec(
        "relay_list_endpoints",
        "List the registered endpoints and how many messages wait in each.",
        _schema({}),
        _result(
            {
                "endpoints": {
                    "type": "array",
                    "items": _result(
                        {
                            "subject": _TEXT,
                            "hash": _TEXT,
                            "depth": _COUNT,
                            "pressure": {"type": "number"},
                        }
                    ),
                }
            }
        ),
    ),
    ToolSpec(
        "relay_register_endpoint",
        "Register an endpoint (a concrete subject with a mailbox) so messages sent to it are kept.",
        _schema({"subject": _subject("e.g. relay.agent.<project>.<name>")}, ["subject"]),
        _result({"subject": _TEXT, "hash": _TEXT, "maildirPath": _TEXT, "registeredAt": _COUNT}),
    ),
    ToolSpec(
        "relay_unregister_endpoint",
        "Unregister an endpoint; its unread mail and dead letters stay on disk.",
        _schema({"subject": _SUBJECT}, ["subject"]),
        _result({"subject": _TEXT, "removed": {"type": "boolean"}}),
    ),
    ToolSpec(
        "relay_dead_letters",
        "List dead letters (messages rejected or failed, with the reason), of one endpoint "
        "or of all you may see.",
        _schema({"endpoint": _subject("an endpoint subject or hash, or _unroutable")}),
        _result(
            {
                "items": {
                    "type": "array",
                    "items": _result(
                        {
                            "id": _TEXT,
                            "endpoint": _TEXT,
                            "from": _TEXT,
                            "reason": {"type": ["string", "null"]},
                        }
                    ),
                }
            }
        ),
    ),
    ToolSpec(
        "relay_trace",
        "Show every copy of a message: the endpoints it reached, its state and timestamps.",
        _schema({"id": _ID}, ["id"]),
        _result({"id": _TEXT, "copies": _COPIES}),
    ),
    ToolSpec(
        "relay_signal",
        "Send an ephemeral signal (typing, presence, progress, read_receipt) to a subject; "
        "nothing is stored.",
        _schema(
            {
                "subject": _subject("who should see it"),
                "type": {"type": "string", "enum": SIGNAL_TYPES},
                "state": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 100,
                    "description": "e.g. active, idle, online, 50%",
                },
            },
            ["subject", "type", "state"],
        ),
        _result({"subject": _TEXT, "signal": {"type": "object"}}),
    ),
)

TOOLS_BY_NAME: dict[str, ToolSpec] = {t.name: t for t in TOOLS}
_VALIDATORS = {t.name: Draft202012Validator(t.input_schema) for t in TOOLS}


def checked_arguments(name: str, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """The arguments of a call to tool ``name``, with defaults filled in; an
    `InvalidMessage` naming the first argument that breaks the tool's schema."""
    args = dict(arguments or {})
    errors = sorted(_VALIDATORS[name].iter_errors(args), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = f"argument {'.'.join(map(str, first.path))!r}: " if first.path else ""
        raise InvalidMessage(f"{name}: {where}{first.message}")
    for key, spec in TOOLS_BY_NAME[name].input_schema["properties"].items():
        if key not in args and "default" in spec:
            args[key] = spec["default"]
    return args


def as_text(data: Any) -> str:
    """A result as the JSON text an agent reads."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)


def error_text(code: str, message: str) -> str:
    """A refusal: the Relay code first, then the sentence (docs/mcp.md, "Tools")."""
    return f"{code}: {message}"


def publish_refusal(result: Mapping[str, Any]) -> tuple[str, str] | None:
    """(code, sentence) when a publish reached no endpoint because it was refused, else
    None: a fan-out that reached some endpoints is a result, its rejections listed."""
    if result["deliveredTo"] or not result["rejected"]:
        return None
    key, reason = result["rejected"][0]
    detail = result.get("details", {}).get(key) or reason.replace("_", " ")
    more = len(result["rejected"]) - 1
    return reason, detail + (f" (and {more} more endpoints refused)" if more else "")


def carried_budget(budgets: Iterable[Budget]) -> Budget | None:
    """The budget a message an agent sends carries, given the budgets of the messages it
    holds (read, not yet acknowledged): what it sends may be caused by any of them, so
    it carries the tightest of each limit and the chains of all of them, and a loop
    through any of them is stopped. None when it holds nothing: a fresh budget."""
    budgets = list(budgets)
    if not budgets:
        return None
    chain: list[str] = []
    for budget in budgets:
        chain += [s for s in budget.ancestor_chain if s not in chain]
    return Budget(
        hop_count=max(b.hop_count for b in budgets),
        max_hops=min(b.max_hops for b in budgets),
        ancestor_chain=tuple(chain),
        ttl=min(b.ttl for b in budgets),
        call_budget_remaining=min(b.call_budget_remaining for b in budgets),
    )
