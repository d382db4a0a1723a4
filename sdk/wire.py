"""The client protocol, frame by frame: encode and decode only, no I/O.

See docs/protocol.md for the specification this module implements. A request is two
ZeroMQ frames, ``[MAGIC, msgpack map]``; a reply is ``[MAGIC, msgpack map]``; a pushed
message is ``[MAGIC, msgpack map, stored message bytes]``. A client may put up to
`MAX_BATCH` requests in one frame as a msgpack array of maps; one that says
``batch: true`` on ``hello`` (and on its pings) gets its replies batched the same way:
one frame, and one trip through ZeroMQ, for many messages. The router decodes with
`decode_requests`, which never raises anything but a `RelayError` subclass, so one
malformed frame costs one error reply and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from sdk.errors import InvalidMessage, MalformedFrame, RelayError, UnsupportedVersion, from_code

PROTOCOL_VERSION = 1
MAGIC = b"RLY1"
MAGIC_PREFIX = b"RLY"
# The largest request body the router decodes. Payloads have their own, lower limit
# (config limits.maxPayloadBytes, 1 MiB by default); this bound stops a client from
# making the router unpack arbitrarily large or deep structures.
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_BATCH = 1024  # requests (or replies) in one batch frame
BATCH_BYTES = 4 * 1024 * 1024  # a batch frame's size, well under MAX_BODY_BYTES
_UNPACK_LIMITS = {
    "max_str_len": MAX_BODY_BYTES,
    "max_bin_len": MAX_BODY_BYTES,
    "max_array_len": 1_000_000,
    "max_map_len": 100_000,
}

OPERATIONS = frozenset(
    {
        "hello",
        "ping",
        "bye",
        "fetch",
        "in_progress",
        "publish",
        "ingest",
        "relay_take",
        "relayed",
        "remote_endpoints",
        "register",
        "unregister",
        "endpoints",
        "subscribe",
        "unsubscribe",
        "ack",
        "nack",
        "signal",
        "dead_letters",
        "purge_dead_letters",
        "requeue_dead_letters",
        "compact_remove",
        "pending",
        "complete",
        "fail",
        "requeue",
        "add_rule",
        "remove_rule",
        "list_rules",
        "get_config",
        "set_config",
        "status",
        "trace",
        "rebuild_index",
    }
)


# Not frozen, and its own __init__: one is made per request, and a dataclass's generated
# __init__ runs as Python even in the compiled build (a frozen one slower still), where
# this one is compiled (docs/performance.md, "The last interpreted calls on the handler path").
@dataclass(slots=True, init=False)
class Request:
    op: str
    rid: int
    body: dict[str, Any]

    def __init__(self, op: str, rid: int, body: dict[str, Any]) -> None:
        self.op = op
        self.rid = rid
        self.body = body

    def get(self, name: str, default: Any = None) -> Any:
        return self.body.get(name, default)


@dataclass(frozen=True, slots=True)
class Reply:
    rid: int
    ok: bool
    result: Any = None
    error: RelayError | None = None


@dataclass(frozen=True, slots=True)
class Push:
    """A message the router pushes to a subscription: header fields plus the file bytes."""

    sub: int
    id: str
    endpoint: str
    data: bytes
    deliveries: int = 1  # which hand-out this is: 1 the first time


def packb(obj: Any) -> bytes:
    # A Packer of its own per call (one shared would not be thread-safe), with a small
    # first buffer: `msgpack.packb`'s allocates 256 KiB, a third of a small body's cost
    # (0.74 -> 0.45 us a reply); a larger body grows it as packb's would. buf_size is
    # msgpack 1.1's (pyproject.toml).
    return msgpack.Packer(use_bin_type=True, buf_size=256).pack(obj)


# msgpack bounds each length by the body's own size when given no limits (a map's by
# half of it); below this size those bounds are within every one of _UNPACK_LIMITS, and
# passing the limits as keywords costs a third of a small body's decode (strict_map_key
# is msgpack's default either way).
_LIMITS_NEEDED_FROM = min(
    _UNPACK_LIMITS["max_str_len"],
    _UNPACK_LIMITS["max_bin_len"],
    _UNPACK_LIMITS["max_array_len"],
    2 * _UNPACK_LIMITS["max_map_len"],
)


def unpackb(data: bytes) -> Any:
    if len(data) < _LIMITS_NEEDED_FROM:
        return msgpack.unpackb(data, raw=False)
    return msgpack.unpackb(data, raw=False, strict_map_key=True, **_UNPACK_LIMITS)


# What msgpack raises for a value it cannot encode: TypeError (an object, a set),
# OverflowError (an int beyond 64 bits), ValueError (a cycle: "recursion limit exceeded").
_PACK_ERRORS = (TypeError, ValueError, OverflowError)


def encode_request(op: str, rid: int, **fields: Any) -> list[bytes]:
    """The frames of a request; `InvalidMessage` naming the part of ``fields`` msgpack
    cannot encode (an object, a set, an int beyond 64 bits). Every SDK request is
    encoded here, before anything is queued, so a bad value costs only its call."""
    try:
        return [MAGIC, packb({"op": op, "rid": rid, **fields})]
    except _PACK_ERRORS as exc:
        where = _unencodable(fields, f"{op} request")
        raise InvalidMessage(
            f"{where} cannot be encoded: {exc}; values must be maps, lists, strings, "
            "bytes, numbers (ints of at most 64 bits), booleans or None"
        ) from None


_MAX_PATH_DEPTH = 10  # how deep the path in an error goes (a cyclic value has no end)


def _unencodable(value: Any, path: str, depth: int = 0) -> str:
    """The path (``publish request['payload']['x']``) to the first part of ``value`` that
    msgpack cannot encode; only ever walked once encoding has failed."""
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return path
    for key, item in items:
        if depth < _MAX_PATH_DEPTH and not _encodes(item):
            return _unencodable(item, f"{path}[{key!r}]", depth + 1)
    return path


def _encodes(value: Any) -> bool:
    try:
        packb(value)
    except _PACK_ERRORS:
        return False
    return True


def _check_magic(frame: bytes) -> None:
    if frame == MAGIC:
        return
    if frame.startswith(MAGIC_PREFIX):
        raise UnsupportedVersion(
            f"protocol {frame[len(MAGIC_PREFIX) :]!r:.20} is not supported; "
            f"this broker speaks {MAGIC!r}"
        )
    raise MalformedFrame(f"first frame must be {MAGIC!r}, got {frame[:16]!r}")


@dataclass(frozen=True, slots=True)
class BadRequest:
    """An item of a batch that is not a request: answered with ``error`` under ``rid``."""

    rid: int
    error: RelayError


def decode_request(frames: Sequence[bytes]) -> Request:
    """Parse a client request; raise a RelayError naming what is wrong with it."""
    return request_of(_decode_body(frames))


def decode_requests(frames: Sequence[bytes]) -> list[Request | BadRequest]:
    """Parse a request frame holding one request or a batch of them. A broken frame
    raises; a broken item of a good batch is a `BadRequest` among the others."""
    body = _decode_body(frames)
    if not isinstance(body, list):
        return [request_of(body)]
    if not 0 < len(body) <= MAX_BATCH:
        raise MalformedFrame(f"a batch holds 1 to {MAX_BATCH} requests, got {len(body)}")
    requests: list[Request | BadRequest] = []
    for item in body:
        rid = _rid_of(item)  # before request_of takes the map apart
        try:
            requests.append(request_of(item))
        except RelayError as exc:
            requests.append(BadRequest(rid, exc))
    return requests


def _decode_body(frames: Sequence[bytes]) -> Any:
    if len(frames) != 2:
        raise MalformedFrame(f"a request has 2 frames, got {len(frames)}")
    _check_magic(frames[0])
    if len(frames[1]) > MAX_BODY_BYTES:
        raise MalformedFrame(
            f"request body of {len(frames[1])} bytes exceeds the {MAX_BODY_BYTES} byte limit"
        )
    try:
        return unpackb(frames[1])
    except Exception as exc:  # msgpack raises many unrelated types on bad input
        raise MalformedFrame(f"request body is not valid msgpack: {exc}") from None


def request_of(body: Any) -> Request:
    if not isinstance(body, dict):
        raise MalformedFrame(f"request body must be a map, got {type(body).__name__}")
    rid = body.pop("rid", None)
    if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < 2**63:
        raise MalformedFrame(f"request field 'rid' must be a non-negative int, got {rid!r:.40}")
    op = body.pop("op", None)
    if not isinstance(op, str):
        raise MalformedFrame(f"request field 'op' must be a string, got {op!r:.40}")
    return Request(op=op, rid=rid, body=body)


def peek_rid(frames: Sequence[bytes]) -> int:
    """Best-effort request id of a request that failed to decode (0 when unknown)."""
    try:
        return _rid_of(unpackb(frames[1]))
    except Exception:
        return 0


def _rid_of(body: Any) -> int:
    rid = body.get("rid", 0) if isinstance(body, dict) else 0
    return rid if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < 2**63 else 0


def ok_body(rid: int, result: Any = None) -> bytes:
    return packb({"rid": rid, "ok": True, "result": result})


def error_body(rid: int, error: RelayError) -> bytes:
    return packb({"rid": rid, "ok": False, "error": error.to_wire()})


def encode_ok(rid: int, result: Any = None) -> list[bytes]:
    return [MAGIC, ok_body(rid, result)]


def encode_error(rid: int, error: RelayError) -> list[bytes]:
    return [MAGIC, error_body(rid, error)]


def chunks(sizes: Sequence[int], limit: int = MAX_BATCH) -> Iterator[range]:
    """Index ranges of at most ``limit`` items and about `BATCH_BYTES` each (one larger
    item goes alone), for cutting a queue of packed bodies into batch frames."""
    start, size = 0, 0
    for i, n in enumerate(sizes):
        if i > start and (i - start >= limit or size + n > BATCH_BYTES):
            yield range(start, i)
            start, size = i, 0
        size += n
    if start < len(sizes):
        yield range(start, len(sizes))


def frames(bodies: Sequence[bytes], limit: int = MAX_BATCH) -> Iterator[tuple[range, bytes]]:
    """The body frames that carry ``bodies`` in order: a lone body as itself, runs of
    them as batches (see `chunks`); each with the indices of the bodies it holds."""
    for part in chunks([len(b) for b in bodies], limit):
        run = bodies[part.start : part.stop]
        yield part, run[0] if len(run) == 1 else batch(run)


def batch(bodies: Sequence[bytes]) -> bytes:
    """One frame holding already-packed maps as a msgpack array: no re-encoding."""
    n = len(bodies)
    if n < 16:
        header = bytes((0x90 | n,))
    elif n < 2**16:
        header = b"\xdc" + n.to_bytes(2, "big")
    else:
        header = b"\xdd" + n.to_bytes(4, "big")
    return header + b"".join(bodies)


def encode_push(
    sub: int, message_id: str, endpoint: str, data: bytes, deliveries: int | None = None
) -> list[bytes]:
    """A pushed message; ``deliveries`` for a consumer's (an observer's has none)."""
    header = {"push": "message", "sub": sub, "id": message_id, "endpoint": endpoint}
    if deliveries is not None:
        header["deliveries"] = deliveries
    return [MAGIC, packb(header), data]


def decode_incoming(frames: Sequence[bytes]) -> Reply | Push:
    """Parse what a client receives from the router: a reply or a pushed message."""
    incoming = decode_incoming_all(frames)
    if len(incoming) != 1:
        raise MalformedFrame(f"expected one reply, got a batch of {len(incoming)}")
    return incoming[0]


def decode_incoming_all(frames: Sequence[bytes]) -> list[Reply | Push]:
    """What a client receives: a reply, a pushed message, or a batch of replies."""
    if len(frames) not in (2, 3):
        raise MalformedFrame(f"expected 2 or 3 frames from the broker, got {len(frames)}")
    _check_magic(frames[0])
    try:
        header = unpackb(frames[1])
    except Exception as exc:
        raise MalformedFrame(f"broker frame is not valid msgpack: {exc}") from None
    if isinstance(header, list) and len(frames) == 2:
        return [_reply_of(item) for item in header]
    if not isinstance(header, dict):
        raise MalformedFrame("broker frame must be a map")
    if header.get("push") == "message" and len(frames) == 3:
        deliveries = header.get("deliveries", 1)
        return [Push(header["sub"], header["id"], header["endpoint"], frames[2], deliveries)]
    return [_reply_of(header)]


def _reply_of(header: Any) -> Reply:
    if not isinstance(header, dict):
        raise MalformedFrame("a reply must be a map")
    if header.get("ok"):
        return Reply(rid=header["rid"], ok=True, result=header.get("result"))
    err = header.get("error") or {}
    error = from_code(str(err.get("code", "internal")), str(err.get("message", "")))
    return Reply(rid=header.get("rid", 0), ok=False, error=error)


# Signals travel on the signals socket (XPUB) in two forms, each two frames, and a
# subscriber chooses by the topic it subscribes to:
# - one signal: the subject (the ZeroMQ topic) and the msgpack signal map. Version 1's
#   form: subscribe to the literal prefix of your pattern, then match exactly.
# - a run: ``+`` and the subject, then a msgpack array of the signal maps sent on that
#   subject, oldest first. Subscribe to ``+`` and the literal prefix. The router puts the
#   signals of one pass that follow each other on one subject in one run: under load
#   that is one ZeroMQ message, and one wake-up of each subscriber, for many signals.
# The router sends the first form only while a subscription that wants it exists.

SIGNAL_RUN = b"+"  # topic prefix of runs; no subject starts with it
MAX_SIGNALS_PER_RUN = 1024


def encode_signal(subject: str, body: bytes) -> list[bytes]:
    """One signal, its map already packed."""
    return [subject.encode(), body]


def encode_signal_run(subject: str, bodies: Sequence[bytes]) -> list[bytes]:
    """A run of signals on one subject, their maps already packed (no re-encoding)."""
    return [SIGNAL_RUN + subject.encode(), batch(bodies)]


def decode_signals(frames: Sequence[bytes]) -> tuple[str, list[Any]]:
    """The subject and the signal maps of a message in either form (an item may be
    anything; the caller validates each, so one bad item costs only itself)."""
    if len(frames) != 2:
        raise MalformedFrame(f"a signal message has 2 frames, got {len(frames)}")
    topic = bytes(frames[0])
    try:
        body = unpackb(frames[1])
        if not topic.startswith(SIGNAL_RUN):
            return topic.decode(), [body]
        subject = topic[len(SIGNAL_RUN) :].decode()
    except Exception:  # msgpack raises many unrelated types on bad input
        raise MalformedFrame("a signal message is a UTF-8 subject and msgpack") from None
    if not isinstance(body, list):
        raise MalformedFrame("a run of signals must be an array")
    return subject, body
