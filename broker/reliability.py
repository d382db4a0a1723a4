"""The publish path's reliability policies, wired together for the router. No I/O.

The policies themselves (ratelimit.py, breaker.py, backpressure.py) are pure units;
this module holds their per-sender and per-endpoint state, applies the configuration,
and answers the router's three questions: may this sender publish now (`rate`), may
this copy go to this endpoint (`gate`), and what did a delivery's outcome teach the
endpoint's breaker (`outcome`). Signals to emit come back as data; the router sends them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.backpressure import Level, Pressure, calm, pressure
from broker.breaker import BreakerSettings, CircuitBreaker
from broker.publish import Copy, Refusal
from broker.ratelimit import RateLimiter, RateVerdict
from sdk.paths import UNROUTABLE
from sdk.types import Signal, SignalType

SIGNAL_INTERVAL_MS = 1000  # backpressure signals: at most one a second per subject and level


class Reliability:
    def __init__(self, config: dict[str, Any]) -> None:
        self.limiter = RateLimiter()
        self.breakers: dict[str, CircuitBreaker] = {}
        self._signalled: dict[tuple[str, str, str], int] = {}
        self.configure(config)

    def configure(self, config: dict[str, Any]) -> None:
        self.config = config
        self.limiter.configure(config["rateLimit"])
        self._settings = BreakerSettings.from_config(config["circuitBreaker"])
        for breaker in self.breakers.values():
            breaker.settings = self._settings

    # --- per publish --------------------------------------------------------------------

    def rate(self, sender: str, now: int) -> RateVerdict | None:
        """The verdict that refuses this publish, or None to let it through."""
        if not self.config["rateLimit"]["enabled"]:
            return None
        return self.limiter.refusal(sender, now)

    def count(self, sender: str, now: int) -> None:
        """A publish stored a copy somewhere: it counts toward the sender's limit."""
        if self.config["rateLimit"]["enabled"]:
            self.limiter.record(sender, now)

    def seed(self, publishes: Iterable[tuple[str, int]]) -> None:
        self.limiter.seed(publishes)

    # --- per target endpoint ---------------------------------------------------------------

    def pressure_of(self, depth: int) -> Pressure:
        """The pressure on an endpoint with ``depth`` messages waiting in its new/."""
        section = self.config["backpressure"]
        return pressure(
            depth,
            section["maxMailboxSize"],
            section["pressureWarningAt"],
            section["enabled"],
        )

    def pressure_ratio(self, depth: int) -> float:
        """``pressure_of(depth).ratio``, without the rest (every publish's answer)."""
        maximum = self.config["backpressure"]["maxMailboxSize"]
        return 1.0 if maximum <= 0 else min(1.0, depth / maximum)

    def gate(
        self, endpoint: str, endpoint_subject: str, sender: str, depth: int, now: int
    ) -> tuple[Refusal | None, bool, list[tuple[str, Signal]]]:
        """Backpressure (``depth``: messages waiting in the endpoint's new/), then the
        circuit breaker: (refusal, is_probe, signals to send)."""
        section = self.config["backpressure"]
        signals: list[tuple[str, Signal]] = []
        limits = (section["maxMailboxSize"], section["pressureWarningAt"], section["enabled"])
        if not calm(depth, *limits):
            load = self.pressure_of(depth)
            signals = self._backpressure_signals(endpoint, endpoint_subject, sender, load, now)
            if load.reject:
                return Refusal("backpressure", load.reason), False, signals
        if not self.config["circuitBreaker"]["enabled"]:
            return None, False, signals
        breaker = self.breaker(endpoint)
        admitted, probe = breaker.admit(now)
        if not admitted:
            return Refusal("circuit_open", breaker.reason(endpoint)), False, signals
        return None, probe, signals

    def outcome(self, copy: Copy, *, success: bool, now: int) -> None:
        """A copy's write succeeded or failed (a probe's outcome frees its slot)."""
        if copy.endpoint == UNROUTABLE or not self.config["circuitBreaker"]["enabled"]:
            return
        breaker = self.breaker(copy.endpoint)
        if copy.probe:
            breaker.probe_done(success, now)
        else:
            breaker.record(success, now)

    def consumer_outcome(self, endpoint: str, *, success: bool, now: int) -> None:
        """An ack (success) or a nack (failure) of a message of this endpoint."""
        if self.config["circuitBreaker"]["enabled"]:
            self.breaker(endpoint).record(success, now)

    def never_tried(self, copy: Copy) -> None:
        """A probe whose delivery never happened (its writer is down) frees its slot."""
        if copy.probe and copy.endpoint in self.breakers:
            self.breakers[copy.endpoint].release_probe()

    def breaker(self, endpoint: str) -> CircuitBreaker:
        breaker = self.breakers.get(endpoint)
        if breaker is None:
            breaker = self.breakers[endpoint] = CircuitBreaker(self._settings)
        return breaker

    def describe(self, endpoint: str, now: int) -> dict[str, object]:
        breaker = self.breakers.get(endpoint)
        return breaker.describe(now) if breaker else {"state": "closed"}

    def _backpressure_signals(
        self, endpoint: str, endpoint_subject: str, sender: str, load: Pressure, now: int
    ) -> list[tuple[str, Signal]]:
        """Warn the sender and the endpoint, at most once a second per subject and level."""
        if load.level is Level.OK:
            return []
        signal = Signal(
            SignalType.BACKPRESSURE, load.level.value, endpoint_subject, now, load.signal_data()
        )
        due = []
        for subject in (sender, endpoint_subject):
            key = (endpoint, subject, load.level.value)
            if now - self._signalled.get(key, -SIGNAL_INTERVAL_MS) >= SIGNAL_INTERVAL_MS:
                self._signalled[key] = now
                due.append((subject, signal))
        return due

    def prune(self, now: int) -> None:
        """Forget what no longer matters (bounds memory): idle senders, old throttles."""
        self.limiter.forget_idle(now)
        self._signalled = {k: t for k, t in self._signalled.items() if now - t < SIGNAL_INTERVAL_MS}
