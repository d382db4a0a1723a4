"""The internal router ⇄ writer protocol: encode and decode only.

Not public: both ends ship together. The router binds one ROUTER socket per shard
(``run/shard-<K>.sock``) and one PULL socket for results (``run/results.sock``); each
writer connects a DEALER to its shard socket and a PUSH to the results socket. The
router sends to the one peer of a shard socket that said ``hello`` there, so another
process connecting to it gets nothing and, leaving, is not taken for the writer
(broker/router/writer_links.py).

Router → writer, ``[kind, msgpack header]`` or ``[kind, header, data]``:

``deliver``  ``[kind, msgpack [[header, ...], [data, ...]]]``: every copy the router
             decided in one pass over its socket, for this shard, in one frame (one
             send, one wake-up and one ZeroMQ part, not one per copy). A header is
             ``[token, id, endpoint, subject, sender, created_at, target, reason, code,
             failed_at, relayed_from, parent_id]`` and its data the file bytes; target
             is ``new``, ``cur`` (stored claimed: the router picked a waiting consumer
             with credit for it, and pushes it when ``stored`` comes back) or
             ``failed`` (a dead letter, with the reason, code and time in its file).
             ``relayed_from``: for a copy relayed from another node (which JetStream
             may deliver again), that node's name, else null; the writer, the one
             place that orders every store of its shard, stores it only if the
             endpoint has no copy of this id; if it has one relayed from the same
             node, it answers ``already_stored``, and ``id_conflict`` if the copy it
             has came from elsewhere (one file per id in a mailbox).
             ``parent_id``: the envelope's parentId, for the index row (the writer
             does not parse the file it stores).
``claim``    ``[sub, id, endpoint, deliveries]``: claim for subscription ``sub``: move
             new/ → cur/ (``deliveries`` 0), or, for a message returned after
             ``deliveries`` hand-outs, rename it in cur/ with its new count.
``op``       ``[token, name, args]``: done, fail, requeue, redrive, purge, rebuild, watch,
             compact_remove; answered by a ``reply`` with the same token.

Writer → router:

``hello``    ``[shard, shards, pid]`` on the shard socket (the only message a writer
             sends there) each time it connects: at start, after a router restart.
``stored``   ``[[token, id, endpoint, stored_at | None, code | None, message | None,
             target], ...]`` one frame per group commit; target as sent, so that an
             answer the router no longer waits for still says where the file went.
``claimed``  ``[sub, id, endpoint, code | None, message | None, deliveries]`` + file
             bytes; ``deliveries`` counts this hand-out. A claim whose group commit
             then failed is answered ``storage_error`` and its file is where it was.
``ingested`` ``[id, endpoint]`` + file bytes: a file another program put into new/.
``reply``    ``[token, ok, result | {code, message}, shard]``; the shard says which of an
             operation's writers answered (one that answers after another went away
             still counts, docs/architecture.md).
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

ALREADY_STORED = "already_stored"  # a `stored` code: a relayed copy the endpoint has
ID_CONFLICT = "id_conflict"  # a `stored` code: the endpoint has this id from elsewhere


# The origin of a stored copy whose file cannot be read (gone: compacted meanwhile): no
# node is named "", and a copy of unknown origin is no redelivery (docs/federation.md).
ORIGIN_UNKNOWN = ""


def id_conflict(message_id: str, node: str, where: str, stored_from: str | None) -> str:
    """The sentence of an ``id_conflict``: ``where`` (an endpoint) holds a copy of
    ``message_id`` that came from ``stored_from`` (None: published there;
    ``ORIGIN_UNKNOWN``: its file cannot be read), not ``node``."""
    if stored_from == ORIGIN_UNKNOWN:
        source = "whose file cannot be read (its origin is unknown)"
    elif stored_from is None:
        source = "published there"
    else:
        source = f"relayed from node {stored_from}"
    return (
        f"message {message_id} from node {node} not stored: {where} has a copy of that id {source}"
    )


# ---------------------------------------------------------------------- the records
# Each packs as a msgpack array (a NamedTuple is a tuple): its fields, in order, are the
# positional form the module's docstring gives.


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
    # a relayed copy: the node it came from; not stored if the endpoint has this id
    relayed_from: str | None = None
    parent_id: str | None = None  # the envelope's parentId (a reply), for the index row


_new_tuple = tuple.__new__


def delivery_header(
    token: int,
    id: str,
    endpoint: str,
    subject: str,
    sender: str,
    created_at: int,
    target: str,
    reason: str | None,
    code: str | None,
    failed_at: int | None,
    relayed_from: str | None,
    parent_id: str | None,
) -> DeliveryHeader:
    """A `DeliveryHeader` of every field, built as the tuple it is: its NamedTuple
    ``__new__`` is Python code, which the router ran for each copy it stores (0.58
    against 0.13 µs a header)."""
    return _new_tuple(
        DeliveryHeader,
        (
            token,
            id,
            endpoint,
            subject,
            sender,
            created_at,
            target,
            reason,
            code,
            failed_at,
            relayed_from,
            parent_id,
        ),
    )


class ClaimOrder(NamedTuple):
    """``claim``: move new/ -> cur/ for subscription ``sub`` (``deliveries`` 0), or
    claim again in cur/ a message handed out ``deliveries`` times."""

    sub: int
    id: str
    endpoint: str
    deliveries: int = 0


class Op(NamedTuple):
    """``op``: an operation the writer answers with a `Reply` of the same token."""

    token: int
    name: str
    args: dict[str, Any]


class Hello(NamedTuple):
    shard: int
    shards: int
    pid: int


class Stored(NamedTuple):
    """One copy of a ``stored`` report: durable at ``stored_at``, or not (``code``)."""

    token: int
    id: str
    endpoint: str
    stored_at: int | None
    code: str | None
    message: str | None
    target: str  # as sent: an answer the router no longer waits for still says where

    def failed(self, code: str, message: str) -> Stored:
        return self._replace(stored_at=None, code=code, message=message)


class Claimed(NamedTuple):
    """A ``claimed`` report; the file's bytes travel in the frame after it."""

    sub: int
    id: str
    endpoint: str
    code: str | None = None
    message: str | None = None
    deliveries: int = 1  # this hand-out's number


class Ingested(NamedTuple):
    """A file another program put into new/; its bytes travel after it."""

    id: str
    endpoint: str


class Reply(NamedTuple):
    token: int
    ok: bool
    result: Any  # the result, or {code, message}
    shard: int  # the writer's


# ---------------------------------------------------------------------- the frames


def deliver(items: list[tuple[DeliveryHeader, bytes]]) -> list[bytes]:
    """One frame carrying many deliveries: (header, file bytes) pairs."""
    return [DELIVER, packb([[header for header, _ in items], [data for _, data in items]])]


def claim(sub: int, message_id: str, endpoint: str, deliveries: int = 0) -> list[bytes]:
    return [CLAIM, packb(ClaimOrder(sub, message_id, endpoint, deliveries))]


def op(token: int, name: str, **args: Any) -> list[bytes]:
    return [OP, packb(Op(token, name, args))]


def requeue(token: int, message_id: str, endpoint: str) -> list[bytes]:
    """Put a claimed message back in new/ (an ``op``)."""
    return op(token, "requeue", id=message_id, endpoint=endpoint)


def hello(shard: int, shards: int, pid: int) -> list[bytes]:
    return [HELLO, packb(Hello(shard, shards, pid))]


def stored(results: list[Stored]) -> list[bytes]:
    return [STORED, packb(results)]


def claimed(
    sub: int,
    message_id: str,
    endpoint: str,
    data: bytes,
    error: tuple[str, str] | None = None,
    deliveries: int = 1,
) -> list[bytes]:
    code, message = error or (None, None)
    header = Claimed(sub, message_id, endpoint, code, message, deliveries)
    return [CLAIMED, packb(header), data]


def ingested(message_id: str, endpoint: str, data: bytes) -> list[bytes]:
    return [INGESTED, packb(Ingested(message_id, endpoint)), data]


def reply(token: int, ok: bool, result: Any, shard: int) -> list[bytes]:
    return [REPLY, packb(Reply(token, ok, result, shard))]


# What each kind's header decodes into, both directions (``deliver`` aside).
_RECORDS: dict[bytes, Any] = {
    CLAIM: ClaimOrder,
    OP: Op,
    HELLO: Hello,
    CLAIMED: Claimed,
    INGESTED: Ingested,
    REPLY: Reply,
}


def decode(frames: list[bytes]) -> tuple[bytes, Any, bytes | None]:
    """Split a frame list into (kind, header record, data or None): a ``stored`` header
    is a list of `Stored`, every other kind's one record. A header of the wrong shape
    raises (TypeError, ValueError).

    For ``deliver`` use `decode_deliveries`."""
    kind = bytes(frames[0])
    if len(frames) < 2:
        raise ValueError(f"a {kind!r:.20} report without its header")
    raw = unpackb(frames[1])
    data = bytes(frames[2]) if len(frames) > 2 else None
    if kind == STORED:
        return kind, [Stored(*row) for row in raw], data
    record = _RECORDS.get(kind)
    return kind, (record(*raw) if record is not None else raw), data


def as_failed(frames: list[bytes], error: tuple[str, str]) -> list[bytes]:
    """A report of success turned into one of failure (``error``: code, message), for
    a writer whose index transaction did not commit after all."""
    kind, header, _data = decode(frames)
    if kind == STORED:
        return stored([s.failed(*error) if s.stored_at is not None else s for s in header])
    if kind == CLAIMED:
        return claimed(header.sub, header.id, header.endpoint, b"", error, header.deliveries)
    if kind == REPLY:
        failure = {"code": error[0], "message": error[1]}
        return reply(header.token, False, failure, header.shard)
    return frames


def decode_deliveries(frames: list[bytes]) -> list[tuple[DeliveryHeader, bytes]]:
    # Not wire.unpackb: its limits are the client protocol's, and a file may be larger
    # than any request (a payload's JSON can be longer than its msgpack).
    headers, datas = msgpack.unpackb(frames[1], raw=False)
    if len(headers) != len(datas):
        raise ValueError(f"{len(headers)} delivery headers for {len(datas)} files")
    return [(DeliveryHeader(*h), data) for h, data in zip(headers, datas, strict=True)]
