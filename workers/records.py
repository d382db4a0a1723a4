"""What the storage side knows about one stored copy of a message.

A `MessageRecord` is one row of the index and, equally, what a scan of the Maildir
recovers from one file: the index is derived from the Maildir, so the two must agree
field for field (see docs/architecture.md, "File names and states").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    NEW = "new"
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class MessageRecord:
    id: str
    endpoint: str  # endpoint hash, or "_unroutable"
    subject: str  # the endpoint subject the copy was delivered to
    sender: str  # the envelope's "from"
    state: State
    created_at: int  # unix ms, from the envelope
    stored_at: int  # unix ms, the file's mtime
    claimed_at: int | None = None
    finished_at: int | None = None  # done or failed time
    reason: str | None = None  # dead-letter reason
    reason_code: str | None = None  # dead-letter code (hop_limit, no_match, nack, ...)
    size: int = 0  # file size in bytes
    parent_id: str | None = None  # the envelope's parentId: the message this one answers
    # Times the copy was handed to a consumer (workers.filenames.deliveries_of): 0 in
    # new/, the name's N= (else 1) in cur/, the deadLetter's count in failed/.
    deliveries: int = 0
