"""Reading the Maildir back: one record (an index row) per message file, for the index
rebuild at writer start, ingest and ops (`iter_records`, `iter_rows`, `read_record`),
and the files that are not messages (`InvalidFile`)."""

from __future__ import annotations

import json
import json.scanner
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from sdk.errors import InvalidMessage
from sdk.ids import id_time_ms
from workers.filenames import FileName, deliveries_of, parse_name
from workers.fsio import OPEN_DIR, OPEN_READ, read_fd
from workers.records import MessageRecord, State

if TYPE_CHECKING:
    from workers.maildir import Mailbox

log = logging.getLogger("relay.maildir")


class ScanRow(NamedTuple):
    """One message file read back: its index row, with `MessageRecord`'s fields in the
    index's column order (workers/index_sql.py COLUMNS).

    A tuple rather than a record object so that the index rebuild binds it to SQL as
    it is; `MessageRecord(*row)` makes the record when one is wanted."""

    id: str
    endpoint: str
    subject: str
    sender: str
    state: State
    created_at: int
    stored_at: int
    claimed_at: int | None
    finished_at: int | None
    reason: str | None
    reason_code: str | None
    size: int
    parent_id: str | None
    deliveries: int


@dataclass(frozen=True)
class InvalidFile:
    """A file in a mailbox that is not a Relay message (bad name, not a JSON envelope)."""

    endpoint: str
    path: str
    reason: str


def log_invalid(bad: InvalidFile) -> None:
    log.warning("skipping %s in %s: %s", bad.path, bad.endpoint, bad.reason)


def _endpoints_under(mailboxes_root: str) -> list[str]:
    try:
        with os.scandir(mailboxes_root) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []


def iter_records(
    mailboxes_root: str | os.PathLike[str],
    endpoints: Iterable[str] | None = None,
    on_invalid: Callable[[InvalidFile], None] | None = log_invalid,
) -> Iterator[MessageRecord]:
    """One MessageRecord per message file of the given mailboxes (all when None).

    A file that is not a message (its name is not ``<id>[...]``, it is not a JSON
    object, its "id" is not its name, a field is missing or of the wrong type) is
    skipped and passed to ``on_invalid`` (default: logged); the writer dead-letters
    those in new/ with `Mailbox.quarantine`. tmp/ is not scanned. A file that moves
    while the scan runs may be seen in both places or in neither: scan a quiet
    mailbox (the writer scans at start, before it serves).
    """
    for row in iter_rows(mailboxes_root, endpoints, on_invalid):
        yield MessageRecord(*row)


def iter_rows(
    mailboxes_root: str | os.PathLike[str],
    endpoints: Iterable[str] | None = None,
    on_invalid: Callable[[InvalidFile], None] | None = log_invalid,
) -> Iterator[ScanRow]:
    """`iter_records` as `ScanRow` tuples (the index columns).

    Speed matters here (the index rebuild at every writer start; bench_storage
    "rebuild", goal >= 50,000 msg/s): no record objects, files opened relative to
    their directory's fd, one C-scanner call per JSON document. A ScanRow built by
    keyword costs about 0.9 µs a file more than a bare tuple (the scan alone: 114,000
    -> 104,000 files/s warm; about 5 % of a rebuild), the price of naming the fields.
    """
    root = os.fspath(mailboxes_root)
    for endpoint in _endpoints_under(root) if endpoints is None else endpoints:
        for subdir in ("new", "cur", "failed"):
            directory = f"{root}/{endpoint}/{subdir}"
            try:
                dir_fd = os.open(directory, OPEN_DIR)
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                for name in os.listdir(dir_fd):
                    try:
                        row = _row_of(endpoint, subdir, name, dir_fd)
                    except _Invalid as bad:
                        if on_invalid is not None:
                            on_invalid(InvalidFile(endpoint, f"{directory}/{name}", str(bad)))
                        continue
                    if row is not None:
                        yield row
            finally:
                os.close(dir_fd)


def read_record(mailbox: Mailbox, subdir: str, name: str) -> MessageRecord | None:
    """The record of one file, ``subdir`` being "new", "cur" or "failed"; None when the
    file is gone or is not a message (the same checks as `iter_records`)."""
    try:
        dir_fd = os.open(mailbox.dir_of(subdir), OPEN_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        row = _row_of(mailbox.endpoint, subdir, name, dir_fd)
    except _Invalid:
        return None
    finally:
        os.close(dir_fd)
    return None if row is None else MessageRecord(*row)


class _Invalid(Exception):
    pass


_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # the C scanner, no wrappers
_ID_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


def _decode_json(text: str) -> object:
    """json.loads for one document, minus its wrappers (≈ 1 µs a file in a rebuild)."""
    start = 0
    if text[:1].isspace():
        start = len(text) - len(text.lstrip())
    try:
        obj, end = _scan_json(text, start)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text) and not text[end:].isspace():
        raise ValueError("data after the JSON document")
    return obj


_S_IFMT, _S_IFREG = 0o170000, 0o100000


def _row_of(endpoint: str, subdir: str, name: str, dir_fd: int) -> ScanRow | None:
    if subdir != "cur" and _ID_RE.fullmatch(name):  # new/<id>, failed/<id>: the common case
        parsed = FileName(name)
    else:
        try:
            parsed = parse_name(name)
        except InvalidMessage as exc:
            raise _Invalid(exc.message) from None
    try:
        fd = os.open(name, OPEN_READ | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None  # moved while we listed: it will be seen where it went
    except OSError as exc:
        raise _Invalid(f"cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & _S_IFMT != _S_IFREG:
            raise _Invalid("not a regular file")
        data = read_fd(fd, st.st_size)
    finally:
        os.close(fd)
    try:
        obj = _decode_json(data.decode())
    except ValueError:  # UnicodeDecodeError included
        raise _Invalid("not a JSON text in UTF-8") from None
    if type(obj) is not dict:
        raise _Invalid("not a JSON object")
    message_id = parsed.id
    if obj.get("id") != message_id:
        raise _Invalid(f"its id {obj.get('id')!r:.40} is not its file name")
    subject = obj.get("subject")
    sender = obj.get("from")
    created_at = obj.get("createdAt")
    parent_id = obj.get("parentId")
    if parent_id is not None and (type(parent_id) is not str or not _ID_RE.fullmatch(parent_id)):
        parent_id = None  # the index keeps ids only; the file says what it says
    if subdir == "failed":
        dead = obj.get("deadLetter")
        if (
            type(dead) is not dict
            or type(dead.get("failedAt")) is not int
            or type(dead.get("reason")) is not str
            or type(dead.get("code")) is not str
        ):
            raise _Invalid("a file in failed/ without a valid deadLetter")
        # A quarantined file keeps only "raw": its envelope fields are unknown.
        return ScanRow(
            id=message_id,
            endpoint=endpoint,
            subject=subject if type(subject) is str else "",
            sender=sender if type(sender) is str else "",
            state=State.FAILED,
            created_at=created_at if type(created_at) is int else id_time_ms(message_id),
            stored_at=st.st_mtime_ns // 1_000_000,
            claimed_at=dead.get("claimedAt") if type(dead.get("claimedAt")) is int else None,
            finished_at=dead["failedAt"],
            reason=dead["reason"],
            reason_code=dead["code"],
            size=len(data),
            parent_id=parent_id,
            deliveries=deliveries_of(subdir, parsed, dead),
        )
    if type(subject) is not str or type(sender) is not str or type(created_at) is not int:
        raise _Invalid("subject, from or createdAt is missing or of the wrong type")
    if subdir == "new":
        state, claimed_at, done_at = State.NEW, None, None
    elif parsed.flags and "S" in parsed.flags:
        state, claimed_at, done_at = State.DONE, parsed.claimed_at, parsed.done_at
    else:
        state, claimed_at, done_at = State.CLAIMED, parsed.claimed_at, None
    return ScanRow(
        id=message_id,
        endpoint=endpoint,
        subject=subject,
        sender=sender,
        state=state,
        created_at=created_at,
        stored_at=st.st_mtime_ns // 1_000_000,
        claimed_at=claimed_at,
        finished_at=done_at,
        reason=None,
        reason_code=None,
        size=len(data),
        parent_id=parent_id,
        deliveries=deliveries_of(subdir, parsed),
    )
