"""Running a broker process (the router, a writer) until it is told to stop.

Process hygiene in one place: the process takes its lock in ``run/`` (workers/locks.py)
before it touches anything in the data directory, and a second process of the same
role is refused at once (exit status `LOCKED`) without touching the first's sockets or
files; SIGTERM and SIGINT only set the service's ``stopping`` flag (the loop notices
within its poll interval, drains, and closes). The lock, which says the process's pid,
is held from before start-up until after close, so tools that ask "is Relay running
here?" (`relay down`, ops compaction) see a process that is still starting or stopping.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Protocol

from sdk.paths import Home
from workers import locks

log = logging.getLogger("relay.process")

LOCKED = 3  # exit status of a process refused because the data directory is served


class Service(Protocol):
    stopping: bool

    def start(self) -> None: ...

    def serve(self) -> None: ...

    def close(self) -> None: ...


def run_until_stopped(home: Home, name: str, shards: int, make: Callable[[], Service]) -> int:
    """Hold ``run/<name>.lock``, then build the service with ``make`` and run it until
    SIGTERM/SIGINT; `LOCKED` if another process holds the lock (or serves another
    shard count)."""
    try:
        lock = locks.take(home, name, shards)
    except locks.DirectoryLocked as exc:
        log.error("%s not started: %s", name, exc)
        return LOCKED
    stop_requested = False
    service: Service | None = None

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True  # handlers only set flags
        if service is not None:
            service.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        service = make()
        service.stopping = service.stopping or stop_requested
        service.start()
        service.serve()
    finally:
        if service is not None:
            service.close()
    # The lock is not released here but by the kernel when the process ends, so that a
    # free lock means a process gone (`relay down` returns on it).
    _held.append(lock)
    return 0


_held: list[locks.Lock] = []
