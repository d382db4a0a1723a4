"""Circuit breakers, one per endpoint. Pure; time is an argument.

CLOSED: deliveries pass; ``failureThreshold`` consecutive failures open the breaker.
OPEN: deliveries are rejected (``circuit_open``, not a dead letter) until ``cooldownMs``
has passed since it opened; then it is HALF_OPEN.
HALF_OPEN: at most ``halfOpenProbeCount`` probe deliveries are in flight at a time
(enforced: a probe slot is taken by `admit` and given back by `probe_done`);
``successToClose`` consecutive successes close it; any failure reopens it.

Failures are write failures reported by the writer and consumer nacks; successes are
durable writes and acks. State lives in the router's memory and resets on restart, by
design: a restart is a fresh chance for every endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    failure_threshold: int = 5
    cooldown_ms: int = 30_000
    half_open_probes: int = 1
    success_to_close: int = 2

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> BreakerSettings:
        return cls(
            int(section["failureThreshold"]),
            int(section["cooldownMs"]),
            int(section["halfOpenProbeCount"]),
            int(section["successToClose"]),
        )


class CircuitBreaker:
    def __init__(self, settings: BreakerSettings) -> None:
        self.settings = settings
        self.state = BreakerState.CLOSED
        self.failures = 0  # consecutive, while CLOSED
        self.successes = 0  # consecutive, while HALF_OPEN
        self.opened_at = 0
        self.probes = 0  # probe deliveries in flight, while HALF_OPEN

    def admit(self, now_ms: int) -> tuple[bool, bool]:
        """(admitted, is_probe). A probe must be finished with `probe_done`."""
        if self.state is BreakerState.OPEN:
            if now_ms - self.opened_at < self.settings.cooldown_ms:
                return False, False
            self.state, self.successes, self.probes = BreakerState.HALF_OPEN, 0, 0
        if self.state is BreakerState.HALF_OPEN:
            if self.probes >= self.settings.half_open_probes:
                return False, False
            self.probes += 1
            return True, True
        return True, False

    def probe_done(self, success: bool, now_ms: int) -> None:
        """The outcome of a probe delivery (its write): frees its slot, then counts it."""
        if self.state is BreakerState.HALF_OPEN:
            self.probes = max(0, self.probes - 1)
        self.record(success, now_ms)

    def release_probe(self) -> None:
        """A probe slot taken for a delivery that was never attempted."""
        if self.state is BreakerState.HALF_OPEN:
            self.probes = max(0, self.probes - 1)

    def record(self, success: bool, now_ms: int) -> None:
        """An outcome that counts: a write result, an ack (success) or a nack (failure)."""
        if self.state is BreakerState.CLOSED:
            self.failures = 0 if success else self.failures + 1
            if self.failures >= self.settings.failure_threshold:
                self._open(now_ms)
        elif self.state is BreakerState.HALF_OPEN:
            if not success:
                self._open(now_ms)
                return
            self.successes += 1
            if self.successes >= self.settings.success_to_close:
                self.state, self.failures, self.probes = BreakerState.CLOSED, 0, 0

    def _open(self, now_ms: int) -> None:
        self.state, self.opened_at, self.failures, self.successes = (
            BreakerState.OPEN,
            now_ms,
            0,
            0,
        )

    def reason(self, endpoint: str) -> str:
        return f"circuit open for endpoint {endpoint}"

    def describe(self, now_ms: int) -> dict[str, object]:
        info: dict[str, object] = {"state": self.state.value, "failures": self.failures}
        if self.state is BreakerState.OPEN:
            info["reopensInMs"] = max(0, self.settings.cooldown_ms - (now_ms - self.opened_at))
        return info
