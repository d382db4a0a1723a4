"""The gateway's listening socket, bound with retries: an address that is taken does not
end the process.

Under honcho (`make run`) a process that exits stops the whole group, router and
writers included, so a gateway that cannot bind 127.0.0.1:7480 would take the broker
down with it. Instead it says so in one log line, writes it where `relay status` reads
it (sdk/edge_state.py), and tries again after 1, 2, 4, ... seconds, then every
`MAX_DELAY_S`, until it binds or is stopped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from sdk import edge_state
from sdk.edge_state import LISTENING, RETRYING, EdgeState
from sdk.paths import Home

log = logging.getLogger("relay.http")

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
BACKLOG = 2048  # uvicorn's default


def retry_delay(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failed bind (1, 2, 4, ... then 30)."""
    return min(FIRST_DELAY_S * 2 ** max(failures - 1, 0), MAX_DELAY_S)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); `OSError` when the address is taken or
    not ours. SO_REUSEADDR as uvicorn sets it: a port in TIME_WAIT is not "taken"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)  # two SO_REUSEADDR sockets may share a port until one listens
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class Listener:
    """Binds (host, port) for the gateway of ``home``, retrying; keeps the gateway's state
    file in run/ up to date until `close`."""

    def __init__(
        self,
        home: Home,
        host: str,
        port: int,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.home, self.host, self.port = home, host, port
        self.pid = os.getpid()
        self.address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._clock = clock or _now_ms

    def open(self, stop: threading.Event) -> socket.socket | None:
        """The bound socket, or None when ``stop`` was set before it could bind."""
        edge_state.forget_dead(self.home, "http")
        failures, last_error, since = 0, None, 0
        while not stop.is_set():
            try:
                sock = bind(self.host, self.port)
            except OSError as exc:
                failures += 1
                error = exc.strerror or str(exc)
                delay = retry_delay(failures)
                if error != last_error:  # one line, not one per attempt
                    log.warning(
                        "relay http cannot bind %s (%s); retrying with backoff up to every "
                        "%g s; another address: relay http --listen HOST:PORT "
                        "(make run HTTP=HOST:PORT)",
                        self.address,
                        error,
                        MAX_DELAY_S,
                    )
                    since = self._clock()
                last_error = error
                self._write(RETRYING, since, error, self._clock() + int(delay * 1000))
                stop.wait(delay)
                continue
            if failures:
                log.warning("relay http bound %s after %d failed attempts", self.address, failures)
            self._write(LISTENING, self._clock())
            return sock
        return None

    def _write(
        self, state: str, since: int, error: str | None = None, retry_at: int | None = None
    ) -> None:
        edge_state.write(
            self.home,
            EdgeState("http", self.pid, self.address, state, since, error, retry_at),
        )

    def close(self) -> None:
        edge_state.remove(self.home, "http", self.pid)


def _now_ms() -> int:
    return int(time.time() * 1000)
