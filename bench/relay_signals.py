"""Signals through Relay's broker: a second client's ``on_signal`` receiving what the
first one sends (100 requests in flight, or ``signal(wait=False)`` from another
process), and ``client.signal()`` in a loop. Signals never touch the disk; their floors
are raw PUB/SUB (d) and a DEALER/ROUTER round trip (c) (bench/floors.py)."""

from __future__ import annotations

import multiprocessing
import threading
import time

from bench.common import Figures, rate
from bench.relay_broker import RelayBroker
from bench.workload import (
    INFLIGHT,
    SIGNAL_N,
    SIGNAL_NO_REPLY_N,
    SIGNAL_SUBJECT,
    SIGNAL_SYNC_N,
    signal_wire,
)
from sdk.types import Signal


def _send_signals(home: str, count: int, round_no: int) -> None:
    """Child process: ``count`` signals without reply; close() flushes them (its bye
    leaves after them)."""
    from sdk import connect

    # Built before the first leaves, as anchor (d) encodes its body once: the row
    # measures the bus, not the making of Signal objects.
    signals = [Signal.from_wire(signal_wire(n, round_no)) for n in range(count)]
    with connect(home, timeout=30) as client:
        for signal in signals:
            client.signal(SIGNAL_SUBJECT, signal, wait=False)


class RelaySignals:
    """The signal workloads on a `RelayBroker`'s two clients: its publisher sends, its
    receiver's ``on_signal`` notes when each signal of the current round arrives."""

    def __init__(self, relay: RelayBroker) -> None:
        self.relay = relay
        self.round = 0
        self.signals_seen = 0
        self.signal_times: list[float] = []
        relay.receiver.on_signal(SIGNAL_SUBJECT, self._on_signal)
        # The SUB socket connects asynchronously: signal until the handler hears one.
        deadline = time.monotonic() + 10
        while not self.signals_seen:
            if time.monotonic() > deadline:
                raise RuntimeError("on_signal handler never received a signal")
            relay.publisher.signal(SIGNAL_SUBJECT, Signal.from_wire(signal_wire(0, -1)))
            time.sleep(0.01)

    def _on_signal(self, subject: str, signal: Signal) -> None:
        if signal.data and signal.data.get("round") == self.round:
            self.signal_times.append(time.perf_counter())
        self.signals_seen += 1

    def pipelined(self) -> Figures:
        """Signals received by the second client's on_signal, 100 requests in flight."""
        self.round += 1
        self.signal_times = []
        slots = threading.Semaphore(INFLIGHT)
        send_request = self.relay.publisher.send_request
        for n in range(SIGNAL_N):
            slots.acquire()
            future = send_request(
                "signal", subject=SIGNAL_SUBJECT, signal=signal_wire(n, self.round)
            )
            future.add_done_callback(lambda _f: slots.release())
        return self._signal_rate()

    def _signal_rate(self, count: int = SIGNAL_N, min_share: float = 0.99) -> Figures:
        """Wait for this round's signals to stop arriving; received/s and lost."""
        deadline, seen = time.monotonic() + 10, 0  # 10 s for the first, 2 s between
        while len(self.signal_times) < count and time.monotonic() < deadline:
            if len(self.signal_times) != seen:  # still arriving: wait on
                seen, deadline = len(self.signal_times), time.monotonic() + 2
            time.sleep(0.01)
        times = list(self.signal_times)
        if len(times) < count * min_share:
            raise RuntimeError(f"on_signal received {len(times)}/{count} signals")
        return {"rate": rate(len(times) - 1, times[-1] - times[0]), "lost": count - len(times)}

    def no_reply(self) -> Figures:
        """Signals received by the second client's on_signal, sent with wait=False (no
        round trip: the SDK puts what queued together in one frame) by a client in
        another process, as anchor (d) sends from another process."""
        self.round += 1
        self.signal_times = []
        sender = multiprocessing.get_context("spawn").Process(
            target=_send_signals,
            args=(str(self.relay.broker.home.root), SIGNAL_NO_REPLY_N, self.round),
        )
        sender.start()
        try:
            # Without replies nothing slows the sender down: when the receiver falls
            # behind, PUB drops past its high-water mark (signals are ephemeral). The
            # row reports how many were lost; only a path that lost most is an error.
            return self._signal_rate(SIGNAL_NO_REPLY_N, min_share=0.5)
        finally:
            sender.join(30)

    def sync(self) -> Figures:
        """client.signal() in a loop: each waits for the router's answer."""
        signal = Signal.from_wire(signal_wire(0, -1))
        subject, send = SIGNAL_SUBJECT, self.relay.publisher.signal
        start = time.perf_counter()
        for _ in range(SIGNAL_SYNC_N):
            send(subject, signal)
        return {"rate": rate(SIGNAL_SYNC_N, time.perf_counter() - start)}
