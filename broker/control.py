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
  set; `get_config` merges it over `DEFAULT_CONFIG`. The defaults, the checks and the two
  layouts accepted are broker/config.py.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import apsw

from broker.config import DEFAULT_CONFIG, check_consistent, merge_leaves, validate_config
from sdk.errors import InvalidSubject
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

# Whether an endpoint is advertised to other nodes by the federation bridge
# (docs/federation.md); node-local by default.
_SCHEMA_V3 = """
ALTER TABLE endpoints ADD COLUMN shared INTEGER NOT NULL DEFAULT 0;
"""

MIGRATIONS = [_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3]


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

    def register_endpoint(
        self, subject: str, now_ms: int, *, shared: bool | None = None
    ) -> EndpointInfo:
        """Register a concrete subject (idempotent); the caller creates its Maildir.
        ``shared`` True or False sets whether other nodes see it; None leaves an
        existing endpoint as it is (and makes a new one node-local)."""
        validate(subject)
        digest = endpoint_hash(subject)
        with self._tx() as conn:
            row = conn.execute(_SELECT_ENDPOINT + "WHERE subject = ?", (subject,)).fetchone()
            if row is not None:
                info = _endpoint(row)
                if shared is None or shared == info.shared:
                    return info
                conn.execute(
                    "UPDATE endpoints SET shared = ? WHERE subject = ?", (int(shared), subject)
                )
                return replace(info, shared=shared)
            row = conn.execute(_SELECT_ENDPOINT + "WHERE hash = ?", (digest,)).fetchone()
            if row is not None:
                raise InvalidSubject(
                    f"{subject!r} has the same endpoint hash ({digest}) as the registered "
                    f"{row[0]!r}; use another subject"
                )
            path = os.path.join(self.mailboxes_root, digest)
            info = EndpointInfo(subject, digest, path, now_ms, shared=bool(shared))
            conn.execute(
                "INSERT INTO endpoints (subject, hash, maildir_path, registered_at, shared) "
                "VALUES (?, ?, ?, ?, ?)",
                (info.subject, info.hash, info.maildir_path, info.registered_at, int(info.shared)),
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
        return [_endpoint(row) for row in rows]

    def get_endpoint(self, subject: str) -> EndpointInfo | None:
        with self._locked() as conn:
            row = conn.execute(_SELECT_ENDPOINT + "WHERE subject = ?", (subject,)).fetchone()
        return None if row is None else _endpoint(row)

    def get_endpoint_by_hash(self, digest: str) -> EndpointInfo | None:
        with self._locked() as conn:
            row = conn.execute(_SELECT_ENDPOINT + "WHERE hash = ?", (digest,)).fetchone()
        return None if row is None else _endpoint(row)

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
            merge_leaves(config, leaves)
            check_consistent(config)
            _store_leaves(conn, leaves)
        return config

    def replace_config(self, partial: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Make ``partial`` the whole stored config (e.g. config.json): what it leaves out
        goes back to its default."""
        leaves = validate_config(partial)
        config = copy.deepcopy(DEFAULT_CONFIG)
        merge_leaves(config, leaves)
        check_consistent(config)
        with self._tx() as conn:
            conn.execute("DELETE FROM config")
            _store_leaves(conn, leaves)
        return config

    @staticmethod
    def _load_config(conn: apsw.Connection) -> dict[str, dict[str, Any]]:
        config = copy.deepcopy(DEFAULT_CONFIG)
        rows = conn.execute("SELECT key, value FROM config").fetchall()
        merge_leaves(config, {key: json.loads(value) for key, value in rows})
        return config


_SELECT_ENDPOINT = "SELECT subject, hash, maildir_path, registered_at, shared FROM endpoints "


def _endpoint(row: tuple) -> EndpointInfo:
    subject, digest, path, registered_at, shared = row
    return EndpointInfo(subject, digest, path, registered_at, shared=bool(shared))


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
