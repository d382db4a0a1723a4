"""The Maildir store on real files: states and names, modes, claim races, group commit,
tmp sweeping, recovery of hand-made crash states, and the scan the index is rebuilt from.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.errors import AlreadyClaimed, InvalidMessage, InvalidState, MessageNotFound, StorageError
from sdk.ids import new_id
from workers.dead_letters import redrive_batch
from workers.filenames import FileName, deliveries_of, format_name, parse_name, place_of
from workers.group_commit import deliver_batch
from workers.maildir import Mailbox
from workers.records import MessageRecord, State
from workers.scan import InvalidFile, iter_records, read_record

NOW = 1_764_108_000_000


def make_envelope(
    subject: str = "relay.agent.p.backend", sender: str = "relay.agent.p.frontend", **extra
) -> tuple[str, bytes]:
    message_id = new_id()
    envelope = {
        "id": message_id,
        "subject": subject,
        "from": sender,
        "replyTo": None,
        "createdAt": NOW,
        "budget": {
            "hopCount": 1,
            "maxHops": 5,
            "ancestorChain": [subject],
            "ttl": NOW + 3_600_000,
            "callBudgetRemaining": 9,
        },
        "payload": {"content": "hello"},
        **extra,
    }
    return message_id, json.dumps(envelope).encode()


@pytest.fixture
def mailboxes(tmp_path: Path) -> Path:
    root = tmp_path / "mailboxes"
    root.mkdir()
    return root


@pytest.fixture
def box(mailboxes: Path) -> Mailbox:
    mailbox = Mailbox.at(mailboxes, "0123456789ab")
    mailbox.create()
    return mailbox


def made_boxes(mailboxes: Path, count: int) -> list[Mailbox]:
    """``count`` mailboxes, created."""
    boxes = [Mailbox.at(mailboxes, f"00000000000{i}") for i in range(count)]
    for mailbox in boxes:
        mailbox.create()
    return boxes


def files_in(directory: str) -> list[str]:
    return sorted(os.listdir(directory))


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("01JD0000000000000000000000", FileName("01JD0000000000000000000000")),
        (
            "01JD0000000000000000000000,C=17:2,",
            FileName("01JD0000000000000000000000", 17, None, ""),
        ),
        (
            "01JD0000000000000000000000,C=17,D=18:2,S",
            FileName("01JD0000000000000000000000", 17, 18, "S"),
        ),
        (
            "01JD0000000000000000000000:2,S",
            FileName("01JD0000000000000000000000", None, None, "S"),
        ),
        (
            "01JD0000000000000000000000,S=512,C=17:2,",
            FileName("01JD0000000000000000000000", 17, None, ""),
        ),
        (
            "01JD0000000000000000000000,C=17,N=3:2,",
            FileName("01JD0000000000000000000000", 17, None, "", 3),
        ),
        (
            "01JD0000000000000000000000,C=17,N=2,D=18:2,S",
            FileName("01JD0000000000000000000000", 17, 18, "S", 2),
        ),
    ],
    ids=[
        "new",
        "claimed",
        "done",
        "maildir-native-seen",
        "foreign-field-kept-out",
        "claimed-third-time",
        "done-after-two",
    ],
)
def test_parse_name_reads_claim_and_done_times(name: str, parsed: FileName) -> None:
    assert parse_name(name) == parsed


@pytest.mark.parametrize(
    "parsed",
    [
        FileName("01JD0000000000000000000000"),
        FileName("01JD0000000000000000000000", 17, None, ""),
        FileName("01JD0000000000000000000000", 17, 18, "S"),
        FileName("01JD0000000000000000000000", 17, None, "", 2),
        FileName("01JD0000000000000000000000", 17, 18, "S", 7),
    ],
    ids=["new", "claimed", "done", "claimed-again", "done-after-seven"],
)
def test_format_name_is_the_inverse_of_parse_name(parsed: FileName) -> None:
    assert parse_name(format_name(*parsed)) == parsed


def test_format_name_writes_n_from_the_second_hand_out_on_right_after_c() -> None:
    m = "01JD0000000000000000000000"
    assert format_name(m, 17, None, "", deliveries=1) == f"{m},C=17:2,"
    assert format_name(m, 17, None, "", deliveries=2) == f"{m},C=17,N=2:2,"
    assert format_name(m, 17, 18, "S", deliveries=5) == f"{m},C=17,N=5,D=18:2,S"


@pytest.mark.parametrize(
    ("subdir", "name", "dead_letter", "expected"),
    [
        ("new", "01JD0000000000000000000000", None, 0),
        ("cur", "01JD0000000000000000000000,C=17:2,", None, 1),
        ("cur", "01JD0000000000000000000000,C=17,N=4:2,", None, 4),
        ("cur", "01JD0000000000000000000000,C=17,N=4,D=18:2,S", None, 4),
        ("cur", "01JD0000000000000000000000:2,S", None, 1),
        ("failed", "01JD0000000000000000000000", {"code": "no_match"}, 0),
        ("failed", "01JD0000000000000000000000", {"code": "nack", "deliveries": 3}, 3),
        ("failed", "01JD0000000000000000000000", {"deliveries": "3"}, 0),
        ("failed", "01JD0000000000000000000000", None, 0),
    ],
    ids=[
        "new-never-handed-out",
        "claimed-once",
        "claimed-fourth-time",
        "done-after-four",
        "maildir-native-seen",
        "dead-letter-never-handed-out",
        "dead-letter-of-a-consumer",
        "dead-letter-junk-count",
        "failed-without-dead-letter",
    ],
)
def test_deliveries_of_a_file_follows_its_directory_and_name(
    subdir: str, name: str, dead_letter: dict | None, expected: int
) -> None:
    assert deliveries_of(subdir, parse_name(name), dead_letter) == expected


@pytest.mark.parametrize(
    "name",
    [
        "1764108000.M1P2.host",
        "01JD000000000000000000000",  # 25 chars
        "01JD0000000000000000000000,C=x:2,",
        "01JD0000000000000000000000:1,S",
        "01JD0000000000000000000000.1234",
        "01jd0000000000000000000000",
    ],
    ids=["maildir-unique-name", "short-id", "bad-field", "info-v1", "tmp-name", "lowercase"],
)
def test_parse_name_rejects_what_is_not_a_message_name(name: str) -> None:
    with pytest.raises(InvalidMessage):
        parse_name(name)


# --------------------------------------------------------------------------- lifecycle


def test_create_makes_private_dirs_and_is_idempotent(box: Mailbox) -> None:
    box.create()  # again
    for sub in ("tmp", "new", "cur", "failed"):
        assert stat.S_IMODE(os.stat(box.root / sub).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(box.root).st_mode) == 0o700


def test_deliver_stores_the_file_in_new_with_its_mtime_as_stored_at(box: Mailbox) -> None:
    message_id, data = make_envelope()
    stored_at = box.deliver(message_id, data)
    path = box.root / "new" / message_id
    assert path.read_bytes() == data
    assert stored_at == path.stat().st_mtime_ns // 1_000_000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert files_in(box.tmp_dir) == []


def test_claim_moves_the_file_to_cur_with_the_claim_time(box: Mailbox) -> None:
    message_id, data = make_envelope()
    stored_at = box.deliver(message_id, data)
    name, content = box.claim(message_id, NOW + 5)
    assert name == f"{message_id},C={NOW + 5}:2,"
    assert content == data
    assert files_in(box.new_dir) == []
    assert files_in(box.cur_dir) == [name]
    # a rename keeps the mtime: stored_at is still recoverable from the file
    assert (Path(box.cur_dir) / name).stat().st_mtime_ns // 1_000_000 == stored_at
    assert box.read(message_id) == (State.CLAIMED, data)


def test_complete_marks_a_claimed_message_done(box: Mailbox) -> None:
    message_id, data = make_envelope()
    box.deliver(message_id, data)
    box.claim(message_id, NOW + 5)
    name = box.complete(message_id, NOW + 9)
    assert name == f"{message_id},C={NOW + 5},D={NOW + 9}:2,S"
    assert files_in(box.cur_dir) == [name]
    assert box.read(message_id) == (State.DONE, data)


def test_complete_keeps_how_many_times_the_message_was_handed_out(
    mailboxes: Path, box: Mailbox
) -> None:
    message_id, data = make_envelope()
    (Path(box.cur_dir) / format_name(message_id, NOW, None, "", 3)).write_bytes(data)
    fresh = Mailbox.at(mailboxes, box.endpoint)  # finds the claim by scanning cur/
    name = fresh.complete(message_id, NOW + 1)
    assert name == f"{message_id},C={NOW},N=3,D={NOW + 1}:2,S"


def test_complete_after_a_restart_finds_the_claimed_file_by_scanning(
    mailboxes: Path, box: Mailbox
) -> None:
    message_id, data = make_envelope()
    box.deliver(message_id, data)
    box.claim(message_id, NOW)
    fresh = Mailbox.at(mailboxes, box.endpoint)  # knows nothing of the claim
    fresh.complete(message_id, NOW + 1)
    assert fresh.find(message_id)[0] is State.DONE


def test_complete_finds_a_claim_renamed_by_hand_since_it_was_made(box: Mailbox) -> None:
    message_id, data = make_envelope()
    box.deliver(message_id, data)
    name, _ = box.claim(message_id, NOW)  # the name the mailbox remembers
    by_hand = format_name(message_id, NOW + 3, None, "", 2)
    os.rename(Path(box.cur_dir) / name, Path(box.cur_dir) / by_hand)
    done = box.complete(message_id, NOW + 9)
    assert done == f"{message_id},C={NOW + 3},N=2,D={NOW + 9}:2,S"
    assert files_in(box.cur_dir) == [done]


def test_complete_of_a_claim_whose_file_is_gone_is_not_found(box: Mailbox) -> None:
    message_id, data = make_envelope()
    box.deliver(message_id, data)
    name, _ = box.claim(message_id, NOW)
    os.unlink(Path(box.cur_dir) / name)
    with pytest.raises(MessageNotFound):
        box.complete(message_id, NOW + 1)


@pytest.mark.parametrize(
    ("state", "error"),
    [("new", InvalidState), ("done", InvalidState), ("failed", InvalidState), ("none", None)],
)
def test_complete_refuses_a_message_that_is_not_claimed(
    box: Mailbox, state: str, error: type[Exception] | None
) -> None:
    message_id, data = make_envelope()
    if state != "none":
        box.deliver(message_id, data)
    if state == "done":
        box.claim(message_id, NOW)
        box.complete(message_id, NOW)
    if state == "failed":
        box.fail(message_id, "expired", "ttl", NOW)
    with pytest.raises(error or MessageNotFound):
        box.complete(message_id, NOW + 1)


def test_claim_of_a_message_gone_from_new(box: Mailbox) -> None:
    claimed, data = make_envelope()
    box.deliver(claimed, data)
    box.claim(claimed, NOW)
    with pytest.raises(AlreadyClaimed):
        box.claim(claimed, NOW)
    failed, data = make_envelope()
    box.deliver(failed, data)
    box.fail(failed, "nope", "nack", NOW)
    with pytest.raises(AlreadyClaimed):
        box.claim(failed, NOW)
    with pytest.raises(MessageNotFound):
        box.claim(new_id(), NOW)


@pytest.mark.parametrize("claimed", [False, True], ids=["from-new", "from-claimed"])
def test_fail_writes_a_dead_letter_and_removes_the_original(box: Mailbox, claimed: bool) -> None:
    message_id, data = make_envelope()
    stored_at = box.deliver(message_id, data)
    if claimed:
        box.claim(message_id, NOW)
    size = box.fail(message_id, "handler raised KeyError", "nack", NOW + 7)
    path = Path(box.failed_dir) / message_id
    letter = json.loads(path.read_bytes())
    # A claimed message's dead letter says when it was claimed (a nack's trace shows it).
    claim = {"claimedAt": NOW} if claimed else {}
    assert letter == {
        **json.loads(data),
        "deadLetter": {
            "reason": "handler raised KeyError",
            "code": "nack",
            "failedAt": NOW + 7,
            "endpoint": box.endpoint,
            **claim,
            **({"deliveries": 1} if claimed else {}),  # it was handed out once
        },
    }
    assert read_record(box, "failed", message_id).claimed_at == (NOW if claimed else None)
    assert size == path.stat().st_size
    assert path.stat().st_mtime_ns // 1_000_000 == stored_at  # stored_at survives a failure
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert files_in(box.new_dir) == files_in(box.cur_dir) == files_in(box.tmp_dir) == []
    assert box.find(message_id)[0] is State.FAILED


def test_fail_refuses_done_and_failed_messages(box: Mailbox) -> None:
    message_id, data = make_envelope()
    box.deliver(message_id, data)
    box.claim(message_id, NOW)
    box.complete(message_id, NOW)
    with pytest.raises(InvalidState):
        box.fail(message_id, "late", "nack", NOW)
    other, data = make_envelope()
    box.deliver(other, data)
    box.fail(other, "first", "nack", NOW)
    with pytest.raises(InvalidState):
        box.fail(other, "second", "nack", NOW)
    with pytest.raises(MessageNotFound):
        box.fail(new_id(), "ghost", "nack", NOW)


def test_deliver_failed_stores_a_prebuilt_dead_letter(box: Mailbox) -> None:
    message_id, data = make_envelope(
        deadLetter={"reason": "hop limit", "code": "hop_limit", "failedAt": NOW, "endpoint": "x"}
    )
    box.deliver_failed(message_id, data)
    assert box.read(message_id) == (State.FAILED, data)


def test_requeue_puts_a_claimed_message_back_in_new(box: Mailbox) -> None:
    message_id, data = make_envelope()
    box.deliver(message_id, data)
    box.claim(message_id, NOW)
    box.requeue(message_id)
    assert box.list_new() == [message_id]
    box.claim(message_id, NOW + 1)
    box.complete(message_id, NOW + 2)
    with pytest.raises(InvalidState):
        box.requeue(message_id)


def test_list_new_is_in_id_order_and_ignores_foreign_names(box: Mailbox) -> None:
    ids = [make_envelope() for _ in range(5)]
    for message_id, data in reversed(ids):
        box.deliver(message_id, data)
    (Path(box.new_dir) / "1764108000.M1P2.host").write_bytes(b"{}")
    assert box.list_new() == [message_id for message_id, _ in ids]


def test_read_of_an_unknown_id_is_not_found(box: Mailbox) -> None:
    assert box.find(new_id()) is None
    with pytest.raises(MessageNotFound):
        box.read(new_id())


def test_purge_failed_removes_dead_letters_only(box: Mailbox) -> None:
    kept, data = make_envelope()
    box.deliver(kept, data)
    dead, data = make_envelope()
    box.deliver(dead, data)
    box.fail(dead, "x", "nack", NOW)
    assert box.purge_failed() == [dead]
    assert box.list_new() == [kept]
    assert files_in(box.failed_dir) == []


# --------------------------------------------------------------------------- races


def _claim_all(root: str, endpoint: str, ids: list[str], start, results) -> None:
    mailbox = Mailbox(root, endpoint)
    start.wait()
    won, lost = [], 0
    for message_id in ids:
        try:
            mailbox.claim(message_id, NOW, sync=False)
            won.append(message_id)
        except AlreadyClaimed:
            lost += 1
    results.put((won, lost))


def test_two_processes_racing_to_claim_each_message_exactly_one_wins(box: Mailbox) -> None:
    # Given 300 messages in new/ and two processes claiming all of them in the same order
    ids = []
    for _ in range(300):
        message_id, data = make_envelope()
        box.deliver(message_id, data)
        ids.append(message_id)
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_claim_all, args=(str(box.root), box.endpoint, ids, start, results))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    start.set()
    outcomes = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    # Then every message was won by exactly one of them and lost by the other
    (won_a, lost_a), (won_b, lost_b) = outcomes
    assert set(won_a).isdisjoint(won_b)
    assert sorted(won_a + won_b) == sorted(ids)
    assert lost_a == len(ids) - len(won_a) and lost_b == len(ids) - len(won_b)
    assert len(files_in(box.cur_dir)) == len(ids) and files_in(box.new_dir) == []


# --------------------------------------------------------------------------- group commit


def test_deliver_batch_stores_every_item_in_its_target(mailboxes: Path) -> None:
    boxes = made_boxes(mailboxes, 3)
    items = []
    for i in range(30):
        message_id, data = make_envelope()
        items.append((boxes[i % 3], message_id, data, "failed" if i % 10 == 0 else "new"))
    results = deliver_batch(items)
    for (mailbox, message_id, data, target), stored_at in zip(items, results, strict=True):
        path = Path(mailbox.dir_of(target)) / message_id
        assert path.read_bytes() == data
        assert stored_at == path.stat().st_mtime_ns // 1_000_000
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert all(files_in(mailbox.tmp_dir) == [] for mailbox in boxes)


def test_deliver_batch_item_whose_mailbox_vanished_fails_alone(mailboxes: Path) -> None:
    # Given a batch for three mailboxes, one of which was removed from disk
    boxes = made_boxes(mailboxes, 3)
    shutil.rmtree(boxes[1].root)
    items = [(boxes[i % 3], *make_envelope(), "new") for i in range(9)]
    # When it is delivered
    results = deliver_batch(items)
    # Then only the vanished mailbox's items fail, with a StorageError, and nothing is left
    for (mailbox, message_id, _, _), result in zip(items, results, strict=True):
        if mailbox is boxes[1]:
            assert isinstance(result, StorageError)
            assert "ENOENT" in str(result)
        else:
            assert isinstance(result, int)
            assert mailbox.find(message_id)[0] is State.NEW
    assert not boxes[1].root.exists()
    assert files_in(boxes[0].tmp_dir) == files_in(boxes[2].tmp_dir) == []


def test_deliver_batch_with_a_duplicate_id_fails_the_duplicate_only(box: Mailbox) -> None:
    message_id, data = make_envelope()
    other, other_data = make_envelope()
    results = deliver_batch(
        [
            (box, message_id, data, "new"),
            (box, message_id, data, "new"),
            (box, other, other_data, "new"),
        ]
    )
    assert isinstance(results[0], int) and isinstance(results[2], int)
    assert isinstance(results[1], StorageError)
    assert box.list_new() == sorted([message_id, other])
    assert files_in(box.tmp_dir) == []


def test_deliver_batch_stores_a_cur_item_claimed_at_its_stored_time(box: Mailbox) -> None:
    # Given a batch where one copy already has a consumer waiting for it
    waiting, waiting_data = make_envelope()
    claimed, claimed_data = make_envelope()
    results = deliver_batch(
        [(box, waiting, waiting_data, "new"), (box, claimed, claimed_data, "cur")]
    )
    # Then it skips new/: claimed since the moment it was stored, and completable
    assert box.list_new() == [waiting]
    [name] = files_in(box.cur_dir)
    assert name == f"{claimed},C={results[1]}:2,"
    assert box.read(claimed) == (State.CLAIMED, claimed_data)
    box.complete(claimed, results[1] + 1)
    assert box.find(claimed)[0] is State.DONE
    assert files_in(box.tmp_dir) == []


def test_deliver_batch_of_one_takes_the_single_file_path(box: Mailbox) -> None:
    message_id, data = make_envelope()
    [stored_at] = deliver_batch([(box, message_id, data, "new")])
    assert isinstance(stored_at, int)
    assert box.read(message_id) == (State.NEW, data)


def test_redrive_batch_requeues_what_it_can_and_refuses_each_other_item_alone(
    mailboxes: Path,
) -> None:
    # Given dead letters in two mailboxes, a quarantined file and an id with no dead letter
    boxes = made_boxes(mailboxes, 2)
    dead = []
    for i in range(6):
        message_id, data = make_envelope()
        stored_at = boxes[i % 2].deliver(message_id, data)
        boxes[i % 2].fail(message_id, "consumer raised", "nack", NOW)
        dead.append((boxes[i % 2], message_id, data, stored_at))
    (Path(boxes[0].new_dir) / "README").write_bytes(b"junk")
    junk = boxes[0].quarantine("README", "not a JSON envelope", "invalid_message", NOW)
    items = [(m.paths, i) for m, i, _, _ in dead] + [
        (boxes[0].paths, junk),
        (boxes[1].paths, new_id()),
    ]
    # When they are requeued in one batch
    results = redrive_batch(items, NOW + 5)
    # Then each dead letter is back in new/ as the message it was, its dead letter in its
    # history and its mtime the original's; the others are refused and left as they were
    assert results[:6] == [None] * 6
    for mailbox, message_id, data, stored_at in dead:
        state, content = mailbox.read(message_id)
        requeued = json.loads(content)
        assert state is State.NEW and requeued.pop("requeues")[0]["requeuedAt"] == NOW + 5
        assert requeued == json.loads(data)
        assert (Path(mailbox.new_dir) / message_id).stat().st_mtime_ns // 10**6 == stored_at
    assert isinstance(results[6], InvalidState) and isinstance(results[7], MessageNotFound)
    assert boxes[0].find(junk)[0] is State.FAILED
    assert all(files_in(m.failed_dir) == [junk] * (m is boxes[0]) for m in boxes)
    assert all(files_in(m.tmp_dir) == [] for m in boxes)


def _comparable(records: list[MessageRecord]) -> list[tuple]:
    return sorted((r.endpoint, r.state, r.subject, r.size) for r in records)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    targets=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["new", "failed"]), st.integers(0, 300)),
        min_size=1,
        max_size=40,
    )
)
def test_group_commit_stores_what_one_by_one_delivery_stores(
    tmp_path_factory: pytest.TempPathFactory, targets: list[tuple[int, str, int]]
) -> None:
    # The fast path (deliver_batch) held to the obvious one (deliver / deliver_failed).
    roots = [tmp_path_factory.mktemp("batch"), tmp_path_factory.mktemp("single")]
    for root in roots:
        for i in range(3):
            Mailbox.at(root, f"00000000000{i}").create()
    items = []
    for endpoint, target, pad in targets:
        message_id, data = make_envelope(
            pad="x" * pad,
            deadLetter={"reason": "r", "code": "c", "failedAt": NOW, "endpoint": "e"},
        )
        items.append((f"00000000000{endpoint}", message_id, data, target))
    batch = deliver_batch([(Mailbox.at(roots[0], e), i, d, t) for e, i, d, t in items])
    assert all(isinstance(result, int) for result in batch)
    for endpoint, message_id, data, target in items:
        single = Mailbox.at(roots[1], endpoint)
        (single.deliver if target == "new" else single.deliver_failed)(message_id, data)
    assert _comparable(list(iter_records(roots[0]))) == _comparable(list(iter_records(roots[1])))


# --------------------------------------------------------------------------- sweep, recover


def test_sweep_tmp_removes_own_stale_files_and_old_foreign_ones(box: Mailbox) -> None:
    tmp = Path(box.tmp_dir)
    own = tmp / f"{new_id()}.99999"
    fresh_foreign = tmp / "1764108000.M1P2.host"
    old_foreign = tmp / "1600000000.M1P2.host"
    for path in (own, fresh_foreign, old_foreign):
        path.write_bytes(b"partial")
    now = time.time()
    old = now - 37 * 3600
    os.utime(old_foreign, (old, old))
    # a periodic sweep with a grace period keeps a young own file
    assert box.sweep_tmp(own_older_than_s=60, now=now) == 1
    assert sorted(p.name for p in tmp.iterdir()) == sorted([own.name, fresh_foreign.name])
    # at start every own file is stale; a foreign one younger than 36 h is not
    assert box.sweep_tmp(now=now) == 1
    assert [p.name for p in tmp.iterdir()] == [fresh_foreign.name]


def test_recover_keeps_the_most_advanced_copy_of_each_message(box: Mailbox) -> None:
    # Given the leftovers of a crash inside fail() and of a half-undone claim
    half_failed, data = make_envelope()
    box.deliver(half_failed, data)
    (Path(box.failed_dir) / half_failed).write_bytes(data)  # stand-in dead letter
    both_new_and_cur, data2 = make_envelope()
    box.deliver(both_new_and_cur, data2)
    (Path(box.cur_dir) / format_name(both_new_and_cur, NOW, None, "")).write_bytes(data2)
    claimed_and_done, data3 = make_envelope()
    (Path(box.cur_dir) / format_name(claimed_and_done, NOW, None, "")).write_bytes(data3)
    (Path(box.cur_dir) / format_name(claimed_and_done, NOW, NOW, "S")).write_bytes(data3)
    untouched, data4 = make_envelope()
    box.deliver(untouched, data4)
    (Path(box.tmp_dir) / f"{new_id()}.4242").write_bytes(b"half")
    # When the mailbox is recovered
    report = box.recover()
    # Then each message is in exactly one state, the most advanced one
    assert report.tmp_removed == 1 and report.duplicates_removed == 3
    assert box.find(half_failed)[0] is State.FAILED
    assert box.find(both_new_and_cur)[0] is State.CLAIMED
    assert box.find(claimed_and_done)[0] is State.DONE
    assert box.list_new() == [untouched]
    assert len(files_in(box.cur_dir)) == 2
    assert files_in(box.tmp_dir) == []


# --------------------------------------------------------------------------- scan


def test_iter_records_reads_every_state_from_names_and_json(box: Mailbox) -> None:
    ids = [make_envelope(subject=f"relay.s{i}", sender=f"relay.f{i}") for i in range(4)]
    stored = {message_id: box.deliver(message_id, data) for message_id, data in ids}
    (a, _), (b, _), (c, _), (d, _) = ids
    box.claim(b, NOW + 1)
    box.claim(c, NOW + 2)
    box.complete(c, NOW + 3)
    size = box.fail(d, "boom", "nack", NOW + 4)
    records = {r.id: r for r in iter_records(box.root.parent)}
    assert records[a] == MessageRecord(
        a, box.endpoint, "relay.s0", "relay.f0", State.NEW, NOW, stored[a], size=len(ids[0][1])
    )
    assert records[b].state is State.CLAIMED and records[b].claimed_at == NOW + 1
    assert (records[c].state, records[c].claimed_at, records[c].finished_at) == (
        State.DONE,
        NOW + 2,
        NOW + 3,
    )
    assert records[d] == MessageRecord(
        d,
        box.endpoint,
        "relay.s3",
        "relay.f3",
        State.FAILED,
        NOW,
        stored[d],
        finished_at=NOW + 4,
        reason="boom",
        reason_code="nack",
        size=size,
    )


def test_a_maildir_native_producer_drop_is_found_and_junk_is_reported(box: Mailbox) -> None:
    # Given an external producer that writes tmp/ then renames into new/, as Maildir says
    message_id, data = make_envelope()
    tmp = Path(box.tmp_dir) / "1764108000.M1P2.otherhost"
    tmp.write_bytes(data)
    os.rename(tmp, Path(box.new_dir) / message_id)
    # and some junk beside it
    junk_id = new_id()
    (Path(box.new_dir) / junk_id).write_bytes(b"not json at all")
    (Path(box.new_dir) / "README").write_text("hello")
    _, wrong_data = make_envelope()
    wrong_name = new_id()  # a valid envelope under another message's name
    (Path(box.new_dir) / wrong_name).write_bytes(wrong_data)
    # When the mailboxes are scanned
    invalid: list[InvalidFile] = []
    records = list(iter_records(box.root.parent, [box.endpoint], invalid.append))
    # Then the producer's message is a record, and each junk file is reported, not yielded
    assert [r.id for r in records] == [message_id]
    assert records[0].state is State.NEW and records[0].subject == "relay.agent.p.backend"
    assert sorted(Path(bad.path).name for bad in invalid) == sorted(["README", junk_id, wrong_name])
    assert all(bad.endpoint == box.endpoint for bad in invalid)
    # one file at a time, as the writer's inotify handler reads them: the same verdicts
    assert read_record(box, "new", message_id) == records[0]
    assert read_record(box, "new", junk_id) is None
    assert read_record(box, "new", "README") is None
    assert read_record(box, "new", new_id()) is None


def test_quarantine_turns_junk_into_a_dead_letter_the_scan_accepts(box: Mailbox) -> None:
    (Path(box.new_dir) / "README").write_bytes(b"\xffnot utf-8 json")
    message_id = box.quarantine("README", "not a JSON envelope", "invalid_message", NOW)
    assert files_in(box.new_dir) == []
    letter = json.loads((Path(box.failed_dir) / message_id).read_bytes())
    assert letter["originalName"] == "README" and letter["raw"].endswith("not utf-8 json")
    [record] = list(iter_records(box.root.parent, on_invalid=None))
    assert (record.id, record.state, record.reason_code) == (
        message_id,
        State.FAILED,
        "invalid_message",
    )


def test_iter_records_of_absent_mailboxes_is_empty(mailboxes: Path) -> None:
    assert list(iter_records(mailboxes, ["ffffffffffff"])) == []
    assert list(iter_records(mailboxes / "nowhere")) == []


@pytest.mark.parametrize("bad_id", ["../../etc/passwd", "", "01JD0000000000000000000000/x"])
def test_an_id_that_is_not_a_ulid_never_becomes_a_path(box: Mailbox, bad_id: str) -> None:
    for operation in (
        lambda: box.deliver(bad_id, b"{}"),
        lambda: box.claim(bad_id, NOW),
        lambda: box.complete(bad_id, NOW),
        lambda: box.fail(bad_id, "r", "c", NOW),
        lambda: box.read(bad_id),
    ):
        with pytest.raises(InvalidMessage):
            operation()
    message_id, data = make_envelope()
    results = deliver_batch([(box, bad_id, b"{}", "new"), (box, message_id, data, "new")])
    assert isinstance(results[0], InvalidMessage) and isinstance(results[1], int)
    assert box.list_new() == [message_id]


def test_an_index_row_names_its_file_without_a_listing(box: Mailbox) -> None:
    """place_of(row) is where the file is, in every state (the router reads a reply's
    parent this way: one open, no listing of cur/)."""
    ids = []
    for _ in range(5):
        message_id, data = make_envelope()
        box.deliver(message_id, data)
        ids.append(message_id)
    box.claim(ids[1], NOW)
    box.claim(ids[2], NOW)
    box.reclaim(ids[2], NOW + 1, 3)
    box.claim(ids[3], NOW)
    box.reclaim(ids[3], NOW + 1, 2)
    box.complete(ids[3], NOW + 2)
    box.fail(ids[4], "no", "nack", NOW + 3)
    records = {r.id: r for r in iter_records(Path(box.root).parent, [box.endpoint])}
    assert {r.state for r in records.values()} == set(State)
    for record in records.values():
        subdir, name = place_of(
            record.state, record.id, record.claimed_at, record.finished_at, record.deliveries
        )
        assert (Path(box.root) / subdir / name).is_file(), (record.state, name)
