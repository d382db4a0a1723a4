"""Dead letters: moving a message (`Mailbox.fail`), or a file in new/ that is not one
(`Mailbox.quarantine`), into failed/ with its reason; moving one back to new/ (`redrive`,
an operator's requeue of a dead letter); purging failed/.

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

redrive (an operator's requeue of a dead letter): write the message back, then remove
    the dead letter. The file is rewritten, not renamed: new/<id> is the envelope without
    its "deadLetter", which is appended to its "requeues" list with "requeuedAt".
    1. read ``failed/<id>``
    2. write ``tmp/<id>.<pid>`` = the envelope, mtime copied from the dead letter (so
       stored_at stays the original's)                    [maildir.redrive.after_tmp_write]
    3. rename to ``new/<id>``, fsync new/                  [maildir.redrive.after_new_written]
    4. unlink ``failed/<id>``                              [maildir.redrive.after_unlink]
       and fsync failed/
    - crash before 3: a stale tmp file (removed by `recover`); still a dead letter.
    - crash between 3 and 4 (the crash window): the message is in new/ AND in failed/.
      `recover` keeps the failed copy (failed outranks new, as for `fail`'s window), so
      the requeue is undone, never doubled: one copy, a dead letter, and the operator's
      request, which was never answered, can be made again. A power cut may also undo
      the unlink of 4 before failed/ is fsynced: the same state, the same outcome.
    - after 4: waiting in new/ only.

purge_failed (operator request): unlink each failed/<id>, then fsync failed/. A crash
    part-way leaves some dead letters; the request can be repeated.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

from sdk.errors import InvalidState, MessageNotFound
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
from workers.fsio import OPEN_READ, fsync_dir, read_fd, storage_error, store_file
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
    """Move the dead letter ``failed/<message_id>`` back to new/ as the message it was:
    same id, budget and payload, its "deadLetter" moved into "requeues" (a list, with
    "requeuedAt": ``now_ms``), so the file keeps its history. Crash states: above.

    MessageNotFound when there is no such dead letter; InvalidState when it holds no
    envelope (a quarantined file, kept as "raw").
    """
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
    store_file(
        mailbox.tmp_dir,
        mailbox.new_dir,
        message_id,
        data,
        what,
        (REDRIVE_AFTER_TMP_WRITE, "", ""),
        mtime_ns=st.st_mtime_ns,
    )
    fault_point(REDRIVE_AFTER_NEW_WRITTEN)
    try:
        os.unlink(source)
    except FileNotFoundError:
        pass
    except OSError as exc:
        # new/<id> is durable, but so is failed/<id>, which recover() would keep: take
        # the requeue back now, so that what is answered is what stays.
        with contextlib.suppress(OSError):
            os.unlink(f"{mailbox.new_dir}/{message_id}")
            fsync_dir(mailbox.new_dir)
        raise storage_error(what, exc) from exc
    fault_point(REDRIVE_AFTER_UNLINK)
    try:
        fsync_dir(mailbox.failed_dir)
    except OSError as exc:
        # Requeued; only a power cut now could bring the dead letter back (recover()
        # would then keep it, as after a crash in the window above).
        log.warning("%s: could not fsync %s: %s", what, mailbox.failed_dir, exc)


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
