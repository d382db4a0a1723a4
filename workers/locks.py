"""One broker per data directory: the flock(2) locks in ``run/``.

Each process of a broker holds an exclusive flock on a file of its own from before it
touches anything in the data directory until it exits:

    run/router.lock      the router
    run/writer-<K>.lock  the writer of shard K
    run/up.lock          `relay up`, the supervisor of a whole group

A lock file holds ``{"pid": P, "shards": N}`` of the process that holds it, so a
process that is refused can name the one in its way, and `relay down` and the ops jobs
know whom to ask. A flock belongs to the open file, not to the name: it goes away
with the process however it ends (kill -9 included), so nothing is ever stale. The
files themselves stay in ``run/`` (removing a lock file races with a process opening
it); what they say counts only while they are locked.

Taking a lock and looking at the others happen under ``run/start.lock``: exclusive for
a process that takes its lock (try its own, check the others, write its pid), shared
for one that only looks (`holders`). So a look never makes a starting process fail its
try, and two processes starting at once check each other's shard counts: a writer
started for N shards is refused by a directory served with M != N, because the
mailboxes a shard owns depend on N (`shard_of`) and two writers must never own one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sdk.paths import Home

START_LOCK = "start.lock"
SUFFIX = ".lock"
START_WAIT_S = 10.0  # a start lock is held for microseconds; this is a deadline, not a wait


@dataclass(frozen=True, slots=True)
class Holder:
    """A process that holds one of a data directory's locks."""

    name: str  # router, writer-<K>, up
    pid: int
    shards: int | None

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid})"


class DirectoryLocked(Exception):
    """The data directory is served already, by ``holder``."""

    def __init__(self, home: Home, message: str, holder: Holder) -> None:
        super().__init__(message)
        self.home = home
        self.holder = holder


class Lock:
    """A lock held: released when closed, or when the process ends."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the flock goes with the open file
            self._fd = None

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_file(home: Home, name: str) -> Path:
    return home.run / f"{name}{SUFFIX}"


def take(home: Home, name: str, shards: int | None, *, alone: bool = False) -> Lock:
    """Hold ``run/<name>.lock`` for this process, or raise DirectoryLocked naming the
    process in the way: the holder of this lock, or (``shards`` given) a holder of
    another lock of this directory that serves another shard count, or (``alone``) any
    holder at all. Creates the data directory (0700) if it does not exist."""
    home.create()
    with _start_lock(home, fcntl.LOCK_EX):
        path = lock_file(home, name)
        fd = _open(path)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(name, fd)
                raise DirectoryLocked(
                    home, f"{home.root} is served already: {holder} holds {path}", holder
                ) from None
            for other in _holders(home, skip=name):
                if alone:
                    raise DirectoryLocked(
                        home, f"{home.root} is served already: {other} is running", other
                    )
                if shards is not None and other.shards is not None and other.shards != shards:
                    raise DirectoryLocked(
                        home,
                        f"{home.root} is served with {other.shards} shards ({other} is "
                        f"running); a process for {shards} shards may not join it",
                        other,
                    )
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "shards": shards}).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
    return Lock(path, fd)


def holders(home: Home) -> dict[str, Holder]:
    """The processes holding this directory's locks now, by lock name."""
    if not home.run.is_dir():
        return {}
    with _start_lock(home, fcntl.LOCK_SH):
        return {h.name: h for h in _holders(home)}


@contextlib.contextmanager
def quiet(home: Home) -> Iterator[dict[str, Holder]]:
    """The start lock held exclusively, with the holders of the moment: no process of
    this directory starts until the block ends (`relay down` removes what a killed
    router left in run/ under it)."""
    home.create()
    with _start_lock(home, fcntl.LOCK_EX):
        yield {h.name: h for h in _holders(home)}


def _holders(home: Home, skip: str | None = None) -> list[Holder]:
    found = []
    for path in sorted(home.run.glob(f"*{SUFFIX}")):
        name = path.name[: -len(SUFFIX)]
        if path.name == START_LOCK or name == skip:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                found.append(_read(name, fd))  # held: what it says is true
        finally:
            os.close(fd)  # a shared lock taken is released with it
    return found


def _read(name: str, fd: int) -> Holder:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        pid, shards = int(data["pid"]), data.get("shards")
    except (ValueError, KeyError, TypeError, OSError):
        return Holder(name, 0, None)  # an old broker's, or one still writing it
    return Holder(name, pid, shards if isinstance(shards, int) else None)


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier run keeps no wider mode
    return fd


@contextlib.contextmanager
def _start_lock(home: Home, how: int) -> Iterator[None]:
    fd = _open(home.run / START_LOCK)
    try:
        deadline = time.monotonic() + START_WAIT_S
        while True:
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(
                        errno.ETIMEDOUT, f"{home.run / START_LOCK} held for {START_WAIT_S:g} s"
                    ) from None
                time.sleep(0.001)
        yield
    finally:
        os.close(fd)
