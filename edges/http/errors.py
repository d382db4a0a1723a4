"""Relay's error codes as HTTP answers: one table, one JSON shape.

A refusal over HTTP carries the same stable code as over the ZeroMQ protocol
(sdk/errors.py, docs/protocol.md "Errors"), in the body ``{"error": {"code", "message"}}``,
with the HTTP status that fits it. A code missing from the table (a newer router's)
answers 500 with its code intact, so a client can still tell what happened.
"""

from __future__ import annotations

from typing import Any

from sdk.errors import RelayError

# code -> HTTP status. Keep in step with docs/http.md ("Errors").
STATUS_BY_CODE: dict[str, int] = {
    "invalid_subject": 400,
    "invalid_message": 400,
    "malformed_frame": 400,
    "unsupported_version": 400,
    "invalid_config": 400,
    "not_authorized": 403,  # 401 instead when the request carried no usable credentials
    "access_denied": 403,
    "sender_not_allowed": 403,
    "not_found": 404,
    "endpoint_not_found": 404,
    "message_not_found": 404,
    "unknown_operation": 404,
    "already_claimed": 409,
    "invalid_state": 409,
    "ttl_expired": 409,
    "payload_too_large": 413,
    "limit_exceeded": 429,
    "internal": 500,
    "storage_error": 507,
    "unavailable": 503,
    "timeout": 504,
}


def status_for(code: str) -> int:
    return STATUS_BY_CODE.get(code, 500)


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


class HttpError(RelayError):
    """A refusal the gateway itself makes (bad JSON, no token), with its Relay code and,
    where the table's status does not fit, its own (401 for missing credentials)."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status if status is not None else status_for(code)


def unauthenticated(message: str) -> HttpError:
    return HttpError("not_authorized", message, status=401)


def invalid(message: str) -> HttpError:
    return HttpError("invalid_message", message)
