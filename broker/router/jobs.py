"""Work the router gave the writers and waits on: client requests answered only when
every writer involved has answered (or the deadline passed), and the copies and
operations not sent yet. Pure: the loop sends, this unit says what.

A publish is a job with one copy per target endpoint; an operation (ack, purge,
rebuild, ...) is a job with one part per shard. A job's token travels with its work
and comes back with each answer. Jobs are kept in insertion order, which is deadline
order (every job gets the same deadline), so the sweep stops at the first job not due.

Work for a shard whose writer is expected but not up (starting, restarting) is *parked*:
sent at its hello, or never, when its request was answered meanwhile (a publish answered
``unavailable`` must not be stored after all).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from broker.publish import Copy
from sdk import wire
from sdk.errors import LimitExceeded, RelayError
from workers import protocol as proto

WRITER_DEADLINE_MS = 10_000
MAX_INFLIGHT_PER_CLIENT = 1024  # requests awaiting a writer, per client

# One copy for a writer: what it needs to store and index it, and the file bytes.
Delivery = tuple[proto.DeliveryHeader, bytes]


class Job:
    """A client request waiting for writers: a publish, or an operation on N shards.
    A class with its own ``__init__``, not a dataclass: one is made for every publish,
    and compiled, its seven containers are built in place where a dataclass calls a
    default factory through Python for each."""

    def __init__(
        self,
        client: bytes,
        rid: int,
        deadline: int,
        remaining: int,
        on_done: Callable[[Job], Any],  # builds the reply result (or raises RelayError)
    ) -> None:
        self.client = client
        self.rid = rid
        self.deadline = deadline
        self.remaining = remaining
        self.on_done = on_done
        self.on_reply: Callable[[Any], None] | None = None  # each answer, even late (WriterWork)
        self.results: list[Any] = []
        self.shards: set[int] = set()
        self.answered_by: set[int] = set()  # shards that answered (an operation)
        self.error: RelayError | None = None
        self.message_id = ""  # a publish's message
        self.sender = ""  # a publish's sender (its copies' "from")
        self.copies: dict[str, Copy] = {}  # a publish's writes, by endpoint
        # a publish's remote parts: far node -> its endpoint subjects (docs/federation.md)
        self.remote: dict[str, tuple[str, ...]] = {}
        # endpoint (or "@node" for a remote part) -> None (durable; in JetStream) or
        # (code, message) when the copy was not stored
        self.outcomes: dict[str, tuple[str, str] | None] = {}

    @property
    def is_publish(self) -> bool:
        return bool(self.copies) or bool(self.remote)

    def awaits_node(self, node: str) -> bool:
        """Whether this publish still waits for the bridge to relay its part for ``node``."""
        return node in self.remote and f"@{node}" not in self.outcomes

    def awaits(self, endpoint: str) -> bool:
        """Whether this publish still waits for its copy to ``endpoint``."""
        return endpoint in self.copies and endpoint not in self.outcomes


class WriterJobs:
    def __init__(self, tokens: Iterator[int] | None = None) -> None:
        self.pending: dict[int, Job] = {}
        self.tokens = tokens or itertools.count(1)
        self.waiting_per_client: dict[bytes, int] = {}
        # Publishes waiting on writers, by message id: an ingest of an id already on its
        # way must not store it a second time (docs/federation.md).
        self.by_message: dict[str, int] = {}
        # Copies decided during a pass, per shard, sent at its end in one frame each.
        self.outgoing: dict[int, list[Delivery]] = {}
        self.parked_copies: dict[int, list[Delivery]] = {}
        self.parked_ops: dict[int, list[tuple[int, list[bytes]]]] = {}
        # Operations answered (at their deadline, or failed by a writer gone) whose
        # writers' answers still matter: token -> (on_reply, the shards owing one).
        self.late: dict[int, tuple[Callable[[Any], None], set[int]]] = {}

    # ----------------------------------------------------------------- jobs

    def open(
        self, client: bytes, rid: int, parts: int, on_done: Callable[[Job], Any], now: int
    ) -> tuple[int, Job]:
        """A new job of ``parts`` answers, registered under a fresh token."""
        waiting = self.waiting_per_client.get(client, 0)
        if waiting >= MAX_INFLIGHT_PER_CLIENT:
            raise LimitExceeded(
                f"{waiting} requests of this connection are already waiting on "
                f"writers; the limit is {MAX_INFLIGHT_PER_CLIENT}"
            )
        job = Job(client, rid, now + WRITER_DEADLINE_MS, parts, on_done)
        token = next(self.tokens)
        self.pending[token] = job
        self.waiting_per_client[client] = waiting + 1
        return token, job

    def storing(self, message_id: str) -> bool:
        """Whether copies of this message are on their way to the writers."""
        return message_id in self.by_message

    def publishing(self, token: int, job: Job, message_id: str, sender: str) -> None:
        job.message_id, job.sender = message_id, sender
        self.by_message[message_id] = token

    def forget(self, token: int) -> Job | None:
        job = self.pending.pop(token, None)
        if job is not None:
            if self.by_message.get(job.message_id) == token:
                del self.by_message[job.message_id]
            left = self.waiting_per_client.get(job.client, 1) - 1
            if left > 0:
                self.waiting_per_client[job.client] = left
            else:
                self.waiting_per_client.pop(job.client, None)
        return job

    def answered(self, token: int, job: Job) -> tuple[bytes, bytes] | None:
        """One more answer for ``job``; (client, reply body) once it has them all."""
        job.remaining -= 1
        if job.remaining > 0:
            return None
        return job.client, self.finish(token, job)

    def finish(self, token: int, job: Job) -> bytes:
        """The job's reply body, the job forgotten."""
        self.forget(token)
        try:
            if job.error is not None:
                raise job.error
            return wire.ok_body(job.rid, job.on_done(job))
        except RelayError as exc:
            return wire.error_body(job.rid, exc)

    def outlive(self, token: int, job: Job) -> None:
        """``job`` is answered without all its writers: keep its ``on_reply`` for the
        late answers of the shards that owe one (`late_reply`)."""
        owing = job.shards - job.answered_by
        if job.on_reply is not None and owing:
            self.late[token] = (job.on_reply, owing)

    def abandon(self, token: int, job: Job, sent_to: set[int]) -> None:
        """``job`` fails before all its writers got it (one's queue was full): the
        writers it was sent to still do it, so their answers keep their effects; what
        was parked for writers not up is never sent."""
        job.shards = set(sent_to)
        self.outlive(token, job)
        self.forget(token)

    def late_reply(self, token: int, shard: int) -> Callable[[Any], None] | None:
        """The ``on_reply`` of an answer that came after its job was answered."""
        kept = self.late.get(token)
        if kept is None or shard not in kept[1]:
            return None
        on_reply, owing = kept
        owing.discard(shard)
        if not owing:
            del self.late[token]
        return on_reply

    def writer_gone(self, shard: int) -> list[Job]:
        """No answer comes from a writer that went away (the Maildir, read again at its
        next hello, says what it did). The operations that waited on it fail as a whole:
        returned, forgotten, their other writers' answers kept for their effects (a
        requeue's messages must join their queues). Publishes are the caller's."""
        failed = []
        for token, job in self.on_shard(shard):
            if not job.is_publish:
                self.outlive(token, job)  # owing the gone shard's answer, dropped below
                self.forget(token)
                failed.append(job)
        for token, (_, owing) in list(self.late.items()):
            owing.discard(shard)
            if not owing:
                del self.late[token]
        return failed

    def due(self, now: int) -> Iterator[tuple[int, Job]]:
        """The jobs whose deadline passed, oldest first (they stay registered)."""
        for token, job in list(self.pending.items()):
            if job.deadline > now:
                return
            yield token, job

    def on_shard(self, shard: int) -> list[tuple[int, Job]]:
        return [(t, job) for t, job in self.pending.items() if shard in job.shards]

    # ----------------------------------------------------------------- work not sent yet

    def queue_copy(self, shard: int, header: proto.DeliveryHeader, data: bytes) -> None:
        self.outgoing.setdefault(shard, []).append((header, data))

    def take_outgoing(self) -> dict[int, list[Delivery]]:
        outgoing, self.outgoing = self.outgoing, {}
        return outgoing

    def park_copies(self, shard: int, items: list[Delivery]) -> list[tuple[str, str]]:
        """Keep copies for the shard's hello. One meant to be stored claimed goes to new/
        instead, so its consumer's credit comes back now, not after the writer's start:
        returns those (id, endpoint) for the ledger."""
        parked, unclaimed = self.parked_copies.setdefault(shard, []), []
        for header, data in items:
            if header.target == proto.TARGET_CUR:
                unclaimed.append((header.id, header.endpoint))
                header = header._replace(target=proto.TARGET_NEW)
            parked.append((header, data))
        return unclaimed

    def park_op(self, shard: int, token: int, frames: list[bytes]) -> None:
        self.parked_ops.setdefault(shard, []).append((token, frames))

    def unpark(self, shard: int) -> tuple[list[list[bytes]], list[Delivery]]:
        """What was kept for a shard whose writer came: its operations, then its copies,
        both only where their request still waits."""
        ops = [f for t, f in self.parked_ops.pop(shard, []) if t in self.pending]
        copies = [(h, d) for h, d in self.parked_copies.pop(shard, []) if self.awaited(h)]
        return ops, copies

    def drop_parked_of_finished(self) -> None:
        for shard, items in self.parked_copies.items():
            self.parked_copies[shard] = [(h, d) for h, d in items if self.awaited(h)]
        for shard, ops in self.parked_ops.items():
            self.parked_ops[shard] = [(t, f) for t, f in ops if t in self.pending]

    def awaited(self, header: proto.DeliveryHeader) -> bool:
        """Whether a copy's publish still waits for it."""
        job = self.pending.get(header.token)
        return job is not None and job.awaits(header.endpoint)
