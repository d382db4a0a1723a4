"""Removing archived copies from the live store: by the writers, or by the job itself.

docs/design.md invariant 1: every file move in a mailbox is done by the writer that owns it.
So while a broker runs, compaction never unlinks a file itself: it sends
``compact_remove`` requests (`BrokerRemoval`) and the router forwards each (id, endpoint)
to the owning shard's writer, which removes the file only if it is done or failed and
deletes the index row in its own group commit (workers/compaction.py).

When no Relay process runs at all, nobody owns the mailboxes and the job removes the
files and rows itself (`LocalRemoval`), with the same function and the same checks.
A router that does not answer while some Relay process is alive is an error: the job
refuses to touch files behind a running writer's back.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ops.live import index_paths
from sdk.errors import RelayError
from sdk.paths import Home
from workers import locks
from workers.compaction import Hint, remove_finished
from workers.index import MessageIndex
from workers.maildir import Mailbox

REQUEST_ITEMS = 2000  # per compact_remove request: each is one writer group commit
# Mailboxes cleared at once by LocalRemoval. An unlink waits on the disk (on an ext4
# mounted with `discard`, a synchronous TRIM of the file's block: ~80-110 us each); a few
# in flight at once about halve the cost per file (bench/bench_ops.py).
REMOVAL_THREADS = 8


class OpsError(Exception):
    """A job cannot go on (the message says why and what to do)."""


@dataclass
class RemovalTotals:
    removed: int = 0  # index rows deleted (copies no longer live)
    files: int = 0
    bytes: int = 0
    skipped: int = 0  # new or claimed after all: left alone
    indexes: list[dict[str, Any]] = field(default_factory=list)

    def add(self, result: dict[str, Any]) -> None:
        self.removed += result.get("removed", 0)
        self.files += result.get("files", 0)
        self.bytes += result.get("bytes", 0)
        self.skipped += result.get("skipped", 0)
        self.indexes.extend(result.get("indexes", []))


class BrokerRemoval:
    mode = "broker"

    def __init__(self, home: Home, timeout: float = 60.0) -> None:
        from sdk.client import connect

        self.client = connect(home.root, timeout=timeout)
        self.timeout = timeout

    def remove(self, keys: Sequence[tuple[str, str]], hints: dict, totals: RemovalTotals) -> None:
        for start in range(0, len(keys), REQUEST_ITEMS):
            totals.add(self.client.compact_remove(list(keys[start : start + REQUEST_ITEMS])))

    def finish(self, vacuum_pages: int, totals: RemovalTotals) -> None:
        totals.add(self.client.compact_remove([], checkpoint=True, vacuum_pages=vacuum_pages))

    def close(self) -> None:
        self.client.close()


class LocalRemoval:
    mode = "local"

    def __init__(self, home: Home) -> None:
        self.home = home
        self.indexes = [MessageIndex(path) for path in index_paths(home)]

    def remove(
        self, keys: Sequence[tuple[str, str]], hints: dict[tuple[str, str], Hint], totals
    ) -> None:
        if running_processes(self.home):
            raise OpsError(
                "a Relay process started while compaction removed files itself; stopping. "
                "Run compaction again: the broker will do the removal."
            )
        by_endpoint: dict[str, list[Hint]] = {}
        for key in keys:
            by_endpoint.setdefault(key[1], []).append(hints.get(key, (key[0], None, None)))

        def one(endpoint: str):
            mailbox = Mailbox(self.home.mailbox(endpoint), endpoint)
            return remove_finished(mailbox, by_endpoint[endpoint])  # fsyncs its directories

        # Each mailbox on a thread of its own (unlink and fsync release the GIL); the
        # index rows go only after every mailbox's files are gone and fsynced.
        threads = min(REMOVAL_THREADS, len(by_endpoint)) or 1
        with ThreadPoolExecutor(threads, thread_name_prefix="relay-remove") as pool:
            results = list(zip(by_endpoint, pool.map(one, by_endpoint), strict=True))
        deletes = []
        for endpoint, removed in results:
            deletes.extend((message_id, endpoint) for message_id in removed.deleted)
            totals.files += removed.files
            totals.bytes += removed.bytes
            totals.skipped += removed.skipped
        for index in self.indexes:  # stale index files of an old shard count too
            index.delete(deletes)
        totals.removed += len(deletes)

    def finish(self, vacuum_pages: int, totals: RemovalTotals) -> None:
        for index in self.indexes:
            totals.indexes.append(index.compact_storage(vacuum_pages))

    def close(self) -> None:
        for index in self.indexes:
            index.close()


def running_processes(home: Home) -> dict[str, int]:
    """Relay processes of this home that are alive: the holders of its locks in run/
    (workers/locks.py; a lock dies with its process, so none is stale)."""
    return {name: holder.pid for name, holder in locks.holders(home).items()}


def choose_removal(home: Home, mode: str = "auto", timeout: float = 60.0):
    """`BrokerRemoval` when a router answers, `LocalRemoval` when no Relay process runs."""
    alive = running_processes(home)
    if mode in ("auto", "broker") and "router" in alive:
        remover = BrokerRemoval(home, timeout)
        try:
            status = remover.client.status(timeout=5.0)
        except RelayError as exc:
            remover.close()
            raise OpsError(
                f"the router (pid {alive['router']}) does not answer ({exc}); compaction "
                "removes nothing behind a running writer's back. Try again when it answers."
            ) from exc
        down = [w["shard"] for w in status["writers"] if not w["pid"]]
        if down:
            remover.close()
            raise OpsError(
                f"writer(s) of shard {', '.join(map(str, down))} are down: start them "
                "first (they remove the archived files of their mailboxes)"
            )
        return remover
    if mode == "broker":
        raise OpsError("no router is running (--removal broker)")
    if alive:
        names = ", ".join(f"{name} (pid {pid})" for name, pid in sorted(alive.items()))
        raise OpsError(
            f"Relay processes run ({names}) but no router: start the router, or stop them, "
            "so that exactly one process owns the mailboxes"
        )
    return LocalRemoval(home)
