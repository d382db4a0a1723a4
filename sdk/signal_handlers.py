"""A client's `on_signal` handlers and the thread that calls them.

The I/O thread hands over what the signals socket received, several messages in one
item (one wake-up here); this thread decodes each message (a subject and one signal, or
a run of them: docs/protocol.md, "signal"), matches the handlers once per message and
calls them in order. A handler's exception is logged, never raised into the client. It
depends on a small interface to the connection (`SignalSocket`), not on the client.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from sdk import subjects, wire
from sdk.errors import RelayError
from sdk.types import Signal

log = logging.getLogger("relay.client")

SignalHandler = Callable[[str, Signal], Any]


class SignalSocket(Protocol):
    """What the handlers need of the connection's signals socket."""

    def listen_signals(self, address: str) -> None: ...

    def follow_signals(self, prefix: bytes) -> None: ...


class SignalHandlers:
    """The handlers of one client, by key, and their thread (started on first use)."""

    def __init__(self, socket: SignalSocket) -> None:
        self._socket = socket
        self._handlers: dict[int, tuple[str, SignalHandler]] = {}
        self._keys = itertools.count(1)
        self._arrived: queue.Queue[list[list[bytes]]] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(
        self, pattern: str, handler: SignalHandler, *, address: str, runs: bool
    ) -> Callable[[], None]:
        """Call handler(subject, signal) for each signal whose subject matches
        ``pattern``, from the router's signals socket at ``address`` (as runs of
        signals when the router offers them); returns the function that stops it."""
        subjects.validate(pattern, wildcards=True)
        key = next(self._keys)
        with self._lock:
            if self._thread is None:
                self._socket.listen_signals(address)
                self._thread = threading.Thread(
                    target=self._loop, name="relay-client-signals", daemon=True
                )
                self._thread.start()
            self._handlers[key] = (pattern, handler)
            prefix = subjects.literal_prefix(pattern).encode()
            self._socket.follow_signals((wire.SIGNAL_RUN if runs else b"") + prefix)
        return lambda: self._handlers.pop(key, None) and None

    def arrived(self, messages: list[list[bytes]]) -> None:
        """(I/O thread) Messages of the signals socket, for this thread."""
        self._arrived.put(messages)

    def close(self) -> None:
        self._closed = True

    def _loop(self) -> None:
        while not self._closed:
            try:
                arrived = self._arrived.get(timeout=0.2)
            except queue.Empty:
                continue
            for frames in arrived:
                self.dispatch(frames)

    def dispatch(self, frames: list[bytes]) -> None:
        """One message of the signals socket: a subject and the signals sent on it."""
        try:
            subject, bodies = wire.decode_signals(frames)
        except RelayError:
            log.warning("malformed signal message dropped")
            return
        if not subjects.is_valid(subject):
            log.warning("signal message on an invalid subject %.60r dropped", subject)
            return
        handlers = self._handlers
        matched = [(k, h) for k, (p, h) in list(handlers.items()) if subjects.matches(subject, p)]
        if not matched:
            return
        malformed = 0
        for body in bodies:
            try:
                signal = Signal.from_wire(body)
            except RelayError:
                malformed += 1
                continue
            for key, handler in matched:
                if key not in handlers:  # unsubscribed while this run was handled
                    continue
                try:
                    handler(subject, signal)
                except Exception:
                    log.exception("signal handler failed")
        if malformed:
            log.warning("%d malformed signals on %s dropped", malformed, subject)
