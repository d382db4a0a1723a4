"""Reading the shards' message indexes for queries (trace, dead letters, pending, status).

The writers own the indexes; the router opens them read-only for one query and closes
them: a reader that stays would stop a writer's checkpoint at shutdown from truncating
its WAL. Opening costs ~0.1 ms; queries are operator requests.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from sdk.errors import RelayError, StorageError
from sdk.paths import Home, shard_of
from workers.index import MessageIndex
from workers.maildir import Mailbox
from workers.records import MessageRecord, State

log = logging.getLogger("relay.router")


class Indexes:
    def __init__(self, home: Home, shards: int) -> None:
        self.home = home
        self.shards = shards

    @contextlib.contextmanager
    def open(self, endpoint: str | None = None) -> Iterator[list[MessageIndex]]:
        """The index of ``endpoint``'s shard, or of every shard; damaged or not yet made
        ones are skipped (their writer rebuilds or makes them at start)."""
        shards = [shard_of(endpoint, self.shards)] if endpoint else range(self.shards)
        indexes = []
        for path in map(self.home.index_db, shards):
            if not path.exists():
                continue
            try:
                index = MessageIndex(path, readonly=True)
            except StorageError as exc:
                log.warning("index %s unreadable, skipped: %s", path, exc)
                continue
            if index.schema_version == 0:
                index.close()
                continue
            indexes.append(index)
        try:
            yield indexes
        finally:
            for index in indexes:
                index.close()

    def count(self, state: State, endpoint: str) -> int:
        with self.open(endpoint) as indexes:
            return sum(i.count(endpoint=endpoint, state=state) for i in indexes)

    def query(self, *, state: State, endpoint: str | None, limit: int) -> list[MessageRecord]:
        found: list[MessageRecord] = []
        with self.open(endpoint) as indexes:
            for index in indexes:
                records, _ = index.query(state=state.value, endpoint=endpoint, limit=limit)
                found.extend(records)
        found.sort(key=lambda r: (r.id, r.endpoint))
        return found[:limit]

    def copies_of(self, message_id: str) -> list[MessageRecord]:
        copies: list[MessageRecord] = []
        with self.open() as indexes:
            for index in indexes:
                copies.extend(index.get(message_id))
        return copies

    def recent_publishes(self, since: int) -> list[tuple[str, int]]:
        """(sender, created_at) of each message published since ``since`` (ms), once
        each, however many endpoints it reached."""
        seen: dict[str, tuple[str, int]] = {}
        with self.open() as indexes:
            for index in indexes:
                for message_id, sender, created_at in index.recent_publishes(since):
                    seen[message_id] = (sender, created_at)
        return list(seen.values())

    def with_file(self, record: MessageRecord, wire_record: dict[str, Any]) -> dict[str, Any]:
        """``wire_record`` with the message's envelope, read from its file if it is there."""
        mailbox = Mailbox(self.home.mailbox(record.endpoint), record.endpoint)
        with contextlib.suppress(RelayError, OSError, ValueError):
            _, data = mailbox.read(record.id)
            wire_record["envelope"] = json.loads(data)
        return wire_record


def record_wire(record: MessageRecord, endpoint_subject: str | None) -> dict[str, Any]:
    return {
        "id": record.id,
        "endpoint": record.endpoint,
        "subject": record.subject,
        "endpointSubject": endpoint_subject,
        "from": record.sender,
        "state": record.state.value,
        "createdAt": record.created_at,
        "storedAt": record.stored_at,
        "claimedAt": record.claimed_at,
        "finishedAt": record.finished_at,
        "reason": record.reason,
        "code": record.reason_code,
        "size": record.size,
    }
