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

ARMED: frozenset[str] = frozenset(
    name.strip() for name in os.environ.get(ENV_VAR, "").split(",") if name.strip()
)


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL if ``name`` is armed in ``RELAY_FAULT``."""
    if name in ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
