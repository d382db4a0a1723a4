"""The writer process of one shard: the only process that moves files in its mailboxes.

Loop: wait for deliveries and operations from the router (a DEALER) or for files another
program dropped into a ``new/`` (inotify); take everything that is queued, up to
`MAX_BATCH`, and handle it as one group commit:

1. claims, completions, failures, requeues (renames, cur/ not fsynced yet);
2. write every delivery's file into ``tmp/``, one ``syncfs``, rename each into ``new/``
   (``cur/`` when the router had a consumer waiting for it, ``failed/`` for a dead
   letter), one fsync per directory, which covers the renames of step 1 in ``cur/``
   (workers.group_commit.deliver_batch); the directories only step 1 touched are
   fsynced next;
3. ONE index transaction for all of the above;
4. only then tell the router: a publish is acknowledged when it is durable.

The batch grows with load and is a single message when idle: nothing waits for a
batch to fill. Start-up: recover every mailbox (stale tmp files, half-done failures),
rebuild the shard's index from the Maildir (the Maildir is the truth), ingest files
dropped while no writer ran, then say hello to the router.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import apsw
import zmq
from inotify_simple import INotify
from inotify_simple import flags as iflags

from sdk.errors import (
    EndpointNotFound,
    InvalidState,
    RelayError,
    StorageError,
    UnknownOperation,
)
from sdk.ids import is_id
from sdk.paths import UNROUTABLE, Home, is_mailbox_name, shard_of
from sdk.sockets import POLLIN, poll_item, read_queued, ready_in, send_parts
from sdk.types import relayed_from
from workers import clock, ingest
from workers import protocol as proto
from workers.compaction import remove_archived
from workers.dead_letters import redrive_batch
from workers.faults import fault_point
from workers.filenames import parse_name
from workers.group_commit import deliver_batch
from workers.index import MessageIndex, rebuild_from_maildir
from workers.index_changes import IndexChanges
from workers.inotify_events import read_events
from workers.maildir import Mailbox
from workers.process import run_until_stopped
from workers.records import State
from workers.scan import read_record

BEFORE_INDEX_COMMIT = "writer.before_index_commit"

log = logging.getLogger("relay.writer")

MAX_BATCH = 512  # router frames (a pass's deliveries, or one operation) per group commit
IDLE_POLL_MS = 500  # wake-up interval to notice a stop request
_WATCH_FLAGS = iflags.MOVED_TO | iflags.CLOSE_WRITE
_Q_OVERFLOW = int(iflags.Q_OVERFLOW)


def now_ms() -> int:
    """Claims, completions, failures: on the clock of the files' mtimes (clock.py)."""
    return clock.now_ms()


class Writer:
    def __init__(self, home: Home, shard: int, shards: int, ctx: zmq.Context | None = None):
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} is outside 0..{shards - 1}")
        self.home = home.create()
        self.shard, self.shards = shard, shards
        self.ctx = ctx or zmq.Context.instance()
        self.stopping = False
        self.mailboxes: dict[str, Mailbox] = {}
        self.index: MessageIndex  # opened (and rebuilt) by start()
        self.inotify = INotify(nonblocking=True)  # read by `read_events`
        self._watches: dict[int, str] = {}  # inotify wd -> endpoint
        self._own_renames: set[tuple[str, str]] = set()  # (endpoint, name) we moved into new/
        self._subjects: dict[str, str] = {}

        # A DEALER: the router's socket for this shard sends only to the connection
        # that said hello, so a stray one (a typo, a probe) neither takes deliveries
        # nor, going away, passes for this writer.
        self.inbox = self.ctx.socket(zmq.DEALER)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self._inbox_item = poll_item(self.inbox)
        # Hello goes out each time the router's socket accepts us (at start, and after a
        # router restart): only then can the router's deliveries reach this writer.
        self.connected = self.inbox.get_monitor_socket(zmq.EVENT_CONNECTED)
        self.inbox.connect(home.shard_address(shard))
        self.results = self.ctx.socket(zmq.PUSH)
        self.results.setsockopt(zmq.LINGER, 2000)
        self.results.connect(home.results_address)

    # ------------------------------------------------------------------ start-up

    def start(self) -> None:
        self._adopt_mailboxes()
        for mailbox in self.mailboxes.values():
            mailbox.recover()
        self.index, count = self._rebuilt_index()
        log.info(
            "shard %d/%d: %d mailboxes, index rebuilt from Maildir with %d messages",
            self.shard,
            self.shards,
            len(self.mailboxes),
            count,
        )
        self._rescan()

    def _rebuilt_index(self) -> tuple[MessageIndex, int]:
        """Open the shard's index and rebuild it from the Maildir (the truth).

        An index that cannot be opened or rebuilt (deleted, truncated, not a database,
        corrupt pages) is moved aside, with a log line saying so, and made anew.
        """
        path = self.home.index_db(self.shard)
        for attempt in (1, 2):
            index = None
            try:
                index = MessageIndex(path)
                return index, rebuild_from_maildir(index, self.home.mailboxes, list(self.mailboxes))
            except (StorageError, apsw.Error) as exc:
                if index is not None:
                    with contextlib.suppress(Exception):
                        index.close()
                if attempt == 2:
                    raise
                aside = f"{path}.corrupt-{now_ms()}"
                log.error(
                    "index %s is unusable (%s): moved aside to %s, rebuilding it from the Maildir",
                    path,
                    exc,
                    aside,
                )
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(f"{path}{suffix}", f"{aside}{suffix}")
        raise AssertionError("unreachable")

    def _adopt_mailboxes(self) -> None:
        if self.shard == 0:
            Mailbox(self.home.mailbox(UNROUTABLE), UNROUTABLE).create()
        for entry in os.scandir(self.home.mailboxes):
            if (
                entry.is_dir()
                and is_mailbox_name(entry.name)
                and shard_of(entry.name, self.shards) == self.shard
            ):
                self._watch(entry.name)

    def _watch(self, endpoint: str) -> Mailbox:
        mailbox = self.mailboxes.get(endpoint)
        if mailbox is None:
            mailbox = Mailbox(self.home.mailbox(endpoint), endpoint)
            mailbox.create()
            wd = self.inotify.add_watch(str(mailbox.root / "new"), _WATCH_FLAGS)
            self._watches[wd] = endpoint
            self.mailboxes[endpoint] = mailbox
        return mailbox

    # ------------------------------------------------------------------ main loop

    def serve(self) -> None:
        polled = [(self.inbox, POLLIN), (self.inotify.fileno(), POLLIN), (self.connected, POLLIN)]
        while not self.stopping:
            events = ready_in(polled, IDLE_POLL_MS)
            if self.connected in events:
                self.connected.recv_multipart()
                # On the shard socket itself: the router learns which connection is ours.
                self.inbox.send_multipart(proto.hello(self.shard, self.shards, os.getpid()))
            if self.inotify.fileno() in events:
                self._on_inotify()
            if self.inbox in events:
                self._process(self._drain())
        # Drain what the router already handed us, so nothing queued is dropped.
        while batch := self._drain():
            self._process(batch)

    def _drain(self) -> list[list[bytes]]:
        """What is queued, up to `MAX_BATCH` frames, read as the router's loop reads
        (sdk/sockets.py `read_queued`)."""
        return read_queued(self._inbox_item, MAX_BATCH)

    def close(self) -> None:
        index: MessageIndex | None = getattr(self, "index", None)  # None: never started
        if index is not None:
            index.close()
        self.inotify.close()
        self.inbox.disable_monitor()
        self.connected.close(0)
        self.inbox.close(0)
        self.results.close()
        self.ctx.term()

    # ------------------------------------------------------------------ one group commit

    def _process(self, batch: list[list[bytes]]) -> None:
        deliveries: list[tuple[proto.DeliveryHeader, bytes]] = []
        others: list[tuple[bytes, Any, bytes | None]] = []
        for frames in batch:
            try:
                if frames[0] == proto.DELIVER:
                    deliveries.extend(proto.decode_deliveries(frames))
                else:
                    others.append(proto.decode(frames))
            except Exception:  # a bug on the router side; never crash the writer for it
                log.exception("undecodable frames from router dropped")

        changes = IndexChanges()
        outbox: list[list[bytes]] = []
        # Claims and completions rename first: the deliveries' fsync of cur/ then covers
        # them too, and a consumer keeping up with its publishers costs one cur/ fsync
        # per commit, not two.
        for kind, header, data in others:
            outbox.extend(self._handle(kind, header, data, changes))
        if deliveries:
            outbox.append(self._deliver(deliveries, changes))
        fault_point(BEFORE_INDEX_COMMIT)  # the files are durable, the index not yet
        stored_claimed, claimed_names = changes.stored_claimed, changes.claimed_names
        try:
            changes.commit(self.index)
        except Exception as exc:
            log.exception("index transaction (or directory fsync) failed")
            error = ("storage_error", f"index update failed: {exc}")
            outbox = [proto.as_failed(frames, error) for frames in outbox]
            self._unclaim(stored_claimed)
            self._unclaim_names(claimed_names)
        for frames in outbox:
            send_parts(self.results, frames, copy=False)

    def _deliver(
        self, deliveries: list[tuple[proto.DeliveryHeader, bytes]], changes: IndexChanges
    ) -> list[bytes]:
        results: list[proto.Stored] = []
        deliveries = self._not_stored_yet(deliveries, results)
        items = [(self._watch(h.endpoint), h.id, data, h.target) for h, data in deliveries]
        for (h, data), outcome in zip(deliveries, deliver_batch(items), strict=True):
            if isinstance(outcome, Exception):
                error = ("storage_error", str(outcome))
                results.append(proto.Stored(h.token, h.id, h.endpoint, None, *error, h.target))
                continue
            failed = h.target == proto.TARGET_FAILED
            claimed = h.target == proto.TARGET_CUR
            if claimed:  # deliver_batch fsynced cur/ after this commit's earlier renames
                changes.synced.add(self.mailboxes[h.endpoint].cur_dir)
                changes.stored_claimed.append((h.endpoint, h.id))
            if h.target == proto.TARGET_NEW:
                self._own_renames.add((h.endpoint, h.id))
            # The row in COLUMNS order (workers/index_sql.py), as a MessageRecord would
            # give it: a tuple, not a record object per copy.
            changes.rows.append(
                (
                    h.id,
                    h.endpoint,
                    h.subject,
                    h.sender,
                    _STORED_STATE[h.target],
                    h.created_at,
                    outcome,  # stored_at
                    outcome if claimed else None,  # claimed_at
                    h.failed_at if failed else None,  # finished_at
                    h.reason,
                    h.code,  # reason_code
                    len(data),  # size
                    h.parent_id,
                    1 if claimed else 0,  # deliveries: stored claimed, handed out once
                )
            )
            results.append(proto.Stored(h.token, h.id, h.endpoint, outcome, None, None, h.target))
        return proto.stored(results)

    def _not_stored_yet(
        self, deliveries: list[tuple[proto.DeliveryHeader, bytes]], results: list[proto.Stored]
    ) -> list[tuple[proto.DeliveryHeader, bytes]]:
        """The deliveries to store. A copy relayed from another node whose endpoint has
        this id already, in its index or earlier in this batch, is not: it is answered
        ``already_stored`` when that copy came from the same node (JetStream delivered it
        again), ``id_conflict`` when from elsewhere (another node cannot hide a message
        by relaying its id first, nor have its own counted as stored; a mailbox holds
        one file per id). The router's own check misses a copy whose writer answered
        after the publish deadline; this one, in the process that orders the shard's
        stores, misses nothing."""
        kept: list[tuple[proto.DeliveryHeader, bytes]] = []
        seen: dict[tuple[str, str], str | None] = {}  # (id, endpoint) -> its origin
        for h, data in deliveries:
            origin = h.relayed_from
            if origin is None:  # a local copy's id is new: it costs no lookup
                kept.append((h, data))
                continue
            key = (h.id, h.endpoint)
            if key not in seen and not self.index.has(*key):
                seen[key] = origin
                kept.append((h, data))
                continue
            stored_from = seen[key] if key in seen else self._origin_of(h.endpoint, h.id)
            if stored_from == origin:
                code, message = proto.ALREADY_STORED, f"message {h.id} is already in {h.endpoint}"
            else:
                code = proto.ID_CONFLICT
                message = proto.id_conflict(h.id, origin, f"endpoint {h.endpoint}", stored_from)
            results.append(proto.Stored(h.token, h.id, h.endpoint, None, code, message, h.target))
        return kept

    def _origin_of(self, endpoint: str, message_id: str) -> str | None:
        """The node the stored copy of ``message_id`` came from (its file says), or
        ``ORIGIN_UNKNOWN`` when the file cannot be read: then no node's copy is a
        redelivery (each is refused, none silently dropped)."""
        try:
            return relayed_from(self.mailboxes[endpoint].read(message_id)[1])
        except (RelayError, OSError, ValueError, KeyError):
            return proto.ORIGIN_UNKNOWN

    def _unclaim(self, stored_claimed: list[tuple[str, str]]) -> None:
        """Copies stored claimed in a commit that failed: nobody will be told of them, so
        they go to new/ (as if stored there) rather than stay claimed by nobody."""
        for endpoint, message_id in stored_claimed:
            try:
                self._own_renames.add((endpoint, message_id))
                self.mailboxes[endpoint].requeue(message_id)
            except (RelayError, OSError) as exc:
                log.error("%s/%s stays claimed in cur/: %s", endpoint, message_id, exc)

    def _unclaim_names(self, claimed: list[tuple[str, str, str | None]]) -> None:
        """Claims of a commit that failed, answered ``storage_error``: each goes back to
        where it was (new/, or its earlier name in cur/), so that the router, which puts
        it back in line, finds it there."""
        for endpoint, message_id, old in claimed:
            mailbox = self.mailboxes[endpoint]
            try:
                if old is None:
                    self._own_renames.add((endpoint, message_id))
                    mailbox.requeue(message_id)
                else:
                    mailbox.rename_claimed(message_id, old)
            except (RelayError, OSError) as exc:
                log.error("%s/%s stays claimed in cur/: %s", endpoint, message_id, exc)

    def _handle(
        self, kind: bytes, header: Any, data: bytes | None, changes: IndexChanges
    ) -> list[list[bytes]]:
        if kind == proto.CLAIM:
            return [self._claim(header, changes)]
        if kind == proto.OP:
            token, name, args = header  # a proto.Op
            try:
                result = self._operation(name, args, changes)
            except RelayError as exc:
                return [proto.reply(token, False, exc.to_wire(), self.shard)]
            except OSError as exc:
                return [proto.reply(token, False, StorageError(str(exc)).to_wire(), self.shard)]
            return [proto.reply(token, True, result, self.shard)]
        log.error("unknown frame kind %r from router dropped", kind)
        return []

    def _claim(self, order: proto.ClaimOrder, changes: IndexChanges) -> list[bytes]:
        """Claim a message for a subscription: from new/, or again in cur/ for one
        handed out ``order.deliveries`` times already. A claim whose commit then fails
        is undone (`_unclaim`): nobody will be told of it."""
        sub, message_id, endpoint, before = order
        deliveries = before + 1
        try:
            mailbox = self._mailbox(endpoint)
            if before:
                old, name, content = mailbox.reclaim(message_id, now_ms(), deliveries)
            else:
                old = None
                name, content = mailbox.claim(message_id, now_ms(), sync=False)
            changes.dirs.add(mailbox.cur_dir)
        except RelayError as exc:
            error = (exc.code, exc.message)
            return proto.claimed(sub, message_id, endpoint, b"", error, deliveries)
        except OSError as exc:
            error = ("storage_error", f"claim failed: {exc}")
            return proto.claimed(sub, message_id, endpoint, b"", error, deliveries)
        changes.claims.append((message_id, endpoint, _claimed_at(name), deliveries))
        changes.claimed_names.append((endpoint, message_id, old))
        return proto.claimed(sub, message_id, endpoint, content, None, deliveries)

    def _mailbox(self, endpoint: str) -> Mailbox:
        mailbox = self.mailboxes.get(endpoint)
        if mailbox is None:
            raise EndpointNotFound(f"no mailbox {endpoint!r} on shard {self.shard}")
        return mailbox

    def _operation(self, name: str, args: dict[str, Any], changes: IndexChanges) -> Any:
        now = now_ms()
        if name == "done":
            mailbox = self._mailbox(args["endpoint"])
            mailbox.complete(args["id"], now, sync=False)
            changes.dirs.add(mailbox.cur_dir)
            changes.dones.append((args["id"], args["endpoint"], now))
            return {"state": "done"}
        if args.get("claimedOnly"):
            self._require_claimed(args["id"], args["endpoint"])
        if name == "fail":
            reason = args.get("reason") or "failed by consumer"
            code = args.get("code") or "nack"
            mailbox = self._mailbox(args["endpoint"])
            handed = mailbox.deliveries(args["id"])  # the dead letter keeps the count
            size = mailbox.fail(args["id"], reason, code, now)
            changes.fails.append((args["id"], args["endpoint"], now, reason, code, size, handed))
            return {"state": "failed"}
        if name == "requeue":
            mailbox = self._mailbox(args["endpoint"])
            self._own_renames.add((args["endpoint"], args["id"]))
            mailbox.requeue(args["id"])
            changes.requeues.append((args["id"], args["endpoint"]))
            return {"state": "new", "id": args["id"], "endpoint": args["endpoint"]}
        if name == "redrive":
            return self._redrive(args.get("items") or [], now, changes)
        if name == "watch":
            self._subjects[args["endpoint"]] = args["subject"]
            self._watch(args["endpoint"])
            self._rescan([args["endpoint"]])  # files dropped before the watch existed
            return {}
        if name == "purge":
            return {"purged": self._purge(args.get("endpoint"), changes)}
        if name == "compact_remove":
            return self._compact_remove(args, changes)
        if name == "rebuild":
            changes.commit(self.index)  # earlier changes of this batch first
            return {
                "messages": rebuild_from_maildir(
                    self.index, self.home.mailboxes, list(self.mailboxes)
                )
            }
        raise UnknownOperation(f"writer has no operation {name!r}")

    def _compact_remove(self, args: dict[str, Any], changes: IndexChanges) -> dict[str, Any]:
        """Ops compaction archived these (id, endpoint) copies: delete their files and
        index rows; then, when asked, checkpoint the index and vacuum it past
        ``vacuumPages`` free pages (docs/ops.md)."""
        result: dict[str, Any] = dict(
            remove_archived(self.mailboxes, self.index, args.get("items") or (), changes)
        )
        if args.get("checkpoint"):
            changes.commit(self.index)  # the deletes first
            result["index"] = self.index.compact_storage(int(args.get("vacuumPages") or 0))
        return result

    def _redrive(self, items: list[list[str]], now: int, changes: IndexChanges) -> dict[str, Any]:
        """An operator's requeue of dead letters ([id, endpoint] each): all go back to
        new/ in one batch (`redrive_batch`: one flush for the lot, not three fsyncs
        each), their index rows read back from the files, as a rebuild would make them.
        One refused (gone, not a message) leaves the others be."""
        requeued, refused = [], []
        batch: list[tuple[str, str, Mailbox]] = []
        for message_id, endpoint in items:
            try:
                batch.append((message_id, endpoint, self._mailbox(endpoint)))
            except RelayError as exc:
                refused.append({"id": message_id, "endpoint": endpoint, **exc.to_wire()})
        # The renames into new/ are ours, not drop-ins for inotify to adopt.
        self._own_renames.update((endpoint, message_id) for message_id, endpoint, _ in batch)
        errors = redrive_batch(
            [(mailbox.paths, message_id) for message_id, _, mailbox in batch], now
        )
        for (message_id, endpoint, mailbox), error in zip(batch, errors, strict=True):
            if error is not None:
                self._own_renames.discard((endpoint, message_id))
                refused.append({"id": message_id, "endpoint": endpoint, **error.to_wire()})
                continue
            record = read_record(mailbox, "new", message_id)
            if record is not None:
                changes.inserts.append(record)
            requeued.append([message_id, endpoint])
        return {"requeued": requeued, "refused": refused}

    def _require_claimed(self, message_id: str, endpoint: str) -> None:
        found = self._mailbox(endpoint).find(message_id)
        if found is not None and found[0] is State.NEW:
            raise InvalidState(
                f"message {message_id} waits in new/ of {endpoint}: only claimed (pending) "
                "messages can be finished by an operator"
            )

    def _purge(self, endpoint: str | None, changes: IndexChanges) -> int:
        """Delete dead letters (files in failed/ and their index rows)."""
        targets = [self._mailbox(endpoint)] if endpoint else list(self.mailboxes.values())
        purged = 0
        for mailbox in targets:
            for message_id in mailbox.purge_failed():
                changes.deletes.append((message_id, mailbox.endpoint))
                purged += 1
        return purged

    # ------------------------------------------------------------------ files from outside

    def _on_inotify(self) -> None:
        overflow = False
        for wd, mask, name in read_events(self.inotify.fileno()):
            if mask & _Q_OVERFLOW:
                overflow = True
                continue
            endpoint = self._watches.get(wd)
            if endpoint is None or not name:
                continue
            key = (endpoint, name)
            if key in self._own_renames:
                self._own_renames.discard(key)
                continue
            self._ingest(endpoint, name)
        if overflow:
            log.warning("inotify queue overflowed: rescanning every new/ of shard %d", self.shard)
            self._own_renames.clear()
            self._rescan()

    def _rescan(self, endpoints: list[str] | None = None) -> None:
        """Find files in new/ the index does not know (dropped in while nobody watched)."""
        for endpoint in self.mailboxes if endpoints is None else endpoints:
            for name in os.listdir(self.mailboxes[endpoint].root / "new"):
                if (endpoint, name) in self._own_renames:
                    continue  # ours, its index row is in this group commit
                self._ingest(endpoint, name)

    def _known_new(self, endpoint: str, name: str) -> bool:
        """Whether new/<name> is a message the index already has as waiting in new/."""
        if not is_id(name):
            return False
        return any(r.endpoint == endpoint and r.state is State.NEW for r in self.index.get(name))

    def _ingest(self, endpoint: str, name: str) -> None:
        """Adopt new/<name>; a file moved back into new/ by hand is re-indexed as new."""
        mailbox = self.mailboxes[endpoint]
        if self._known_new(endpoint, name):
            return
        try:
            result = ingest.adopt(mailbox, name, self._subject_of(endpoint), now_ms())
        except FileNotFoundError:
            return  # moved away again before we looked
        except Exception:  # no file anyone can drop in may take the writer down
            log.exception("could not ingest %s/new/%s; left where it is", endpoint, name)
            return
        if result is None:
            return
        record, data = result
        self.index.write(inserts=[record])
        if record.state is State.NEW:
            self._own_renames.discard((endpoint, record.id))
            self.results.send_multipart(proto.ingested(record.id, endpoint, data))
        log.info("ingested %s/new/%s as %s (%s)", endpoint, name, record.id, record.state)

    def _subject_of(self, endpoint: str) -> str | None:
        if endpoint not in self._subjects:
            self._subjects.update(ingest.endpoint_subjects(self.home.control_db))
        return self._subjects.get(endpoint)


_STORED_STATE = {
    proto.TARGET_NEW: State.NEW,
    proto.TARGET_CUR: State.CLAIMED,
    proto.TARGET_FAILED: State.FAILED,
}


def _claimed_at(name: str) -> int:
    claimed_at = parse_name(name).claimed_at
    assert claimed_at is not None, name  # a claimed name (Mailbox.claim) has its C=
    return claimed_at


def main(home: Home, shard: int, shards: int) -> int:
    return run_until_stopped(home, f"writer-{shard}", shards, lambda: Writer(home, shard, shards))
