"""Group commit: many messages, in many mailboxes, stored with one flush
(`deliver_batch`, the writer's hot path).

Order of writes, and what a crash between two steps leaves behind (the conventions of
workers/maildir.py; its single `deliver` is the same steps for one file):

deliver_batch (group commit): the same steps, each done for the whole batch
    1. write every tmp file, no fsync                            [maildir.after_tmp_write]
    2. one syncfs() per filesystem in the batch (fsync when a filesystem has a single
       file: same durability without flushing unrelated dirty data) [maildir.after_sync]
    3. rename each tmp file into its target dir                  [maildir.after_rename]
       (``cur/<id>,C=<stored_at>:2,`` for a copy stored claimed: a consumer with
       credit was waiting, so the copy skips new/ and the second commit a claim costs)
    4. fsync each distinct target dir once                       [maildir.after_dir_sync]
    Crash states are those of single delivery, for each file independently: some
    files may already be in new/ (or cur/) and others still in tmp/; none is
    acknowledged. A copy stored claimed that a crash leaves in cur/ was handed to no
    consumer; it is listed as pending (like a claim whose consumer died), and an
    operator requeues or completes it.
    A failure of one item (ENOSPC, EDQUOT, EIO, EACCES, its mailbox removed) makes that
    item a StorageError and removes its tmp file; the other items go on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sdk.errors import InvalidMessage, StorageError
from sdk.ids import is_id
from workers.faults import AFTER_DIR_SYNC, AFTER_RENAME, AFTER_SYNC, AFTER_TMP_WRITE, fault_point
from workers.filenames import format_name
from workers.flush import Written, sync_dirs
from workers.fsio import FILE_MODE, OPEN_NEW, mtime_ms, storage_error, unlink_quiet, write_all
from workers.maildir import Mailbox


def deliver_batch(
    items: Sequence[tuple[Mailbox, str, bytes, str]],
) -> list[int | StorageError | InvalidMessage]:
    """Store many messages with one flush: per item (mailbox, id, data, target dir:
    "new", "cur" for a copy stored claimed, or "failed") its stored_at (ms) or the
    error (StorageError; InvalidMessage for an id that is not a ULID).

    The files are flushed with one syncfs (workers/flush.py says why), the renames
    made durable by one fsync per target directory, or by a second syncfs when the
    batch touches more directories than `workers.flush.DIRS_PER_SYNCFS`.

    One item's failure (ENOSPC, EDQUOT, EIO, EACCES, a removed mailbox) does not fail
    the others, and leaves no tmp file behind.
    """
    results: list[int | StorageError | InvalidMessage | None] = [None] * len(items)
    pid = os.getpid()
    # index -> (mailbox, id, tmp path, target dir, stored_at, st_dev)
    written: list[tuple[int, Mailbox, str, str, str, int, int]] = []
    files = Written()

    for _, _, _, target in items:
        if target not in ("new", "cur", "failed"):
            raise ValueError(f"target must be 'new', 'cur' or 'failed', got {target!r}")

    for i, (mailbox, message_id, data, target) in enumerate(items):
        target_dir = mailbox.dir_of(target)
        if not is_id(message_id):  # never a path: it becomes one
            results[i] = InvalidMessage(f"message id {message_id!r:.40} is not a ULID")
            continue
        tmp = f"{mailbox.tmp_dir}/{message_id}.{pid}"
        try:
            fd = os.open(tmp, OPEN_NEW, FILE_MODE)
        except OSError as exc:
            results[i] = _delivery_error(mailbox, message_id, exc)
            continue
        keep, failure = False, None
        try:
            write_all(fd, data)
            st = os.fstat(fd)
            dev = st.st_dev
            keep = files.add(fd, dev)
        except OSError as exc:
            failure = exc
        finally:
            if not keep:
                os.close(fd)
        if failure is not None:
            unlink_quiet(tmp)
            results[i] = _delivery_error(mailbox, message_id, failure)
            continue
        written.append((i, mailbox, message_id, tmp, target_dir, mtime_ms(st), dev))
    fault_point(AFTER_TMP_WRITE)

    failed_dev = files.flush()
    fault_point(AFTER_SYNC)

    renamed = []  # (index, mailbox, id, target dir, name in it, stored_at, st_dev)
    for i, mailbox, message_id, tmp, target_dir, stored_at, dev in written:
        if dev in failed_dev:
            unlink_quiet(tmp)
            results[i] = _delivery_error(mailbox, message_id, failed_dev[dev])
            continue
        name = message_id
        if target_dir == mailbox.cur_dir:  # stored claimed, at the time it was stored
            name = format_name(message_id, claimed_at=stored_at, flags="")
        try:
            os.rename(tmp, f"{target_dir}/{name}")
        except OSError as exc:
            unlink_quiet(tmp)
            results[i] = _delivery_error(mailbox, message_id, exc)
            continue
        renamed.append((i, mailbox, message_id, target_dir, name, stored_at, dev))
    fault_point(AFTER_RENAME)

    dir_error = sync_dirs({entry[3]: entry[6] for entry in renamed})
    fault_point(AFTER_DIR_SYNC)

    for i, mailbox, message_id, target_dir, name, stored_at, _ in renamed:
        error = dir_error[target_dir]
        if error is None:
            results[i] = stored_at
            if name != message_id:
                mailbox.remember_claim(message_id, name)
        else:
            unlink_quiet(f"{target_dir}/{name}")  # not durable: take it back
            results[i] = _delivery_error(mailbox, message_id, error)
    return results  # type: ignore[return-value]


def _delivery_error(mailbox: Mailbox, message_id: str, exc: OSError) -> StorageError:
    # Built only on failure: deliver_batch's loops run once per message.
    return storage_error(f"deliver {message_id} to {mailbox.endpoint}", exc)
