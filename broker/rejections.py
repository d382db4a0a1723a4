"""Counts of the router's reliability rejections, kept for `relay ops metrics`.

A publish refused by the rate limiter, backpressure or an open circuit writes nothing
(it is not a dead letter: docs/design.md, "Concepts"), so without this log nothing
would remember it.
Budget and access rejections need no log: they are dead letters, counted from the index
and the archive by their code.

Cost: `record` is one dict increment on the rejection path and nothing on the delivery
path. Counts are kept per (minute, reason, endpoint, sender) in memory and written by
`flush_due`, from the router's poll loop, at most every `FLUSH_INTERVAL_MS`, as one
upsert transaction into ``$RELAY_HOME/rejections.db`` (WAL, synchronous=NORMAL: no fsync
on commit, about 0.1 ms). A crash loses at most the last interval's counts: these are
statistics, not messages. A flush that fails is logged and its counts dropped; the
router never stops for them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import apsw

from workers.sqlite import checkpoint_and_close, migrate, open_db, transaction

log = logging.getLogger("relay.rejections")

FILE_NAME = "rejections.db"
FLUSH_INTERVAL_MS = 2000
MAX_KEYS = 100_000  # distinct keys held before an early flush: memory stays bounded
MINUTE_MS = 60_000
RATE_LIMITED, BACKPRESSURE, CIRCUIT_OPEN = "rate_limited", "backpressure", "circuit_open"

MIGRATIONS = [
    """
    CREATE TABLE rejections (
        minute   INTEGER NOT NULL,  -- unix ms, start of the minute (UTC)
        reason   TEXT    NOT NULL,  -- rate_limited | backpressure | circuit_open
        endpoint TEXT    NOT NULL,  -- endpoint hash; "*" for rate_limited (before fan-out)
        sender   TEXT    NOT NULL,
        count    INTEGER NOT NULL,
        PRIMARY KEY (minute, reason, endpoint, sender)
    ) WITHOUT ROWID;
    """,
]
COLUMNS = ("minute", "reason", "endpoint", "sender", "count")
UPSERT = (
    "INSERT INTO rejections (minute, reason, endpoint, sender, count) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (minute, reason, endpoint, sender) DO UPDATE SET count = count + excluded.count"
)


class RejectionLog:
    """The router's batched recorder; one per router, used from its one thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.counts: dict[tuple[int, str, str, str], int] = {}
        self._conn: apsw.Connection | None = None
        self._next_flush = 0

    def record(self, now_ms: int, reason: str, endpoint: str, sender: str) -> None:
        key = (now_ms - now_ms % MINUTE_MS, reason, endpoint, sender)
        self.counts[key] = self.counts.get(key, 0) + 1
        if len(self.counts) >= MAX_KEYS:
            self.flush()

    def flush_due(self, now_ms: int) -> None:
        """Flush when the interval has passed (call it from the poll loop)."""
        if self.counts and now_ms >= self._next_flush:
            self._next_flush = now_ms + FLUSH_INTERVAL_MS
            self.flush()

    def flush(self) -> None:
        if not self.counts:
            return
        rows = [(*key, n) for key, n in self.counts.items()]
        self.counts = {}
        try:
            if self._conn is None:
                self._conn = open_db(self.path)
                migrate(self._conn, MIGRATIONS)
            with transaction(self._conn):
                self._conn.cursor().executemany(UPSERT, rows)
        except apsw.Error as exc:
            log.warning("could not record %d rejection counts in %s: %s", len(rows), self.path, exc)

    def close(self) -> None:
        self.flush()
        if self._conn is not None:
            checkpoint_and_close(self._conn)
            self._conn = None
