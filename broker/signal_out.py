"""Signals on their way to the PUB socket, gathered for one pass of the router's loop.

Signals that follow each other on one subject leave as one ZeroMQ message (the
subject, then an array of signal maps: docs/protocol.md): one send and one subscriber
wake-up for a run of them instead of one per signal. Only runs of the same subject are
joined, so a subscriber sees every signal in the order the router emitted it, whatever
subjects its pattern covers.
"""

from __future__ import annotations

from typing import Any

import zmq

from sdk import wire


class SignalOutbox:
    def __init__(self, limit: int = wire.MAX_SIGNALS_PER_MESSAGE) -> None:
        self.limit = limit
        self._runs: list[tuple[str, list[dict[str, Any]]]] = []

    def add(self, subject: str, signal: dict[str, Any]) -> None:
        if self._runs:
            last_subject, signals = self._runs[-1]
            if last_subject == subject and len(signals) < self.limit:
                signals.append(signal)
                return
        self._runs.append((subject, [signal]))

    def flush(self, pub: zmq.Socket) -> None:
        """Send what gathered. PUB never blocks: past a subscriber's high-water mark
        ZeroMQ drops the message (signals are ephemeral)."""
        runs, self._runs = self._runs, []
        for subject, signals in runs:
            pub.send_multipart(wire.encode_signals(subject, signals))
