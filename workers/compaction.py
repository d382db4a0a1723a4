"""The removal half of ops compaction: deleting finished messages once they are archived.

`ops.compact` first commits finished messages (done, dead letters) to the Parquet archive,
then asks for their removal from the live store. The removal runs in the writer that owns
the mailbox (the ``compact_remove`` operation, while the broker runs: docs/design.md invariant
1, one owner per file move) or, when no Relay process runs at all, in the compaction job
itself. Both call `remove_finished`.

Only finished files are ever removed: ``failed/<id>`` and a done ``cur/<id>,...:2,S``. A
message that is new or claimed is left alone and counted as skipped, whatever the
request says, so a stale or wrong request cannot lose live mail.

Order of writes, and what a crash between two of them leaves
    1. unlink each finished file
    2. fsync each directory touched (cur/, failed/)
    3. delete the index rows (the caller: one transaction)
    - crash before 2: some files gone (a power cut may bring some back: they are
      archived already, so a rerun finds them in the archive and removes them again).
    - crash between 2 and 3: index rows whose file is gone. The writer rebuilds its index
      from the Maildir at start; a rerun of compaction deletes them too (a row whose file
      is gone and that is not live is deleted).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sdk.errors import InvalidMessage
from workers.filenames import parse_name
from workers.fsio import fsync_dirs, storage_error
from workers.maildir import Mailbox
from workers.records import MessageRecord

# A hint per message: (id, claimed_at, done_at) from the index, used to name a done file
# without listing cur/ (None when unknown: cur/ is then listed once per call).
Hint = tuple[str, int | None, int | None]


@dataclass
class Removed:
    """What `remove_finished` did in one mailbox."""

    deleted: list[str] = field(default_factory=list)  # ids whose index row must go
    files: int = 0  # files unlinked
    bytes: int = 0  # their sizes
    skipped: int = 0  # new or claimed: left alone
    dirs: set[str] = field(default_factory=set)  # directories to fsync (caller)


def remove_finished(mailbox: Mailbox, hints: Iterable[Hint], *, sync: bool = True) -> Removed:
    """Unlink the done and dead-lettered files of the given ids; see the module docstring.

    Returns the ids whose index rows should be deleted: those whose finished file was
    removed, and those with no file at all (already gone; their rows are stale). With
    ``sync=False`` the caller fsyncs ``Removed.dirs`` before deleting index rows.
    """
    result = Removed()
    listing: tuple[dict[str, str], set[str]] | None = None  # cur/, listed on a miss
    for message_id, claimed_at, done_at in hints:
        failed = f"{mailbox.failed_dir}/{message_id}"
        path: str | None = failed
        directory = mailbox.failed_dir
        if not os.path.lexists(failed):
            directory = mailbox.cur_dir
            path = None
            if claimed_at is not None and done_at is not None:
                name = f"{message_id},C={claimed_at},D={done_at}:2,S"
                if os.path.lexists(f"{mailbox.cur_dir}/{name}"):
                    path = f"{mailbox.cur_dir}/{name}"
            if path is None:
                if listing is None:
                    listing = _list_cur(mailbox.cur_dir)
                listed = listing[0].get(message_id)
                if listed is not None:
                    path = f"{mailbox.cur_dir}/{listed}"
        if path is None:
            claimed = listing[1] if listing is not None else set()
            if message_id in claimed or os.path.lexists(f"{mailbox.new_dir}/{message_id}"):
                result.skipped += 1
            else:
                result.deleted.append(message_id)  # no file: the row is stale
            continue
        try:
            size = os.lstat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            result.deleted.append(message_id)
            continue
        except OSError as exc:
            raise storage_error(f"remove {message_id} in {mailbox.endpoint}", exc) from exc
        result.deleted.append(message_id)
        result.files += 1
        result.bytes += size
        result.dirs.add(directory)
    if sync and result.dirs:
        fsync_dirs(sorted(result.dirs))
    return result


def _list_cur(cur_dir: str) -> tuple[dict[str, str], set[str]]:
    """cur/ in one listing: {id: done file name} and the set of claimed ids. Used on a
    miss only, for names that differ from the canonical ``<id>,C=..,D=..:2,S`` (extra
    flags set by another tool) and to tell a claimed message from a gone one."""
    done: dict[str, str] = {}
    claimed: set[str] = set()
    try:
        names = os.listdir(cur_dir)
    except FileNotFoundError:
        return done, claimed
    for name in names:
        try:
            parsed = parse_name(name)
        except InvalidMessage:
            continue
        if parsed.flags and "S" in parsed.flags:
            done[parsed.id] = name
        else:
            claimed.add(parsed.id)
    return done, claimed


class _IndexRows(Protocol):
    """The index as `remove_archived` uses it: a row's claim and finish times."""

    def lookup(self, message_id: str, endpoint: str) -> MessageRecord | None: ...


class _Deletions(Protocol):
    """Where `remove_archived` records what the commit must do after the unlinks."""

    dirs: set[str]
    deletes: list[tuple[str, str]]


def remove_archived(
    mailboxes: Mapping[str, Mailbox],
    index: _IndexRows,
    items: Iterable[Sequence[str]],
    changes: _Deletions,
) -> dict[str, int]:
    """The writer's ``compact_remove``: remove the archived ``[id, endpoint]`` copies of
    its mailboxes (finished ones only), noting the directories to fsync and the index
    rows to delete in ``changes``; totals as the router reports them."""
    by_endpoint: dict[str, list[str]] = {}
    for message_id, endpoint in items:
        by_endpoint.setdefault(endpoint, []).append(message_id)
    result = {"removed": 0, "files": 0, "bytes": 0, "skipped": 0}
    for endpoint, ids in by_endpoint.items():
        mailbox = mailboxes.get(endpoint)
        if mailbox is None:
            result["skipped"] += len(ids)
            continue
        hints = []
        for message_id in ids:
            row = index.lookup(message_id, endpoint)
            claimed_at, done_at = (row.claimed_at, row.finished_at) if row else (None, None)
            hints.append((message_id, claimed_at, done_at))
        removed = remove_finished(mailbox, hints, sync=False)
        changes.dirs.update(removed.dirs)  # fsynced before the index rows go
        changes.deletes.extend((message_id, endpoint) for message_id in removed.deleted)
        result["removed"] += len(removed.deleted)
        result["files"] += removed.files
        result["bytes"] += removed.bytes
        result["skipped"] += removed.skipped
    return result
