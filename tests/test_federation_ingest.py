"""The far node's side of federation (docs/federation.md), through real processes: a
bridge is an SDK client that hands in messages relayed from another node with
``ingest``; they keep their id, are stored at most once per endpoint however often
JetStream redelivers them, carry their budget on, and only the senders an origin node
may relay get in."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

from sdk.errors import SenderNotAllowed
from sdk.ids import new_id
from sdk.subjects import endpoint_hash, reply_inbox
from sdk.types import Budget, Envelope, default_budget
from tests.harness import depth, wait_for, write_auth

pytestmark = pytest.mark.integration

INBOX = "relay.agent.b.inbox"
SENDER = "relay.agent.a.sender"


def relayed(*, sender: str = SENDER, budget: Budget | None = None, **fields) -> Envelope:
    """An envelope as the origin node's router made it."""
    now = int(time.time() * 1000)
    return Envelope(
        id=new_id(),
        subject=INBOX,
        sender=sender,
        reply_to=fields.get("reply_to"),
        budget=budget or default_budget(now),
        created_at=now,
        payload=fields.get("payload", {"content": "from a"}),
    )


def test_an_ingested_message_keeps_its_id_and_is_stored_once_however_often_it_comes(broker):
    client = broker.client()
    client.register_endpoint(INBOX)
    envelope = relayed()
    first = client.ingest(envelope, [INBOX], node="a")
    again = client.ingest(envelope, [INBOX], node="a")  # a JetStream redelivery
    assert (first.message_id, first.delivered_to, first.rejected) == (envelope.id, 1, ())
    assert (again.message_id, again.delivered_to, again.rejected) == (envelope.id, 1, ())
    assert depth(client, INBOX) == 1
    got: list[Envelope] = []
    client.subscribe(INBOX, got.append)
    wait_for(lambda: got, what="the relayed message")
    assert got[0].id == envelope.id and got[0].sender == SENDER
    assert got[0].payload == {"content": "from a"}


def test_a_second_node_relaying_an_id_stored_here_is_refused_clearly_not_counted(broker):
    """De-duplication is by (origin node, id): an id stored from node a, relayed again
    by node c, is no redelivery; one mailbox holds one file per id, so c's copy is
    refused ``id_conflict`` (the bridge terms it and says so), and a's copy stays."""
    client = broker.client()
    client.register_endpoint(INBOX)
    envelope = relayed()
    assert client.ingest(envelope, [INBOX], node="a").delivered_to == 1
    other = replace(envelope, payload={"content": "from c"})
    refused = client.ingest(other, [INBOX], node="c")
    assert (refused.delivered_to, refused.rejected) == (0, ((endpoint_hash(INBOX), "id_conflict"),))
    again = client.ingest(envelope, [INBOX], node="a")  # a's own redelivery: a duplicate
    assert (again.delivered_to, again.rejected) == (1, ())
    (held,) = client.fetch(INBOX, wait=5)
    assert (held.envelope.payload, held.envelope.relayed_from) == ({"content": "from a"}, "a")


def test_an_ingest_advances_the_budget_it_travelled_with(broker):
    client = broker.client()
    client.register_endpoint(INBOX)
    now = int(time.time() * 1000)
    envelope = relayed(budget=default_budget(now, hop_count=2, ancestor_chain=["relay.x.y"]))
    client.ingest(envelope, [INBOX], node="a")
    got: list[Envelope] = []
    client.subscribe(INBOX, got.append)
    wait_for(lambda: got, what="the relayed message")
    assert got[0].budget.hop_count == 3
    assert got[0].budget.ancestor_chain == ("relay.x.y", INBOX)
    assert got[0].budget.call_budget_remaining == 9


@pytest.mark.parametrize(
    "overrides, code",
    [
        ({"hop_count": 5}, "hop_limit"),
        ({"ancestor_chain": [INBOX]}, "cycle_detected"),  # a loop back across hosts
        ({"call_budget_remaining": 0}, "budget_exhausted"),
    ],
    ids=["hops", "cycle", "calls"],
)
def test_a_spent_budget_from_another_node_is_a_dead_letter_here(broker, overrides, code):
    client = broker.client()
    client.register_endpoint(INBOX)
    now = int(time.time() * 1000)
    envelope = relayed(budget=default_budget(now, **overrides))
    result = client.ingest(envelope, [INBOX], node="a")
    assert result.delivered_to == 0
    assert result.rejected == ((endpoint_hash(INBOX), "budget_exceeded"),)
    letters = client.dead_letters(endpoint_hash(INBOX))
    assert [(d["id"], d["code"]) for d in letters] == [(envelope.id, code)]
    client.ingest(envelope, [INBOX], node="a")  # redelivered: settled, not stored twice
    assert len(client.dead_letters(endpoint_hash(INBOX))) == 1


def test_an_ingest_for_an_endpoint_gone_here_is_one_no_match_dead_letter(broker):
    client = broker.client()
    envelope = relayed()
    first = client.ingest(envelope, [INBOX], node="a")
    assert first.rejected == (("*", "no_match"),)
    again = client.ingest(envelope, [INBOX], node="a")
    assert (again.delivered_to, again.rejected) == (0, ())
    assert [d["id"] for d in client.dead_letters("_unroutable")] == [envelope.id]


def test_only_the_endpoints_named_are_reached_not_every_match(broker):
    client = broker.client()
    client.register_endpoint(INBOX)
    client.register_endpoint("relay.agent.b.private")
    result = client.ingest(relayed(), [INBOX], node="a")
    assert result.delivered_to == 1
    assert depth(client, "relay.agent.b.private") == 0


def test_a_bridge_relays_only_the_senders_its_origin_node_may_speak_for(broker):
    client = broker.client()
    client.register_endpoint(INBOX)
    bridge = {"senders": [">"], "admin": True, "relays": {"a": ["relay.agent.a.>"]}}
    write_auth(broker.home, {"uids": {str(os.getuid()): bridge}})

    def refused(envelope: Envelope, node: str) -> bool:
        try:
            client.ingest(envelope, [INBOX], node=node)
        except SenderNotAllowed:
            return True
        return False

    wait_for(lambda: refused(relayed(), "c"), 10, what="auth.json to apply")
    assert refused(relayed(sender="relay.agent.b.someone"), "a")  # a speaking for b
    assert refused(relayed(reply_to="relay.agent.b.someone"), "a")
    assert refused(relayed(reply_to=reply_inbox("relay.agent.b.someone", "0a1b")), "a")
    assert client.ingest(relayed(), [INBOX], node="a").delivered_to == 1
    # a request's reply inbox is its sender's (sdk/replies.py): a relays it for a's agent
    request = relayed(reply_to=reply_inbox(SENDER, "0a1b"))
    assert client.ingest(request, [INBOX], node="a").delivered_to == 1
    assert depth(client, INBOX) == 2


def test_an_ingest_is_unavailable_while_the_endpoints_writer_is_down(broker):
    client = broker.client()
    client.register_endpoint(INBOX)
    shard = int(endpoint_hash(INBOX), 16) % broker.shards
    broker.kill(f"writer{shard}")
    envelope = relayed()
    wait_for(lambda: _unavailable(client, envelope), 10, what="the router to see the writer gone")
    broker.start_writer(shard)
    wait_for(lambda: not _unavailable(client, envelope), 20, what="the writer to come back")
    assert client.ingest(envelope, [INBOX], node="a").delivered_to == 1
    assert depth(client, INBOX) == 1


def _unavailable(client, envelope: Envelope) -> bool:
    from sdk.errors import Unavailable

    try:
        client.ingest(envelope, [INBOX], node="a")
    except Unavailable:
        return True
    return False


def test_an_id_whose_stored_file_is_gone_is_refused_from_another_node(broker):
    """The index still has a's copy, its file is gone (compacted meanwhile): where it came
    from is unknown, so c's copy of that id is refused ``id_conflict``, not counted as
    delivered and dropped without a word."""
    client = broker.client()
    client.register_endpoint(INBOX)
    envelope = relayed()
    assert client.ingest(envelope, [INBOX], node="a").delivered_to == 1
    (held,) = client.fetch(INBOX, wait=5)
    held.ack()
    mailbox = broker.home.mailbox(endpoint_hash(INBOX))
    wait_for(lambda: client.trace(envelope.id)["copies"][0]["state"] == "done", what="done")
    for name in os.listdir(f"{mailbox}/cur"):
        os.remove(f"{mailbox}/cur/{name}")
    refused = client.ingest(replace(envelope, payload={"content": "from c"}), [INBOX], node="c")
    assert (refused.delivered_to, refused.rejected) == (0, ((endpoint_hash(INBOX), "id_conflict"),))
