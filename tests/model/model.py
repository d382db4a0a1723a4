"""What must be true: the model of publishes and their copies, and the checks of a
snapshot (Maildir, index, what each consumer was pushed) against it.

`check` returns (fatal, problems). Fatal findings can never heal (a message pushed
twice, out of order, a publish answered wrongly): the test fails at once. Problems may
still be in flight (an ack on its way, a claim not yet pushed); the caller polls until
there are none and two snapshots in a row are equal, and reports them at its deadline.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from sdk.paths import UNROUTABLE
from sdk.subjects import matches
from sdk.types import PublishResult
from tests.model.snapshot import DEAD_LIMIT, PENDING_LIMIT, Disk, Index, dead_letter_of
from tests.model.world import HASHES, SUBJECT_OF, Receipt, Sub, World

LINGER_S = 7.0  # a killed consumer's session may last this long (5 s of silence + sweep)


@dataclass(frozen=True)
class Copy:
    id: str
    endpoint: str
    subject: str
    seq: int  # which publish of the sequence
    denied: bool  # access_denied: a dead letter from the start
    ordered: bool  # published from the test thread, one publish after the other
    order_epoch: int  # its endpoint's order epoch at publish time


@dataclass(frozen=True)
class Seen:
    """A receipt as it was at snapshot time."""

    sub: Sub
    id: str
    endpoint: str
    router_epoch: int
    order_epoch: int
    handled: str | None
    handled_epoch: int | None
    after_close: bool

    @classmethod
    def of(cls, r: Receipt) -> Seen:
        return cls(
            r.sub,
            r.id,
            r.endpoint,
            r.router_epoch,
            r.order_epoch,
            r.handled,
            r.handled_epoch,
            r.after_close,
        )


@dataclass
class Snapshot:
    disk: Disk
    index: Index
    seen: dict[int, list[Seen]]  # sub key -> its receipts, in arrival order

    def key(self) -> object:
        receipts = sorted(
            (k, [(s.id, s.endpoint, s.handled) for s in v]) for k, v in self.seen.items()
        )
        return self.disk.key(), self.index.key(), receipts


class Model:
    def __init__(self, world: World) -> None:
        self.world = world
        self.registered: dict[str, str] = {}  # subject -> hash
        self.rules: list[tuple[str, str]] = []  # deny rules (from, to), one priority
        self.default_credit = 64
        self.copies: dict[tuple[str, str], Copy] = {}
        self.unroutable: set[str] = set()
        self.seq = 0
        self.router_started = 0.0  # time.monotonic() of the last router restart
        self._reasons_ok: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ publishes

    def targets(self, subject: str) -> list[tuple[str, str]]:
        return sorted((s, h) for s, h in self.registered.items() if matches(s, subject))

    def denied(self, sender: str, target: str) -> bool:
        return any(matches(sender, f) and matches(target, t) for f, t in self.rules)

    def published(
        self, subject: str, sender: str, result: PublishResult | BaseException, *, ordered: bool
    ) -> list[str]:
        """Record a publish made with the current registrations and rules; returns what
        is wrong with its answer."""
        self.seq += 1
        if isinstance(result, BaseException):
            known = " (known bug 2 or 3?)" if "unavailable" in repr(result).lower() else ""
            return [f"publish #{self.seq} to {subject} from {sender} raised {result!r}{known}"]
        targets = self.targets(subject)
        if not targets:
            self.unroutable.add(result.message_id)
            want = (0, {("*", "no_match")})
        else:
            refused = {(h, "access_denied") for s, h in targets if self.denied(sender, s)}
            want = (len(targets) - len(refused), refused)
        got = (result.delivered_to, set(result.rejected))
        for s, h in targets:
            epoch = self.world.order_epoch[h]
            copy = Copy(result.message_id, h, s, self.seq, self.denied(sender, s), ordered, epoch)
            self.copies[(copy.id, h)] = copy
        if got == want:
            return []
        known = " (known bug 2 or 3: refused unavailable)" if "unavailable" in str(got) else ""
        return [
            f"publish #{self.seq} {result.message_id} to {subject} from {sender}: answered "
            f"delivered_to={got[0]} rejected={sorted(got[1])}, expected delivered_to={want[0]} "
            f"rejected={sorted(want[1])} ({dict(result.details)}){known}"
        ]

    def relayed_again(self, subject: str, sender: str, result: PublishResult) -> list[str]:
        """A message relayed from another node handed in again (a JetStream redelivery,
        after its first ingest was answered): endpoints that have its id count as
        delivered and get nothing; endpoints registered since get a copy (or a dead
        letter, denied); with no endpoint left it is a no_match dead letter, once."""
        self.seq += 1
        message_id, delivered, refused = result.message_id, 0, set()
        targets = self.targets(subject)
        for s, h in targets:
            if (message_id, h) in self.copies:
                delivered += 1
                continue
            denied = self.denied(sender, s)
            epoch = self.world.order_epoch[h]
            self.copies[(message_id, h)] = Copy(message_id, h, s, self.seq, denied, False, epoch)
            if denied:
                refused.add((h, "access_denied"))
            else:
                delivered += 1
        if not targets and message_id not in self.unroutable:
            self.unroutable.add(message_id)
            refused.add(("*", "no_match"))
        got = (result.delivered_to, set(result.rejected))
        if got == (delivered, refused):
            return []
        return [
            f"ingest #{self.seq} {message_id} again to {subject} from {sender}: answered "
            f"delivered_to={got[0]} rejected={sorted(got[1])}, expected "
            f"delivered_to={delivered} rejected={sorted(refused)}"
        ]

    # ------------------------------------------------------------------ checks

    def check(self, snap: Snapshot, mailboxes: Path) -> tuple[list[str], list[str]]:
        fatal: list[str] = [f"a client dropped a push: {d}" for d in self.world.dropped]
        problems: list[str] = []
        consumed: dict[tuple[str, str], list[Seen]] = defaultdict(list)
        for sub in self.world.subs:
            seen = snap.seen.get(sub.key, [])
            fatal += self._check_receipts(sub, seen)
            if sub.mode == "observe":
                problems += self._check_observer(sub, seen)
            else:
                for s in seen:
                    consumed[(s.id, s.endpoint)].append(s)
        for key, copy in sorted(self.copies.items(), key=lambda kv: kv[1].seq):
            fatal += self._twice(copy, consumed.get(key, []))
            problems += self._check_copy(copy, consumed.get(key, []), snap.disk, mailboxes)
        problems += self._check_files(snap.disk)
        problems += self._check_index(snap.disk, snap.index)
        problems += self._check_liveness(snap)
        return fatal, problems

    def _check_receipts(self, sub: Sub, seen: list[Seen]) -> list[str]:
        """Every push is of a stored copy its pattern matches, once, in order."""
        out = []
        by_endpoint: dict[str, list[Seen]] = defaultdict(list)
        for s in seen:
            copy = self.copies.get((s.id, s.endpoint))
            if copy is None or copy.denied or not matches(copy.subject, sub.pattern):
                what = "a dead letter" if copy else "no copy the model knows"
                out.append(f"{sub.name} was pushed {s.id}/{s.endpoint}: {what} or not its pattern")
                continue
            by_endpoint[s.endpoint].append(s)
        for endpoint, items in by_endpoint.items():
            ids = [s.id for s in items]
            if len(set(ids)) != len(ids):
                out.append(f"{sub.name} was pushed the same message twice: {ids}")
            streams: dict[int, list[str]] = defaultdict(list)
            for s in items:
                copy = self.copies[(s.id, endpoint)]
                if copy.ordered and copy.order_epoch == s.order_epoch:
                    streams[s.order_epoch].append(s.id)
            for epoch, stream in streams.items():
                if stream != sorted(stream):
                    out.append(
                        f"{sub.name} got {SUBJECT_OF.get(endpoint)}'s messages out of order "
                        f"(order epoch {epoch}): {stream}"
                    )
        return out

    def _twice(self, copy: Copy, seen: list[Seen]) -> list[str]:
        if len(seen) <= 1:
            return []
        return [f"{copy.id} of {copy.subject} was pushed to {[s.sub.name for s in seen]}"]

    def _check_observer(self, sub: Sub, seen: list[Seen]) -> list[str]:
        got = {(s.id, s.endpoint) for s in seen}
        windows = [(start, self.seq + 1 if end is None else end) for start, end in sub.windows]
        missing = [
            copy.id
            for key, copy in self.copies.items()
            if not copy.denied
            and matches(copy.subject, sub.pattern)
            and key not in got
            and any(start <= copy.seq < end for start, end in windows)
        ]
        if missing:
            return [f"observer {sub.name} has not seen {len(missing)} stored copies: {missing[:8]}"]
        return []

    def _want(self, copy: Copy, seen: list[Seen]) -> str | None:
        """Where a copy must be once everything settled; None: not known yet."""
        if copy.denied:
            return "failed"
        if not seen:
            return "new"
        s = seen[0]
        sub = s.sub
        if sub.mode == "process":
            return "claimed"
        if s.handled is None:
            closed = sub.client is not None and sub.client.closed
            if closed or (sub.behaviour == "hold" and not sub.released.is_set()):
                return "claimed"
            return None
        if s.after_close or s.handled_epoch != s.router_epoch:
            return "claimed"  # its answer could not be taken: the session that held it ended
        return "done" if s.handled == "ack" else "failed"

    def _check_copy(self, copy: Copy, seen: list[Seen], disk: Disk, mailboxes: Path) -> list[str]:
        where = disk.where(copy.id, copy.endpoint)
        want = self._want(copy, seen)
        holder = f", pushed to {seen[0].sub.name} (handled: {seen[0].handled})" if seen else ""
        name = f"{copy.id} of {copy.subject} (publish #{copy.seq}{holder})"
        if want is None:
            return [f"{name}: its handler has not finished yet; on disk {where}"]
        if where != [want]:
            return [f"{name}: want {want}, on disk {where or 'nowhere'}"]
        if want == "failed" and (copy.id, copy.endpoint) not in self._reasons_ok:
            letter = dead_letter_of(mailboxes, copy.id, copy.endpoint)
            code = "access_denied" if copy.denied else "nack"
            text = "" if copy.denied else f"model nack {copy.id}"
            if letter.get("code") != code or text not in (letter.get("reason") or ""):
                return [f"{name}: dead letter {letter}, want code {code} with {text!r}"]
            self._reasons_ok.add((copy.id, copy.endpoint))
        return []

    def _check_files(self, disk: Disk) -> list[str]:
        out = []
        for (message_id, endpoint), where in disk.places.items():
            if endpoint == UNROUTABLE:
                if message_id not in self.unroutable or where != ["failed"]:
                    out.append(f"unroutable {message_id}: {where}, unknown to the model")
            elif (message_id, endpoint) not in self.copies:
                out.append(
                    f"{message_id} in {SUBJECT_OF.get(endpoint)} {where}: no publish made it"
                )
        missing = self.unroutable - {i for i, e in disk.places if e == UNROUTABLE}
        if missing:
            out.append(f"no_match publishes missing from {UNROUTABLE}/failed/: {sorted(missing)}")
        out += [f"{SUBJECT_OF.get(e, e)}/tmp/ holds {n} files" for e, n in disk.tmp.items() if n]
        return out

    def _check_index(self, disk: Disk, index: Index) -> list[str]:
        out = []
        for subject, h in sorted(self.registered.items()):
            new = disk.ids(h, "new")
            if index.depth.get(h) != len(new):
                out.append(
                    f"status depth of {subject} is {index.depth.get(h)}, new/ holds {len(new)}"
                )
            claimed = disk.ids(h, "claimed")[:PENDING_LIMIT]
            if index.pending.get(h) != claimed:
                out.append(
                    f"pending({subject}) = {index.pending.get(h)}, cur/ holds claimed {claimed}"
                )
        failed = sorted((i, e) for (i, e), where in disk.places.items() if "failed" in where)
        listed = sorted(index.dead)
        if len(failed) > DEAD_LIMIT:
            failed = failed[:DEAD_LIMIT]
        if listed != failed:
            extra = sorted(set(listed) - set(failed))[:8]
            lacking = sorted(set(failed) - set(listed))[:8]
            out.append(f"dead_letters() lists {extra} not in failed/, misses {lacking}")
        unroutable = len(disk.ids(UNROUTABLE, "failed"))
        if index.unroutable != unroutable:
            out.append(
                f"status unroutable = {index.unroutable}, {UNROUTABLE}/failed/ holds {unroutable}"
            )
        down = [k for k, up in enumerate(index.writers) if not up]
        if down:
            out.append(f"the router counts writer(s) {down} as down while they run (known bug 2?)")
        return out

    def _check_liveness(self, snap: Snapshot) -> list[str]:
        """A live consumer with room gets what waits for it; the router holds every
        live subscription (renewed after a router restart) and no ended one."""
        out = []
        epoch = self.world.router_epoch
        now = time.monotonic()
        live = [s for s in self.world.subs if not s.ended]
        lingering = sum(
            1
            for s in self.world.subs
            if s.mode == "process"
            and s.ended
            and s.ended_at > max(now - LINGER_S, self.router_started)
        )
        if not len(live) <= snap.index.subscriptions <= len(live) + lingering:
            out.append(
                f"the router holds {snap.index.subscriptions} subscriptions, the model {len(live)}"
                + (f" (+ up to {lingering} of killed consumers)" if lingering else "")
            )
        for sub in live:
            if sub.mode == "observe":
                continue
            seen = snap.seen.get(sub.key, [])
            held = sum(
                1
                for s in seen
                if s.router_epoch == epoch and (sub.mode == "process" or s.handled is None)
            )
            if held >= sub.granted:
                continue
            for subject, h in sorted(self.registered.items()):
                waiting = snap.disk.ids(h, "new")
                if waiting and matches(subject, sub.pattern):
                    out.append(
                        f"stall: {sub.name} holds {held} of {sub.granted}, but {subject} has "
                        f"{len(waiting)} waiting in new/: {waiting[:5]}"
                        + (" (known bug 1?)" if "*" in sub.pattern or ">" in sub.pattern else "")
                    )
        return out

    def endpoints(self) -> list[str]:
        return sorted(HASHES.values())
