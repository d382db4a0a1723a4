"""The writer's claims: from new/, or again in cur/ for a message handed out before
(its count in the name), and a claim whose group commit fails its index transaction
goes back where it was, so it is never left claimed for nobody."""

from __future__ import annotations

import os
import time

import apsw
import zmq

from sdk.ids import new_id
from sdk.subjects import endpoint_hash
from workers import protocol as proto
from workers.filenames import parse_name
from workers.writer import Writer

SUBJECT = "relay.agent.c.box"
ENDPOINT = endpoint_hash(SUBJECT)


def stored(writer: Writer, results: zmq.Socket) -> str:
    message_id = new_id(int(time.time() * 1000))
    header = proto.DeliveryHeader(1, message_id, ENDPOINT, SUBJECT, "relay.agent.c.x", 0)
    writer._process([proto.deliver([(header, b'{"id": "x"}')])])
    assert next_report(results, proto.STORED)
    return message_id


def next_report(results: zmq.Socket, kind: bytes) -> tuple:
    while True:
        frames = results.recv_multipart()  # RCVTIMEO bounds the wait
        if frames[0] == kind:
            return proto.decode(frames)[1]


def claim(writer: Writer, results: zmq.Socket, message_id: str, before: int) -> proto.Claimed:
    writer._process([proto.claim(7, message_id, ENDPOINT, before)])
    return next_report(results, proto.CLAIMED)


def cur_names(writer: Writer) -> list[str]:
    return os.listdir(writer.mailboxes[ENDPOINT].cur_dir)


def test_a_claim_again_renames_the_file_with_its_count(shard_writer):
    writer, results = shard_writer
    message_id = stored(writer, results)
    assert claim(writer, results, message_id, 0).deliveries == 1
    again = claim(writer, results, message_id, 1)
    assert (again.code, again.deliveries) == (None, 2)
    (name,) = cur_names(writer)
    assert parse_name(name).deliveries == 2
    (row,) = writer.index.get(message_id)
    assert (row.state.value, row.deliveries) == ("claimed", 2)


def test_a_claim_whose_commit_fails_goes_back_to_where_it_was(shard_writer, tmp_path):
    writer, results = shard_writer
    first, second = stored(writer, results), stored(writer, results)
    assert claim(writer, results, second, 0).code is None
    held = cur_names(writer)
    # Another connection holds the index's write lock: the commit fails.
    writer.index._conn.setbusytimeout(50)
    blocker = apsw.Connection(str(writer.home.index_db(0)))
    blocker.execute("BEGIN IMMEDIATE")
    try:
        failed = claim(writer, results, first, 0)
        failed_again = claim(writer, results, second, 1)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert failed.code == failed_again.code == "storage_error"
    assert writer.mailboxes[ENDPOINT].list_new() == [first]  # back in new/
    assert cur_names(writer) == held  # its earlier name, count and all
