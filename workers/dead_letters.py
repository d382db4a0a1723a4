"""Dead letters: moving a message (`Mailbox.fail`), or a file in new/ that is not one
(`Mailbox.quarantine`), into failed/ with its reason; moving them back to new/
(`redrive_batch`, an operator's requeue of dead letters, a batch with one flush);
purging failed/.

Order of writes, and what a crash between two steps leaves behind (the conventions of
workers/maildir.py):

fail (and quarantine): write the dead letter, then remove the original
    1. read the original from new/ or cur/ (claimed)
    2. write ``tmp/<id>.<pid>`` = envelope + "deadLetter", mtime copied from the
       original (before the fsync)                           [maildir.fail.after_tmp_write]
    3. rename to ``failed/<id>``, fsync failed/              [maildir.fail.after_failed_written]
    4. unlink the original                                   [maildir.fail.after_unlink]
       and fsync its directory
    - crash before 3: a stale tmp file (removed by `recover`); the message is unchanged.
    - crash between 3 and 4: the message is in failed/ AND in new/ or cur/. `recover`
      removes the non-failed copy: the failure was decided and is on disk.
    - after 4: failed only.

redrive (an operator's requeue of dead letters, `redrive_batch`): write each message
    back, then remove its dead letter; each step done for the whole batch, like a group
    commit (workers/group_commit.py), so that a batch costs one flush of its files and
    one of each directory it touched, not three fsyncs a message. The file is
    rewritten, not renamed: new/<id> is the envelope without its "deadLetter", which is
    appended to its "requeues" list with "requeuedAt".
    1. read each ``failed/<id>``; write ``tmp/<id>.<pid>`` = the envelope, mtime copied
       from the dead letter (so stored_at stays the original's), no fsync yet
                                                          [maildir.redrive.after_tmp_write]
    2. one flush of the tmp files: syncfs per filesystem (fsync for a single file)
    3. rename each to ``new/<id>``, then fsync each new/ once
                                                          [maildir.redrive.after_new_written]
    4. unlink each ``failed/<id>``                         [maildir.redrive.after_unlink]
       then fsync each failed/ once
    - crash before 3: stale tmp files (removed by `recover`); still dead letters.
    - crash in 3 or between 3 and 4 (the crash window): a message is in new/ AND in
      failed/. `recover` keeps the failed copy (failed outranks new, as for `fail`'s
      window), so the requeue is undone, never doubled: one copy, a dead letter, and the
      operator's request, which was never answered, can be made again. A power cut may
      also undo the unlinks of 4 before failed/ is fsynced: the same state, the same
      outcome. A crash part-way through 4 leaves some messages requeued and the others
      dead letters, each in exactly one state.
    - after 4: waiting in new/ only.
    The renames of 3 are durable (new/ fsynced) before any unlink of 4: a dead letter
    is never removed while its message could still vanish from new/.

purge_failed (operator request): unlink each failed/<id>, then fsync failed/. A crash
    part-way leaves some dead letters; the request can be repeated.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from sdk.errors import InvalidMessage, InvalidState, MessageNotFound, RelayError, StorageError
from sdk.ids import is_id, new_id
from workers.faults import (
    FAIL_AFTER_FAILED_WRITTEN,
    FAIL_AFTER_TMP_WRITE,
    FAIL_AFTER_UNLINK,
    REDRIVE_AFTER_NEW_WRITTEN,
    REDRIVE_AFTER_TMP_WRITE,
    REDRIVE_AFTER_UNLINK,
    fault_point,
)
from workers.filenames import deliveries_of, parse_name
from workers.flush import Written, sync_dirs
from workers.fsio import (
    FILE_MODE,
    OPEN_NEW,
    OPEN_READ,
    fsync_dir,
    read_fd,
    storage_error,
    store_file,
    unlink_quiet,
    write_all,
)
from workers.mailbox_paths import MailboxPaths

log = logging.getLogger("relay.maildir")


def quarantine(mailbox: MailboxPaths, name: str, reason: str, code: str, now_ms: int) -> str:
    """Dead-letter a file in new/ that is not a valid envelope (see `iter_records`).

    The dead letter is ``{"id", "raw", "originalName", "deadLetter"}`` with the
    original bytes as text in "raw". Its id is the file name when that is a free
    message id, else a new one. Returns the id.
    """
    message_id = name
    if not is_id(name) or os.path.exists(f"{mailbox.failed_dir}/{name}"):
        message_id = new_id(now_ms)
    move_to_failed(
        mailbox, mailbox.new_dir, name, message_id, reason, code, now_ms, keep_envelope=False
    )
    return message_id


def move_to_failed(
    mailbox: MailboxPaths,
    source_dir: str,
    name: str,
    message_id: str,
    reason: str,
    code: str,
    now_ms: int,
    *,
    keep_envelope: bool,
) -> int:
    """Write ``failed/<message_id>`` from ``<source_dir>/<name>`` with a "deadLetter",
    then remove the original; returns the dead letter's size in bytes.

    With ``keep_envelope`` the original's JSON object gets the "deadLetter" field;
    otherwise (or when it is not a JSON object) its bytes are kept as text in "raw".
    """
    source = f"{source_dir}/{name}"
    what = f"fail {message_id} in {mailbox.endpoint}"
    st, raw = _read(source, f"no message {message_id} in {mailbox.endpoint}", what)
    dead_letter = {
        "reason": reason,
        "code": code,
        "failedAt": now_ms,
        "endpoint": mailbox.endpoint,
    }
    if source_dir == mailbox.cur_dir:
        # A claimed message (a nack): when it was claimed and how many times it was
        # handed out, as its name in cur/ says, kept so that the rebuilt index says it too.
        parsed = parse_name(name)
        if parsed.claimed_at is not None:
            dead_letter["claimedAt"] = parsed.claimed_at
        dead_letter["deliveries"] = deliveries_of("cur", parsed)
    envelope = None
    if keep_envelope:
        try:
            envelope = json.loads(raw)
        except ValueError:
            envelope = None
    if isinstance(envelope, dict):
        envelope["deadLetter"] = dead_letter
    else:
        envelope = {
            "id": message_id,
            "raw": raw.decode("utf-8", "replace"),
            "originalName": name,
            "deadLetter": dead_letter,
        }
    data = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()
    store_file(
        mailbox.tmp_dir,
        mailbox.failed_dir,
        message_id,
        data,
        f"fail {message_id} to {mailbox.endpoint}",
        (FAIL_AFTER_TMP_WRITE, "", ""),
        mtime_ns=st.st_mtime_ns,
    )
    fault_point(FAIL_AFTER_FAILED_WRITTEN)
    try:
        os.unlink(source)
        fault_point(FAIL_AFTER_UNLINK)
        fsync_dir(source_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        # failed/<id> is durable; recover() drops the original at the next start.
        log.warning("%s: could not remove the original %s: %s", what, source, exc)
    return len(data)


def redrive(mailbox: MailboxPaths, message_id: str, now_ms: int) -> None:
    """Requeue one dead letter (`redrive_batch` of one); raises its error."""
    (error,) = redrive_batch([(mailbox, message_id)], now_ms)
    if error is not None:
        raise error


def redrive_batch(
    items: Sequence[tuple[MailboxPaths, str]], now_ms: int
) -> list[RelayError | None]:
    """Move each dead letter ``failed/<id>`` back to new/ as the message it was: same id,
    budget and payload, its "deadLetter" moved into "requeues" (a list, with
    "requeuedAt": ``now_ms``), so the file keeps its history. Each step is done for all
    items at once (crash states: above). Per item None (requeued, durably) or its error:
    MessageNotFound when there is no such dead letter, InvalidState when it holds no
    envelope (a quarantined file, kept as "raw"), InvalidMessage for an id that is not a
    ULID, StorageError; one item's error leaves the others be.
    """
    results: list[RelayError | None] = [None] * len(items)
    files = Written()
    written = []  # (index, mailbox, id, tmp path, st_dev)
    for i, (mailbox, message_id) in enumerate(items):
        try:
            tmp, dev = _write_requeued(mailbox, message_id, now_ms, files)
        except RelayError as exc:
            results[i] = exc
            continue
        written.append((i, mailbox, message_id, tmp, dev))
    fault_point(REDRIVE_AFTER_TMP_WRITE)

    failed_dev = files.flush()
    renamed = []  # (index, mailbox, id, st_dev)
    for i, mailbox, message_id, tmp, dev in written:
        try:
            if dev in failed_dev:
                raise failed_dev[dev]
            os.rename(tmp, f"{mailbox.new_dir}/{message_id}")
        except OSError as exc:
            unlink_quiet(tmp)
            results[i] = _requeue_error(mailbox, message_id, exc)
            continue
        renamed.append((i, mailbox, message_id, dev))
    new_error = sync_dirs({m.new_dir: dev for _, m, _, dev in renamed})
    fault_point(REDRIVE_AFTER_NEW_WRITTEN)

    unlinked = []  # (mailbox, st_dev)
    for i, mailbox, message_id, dev in renamed:
        error = new_error[mailbox.new_dir]
        if error is not None:  # not durable: take it back, the dead letter stays
            unlink_quiet(f"{mailbox.new_dir}/{message_id}")
        else:
            error = _unlink_dead_letter(mailbox, message_id)
        if error is not None:
            results[i] = _requeue_error(mailbox, message_id, error)
            continue
        unlinked.append((mailbox, dev))
    fault_point(REDRIVE_AFTER_UNLINK)

    for failed_dir, error in sync_dirs({m.failed_dir: dev for m, dev in unlinked}).items():
        if error is not None:
            # Requeued; only a power cut now could bring the dead letters back (recover()
            # would then keep them, as after a crash in the window above).
            log.warning("requeue of dead letters: could not fsync %s: %s", failed_dir, error)
    return results


def _write_requeued(
    mailbox: MailboxPaths, message_id: str, now_ms: int, files: Written
) -> tuple[str, int]:
    """Step 1 for one dead letter: its message written to tmp/, not flushed (``files``
    keeps what flushes it). Returns the tmp path and its filesystem."""
    if not is_id(message_id):  # never a path: it becomes one
        raise InvalidMessage(f"message id {message_id!r:.40} is not a ULID")
    source = f"{mailbox.failed_dir}/{message_id}"
    what = f"requeue dead letter {message_id} in {mailbox.endpoint}"
    st, raw = _read(source, f"no dead letter {message_id} in {mailbox.endpoint}", what)
    envelope = _requeued_envelope(raw, message_id, now_ms)
    if envelope is None:
        raise InvalidState(
            f"dead letter {message_id} in {mailbox.endpoint} is not a message (a file "
            "that was not an envelope when it arrived): it cannot be requeued"
        )
    data = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()
    tmp = f"{mailbox.tmp_dir}/{message_id}.{os.getpid()}"
    try:
        fd = os.open(tmp, OPEN_NEW, FILE_MODE)
    except OSError as exc:
        raise storage_error(what, exc) from exc
    keep = False
    try:
        write_all(fd, data)
        os.utime(fd, ns=(st.st_mtime_ns, st.st_mtime_ns))
        dev = os.fstat(fd).st_dev
        keep = files.add(fd, dev)
        return tmp, dev
    except OSError as exc:
        unlink_quiet(tmp)
        raise storage_error(what, exc) from exc
    finally:
        if not keep:
            os.close(fd)


def _unlink_dead_letter(mailbox: MailboxPaths, message_id: str) -> OSError | None:
    """Step 4 for one message, durable in new/: remove its dead letter. When that fails,
    take the requeue back (new/<id> removed, durably), since recover() would keep the
    dead letter anyway: what is answered is what stays. Returns the error, if any."""
    try:
        os.unlink(f"{mailbox.failed_dir}/{message_id}")
    except FileNotFoundError:
        pass
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(f"{mailbox.new_dir}/{message_id}")
            fsync_dir(mailbox.new_dir)
        return exc
    return None


def _requeue_error(mailbox: MailboxPaths, message_id: str, exc: OSError) -> StorageError:
    return storage_error(f"requeue dead letter {message_id} in {mailbox.endpoint}", exc)


def _read(path: str, missing: str, what: str) -> tuple[os.stat_result, bytes]:
    """A file's status (its mtime is kept on the copy written) and content."""
    try:
        fd = os.open(path, OPEN_READ)
        try:
            st = os.fstat(fd)
            return st, read_fd(fd, st.st_size)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise MessageNotFound(missing) from None
    except OSError as exc:
        raise storage_error(what, exc) from exc


def _requeued_envelope(raw: bytes, message_id: str, now_ms: int) -> dict[str, Any] | None:
    """The dead letter's envelope as it goes back to new/, or None if it has none."""
    try:
        envelope = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(envelope, dict) or "raw" in envelope or envelope.get("id") != message_id:
        return None
    dead_letter = envelope.pop("deadLetter", None)
    if isinstance(dead_letter, dict):
        history = envelope.get("requeues")
        history = history if isinstance(history, list) else []
        envelope["requeues"] = [*history, {**dead_letter, "requeuedAt": now_ms}]
    return envelope


def purge_failed(mailbox: MailboxPaths) -> list[str]:
    """Delete every dead letter of ``mailbox``; returns the ids removed.

    An operator's request, off the hot path (deletes are slow to recover from on this
    ext4, see workers/maildir.py). Files in failed/ whose name is not a message id are
    left for a person to look at.
    """
    try:
        names = os.listdir(mailbox.failed_dir)
    except FileNotFoundError:
        return []
    removed = []
    for name in sorted(names):
        if len(name) != 26 or not is_id(name):
            continue
        try:
            os.unlink(f"{mailbox.failed_dir}/{name}")
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error(f"purge {name} in {mailbox.endpoint}", exc) from exc
        removed.append(name)
    if removed:
        try:
            fsync_dir(mailbox.failed_dir)
        except OSError as exc:
            raise storage_error(f"purge dead letters of {mailbox.endpoint}", exc) from exc
    return removed
