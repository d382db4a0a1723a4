"""The control plane: endpoints, access rules and reliability config in ``control.db``.

One SQLite file, opened through `workers.sqlite.open_db` (WAL, mode 0600), schema
versioned by ``user_version`` (`MIGRATIONS` only ever grows). Every change is one
transaction, so a crash leaves either the old state or the new one, never half a rules
file. The router owns the one `ControlPlane` and keeps its policy in memory, seeded
from here at start.

Decisions:

- ``register_endpoint`` is idempotent: registering a subject again returns the first
  registration unchanged (same time, same path). Two subjects whose 12-hex-char hashes
  collide cannot both be registered; the second is refused with `InvalidSubject`.
- Neither registering nor unregistering touches the disk outside this database: the
  caller creates the Maildir, and unregistering never deletes mail or dead letters.
- Re-adding a rule with the same ``from``/``to`` replaces its action and priority in
  place: it keeps its position among rules of equal priority.
- Config is stored as one row per leaf (``rateLimit.maxPerWindow``) holding only what was
  set; `get_config` merges it over `DEFAULT_CONFIG`, so a setting nobody changed follows
  the defaults of the running version. Dict-valued settings (``perSenderOverrides``) are
  leaves: setting one replaces the whole mapping. Rows for keys this version does not
  know are ignored on read.
- Config is accepted in two layouts: Relay's flat one and the seeds', which nests
  rateLimit, circuitBreaker and backpressure under ``reliability``. It is stored and read
  back flat; one section given in both places is refused.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import apsw

from sdk.errors import InvalidConfig, InvalidSubject
from sdk.subjects import endpoint_hash, validate
from sdk.types import AccessRule, EndpointInfo, RuleAction
from workers.sqlite import checkpoint_and_close, migrate, open_db, transaction

_SCHEMA_V1 = """
CREATE TABLE endpoints (
    subject       TEXT PRIMARY KEY,
    hash          TEXT NOT NULL UNIQUE,
    maildir_path  TEXT NOT NULL,
    registered_at INTEGER NOT NULL
) STRICT;
CREATE TABLE rules (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    from_pattern TEXT NOT NULL,
    to_pattern   TEXT NOT NULL,
    action       TEXT NOT NULL CHECK (action IN ('allow', 'deny')),
    priority     INTEGER NOT NULL,
    UNIQUE (from_pattern, to_pattern)
) STRICT;
CREATE TABLE config (
    key   TEXT PRIMARY KEY,  -- "section.name"
    value TEXT NOT NULL      -- JSON
) STRICT;
"""

# The digest of each operator file (config.json, access-rules.json) last applied, so a
# restart does not re-apply an unchanged file over changes made since with the CLI/SDK.
_SCHEMA_V2 = """
CREATE TABLE applied_files (
    name   TEXT PRIMARY KEY,
    digest TEXT NOT NULL
) STRICT;
"""

MIGRATIONS = [_SCHEMA_V1, _SCHEMA_V2]

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
}

# --- config validation -------------------------------------------------------------------

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


def _merge(config: dict[str, dict[str, Any]], leaves: Mapping[str, Any]) -> None:
    for key, value in leaves.items():
        section, _, name = key.partition(".")
        if name in config.get(section, ()):
            config[section][name] = copy.deepcopy(value)


def _check_consistent(config: Mapping[str, Mapping[str, Any]]) -> None:
    limits = config["limits"]
    if limits["defaultCredit"] > limits["maxCredit"]:
        raise InvalidConfig(
            f"limits.defaultCredit ({limits['defaultCredit']}) must not exceed "
            f"limits.maxCredit ({limits['maxCredit']})"
        )


# --- the control plane ---------------------------------------------------------------------


class ControlPlane:
    """``control.db``: every method is one transaction; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str], mailboxes_root: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self.mailboxes_root = os.fspath(mailboxes_root)
        self._lock = threading.RLock()
        self._conn: apsw.Connection | None = open_db(self.path)
        try:
            migrate(self._conn, MIGRATIONS)
        except BaseException:
            self._conn.close()
            raise

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                checkpoint_and_close(self._conn)
                self._conn = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[apsw.Connection]:
        """The connection, for single-statement reads (each one is atomic by itself)."""
        # One connection shared by threads: the lock keeps one thread's transaction from
        # swallowing another's statements (apsw serializes calls, not transactions).
        with self._lock:
            if self._conn is None:
                raise RuntimeError("control plane is closed")
            yield self._conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[apsw.Connection]:
        with self._locked() as conn, transaction(conn):
            yield conn

    # --- endpoints ---

    def register_endpoint(self, subject: str, now_ms: int) -> EndpointInfo:
        """Register a concrete subject (idempotent); the caller creates its Maildir."""
        validate(subject)
        digest = endpoint_hash(subject)
        with self._tx() as conn:
            row = conn.execute(_SELECT_ENDPOINT + "WHERE subject = ?", (subject,)).fetchone()
            if row is not None:
                return EndpointInfo(*row)
            row = conn.execute(_SELECT_ENDPOINT + "WHERE hash = ?", (digest,)).fetchone()
            if row is not None:
                raise InvalidSubject(
                    f"{subject!r} has the same endpoint hash ({digest}) as the registered "
                    f"{row[0]!r}; use another subject"
                )
            info = EndpointInfo(subject, digest, os.path.join(self.mailboxes_root, digest), now_ms)
            conn.execute(
                "INSERT INTO endpoints (subject, hash, maildir_path, registered_at) "
                "VALUES (?, ?, ?, ?)",
                (info.subject, info.hash, info.maildir_path, info.registered_at),
            )
            return info

    def unregister_endpoint(self, subject: str) -> bool:
        """Forget the endpoint; its mailbox (unread mail, dead letters) stays on disk."""
        validate(subject)
        with self._tx() as conn:
            conn.execute("DELETE FROM endpoints WHERE subject = ?", (subject,))
            return conn.changes() > 0

    def list_endpoints(self) -> list[EndpointInfo]:
        with self._locked() as conn:
            rows = conn.execute(_SELECT_ENDPOINT + "ORDER BY subject").fetchall()
        return [EndpointInfo(*row) for row in rows]

    def get_endpoint(self, subject: str) -> EndpointInfo | None:
        with self._locked() as conn:
            row = conn.execute(_SELECT_ENDPOINT + "WHERE subject = ?", (subject,)).fetchone()
        return None if row is None else EndpointInfo(*row)

    def get_endpoint_by_hash(self, digest: str) -> EndpointInfo | None:
        with self._locked() as conn:
            row = conn.execute(_SELECT_ENDPOINT + "WHERE hash = ?", (digest,)).fetchone()
        return None if row is None else EndpointInfo(*row)

    # --- access rules ---

    def add_rule(self, rule: AccessRule | Mapping[str, Any]) -> AccessRule:
        """Add a rule, or replace the action and priority of the one with the same from/to."""
        rule = _checked_rule(rule)
        with self._tx() as conn:
            _upsert_rule(conn, rule)
        return rule

    def remove_rule(self, from_pattern: str, to_pattern: str) -> bool:
        with self._tx() as conn:
            conn.execute(
                "DELETE FROM rules WHERE from_pattern = ? AND to_pattern = ?",
                (from_pattern, to_pattern),
            )
            return conn.changes() > 0

    def list_rules(self) -> list[AccessRule]:
        """All rules in evaluation order: priority descending, then insertion order."""
        with self._locked() as conn:
            rows = conn.execute(
                "SELECT from_pattern, to_pattern, action, priority FROM rules "
                "ORDER BY priority DESC, id"
            ).fetchall()
        return [AccessRule(f, t, RuleAction(a), p) for f, t, a, p in rows]

    def replace_rules(self, rules: Iterable[AccessRule | Mapping[str, Any]]) -> list[AccessRule]:
        """Make ``rules`` (e.g. a rules file, in file order) the whole rule set, atomically.

        Every rule is validated before anything changes; a later duplicate from/to
        replaces an earlier one in place, as `add_rule` does.
        """
        checked = [_checked_rule(rule) for rule in rules]
        with self._tx() as conn:
            conn.execute("DELETE FROM rules")
            for rule in checked:
                _upsert_rule(conn, rule)
        return self.list_rules()

    # --- operator files ---

    def applied_digest(self, name: str) -> str | None:
        with self._locked() as conn:
            row = conn.execute(
                "SELECT digest FROM applied_files WHERE name = ?", (name,)
            ).fetchone()
        return row[0] if row else None

    def set_applied_digest(self, name: str, digest: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO applied_files (name, digest) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET digest = excluded.digest",
                (name, digest),
            )

    # --- config ---

    def get_config(self) -> dict[str, dict[str, Any]]:
        """The effective config: stored settings merged over `DEFAULT_CONFIG` (a copy)."""
        with self._locked() as conn:
            return self._load_config(conn)

    def set_config(self, partial: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Deep-merge ``partial`` into the stored config; all of it is applied or none."""
        leaves = validate_config(partial)
        with self._tx() as conn:
            config = self._load_config(conn)
            _merge(config, leaves)
            _check_consistent(config)
            _store_leaves(conn, leaves)
        return config

    def replace_config(self, partial: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Make ``partial`` the whole stored config (e.g. config.json): what it leaves out
        goes back to its default."""
        leaves = validate_config(partial)
        config = copy.deepcopy(DEFAULT_CONFIG)
        _merge(config, leaves)
        _check_consistent(config)
        with self._tx() as conn:
            conn.execute("DELETE FROM config")
            _store_leaves(conn, leaves)
        return config

    @staticmethod
    def _load_config(conn: apsw.Connection) -> dict[str, dict[str, Any]]:
        config = copy.deepcopy(DEFAULT_CONFIG)
        rows = conn.execute("SELECT key, value FROM config").fetchall()
        _merge(config, {key: json.loads(value) for key, value in rows})
        return config


_SELECT_ENDPOINT = "SELECT subject, hash, maildir_path, registered_at FROM endpoints "


def _checked_rule(rule: AccessRule | Mapping[str, Any]) -> AccessRule:
    """Validate a rule as if it came off the wire (patterns, action, priority)."""
    return AccessRule.from_wire(rule.to_wire() if isinstance(rule, AccessRule) else rule)


def _upsert_rule(conn: apsw.Connection, rule: AccessRule) -> None:
    conn.execute(
        "INSERT INTO rules (from_pattern, to_pattern, action, priority) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (from_pattern, to_pattern) "
        "DO UPDATE SET action = excluded.action, priority = excluded.priority",
        (rule.from_pattern, rule.to_pattern, str(rule.action), rule.priority),
    )


def _store_leaves(conn: apsw.Connection, leaves: Mapping[str, Any]) -> None:
    for key, value in leaves.items():
        conn.execute(
            "INSERT INTO config (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )
