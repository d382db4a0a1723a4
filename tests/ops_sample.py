"""A data directory full of history, for the ops tests (docs/ops.md's figures too).

It is test data, not product: it moves message files the way a writer would, which no
shipped code but the writer may do (docs/design.md invariant 1), so it lives here.

`generate` writes real message files with the storage code (`deliver_batch`, then the
renames a writer makes for claims and completions, and each file's mtime set to its
stored time), registers the endpoints in control.db and builds each shard's index from
the Maildir, as a writer does at start. It returns the ground truth, one record per
copy, so that tests compute what they expect on their own.

Copies are spread over ``span_days`` before ``now_ms`` in every state: done, dead letters
(consumer nacks, budget, access and unroutable ones), new and claimed; some messages fan
out to two endpoints (same id, two copies).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

from broker.control import ControlPlane
from sdk.ids import MonotonicUlid
from sdk.paths import UNROUTABLE, Home, shard_of
from sdk.subjects import endpoint_hash
from workers.filenames import format_name
from workers.group_commit import deliver_batch
from workers.index import MessageIndex, rebuild_from_maildir
from workers.maildir import Mailbox
from workers.records import MessageRecord, State

DAY_MS = 86_400_000
SENDERS = ("relay.agent.sample.frontend", "relay.agent.sample.planner", "relay.human.console")
DEAD_CODES = (
    ("nack", "handler raised ValueError: bad input"),
    ("nack", "handler raised TimeoutError"),
    ("ttl_expired", "ttl expired"),
    ("hop_limit", "max hops exceeded (5/5)"),
    ("access_denied", "access denied by rule > -> relay.agent.sample.>"),
)


@dataclass(frozen=True)
class Spec:
    copies: int = 3000
    endpoints: int = 4
    shards: int = 2
    span_days: float = 45.0
    fanout: float = 0.1  # share of messages that also go to a second endpoint
    unroutable: float = 0.02  # share of publishes that matched nothing
    weights: tuple[float, float, float, float] = (0.55, 0.2, 0.15, 0.1)  # done failed new claimed
    seed: int = 7
    batch: int = 1000  # files per deliver_batch


def endpoint_subject(i: int) -> str:
    return f"relay.agent.sample.worker{i}"


def generate(home: Home, now_ms: int, spec: Spec = Spec()) -> list[MessageRecord]:
    home.create()
    rng = random.Random(spec.seed)
    ids = MonotonicUlid()
    subjects = [endpoint_subject(i) for i in range(spec.endpoints)]
    with ControlPlane(home.control_db, home.mailboxes) as control:
        for subject in subjects:
            control.register_endpoint(subject, now_ms - int(spec.span_days * DAY_MS) - DAY_MS)
    boxes = {
        endpoint_hash(s): Mailbox(home.mailbox(endpoint_hash(s)), endpoint_hash(s))
        for s in subjects
    }
    boxes[UNROUTABLE] = Mailbox(home.mailbox(UNROUTABLE), UNROUTABLE)
    for box in boxes.values():
        box.create()
    hashes = [endpoint_hash(s) for s in subjects]

    # Creation times, increasing (ids are monotonic ULIDs of their creation time).
    span_ms = int(spec.span_days * DAY_MS)
    times = sorted(now_ms - rng.randrange(60_000, span_ms) for _ in range(spec.copies))
    records: list[MessageRecord] = []
    files: list[tuple[MessageRecord, bytes]] = []
    i = 0
    while i < len(times):
        created = times[i]
        message_id = ids.new(created)
        sender = rng.choice(SENDERS)
        payload = {"content": f"message {i}", "n": i} if i % 5 else f"plain text {i}"
        if rng.random() < spec.unroutable:
            targets = [UNROUTABLE]
        elif rng.random() < spec.fanout and i + 1 < len(times):
            targets = rng.sample(hashes, 2)
        else:
            targets = [rng.choice(hashes)]
        for endpoint in targets:
            record = _copy(
                rng, message_id, endpoint, subjects, hashes, sender, created, now_ms, spec
            )
            files.append((record, _file(record, payload)))
            records.append(record)
            i += 1
    _write(boxes, files, spec.batch)
    for shard in range(spec.shards):
        owned = [e for e in boxes if shard_of(e, spec.shards) == shard]
        with MessageIndex(home.index_db(shard)) as index:
            rebuild_from_maildir(index, home.mailboxes, owned)
    return [_sized(r, data) for r, data in files]


def _copy(
    rng, message_id, endpoint, subjects, hashes, sender, created, now_ms, spec
) -> MessageRecord:
    stored = created + rng.randrange(0, 40)
    subject = (
        subjects[hashes.index(endpoint)] if endpoint in hashes else "relay.agent.sample.nobody"
    )

    def dead(failed: int, reason: str, code: str) -> MessageRecord:
        return MessageRecord(
            message_id, endpoint, subject, sender, State.FAILED, created, stored, None,
            failed, reason, code,
        )  # fmt: skip

    if endpoint == UNROUTABLE:
        return dead(stored, "no matching endpoints", "no_match")
    state = rng.choices(list(State.__members__.values()), weights=_weights(spec))[0]
    if state is State.NEW:
        return MessageRecord(message_id, endpoint, subject, sender, state, created, stored)
    claimed = stored + int(rng.lognormvariate(3, 1.5))  # ms waiting in new/
    claimed = min(claimed, now_ms - 1)
    if state is State.CLAIMED:
        return MessageRecord(message_id, endpoint, subject, sender, state, created, stored, claimed)
    if state is State.DONE:
        done = min(claimed + int(rng.lognormvariate(5, 1.2)), now_ms - 1)
        return MessageRecord(
            message_id, endpoint, subject, sender, state, created, stored, claimed, done
        )
    code, reason = rng.choice(DEAD_CODES)
    failed = stored if code != "nack" else min(claimed + int(rng.lognormvariate(5, 1)), now_ms - 1)
    return dead(failed, reason, code)


def _weights(spec: Spec) -> list[float]:
    done, failed, new, claimed = spec.weights
    return [new, claimed, done, failed]  # State order: new, claimed, done, failed


def _file(record: MessageRecord, payload) -> bytes:
    envelope = {
        "id": record.id,
        "subject": record.subject,
        "from": record.sender,
        "replyTo": None,
        "budget": {
            "hopCount": 1,
            "maxHops": 5,
            "ancestorChain": [record.subject],
            "ttl": record.created_at + 3_600_000,
            "callBudgetRemaining": 9,
        },
        "createdAt": record.created_at,
        "payload": payload,
    }
    if record.state is State.FAILED:
        envelope["deadLetter"] = {
            "reason": record.reason,
            "code": record.reason_code,
            "failedAt": record.finished_at,
            "endpoint": record.endpoint,
        }
    return json.dumps(envelope, separators=(",", ":")).encode()


def _write(boxes: dict[str, Mailbox], files: list[tuple[MessageRecord, bytes]], batch: int) -> None:
    for start in range(0, len(files), batch):
        chunk = files[start : start + batch]
        items = [
            (boxes[r.endpoint], r.id, data, "failed" if r.state is State.FAILED else "new")
            for r, data in chunk
        ]
        for outcome in deliver_batch(items):
            if isinstance(outcome, Exception):
                raise outcome
        for record, _ in chunk:
            box = boxes[record.endpoint]
            if record.state is State.FAILED:
                path = f"{box.failed_dir}/{record.id}"
            elif record.state is State.NEW:
                path = f"{box.new_dir}/{record.id}"
            else:
                done = record.finished_at if record.state is State.DONE else None
                flags = "S" if done is not None else ""
                name = format_name(record.id, record.claimed_at, done, flags)
                path = f"{box.cur_dir}/{name}"
                os.rename(f"{box.new_dir}/{record.id}", path)
            stored_ns = record.stored_at * 1_000_000
            os.utime(path, ns=(stored_ns, stored_ns))


def _sized(record: MessageRecord, data: bytes) -> MessageRecord:
    return MessageRecord(
        record.id,
        record.endpoint,
        record.subject,
        record.sender,
        record.state,
        record.created_at,
        record.stored_at,
        record.claimed_at,
        record.finished_at,
        record.reason,
        record.reason_code,
        len(data),
    )
