"""Publish, consume, observe, fan-out and backlog through real router and writer processes."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from inotify_simple import INotify
from inotify_simple import flags as iflags

from cli.main import main as relay_main
from sdk.errors import InvalidState
from sdk.paths import shard_of
from sdk.types import Envelope
from tests.harness import signals_flowing, wait_for

pytestmark = pytest.mark.integration

A = "relay.agent.demo.a"
B = "relay.agent.demo.b"
C = "relay.agent.other.c"
SENDER = "relay.agent.demo.cli"


class Inbox:
    """Collects what a handler receives, thread-safely."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.items: list[Envelope] = []
        self.lock = threading.Lock()
        self.fail_on = fail_on

    def __call__(self, envelope: Envelope) -> None:
        with self.lock:
            self.items.append(envelope)
        if self.fail_on is not None and envelope.payload == self.fail_on:
            raise ValueError(f"cannot handle {self.fail_on}")

    def payloads(self) -> list:
        with self.lock:
            return [e.payload for e in self.items]


def test_published_message_reaches_subscriber_and_is_done_after_ack(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    inbox = Inbox()
    client.subscribe(A, inbox)
    result = client.publish(A, {"content": "hello"}, sender=SENDER, reply_to=SENDER)
    assert result.delivered_to == 1 and result.rejected == ()
    wait_for(lambda: inbox.items, what="the message to reach the handler")
    envelope = inbox.items[0]
    assert envelope.id == result.message_id
    assert envelope.payload == {"content": "hello"}
    assert envelope.sender == SENDER and envelope.reply_to == SENDER
    assert envelope.budget.hop_count == 1 and envelope.budget.ancestor_chain == (A,)
    wait_for(
        lambda: client.trace(result.message_id)["copies"][0]["state"] == "done",
        what="the ack to mark the message done",
    )
    # the id the publisher got is the file name in the mailbox
    cur = os.listdir(os.path.join(info.maildir_path, "cur"))
    assert [n.split(",")[0] for n in cur] == [result.message_id]


def test_a_reply_keeps_the_id_of_the_message_it_answers_through_a_rebuild(broker, capsys):
    # Given a question from A to B, and B's reply to it
    client = broker.client()
    info_a = client.register_endpoint(A)
    info_b = client.register_endpoint(B)
    question = client.publish(B, "question?", sender=A, reply_to=A).message_id
    asked = Inbox()
    client.subscribe(B, asked)
    wait_for(lambda: asked.items, what="the question to reach B")
    answer = client.reply(asked.items[0], "answer!", sender=B).message_id
    # Then the reply's file, its handler and its trace name the question
    with open(os.path.join(info_a.maildir_path, "new", answer)) as f:
        assert json.load(f)["parentId"] == question
    [copy] = client.trace(answer)["copies"]
    assert copy["parentId"] == question and copy["deliveries"] == 0
    [asked_copy] = client.trace(question)["copies"]
    assert asked_copy["parentId"] is None and asked_copy["deliveries"] == 1
    assert asked_copy["endpoint"] == info_b.hash
    # and so does the index rebuilt from the Maildir alone
    client.rebuild_index()
    [copy] = client.trace(answer)["copies"]
    assert copy["parentId"] == question and copy["deliveries"] == 0
    # `relay trace` shows both
    capsys.readouterr()
    assert relay_main(["--home", str(broker.home.root), "trace", answer]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[3:5] == ["DELIVERIES", "PARENT"]
    assert row.split()[3:5] == ["0", question]
    answers = Inbox()
    client.subscribe(A, answers)
    wait_for(lambda: answers.items, what="the answer to reach A")
    assert answers.items[0].parent_id == question


def test_wildcard_publish_fans_out_to_every_matching_endpoint(broker):
    client = broker.client()
    for subject in (A, B, C):
        client.register_endpoint(subject)
    result = client.publish("relay.agent.demo.*", {"n": 1}, sender=SENDER)
    assert result.delivered_to == 2
    copies = client.trace(result.message_id)["copies"]
    assert sorted(c["endpointSubject"] for c in copies) == [A, B]
    assert all(c["state"] == "new" for c in copies)


def test_backlog_reaches_a_late_subscriber_in_order(broker):
    client = broker.client()
    client.register_endpoint(A)
    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(20)]
    inbox = Inbox()
    client.subscribe(A, inbox)
    wait_for(lambda: len(inbox.items) == 20, what="the backlog")
    assert [e.id for e in inbox.items] == ids
    assert inbox.payloads() == list(range(20))


def test_competing_consumers_each_message_is_consumed_once(broker):
    first, second = broker.client(), broker.client()
    first.register_endpoint(A)
    inbox1, inbox2 = Inbox(), Inbox()
    first.subscribe(A, inbox1, credit=2)
    second.subscribe(A, inbox2, credit=2)
    for i in range(40):
        first.publish(A, i, sender=SENDER)
    wait_for(lambda: len(inbox1.items) + len(inbox2.items) == 40, what="all 40 messages")
    got = inbox1.payloads() + inbox2.payloads()
    assert sorted(got) == list(range(40))
    assert inbox1.items and inbox2.items, "the router spreads messages across consumers"


def test_observer_sees_every_message_without_taking_it(broker):
    client = broker.client()
    client.register_endpoint(A)
    watched, consumed = Inbox(), Inbox()
    client.observe("relay.agent.>", watched)
    client.subscribe(A, consumed)
    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(5)]
    wait_for(
        lambda: len(watched.items) == 5 and len(consumed.items) == 5,
        what="observer and consumer to see all five",
    )
    assert [e.id for e in watched.items] == ids
    assert sorted(e.id for e in consumed.items) == ids


def test_handler_exception_nacks_the_message_into_dead_letters(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    inbox = Inbox(fail_on="poison")
    client.subscribe(A, inbox)
    bad = client.publish(A, "poison", sender=SENDER).message_id
    good = client.publish(A, "fine", sender=SENDER).message_id
    letters = wait_for(lambda: client.dead_letters(info.hash), what="the dead letter")
    assert [d["id"] for d in letters] == [bad]
    assert letters[0]["code"] == "nack"
    assert "cannot handle poison" in letters[0]["reason"]
    wait_for(
        lambda: client.trace(good)["copies"][0]["state"] == "done",
        what="the next message to be handled: the client survived",
    )


def test_ack_sends_a_delivery_receipt_to_the_sender(broker):
    client = broker.client()
    client.register_endpoint(A)
    receipts = []
    client.on_signal(SENDER, lambda subject, sig: receipts.append(sig))
    client.subscribe(A, Inbox())
    signals_flowing(client, SENDER)
    receipts.clear()
    message_id = client.publish(A, "x", sender=SENDER).message_id
    wait_for(lambda: any(s.type == "delivery_receipt" for s in receipts), what="receipt")
    receipt = next(s for s in receipts if s.type == "delivery_receipt")
    assert receipt.data["messageId"] == message_id and receipt.endpoint_subject == A


def test_file_dropped_into_new_by_another_program_is_delivered(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    inbox = Inbox()
    client.subscribe(A, inbox)
    tmp = os.path.join(info.maildir_path, "tmp", "drop.1")
    with open(tmp, "w") as f:
        json.dump({"from": "relay.tools.cron", "payload": {"content": "from cron"}}, f)
    os.rename(tmp, os.path.join(info.maildir_path, "new", "drop.1"))
    wait_for(lambda: inbox.items, what="the dropped file to be delivered")
    envelope = inbox.items[0]
    assert envelope.payload == {"content": "from cron"}
    assert envelope.sender == "relay.tools.cron" and envelope.subject == A
    assert not os.path.exists(os.path.join(info.maildir_path, "new", "drop.1"))


def test_an_operator_finishes_what_a_live_consumer_holds(broker):
    # Consumption changed on purpose: a consumer that dies no longer leaves its messages
    # pending, they are handed out again (tests/test_consumer_crash.py). What a live
    # consumer holds is pending, and an operator may still finish it for it.
    client, holder = broker.client(), broker.client()
    info = client.register_endpoint(A)
    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(3)]
    held = holder.fetch(A, batch=3)
    pending = client.pending(A)
    assert sorted(p["id"] for p in pending) == ids
    assert all(p["claimedAt"] and p["deliveries"] == 1 for p in pending)
    client.complete(ids[0], info.hash)
    client.fail(ids[1], info.hash, "operator gave up")
    assert [p["id"] for p in client.pending(A)] == [ids[2]]
    assert client.trace(ids[0])["copies"][0]["state"] == "done"
    assert client.dead_letters(info.hash)[0]["reason"] == "operator gave up"
    with pytest.raises(InvalidState):
        held[0].ack()  # the operator settled it on the holder's behalf
    client.requeue(ids[2], info.hash)  # back to new/: the next consumer gets it
    inbox = Inbox()
    client.subscribe(A, inbox)
    wait_for(lambda: [e.id for e in inbox.items] == [ids[2]], what="the requeued message")
    wait_for(lambda: client.pending(A) == [], what="nothing left pending")


def test_operator_completing_a_held_message_gives_the_consumer_its_credit_back(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    release = threading.Event()
    inbox = Inbox()

    def slow(envelope):
        inbox(envelope)
        release.wait(20)

    client.subscribe(A, slow, credit=1)
    first = client.publish(A, 1, sender=SENDER).message_id
    second = client.publish(A, 2, sender=SENDER).message_id
    wait_for(lambda: inbox.items, what="the first message")
    client.complete(first, info.hash)  # the operator finishes it for the stuck consumer
    release.set()
    wait_for(
        lambda: [e.id for e in inbox.items] == [first, second],
        what="the second message, on the credit given back",
    )


def test_an_operator_cannot_fail_a_message_nobody_has_claimed(broker):
    from sdk.errors import InvalidState

    client = broker.client()
    info = client.register_endpoint(A)
    message_id = client.publish(A, 1, sender=SENDER).message_id
    with pytest.raises(InvalidState, match="only claimed"):
        client.fail(message_id, info.hash)
    assert client.status()["endpoints"][0]["depth"] == 1


def _events_in_new(info, directory: str = "new") -> INotify:
    """An inotify watch on the endpoint's new/ (or another of its directories): any file
    that lands there or leaves it by a rename shows."""
    watch = INotify()
    mask = iflags.CREATE | iflags.MOVED_TO | iflags.MOVED_FROM
    watch.add_watch(os.path.join(info.maildir_path, directory), mask)
    return watch


def test_a_message_for_a_waiting_consumer_is_stored_claimed_and_never_waits_in_new(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    inbox = Inbox()
    client.subscribe(A, inbox, credit=5)
    watch = _events_in_new(info)
    try:
        ids = [client.publish(A, i, sender=SENDER).message_id for i in range(3)]
        wait_for(lambda: len(inbox.items) == 3, what="three messages at the handler")
        # One commit stored them claimed: nothing ever landed in new/ ...
        assert watch.read(timeout=0) == []
    finally:
        watch.close()
    assert [e.id for e in inbox.items] == ids
    for message_id in ids:
        # ... claimed the moment it was stored, and done once acknowledged.
        copy = wait_for(
            lambda i=message_id: (c := client.trace(i)["copies"][0])["state"] == "done" and c,
            what="the ack to mark the message done",
        )
        assert copy["claimedAt"] == copy["storedAt"]


def test_order_holds_when_messages_switch_between_stored_claimed_and_queued(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    inbox = Inbox()
    release = threading.Event()

    def slow(envelope):
        inbox(envelope)
        release.wait(20)

    client.subscribe(A, slow, credit=1)
    # The first takes the only credit (stored claimed); the rest queue in new/ ...
    futures = [client.publish_async(A, i, sender=SENDER) for i in range(10)]
    ids = [f.result(10).message_id for f in futures]
    wait_for(lambda: inbox.items, what="the first message")
    assert client.status()["endpoints"][0]["depth"] == 9
    release.set()
    wait_for(lambda: len(inbox.items) == 10, what="the queued messages")
    wait_for(  # its ack gave the credit back
        lambda: client.trace(ids[-1])["copies"][0]["state"] == "done", what="the last ack"
    )
    # ... and once the queue is empty, the next is stored claimed again, after them.
    watch = _events_in_new(info)
    try:
        ids.append(client.publish(A, 10, sender=SENDER).message_id)
        wait_for(lambda: len(inbox.items) == 11, what="the eleventh message")
        assert watch.read(timeout=0) == []
    finally:
        watch.close()
    assert [e.id for e in inbox.items] == ids
    assert inbox.payloads() == list(range(11))


def test_a_message_stored_for_a_consumer_that_left_meanwhile_goes_to_the_next(broker):
    leaving, staying = broker.client(), broker.client()
    info = leaving.register_endpoint(A)
    leaving.subscribe(A, Inbox())
    cur = _events_in_new(info, "cur")
    for shard in range(broker.shards):  # the writers hold the copy until the consumer left
        broker.procs[f"writer{shard}"].send_signal(signal.SIGSTOP)
    try:
        # Same connection, so the router decides the publish (stored claimed for
        # `leaving`, its only consumer) before it reads the goodbye.
        leaving.publish_async(A, "orphan", sender=SENDER)
        leaving.close()
    finally:
        for shard in range(broker.shards):
            broker.procs[f"writer{shard}"].send_signal(signal.SIGCONT)
    # Nobody was told about it: stored claimed, it goes back to new/, not pending for
    # nobody ...
    [orphan] = wait_for(
        lambda: os.listdir(os.path.join(info.maildir_path, "new")), what="the orphan in new/"
    )
    try:
        events = cur.read(timeout=0)  # both moves happened before the file reached new/
        moves = [(e.mask & (iflags.MOVED_TO | iflags.MOVED_FROM), e.name) for e in events]
    finally:
        cur.close()
    name = f"{orphan},C="
    assert [m for m, n in moves if n.startswith(name)] == [iflags.MOVED_TO, iflags.MOVED_FROM]
    assert staying.pending(A) == []
    # ... and the next consumer gets it.
    inbox = Inbox()
    staying.subscribe(A, inbox)
    wait_for(lambda: inbox.payloads() == ["orphan"], what="the orphan at the next consumer")


def test_a_consumers_credit_comes_back_when_its_writer_dies_with_a_copy_for_it(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    inbox = Inbox()
    client.subscribe(A, inbox, credit=1)
    writer = f"writer{shard_of(info.hash, broker.shards)}"
    broker.procs[writer].send_signal(signal.SIGSTOP)  # holds the copy stored claimed ...
    lost = client.publish_async(A, "lost", sender=SENDER)
    wait_for(lambda: client.status()["pendingRequests"] == 1, what="the copy sent to the writer")
    broker.kill(writer)  # ... and dies with it, unwritten
    result = lost.result(15)
    assert result.delivered_to == 0 and [r[1] for r in result.rejected] == ["unavailable"]
    broker.start_writer(int(writer.removeprefix("writer")))
    broker.wait_ready()
    # The only credit was taken for the lost copy: it came back, so the next arrives.
    client.publish(A, "next", sender=SENDER)
    wait_for(lambda: inbox.payloads() == ["next"], what="the next message at the consumer")


def test_one_messages_dead_letters_are_found_by_its_id_however_many_there_are(broker):
    client = broker.client()
    lost = [
        client.publish("relay.agent.nobody.here", n, sender=SENDER).message_id for n in range(3)
    ]
    (found,) = client.dead_letters(message_id=lost[1], limit=1)  # not the first one listed
    assert (found["id"], found["code"], found["envelope"]["payload"]) == (lost[1], "no_match", 1)
    assert client.dead_letters("_unroutable", message_id=lost[2])[0]["id"] == lost[2]
