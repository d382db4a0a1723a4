"""The Maildir store: the only code that creates, moves or removes message files.

Layout and names are fixed by docs/architecture.md ("Files on disk"):

    mailboxes/<hash>/tmp/<id>.<pid>                      being written (ours)
    mailboxes/<hash>/new/<id>                            new
    mailboxes/<hash>/cur/<id>,C=<ms>:2,                  claimed
    mailboxes/<hash>/cur/<id>,C=<ms>,D=<ms>:2,S          done
    mailboxes/<hash>/failed/<id>                         dead letter (JSON + "deadLetter")

Every file is a JSON envelope named by its message id, mode 0600 in 0700 directories.
A file's mtime is its ``stored_at`` (ms); renames keep it, and `fail` copies it onto the
dead letter, so every field of the index can be recomputed from the files alone.

Order of writes, and what a crash between two steps leaves behind
=================================================================

"Crash" is a SIGKILL (tests/test_maildir_crash.py kills a child at each `fault_point`)
or a power cut. Nothing is acknowledged to anyone before the last step has returned.

Fault points are named in brackets after the step they follow.

deliver / deliver_failed (one message): write + fsync, rename, fsync the directory
    1. create ``tmp/<id>.<pid>`` (O_CREAT|O_EXCL, 0600), write  [maildir.after_tmp_write]
    2. fsync the file                                            [maildir.after_sync]
    3. rename it to ``new/<id>`` (or ``failed/<id>``)            [maildir.after_rename]
    4. fsync ``new/`` (``failed/``)
    - crash before 3: a complete or partial tmp file, nothing in new/. The publish was
      never acknowledged; `recover` deletes the tmp file.
    - crash between 3 and 4: the file in new/ is complete (its data was flushed in 2).
      A process crash leaves it visible; a power cut may undo the rename (back to the
      state before 3). Never a partial file. After a process crash the message is in
      new/ although its publisher saw no acknowledgement; a retry is a new publish
      with a new id.
    - after 4: durable; the caller may acknowledge.

deliver_batch (group commit): the same steps, each done for the whole batch
    1. write every tmp file, no fsync                            [maildir.after_tmp_write]
    2. one syncfs() per filesystem in the batch (fsync when a filesystem has a single
       file: same durability without flushing unrelated dirty data) [maildir.after_sync]
    3. rename each tmp file into its target dir                  [maildir.after_rename]
       (``cur/<id>,C=<stored_at>:2,`` for a copy stored claimed: a consumer with
       credit was waiting, so the copy skips new/ and the second commit a claim costs)
    4. fsync each distinct target dir once                       [maildir.after_dir_sync]
    Crash states are those of single delivery, for each file independently: some
    files may already be in new/ (or cur/) and others still in tmp/; none is
    acknowledged. A copy stored claimed that a crash leaves in cur/ was handed to no
    consumer; it is listed as pending (like a claim whose consumer died), and an
    operator requeues or completes it.
    A failure of one item (ENOSPC, EDQUOT, EIO, EACCES, its mailbox removed) makes that
    item a StorageError and removes its tmp file; the other items go on.

claim: one rename, then fsync of cur/ and new/ (unless ``sync=False``)
    rename ``new/<id>`` -> ``cur/<id>,C=<ms>:2,``               [maildir.claim.after_rename]
    The rename is atomic: a crash leaves the file in exactly one place. Of two
    concurrent claimers exactly one rename succeeds; the other gets ENOENT and then
    AlreadyClaimed. A power cut before the directory fsync may put the file back in
    new/; the message was not handed out before the fsync returned, so no consumer saw
    it (at most once holds).

complete: one rename inside cur/, then fsync of cur/
    ``cur/<id>,C=<c>:2,`` -> ``cur/<id>,C=<c>,D=<ms>:2,S``  [maildir.complete.after_rename]
    Atomic: claimed or done, never both.

requeue (an explicit request; Relay never redelivers on its own): one rename back
    ``cur/<id>,C=<c>:2,`` -> ``new/<id>``, fsync new/ and cur/ [maildir.requeue.after_rename]
    Atomic; a power cut before the fsyncs may leave it claimed, as if never requeued.

purge_failed (operator request): unlink each failed/<id>, then fsync failed/. A crash
    part-way leaves some dead letters; the request can be repeated.

fail (and quarantine): write the dead letter, then remove the original
    1. read the original from new/ or cur/ (claimed)
    2. write ``tmp/<id>.<pid>`` = envelope + "deadLetter", mtime copied from the
       original (before the fsync)                           [maildir.fail.after_tmp_write]
    3. rename to ``failed/<id>``, fsync failed/              [maildir.fail.after_failed_written]
    4. unlink the original                                   [maildir.fail.after_unlink]
       and fsync its directory
    - crash before 3: a stale tmp file (removed by `recover`); the message is unchanged.
    - crash between 3 and 4: the message is in failed/ AND in new/ or cur/. `recover`
      removes the non-failed copy: the failure was decided and is on disk.
    - after 4: failed only.

recover (at writer start, before anything else touches the mailbox)
    1. `sweep_tmp`: our own tmp files (``<id>.<pid>``) are all stale (their writer is
       dead); a foreign tmp file only after 36 h (Maildir convention: an external
       producer may be writing it right now).
    2. one state per message: where an id has several files, keep the most advanced
       (failed > done > claimed > new) and unlink the others. Only a crash inside
       `fail` (or a power cut undoing part of a rename on this non-journalled ext4)
       produces duplicates.

tmp files are created with O_EXCL, so two writes of one id never share a tmp file (a
duplicate inside one batch fails alone). rename(2) replaces an existing target: ids are
unique per copy (one id per message, one file per endpoint) and Relay never retries a
delivery by itself, so the router never sends a second copy of one id to one mailbox.

Deletes stay off the hot path (DESIGN.md: creating files where many were just deleted
costs ~1 ms each on this ext4): finished files stay in cur/ and failed/ until
compaction removes them in bulk.
"""

from __future__ import annotations

import errno
import json
import json.scanner
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, NoReturn

from sdk.errors import AlreadyClaimed, InvalidMessage, InvalidState, MessageNotFound, StorageError
from sdk.ids import check_id, id_time_ms, is_id, new_id
from workers.faults import fault_point
from workers.records import MessageRecord, State
from workers.syncfs import syncfs

log = logging.getLogger("relay.maildir")

DIR_MODE = 0o700
FILE_MODE = 0o600
SUBDIRS = ("tmp", "new", "cur", "failed")
FOREIGN_TMP_MAX_AGE_S = 36 * 3600  # the Maildir convention for abandoned tmp files

_OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC
_OPEN_READ = os.O_RDONLY | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

# Fault points, in the order the operations reach them (see the module docstring).
AFTER_TMP_WRITE = "maildir.after_tmp_write"
AFTER_SYNC = "maildir.after_sync"
AFTER_RENAME = "maildir.after_rename"
AFTER_DIR_SYNC = "maildir.after_dir_sync"
CLAIM_AFTER_RENAME = "maildir.claim.after_rename"
COMPLETE_AFTER_RENAME = "maildir.complete.after_rename"
REQUEUE_AFTER_RENAME = "maildir.requeue.after_rename"
FAIL_AFTER_TMP_WRITE = "maildir.fail.after_tmp_write"
FAIL_AFTER_FAILED_WRITTEN = "maildir.fail.after_failed_written"
FAIL_AFTER_UNLINK = "maildir.fail.after_unlink"
FAULT_POINTS = (
    AFTER_TMP_WRITE,
    AFTER_SYNC,
    AFTER_RENAME,
    AFTER_DIR_SYNC,
    CLAIM_AFTER_RENAME,
    COMPLETE_AFTER_RENAME,
    REQUEUE_AFTER_RENAME,
    FAIL_AFTER_TMP_WRITE,
    FAIL_AFTER_FAILED_WRITTEN,
    FAIL_AFTER_UNLINK,
)

Target = Literal["new", "cur", "failed"]  # cur: stored already claimed (deliver_batch)


# --------------------------------------------------------------------------- file names


class FileName(NamedTuple):
    """A parsed message file name. ``flags`` is None when the name has no ``:2,`` part."""

    id: str
    claimed_at: int | None = None
    done_at: int | None = None
    flags: str | None = None


_FIELD_RE = re.compile(r"^([A-Za-z]+)=(\d+)$")


def parse_name(name: str) -> FileName:
    """Split ``<id>[,K=V...][:2,<flags>]`` into its parts; InvalidMessage if it is not one.

    Fields other than C= (claimed ms) and D= (done ms) are kept out of the result but
    accepted, so a Dovecot-style ``,S=<size>`` written by another tool does not hide a file.
    """
    if len(name) == 26:  # the common case, new/<id> and failed/<id>
        if is_id(name):
            return FileName(name)
        raise InvalidMessage(f"file name {name!r} is not a message id")
    base, sep, flags = name.partition(":2,")
    if not sep and ":" in name:
        raise InvalidMessage(f"file name {name!r} has an unknown info part")
    message_id, *fields = base.split(",")
    if not is_id(message_id):
        raise InvalidMessage(f"file name {name!r} does not start with a message id")
    claimed_at = done_at = None
    for field in fields:
        match = _FIELD_RE.match(field)
        if match is None:
            raise InvalidMessage(f"file name {name!r} has a malformed field {field!r}")
        key, value = match.group(1), int(match.group(2))
        if key == "C":
            claimed_at = value
        elif key == "D":
            done_at = value
    return FileName(message_id, claimed_at, done_at, flags if sep else None)


def format_name(
    message_id: str,
    claimed_at: int | None = None,
    done_at: int | None = None,
    flags: str | None = None,
) -> str:
    """The inverse of `parse_name` (for the fields Relay writes)."""
    name = message_id
    if claimed_at is not None:
        name += f",C={claimed_at}"
    if done_at is not None:
        name += f",D={done_at}"
    if flags is not None:
        name += ":2," + flags
    return name


def _state_of(subdir: str, parsed: FileName) -> State:
    if subdir == "new":
        return State.NEW
    if subdir == "failed":
        return State.FAILED
    return State.DONE if parsed.flags and "S" in parsed.flags else State.CLAIMED


_OWN_TMP_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}\.\d+$")

# Precedence when one id has several files (a crash inside fail, or a power cut that
# undid half a rename): keep the most advanced state.
_RANK = {State.NEW: 0, State.CLAIMED: 1, State.DONE: 2, State.FAILED: 3}


# --------------------------------------------------------------------------- low-level


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_fd(fd: int, size: int) -> bytes:
    """Read a regular file to its end; ``size`` (from fstat) is a hint, not a limit."""
    want = size + 1  # one byte more than expected: a short read is the end of the file
    chunk = os.read(fd, want)
    if len(chunk) < want:
        return chunk
    chunks = [chunk]
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_file(path: str) -> bytes:
    fd = os.open(path, _OPEN_READ)
    try:
        return _read_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, making the renames and unlinks done inside it durable."""
    fd = os.open(path, _OPEN_DIR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dirs(paths: Iterable[str | os.PathLike[str]]) -> None:
    """fsync each distinct directory once (for callers batching ``sync=False`` moves)."""
    for path in dict.fromkeys(os.fspath(p) for p in paths):
        fsync_dir(path)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("could not remove %s: %s", path, exc)


def _storage_error(action: str, exc: OSError) -> StorageError:
    code = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
    return StorageError(f"{action}: {exc.strerror or exc} ({code})")


def _ms(st: os.stat_result) -> int:
    return st.st_mtime_ns // 1_000_000


# --------------------------------------------------------------------------- the mailbox


@dataclass(frozen=True)
class Recovery:
    """What `Mailbox.recover` repaired."""

    tmp_removed: int = 0
    duplicates_removed: int = 0


class Mailbox:
    """One endpoint's Maildir: ``root`` is ``mailboxes/<hash>``, ``endpoint`` its hash.

    One writer owns each mailbox (DESIGN.md invariant 1), so the names of the files it
    claimed are remembered here to complete or fail them without listing cur/; a miss
    (after a restart, or a file moved by hand) falls back to a scan of cur/.
    """

    def __init__(self, root: str | os.PathLike[str], endpoint: str | None = None) -> None:
        self.root = Path(root)
        self.endpoint = endpoint if endpoint is not None else self.root.name
        base = os.fspath(root)
        self.tmp_dir = f"{base}/tmp"
        self.new_dir = f"{base}/new"
        self.cur_dir = f"{base}/cur"
        self.failed_dir = f"{base}/failed"
        self._claimed: dict[str, str] = {}  # id -> its name in cur/, for claims made here

    @classmethod
    def at(cls, mailboxes_root: str | os.PathLike[str], endpoint: str) -> Mailbox:
        return cls(Path(mailboxes_root) / endpoint, endpoint)

    def __repr__(self) -> str:
        return f"Mailbox({os.fspath(self.root)!r}, {self.endpoint!r})"

    def dir_of(self, state: State | str) -> str:
        return {
            "new": self.new_dir,
            "claimed": self.cur_dir,
            "done": self.cur_dir,
            "cur": self.cur_dir,
            "failed": self.failed_dir,
            "tmp": self.tmp_dir,
        }[str(state)]

    # ----------------------------------------------------------------- create

    def create(self) -> None:
        """Make root and tmp/new/cur/failed (0700); idempotent; fsyncs what it created."""
        created = []
        for path in (os.fspath(self.root), *(self.dir_of(d) for d in SUBDIRS)):
            try:
                os.makedirs(path, mode=DIR_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise _storage_error(f"create mailbox {self.endpoint}", exc) from exc
            os.chmod(path, DIR_MODE)  # exact mode whatever the umask
            created.append(path)
        if created:
            try:
                fsync_dirs([os.fspath(self.root), os.fspath(self.root.parent)])
            except OSError as exc:
                raise _storage_error(f"create mailbox {self.endpoint}", exc) from exc

    def exists(self) -> bool:
        return all(os.path.isdir(self.dir_of(d)) for d in SUBDIRS)

    # ----------------------------------------------------------------- deliver

    def deliver(self, message_id: str, data: bytes) -> int:
        """Store one message in new/; returns stored_at (file mtime, ms). See docstring."""
        return self._store(check_id(message_id), data, self.new_dir, "deliver")

    def deliver_failed(self, message_id: str, data: bytes) -> int:
        """Store a dead letter whose JSON (with "deadLetter") the caller built."""
        return self._store(check_id(message_id), data, self.failed_dir, "dead-letter")

    def _store(
        self,
        message_id: str,
        data: bytes,
        target_dir: str,
        action: str,
        *,
        mtime_ns: int | None = None,
        faults: tuple[str, str, str] = (AFTER_TMP_WRITE, AFTER_SYNC, AFTER_RENAME),
    ) -> int:
        tmp_fault, sync_fault, rename_fault = faults
        what = f"{action} {message_id} to {self.endpoint}"
        tmp = f"{self.tmp_dir}/{message_id}.{os.getpid()}"
        target = f"{target_dir}/{message_id}"
        try:
            fd = os.open(tmp, _OPEN_NEW, FILE_MODE)
        except OSError as exc:
            raise _storage_error(what, exc) from exc
        try:
            try:
                _write_all(fd, data)
                if mtime_ns is not None:
                    os.utime(fd, ns=(mtime_ns, mtime_ns))
                stored_at = _ms(os.fstat(fd))
                fault_point(tmp_fault)
                os.fsync(fd)
            finally:
                os.close(fd)
            fault_point(sync_fault)
            os.rename(tmp, target)
        except OSError as exc:
            _unlink_quiet(tmp)
            raise _storage_error(what, exc) from exc
        fault_point(rename_fault)
        try:
            fsync_dir(target_dir)
        except OSError as exc:
            _unlink_quiet(target)  # not durable: take it back rather than half-deliver
            raise _storage_error(what, exc) from exc
        return stored_at

    # ----------------------------------------------------------------- claim / complete

    def claim(self, message_id: str, now_ms: int, *, sync: bool = True) -> tuple[str, bytes]:
        """Move new/<id> to cur/<id>,C=<now_ms>:2, and return (new name, content).

        AlreadyClaimed when the file left new/ already (it is in cur/ or failed/),
        MessageNotFound when the id is nowhere. With ``sync=False`` the caller must
        fsync cur/ before handing the message out (the writer does so once per group
        commit); new/ need not be: if a power cut leaves the file in both, `recover`
        keeps the claimed copy.
        """
        name = format_name(check_id(message_id), claimed_at=now_ms, flags="")
        source, target = f"{self.new_dir}/{message_id}", f"{self.cur_dir}/{name}"
        try:
            os.rename(source, target)
        except FileNotFoundError:
            if self._find_cur(message_id) is not None or os.path.exists(
                f"{self.failed_dir}/{message_id}"
            ):
                raise AlreadyClaimed(
                    f"message {message_id} in {self.endpoint} was claimed already"
                ) from None
            raise MessageNotFound(f"no message {message_id} in {self.endpoint}") from None
        except OSError as exc:
            raise _storage_error(f"claim {message_id} in {self.endpoint}", exc) from exc
        fault_point(CLAIM_AFTER_RENAME)
        try:
            data = _read_file(target)
            if sync:
                fsync_dir(self.cur_dir)
                fsync_dir(self.new_dir)
        except OSError as exc:
            # Not handed out: put it back rather than strand it as pending in cur/.
            try:
                os.rename(target, source)
            except OSError:
                self._claimed[message_id] = name
            raise _storage_error(f"claim {message_id} in {self.endpoint}", exc) from exc
        self._claimed[message_id] = name
        return name, data

    def complete(self, message_id: str, now_ms: int, *, sync: bool = True) -> str:
        """Mark a claimed message done: cur/<id>,C=..:2, -> cur/<id>,C=..,D=<now_ms>:2,S.

        InvalidState when it is not claimed (new, done or failed), MessageNotFound when
        the id is nowhere. Returns the new name.
        """
        name = self._find_cur(check_id(message_id))
        if name is None:
            self._raise_not_in_cur(message_id, "complete")
        parsed = parse_name(name)
        if parsed.flags and "S" in parsed.flags:
            raise InvalidState(f"message {message_id} in {self.endpoint} is already done")
        flags = "".join(sorted(set(parsed.flags or "") | {"S"}))
        done = format_name(message_id, parsed.claimed_at, now_ms, flags)
        try:
            os.rename(f"{self.cur_dir}/{name}", f"{self.cur_dir}/{done}")
            fault_point(COMPLETE_AFTER_RENAME)
            self._claimed.pop(message_id, None)
            if sync:
                fsync_dir(self.cur_dir)
        except OSError as exc:
            raise _storage_error(f"complete {message_id} in {self.endpoint}", exc) from exc
        return done

    def requeue(self, message_id: str, *, sync: bool = True) -> None:
        """Put a claimed (not done) message back in new/ for another claim.

        InvalidState when it is not claimed, MessageNotFound when the id is nowhere.
        """
        name = self._find_cur(check_id(message_id))
        if name is None:
            self._raise_not_in_cur(message_id, "requeue")
        parsed = parse_name(name)
        if parsed.flags and "S" in parsed.flags:
            raise InvalidState(f"cannot requeue {message_id} in {self.endpoint}: it is done")
        try:
            os.rename(f"{self.cur_dir}/{name}", f"{self.new_dir}/{message_id}")
            fault_point(REQUEUE_AFTER_RENAME)
            self._claimed.pop(message_id, None)
            if sync:
                fsync_dir(self.new_dir)
                fsync_dir(self.cur_dir)
        except OSError as exc:
            raise _storage_error(f"requeue {message_id} in {self.endpoint}", exc) from exc

    def _raise_not_in_cur(self, message_id: str, action: str) -> NoReturn:
        if os.path.exists(f"{self.new_dir}/{message_id}"):
            raise InvalidState(f"cannot {action} {message_id} in {self.endpoint}: not claimed")
        if os.path.exists(f"{self.failed_dir}/{message_id}"):
            raise InvalidState(f"cannot {action} {message_id} in {self.endpoint}: it failed")
        raise MessageNotFound(f"no message {message_id} in {self.endpoint}")

    def _find_cur(self, message_id: str) -> str | None:
        """The name of the id's file in cur/ (done preferred over claimed), or None."""
        name = self._claimed.get(message_id)
        if name is not None:
            if os.path.exists(f"{self.cur_dir}/{name}"):
                return name
            del self._claimed[message_id]
        try:
            names = [
                found
                for found in os.listdir(self.cur_dir)
                if found.startswith(message_id) and found[26:27] in (",", ":")
            ]
        except FileNotFoundError:
            return None
        best = None
        for found in names:
            try:
                rank = _RANK[_state_of("cur", parse_name(found))]
            except InvalidMessage:
                continue
            if best is None or rank > best[0]:
                best = (rank, found)
        return best[1] if best else None

    # ----------------------------------------------------------------- fail

    def fail(self, message_id: str, reason: str, code: str, now_ms: int) -> int:
        """Dead-letter a new or claimed message: failed/<id> = envelope + "deadLetter".

        Returns the dead letter's size in bytes (the index row's new size). Its mtime,
        hence stored_at, is the original's. InvalidState if the message is done or
        failed already, MessageNotFound if the id is nowhere.
        """
        if os.path.exists(f"{self.new_dir}/{check_id(message_id)}"):
            source_dir, name = self.new_dir, message_id
        else:
            name = self._find_cur(message_id)
            if name is None:
                self._raise_not_in_cur(message_id, "fail")
            parsed = parse_name(name)
            if parsed.flags and "S" in parsed.flags:
                raise InvalidState(f"cannot fail {message_id} in {self.endpoint}: it is done")
            source_dir = self.cur_dir
        size = self._move_to_failed(
            source_dir, name, message_id, reason, code, now_ms, keep_envelope=True
        )
        self._claimed.pop(message_id, None)
        return size

    def quarantine(self, name: str, reason: str, code: str, now_ms: int) -> str:
        """Dead-letter a file in new/ that is not a valid envelope (see `iter_records`).

        The dead letter is ``{"id", "raw", "originalName", "deadLetter"}`` with the
        original bytes as text in "raw". Its id is the file name when that is a free
        message id, else a new one. Returns the id.
        """
        message_id = name
        if not is_id(name) or os.path.exists(f"{self.failed_dir}/{name}"):
            message_id = new_id(now_ms)
        self._move_to_failed(
            self.new_dir, name, message_id, reason, code, now_ms, keep_envelope=False
        )
        return message_id

    def _move_to_failed(
        self,
        source_dir: str,
        name: str,
        message_id: str,
        reason: str,
        code: str,
        now_ms: int,
        *,
        keep_envelope: bool,
    ) -> int:
        source = f"{source_dir}/{name}"
        what = f"fail {message_id} in {self.endpoint}"
        try:
            fd = os.open(source, _OPEN_READ)
            try:
                st = os.fstat(fd)
                raw = _read_fd(fd, st.st_size)
            finally:
                os.close(fd)
        except FileNotFoundError:
            raise MessageNotFound(f"no message {message_id} in {self.endpoint}") from None
        except OSError as exc:
            raise _storage_error(what, exc) from exc
        dead_letter = {
            "reason": reason,
            "code": code,
            "failedAt": now_ms,
            "endpoint": self.endpoint,
        }
        envelope = None
        if keep_envelope:
            try:
                envelope = json.loads(raw)
            except ValueError:
                envelope = None
        if isinstance(envelope, dict):
            envelope["deadLetter"] = dead_letter
        else:
            envelope = {
                "id": message_id,
                "raw": raw.decode("utf-8", "replace"),
                "originalName": name,
                "deadLetter": dead_letter,
            }
        data = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()
        self._store(
            message_id,
            data,
            self.failed_dir,
            "fail",
            mtime_ns=st.st_mtime_ns,
            faults=(FAIL_AFTER_TMP_WRITE, "", ""),
        )
        fault_point(FAIL_AFTER_FAILED_WRITTEN)
        try:
            os.unlink(source)
            fault_point(FAIL_AFTER_UNLINK)
            fsync_dir(source_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            # failed/<id> is durable; recover() drops the original at the next start.
            log.warning("%s: could not remove the original %s: %s", what, source, exc)
        return len(data)

    def purge_failed(self) -> list[str]:
        """Delete every dead letter of this mailbox; returns the ids removed.

        An operator's request, off the hot path (deletes are slow to recover from on this
        ext4, see the module docstring). Files in failed/ whose name is not a message id
        are left for a person to look at.
        """
        try:
            names = os.listdir(self.failed_dir)
        except FileNotFoundError:
            return []
        removed = []
        for name in sorted(names):
            if len(name) != 26 or not is_id(name):
                continue
            try:
                os.unlink(f"{self.failed_dir}/{name}")
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _storage_error(f"purge {name} in {self.endpoint}", exc) from exc
            removed.append(name)
        if removed:
            try:
                fsync_dir(self.failed_dir)
            except OSError as exc:
                raise _storage_error(f"purge dead letters of {self.endpoint}", exc) from exc
        return removed

    # ----------------------------------------------------------------- read

    def list_new(self) -> list[str]:
        """Ids in new/, oldest first (ULIDs sort in time order). Foreign names are left
        out; `iter_records` reports them."""
        try:
            names = os.listdir(self.new_dir)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if len(n) == 26 and is_id(n))

    def find(self, message_id: str) -> tuple[State, Path] | None:
        """Where the message is now, or None. Failed wins over a leftover copy."""
        if os.path.exists(f"{self.failed_dir}/{check_id(message_id)}"):
            return State.FAILED, Path(self.failed_dir, message_id)
        if os.path.exists(f"{self.new_dir}/{message_id}"):
            return State.NEW, Path(self.new_dir, message_id)
        name = self._find_cur(message_id)
        if name is None:
            return None
        return _state_of("cur", parse_name(name)), Path(self.cur_dir, name)

    def read(self, message_id: str) -> tuple[State, bytes]:
        """The message's state and file content, in any state; MessageNotFound if none."""
        check_id(message_id)
        for _ in range(3):  # the file may move between find and open; look again
            found = self.find(message_id)
            if found is None:
                break
            try:
                return found[0], _read_file(os.fspath(found[1]))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _storage_error(f"read {message_id} in {self.endpoint}", exc) from exc
        raise MessageNotFound(f"no message {message_id} in {self.endpoint}")

    # ----------------------------------------------------------------- recovery

    def sweep_tmp(
        self,
        own_older_than_s: float = 0,
        foreign_older_than_s: float = FOREIGN_TMP_MAX_AGE_S,
        now: float | None = None,
    ) -> int:
        """Remove stale files from tmp/; returns how many.

        Own files (``<id>.<pid>``, written by a Relay writer) older than
        ``own_older_than_s`` go: at start every one is stale, since the writer that made
        it is dead (0, the default). Any other file is an external producer's and is
        removed only past ``foreign_older_than_s`` (36 h), as Maildir readers do.
        ``now`` is unix seconds (default: the clock).
        """
        now = time.time() if now is None else now
        removed = 0
        try:
            entries = list(os.scandir(self.tmp_dir))
        except FileNotFoundError:
            return 0
        for entry in entries:
            limit = own_older_than_s if _OWN_TMP_RE.match(entry.name) else foreign_older_than_s
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if age >= limit:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        continue  # not ours to judge
                    os.unlink(entry.path)
                    removed += 1
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    log.warning("could not remove stale %s: %s", entry.path, exc)
        return removed

    def recover(self, now: float | None = None) -> Recovery:
        """Repair what a crash left (module docstring): stale tmp files, duplicate states."""
        tmp_removed = self.sweep_tmp(own_older_than_s=0, now=now)
        copies: dict[str, list[tuple[int, str, str]]] = {}  # id -> [(rank, dir, name)]
        for subdir, directory in (
            ("new", self.new_dir),
            ("cur", self.cur_dir),
            ("failed", self.failed_dir),
        ):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            for name in names:
                try:
                    parsed = parse_name(name)
                except InvalidMessage:
                    continue
                rank = _RANK[_state_of(subdir, parsed)]
                copies.setdefault(parsed.id, []).append((rank, directory, name))
        removed = 0
        touched = set()
        for found in copies.values():
            if len(found) < 2:
                continue
            found.sort(reverse=True)
            for _, directory, name in found[1:]:
                _unlink_quiet(f"{directory}/{name}")
                touched.add(directory)
                removed += 1
        if touched:
            fsync_dirs(touched)
        self._claimed.clear()
        if tmp_removed or removed:
            log.info(
                "recovered %s: %d stale tmp files, %d duplicate copies removed",
                self.endpoint,
                tmp_removed,
                removed,
            )
        return Recovery(tmp_removed, removed)


# --------------------------------------------------------------------------- group commit


def deliver_batch(
    items: Sequence[tuple[Mailbox, str, bytes, Target]],
) -> list[int | StorageError | InvalidMessage]:
    """Store many messages with one flush: per item its stored_at (ms) or the error
    (StorageError; InvalidMessage for an id that is not a ULID).

    Why syncfs (DESIGN.md, "The disk, measured"): fsyncing 100 files one by one does not
    merge the flushes (≈ 5,900 msg/s, the same as one at a time) while one syncfs for
    the batch does (≈ 16,000 msg/s raw). The renames are made durable by one fsync per
    target directory (a rename is durable only once its directory is fsynced, ≈ 110 µs
    each), or by a second syncfs when the batch touches more than `_DIRS_PER_SYNCFS`
    directories. bench/bench_storage.py ("maildir batch delivery") guards these figures.

    One item's failure (ENOSPC, EDQUOT, EIO, EACCES, a removed mailbox) does not fail
    the others, and leaves no tmp file behind.
    """
    results: list[int | StorageError | InvalidMessage | None] = [None] * len(items)
    pid = os.getpid()
    # index -> (mailbox, id, tmp path, target dir, stored_at, st_dev)
    written: list[tuple[int, Mailbox, str, str, str, int, int]] = []
    flush_fd: dict[int, int] = {}  # st_dev -> an open fd on it (the first file written)
    on_dev: dict[int, int] = {}  # st_dev -> how many files

    for _, _, _, target in items:
        if target not in ("new", "cur", "failed"):
            raise ValueError(f"target must be 'new', 'cur' or 'failed', got {target!r}")

    for i, (mailbox, message_id, data, target) in enumerate(items):
        target_dir = mailbox.dir_of(target)
        if not is_id(message_id):  # never a path: it becomes one
            results[i] = InvalidMessage(f"message id {message_id!r:.40} is not a ULID")
            continue
        tmp = f"{mailbox.tmp_dir}/{message_id}.{pid}"
        try:
            fd = os.open(tmp, _OPEN_NEW, FILE_MODE)
        except OSError as exc:
            results[i] = _delivery_error(mailbox, message_id, exc)
            continue
        keep = False
        try:
            _write_all(fd, data)
            st = os.fstat(fd)
            dev = st.st_dev
            on_dev[dev] = on_dev.get(dev, 0) + 1
            if dev not in flush_fd:
                flush_fd[dev] = fd
                keep = True
        except OSError as exc:
            _unlink_quiet(tmp)
            results[i] = _delivery_error(mailbox, message_id, exc)
            continue
        finally:
            if not keep:
                os.close(fd)
        written.append((i, mailbox, message_id, tmp, target_dir, _ms(st), dev))
    fault_point(AFTER_TMP_WRITE)

    failed_dev: dict[int, OSError] = {}
    for dev, fd in flush_fd.items():
        try:
            # One file on this filesystem: fsync it alone rather than flush everything
            # else that happens to be dirty there (the index WAL, other programs).
            if on_dev[dev] == 1:
                os.fsync(fd)
            else:
                syncfs(fd)
        except OSError as exc:
            failed_dev[dev] = exc
        finally:
            os.close(fd)
    fault_point(AFTER_SYNC)

    renamed = []  # (index, mailbox, id, target dir, name in it, stored_at, st_dev)
    for i, mailbox, message_id, tmp, target_dir, stored_at, dev in written:
        if dev in failed_dev:
            _unlink_quiet(tmp)
            results[i] = _delivery_error(mailbox, message_id, failed_dev[dev])
            continue
        name = message_id
        if target_dir == mailbox.cur_dir:  # stored claimed, at the time it was stored
            name = format_name(message_id, claimed_at=stored_at, flags="")
        try:
            os.rename(tmp, f"{target_dir}/{name}")
        except OSError as exc:
            _unlink_quiet(tmp)
            results[i] = _delivery_error(mailbox, message_id, exc)
            continue
        renamed.append((i, mailbox, message_id, target_dir, name, stored_at, dev))
    fault_point(AFTER_RENAME)

    dir_error = _sync_dirs({entry[3]: entry[6] for entry in renamed})
    fault_point(AFTER_DIR_SYNC)

    for i, mailbox, message_id, target_dir, name, stored_at, _ in renamed:
        exc = dir_error[target_dir]
        if exc is None:
            results[i] = stored_at
            if name != message_id:
                mailbox._claimed[message_id] = name
        else:
            _unlink_quiet(f"{target_dir}/{name}")  # not durable: take it back
            results[i] = _delivery_error(mailbox, message_id, exc)
    return results  # type: ignore[return-value]


def _delivery_error(mailbox: Mailbox, message_id: str, exc: OSError) -> StorageError:
    # Built only on failure: deliver_batch's loops run once per message.
    return _storage_error(f"deliver {message_id} to {mailbox.endpoint}", exc)


# Above this many directories on one filesystem, one syncfs makes the renames durable
# for less than a directory fsync each (bench_broker "publish, 100 in flight, 8
# endpoints": a batch touching 4 mailboxes spent as long in 4 dir fsyncs as in syncfs).
_DIRS_PER_SYNCFS = 2


def _sync_dirs(dirs: dict[str, int]) -> dict[str, OSError | None]:
    """Make the renames into each directory durable: {dir: error or None}.

    ``dirs`` maps each directory to its filesystem (st_dev).
    """
    errors: dict[str, OSError | None] = {}
    by_dev: dict[int, list[str]] = {}
    for directory, dev in dirs.items():
        by_dev.setdefault(dev, []).append(directory)
    for directories in by_dev.values():
        if len(directories) > _DIRS_PER_SYNCFS:
            try:
                fd = os.open(directories[0], _OPEN_DIR)
                try:
                    syncfs(fd)
                finally:
                    os.close(fd)
                errors.update(dict.fromkeys(directories))
                continue
            except OSError:
                pass  # fall back to one fsync per directory, which names the culprit
        for directory in directories:
            try:
                fsync_dir(directory)
                errors[directory] = None
            except OSError as exc:
                errors[directory] = exc
    return errors


# --------------------------------------------------------------------------- scan


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
) -> Iterator[tuple]:
    """`iter_records` as plain tuples in MessageRecord field order (the index columns).

    Speed matters here (the index rebuild at every writer start; bench_storage
    "rebuild", goal >= 50,000 msg/s): no record objects, files opened relative to
    their directory's fd, one C-scanner call per JSON document.
    """
    root = os.fspath(mailboxes_root)
    for endpoint in _endpoints_under(root) if endpoints is None else endpoints:
        for subdir in ("new", "cur", "failed"):
            directory = f"{root}/{endpoint}/{subdir}"
            try:
                dir_fd = os.open(directory, _OPEN_DIR)
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
        dir_fd = os.open(mailbox.dir_of(subdir), _OPEN_DIR)
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


def _row_of(endpoint: str, subdir: str, name: str, dir_fd: int) -> tuple | None:
    if subdir != "cur" and _ID_RE.fullmatch(name):  # new/<id>, failed/<id>: the common case
        parsed = FileName(name)
    else:
        try:
            parsed = parse_name(name)
        except InvalidMessage as exc:
            raise _Invalid(exc.message) from None
    try:
        fd = os.open(name, _OPEN_READ | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None  # moved while we listed: it will be seen where it went
    except OSError as exc:
        raise _Invalid(f"cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & _S_IFMT != _S_IFREG:
            raise _Invalid("not a regular file")
        data = _read_fd(fd, st.st_size)
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
        return (
            message_id,
            endpoint,
            subject if type(subject) is str else "",
            sender if type(sender) is str else "",
            State.FAILED,
            created_at if type(created_at) is int else id_time_ms(message_id),
            st.st_mtime_ns // 1_000_000,
            None,
            dead["failedAt"],
            dead["reason"],
            dead["code"],
            len(data),
        )
    if type(subject) is not str or type(sender) is not str or type(created_at) is not int:
        raise _Invalid("subject, from or createdAt is missing or of the wrong type")
    if subdir == "new":
        state, claimed_at, done_at = State.NEW, None, None
    elif parsed.flags and "S" in parsed.flags:
        state, claimed_at, done_at = State.DONE, parsed.claimed_at, parsed.done_at
    else:
        state, claimed_at, done_at = State.CLAIMED, parsed.claimed_at, None
    return (
        message_id,
        endpoint,
        subject,
        sender,
        state,
        created_at,
        st.st_mtime_ns // 1_000_000,
        claimed_at,
        done_at,
        None,
        None,
        len(data),
    )
