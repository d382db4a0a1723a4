"""The OpenAPI 3.1 document served at /openapi.json, built from one table of operations
(pure). A test checks that every route of the app is in it and nothing else."""

from __future__ import annotations

from typing import Any

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


SUBJECT = _param("subject", "path", "a concrete endpoint subject, e.g. relay.agent.demo.backend")
MESSAGE_ID = _param("id", "path", "a message id (ULID)")
ENDPOINT_Q = _param("endpoint", "query", "endpoint hash or subject")

# (method, path, summary, parameters, request body schema or None, success status)
OPERATIONS: list[tuple[str, str, str, list[dict], dict | None, int]] = [
    ("post", "/api/publish", "Publish a message", [], _ref("PublishRequest"), 200),
    ("post", "/api/signals", "Send an ephemeral signal", [], _ref("SignalRequest"), 200),
    ("get", "/api/endpoints", "Endpoints with depth, pressure and breaker state", [], None, 200),
    ("post", "/api/endpoints", "Register an endpoint", [], _ref("RegisterRequest"), 201),
    ("delete", "/api/endpoints/{subject}", "Unregister (mail is kept)", [SUBJECT], None, 200),
    (
        "get",
        "/api/endpoints/{subject}/inbox",
        "Claim what waits and list what is held for you (until ack or nack)",
        [
            SUBJECT,
            _param("limit", "query", "at most this many (1-16)", {"type": "integer"}),
            _param("wait", "query", "seconds to wait for a first one (0-30)", {"type": "number"}),
        ],
        None,
        200,
    ),
    ("get", "/api/endpoints/{subject}/pending", "Claimed, unanswered", [SUBJECT], None, 200),
    ("post", "/api/messages/{id}/ack", "Ack a held message", [MESSAGE_ID, ENDPOINT_Q], _OBJ, 202),
    ("post", "/api/messages/{id}/nack", "Nack a held message", [MESSAGE_ID], _ref("Nack"), 202),
    (
        "post",
        "/api/messages/{id}/requeue",
        "Operators: return a claimed message to new/",
        [MESSAGE_ID],
        _ref("EndpointRequest"),
        200,
    ),
    (
        "get",
        "/api/dead-letters",
        "Dead letters with reasons",
        [ENDPOINT_Q, _param("limit", "query", "1-1000", {"type": "integer"})],
        None,
        200,
    ),
    ("delete", "/api/dead-letters", "Operators: purge dead letters", [ENDPOINT_Q], None, 200),
    (
        "post",
        "/api/dead-letters/{id}/republish",
        "Publish a dead letter's payload again, as its sender",
        [MESSAGE_ID],
        _ref("EndpointRequest"),
        200,
    ),
    ("get", "/api/trace/{id}", "Every copy of a message, state and times", [MESSAGE_ID], None, 200),
    ("get", "/api/rules", "Access rules", [], None, 200),
    ("post", "/api/rules", "Operators: add an access rule", [], _ref("Rule"), 201),
    (
        "delete",
        "/api/rules",
        "Operators: remove an access rule",
        [_param("from", "query", "from pattern"), _param("to", "query", "to pattern")],
        None,
        200,
    ),
    ("get", "/api/config", "Reliability settings", [], None, 200),
    ("patch", "/api/config", "Operators: change settings (a partial)", [], _OBJ, 200),
    ("get", "/api/status", "Processes, clients, endpoints", [], None, 200),
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
    ),
]

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
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
}


def _operation(summary: str, params: list, body: dict | None, ok: int) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ref("Error")}}}
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": params,
        "responses": {
            str(ok): {"description": "done"},
            "4XX": {"description": "refused, with a Relay error code", **error},
            "5XX": {"description": "the broker could not answer", **error},
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def document(version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, params, body, ok in OPERATIONS:
        paths.setdefault(path, {})[method] = _operation(summary, params, body, ok)
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
