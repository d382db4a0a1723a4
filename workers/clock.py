"""The clock of every time Relay records: the kernel's coarse realtime clock.

A file's mtime, which is a message's ``stored_at`` (workers/maildir.py), comes from the
kernel's coarse clock (the time of the last tick, 4 ms apart at HZ=250); a time read
with `time.time()` is finer and runs up to a tick ahead of it. With a fine ``createdAt``
a message was "stored" 1-5 ms before it was created in three traces out of five. Read
from the same coarse clock, a time taken before a write is never after the write's
mtime, so createdAt <= storedAt <= claimedAt <= finishedAt holds on one host, and it
costs no system call: the clock is read through the vDSO, like `time.time()` (about
100 ns from Python; bench figures in docs/architecture.md, "One clock").
"""

from __future__ import annotations

import time

# Linux's CLOCK_REALTIME_COARSE; Python's time module has no name for it.
CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)


def now_ms() -> int:
    """Unix time in ms, from the clock file mtimes come from."""
    return time.clock_gettime_ns(CLOCK_REALTIME_COARSE) // 1_000_000
