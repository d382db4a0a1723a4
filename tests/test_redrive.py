"""Requeueing dead letters (the redrive): a dead letter goes back to its endpoint's new/
under its own id and is handed out again, from the SDK and the command line; what is
refused stays a dead letter (docs/operations.md, "Requeueing dead letters")."""

from __future__ import annotations

import json
import signal
import time

import pytest

from broker.router.jobs import Job, WriterJobs
from sdk.errors import InvalidState, MessageNotFound, TtlExpired, Unavailable
from sdk.paths import shard_of
from sdk.types import default_budget
from tests.harness import Broker, wait_for
from workers import faults

pytestmark = pytest.mark.integration

A = "relay.agent.redrive.backend"
SENDER = "relay.agent.redrive.frontend"


def nacked(client, subject: str, count: int = 1, **publish_options) -> list[str]:
    """``count`` messages published to ``subject``, fetched and nacked: dead letters."""
    ids = [
        client.publish(subject, {"n": n}, sender=SENDER, **publish_options).message_id
        for n in range(count)
    ]
    held = []
    while len(held) < count:
        held += client.fetch(subject, batch=count, wait=5)
    for message in held:
        message.nack("cannot parse this")
    return ids


def test_a_nacked_message_requeued_is_handed_out_again_under_its_own_id(broker: Broker):
    # Given a message a consumer nacked
    client = broker.client()
    info = client.register_endpoint(A)
    (message_id,) = nacked(client, A)
    assert [d["id"] for d in client.dead_letters(info.hash)] == [message_id]

    # When an operator requeues it
    answer = client.requeue_dead_letters(message_id=message_id)

    # Then it waits in new/ again, as the index says, with its dead letter in its trace
    assert answer["requeued"] == [{"id": message_id, "endpoint": info.hash}]
    assert answer["refused"] == [] and answer["more"] is False
    assert client.dead_letters(info.hash) == []
    (copy,) = client.trace(message_id)["copies"]
    assert copy["state"] == "new" and copy["deliveries"] == 0
    assert [(r["code"], r["reason"]) for r in copy["requeues"]] == [("nack", "cannot parse this")]
    assert copy["requeues"][0]["requeuedAt"] >= copy["requeues"][0]["failedAt"]
    client.rebuild_index()  # the index row is the one the Maildir gives
    assert client.trace(message_id)["copies"] == [copy]
    # and a consumer gets it under its own id, with its payload, handed out once
    (message,) = client.fetch(A, wait=5)
    assert message.id == message_id and message.deliveries == 1
    assert message.envelope.payload == {"n": 0}
    message.ack()
    assert client.trace(message_id)["copies"][0]["state"] == "done"


def test_a_max_deliveries_dead_letter_requeued_counts_its_deliveries_afresh(broker: Broker):
    # Given a message released after delivery.maxDeliveries (1) hand-outs: a dead letter
    client = broker.client()
    info = client.register_endpoint(A)
    client.set_config({"delivery": {"maxDeliveries": 1}})
    message_id = client.publish(A, "poison", sender=SENDER).message_id
    (held,) = client.fetch(A, wait=5, ack_wait=0.2)  # never answered
    (letter,) = wait_for(lambda: client.dead_letters(info.hash), what="the dead letter")
    assert (letter["id"], letter["code"], letter["deliveries"]) == (held.id, "max_deliveries", 1)

    # When it is requeued and fetched again
    client.requeue_dead_letters(info.hash, message_id=message_id)
    (again,) = client.fetch(A, wait=5)

    # Then it is its first hand-out since the requeue, not a second death
    assert again.id == message_id and again.deliveries == 1
    again.ack()
    assert client.dead_letters(info.hash) == []


def test_a_dead_letter_past_its_ttl_is_refused_and_stays(broker: Broker):
    client = broker.client()
    info = client.register_endpoint(A)
    budget = default_budget(int(time.time() * 1000), ttl_ms=1500)
    (message_id,) = nacked(client, A, budget=budget)
    wait_for(lambda: time.time() * 1000 > budget.ttl + 50, what="the message's TTL to pass")

    with pytest.raises(TtlExpired, match="would die again"):
        client.requeue_dead_letters(message_id=message_id)

    assert [d["id"] for d in client.dead_letters(info.hash)] == [message_id]
    assert client.fetch(A) == []


def test_requeue_all_is_bounded_says_whether_more_remain_and_keeps_id_order(broker: Broker):
    # Given three dead letters of one endpoint
    client = broker.client()
    info = client.register_endpoint(A)
    ids = nacked(client, A, count=3)

    # When an operator requeues them two at a time
    first = client.requeue_dead_letters(A, limit=2)
    rest = client.requeue_dead_letters(A, limit=2, after=first["after"])

    # Then each page says how far it went, and consumers get them oldest first
    assert [r["id"] for r in first["requeued"]] == ids[:2] and first["more"] is True
    assert first["after"] == ids[1]
    assert [r["id"] for r in rest["requeued"]] == ids[2:] and rest["more"] is False
    assert rest["after"] is None
    assert client.dead_letters(info.hash) == []
    handed = []
    while len(handed) < 3:
        handed += client.fetch(A, batch=3, wait=5)
    assert [m.id for m in handed] == ids


def test_dead_letters_refused_at_publish_time_are_not_requeued(broker: Broker):
    client = broker.client()
    lost = client.publish(A, "too early", sender=SENDER).message_id  # A not registered yet
    client.register_endpoint(A)

    with pytest.raises(InvalidState, match="republish it instead"):
        client.requeue_dead_letters(message_id=lost)
    with pytest.raises(MessageNotFound):
        client.requeue_dead_letters(A, message_id=lost)  # not a dead letter of A


def test_relay_dlq_requeue_puts_a_dead_letter_back_from_the_command_line(broker: Broker):
    client = broker.client()
    info = client.register_endpoint(A)
    one, two, three = nacked(client, A, count=3)

    single = broker.relay("dlq", "requeue", one, "--endpoint", A)
    assert single.returncode == 0, single.stderr
    assert f"requeued 1 dead letter of {A}" in single.stdout
    traced = broker.relay("trace", one)
    assert traced.stdout.split("\n")[0].split()[-1] == "REQUEUED", traced.stdout
    every = broker.relay("dlq", "requeue", "--all", "--endpoint", A, "--limit", "1", "--json")
    assert every.returncode == 0, every.stderr
    page = json.loads(every.stdout)
    assert [r["id"] for r in page["requeued"]] == [two] and page["more"] is True
    rest = broker.relay("dlq", "requeue", "--all", "--endpoint", A, "--after", two)
    assert rest.returncode == 0 and "requeued 1 dead letter" in rest.stdout

    handed = []
    while len(handed) < 3:
        handed += client.fetch(A, batch=3, wait=5)
    assert [m.id for m in handed] == [one, two, three]
    assert client.dead_letters(info.hash) == []
    missing = broker.relay("dlq", "requeue", one)
    assert missing.returncode != 0 and "message_not_found" in missing.stderr


@pytest.mark.parametrize(
    ("fault", "state"),
    [(faults.REDRIVE_AFTER_NEW_WRITTEN, "failed"), (faults.REDRIVE_AFTER_UNLINK, "new")],
    ids=["in-new-and-failed", "in-new-only"],
)
def test_a_writer_killed_while_requeueing_leaves_one_copy_handed_out_once(
    broker: Broker, fault: str, state: str
):
    # Given dead letters, and their shard's writer armed to die in the middle of a requeue
    client = broker.client(timeout=30)
    info = client.register_endpoint(A)
    ids = nacked(client, A, 3)
    writer = f"writer{shard_of(info.hash, broker.shards)}"
    broker.kill(writer, signal.SIGTERM)
    broker.start_writer(int(writer[-1]), env={"RELAY_FAULT": fault})
    broker.wait_ready()

    # When the requeue of all three (one batch: each step done for all) kills it (the
    # request is answered unavailable) and it restarts
    with pytest.raises(Unavailable):
        client.requeue_dead_letters(info.hash)
    assert broker.procs[writer].wait(10) == -signal.SIGKILL
    broker.start_writer(int(writer[-1]))
    broker.wait_ready()

    # Then each has one copy left, all in the same state: the dead letter when new/ and
    # failed/ both held it (the requeue undone), else the waiting message; the index
    # agrees with the disk
    for message_id in ids:
        assert [c["state"] for c in client.trace(message_id)["copies"]] == [state]
    if state == "failed":
        client.requeue_dead_letters(info.hash)  # the request, made again
    # and a consumer gets each once
    handed = client.fetch(A, batch=10, wait=5)
    while len(handed) < len(ids):
        handed += client.fetch(A, batch=10, wait=5)
    assert sorted(m.id for m in handed) == sorted(ids)
    for message in handed:
        message.ack()
    assert client.fetch(A, batch=10) == []
    assert client.dead_letters(info.hash) == []
    assert {client.trace(i)["copies"][0]["state"] for i in ids} == {"done"}


def _two_shard_job(jobs: WriterJobs) -> tuple[int, Job, list[str]]:
    """A requeue on shards 0 and 1 whose answers' effects land in the list returned."""
    seen: list[str] = []
    token, job = jobs.open(b"client", 1, 2, lambda job: None, now=0)
    job.on_reply, job.shards = seen.append, {0, 1}
    return token, job, seen


def _late_answer_applies_once(jobs: WriterJobs, token: int, shard: int, seen: list[str]) -> None:
    on_reply = jobs.late_reply(token, shard)
    assert on_reply is not None
    on_reply(f"shard {shard}")
    assert seen == [f"shard {shard}"] and jobs.late_reply(token, shard) is None


def test_writers_answers_after_an_operations_deadline_still_reach_its_on_reply():
    """A requeue answered unavailable at its deadline while its writers went on: each
    late answer still puts its messages in line (broker/router/jobs.py, `late_reply`),
    until the writer that owes one goes away."""
    jobs = WriterJobs()
    token, job, seen = _two_shard_job(jobs)

    jobs.outlive(token, job)  # the sweep, at the deadline
    jobs.forget(token)

    for shard in (0, 1):
        on_reply = jobs.late_reply(token, shard)
        assert on_reply is not None
        on_reply(f"shard {shard}")
    assert seen == ["shard 0", "shard 1"] and jobs.late_reply(token, 1) is None
    other, job = jobs.open(b"client", 2, 1, lambda job: None, now=0)
    job.on_reply, job.shards = seen.append, {1}
    jobs.outlive(other, job)
    jobs.forget(other)
    jobs.writer_gone(1)  # its new/ is read again at its hello instead
    assert jobs.late_reply(other, 1) is None


def test_a_writer_gone_drops_only_the_late_answer_it_owed():
    """A requeue on two shards answered at its deadline: one writer restarts (its new/
    is read again at its hello), the other's late answer still puts its messages in
    line, or they stay in new/ outside any queue until the router restarts."""
    jobs = WriterJobs()
    token, job, seen = _two_shard_job(jobs)
    jobs.outlive(token, job)
    jobs.forget(token)

    jobs.writer_gone(0)
    assert jobs.late_reply(token, 0) is None  # from the writer gone: none comes
    _late_answer_applies_once(jobs, token, 1, seen)


def test_an_operation_failed_by_a_writer_gone_keeps_its_other_writers_answers():
    """A requeue on two shards whose writer 0 disconnects first: the request fails as a
    whole, and writer 1's answer, which comes after, still puts its messages in line."""
    jobs = WriterJobs()
    token, job, seen = _two_shard_job(jobs)

    failed = jobs.writer_gone(0)
    assert failed == [job] and token not in jobs.pending
    assert jobs.late_reply(token, 0) is None  # from the writer gone: none comes
    _late_answer_applies_once(jobs, token, 1, seen)


def test_an_operation_refused_by_a_full_writer_keeps_the_answers_of_those_it_reached():
    """A requeue sent to writer 0, then refused because writer 1's queue is full: the
    request fails, writer 0 still moves its messages, and its answer still puts them in
    line; writer 1, which never got the work, owes nothing."""
    jobs = WriterJobs()
    token, job, seen = _two_shard_job(jobs)

    jobs.abandon(token, job, sent_to={0})
    assert token not in jobs.pending
    assert jobs.late_reply(token, 1) is None  # never sent: no answer to wait for
    _late_answer_applies_once(jobs, token, 0, seen)
    assert token not in jobs.late
