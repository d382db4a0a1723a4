"""The Maildir store: `Mailbox`, one endpoint's mailbox. With the modules named below it
is the only code that creates, moves or removes message files.

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

Fault points are named in brackets after the step they follow (workers/faults.py).

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

claim: one rename, then fsync of cur/ and new/ (unless ``sync=False``)
    rename ``new/<id>`` -> ``cur/<id>,C=<ms>:2,``               [maildir.claim.after_rename]
    The rename is atomic: a crash leaves the file in exactly one place. Of two
    concurrent claimers exactly one rename succeeds; the other gets ENOENT and then
    AlreadyClaimed. A power cut before the directory fsync may put the file back in
    new/; the message was not handed out before the fsync returned, so no consumer saw
    it (at most once holds).

reclaim (a message returned by a consumer that died, claimed again): one rename
    inside cur/, ``cur/<id>,C=<c>[,N=<k>]:2,`` -> ``cur/<id>,C=<now>,N=<k+1>:2,``
    [maildir.reclaim.after_rename]. Atomic; the writer fsyncs cur/ before the message
    is handed out, so a power cut before that leaves the older count, and no consumer
    saw the newer one.

complete: one rename inside cur/, then fsync of cur/
    ``cur/<id>,C=<c>:2,`` -> ``cur/<id>,C=<c>,D=<ms>:2,S``  [maildir.complete.after_rename]
    Atomic: claimed or done, never both.

requeue (an operator's, or a claim nobody received): one rename back
    ``cur/<id>,C=<c>:2,`` -> ``new/<id>``, fsync new/ and cur/ [maildir.requeue.after_rename]
    Atomic; a power cut before the fsyncs may leave it claimed, as if never requeued.

The dead letters (fail, quarantine, redrive, purge_failed), the group commit
(deliver_batch) and recovery at start (recover, sweep_tmp) state theirs the same way in
workers/dead_letters.py, workers/group_commit.py and workers/recovery.py; the file names
are workers/filenames.py, the low-level I/O workers/fsio.py, the scan back into index
rows workers/scan.py.

tmp files are created with O_EXCL, so two writes of one id never share a tmp file (a
duplicate inside one batch fails alone). rename(2) replaces an existing target: ids are
unique per copy (one id per message, one file per endpoint) and Relay never retries a
delivery by itself, so the router never sends a second copy of one id to one mailbox.

Deletes stay off the hot path (docs/design.md, "The disk, measured": creating files
where many were just deleted costs ~1 ms each on this ext4): finished files stay in cur/
and failed/ until compaction removes them in bulk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

from sdk.errors import AlreadyClaimed, InvalidMessage, InvalidState, MessageNotFound
from sdk.ids import check_id, is_id
from workers import dead_letters, recovery
from workers.faults import (
    CLAIM_AFTER_RENAME,
    COMPLETE_AFTER_RENAME,
    DELIVER_FAULTS,
    RECLAIM_AFTER_RENAME,
    REQUEUE_AFTER_RENAME,
    fault_point,
)
from workers.filenames import STATE_RANK, deliveries_of, format_name, parse_name, state_of
from workers.fsio import DIR_MODE, fsync_dir, fsync_dirs, read_file, storage_error, store_file
from workers.mailbox_paths import MailboxPaths
from workers.records import State
from workers.recovery import FOREIGN_TMP_MAX_AGE_S, Recovery

SUBDIRS = ("tmp", "new", "cur", "failed")


class Mailbox:
    """One endpoint's Maildir: ``root`` is ``mailboxes/<hash>``, ``endpoint`` its hash.

    One writer owns each mailbox (docs/design.md invariant 1), so the names of the files it
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
        # What the dead letters and recovery need (workers/mailbox_paths.py).
        self.paths = MailboxPaths(
            self.endpoint, self.tmp_dir, self.new_dir, self.cur_dir, self.failed_dir
        )
        self._claimed: dict[str, str] = {}  # id -> its name in cur/, for claims made here
        self._dirs = {  # `dir_of`, once per mailbox rather than once per file
            "new": self.new_dir,
            "claimed": self.cur_dir,
            "done": self.cur_dir,
            "cur": self.cur_dir,
            "failed": self.failed_dir,
            "tmp": self.tmp_dir,
        }

    @classmethod
    def at(cls, mailboxes_root: str | os.PathLike[str], endpoint: str) -> Mailbox:
        return cls(Path(mailboxes_root) / endpoint, endpoint)

    def __repr__(self) -> str:
        return f"Mailbox({os.fspath(self.root)!r}, {self.endpoint!r})"

    def dir_of(self, state: State | str) -> str:
        return self._dirs[str(state)]

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
                raise storage_error(f"create mailbox {self.endpoint}", exc) from exc
            os.chmod(path, DIR_MODE)  # exact mode whatever the umask
            created.append(path)
        if created:
            try:
                fsync_dirs([os.fspath(self.root), os.fspath(self.root.parent)])
            except OSError as exc:
                raise storage_error(f"create mailbox {self.endpoint}", exc) from exc

    def exists(self) -> bool:
        return all(os.path.isdir(self.dir_of(d)) for d in SUBDIRS)

    # ----------------------------------------------------------------- deliver

    def deliver(self, message_id: str, data: bytes) -> int:
        """Store one message in new/; returns stored_at (file mtime, ms). See docstring."""
        return self._store(check_id(message_id), data, self.new_dir, "deliver")

    def deliver_failed(self, message_id: str, data: bytes) -> int:
        """Store a dead letter whose JSON (with "deadLetter") the caller built."""
        return self._store(check_id(message_id), data, self.failed_dir, "dead-letter")

    def _store(self, message_id: str, data: bytes, target_dir: str, action: str) -> int:
        what = f"{action} {message_id} to {self.endpoint}"
        return store_file(self.tmp_dir, target_dir, message_id, data, what, DELIVER_FAULTS)

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
            raise storage_error(f"claim {message_id} in {self.endpoint}", exc) from exc
        fault_point(CLAIM_AFTER_RENAME)
        try:
            data = read_file(target)
            if sync:
                fsync_dir(self.cur_dir)
                fsync_dir(self.new_dir)
        except OSError as exc:
            # Not handed out: put it back rather than strand it as pending in cur/.
            try:
                os.rename(target, source)
            except OSError:
                self._claimed[message_id] = name
            raise storage_error(f"claim {message_id} in {self.endpoint}", exc) from exc
        self._claimed[message_id] = name
        return name, data

    def reclaim(self, message_id: str, now_ms: int, deliveries: int) -> tuple[str, str, bytes]:
        """Claim again a message that waits claimed by nobody in cur/ (its consumer
        died): rename it with the new claim time and ``deliveries``, the number of this
        hand-out. Returns (old name, new name, content). InvalidState when it is not
        claimed (new, done or failed), MessageNotFound when the id is nowhere. The caller
        fsyncs cur/ before handing the message out (the writer does, per group commit).
        """
        old = self._find_cur(check_id(message_id))
        if old is None:
            self._raise_not_in_cur(message_id, "claim again")
        parsed = parse_name(old)
        if parsed.flags and "S" in parsed.flags:
            raise InvalidState(f"message {message_id} in {self.endpoint} is already done")
        name = format_name(message_id, now_ms, flags=parsed.flags or "", deliveries=deliveries)
        target = f"{self.cur_dir}/{name}"
        try:
            os.rename(f"{self.cur_dir}/{old}", target)
            fault_point(RECLAIM_AFTER_RENAME)
            self._claimed[message_id] = name
            return old, name, read_file(target)
        except OSError as exc:
            raise storage_error(f"claim {message_id} again in {self.endpoint}", exc) from exc

    def rename_claimed(self, message_id: str, name: str) -> None:
        """Give a claimed message's file in cur/ another name (undo a `reclaim`)."""
        current = self._find_cur(check_id(message_id))
        if current is not None and current != name:
            os.rename(f"{self.cur_dir}/{current}", f"{self.cur_dir}/{name}")
            self._claimed[message_id] = name

    def complete(self, message_id: str, now_ms: int, *, sync: bool = True) -> str:
        """Mark a claimed message done: cur/<id>,C=..:2, -> cur/<id>,C=..,D=<now_ms>:2,S.

        InvalidState when it is not claimed (new, done or failed), MessageNotFound when
        the id is nowhere. Returns the new name.
        """
        # The name this writer gave the claim is renamed at once: a consumer's ack is
        # the common case, and its file is where the claim put it. Only when it is not
        # (moved by hand, a restart) is cur/ looked through, as `_find_cur` does.
        name = self._claimed.get(check_id(message_id))
        done = None if name is None else self._rename_done(message_id, name, now_ms)
        if done is None:
            name = self._find_cur(message_id)
            if name is None:
                self._raise_not_in_cur(message_id, "complete")
            done = self._rename_done(message_id, name, now_ms)
            if done is None:  # gone between the listing and the rename
                raise MessageNotFound(f"no message {message_id} in {self.endpoint}")
        fault_point(COMPLETE_AFTER_RENAME)
        self._claimed.pop(message_id, None)
        if sync:
            try:
                fsync_dir(self.cur_dir)
            except OSError as exc:
                raise storage_error(f"complete {message_id} in {self.endpoint}", exc) from exc
        return done

    def _rename_done(self, message_id: str, name: str, now_ms: int) -> str | None:
        """Rename cur/<name> to its done name and return that; None when no file has
        ``name`` (the remembered name is then forgotten). InvalidState for a done name."""
        parsed = parse_name(name)
        if parsed.flags and "S" in parsed.flags:
            raise InvalidState(f"message {message_id} in {self.endpoint} is already done")
        flags = "".join(sorted(set(parsed.flags or "") | {"S"}))
        done = format_name(message_id, parsed.claimed_at, now_ms, flags, parsed.deliveries)
        try:
            os.rename(f"{self.cur_dir}/{name}", f"{self.cur_dir}/{done}")
        except FileNotFoundError:
            self._claimed.pop(message_id, None)
            return None
        except OSError as exc:
            raise storage_error(f"complete {message_id} in {self.endpoint}", exc) from exc
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
            raise storage_error(f"requeue {message_id} in {self.endpoint}", exc) from exc

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
                rank = STATE_RANK[state_of("cur", parse_name(found))]
            except InvalidMessage:
                continue
            if best is None or rank > best[0]:
                best = (rank, found)
        return best[1] if best else None

    def deliveries(self, message_id: str) -> int:
        """How many times the message was handed out, as its file name says (0 when it
        waits in new/ or is nowhere to be claimed)."""
        name = self._find_cur(check_id(message_id))
        return 0 if name is None else deliveries_of("cur", parse_name(name))

    def remember_claim(self, message_id: str, name: str) -> None:
        """Note the name in cur/ of a copy stored claimed (workers/group_commit.py)."""
        self._claimed[message_id] = name

    # ----------------------------------------------------------------- fail

    def fail(self, message_id: str, reason: str, code: str, now_ms: int) -> int:
        """Dead-letter a new or claimed message: failed/<id> = envelope + "deadLetter".

        Returns the dead letter's size in bytes (the index row's new size). Its mtime,
        hence stored_at, is the original's. InvalidState if the message is done or
        failed already, MessageNotFound if the id is nowhere. Crash states:
        workers/dead_letters.py.
        """
        if os.path.exists(f"{self.new_dir}/{check_id(message_id)}"):
            source_dir, name = self.new_dir, message_id
        else:
            found = self._find_cur(message_id)
            if found is None:
                self._raise_not_in_cur(message_id, "fail")
            name = found
            parsed = parse_name(name)
            if parsed.flags and "S" in parsed.flags:
                raise InvalidState(f"cannot fail {message_id} in {self.endpoint}: it is done")
            source_dir = self.cur_dir
        size = dead_letters.move_to_failed(
            self.paths, source_dir, name, message_id, reason, code, now_ms, keep_envelope=True
        )
        self._claimed.pop(message_id, None)
        return size

    def redrive(self, message_id: str, now_ms: int) -> None:
        """Requeue a dead letter: failed/<id> back to new/ as the message it was, its
        "deadLetter" kept in its "requeues" (workers/dead_letters.py, crash states
        there). In new/ it counts no hand-out (`deliveries_of`)."""
        dead_letters.redrive(self.paths, check_id(message_id), now_ms)

    def quarantine(self, name: str, reason: str, code: str, now_ms: int) -> str:
        """Dead-letter a file in new/ that is not a valid envelope; returns its dead
        letter's id (workers/dead_letters.py)."""
        return dead_letters.quarantine(self.paths, name, reason, code, now_ms)

    def purge_failed(self) -> list[str]:
        """Delete every dead letter of this mailbox; returns the ids removed
        (workers/dead_letters.py)."""
        return dead_letters.purge_failed(self.paths)

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
        return state_of("cur", parse_name(name)), Path(self.cur_dir, name)

    def read(self, message_id: str) -> tuple[State, bytes]:
        """The message's state and file content, in any state; MessageNotFound if none."""
        check_id(message_id)
        for _ in range(3):  # the file may move between find and open; look again
            found = self.find(message_id)
            if found is None:
                break
            try:
                return found[0], read_file(os.fspath(found[1]))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise storage_error(f"read {message_id} in {self.endpoint}", exc) from exc
        raise MessageNotFound(f"no message {message_id} in {self.endpoint}")

    # ----------------------------------------------------------------- recovery

    def sweep_tmp(
        self,
        own_older_than_s: float = 0,
        foreign_older_than_s: float = FOREIGN_TMP_MAX_AGE_S,
        now: float | None = None,
    ) -> int:
        """Remove stale files from tmp/; returns how many (workers/recovery.py)."""
        return recovery.sweep_tmp(self.tmp_dir, own_older_than_s, foreign_older_than_s, now)

    def recover(self, now: float | None = None) -> Recovery:
        """Repair what a crash left (workers/recovery.py): stale tmp files, duplicate states."""
        repaired = recovery.recover(self.paths, now)
        self._claimed.clear()  # the names remembered may have been removed
        return repaired
