"""``syncfs(2)``: flush every dirty page and inode of one filesystem in one call.

Python's `os` has no syncfs, so it is called from libc through ctypes. Why the writer
wants it (docs/design.md, "The disk, measured"): fsyncing the files of a batch one by one
does not merge the flushes (≈ 5,900 msg/s for a batch of 100, the same as one at a
time), while one syncfs per batch does (≈ 16,000 msg/s raw). bench/bench_storage.py
guards that figure.

Where libc has no syncfs (not Linux, or a libc older than 2.14), `syncfs` falls back to
`os.sync()`, which flushes every filesystem: slower on a busy machine, but just as
durable for the caller.
"""

from __future__ import annotations

import ctypes
import os


def _load_syncfs():  # -> the ctypes function, or None when libc has none
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the running process's libc
        func = libc.syncfs
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int]
    func.restype = ctypes.c_int
    return func


_syncfs = _load_syncfs()

HAVE_SYNCFS = _syncfs is not None
"""True when the real syscall is used; False when `syncfs` falls back to `os.sync()`."""


def syncfs(fd: int) -> None:
    """Flush the filesystem that holds the open file or directory ``fd``.

    Raises OSError (with ``errno`` set, e.g. EIO, EBADF) when the kernel reports an error.
    """
    if _syncfs is None:
        os.sync()
        return
    if _syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")
