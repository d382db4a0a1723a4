"""The REST and SSE routes under /api/ (docs/http.md). Each is a thin translation: JSON in,
one SDK call on the session of whoever the request acts for, JSON out. Refusals are the
router's, raised as `RelayError` and answered by the app's one error handler."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edges.http.errors import invalid
from edges.http.gateway import INBOX_WINDOW, IdentityConnection, Peer
from edges.http.streams import MODES, Stream
from sdk.aio import AsyncMessage
from sdk.errors import InvalidMessage, InvalidState, MessageNotFound, PayloadTooLarge
from sdk.ids import check_id
from sdk.subjects import validate
from sdk.types import AccessRule, Budget, PublishResult, Signal

MAX_WAIT_S = 30.0
# A request body larger than this is refused before it is read whole: the router's own
# bound on a request (16 MiB of msgpack) is the most any payload could need.
MAX_BODY_BYTES = 16 * 1024 * 1024


# ---------------------------------------------------------------------- request helpers


async def session_of(request: Request, *, token_in_query: bool = False) -> IdentityConnection:
    """The session of whoever the request acts for (401 when nobody)."""
    gateway = request.app.state.gateway
    peer = Peer(
        tuple(request.scope["client"]) if request.scope.get("client") else None,
        tuple(request.scope["server"]) if request.scope.get("server") else None,
    )
    # EventSource cannot set headers: the stream also takes ?token= (docs/http.md).
    token = request.query_params.get("token") if token_in_query else None
    principal = gateway.principal(request.headers.get("authorization"), peer, token)
    return await gateway.session(principal)


async def json_body(request: Request) -> dict[str, Any]:
    raw = await _bounded_body(request)
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise invalid(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


async def _bounded_body(request: Request) -> bytes:
    too_large = PayloadTooLarge(f"a request body is at most {MAX_BODY_BYTES // 2**20} MiB")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def field(body: dict[str, Any], name: str, kind: type, *, required: bool = True) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(f"field {name!r} is missing")
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise invalid(f"field {name!r} must be a {kind.__name__}, got {value!r:.60}")
    return value


def query_number(request: Request, name: str, default: float, low: float, high: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise invalid(f"query parameter {name!r} must be a number, got {raw!r:.60}") from None
    if not low <= value <= high:
        raise invalid(f"query parameter {name!r} must be within {low:g}..{high:g}, got {raw}")
    return value


# ---------------------------------------------------------------------- messages


async def publish(request: Request) -> Response:
    session = await session_of(request)
    body = await json_body(request)
    if "payload" not in body:
        raise invalid("field 'payload' is missing (any JSON value)")
    budget = field(body, "budget", dict, required=False)
    result = await session.client.publish(
        field(body, "subject", str),
        body["payload"],
        sender=field(body, "from", str),
        reply_to=field(body, "replyTo", str, required=False),
        budget=Budget.from_wire(budget) if budget is not None else None,
    )
    return JSONResponse(result.to_wire())


async def send_signal(request: Request) -> Response:
    session = await session_of(request)
    body = await json_body(request)
    subject = field(body, "subject", str)
    signal = Signal.from_wire(
        {
            "type": field(body, "type", str),
            "state": field(body, "state", str),
            "endpointSubject": body.get("endpointSubject", subject),
            "timestamp": body.get("timestamp", _now_ms()),
            **({"data": body["data"]} if body.get("data") is not None else {}),
        }
    )
    await session.client.signal(subject, signal, sender=field(body, "from", str, required=False))
    return JSONResponse({"sent": True})


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------- endpoints


async def list_endpoints(request: Request) -> Response:
    session = await session_of(request)
    return JSONResponse({"endpoints": (await session.client.status())["endpoints"]})


async def register_endpoint(request: Request) -> Response:
    session = await session_of(request)
    body = await json_body(request)
    fields: dict[str, Any] = {"subject": validate(field(body, "subject", str))}
    shared = field(body, "shared", bool, required=False)
    if shared is not None:
        fields["shared"] = shared
    # The protocol's request, not the SDK's register_endpoint: its EndpointInfo drops
    # `created`, which says 201 (made now) from 200 (it was there). The client's own
    # deadline ends the future.
    info = await asyncio.wrap_future(session.client.sync.send_request("register", **fields))
    created = bool(info.pop("created", True))
    return JSONResponse(info, status_code=201 if created else 200)


async def unregister_endpoint(request: Request) -> Response:
    session = await session_of(request)
    removed = await session.client.unregister_endpoint(request.path_params["subject"])
    return JSONResponse({"removed": removed})


async def inbox(request: Request) -> Response:
    session = await session_of(request)
    limit = int(query_number(request, "limit", INBOX_WINDOW, 1, INBOX_WINDOW))
    wait = query_number(request, "wait", 0.0, 0.0, MAX_WAIT_S)
    held = await session.read(validate(request.path_params["subject"]), limit, wait)
    return JSONResponse({"messages": [_shown(m) for m in held]})


def _shown(message: AsyncMessage) -> dict[str, Any]:
    """A held message: its envelope, its endpoint (hash) and which hand-out it is."""
    return {
        **message.envelope.to_wire(),
        "endpoint": message.endpoint,
        "deliveries": message.deliveries,
    }


async def pending(request: Request) -> Response:
    session = await session_of(request)
    return JSONResponse({"items": await session.client.pending(request.path_params["subject"])})


def _held(session: IdentityConnection, message_id: str, endpoint: str | None) -> AsyncMessage:
    check_id(message_id, "message id")
    copies = session.held.find(message_id, endpoint or None, time.monotonic())
    if not copies:
        raise MessageNotFound(
            f"message {message_id} is not held for you by this gateway (read it from an "
            "endpoint's inbox first; an answered one is gone, and so is one whose ack "
            f"deadline of {session.held.ack_wait:g} s passed: it went to the next reader)"
        )
    if len(copies) > 1:
        raise InvalidMessage(
            f"message {message_id} is held for several endpoints; name one with 'endpoint'"
        )
    return copies[0]


async def _answer(request: Request, nack: bool) -> Response:
    """Ack or nack a held message: answered 200 once the router has applied it."""
    session = await session_of(request)
    body = await json_body(request)
    endpoint = request.query_params.get("endpoint") or field(body, "endpoint", str, required=False)
    reason = (field(body, "reason", str, required=False) or "nacked over HTTP") if nack else None
    message = _held(session, request.path_params["id"], endpoint)
    try:
        await session.answer(message, reason)
    except InvalidState as exc:
        raise InvalidState(
            f"message {message.id} is no longer held for you: {exc.message}"
        ) from None
    answer = {
        "id": message.id,
        "endpoint": message.endpoint,
        "answer": "nack" if nack else "ack",
        "state": "failed" if nack else "done",
        "deliveries": message.deliveries,
    }
    return JSONResponse({**answer, **({"reason": reason} if nack else {})})


async def ack(request: Request) -> Response:
    return await _answer(request, nack=False)


async def nack(request: Request) -> Response:
    return await _answer(request, nack=True)


async def requeue(request: Request) -> Response:
    """Operators: return a claimed, never-answered message to new/ (the router's requeue)."""
    session = await session_of(request)
    body = await json_body(request)
    message_id = check_id(request.path_params["id"], "message id")
    endpoint = field(body, "endpoint", str)
    await asyncio.to_thread(session.client.sync.requeue, message_id, endpoint)
    return JSONResponse({"id": message_id, "requeued": True})


# ---------------------------------------------------------------------- dead letters


async def dead_letters(request: Request) -> Response:
    session = await session_of(request)
    limit = int(query_number(request, "limit", 100, 1, 1000))
    items = await session.client.dead_letters(request.query_params.get("endpoint"), limit=limit)
    return JSONResponse({"items": items})


async def purge_dead_letters(request: Request) -> Response:
    session = await session_of(request)
    purged = await session.client.purge_dead_letters(request.query_params.get("endpoint"))
    return JSONResponse({"purged": purged})


async def requeue_dead_letter(request: Request) -> Response:
    """Operators: one message's dead letter back to its endpoint's new/, under its own
    id (the router's requeue_dead_letters); ``endpoint`` picks one of a fan-out's. A
    refusal (``ttl_expired``, ...) is the router's error."""
    session = await session_of(request)
    body = await json_body(request)
    message_id = check_id(request.path_params["id"], "message id")
    endpoint = field(body, "endpoint", str, required=False) or request.query_params.get("endpoint")
    answer = await session.client.requeue_dead_letters(endpoint, message_id=message_id)
    return JSONResponse(answer)


async def requeue_dead_letters(request: Request) -> Response:
    """Operators: up to ``limit`` dead letters of one endpoint, oldest first, after the
    id ``after``; the answer says whether more remain and the ``after`` to go on."""
    session = await session_of(request)
    query = request.query_params
    endpoint = query.get("endpoint")
    if not endpoint:
        raise invalid("query parameter 'endpoint' names the endpoint whose dead letters go back")
    after = query.get("after")
    answer = await session.client.requeue_dead_letters(
        endpoint,
        limit=int(query_number(request, "limit", 100, 1, 200)),  # broker/redrive.py
        after=check_id(after, "after") if after else None,
    )
    return JSONResponse(answer)


async def republish_dead_letter(request: Request) -> Response:
    """Publish a dead letter's payload again, as its sender (the router checks that this
    identity may send as it): a new message with a fresh budget and ``republishedFrom``
    set to the dead letter's id. It goes to the endpoint it failed in, or, for an
    ``_unroutable`` one (or one whose endpoint was unregistered since), to the subject it
    was published to. The dead letter stays until purged; `requeue_dead_letter` is the
    other way back: the same message, under its own id."""
    session = await session_of(request)
    body = await json_body(request)
    message_id = check_id(request.path_params["id"], "message id")
    endpoint = field(body, "endpoint", str, required=False) or request.query_params.get("endpoint")
    items = await session.client.dead_letters(endpoint, message_id=message_id)
    letter = items[0] if items else None
    if letter is None:
        raise MessageNotFound(f"no dead letter {message_id} you may see")
    envelope = letter.get("envelope") or {}
    if "payload" not in envelope:
        raise InvalidMessage(f"dead letter {message_id} has no readable envelope to republish")
    fields: dict[str, Any] = {
        "subject": letter["endpointSubject"] or letter["subject"],
        "from": letter["from"],
        "payload": envelope["payload"],
        "republishedFrom": message_id,
    }
    if envelope.get("replyTo") is not None:
        fields["replyTo"] = envelope["replyTo"]
    # The protocol's request: the SDK's publish has no republishedFrom. The client's
    # own deadline ends the future.
    raw = await asyncio.wrap_future(session.client.sync.send_request("publish", **fields))
    result = PublishResult.from_wire(raw)
    return JSONResponse(
        {"republished": message_id, "subject": fields["subject"], "result": result.to_wire()}
    )


# ---------------------------------------------------------------------- administration


async def trace(request: Request) -> Response:
    session = await session_of(request)
    found = await session.client.trace(check_id(request.path_params["id"], "id"))
    if not found["copies"]:  # none stored, or none this identity may see
        raise MessageNotFound(f"no copy of message {found['id']} that you may see")
    return JSONResponse(found)


async def list_rules(request: Request) -> Response:
    session = await session_of(request)
    return JSONResponse({"rules": [r.to_wire() for r in await session.client.list_rules()]})


async def add_rule(request: Request) -> Response:
    session = await session_of(request)
    rule = AccessRule.from_wire(await json_body(request))
    return JSONResponse((await session.client.add_rule(rule)).to_wire(), status_code=201)


async def remove_rule(request: Request) -> Response:
    session = await session_of(request)
    query = request.query_params
    if not query.get("from") or not query.get("to"):
        raise invalid("query parameters 'from' and 'to' name the rule to remove")
    return JSONResponse({"removed": await session.client.remove_rule(query["from"], query["to"])})


async def get_config(request: Request) -> Response:
    session = await session_of(request)
    return JSONResponse(await session.client.get_config())


async def patch_config(request: Request) -> Response:
    session = await session_of(request)
    partial = await json_body(request)
    return JSONResponse(await session.client.set_config(partial))


async def status(request: Request) -> Response:
    session = await session_of(request)
    return JSONResponse(await session.client.status())


# ---------------------------------------------------------------------- streams


async def stream(request: Request) -> Response:
    session = await session_of(request, token_in_query=True)
    query = request.query_params
    pattern = validate(query.get("pattern") or ">", wildcards=True)
    mode = query.get("mode", "observe")
    if mode not in MODES:
        raise invalid(f"mode must be one of {', '.join(MODES)}, got {mode!r:.40}")
    signals = query.get("signals", "true").lower() not in ("false", "0", "no")
    last_event_id = request.headers.get("last-event-id") or query.get("lastEventId")
    opened = await Stream(session, pattern).open(mode, signals, last_event_id)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        opened.events(request.app.state.keepalive), media_type="text/event-stream", headers=headers
    )


ROUTES = [
    Route("/api/publish", publish, methods=["POST"]),
    Route("/api/signals", send_signal, methods=["POST"]),
    Route("/api/endpoints", list_endpoints, methods=["GET"]),
    Route("/api/endpoints", register_endpoint, methods=["POST"]),
    Route("/api/endpoints/{subject}", unregister_endpoint, methods=["DELETE"]),
    Route("/api/endpoints/{subject}/inbox", inbox, methods=["GET"]),
    Route("/api/endpoints/{subject}/pending", pending, methods=["GET"]),
    Route("/api/messages/{id}/ack", ack, methods=["POST"]),
    Route("/api/messages/{id}/nack", nack, methods=["POST"]),
    Route("/api/messages/{id}/requeue", requeue, methods=["POST"]),
    Route("/api/dead-letters", dead_letters, methods=["GET"]),
    Route("/api/dead-letters", purge_dead_letters, methods=["DELETE"]),
    Route("/api/dead-letters/requeue", requeue_dead_letters, methods=["POST"]),
    Route("/api/dead-letters/{id}/requeue", requeue_dead_letter, methods=["POST"]),
    Route("/api/dead-letters/{id}/republish", republish_dead_letter, methods=["POST"]),
    Route("/api/trace/{id}", trace, methods=["GET"]),
    Route("/api/rules", list_rules, methods=["GET"]),
    Route("/api/rules", add_rule, methods=["POST"]),
    Route("/api/rules", remove_rule, methods=["DELETE"]),
    Route("/api/config", get_config, methods=["GET"]),
    Route("/api/config", patch_config, methods=["PATCH"]),
    Route("/api/status", status, methods=["GET"]),
    Route("/api/stream", stream, methods=["GET"]),
]
