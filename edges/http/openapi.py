"""The OpenAPI 3.1 document served at /openapi.json, built from one table of operations
(pure). Tests check that every route of the app is in it and nothing else, and that
real answers validate against it (openapi-core, tests/edges_harness.py).

Response schemas list the fields a client may rely on as ``required`` and leave objects
open (no ``additionalProperties: false``): a newer router may add fields, and a
generated client must not break on them."""

from __future__ import annotations

from typing import Any

from broker.config import DEFAULT_CONFIG
from edges.http.errors import STATUS_BY_CODE

_OBJ = {"type": "object"}
_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _param(name: str, where: str, description: str, schema: dict | None = None) -> dict:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An open object whose listed properties are all there unless ``required`` says."""
    return {
        "type": "object",
        "required": list(properties) if required is None else required,
        "properties": properties,
    }


def _list(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def _json_type(value: Any) -> dict[str, Any]:
    """The JSON type of a default setting (bool before int: a bool is an int)."""
    kinds = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))
    kinds += ((list, "array"), (dict, "object"))
    return {"type": next(name for kind, name in kinds if isinstance(value, kind))}


_STRING = {"type": "string"}
_BOOL = {"type": "boolean"}
_COUNT = {"type": "integer", "minimum": 0}
_MS = {"type": "integer", "minimum": 0, "description": "unix milliseconds"}
_ID = {"type": "string", "description": "a message id (ULID)"}
_HASH = {"type": "string", "description": "endpoint hash (12 hex characters) or _unroutable"}
_DELIVERIES = {
    "type": "integer",
    "minimum": 1,
    "description": "how many times it has been handed out, this time included (1 the first)",
}
_REMOVED = _object({"removed": _BOOL})
# The stream's media type; its events are described in docs/http.md.
_EVENTS = {"text/event-stream": {"schema": _STRING}}

SUBJECT = _param("subject", "path", "a concrete endpoint subject, e.g. relay.agent.demo.backend")
MESSAGE_ID = _param("id", "path", "a message id (ULID)")
ENDPOINT_Q = _param("endpoint", "query", "endpoint hash or subject")

# (method, path, summary, parameters, request body schema or None, success status(es),
# success body schema)
OPERATIONS: list[tuple[str, str, str, list[dict], dict | None, int | tuple[int, ...], dict]] = [
    (
        "post",
        "/api/publish",
        "Publish a message",
        [],
        _ref("PublishRequest"),
        200,
        _ref("PublishResult"),
    ),
    (
        "post",
        "/api/signals",
        "Send an ephemeral signal",
        [],
        _ref("SignalRequest"),
        200,
        _object({"sent": {"const": True}}),
    ),
    (
        "get",
        "/api/endpoints",
        "Endpoints with depth, pressure and breaker state",
        [],
        None,
        200,
        _object({"endpoints": _list(_ref("EndpointStatus"))}),
    ),
    (
        "post",
        "/api/endpoints",
        "Register an endpoint: 201 when made now, 200 when it was registered already",
        [],
        _ref("RegisterRequest"),
        (201, 200),
        _ref("EndpointInfo"),
    ),
    (
        "delete",
        "/api/endpoints/{subject}",
        "Unregister (mail is kept)",
        [SUBJECT],
        None,
        200,
        _REMOVED,
    ),
    (
        "get",
        "/api/endpoints/{subject}/inbox",
        "Claim what waits and list what is held for you (until ack, nack or the ack deadline)",
        [
            SUBJECT,
            _param("limit", "query", "at most this many (1-16)", {"type": "integer"}),
            _param("wait", "query", "seconds to wait for a first one (0-30)", {"type": "number"}),
        ],
        None,
        200,
        _object({"messages": _list(_ref("HeldMessage"))}),
    ),
    (
        "get",
        "/api/endpoints/{subject}/pending",
        "Claimed, unanswered",
        [SUBJECT],
        None,
        200,
        _object({"items": _list(_ref("MessageCopy"))}),
    ),
    (
        "post",
        "/api/messages/{id}/ack",
        "Ack a held message: answered once it is done, durably",
        [MESSAGE_ID, ENDPOINT_Q],
        _OBJ,
        200,
        _ref("Answer"),
    ),
    (
        "post",
        "/api/messages/{id}/nack",
        "Nack a held message: answered once it is a dead letter, durably",
        [MESSAGE_ID, ENDPOINT_Q],
        _ref("Nack"),
        200,
        _ref("Answer"),
    ),
    (
        "post",
        "/api/messages/{id}/requeue",
        "Operators: return a claimed message to new/",
        [MESSAGE_ID],
        _ref("EndpointRequest"),
        200,
        _object({"id": _ID, "requeued": {"type": "boolean"}}),
    ),
    (
        "get",
        "/api/dead-letters",
        "Dead letters with reasons",
        [ENDPOINT_Q, _param("limit", "query", "1-1000", {"type": "integer"})],
        None,
        200,
        _object({"items": _list(_ref("MessageCopy"))}),
    ),
    (
        "delete",
        "/api/dead-letters",
        "Operators: purge dead letters",
        [ENDPOINT_Q],
        None,
        200,
        _object({"purged": _COUNT}),
    ),
    (
        "post",
        "/api/dead-letters/requeue",
        "Operators: requeue an endpoint's dead letters, oldest first, a bounded page",
        [
            _param("endpoint", "query", "endpoint hash or subject (required)"),
            _param("limit", "query", "1-200, default 100", {"type": "integer"}),
            _param("after", "query", "go on after this message id", _ID),
        ],
        None,
        200,
        _ref("Requeued"),
    ),
    (
        "post",
        "/api/dead-letters/{id}/requeue",
        "Operators: a message's dead letter back to its endpoint's new/, under its own id",
        [MESSAGE_ID],
        _ref("EndpointRequest"),
        200,
        _ref("Requeued"),
    ),
    (
        "post",
        "/api/dead-letters/{id}/republish",
        "Publish a dead letter's payload again, as its sender",
        [MESSAGE_ID],
        _ref("EndpointRequest"),
        200,
        _object(
            {"republished": _ID, "subject": _STRING, "result": _ref("PublishResult")},
        ),
    ),
    (
        "get",
        "/api/trace/{id}",
        "Every copy of a message, state and times, and the replies that answer it",
        [MESSAGE_ID],
        None,
        200,
        _object(
            {
                "id": _ID,
                "copies": _list(_ref("MessageCopy")),
                "replies": _list(
                    _object({"id": _ID, "endpoint": _STRING, "subject": _STRING, "from": _STRING})
                ),
            }
        ),
    ),
    (
        "get",
        "/api/rules",
        "Access rules",
        [],
        None,
        200,
        _object({"rules": _list(_ref("Rule"))}),
    ),
    (
        "post",
        "/api/rules",
        "Operators: add an access rule",
        [],
        _ref("Rule"),
        201,
        _ref("Rule"),
    ),
    (
        "delete",
        "/api/rules",
        "Operators: remove an access rule",
        [_param("from", "query", "from pattern"), _param("to", "query", "to pattern")],
        None,
        200,
        _REMOVED,
    ),
    ("get", "/api/config", "Reliability settings", [], None, 200, _ref("Config")),
    (
        "patch",
        "/api/config",
        "Operators: change settings (a partial)",
        [],
        _OBJ,
        200,
        _ref("Config"),
    ),
    ("get", "/api/status", "Processes, clients, endpoints", [], None, 200, _ref("Status")),
    (
        "get",
        "/api/stream",
        "Server-sent events: relay_message, relay_signal, relay_backpressure, relay_gap",
        [
            _param("pattern", "query", "subject pattern (default >)"),
            _param(
                "mode",
                "query",
                "observe (default), consume or signals",
                {"enum": ["observe", "consume", "signals"]},
            ),
            _param("signals", "query", "false: messages only", {"type": "boolean"}),
            _param("token", "query", "bearer token (EventSource cannot set headers)"),
            _param("Last-Event-ID", "header", "resume an observe stream after this event"),
        ],
        None,
        200,
        _EVENTS,
    ),
]

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": sorted(STATUS_BY_CODE)},
                    "message": {"type": "string"},
                },
            }
        },
    },
    "PublishRequest": {
        "type": "object",
        "required": ["subject", "from", "payload"],
        "properties": {
            "subject": {"type": "string"},
            "from": {"type": "string", "description": "sender subject your identity may use"},
            "payload": {"description": "any JSON value"},
            "replyTo": {"type": "string"},
            "budget": {"type": "object"},
        },
    },
    "SignalRequest": {
        "type": "object",
        "required": ["subject", "type", "state"],
        "properties": {
            "subject": {"type": "string"},
            "type": {"enum": ["typing", "presence", "read_receipt", "progress"]},
            "state": {"type": "string"},
            "data": {"type": "object"},
            "from": {"type": "string"},
        },
    },
    "RegisterRequest": {
        "type": "object",
        "required": ["subject"],
        "properties": {
            "subject": {"type": "string"},
            "shared": {
                "type": "boolean",
                "description": "advertise to other nodes (federation); omitted: as it is",
            },
        },
    },
    "EndpointRequest": {
        "type": "object",
        "properties": {"endpoint": {"type": "string", "description": "hash or subject"}},
    },
    "Nack": {
        "type": "object",
        "properties": {"reason": {"type": "string"}, "endpoint": {"type": "string"}},
    },
    "Rule": {
        "type": "object",
        "required": ["from", "to", "action"],
        "properties": {
            "from": {"type": "string"},
            "to": {"type": "string"},
            "action": {"enum": ["allow", "deny"]},
            "priority": {"type": "integer"},
        },
    },
    # ------------------------------------------------------------------ answers
    "Budget": _object(
        {
            "hopCount": _COUNT,
            "maxHops": _COUNT,
            "ancestorChain": _list(_STRING),
            "ttl": _MS,
            "callBudgetRemaining": {"type": "integer"},
        }
    ),
    "Envelope": _object(
        {
            "id": _ID,
            "subject": _STRING,
            "from": _STRING,
            "replyTo": _nullable("string"),
            "budget": _ref("Budget"),
            "createdAt": _MS,
            "payload": {"description": "any JSON value"},
            "publishedTo": {**_STRING, "description": "the pattern published to, if not subject"},
            "republishedFrom": {**_ID, "description": "the dead letter this publishes again"},
            "parentId": {**_ID, "description": "a reply: the id of the message it answers"},
            "relayedFrom": {
                **_STRING,
                "description": "the node this copy was relayed from (federation)",
            },
        },
        ["id", "subject", "from", "replyTo", "budget", "createdAt", "payload"],
    ),
    "HeldMessage": {
        "allOf": [_ref("Envelope"), _object({"endpoint": _HASH, "deliveries": _DELIVERIES})],
        "description": "an envelope held for you until ack, nack or the ack deadline, its "
        "endpoint, and which hand-out this is",
    },
    "PublishResult": _object(
        {
            "messageId": _ID,
            "deliveredTo": {**_COUNT, "description": "how many endpoints stored a copy"},
            "rejected": _list(
                {
                    "type": "array",
                    "prefixItems": [_HASH, {"type": "string", "description": "reason"}],
                    "minItems": 2,
                    "maxItems": 2,
                    "description": '[endpoint hash or "*", reason]',
                }
            ),
            "mailboxPressure": {"type": "object", "additionalProperties": {"type": "number"}},
            "details": {"type": "object", "additionalProperties": _STRING},
        }
    ),
    "EndpointInfo": _object(
        {
            "subject": _STRING,
            "hash": _HASH,
            "maildirPath": _STRING,
            "registeredAt": _MS,
            "shared": _BOOL,
        }
    ),
    "Breaker": _object(
        {
            "state": {"enum": ["closed", "open", "half_open"]},
            "failures": _COUNT,
            "reopensInMs": _COUNT,
        },
        ["state"],
    ),
    "EndpointStatus": {
        "allOf": [
            _ref("EndpointInfo"),
            _object(
                {
                    "depth": {**_COUNT, "description": "messages waiting in new/"},
                    "pressure": {"type": "number", "minimum": 0},
                    "breaker": _ref("Breaker"),
                }
            ),
        ]
    },
    "Answer": _object(
        {
            "id": _ID,
            "endpoint": _HASH,
            "answer": {"enum": ["ack", "nack"]},
            "state": {"enum": ["done", "failed"], "description": "the message's state now"},
            "deliveries": _DELIVERIES,
            "reason": {"type": "string", "description": "a nack's reason"},
        },
        ["id", "endpoint", "answer", "state", "deliveries"],
    ),
    "Requeued": _object(
        {
            "requeued": _list(_object({"id": _ID, "endpoint": _HASH})),
            "refused": _list(
                _object({"id": _ID, "endpoint": _HASH, "code": _STRING, "message": _STRING})
            ),
            "more": {"type": "boolean", "description": "more dead letters remain after these"},
            "after": {**_nullable("string"), "description": "with more: pass it to go on"},
        }
    ),
    "MessageCopy": _object(
        {
            "id": _ID,
            "endpoint": _HASH,
            "subject": _STRING,
            "endpointSubject": _nullable("string"),
            "from": _STRING,
            "state": {"enum": ["new", "claimed", "done", "failed"]},
            "createdAt": _MS,
            "storedAt": _nullable("integer"),
            "claimedAt": _nullable("integer"),
            "finishedAt": _nullable("integer"),
            "reason": _nullable("string"),
            "code": _nullable("string"),
            "size": _nullable("integer"),
            "envelope": {
                "type": "object",
                "description": "the message file (an envelope, plus deadLetter when failed)",
            },
            "requeues": _list(
                {
                    "type": "object",
                    "description": "trace: a dead letter it was requeued from (its "
                    "deadLetter fields and requeuedAt), oldest first",
                }
            ),
        },
        ["id", "endpoint", "subject", "endpointSubject", "from", "state", "createdAt"],
    ),
    "Config": _object(
        {
            section: {
                "type": "object",
                "properties": {key: _json_type(value) for key, value in keys.items()},
            }
            for section, keys in DEFAULT_CONFIG.items()
        }
    ),
    "Status": _object(
        {
            "router": _object(
                {
                    "pid": {"type": "integer"},
                    "startedAt": _MS,
                    "address": _STRING,
                    "signals": _STRING,
                }
            ),
            "shards": {"type": "integer", "minimum": 1},
            "writers": _list(
                _object(
                    {
                        "shard": _COUNT,
                        "pid": _nullable("integer"),
                        "state": {"enum": ["up", "starting", "down"]},
                        "since": _nullable("integer"),
                    }
                )
            ),
            "clients": _COUNT,
            "subscriptions": _COUNT,
            "pendingRequests": _COUNT,
            "endpoints": _list(_ref("EndpointStatus")),
            "unroutable": _COUNT,
            "fileErrors": {"type": "object", "additionalProperties": _STRING},
            "federation": {"type": "object"},
            "edges": _list(
                _object(
                    {
                        "kind": _STRING,
                        "pid": {"type": "integer"},
                        "address": _STRING,
                        "state": {"enum": ["listening", "retrying"]},
                        "since": _MS,
                        "error": _nullable("string"),
                        "retryAt": _nullable("integer"),
                    }
                )
            ),
        },
        ["router", "shards", "writers", "clients", "subscriptions", "endpoints"],
    ),
}


def _operation(
    summary: str, params: list, body: dict | None, ok: int | tuple[int, ...], answer: dict
) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ref("Error")}}}
    content = answer if answer is _EVENTS else {"application/json": {"schema": answer}}
    done = {"description": "done", "content": content}
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": params,
        "responses": {
            **{str(status): done for status in (ok if isinstance(ok, tuple) else (ok,))},
            "4XX": {"description": "refused, with a Relay error code", **error},
            "5XX": {"description": "the broker could not answer", **error},
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def document(version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, params, body, ok, answer in OPERATIONS:
        paths.setdefault(path, {})[method] = _operation(summary, params, body, ok, answer)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Relay HTTP gateway",
            "version": version,
            "description": "REST and server-sent events in front of a Relay broker (docs/http.md).",
        },
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": paths,
    }
