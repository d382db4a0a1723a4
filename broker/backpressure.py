"""Backpressure, per endpoint: how full a mailbox is, and what to do about it. Pure.

Depth is the number of messages waiting in ``new/`` (not yet handed to a consumer).
At ``maxMailboxSize`` further deliveries are rejected (``backpressure``, not a dead
letter: the publisher decides whether to try later); from ``pressureWarningAt`` of it
a ``backpressure`` signal warns the sender and the endpoint (state ``warning``, or
``critical`` when rejecting). Every PublishResult carries the ratio of each endpoint it
touched, so cooperative senders slow down before anything is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Pressure:
    depth: int
    maximum: int
    ratio: float  # 0.0 - 1.0
    level: Level

    @property
    def reject(self) -> bool:
        return self.level is Level.CRITICAL

    @property
    def reason(self) -> str:
        return f"backpressure: mailbox full ({self.depth}/{self.maximum})"

    def signal_data(self) -> dict[str, float | int]:
        return {"pressure": self.ratio, "currentSize": self.depth, "maxMailboxSize": self.maximum}


def pressure(depth: int, maximum: int, warning_at: float, enabled: bool = True) -> Pressure:
    """The pressure of a mailbox holding ``depth`` waiting messages."""
    ratio = 1.0 if maximum <= 0 else min(1.0, depth / maximum)
    if not enabled:
        level = Level.OK
    elif depth >= maximum:
        level = Level.CRITICAL
    elif ratio >= warning_at:
        level = Level.WARNING
    else:
        level = Level.OK
    return Pressure(depth, maximum, ratio, level)


def calm(depth: int, maximum: int, warning_at: float, enabled: bool = True) -> bool:
    """Whether `pressure` says `Level.OK` (nothing refused, nothing signalled), without
    building it: the answer for almost every target of every publish, so the router's
    gate asks this first."""
    return not enabled or (maximum > 0 and depth < maximum and depth / maximum < warning_at)
