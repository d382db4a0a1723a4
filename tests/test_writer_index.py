"""The rows a writer commits for its deliveries are the rows its Maildir says: the
writer builds them from the router's delivery headers (workers/writer.py `_deliver`),
a rebuild reads them from the files (workers/scan.py), and the two must agree field
for field, or a restart would change what the index answers."""

from __future__ import annotations

import time

from sdk.ids import new_id
from sdk.subjects import endpoint_hash
from tests.test_faults import wait_for_stored
from tests.test_index import envelope
from workers import protocol as proto
from workers.index import MessageIndex, rebuild_from_maildir
from workers.records import State

SUBJECT = "relay.agent.b.inbox"
SENDER = "relay.agent.a.x"


def test_the_rows_a_writer_commits_equal_a_rebuild_of_its_maildir(shard_writer, tmp_path):
    # Given a writer storing a copy into new/, one stored claimed, a reply, a dead letter
    writer, results = shard_writer
    endpoint = endpoint_hash(SUBJECT)
    writer._watch(endpoint)
    created = int(time.time() * 1000)
    first, claimed, reply, dead = (new_id(created) for _ in range(4))
    letter = {"reason": "no consumer took it", "code": "nack", "failedAt": created + 2}
    copies = [
        (proto.DeliveryHeader(1, first, endpoint, SUBJECT, SENDER, created), {}),
        (proto.DeliveryHeader(2, claimed, endpoint, SUBJECT, SENDER, created, "cur"), {}),
        (
            proto.DeliveryHeader(3, reply, endpoint, SUBJECT, SENDER, created, parent_id=first),
            {"parentId": first},
        ),
        (
            proto.DeliveryHeader(
                4,
                dead,
                endpoint,
                SUBJECT,
                SENDER,
                created,
                "failed",
                "no consumer took it",
                "nack",
                created + 2,
            ),
            {"deadLetter": letter | {"endpoint": endpoint}},
        ),
    ]
    frames = [(h, envelope(h.id, SUBJECT, SENDER, created, **extra)) for h, extra in copies]

    # When it stores them in one group commit
    writer._process([proto.deliver(frames)])
    kind, rows, _ = proto.decode(wait_for_stored(results))
    assert kind == proto.STORED and all(row.stored_at is not None for row in rows)

    # Then its index holds, field for field, what a rebuild from the Maildir reads
    kept = writer.index.all_records()
    assert {r.state for r in kept} == {State.NEW, State.CLAIMED, State.FAILED}
    rebuilt = MessageIndex(tmp_path / "rebuilt.db")
    try:
        assert rebuild_from_maildir(rebuilt, writer.home.mailboxes, [endpoint]) == 4
        assert rebuilt.all_records() == kept
    finally:
        rebuilt.close()
