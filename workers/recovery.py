"""Repairing what a crash left in a mailbox (`Mailbox.recover`, `Mailbox.sweep_tmp`).

recover (at writer start, before anything else touches the mailbox)
    1. `sweep_tmp`: our own tmp files (``<id>.<pid>``) are all stale (their writer is
       dead); a foreign tmp file only after 36 h (Maildir convention: an external
       producer may be writing it right now).
    2. one state per message: where an id has several files, keep the most advanced
       (failed > done > claimed > new) and unlink the others. Only a crash inside
       `fail` (or a power cut undoing part of a rename on this non-journalled ext4)
       produces duplicates (workers/maildir.py, workers/dead_letters.py).
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass

from sdk.errors import InvalidMessage
from workers.filenames import STATE_RANK, parse_name, state_of
from workers.fsio import fsync_dirs, unlink_quiet
from workers.mailbox_paths import MailboxPaths

log = logging.getLogger("relay.maildir")

FOREIGN_TMP_MAX_AGE_S = 36 * 3600  # the Maildir convention for abandoned tmp files

_OWN_TMP_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}\.\d+$")  # <id>.<pid>: a Relay writer's


@dataclass(frozen=True)
class Recovery:
    """What `Mailbox.recover` repaired."""

    tmp_removed: int = 0
    duplicates_removed: int = 0


def sweep_tmp(
    tmp_dir: str,
    own_older_than_s: float = 0,
    foreign_older_than_s: float = FOREIGN_TMP_MAX_AGE_S,
    now: float | None = None,
) -> int:
    """Remove stale files from ``tmp_dir``; returns how many.

    Own files (``<id>.<pid>``, written by a Relay writer) older than
    ``own_older_than_s`` go: at start every one is stale, since the writer that made
    it is dead (0, the default). Any other file is an external producer's and is
    removed only past ``foreign_older_than_s`` (36 h), as Maildir readers do.
    ``now`` is unix seconds (default: the clock).
    """
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(tmp_dir))
    except FileNotFoundError:
        return 0
    for entry in entries:
        limit = own_older_than_s if _OWN_TMP_RE.match(entry.name) else foreign_older_than_s
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if age >= limit:
            try:
                if entry.is_dir(follow_symlinks=False):
                    continue  # not ours to judge
                os.unlink(entry.path)
                removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("could not remove stale %s: %s", entry.path, exc)
    return removed


def recover(mailbox: MailboxPaths, now: float | None = None) -> Recovery:
    """Sweep tmp/ and keep one file per message id (the module docstring)."""
    tmp_removed = sweep_tmp(mailbox.tmp_dir, own_older_than_s=0, now=now)
    copies: dict[str, list[tuple[int, str, str]]] = {}  # id -> [(rank, dir, name)]
    for subdir, directory in (
        ("new", mailbox.new_dir),
        ("cur", mailbox.cur_dir),
        ("failed", mailbox.failed_dir),
    ):
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            continue
        for name in names:
            try:
                parsed = parse_name(name)
            except InvalidMessage:
                continue
            rank = STATE_RANK[state_of(subdir, parsed)]
            copies.setdefault(parsed.id, []).append((rank, directory, name))
    removed = 0
    touched = set()
    for found in copies.values():
        if len(found) < 2:
            continue
        found.sort(reverse=True)
        for _, directory, name in found[1:]:
            unlink_quiet(f"{directory}/{name}")
            touched.add(directory)
            removed += 1
    if touched:
        fsync_dirs(touched)
    if tmp_removed or removed:
        log.info(
            "recovered %s: %d stale tmp files, %d duplicate copies removed",
            mailbox.endpoint,
            tmp_removed,
            removed,
        )
    return Recovery(tmp_removed, removed)
