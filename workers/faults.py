"""Test-only fault points: crash the process at exactly a named step.

Storage code calls ``fault_point("maildir.after_rename")`` between the steps whose crash
states it documents. When the environment variable ``RELAY_FAULT`` (a comma-separated
list of names, read once at import) names that point, the process sends itself SIGKILL
there: no cleanup, no ``finally``, no buffered Python write flushed. (What the kernel
already holds survives, so this tests process crashes; what a power cut could undo is
argued from the fsync order in each module's docstring.) tests/test_maildir_crash.py
runs child processes this way and checks what recovery finds.

When ``RELAY_FAULT`` is unset a fault point costs one frozenset membership test.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "RELAY_FAULT"

# The storage fault points, named after the step they follow; each module's docstring
# places them in its order of writes (workers/maildir.py, workers/dead_letters.py,
# workers/group_commit.py). They are defined here, with no storage code, so that every
# module can name them without importing another storage module.
AFTER_TMP_WRITE = "maildir.after_tmp_write"
AFTER_SYNC = "maildir.after_sync"
AFTER_RENAME = "maildir.after_rename"
AFTER_DIR_SYNC = "maildir.after_dir_sync"
CLAIM_AFTER_RENAME = "maildir.claim.after_rename"
RECLAIM_AFTER_RENAME = "maildir.reclaim.after_rename"
COMPLETE_AFTER_RENAME = "maildir.complete.after_rename"
REQUEUE_AFTER_RENAME = "maildir.requeue.after_rename"
FAIL_AFTER_TMP_WRITE = "maildir.fail.after_tmp_write"
FAIL_AFTER_FAILED_WRITTEN = "maildir.fail.after_failed_written"
FAIL_AFTER_UNLINK = "maildir.fail.after_unlink"
REDRIVE_AFTER_TMP_WRITE = "maildir.redrive.after_tmp_write"
REDRIVE_AFTER_NEW_WRITTEN = "maildir.redrive.after_new_written"
REDRIVE_AFTER_UNLINK = "maildir.redrive.after_unlink"
# Every storage fault point, in the order the operations reach them (the crash tests
# cover each one).
FAULT_POINTS = (
    AFTER_TMP_WRITE,
    AFTER_SYNC,
    AFTER_RENAME,
    AFTER_DIR_SYNC,
    CLAIM_AFTER_RENAME,
    RECLAIM_AFTER_RENAME,
    COMPLETE_AFTER_RENAME,
    REQUEUE_AFTER_RENAME,
    FAIL_AFTER_TMP_WRITE,
    FAIL_AFTER_FAILED_WRITTEN,
    FAIL_AFTER_UNLINK,
    REDRIVE_AFTER_TMP_WRITE,
    REDRIVE_AFTER_NEW_WRITTEN,
    REDRIVE_AFTER_UNLINK,
)
DELIVER_FAULTS = (AFTER_TMP_WRITE, AFTER_SYNC, AFTER_RENAME)

ARMED: frozenset[str] = frozenset(
    name.strip() for name in os.environ.get(ENV_VAR, "").split(",") if name.strip()
)


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL if ``name`` is armed in ``RELAY_FAULT``."""
    if name in ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
