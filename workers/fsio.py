"""Low-level file I/O under the Maildir: modes and open flags, whole writes and reads on
raw file descriptors, directory fsync, and the durable store of one file (write to tmp/,
fsync, rename, fsync the directory) whose crash states workers/maildir.py spells out.

Raw ``os`` calls rather than Python file objects: no buffering to reason about, and a
message file is read or written in one or two system calls.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable

from sdk.errors import StorageError
from workers.faults import fault_point

log = logging.getLogger("relay.maildir")

DIR_MODE = 0o700
FILE_MODE = 0o600

OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC
OPEN_READ = os.O_RDONLY | os.O_CLOEXEC
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)  # a message file: whole in one write, but for a signal
    if written < len(data):
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


def read_fd(fd: int, size: int) -> bytes:
    """Read a regular file to its end; ``size`` (from fstat) is a hint, not a limit."""
    want = size + 1  # one byte more than expected: a short read is the end of the file
    chunk = os.read(fd, want)
    if len(chunk) < want:
        return chunk
    chunks = [chunk]
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_file(path: str) -> bytes:
    fd = os.open(path, OPEN_READ)
    try:
        return read_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, making the renames and unlinks done inside it durable."""
    fd = os.open(path, OPEN_DIR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dirs(paths: Iterable[str | os.PathLike[str]]) -> None:
    """fsync each distinct directory once (for callers batching ``sync=False`` moves)."""
    for path in dict.fromkeys(os.fspath(p) for p in paths):
        fsync_dir(path)


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("could not remove %s: %s", path, exc)


def storage_error(action: str, exc: OSError) -> StorageError:
    code = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
    return StorageError(f"{action}: {exc.strerror or exc} ({code})")


def mtime_ms(st: os.stat_result) -> int:
    return st.st_mtime_ns // 1_000_000


def store_file(
    tmp_dir: str,
    target_dir: str,
    message_id: str,
    data: bytes,
    what: str,
    faults: tuple[str, str, str],
    *,
    mtime_ns: int | None = None,
) -> int:
    """Store ``data`` durably as ``<target_dir>/<message_id>`` through
    ``<tmp_dir>/<message_id>.<pid>``; returns stored_at (the file's mtime, ms).

    ``faults`` names the fault points after the tmp write, the fsync and the rename ("" for
    none); ``mtime_ns`` sets the mtime before the fsync (a dead letter keeps its
    original's). StorageError, saying ``what`` failed, leaves neither file behind.
    """
    tmp_fault, sync_fault, rename_fault = faults
    tmp = f"{tmp_dir}/{message_id}.{os.getpid()}"
    target = f"{target_dir}/{message_id}"
    try:
        fd = os.open(tmp, OPEN_NEW, FILE_MODE)
    except OSError as exc:
        raise storage_error(what, exc) from exc
    try:
        try:
            write_all(fd, data)
            if mtime_ns is not None:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            stored_at = mtime_ms(os.fstat(fd))
            fault_point(tmp_fault)
            os.fsync(fd)
        finally:
            os.close(fd)
        fault_point(sync_fault)
        os.rename(tmp, target)
    except OSError as exc:
        unlink_quiet(tmp)
        raise storage_error(what, exc) from exc
    fault_point(rename_fault)
    try:
        fsync_dir(target_dir)
    except OSError as exc:
        unlink_quiet(target)  # not durable: take it back rather than half-deliver
        raise storage_error(what, exc) from exc
    return stored_at
