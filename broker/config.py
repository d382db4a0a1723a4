"""The reliability config: its defaults (`DEFAULT_CONFIG`), the check of every setting
(`CONFIG_SCHEMA`), and a partial config turned into stored leaves (`validate_config`).

Pure: broker/control.py stores the leaves in control.db and merges them over the
defaults. Decisions:

- A setting is stored as one leaf (``rateLimit.maxPerWindow``) holding only what was
  set, so a setting nobody changed follows the defaults of the running version.
  Dict-valued settings (``perSenderOverrides``) are leaves: setting one replaces the
  whole mapping. Leaves for keys this version does not know are ignored on read.
- Config is accepted in two layouts: Relay's flat one and the seeds', which nests
  rateLimit, circuitBreaker and backpressure under ``reliability``. It is stored and
  read back flat; one section given in both places is refused.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sdk.errors import InvalidConfig, RelayError
from sdk.subjects import validate

DEFAULT_CONFIG: dict[str, dict[str, Any]] = {
    "limits": {
        "maxPayloadBytes": 1_048_576,
        "maxSubscriptionsPerClient": 256,
        "defaultCredit": 64,
        "maxCredit": 1024,
    },
    "rateLimit": {
        "enabled": True,
        "windowSecs": 60,
        "maxPerWindow": 100,
        "perSenderOverrides": {},  # subject prefix -> maxPerWindow; longest prefix wins
    },
    "circuitBreaker": {
        "enabled": True,
        "failureThreshold": 5,
        "cooldownMs": 30_000,
        "halfOpenProbeCount": 1,
        "successToClose": 2,
    },
    "backpressure": {
        "enabled": True,
        "maxMailboxSize": 1000,
        "pressureWarningAt": 0.8,
    },
    # The most a client-supplied budget may allow; more is clamped down (budgets only
    # ever shrink, and a client must not grant itself an endless loop).
    "budget": {
        "maxHops": 16,
        "maxTtlMs": 86_400_000,
        "maxCallBudget": 100,
    },
    # Endpoints whose subject matches one of these patterns are advertised to other
    # nodes by the federation bridge, as if registered shared (docs/federation.md).
    "federation": {
        "shared": [],
    },
    # The consumer's half (docs/architecture.md, "The life of a claim"): a client silent
    # for sessionTimeoutMs is gone and what it held is handed out again; a message
    # handed out maxDeliveries times whose holder died once more is a dead letter
    # (0: no limit).
    "delivery": {
        "maxDeliveries": 5,
        "sessionTimeoutMs": 5_000,
    },
}


_Check = Callable[[str, Any], Any]


def _int(minimum: int) -> _Check:
    def check(label: str, value: Any) -> int:
        if type(value) is not int or value < minimum:
            raise InvalidConfig(f"{label} must be an int >= {minimum}, got {value!r:.60}")
        return value

    return check


def _flag(label: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidConfig(f"{label} must be true or false, got {value!r:.60}")
    return value


def _ratio(label: str, value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value <= 1:
        raise InvalidConfig(f"{label} must be a number from 0 to 1, got {value!r:.60}")
    return float(value)


def _overrides(label: str, value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise InvalidConfig(f"{label} must be an object of prefix -> limit, got {value!r:.60}")
    limit = _int(0)
    for prefix, n in value.items():
        if not isinstance(prefix, str) or not prefix:
            raise InvalidConfig(f"{label} keys must be non-empty subject prefixes, got {prefix!r}")
        limit(f"{label}[{prefix!r}]", n)
    return dict(value)


def _patterns(label: str, value: Any) -> list[str]:
    if not isinstance(value, list):
        raise InvalidConfig(f"{label} must be a list of subject patterns, got {value!r:.60}")
    for pattern in value:
        try:
            validate(pattern, wildcards=True)
        except RelayError as exc:
            raise InvalidConfig(f"{label}: {exc.message}") from None
    return list(value)


CONFIG_SCHEMA: dict[str, dict[str, _Check]] = {
    "limits": {
        "maxPayloadBytes": _int(1),
        "maxSubscriptionsPerClient": _int(1),
        "defaultCredit": _int(1),
        "maxCredit": _int(1),
    },
    "rateLimit": {
        "enabled": _flag,
        "windowSecs": _int(1),
        "maxPerWindow": _int(0),
        "perSenderOverrides": _overrides,
    },
    "circuitBreaker": {
        "enabled": _flag,
        "failureThreshold": _int(1),
        "cooldownMs": _int(1000),
        "halfOpenProbeCount": _int(1),
        "successToClose": _int(1),
    },
    "backpressure": {
        "enabled": _flag,
        "maxMailboxSize": _int(0),
        "pressureWarningAt": _ratio,
    },
    "budget": {
        "maxHops": _int(1),
        "maxTtlMs": _int(1000),
        "maxCallBudget": _int(1),
    },
    "federation": {
        "shared": _patterns,
    },
    "delivery": {
        "maxDeliveries": _int(0),
        "sessionTimeoutMs": _int(1000),
    },
}


# The seeds' config.json (DorkOS's relay) nests these three sections under "reliability",
# with the same field names inside; Relay's own layout has them at the top. Both are
# accepted, so a file written for the seeds works here unchanged.
RELIABILITY = "reliability"
RELIABILITY_SECTIONS = ("rateLimit", "circuitBreaker", "backpressure")


def _sections(partial: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """``(where it was written, section, values)`` for each section, in either layout."""
    for key, values in partial.items():
        if key != RELIABILITY:
            yield key, key, values
            continue
        if not isinstance(values, Mapping):
            raise InvalidConfig(f"config key {key!r} must be an object, got {values!r:.60}")
        for section, inner in values.items():
            where = f"{RELIABILITY}.{section}"
            if section not in RELIABILITY_SECTIONS:
                raise InvalidConfig(
                    f"unknown config key {where!r}; known: {', '.join(RELIABILITY_SECTIONS)}"
                )
            # Which of the two would win is a guess the writer should not have to make.
            if section in partial:
                raise InvalidConfig(
                    f"config key {section!r} is given twice, at the top and as {where!r}; "
                    "write it in one place"
                )
            yield where, section, inner


def validate_config(partial: object) -> dict[str, Any]:
    """Check a partial config, in either layout (`RELIABILITY`); return its leaves as
    ``{"section.name": value}``, the one layout stored and read back."""
    if not isinstance(partial, Mapping):
        raise InvalidConfig(f"config must be an object, got {partial!r:.60}")
    leaves: dict[str, Any] = {}
    for where, section, values in _sections(partial):
        schema = CONFIG_SCHEMA.get(section)
        if schema is None:
            known = ", ".join([*CONFIG_SCHEMA, RELIABILITY])
            raise InvalidConfig(f"unknown config key {where!r}; known: {known}")
        if not isinstance(values, Mapping):
            raise InvalidConfig(f"config key {where!r} must be an object, got {values!r:.60}")
        for name, value in values.items():
            check = schema.get(name)
            if check is None:
                raise InvalidConfig(
                    f"unknown config key '{where}.{name}'; known: {', '.join(schema)}"
                )
            leaves[f"{section}.{name}"] = check(f"{where}.{name}", value)
    return leaves


def merge_leaves(config: dict[str, dict[str, Any]], leaves: Mapping[str, Any]) -> None:
    """Write ``leaves`` (``{"section.name": value}``) into ``config``; unknown ones are
    skipped (a setting an older or newer version stored)."""
    for key, value in leaves.items():
        section, _, name = key.partition(".")
        if name in config.get(section, ()):
            config[section][name] = copy.deepcopy(value)


def check_consistent(config: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a whole config whose settings contradict each other."""
    limits = config["limits"]
    if limits["defaultCredit"] > limits["maxCredit"]:
        raise InvalidConfig(
            f"limits.defaultCredit ({limits['defaultCredit']}) must not exceed "
            f"limits.maxCredit ({limits['maxCredit']})"
        )
