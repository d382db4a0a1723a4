"""A client's frame, from its bytes to the operations it asks for.

The frame is decoded (one request or a batch), its connection's rights looked up afresh
(auth.json may have changed since it was admitted), and each request run through the
table of operations (broker/router/operations.py): the operation's name, then the
identity it is judged by (the connection's, or the one it names in ``actingFor`` when
the connection may delegate: broker/delegation.py), then operator rights, then its
fields (a typed request), then the operation itself. Every answer,
error or not, joins the client's replies; a `WriterWork` goes to ``send_work`` (the
loop, which owns the writers' sockets).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from broker.delegation import ACTING_FOR, acting_identity
from broker.router.consumers import Session
from broker.router.context import DEFERRED, Context, WriterWork, now_ms
from broker.router.operations import OPERATIONS
from sdk import wire
from sdk.errors import InvalidState, NotAuthorized, RelayError, UnknownOperation

log = logging.getLogger("relay.router")

# Sends an operation's work to the writers; answers DEFERRED or raises (Unavailable).
SendWork = Callable[[Session, int, WriterWork], Any]


def client_frame(ctx: Context, frames: list[bytes], user: str | None, send_work: SendWork) -> int:
    """Handle one frame from a client; returns how many requests it held."""
    identity, body = frames[0], frames[1:]
    replies = ctx.replies
    try:
        requests = wire.decode_requests(body)
    except RelayError as exc:
        replies.add(identity, wire.error_body(wire.peek_rid(body), exc))
        return 1
    who = ctx.settings.auth.identity(user)
    if who is None:  # admitted once, revoked since (auth.json changed)
        ctx.consumers.end_session(identity)
        error = NotAuthorized(f"the credentials of this connection ({user}) are not admitted")
        for request in requests:
            replies.add(identity, wire.error_body(request.rid, error))
        return len(requests)
    session = ctx.consumers.touch(identity, now_ms(), user)
    session.who = who
    for request in requests:
        if ctx.consumers.sessions.get(identity) is not session:
            # `bye` (or a failed send) ended the session mid-batch: what follows
            # must not run on a detached session.
            ended = InvalidState("the session ended earlier in this batch")
            replies.add(identity, wire.error_body(request.rid, ended))
        elif isinstance(request, wire.BadRequest):
            replies.add(identity, wire.error_body(request.rid, request.error))
        else:
            _handle(ctx, session, request, send_work)
    return len(requests)


def _handle(ctx: Context, session: Session, request: wire.Request, send_work: SendWork) -> None:
    # A signal sent with "reply": false gets no answer, not even an error: a refusal
    # is only logged (docs/protocol.md, "signal").
    quiet = request.op == "signal" and request.get("reply") is False
    try:
        result = _run(ctx, session, request, send_work)
    except RelayError as exc:
        error = exc
    except Exception as exc:  # a bug here must cost one reply, not the router
        log.exception("operation %s failed", request.op)
        error = RelayError(f"internal error: {exc}")
    else:
        if result is not DEFERRED and not quiet:
            ctx.replies.add(session.identity, wire.ok_body(request.rid, result))
        return
    if quiet:
        log.debug("%s without reply refused: %s %s", request.op, error.code, error.message)
    else:
        ctx.replies.add(session.identity, wire.error_body(request.rid, error))


def _run(ctx: Context, session: Session, request: wire.Request, send_work: SendWork) -> Any:
    operation = OPERATIONS.get(request.op)
    if operation is None:
        raise UnknownOperation(f"unknown operation {request.op!r:.60}")
    own, named = session.who, request.body.get(ACTING_FOR)
    if named is not None:  # for this request only: the operations judge `session.who`
        session.who, session.acting = acting_identity(
            ctx.settings.auth, session.user, named, now_ms()
        )
    try:
        who = session.who
        if operation.admin and not (who and who.admin):
            name = who.name if who else session.user
            raise NotAuthorized(f"{request.op!r} needs operator rights; {name} has none")
        result = operation.run(ctx, session, operation.decode(request.body), request.rid)
        if isinstance(result, WriterWork):
            return send_work(session, request.rid, result)
        return result
    finally:
        session.who, session.acting = own, None
