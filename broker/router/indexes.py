"""Reading the shards' message indexes for queries (trace, dead letters, pending, status).

The writers own the indexes; the router opens them read-only when a pass first needs
them and closes them at the end of that pass (`release`, called by the loop): a reader
that stayed would stop a writer's checkpoint at shutdown from truncating its WAL, and
would keep reading a file the writer moved aside. Each query is its own read
transaction, so a reader held for a pass still sees every commit made before the query.
Opening both shards' indexes and closing them costs ~0.2 ms: once per ingest, that was
most of a far router's time (docs/performance.md, "Federation"); once per pass, it is
shared by every ingest the pass handles.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from sdk.errors import RelayError, StorageError
from sdk.paths import Home, shard_of
from workers.filenames import place_of
from workers.fsio import read_file
from workers.index import MessageIndex
from workers.maildir import Mailbox
from workers.records import MessageRecord, State

log = logging.getLogger("relay.router")


class Indexes:
    def __init__(self, home: Home, shards: int) -> None:
        self.home = home
        self.shards = shards
        self._readers: dict[int, MessageIndex | None] | None = None  # this pass's

    @contextlib.contextmanager
    def open(self, endpoint: str | None = None) -> Iterator[list[MessageIndex]]:
        """The index of ``endpoint``'s shard, or of every shard; damaged or not yet made
        ones are skipped (their writer rebuilds or makes them at start). Open until the
        end of the pass (`release`)."""
        shards = [shard_of(endpoint, self.shards)] if endpoint else range(self.shards)
        readers = self._readers if self._readers is not None else {}
        self._readers = readers
        for shard in shards:
            if shard not in readers:
                readers[shard] = self._reader(shard)
        yield [index for shard in shards if (index := readers[shard]) is not None]

    def _reader(self, shard: int) -> MessageIndex | None:
        path = self.home.index_db(shard)
        if not path.exists():
            return None
        try:
            index = MessageIndex(path, readonly=True)
        except StorageError as exc:
            log.warning("index %s unreadable, skipped: %s", path, exc)
            return None
        if index.schema_version == 0:
            index.close()
            return None
        return index

    def release(self) -> None:
        """Close what this pass opened (the loop, at the end of each pass)."""
        readers, self._readers = self._readers, None
        for index in (readers or {}).values():
            if index is not None:
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

    def claimed_on(self, shard: int) -> list[tuple[str, str, int]]:
        """(id, endpoint, deliveries) of every message claimed in the shard's cur/: read
        when its writer comes up, to find the claims nobody holds (after a restart).
        As many as are pending, not as many as the history holds."""
        found: list[tuple[str, str, int]] = []
        reader = self._reader(shard)
        if reader is None:
            return found
        try:
            after = None
            while True:
                records, after = reader.query(state=State.CLAIMED.value, limit=1000, after=after)
                found += [(r.id, r.endpoint, r.deliveries) for r in records]
                if after is None:
                    return found
        finally:
            reader.close()

    def copies_of(self, message_id: str) -> list[MessageRecord]:
        copies: list[MessageRecord] = []
        with self.open() as indexes:
            for index in indexes:
                copies.extend(index.get(message_id))
        return copies

    def replies_to(self, message_id: str, limit: int = 100) -> list[MessageRecord]:
        """Every copy of the messages answering ``message_id``, by id (any shard)."""
        found: list[MessageRecord] = []
        with self.open() as indexes:
            for index in indexes:
                found.extend(index.replies_to(message_id, limit))
        found.sort(key=lambda r: (r.id, r.endpoint))
        return found[:limit]

    def recent_publishes(self, since: int) -> list[tuple[str, int]]:
        """(sender, created_at) of each message published since ``since`` (ms), once
        each, however many endpoints it reached."""
        seen: dict[str, tuple[str, int]] = {}
        with self.open() as indexes:
            for index in indexes:
                for message_id, sender, created_at in index.recent_publishes(since):
                    seen[message_id] = (sender, created_at)
        return list(seen.values())

    def read_copy(self, record: MessageRecord) -> bytes:
        """The file of the copy an index row describes: opened where the row says
        (`place_of`: one open, no listing of cur/, which grows with history); if it moved
        since the row was written (an ack renames a file before its commit changes the
        row), looked for, which lists cur/ on that rare path only. Raises RelayError or
        OSError when it is nowhere."""
        subdir, name = place_of(
            record.state, record.id, record.claimed_at, record.finished_at, record.deliveries
        )
        try:
            return read_file(os.path.join(self.home.mailbox(record.endpoint), subdir, name))
        except FileNotFoundError:
            mailbox = Mailbox(self.home.mailbox(record.endpoint), record.endpoint)
            return mailbox.read(record.id)[1]

    def with_file(self, record: MessageRecord, wire_record: dict[str, Any]) -> dict[str, Any]:
        """``wire_record`` with the message's envelope, read from its file if it is there."""
        with contextlib.suppress(RelayError, OSError, ValueError):
            wire_record["envelope"] = json.loads(self.read_copy(record))
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
        "parentId": record.parent_id,
        "deliveries": record.deliveries,
    }
