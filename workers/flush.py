"""One flush for many files: what makes a batch of writes durable at the cost of one.

Why (docs/design.md, "The disk, measured"): fsyncing 100 files one by one does not merge
the flushes (≈ 5,900 msg/s, the same as one at a time) while one syncfs for the batch
does (≈ 16,000 msg/s raw); a rename is durable only once its directory is fsynced
(≈ 110 µs each). Used by the group commit of deliveries (workers/group_commit.py) and by
the requeue of dead letters (workers/dead_letters.py). bench/bench_storage.py ("maildir
batch delivery") guards these figures.
"""

from __future__ import annotations

import os

from workers.fsio import OPEN_DIR, fsync_dir
from workers.syncfs import syncfs

# Above this many directories on one filesystem, one syncfs makes the renames durable
# for less than a directory fsync each (bench_broker "publish, 100 in flight, 8
# endpoints": a batch touching 4 mailboxes spent as long in 4 dir fsyncs as in syncfs).
DIRS_PER_SYNCFS = 2


class Written:
    """The files a batch wrote, by filesystem (st_dev): one open descriptor on each to
    flush it by, and how many files it holds."""

    def __init__(self) -> None:
        self._fd: dict[int, int] = {}  # st_dev -> an open fd on it (the first file written)
        self._count: dict[int, int] = {}

    def add(self, fd: int, dev: int) -> bool:
        """Count a file just written on ``dev``; True when its ``fd`` is kept to flush
        ``dev`` by (`flush` closes it), False when the caller closes it."""
        self._count[dev] = self._count.get(dev, 0) + 1
        if dev in self._fd:
            return False
        self._fd[dev] = fd
        return True

    def flush(self) -> dict[int, OSError]:
        """Make every file written durable: one syncfs per filesystem, or an fsync of
        the file when a filesystem holds just one (the same durability without flushing
        unrelated dirty data: the index WAL, other programs). Closes the descriptors
        kept; returns the filesystems whose flush failed, with the error."""
        failed: dict[int, OSError] = {}
        for dev, fd in self._fd.items():
            try:
                if self._count[dev] == 1:
                    os.fsync(fd)
                else:
                    syncfs(fd)
            except OSError as exc:
                failed[dev] = exc
            finally:
                os.close(fd)
        self._fd.clear()
        return failed


def sync_dirs(dirs: dict[str, int]) -> dict[str, OSError | None]:
    """Make the renames and unlinks in each directory durable: {dir: error or None}.

    ``dirs`` maps each directory to its filesystem (st_dev). More than `DIRS_PER_SYNCFS`
    on one filesystem take one syncfs; else (or when it fails) one fsync each, which
    names the culprit.
    """
    errors: dict[str, OSError | None] = {}
    by_dev: dict[int, list[str]] = {}
    for directory, dev in dirs.items():
        by_dev.setdefault(dev, []).append(directory)
    for directories in by_dev.values():
        if len(directories) > DIRS_PER_SYNCFS:
            try:
                fd = os.open(directories[0], OPEN_DIR)
                try:
                    syncfs(fd)
                finally:
                    os.close(fd)
                errors.update(dict.fromkeys(directories))
                continue
            except OSError:
                pass  # fall back to one fsync per directory, which names the culprit
        for directory in directories:
            try:
                fsync_dir(directory)
                errors[directory] = None
            except OSError as exc:
                errors[directory] = exc
    return errors
