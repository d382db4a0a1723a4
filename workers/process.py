"""Running a broker process (the router, a writer) until it is told to stop.

Process hygiene in one place: SIGTERM and SIGINT only set the service's ``stopping``
flag (the loop notices within its poll interval, drains, and closes); the pid file in
``run/`` exists from before start-up until after close, so tools that ask "is Relay
running here?" (ops compaction) see a process that is still starting or stopping.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Protocol

from sdk.paths import write_private


class Service(Protocol):
    stopping: bool

    def start(self) -> None: ...

    def serve(self) -> None: ...

    def close(self) -> None: ...


def run_until_stopped(service: Service, pid_file: Path) -> int:
    def stop(_signum: int, _frame: object) -> None:
        service.stopping = True  # handlers only set flags

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    write_private(pid_file, str(os.getpid()))  # 0600, like every file in the data directory
    try:
        service.start()
        service.serve()
    finally:
        service.close()
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
    return 0
