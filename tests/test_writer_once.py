"""A copy relayed from another node (``once`` in its delivery header) is stored by the
writer only if its endpoint has no copy of that id: JetStream may deliver a message
again after the router stopped waiting for the first store (docs/federation.md), and
the writer, which orders every store of its shard, is where a second copy is caught."""

from __future__ import annotations

import json
import os
import time

import zmq

from sdk.ids import new_id
from sdk.subjects import endpoint_hash
from tests.test_faults import wait_for_stored
from workers import protocol as proto
from workers.writer import Writer

SUBJECT = "relay.agent.b.inbox"


def relayed(token: int, message_id: str, *, origin: str | None = "a") -> proto.DeliveryHeader:
    """A copy relayed from node ``origin`` (None: a local copy)."""
    return proto.DeliveryHeader(
        token,
        message_id,
        endpoint_hash(SUBJECT),
        SUBJECT,
        "relay.agent.a.x",
        0,
        relayed_from=origin,
    )


def file_of(header: proto.DeliveryHeader) -> bytes:
    """The file a router makes: a relayed copy says where it came from."""
    return json.dumps({"id": header.id, "relayedFrom": header.relayed_from}).encode()


def store(writer: Writer, results: zmq.Socket, *headers: proto.DeliveryHeader) -> list:
    writer._process([proto.deliver([(h, file_of(h)) for h in headers])])
    kind, rows, _ = proto.decode(wait_for_stored(results))
    assert kind == proto.STORED
    return [proto.Stored(*row) for row in rows]


def test_a_relayed_copy_already_claimed_is_not_stored_again(shard_writer):
    writer, results = shard_writer
    mailbox = writer._watch(endpoint_hash(SUBJECT))
    message_id = new_id(int(time.time() * 1000))
    (first,) = store(writer, results, relayed(1, message_id))
    assert first.stored_at is not None
    mailbox.claim(message_id, int(time.time() * 1000))  # a consumer holds it
    (again,) = store(writer, results, relayed(2, message_id))
    assert (again.stored_at, again.code) == (None, proto.ALREADY_STORED)
    assert mailbox.list_new() == []  # not offered a second time
    assert len(os.listdir(mailbox.cur_dir)) == 1


def test_two_relayed_copies_of_one_id_in_one_commit_store_one(shard_writer):
    writer, results = shard_writer
    mailbox = writer._watch(endpoint_hash(SUBJECT))
    message_id = new_id(int(time.time() * 1000))
    rows = store(writer, results, relayed(1, message_id), relayed(2, message_id))
    assert sorted(r.code or "stored" for r in rows) == [proto.ALREADY_STORED, "stored"]
    assert mailbox.list_new() == [message_id]
    assert writer.index.has(message_id, endpoint_hash(SUBJECT))


def test_a_local_copy_is_not_looked_up(shard_writer):
    """Ids a router made are new: only relayed copies pay for the lookup, and a local
    copy with a known id (never sent by a router) is stored as told."""
    writer, results = shard_writer
    message_id = new_id(int(time.time() * 1000))
    store(writer, results, relayed(1, message_id, origin=None))
    (again,) = store(writer, results, relayed(2, message_id, origin=None))
    assert again.stored_at is not None and again.code is None


def test_an_id_stored_from_one_node_is_refused_from_another_and_kept_from_the_first(
    shard_writer,
):
    """De-duplication is by (origin node, id): node c relaying an id a's copy has is
    no duplicate of it (it would hide a's message, or c's); the endpoint holds one file
    per id, so c's copy is refused ``id_conflict``, while a's again is already stored."""
    writer, results = shard_writer
    mailbox = writer._watch(endpoint_hash(SUBJECT))
    message_id = new_id(int(time.time() * 1000))
    (first,) = store(writer, results, relayed(1, message_id, origin="a"))
    assert first.stored_at is not None
    (other,) = store(writer, results, relayed(2, message_id, origin="c"))
    assert (other.stored_at, other.code) == (None, proto.ID_CONFLICT)
    assert "relayed from node a" in other.message
    (again,) = store(writer, results, relayed(3, message_id, origin="a"))
    assert (again.stored_at, again.code) == (None, proto.ALREADY_STORED)
    assert json.loads(mailbox.read(message_id)[1])["relayedFrom"] == "a"


def test_two_nodes_relaying_one_id_in_one_commit_store_the_first_only(shard_writer):
    writer, results = shard_writer
    mailbox = writer._watch(endpoint_hash(SUBJECT))
    message_id = new_id(int(time.time() * 1000))
    rows = store(writer, results, relayed(1, message_id, origin="c"), relayed(2, message_id))
    assert [(r.token, r.code) for r in sorted(rows)] == [(1, None), (2, proto.ID_CONFLICT)]
    assert json.loads(mailbox.read(message_id)[1])["relayedFrom"] == "c"


def test_an_id_whose_stored_file_cannot_be_read_is_refused_from_another_node(shard_writer):
    """The index has the id but its file is gone (compacted meanwhile): where the copy
    came from is unknown, so another node's copy is refused ``id_conflict``, never
    counted as delivered and silently dropped."""
    writer, results = shard_writer
    mailbox = writer._watch(endpoint_hash(SUBJECT))
    message_id = new_id(int(time.time() * 1000))
    (first,) = store(writer, results, relayed(1, message_id, origin="a"))
    assert first.stored_at is not None
    os.remove(os.path.join(mailbox.new_dir, message_id))
    (other,) = store(writer, results, relayed(2, message_id, origin="c"))
    assert (other.stored_at, other.code) == (None, proto.ID_CONFLICT)
    assert "cannot be read" in other.message
