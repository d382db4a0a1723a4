"""Relay's error taxonomy: one exception class per stable machine-readable code.

Every error that crosses the protocol edge is a reply ``{"code": ..., "message": ...}``;
`from_code` turns such a reply back into the same class on the client side, so a caller
can ``except InvalidSubject`` whether the check ran locally or in the router.
Codes never change once shipped; messages may, and carry the numbers involved
("payload 2.1 MiB exceeds the 1 MiB limit").
"""

from __future__ import annotations


class RelayError(Exception):
    """Base of every Relay error. ``code`` is stable; ``str(err)`` is for people."""

    code = "internal"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidSubject(RelayError):
    code = "invalid_subject"


class InvalidMessage(RelayError):
    """A message, envelope, signal, rule or request field is missing or of the wrong type."""

    code = "invalid_message"


class PayloadTooLarge(RelayError):
    code = "payload_too_large"


class MalformedFrame(RelayError):
    """The bytes on the wire are not a Relay request (bad framing, not msgpack, not a map)."""

    code = "malformed_frame"


class UnsupportedVersion(RelayError):
    code = "unsupported_version"


class UnknownOperation(RelayError):
    code = "unknown_operation"


class NotFound(RelayError):
    code = "not_found"


class EndpointNotFound(NotFound):
    code = "endpoint_not_found"


class MessageNotFound(NotFound):
    code = "message_not_found"


class AlreadyClaimed(RelayError):
    """Another claimer moved the message out of ``new/`` first."""

    code = "already_claimed"


class InvalidState(RelayError):
    """The operation does not apply to the message's current state (e.g. ack of a done one)."""

    code = "invalid_state"


class TtlExpired(InvalidState):
    """A message past its budget's TTL: a dead letter that would die again at once is
    not requeued (docs/protocol.md, "requeue_dead_letters")."""

    code = "ttl_expired"


class AccessDenied(RelayError):
    code = "access_denied"


class SenderNotAllowed(AccessDenied):
    """The connection's credentials (peer uid, CURVE key) do not cover this ``from``."""

    code = "sender_not_allowed"


class NotAuthorized(AccessDenied):
    """An operator operation (config, rules, purge, ...) from a non-admin identity; or,
    on the client side, a broker that refused our credentials at the handshake."""

    code = "not_authorized"


class LimitExceeded(RelayError):
    """A bounded resource is full: subscriptions per client, credit, in-flight requests."""

    code = "limit_exceeded"


class InvalidConfig(RelayError):
    code = "invalid_config"


class StorageError(RelayError):
    """A write, rename or index update failed (disk full, permission denied, ...)."""

    code = "storage_error"


class Unavailable(RelayError):
    """The broker (or a writer behind it) did not answer within the deadline."""

    code = "unavailable"


class Timeout(Unavailable):
    code = "timeout"


class Internal(RelayError):
    code = "internal"


def _with_subclasses(cls: type[RelayError]) -> list[type[RelayError]]:
    """``cls`` and its subclasses, depth first (a later one wins a shared code)."""
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_with_subclasses(sub))
    return found


ERROR_CLASSES: dict[str, type[RelayError]] = {cls.code: cls for cls in _with_subclasses(RelayError)}


def from_code(code: str, message: str) -> RelayError:
    """Rebuild the typed error a broker reply names; unknown codes keep their code."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return RelayError(message, code=code)
    return cls(message)
