"""The consumer's half of the contract, through real processes: what a consumer held
when it died is handed out again, first, saying how many times (`deliveries`); a
poison message ends as a dead letter; `fetch` with confirmed answers; ack deadlines;
a router restart under a live consumer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sdk.errors import InvalidState
from sdk.types import Envelope
from tests.harness import wait_for

pytestmark = pytest.mark.integration

BOX = "relay.agent.crash.box"
SENDER = "relay.agent.crash.cli"
ROOT = os.path.dirname(os.path.dirname(__file__))

# A consumer that takes what it is pushed (default credit) and is killed by SIGKILL
# while its handler is busy with the first message.
DIES_HOLDING = """
import os, signal, sys, threading
from sdk import connect
c = connect(sys.argv[1])
def handler(envelope):
    os.kill(os.getpid(), signal.SIGKILL)
c.subscribe(sys.argv[2], handler)
threading.Event().wait(30)
"""


# One that fetches what waits, then is killed holding all of it: the fetch is answered
# once every claim is made, so no claim is still on its way when it dies.
DIES_AFTER_FETCH = """
import os, signal, sys
from sdk import connect
connect(sys.argv[1]).fetch(sys.argv[2], batch=100)
os.kill(os.getpid(), signal.SIGKILL)
"""


def die_holding(broker, pattern: str = BOX, script: str = DIES_HOLDING) -> None:
    result = subprocess.run(
        [sys.executable, "-c", script, str(broker.home.root), pattern],
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == -9


class Inbox:
    def __init__(self) -> None:
        self.items: list[Envelope] = []

    def __call__(self, envelope: Envelope) -> None:
        self.items.append(envelope)


def test_what_a_killed_consumer_held_is_handed_out_again_first_and_in_order(broker):
    client = broker.client()
    client.register_endpoint(BOX)
    ids = [client.publish(BOX, n, sender=SENDER).message_id for n in range(5)]
    die_holding(broker)
    later = client.publish(BOX, "after the crash", sender=SENDER).message_id
    inbox = Inbox()
    client.subscribe(BOX, inbox)
    wait_for(lambda: len(inbox.items) == 6, what="all six messages")
    assert [e.id for e in inbox.items] == [*ids, later]
    # The first reached the dead handler; the others reached its process, or only
    # its claims did (a claim nobody received is not a hand-out).
    assert inbox.items[0].deliveries == 2
    assert {e.deliveries for e in inbox.items[1:5]} <= {1, 2}
    assert inbox.items[5].deliveries == 1
    wait_for(lambda: client.pending(BOX) == [], what="nothing left claimed")


def test_a_message_that_keeps_killing_its_consumers_ends_as_a_dead_letter(broker):
    client = broker.client()
    info = client.register_endpoint(BOX)
    client.set_config({"delivery": {"maxDeliveries": 2}})
    poison = client.publish(BOX, "poison", sender=SENDER).message_id
    die_holding(broker)
    die_holding(broker)
    dead = wait_for(lambda: client.dead_letters(info.hash), what="the dead letter")
    assert [(d["id"], d["code"]) for d in dead] == [(poison, "max_deliveries")]
    assert client.pending(BOX) == []
    healthy = client.publish(BOX, "healthy", sender=SENDER).message_id
    assert [m.id for m in client.fetch(BOX, wait=5)] == [healthy]  # the rest flows on


def test_fetch_claims_what_waits_and_its_ack_is_done_when_it_returns(broker):
    client = broker.client()
    client.register_endpoint(BOX)
    ids = [client.publish(BOX, n, sender=SENDER).message_id for n in range(3)]
    first = client.fetch(BOX, batch=2)
    assert [m.id for m in first] == ids[:2]
    assert [m.deliveries for m in first] == [1, 1]
    assert first[0].envelope.payload == 0
    first[0].ack()
    assert client.trace(ids[0])["copies"][0]["state"] == "done"  # no wait: confirmed
    with pytest.raises(InvalidState):
        first[0].ack()  # answered already
    first[1].nack("cannot do it")
    assert client.trace(ids[1])["copies"][0]["state"] == "failed"
    assert [m.id for m in client.fetch(BOX, batch=10)] == [ids[2]]
    assert client.fetch(BOX, wait=0.2) == []


def test_a_fetch_that_waits_gets_a_message_published_meanwhile(broker):
    client, publisher = broker.client(), broker.client()
    client.register_endpoint(BOX)
    waiting = client.fetch_async(BOX, wait=10)
    published = publisher.publish(BOX, "late", sender=SENDER).message_id
    assert [m.id for m in waiting.result(15)] == [published]


def test_a_claim_past_its_ack_deadline_goes_to_the_next_consumer(broker):
    slow, quick = broker.client(), broker.client()
    slow.register_endpoint(BOX)
    message_id = slow.publish(BOX, "work", sender=SENDER).message_id
    (held,) = slow.fetch(BOX, ack_wait=0.5)
    (again,) = quick.fetch(BOX, wait=10)
    assert (again.id, again.deliveries) == (message_id, 2)
    with pytest.raises(InvalidState):
        held.ack()  # the first hand-out is no longer the slow consumer's
    again.ack()
    assert quick.trace(message_id)["copies"][0]["state"] == "done"


def test_a_consumer_acks_what_it_held_across_a_router_restart(broker):
    client = broker.client()
    client.register_endpoint(BOX)
    message_id = client.publish(BOX, "work", sender=SENDER).message_id
    (held,) = client.fetch(BOX)
    broker.kill("router")
    broker.start_router()
    broker.wait_ready()
    wait_for(lambda: _acked(held), what="the ack to reach the restarted router")
    assert client.trace(message_id)["copies"][0]["state"] == "done"


def _acked(message) -> bool:
    try:
        message.ack()
    except InvalidState:
        raise
    except Exception:
        return False
    return True


def test_claims_whose_holder_does_not_come_back_after_a_restart_are_handed_out(broker):
    client = broker.client()
    client.register_endpoint(BOX)
    client.set_config({"delivery": {"sessionTimeoutMs": 1000}})
    ids = [client.publish(BOX, n, sender=SENDER).message_id for n in range(2)]
    die_holding(broker, script=DIES_AFTER_FETCH)  # holding both
    broker.kill("router")  # before it saw the consumer go: it learns from cur/
    broker.start_router()
    broker.wait_ready()
    other = broker.client()
    got = wait_for(lambda: other.fetch(BOX, batch=5, wait=1), what="the orphaned claims")
    assert [(m.id, m.deliveries) for m in got] == [(i, 2) for i in ids]
    assert "2 claims in cur/ that no session named" in broker.log("router")


def test_status_shows_claimed_messages_beside_waiting_ones(broker):
    client = broker.client()
    client.register_endpoint(BOX)
    for n in range(3):
        client.publish(BOX, n, sender=SENDER)
    held = client.fetch(BOX, batch=2)
    (endpoint,) = [e for e in client.status()["endpoints"] if e["subject"] == BOX]
    assert (endpoint["depth"], endpoint["claimed"]) == (1, 2)
    assert endpoint["oldestClaimedAt"] >= min(m.envelope.created_at for m in held)
    for message in held:
        message.ack()
    (endpoint,) = [e for e in client.status()["endpoints"] if e["subject"] == BOX]
    assert (endpoint["claimed"], endpoint["oldestClaimedAt"]) == (0, None)


def test_a_confirmed_push_subscription_acks_each_message_before_the_next(broker):
    client, checker = broker.client(), broker.client()
    client.register_endpoint(BOX)
    ids = [client.publish(BOX, n, sender=SENDER).message_id for n in range(3)]
    states_seen: list[str] = []

    def handler(envelope: Envelope) -> None:
        if envelope.payload > 0:  # the one before is done already: its ack was confirmed
            earlier = ids[envelope.payload - 1]
            states_seen.append(checker.trace(earlier)["copies"][0]["state"])

    client.subscribe(BOX, handler, confirm=True)
    wait_for(lambda: len(states_seen) == 2, what="the second and third messages handled")
    assert states_seen == ["done", "done"]


def test_a_client_back_before_the_writers_after_a_restart_keeps_what_it_holds(broker):
    client, other = broker.client(), broker.client()
    client.register_endpoint(BOX)
    # The holder pings four times per session timeout (the ping's sessionTimeoutMs): it
    # stays connected throughout, so only an orphan's deadline could take the message.
    client.set_config({"delivery": {"sessionTimeoutMs": 1000}})
    message_id = client.publish(BOX, "work", sender=SENDER).message_id
    (held,) = client.fetch(BOX)
    for name in ("router", "writer0", "writer1"):
        broker.kill(name)
    broker.start_router()  # alone: the client says hello again before any writer does

    def claimed() -> int:
        try:
            return next(e for e in other.status()["endpoints"] if e["subject"] == BOX)["claimed"]
        except Exception:
            return 0

    wait_for(claimed, 20, what="the client to say it holds the message")
    for shard in range(broker.shards):
        broker.start_writer(shard)
    broker.wait_ready()
    assert other.fetch(BOX, wait=2.5) == []  # past the session timeout: still the client's
    held.ack()
    assert other.trace(message_id)["copies"][0]["state"] == "done"
    # The writers' hellos (before "ready") found the claim in cur/: not one nobody named.
    log = broker.log("router")
    assert log.count("ready: ") == 2, log
    assert "no session named" not in log and "nobody known" not in log, log


def test_a_claim_held_across_a_restart_keeps_its_ack_deadline(broker):
    client, other = broker.client(), broker.client()
    client.register_endpoint(BOX)
    message_id = client.publish(BOX, "work", sender=SENDER).message_id
    (held,) = client.fetch(BOX, ack_wait=2.0)
    broker.kill("router")
    broker.start_router()
    broker.wait_ready()
    (again,) = other.fetch(BOX, wait=15)  # its holder named it, with its deadline
    assert (again.id, again.deliveries) == (message_id, 2)
    with pytest.raises(InvalidState):
        held.ack()


def test_a_client_keeps_what_it_holds_of_an_endpoint_unregistered_meanwhile(broker):
    # Found by the model test: a restarted router refused a client's word for claims
    # of an endpoint unregistered meanwhile (no subject to check its rights against),
    # so they went to others while the client still held them.
    client, other = broker.client(), broker.client()
    client.register_endpoint(BOX)
    message_id = client.publish(BOX, "work", sender=SENDER).message_id
    (held,) = client.fetch(BOX)
    client.unregister_endpoint(BOX)
    # The token its hello got; a new one once it said hello again.
    before = client._transport.session
    broker.kill("router")
    broker.start_router()
    broker.wait_ready()
    wait_for(lambda: client._transport.session != before, 20, what="the client to say hello again")
    other.register_endpoint(BOX)
    assert other.fetch(BOX, wait=7) == []  # past the session timeout: still the client's
    held.ack()
    assert other.trace(message_id)["copies"][0]["state"] == "done"
