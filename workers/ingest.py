"""Adopting files that another program dropped into a mailbox's ``new/``.

Maildir-native producers (a shell script, a program in any language) deliver by
writing a file in ``tmp/`` and renaming it into ``new/``. The writer notices it through
inotify (or a rescan) and adopts it:

- a complete Relay envelope named by its own id is indexed as it is;
- any other JSON object becomes the payload of a new envelope (or its ``payload``
  field does, when it has one), addressed to the endpoint, ``from`` the object's
  ``from`` when that is a valid subject and ``relay.external`` otherwise; the new file
  is delivered into ``new/`` and the original removed;
- anything else (not JSON, not an object) is dead-lettered with code ``malformed_file``.

The id of an adopted file is derived from its name and mtime, so a crash between
delivering the adopted copy and removing the original adopts it again under the same
id: no duplicate.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any

import apsw
from ulid import ULID

from sdk.errors import RelayError
from sdk.subjects import is_valid
from sdk.types import Budget, Envelope, default_budget
from workers.fsio import fsync_dir
from workers.maildir import Mailbox
from workers.records import MessageRecord, State
from workers.scan import read_record
from workers.sqlite import open_db

EXTERNAL_SENDER = "relay.external"


def adopted_id(endpoint: str, name: str, mtime_ms: int) -> str:
    digest = hashlib.sha256(f"{endpoint}/{name}".encode()).digest()[:10]
    return str(ULID.from_bytes(mtime_ms.to_bytes(6, "big") + digest))


def adopt(
    mailbox: Mailbox, name: str, subject: str | None, now_ms: int
) -> tuple[MessageRecord, bytes] | None:
    """Index (and if needed rewrite) new/<name>; None when it vanished meanwhile."""
    path = os.path.join(mailbox.new_dir, name)
    record = read_record(mailbox, "new", name)
    if record is not None:
        with open(path, "rb") as f:
            return record, f.read()
    with open(path, "rb") as f:
        data = f.read()
        mtime_ms = os.fstat(f.fileno()).st_mtime_ns // 1_000_000
    try:
        obj = json.loads(data)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or subject is None:
        why = "not a JSON object" if subject else "endpoint subject unknown"
        message_id = mailbox.quarantine(
            name, f"malformed message file: {why}", "malformed_file", now_ms
        )
        failed = read_record(mailbox, "failed", message_id)
        return (failed, b"") if failed is not None else None

    message_id = adopted_id(mailbox.endpoint, name, mtime_ms)
    if mailbox.find(message_id) is None:
        envelope = _normalize(obj, message_id, subject, now_ms)
        mailbox.deliver(message_id, envelope.to_json())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fsync_dir(mailbox.new_dir)
    record = read_record(mailbox, "new", message_id)
    if record is None or record.state is not State.NEW:
        return None
    with open(os.path.join(mailbox.new_dir, message_id), "rb") as f:
        return record, f.read()


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _json_object(data: bytes) -> dict[str, Any] | None:
    """The file as a JSON object, or None (not JSON, not an object, NaN/Infinity)."""
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _normalize(obj: dict[str, Any], message_id: str, subject: str, now_ms: int) -> Envelope:
    sender = obj.get("from")
    reply_to = obj.get("replyTo")
    created_at = obj.get("createdAt")
    budget = default_budget(now_ms)
    if isinstance(obj.get("budget"), dict):
        with contextlib.suppress(RelayError):
            budget = Budget.from_wire(obj["budget"])
    payload = obj.get("payload", obj)
    return Envelope(
        id=message_id,
        subject=subject,
        sender=sender if isinstance(sender, str) and is_valid(sender) else EXTERNAL_SENDER,
        reply_to=reply_to if isinstance(reply_to, str) and is_valid(reply_to) else None,
        budget=budget,
        created_at=created_at if isinstance(created_at, int) and created_at >= 0 else now_ms,
        payload=payload,
    )


def endpoint_subjects(control_db: os.PathLike[str] | str) -> dict[str, str]:
    """hash -> subject of every registered endpoint, read from the control plane."""
    if not os.path.exists(control_db):
        return {}
    conn = open_db(control_db, readonly=True)
    try:
        return {h: s for s, h in conn.execute("SELECT subject, hash FROM endpoints")}
    except apsw.Error:
        return {}
    finally:
        conn.close()
