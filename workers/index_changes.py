"""What one group commit changes in the shard's index, written in one transaction after
the files are durable (workers/writer.py: files first, index second, then the router)."""

from __future__ import annotations

from workers.fsio import fsync_dirs
from workers.index import MessageIndex
from workers.records import MessageRecord


class IndexChanges:
    """The index rows one group commit changes, written in one transaction."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        """Empty, ready for the next commit (a commit may happen mid-batch, see rebuild)."""
        self.inserts: list[MessageRecord] = []
        # the deliveries' rows, tuples in COLUMNS order (`workers.index.record_row`)
        self.rows: list[tuple] = []
        # (id, endpoint, claimed_at, deliveries): deliveries counts this hand-out
        self.claims: list[tuple[str, str, int, int]] = []
        self.dones: list[tuple[str, str, int]] = []
        # (id, endpoint, failed_at, reason, code, size, deliveries)
        self.fails: list[tuple[str, str, int, str, str, int, int]] = []
        self.requeues: list[tuple[str, str]] = []
        self.deletes: list[tuple[str, str]] = []
        # cur/ directories whose renames (claims, completions) this commit made: each is
        # fsynced once, before anyone hears of them, instead of once per message (the
        # consume path's cost; bench_broker "publish -> handler").
        self.dirs: set[str] = set()
        self.synced: set[str] = set()  # of those, fsynced since their renames already
        self.stored_claimed: list[tuple[str, str]] = []  # (endpoint, id) stored into cur/
        # (endpoint, id, its earlier name in cur/ or None: it was in new/) claimed
        self.claimed_names: list[tuple[str, str, str | None]] = []

    def commit(self, index: MessageIndex) -> None:
        fsync_dirs(sorted(self.dirs - self.synced))
        if any(
            (
                self.inserts,
                self.rows,
                self.claims,
                self.dones,
                self.fails,
                self.requeues,
                self.deletes,
            )
        ):
            index.write(
                inserts=self.inserts,
                rows=self.rows,
                claims=self.claims,
                dones=self.dones,
                fails=self.fails,
                requeues=self.requeues,
                deletes=self.deletes,
            )
        self._clear()
