"""The internal router ⇄ writer protocol: encode and decode only.

Not public: both ends ship together. The router binds one ROUTER socket per shard
(``run/shard-<K>.sock``) and one PULL socket for results (``run/results.sock``); each
writer connects a DEALER to its shard socket and a PUSH to the results socket. The
router sends to the one peer of a shard socket that said ``hello`` there, so another
process connecting to it gets nothing and, leaving, is not taken for the writer
(broker/writer_links.py).

Router → writer, ``[kind, msgpack header]`` or ``[kind, header, data]``:

``deliver``  ``[kind, msgpack [[header, ...], [data, ...]]]``: every copy the router
             decided in one pass over its socket, for this shard, in one frame (one
             send, one wake-up and one ZeroMQ part, not one per copy). A header is
             ``[token, id, endpoint, subject, sender, created_at, target, reason, code,
             failed_at]`` and its data the file bytes; target is ``new``, ``cur``
             (stored claimed: the router picked a waiting consumer with credit for it,
             and pushes it when ``stored`` comes back) or ``failed`` (a dead letter,
             with the reason, code and time in its file).
``claim``    ``[sub, id, endpoint]``: move new/ → cur/ for subscription ``sub``.
``op``       ``[token, name, args]``: done, fail, requeue, purge, rebuild, watch,
             compact_remove; answered by a ``reply`` with the same token.

Writer → router:

``hello``    ``[shard, shards, pid]`` on the shard socket (the only message a writer
             sends there) each time it connects: at start, after a router restart.
``stored``   ``[[token, id, endpoint, stored_at | None, code | None, message | None,
             target], ...]`` one frame per group commit; target as sent, so that an
             answer the router no longer waits for still says where the file went.
``claimed``  ``[sub, id, endpoint, code | None, message | None]`` + file bytes.
``ingested`` ``[id, endpoint]`` + file bytes: a file another program put into new/.
``reply``    ``[token, ok, result | {code, message}]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from sdk.wire import packb, unpackb

DELIVER = b"deliver"
CLAIM = b"claim"
OP = b"op"

HELLO = b"hello"
STORED = b"stored"
CLAIMED = b"claimed"
INGESTED = b"ingested"
REPLY = b"reply"

TARGET_NEW = "new"
TARGET_CUR = "cur"
TARGET_FAILED = "failed"


class DeliveryHeader(NamedTuple):
    """What a writer needs besides the file bytes to store and index one copy."""

    token: int
    id: str
    endpoint: str
    subject: str
    sender: str
    created_at: int
    target: str = TARGET_NEW  # new; cur (stored claimed); failed for a dead letter
    reason: str | None = None
    code: str | None = None
    failed_at: int | None = None


def deliver(items: list[tuple[DeliveryHeader, bytes]]) -> list[bytes]:
    """One frame carrying many deliveries: (header, file bytes) pairs."""
    # A NamedTuple packs as a msgpack array already.
    return [DELIVER, packb([[header for header, _ in items], [data for _, data in items]])]


def claim(sub: int, message_id: str, endpoint: str) -> list[bytes]:
    return [CLAIM, packb([sub, message_id, endpoint])]


def op(token: int, name: str, **args: Any) -> list[bytes]:
    return [OP, packb([token, name, args])]


def requeue(token: int, message_id: str, endpoint: str) -> list[bytes]:
    """Put a claimed message back in new/ (an ``op``)."""
    return op(token, "requeue", id=message_id, endpoint=endpoint)


def hello(shard: int, shards: int, pid: int) -> list[bytes]:
    return [HELLO, packb([shard, shards, pid])]


def stored(results: list[list[Any]]) -> list[bytes]:
    return [STORED, packb(results)]


def claimed(
    sub: int, message_id: str, endpoint: str, data: bytes, error: tuple[str, str] | None = None
) -> list[bytes]:
    code, message = error or (None, None)
    return [CLAIMED, packb([sub, message_id, endpoint, code, message]), data]


def ingested(message_id: str, endpoint: str, data: bytes) -> list[bytes]:
    return [INGESTED, packb([message_id, endpoint]), data]


def reply(token: int, ok: bool, result: Any) -> list[bytes]:
    return [REPLY, packb([token, ok, result])]


def decode(frames: list[bytes]) -> tuple[bytes, Any, bytes | None]:
    """Split a frame list into (kind, decoded header, data or None).

    For ``deliver`` use `decode_deliveries`."""
    kind = bytes(frames[0])
    header = unpackb(frames[1]) if len(frames) > 1 else None
    data = bytes(frames[2]) if len(frames) > 2 else None
    return kind, header, data


def decode_deliveries(frames: list[bytes]) -> list[tuple[DeliveryHeader, bytes]]:
    # Not wire.unpackb: its limits are the client protocol's, and a file may be larger
    # than any request (a payload's JSON can be longer than its msgpack).
    headers, datas = msgpack.unpackb(frames[1], raw=False)
    if len(headers) != len(datas):
        raise ValueError(f"{len(headers)} delivery headers for {len(datas)} files")
    return [(DeliveryHeader(*h), data) for h, data in zip(headers, datas, strict=True)]
