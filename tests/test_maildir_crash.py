"""Crash at every step of every Maildir write, then recover: prove the documented states.

Each case runs a child Python process with ``RELAY_FAULT`` naming one fault point; the
child SIGKILLs itself exactly there (workers.faults). The parent then runs
``Mailbox.recover()`` as a restarting writer would and checks that nothing partial is
visible in new/ or failed/, that every message is in exactly one state (the one the
module docstrings of workers.maildir and the modules it names promise for that step)
and that tmp/ is empty.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from sdk.ids import new_id
from workers import faults, filenames
from workers.maildir import Mailbox
from workers.records import State
from workers.scan import InvalidFile, iter_records

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_764_108_000_000

# The child: prepared messages are already on disk; it performs one operation.
CHILD = textwrap.dedent(
    """
    import json, sys
    from workers.group_commit import deliver_batch
    from workers.maildir import Mailbox
    args = json.loads(sys.argv[1])
    boxes = [Mailbox(root, endpoint) for root, endpoint in args["boxes"]]
    op, messages = args["op"], args["messages"]
    if op == "deliver":
        for box, (message_id, data) in zip(boxes, messages):
            box.deliver(message_id, data.encode())
    elif op == "deliver_failed":
        boxes[0].deliver_failed(messages[0][0], messages[0][1].encode())
    elif op == "deliver_batch":
        deliver_batch([
            (boxes[i % len(boxes)], m, d.encode(), "failed" if i == 0 else "new")
            for i, (m, d) in enumerate(messages)
        ])
    elif op == "claim":
        boxes[0].claim(messages[0][0], 1)
    elif op == "reclaim":
        boxes[0].reclaim(messages[0][0], 4, 2)
    elif op == "complete":
        boxes[0].complete(messages[0][0], 2)
    elif op == "requeue":
        boxes[0].requeue(messages[0][0])
    elif op == "fail":
        boxes[0].fail(messages[0][0], "consumer raised", "nack", 3)
    elif op == "redrive":
        boxes[0].redrive(messages[0][0], 5)
    elif op == "redrive_batch":
        from workers.dead_letters import redrive_batch
        redrive_batch([(boxes[i % len(boxes)].paths, m) for i, (m, _) in enumerate(messages)], 5)
    sys.exit(0)
    """
)


@dataclass(frozen=True)
class Case:
    op: str
    fault: str
    before: State | None  # the state the operation starts from (None: not on disk yet)
    after: State | None  # the one state recovery must find (None: absent)
    messages: int = 1
    crashed: tuple[State, ...] | None = None  # where each message is before recovery

    @property
    def id(self) -> str:
        start = f"-from-{self.before}" if self.before else ""
        return f"{self.op}{start}-at-{self.fault.removeprefix('maildir.')}"


CASES = [
    # single delivery: absent until the rename, then durable in new/
    Case("deliver", faults.AFTER_TMP_WRITE, None, None),
    Case("deliver", faults.AFTER_SYNC, None, None),
    Case("deliver", faults.AFTER_RENAME, None, State.NEW),
    Case("deliver_failed", faults.AFTER_TMP_WRITE, None, None),
    Case("deliver_failed", faults.AFTER_RENAME, None, State.FAILED),
    # group commit, 12 messages over 3 mailboxes (the first one a dead letter)
    Case("deliver_batch", faults.AFTER_TMP_WRITE, None, None, messages=12),
    Case("deliver_batch", faults.AFTER_SYNC, None, None, messages=12),
    Case("deliver_batch", faults.AFTER_RENAME, None, State.NEW, messages=12),
    Case("deliver_batch", faults.AFTER_DIR_SYNC, None, State.NEW, messages=12),
    # moves are single renames
    Case("claim", faults.CLAIM_AFTER_RENAME, State.NEW, State.CLAIMED),
    Case("reclaim", faults.RECLAIM_AFTER_RENAME, State.CLAIMED, State.CLAIMED),
    Case("complete", faults.COMPLETE_AFTER_RENAME, State.CLAIMED, State.DONE),
    Case("requeue", faults.REQUEUE_AFTER_RENAME, State.CLAIMED, State.NEW),
    # fail: unchanged until failed/<id> exists, failed from then on
    Case("fail", faults.FAIL_AFTER_TMP_WRITE, State.NEW, State.NEW),
    Case("fail", faults.FAIL_AFTER_FAILED_WRITTEN, State.NEW, State.FAILED),
    Case("fail", faults.FAIL_AFTER_FAILED_WRITTEN, State.CLAIMED, State.FAILED),
    Case("fail", faults.FAIL_AFTER_UNLINK, State.CLAIMED, State.FAILED),
    # redrive (an operator's requeue of a dead letter): a dead letter until failed/<id>
    # is gone; in the window where new/<id> exists too, the dead letter wins (undone,
    # never doubled)
    Case("redrive", faults.REDRIVE_AFTER_TMP_WRITE, State.FAILED, State.FAILED),
    Case("redrive", faults.REDRIVE_AFTER_NEW_WRITTEN, State.FAILED, State.FAILED),
    Case("redrive", faults.REDRIVE_AFTER_UNLINK, State.FAILED, State.NEW),
    # a requeue of many dead letters, 12 over 3 mailboxes, each step done for all: every
    # one is renamed into new/ before any dead letter is removed
    Case("redrive_batch", faults.REDRIVE_AFTER_TMP_WRITE, State.FAILED, State.FAILED, 12),
    Case(
        "redrive_batch",
        faults.REDRIVE_AFTER_NEW_WRITTEN,
        State.FAILED,
        State.FAILED,
        12,
        crashed=(State.NEW, State.FAILED),
    ),
    Case("redrive_batch", faults.REDRIVE_AFTER_UNLINK, State.FAILED, State.NEW, 12),
]
BATCHES = ("deliver_batch", "redrive_batch")


def test_every_fault_point_has_a_crash_case() -> None:
    assert {case.fault for case in CASES} == set(faults.FAULT_POINTS)


def envelope(message_id: str, *, dead: bool = False) -> str:
    data = {
        "id": message_id,
        "subject": "relay.agent.p.backend",
        "from": "relay.agent.p.frontend",
        "replyTo": None,
        "createdAt": NOW,
        "budget": {},
        "payload": {"content": "x" * 2000},  # big enough that a partial write would show
    }
    if dead:
        data["deadLetter"] = {"reason": "hop limit", "code": "hop_limit", "failedAt": NOW}
    return json.dumps(data)


def prepare(box: Mailbox, message_id: str, data: str, state: State | None) -> None:
    if state is None:
        return
    box.deliver(message_id, data.encode())
    if state is State.CLAIMED:
        box.claim(message_id, NOW)
    if state is State.FAILED:
        box.fail(message_id, "consumer raised", "nack", NOW)


def run_child(fault: str, args: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "RELAY_FAULT": fault, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )


def states_on_disk(box: Mailbox, message_id: str) -> list[State]:
    found = []
    if (Path(box.new_dir) / message_id).exists():
        found.append(State.NEW)
    if (Path(box.failed_dir) / message_id).exists():
        found.append(State.FAILED)
    for name in os.listdir(box.cur_dir):
        if name.startswith(message_id):
            found.append(filenames.state_of("cur", filenames.parse_name(name)))
    return found


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_crash_at_each_step_recovers_to_exactly_one_complete_state(
    tmp_path: Path, case: Case
) -> None:
    # Given the mailboxes and the messages in the state the operation starts from
    mailboxes = tmp_path / "mailboxes"
    boxes = [Mailbox.at(mailboxes, f"00000000000{i}") for i in range(3)]
    for box in boxes:
        box.create()
    messages, owner = [], {}
    for index in range(case.messages):
        message_id = new_id()
        dead = case.op == "deliver_failed" or (case.op == "deliver_batch" and index == 0)
        messages.append((message_id, envelope(message_id, dead=dead)))
        owner[message_id] = boxes[index % 3] if case.op in BATCHES else boxes[0]
    for message_id, data in messages:
        prepare(owner[message_id], message_id, data, case.before)

    # When a child process performs the operation and is killed at the fault point
    args = {
        "op": case.op,
        "boxes": [[str(box.root), box.endpoint] for box in boxes],
        "messages": messages,
    }
    child = run_child(case.fault, args)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    if case.crashed is not None:
        for message_id, _ in messages:
            assert tuple(states_on_disk(owner[message_id], message_id)) == case.crashed

    # Then recovery leaves one complete copy per message, in the promised state
    for box in boxes:
        box.recover()
        assert os.listdir(box.tmp_dir) == []
    invalid: list[InvalidFile] = []
    records = {r.id: r for r in iter_records(mailboxes, on_invalid=invalid.append)}
    assert invalid == []
    for index, (message_id, data) in enumerate(messages):
        box = owner[message_id]
        expected = case.after
        if case.op == "deliver_batch" and index == 0 and expected is not None:
            expected = State.FAILED  # the batch's first item is a dead letter
        found = states_on_disk(box, message_id)
        assert found == ([] if expected is None else [expected]), message_id
        if expected is None:
            assert message_id not in records
            continue
        assert records[message_id].state is expected
        state, content = box.read(message_id)
        assert state is expected
        letter, original = json.loads(content), json.loads(data)
        letter.pop("deadLetter", None)
        letter.pop("requeues", None)  # a requeued dead letter keeps its deadLetter there
        original.pop("deadLetter", None)
        assert letter == original  # complete, never partial
