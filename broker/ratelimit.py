"""Per-sender rate limiting: a sliding-window log. Pure; time is an argument.

Each sender's admitted publishes are kept as a log of timestamps; a publish is admitted
while fewer than the sender's limit fall inside the last ``window_ms``. Trade-off: exact
at every instant (no burst of 2x at a fixed window's edge), at the cost of one timestamp
per admitted publish held for one window: memory is bounded by (senders active in the
window) x (their limit).

The limit is ``maxPerWindow``, or the override of the longest matching sender prefix
(``{"relay.agent.": 1000}``). The router checks once per publish, before fan-out, and
records only publishes that stored at least one copy (dead letters and rejections do
not count), so one sender's burst never uses up anyone else's allowance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RateVerdict:
    allowed: bool
    count: int  # publishes in the window before this one
    limit: int
    window_secs: int

    @property
    def reason(self) -> str:
        return (
            f"rate limit exceeded: {self.count}/{self.limit} messages in {self.window_secs}s window"
        )


class RateLimiter:
    def __init__(
        self,
        window_secs: int = 60,
        max_per_window: int = 100,
        overrides: Mapping[str, int] | None = None,
    ) -> None:
        self._logs: dict[str, deque[int]] = {}
        self.configure(
            {
                "windowSecs": window_secs,
                "maxPerWindow": max_per_window,
                "perSenderOverrides": overrides or {},
            }
        )

    def configure(self, section: Mapping[str, Any]) -> None:
        """Apply new settings (the rateLimit config section); the logs are kept."""
        self.window_secs = int(section["windowSecs"])
        self.max_per_window = int(section["maxPerWindow"])
        self.overrides = dict(section.get("perSenderOverrides") or {})
        self._prefixes = sorted(self.overrides, key=len, reverse=True)

    def limit_for(self, sender: str) -> int:
        for prefix in self._prefixes:
            if sender.startswith(prefix):
                return self.overrides[prefix]
        return self.max_per_window

    def check(self, sender: str, now_ms: int) -> RateVerdict:
        """Would a publish from sender be admitted now? Does not record it."""
        limit = self.limit_for(sender)
        count = self._count(sender, now_ms)
        return RateVerdict(count < limit, count, limit, self.window_secs)

    def refusal(self, sender: str, now_ms: int) -> RateVerdict | None:
        """`check`'s verdict when it refuses; None, and nothing built, when it admits
        (every publish asks)."""
        limit = self.limit_for(sender)
        count = self._count(sender, now_ms)
        return None if count < limit else RateVerdict(False, count, limit, self.window_secs)

    def record(self, sender: str, now_ms: int) -> None:
        self._logs.setdefault(sender, deque()).append(now_ms)

    def seed(self, publishes: Iterable[tuple[str, int]]) -> None:
        """Refill the logs after a restart from (sender, created_at) of stored publishes."""
        for sender, at in sorted(publishes, key=lambda p: p[1]):
            self.record(sender, at)

    def _count(self, sender: str, now_ms: int) -> int:
        log = self._logs.get(sender)
        if log is None:
            return 0
        horizon = now_ms - self.window_secs * 1000
        while log and log[0] <= horizon:
            log.popleft()
        if not log:
            del self._logs[sender]
            return 0
        return len(log)

    def forget_idle(self, now_ms: int) -> None:
        """Drop senders with nothing left in the window (bounds memory)."""
        for sender in list(self._logs):
            self._count(sender, now_ms)
