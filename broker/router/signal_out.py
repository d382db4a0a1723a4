"""Signals on their way to the signals socket, gathered for one pass of the router's loop.

Signals that follow each other on one subject leave as one ZeroMQ message, a *run*
(``+subject``, then an array of signal maps: docs/protocol.md), for subscribers that
asked for runs: one send and one subscriber wake-up for many signals. Only neighbours
are joined, so a subscriber sees every signal in the order the router emitted it,
whatever subjects its pattern covers.

Version 1 subscribers take one signal per message. The socket is an XPUB, so the router
sees every topic subscribed to; while one without the ``+`` covers a subject, that
subject's signals are also sent one by one.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from sdk import wire
from sdk.sockets import send_parts

log = logging.getLogger("relay.router")

_CACHE_LIMIT = 4096  # subjects remembered as wanted, or not, one signal at a time


class SignalOutbox:
    def __init__(self, limit: int = wire.MAX_SIGNALS_PER_RUN) -> None:
        self.limit = limit
        self._runs: list[tuple[str, list[bytes]]] = []
        self._single_topics: set[bytes] = set()  # topics of version 1 subscriptions
        self._topics: set[bytes] = set()  # every topic subscribed to, runs' too
        self._wants_single: dict[str, bool] = {}

    def add(self, subject: str, signal: dict[str, Any]) -> None:
        body = wire.packb(signal)
        if self._runs and self._runs[-1][0] == subject:
            self._runs[-1][1].append(body)
        else:
            self._runs.append((subject, [body]))

    def subscription(self, message: bytes) -> None:
        """An XPUB subscription message: 1 (subscribe) or 0 (unsubscribe), then the
        topic. XPUB reports a topic when its first subscriber comes and its last goes,
        including subscribers that disconnect."""
        if not message or message[0] not in (0, 1):
            return
        topic = message[1:]
        if message[0] == 1:
            self._topics.add(topic)
        else:
            self._topics.discard(topic)
        if topic.startswith(wire.SIGNAL_RUN):
            return
        before = len(self._single_topics)
        if message[0] == 1:
            self._single_topics.add(topic)
        else:
            self._single_topics.discard(topic)
        if len(self._single_topics) != before:
            self._wants_single.clear()

    @property
    def heard(self) -> bool:
        """Whether anyone subscribes to signals at all. While nobody does, the router
        makes none of its own (delivery receipts): building and sending one cost about
        5 % of a consumed message's instructions (docs/performance.md, "Each pass of the
        router's loop"). A subscription that comes as a signal is made may miss it, as
        any ZeroMQ subscriber joining late would."""
        return bool(self._topics)

    def flush(self, pub: zmq.Socket) -> None:
        """Send what gathered. A socket error costs these signals only (they are
        ephemeral); past a subscriber's high-water mark ZeroMQ drops messages itself."""
        runs, self._runs = self._runs, []
        try:
            for subject, bodies in runs:
                for part in wire.chunks([len(body) for body in bodies], self.limit):
                    send_parts(pub, wire.encode_signal_run(subject, bodies[part.start : part.stop]))
                if self._single(subject):
                    for body in bodies:
                        send_parts(pub, wire.encode_signal(subject, body))
        except zmq.ZMQError as exc:
            log.error("signals dropped: the signals socket failed: %s", exc)

    def _single(self, subject: str) -> bool:
        wanted = self._wants_single.get(subject)
        if wanted is None:
            topic = subject.encode()
            wanted = any(topic.startswith(prefix) for prefix in self._single_topics)
            if len(self._wants_single) >= _CACHE_LIMIT:
                self._wants_single.clear()
            self._wants_single[subject] = wanted
        return wanted
