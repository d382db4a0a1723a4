"""What must be true: the model of publishes, their copies and each copy's hand-outs, and
the checks of a snapshot (Maildir, index, what each consumer was handed) against it.

The consumer's contract (docs/architecture.md, "The life of a claim"): a copy handed to
a consumer is *held* by it until it answers (ack: done; nack: a dead letter), or until
the router takes it back, *releases* it: its client closed or was killed, stayed silent
past the session timeout, or the hand-out's ack deadline passed. A released copy is
handed out again, first in line, with ``deliveries`` one higher, or becomes a dead letter
(``max_deliveries``) when it had been handed out ``delivery.maxDeliveries`` times. After
a router restart the router does not know who holds what: a live client says hello
again and keeps what it holds; a claim nobody names is an orphan for one session
timeout, then released.

The model knows when each of these things happened here (time.monotonic(), the same
clock in every process), not when the router acted on them, so each hand-out has a
*release window* (`Model.window`): the router may have taken it back from ``lo`` on, and
surely has by ``hi``. Whatever falls inside a window may be either way; what falls
outside must be one way.

`check` returns (fatal, problems). Fatal findings can never heal (a copy handed to two
consumers at once, a hand-out out of order or with the wrong ``deliveries``, a publish
answered wrongly): the test fails at once. Problems may still be in flight (an ack on
its way, a release not yet swept): the caller polls until there are none and two
snapshots in a row are equal, and reports them at its deadline.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from sdk.paths import UNROUTABLE
from sdk.subjects import matches
from sdk.types import PublishResult
from tests.model.knobs import SKIP
from tests.model.snapshot import DEAD_LIMIT, PENDING_LIMIT, Disk, Index, dead_letter_of
from tests.model.world import HASHES, SESSION_MS, SUBJECT_OF, Receipt, Sub, World

INF = math.inf
TIMEOUT_S = SESSION_MS / 1000  # delivery.sessionTimeoutMs
SWEEP_S = 0.25  # the router ends silent sessions and takes back late claims this often
SLACK_S = 1.0  # for the router to act on something and for it to show
HEARTBEAT_S = 1.5  # a live client's last frame is at most this old (it pings every 1 s)
RESUME_S = 3.0  # a live client says hello again this soon after its router is back
ANSWER_S = 0.5  # a handler's ack or nack reaches the router within this


@dataclass(frozen=True)
class Copy:
    id: str
    endpoint: str
    subject: str
    seq: int  # which publish of the sequence
    denied: bool  # access_denied: a dead letter from the start
    ordered: bool  # published from the test thread, one publish after the other
    order_epoch: int  # its endpoint's order epoch at publish time
    at: float  # when its publish was answered


@dataclass(frozen=True)
class Seen:
    """A receipt (one hand-out) as it was at snapshot time."""

    sub: Sub
    id: str
    endpoint: str
    deliveries: int
    at: float
    router_epoch: int
    order_epoch: int
    since: tuple[float, float]
    handled: str | None
    handled_at: float | None
    refused_at: float | None
    refused_how: str | None
    fetched: bool  # a fetch returned it: its answers are confirmed

    @classmethod
    def of(cls, r: Receipt) -> Seen:
        return cls(
            r.sub,
            r.id,
            r.endpoint,
            r.deliveries,
            r.at,
            r.router_epoch,
            r.order_epoch,
            r.since,
            r.handled,
            r.handled_at,
            r.refused_at,
            r.refused_how,
            r.message is not None,
        )

    @property
    def what(self) -> str:
        return f"{self.sub.name} (hand-out {self.deliveries})"


@dataclass
class Snapshot:
    disk: Disk
    index: Index
    seen: dict[int, list[Seen]]  # sub key -> its receipts, in arrival order
    at: float  # when it was begun: what was due by then shows in it

    def key(self) -> object:
        receipts = sorted(
            (k, [(s.id, s.endpoint, s.deliveries, s.handled) for s in v])
            for k, v in self.seen.items()
        )
        return self.disk.key(), self.index.key(), receipts


@dataclass(frozen=True)
class Outcome:
    """Where a copy may be now: its places on disk, with the dead letter codes a place
    "failed" may have; whether it may or must be waiting to be handed out (counted in
    the endpoint's depth, and owed to a consumer with credit); the hand-outs its file's
    name may say."""

    places: dict[str, frozenset[str]]
    waiting: tuple[bool, bool]  # (may, must)
    deliveries: frozenset[int] | None = None  # None: any at least `least`
    least: int = 0


class Model:
    def __init__(self, world: World) -> None:
        self.world = world
        self.registered: dict[str, str] = {}  # subject -> hash
        self.rules: list[tuple[str, str]] = []  # deny rules (from, to), one priority
        self.default_credit = 64
        self.copies: dict[tuple[str, str], Copy] = {}
        self.unroutable: set[str] = set()
        self.seq = 0
        self._reasons_ok: dict[tuple[str, str], str] = {}  # dead letters checked: code

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
        now = time.monotonic()
        for s, h in targets:
            epoch = self.world.order_epoch[h]
            denied = self.denied(sender, s)
            copy = Copy(result.message_id, h, s, self.seq, denied, ordered, epoch, now)
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
            copy = Copy(message_id, h, s, self.seq, denied, False, epoch, time.monotonic())
            self.copies[(message_id, h)] = copy
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

    # ------------------------------------------------------------------ hand-outs

    def resumable(self, seen: Seen, ready: float) -> bool:
        """Whether the holder of a hand-out names it when it says hello to the router
        that came back at ``ready``: its client lives (a consumer process that is not
        silent pings too) and had not answered it by then (an answer lost with the old
        router is no longer named: the copy is an orphan)."""
        sub = seen.sub
        client = sub.client
        if client is not None and client.closing is not None and client.closing[0] < ready:
            return False
        if sub.killed_at is not None and sub.killed_at < ready:
            return False
        if sub.silenced is not None and sub.silenced[0] < ready:
            return False
        return seen.handled_at is None or seen.handled_at >= ready

    def death(self, seen: Seen) -> tuple[float, float] | None:
        """When the router learns that the holder is gone, (from, surely by): its client
        closed (bye), its process was killed (the connection closes), or it went silent
        (the session times out)."""
        sub = seen.sub
        windows = []
        client = sub.client
        if client is not None and client.closing is not None:
            windows.append((client.closing[0], client.closing[1] + SLACK_S))
        if sub.killed_at is not None:
            windows.append((sub.killed_at, sub.killed_at + SLACK_S))
        if sub.silenced is not None:
            signalled, noticed = sub.silenced
            windows.append(
                (
                    signalled - HEARTBEAT_S + TIMEOUT_S,
                    noticed + TIMEOUT_S + SWEEP_S + SLACK_S,
                )
            )
        if not windows:
            return None
        return min(w[0] for w in windows), min(w[1] for w in windows)

    def window(self, seen: Seen, *, later: float = INF, deaths: bool = True) -> tuple[float, float]:
        """When the router takes a hand-out back if it is not answered: not before lo,
        surely by hi (INF: not while its holder lives as it does now). ``later``: when
        the copy's next hand-out arrived (INF: none yet). ``deaths``: count its holder's
        death (False: only its ack deadline and router restarts).

        After a router restart a live client names what it holds in its hello and the
        new router gives it back, its ack deadline counting anew; that includes a
        hand-out the old router had taken back, if nobody got it since (the client
        cannot know; its ``deliveries`` still matches the file's). A hand-out nobody
        names is an orphan, released one session timeout after its writer's hello."""
        wait, since = seen.sub.ack_wait, seen.since
        death = self.death(seen) if deaths else None
        refused = seen.refused_at
        # Whether the SDK still names it in a hello: not answered (an answer refused
        # forgets it too, except in_progress).
        named = seen.handled is None and seen.refused_how in (None, "in_progress")
        earliest = INF
        for killed, ready in self.world.restarts:
            if killed <= seen.at:
                continue
            lo, hi = _pending(since, wait, death, refused if refused and refused < killed else None)
            earliest = min(earliest, lo)
            resumable = self.resumable(seen, ready)
            if hi < killed and not (resumable and named and later > killed):
                return earliest, hi  # taken back by the router that was killed, for good
            if resumable:
                since, refused = (killed, ready + RESUME_S), None
                if "resumed_ack_wait" in SKIP:
                    wait = None
                if "resume_race" in SKIP:  # its hello may have come before its writer's
                    earliest = min(earliest, killed + TIMEOUT_S)
                continue
            death, wait = (killed + TIMEOUT_S, ready + TIMEOUT_S + SWEEP_S + SLACK_S), None
        lo, hi = _pending(since, wait, death, refused)
        return min(earliest, lo), hi

    def answered(self, seen: Seen) -> str:
        """Whether its answer (ack, nack) was applied: "yes", "no" or "maybe". A
        fetched message's answer is confirmed; a handler's leaves on its own and counts
        only if the router still held the hand-out for its client when it arrived."""
        if seen.handled is None or seen.handled_at is None:
            return "no"
        if seen.fetched:
            return "yes"
        at = seen.handled_at
        client = seen.sub.client
        closing = client.closing if client is not None else None
        if closing is not None and at > closing[1]:
            return "no"  # the client had said bye: never sent
        maybe = closing is not None and at >= closing[0]
        # Sent to a router that was killed, or while it was down: maybe lost.
        maybe = maybe or any(k - ANSWER_S <= at <= r for k, r in self.world.restarts)
        lo, hi = self.window(seen)
        if at > hi:
            return "no"
        maybe = maybe or at + ANSWER_S >= lo
        return "maybe" if maybe else "yes"

    def statuses(self, seen: Seen, now: float) -> set[str]:
        """What a hand-out may be now: "answered", "held" (by its holder), "released"."""
        answered = self.answered(seen)
        if answered == "yes":
            return {"answered"}
        lo, hi = self.window(seen)
        out = {"held"} if now < lo else {"released"} if now > hi else {"held", "released"}
        if answered == "maybe":
            out.add("answered")
        return out

    def max_deliveries(self, start: float, end: float) -> set[int]:
        """The values delivery.maxDeliveries had between start and end."""
        history = self.world.max_deliveries
        values = {next(v for t, v in reversed(history) if t <= start)}
        return values | {v for t, v in history if start < t <= end}

    def lossy(self, endpoint: str, after: Seen | None, start: float, end: float) -> bool:
        """Whether a hand-out of a copy of ``endpoint`` may have been lost unseen between
        start and end: a consumer that could take it closed or was killed, or the router
        was killed, while the copy was free to be handed out (``after`` is its last hand-
        out seen; None: none)."""
        for begun, ended, endpoints, owner in self.world.lossy:
            if ended < start or begun > end:
                continue
            if endpoints is not None and endpoint not in endpoints:
                continue
            if after is None:
                return True
            own = owner is not None and owner in (after.sub, after.sub.client)
            lo, _ = self.window(after, deaths=not own)
            if lo < ended:
                return True
        return False

    def orphan_maybe(self, seen: Seen, now: float) -> bool:
        """Whether the copy may be an orphan now: a router restarted since it was handed
        out, and its holder does not name it in a hello (or may not have yet), and the
        session timeout since has not passed."""
        return any(
            k > seen.at
            and now < r + TIMEOUT_S + SWEEP_S + SLACK_S
            and (now < r + RESUME_S or not self.resumable(seen, r))
            for k, r in self.world.restarts
        )

    def outcome(self, copy: Copy, seen: list[Seen], now: float) -> Outcome:
        """Where a copy may be now, from its hand-outs seen (in arrival order)."""
        if copy.denied:
            return Outcome({"failed": frozenset({"access_denied"})}, (False, False))
        last = seen[-1] if seen else None
        lost = self.lossy(copy.endpoint, last, last.at if last else copy.at, now)
        if last is None:
            places = {"new": frozenset()}
            if lost:
                places |= {"claimed": frozenset(), "failed": frozenset({"max_deliveries"})}
            return Outcome(places, (True, not lost), None, 1)
        places: dict[str, set[str]] = defaultdict(set)
        may_wait = must_wait = False
        statuses = self.statuses(last, now)
        if "answered" in statuses:
            if last.handled == "ack":
                places["done"] |= set()
            else:
                places["failed"].add("nack")
        if "held" in statuses:
            places["claimed"] |= set()
        if "released" in statuses or lost:
            lo, hi = self.window(last)
            limits = self.max_deliveries(min(lo, now), min(hi, now))
            if lost or any(m and last.deliveries >= m for m in limits):
                places["failed"].add("max_deliveries")
            if lost or any(not m or last.deliveries < m for m in limits):
                places["claimed"] |= set()
                may_wait = True
                must_wait = (
                    statuses == {"released"}
                    and not lost
                    and all(m and last.deliveries < m for m in limits)
                    and not self.orphan_maybe(last, now)
                )
        exact = None if "released" in statuses or lost else frozenset({last.deliveries})
        frozen = {place: frozenset(codes) for place, codes in places.items()}
        return Outcome(frozen, (may_wait, must_wait), exact, last.deliveries)

    # ------------------------------------------------------------------ checks

    def check(self, snap: Snapshot, mailboxes: Path) -> tuple[list[str], list[str]]:
        fatal: list[str] = [f"a client dropped a push: {d}" for d in self.world.dropped]
        problems: list[str] = []
        handed: dict[tuple[str, str], list[Seen]] = defaultdict(list)
        streams: dict[object, list[Seen]] = defaultdict(list)
        for sub in self.world.subs:
            seen = snap.seen.get(sub.key, [])
            fatal += self._check_receipts(sub, seen)
            if sub.mode == "observe":
                problems += self._check_observer(sub, seen)
                continue
            streams[sub.stream] += seen
            for s in seen:
                handed[(s.id, s.endpoint)].append(s)
        for stream in streams.values():
            fatal += self._check_order(stream)
        outcomes: dict[tuple[str, str], Outcome] = {}
        for key, copy in sorted(self.copies.items(), key=lambda kv: kv[1].seq):
            seen = sorted(handed.get(key, []), key=lambda s: s.at)
            fatal += self._check_hand_outs(copy, seen)
            outcomes[key] = self.outcome(copy, seen, snap.at)
            problems += self._check_copy(copy, seen, outcomes[key], snap, mailboxes)
        problems += self._check_files(snap.disk)
        problems += self._check_index(snap, outcomes)
        problems += self._check_liveness(snap, outcomes)
        return fatal, problems

    def dead_letter_codes(self) -> list[str]:
        """The codes of the dead letters checked so far."""
        return list(self._reasons_ok.values())

    def _name(self, copy: Copy, seen: list[Seen]) -> str:
        handed = ", ".join(f"{s.what}{f' {s.handled}' if s.handled else ''}" for s in seen[-3:])
        return (
            f"{copy.id} of {copy.subject} (publish #{copy.seq}{', to ' + handed if seen else ''})"
        )

    def _check_receipts(self, sub: Sub, seen: list[Seen]) -> list[str]:
        """Every hand-out is of a stored copy its pattern matches, once."""
        out = []
        for s in seen:
            copy = self.copies.get((s.id, s.endpoint))
            if copy is None or copy.denied or not matches(copy.subject, sub.pattern):
                what = "a dead letter" if copy else "no copy the model knows"
                out.append(f"{sub.name} was pushed {s.id}/{s.endpoint}: {what} or not its pattern")
            elif sub.mode != "observe" and s.deliveries < 1:
                out.append(f"{sub.name} was handed {s.id} saying deliveries={s.deliveries}")
        if sub.mode == "observe":
            ids = [(s.id, s.endpoint) for s in seen]
            if len(set(ids)) != len(ids):
                out.append(f"{sub.name} was shown the same message twice: {ids}")
        return out

    def _check_order(self, stream: list[Seen]) -> list[str]:
        """A consumer gets each endpoint's messages in id order, except those handed out
        again (released by a consumer that died, left or let its deadline pass): only
        first hand-outs of copies published one after the other from the test thread,
        in the order epoch they were published in (a claim in flight when a consumer
        ended, or a process restarted, may go back in line behind younger ones)."""
        out = []
        by_endpoint: dict[tuple[str, int], list[Seen]] = defaultdict(list)
        for s in sorted(stream, key=lambda s: s.at):
            copy = self.copies.get((s.id, s.endpoint))
            if copy and copy.ordered and s.deliveries == 1 and copy.order_epoch == s.order_epoch:
                by_endpoint[(s.endpoint, s.order_epoch)].append(s)
        for (endpoint, epoch), items in by_endpoint.items():
            ids = [s.id for s in items]
            if ids != sorted(ids):
                out.append(
                    f"{items[0].sub.name} got {SUBJECT_OF.get(endpoint)}'s messages out of "
                    f"order (first hand-outs, order epoch {epoch}): {ids}"
                )
        return out

    def _check_hand_outs(self, copy: Copy, seen: list[Seen]) -> list[str]:
        """Held by one consumer at a time: handed out again only once its holder can
        have lost it (closed, killed, silent, its ack deadline passed), never after its
        answer was applied; ``deliveries`` 1 the first time and one more each time
        (unless a hand-out in between may have been lost unseen)."""
        out = []
        previous: Seen | None = None
        for s in seen:
            name = self._name(copy, seen)
            start = previous.at if previous is not None else copy.at
            lost = self.lossy(copy.endpoint, previous, start, s.at)
            want = previous.deliveries + 1 if previous is not None else 1
            if s.deliveries < want or (s.deliveries != want and not lost):
                out.append(
                    f"{name}: handed to {s.sub.name} as hand-out {s.deliveries}, want {want}"
                )
            if previous is not None:
                lo, _ = self.window(previous, later=s.at)
                if self.answered(previous) == "yes":
                    out.append(
                        f"{name}: handed to {s.what} after {previous.what} answered it "
                        f"({previous.handled})"
                    )
                elif s.at < lo:
                    when = (
                        "its holder lives and has no ack deadline"
                        if lo == INF
                        else f"{lo - s.at:.2f} s before it could have been taken back"
                    )
                    hint = ""
                    if any(
                        previous.at < k < s.at and self.resumable(previous, r)
                        for k, r in self.world.restarts
                    ):
                        hint = " (known: its client's hello reached the restarted router before"
                        hint += " the writer's? RELAY_MODEL_SKIP=resume_race)"
                    out.append(
                        f"{name}: handed to {s.what} while {previous.what} held it ({when}){hint}"
                    )
            previous = s
        return out

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

    def _check_copy(
        self, copy: Copy, seen: list[Seen], outcome: Outcome, snap: Snapshot, mailboxes: Path
    ) -> list[str]:
        key = (copy.id, copy.endpoint)
        where = snap.disk.where(*key)
        name = self._name(copy, seen)
        if len(where) != 1 or where[0] not in outcome.places:
            want = " or ".join(sorted(outcome.places))
            return [f"{name}: want {want}, on disk {where or 'nowhere'}"]
        place = where[0]
        if place in ("claimed", "done"):
            on_disk = snap.disk.deliveries.get(key, 0)
            exact = outcome.deliveries
            if (exact is not None and on_disk not in exact) or on_disk < outcome.least:
                want = f"{sorted(exact)}" if exact is not None else f">= {outcome.least}"
                return [f"{name}: its file in cur/ says N={on_disk}, want {want}"]
        if place == "failed" and key not in self._reasons_ok:
            letter = dead_letter_of(mailboxes, *key)
            code, codes = letter.get("code"), outcome.places["failed"]
            text = f"model nack {copy.id}" if code == "nack" else ""
            handed = letter.get("deliveries", 0)
            wrong = code not in codes or text not in (letter.get("reason") or "")
            if code == "nack":
                wrong = wrong or handed != seen[-1].deliveries
            elif code == "max_deliveries":
                wrong = wrong or handed < (seen[-1].deliveries if seen else 1)
            if wrong:
                return [f"{name}: dead letter {letter}, want code {sorted(codes)} {text!r}"]
            self._reasons_ok[key] = code
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

    def _check_index(self, snap: Snapshot, outcomes: dict[tuple[str, str], Outcome]) -> list[str]:
        """The index and the router agree with the Maildir: depth is what waits in new/
        plus what was released and waits in cur/ to be handed out again."""
        disk, index = snap.disk, snap.index
        out = []
        for subject, h in sorted(self.registered.items()):
            new = disk.ids(h, "new")
            claimed = disk.ids(h, "claimed")
            waiting = [outcomes[(i, h)].waiting for i in claimed if (i, h) in outcomes]
            least = len(new) + sum(1 for _, must in waiting if must)
            most = len(new) + sum(1 for may, _ in waiting if may)
            depth = index.depth.get(h)
            if depth is None or not least <= depth <= most:
                released = (
                    f" and {least - len(new)}-{most - len(new)} released" if most > len(new) else ""
                )
                hint = ""
                if self.world.restarts and depth is not None and depth > most:
                    hint = " (known: a claim its live client named after a router restart"
                    hint += " released as an orphan? RELAY_MODEL_SKIP=resume_race)"
                elif self.world.restarts and depth is not None:
                    hint = " (known: a claim named after a router restart kept past its ack"
                    hint += " deadline? RELAY_MODEL_SKIP=resumed_ack_wait)"
                out.append(
                    f"status depth of {subject} is {depth}, new/ holds {len(new)}{released}{hint}"
                )
            listed = claimed[:PENDING_LIMIT]
            if index.pending.get(h) != listed:
                out.append(
                    f"pending({subject}) = {index.pending.get(h)}, cur/ holds claimed {listed}"
                )
                continue
            wrong = [
                (i, index.pending_deliveries.get((i, h)), disk.deliveries.get((i, h)))
                for i in listed
                if index.pending_deliveries.get((i, h)) != disk.deliveries.get((i, h))
            ]
            if wrong:
                out.append(f"pending({subject}) deliveries (id, index, file name): {wrong[:5]}")
        failed = sorted((i, e) for (i, e), where in disk.places.items() if "failed" in where)
        listed_dead = sorted(index.dead)
        if len(failed) > DEAD_LIMIT:
            failed = failed[:DEAD_LIMIT]
        if listed_dead != failed:
            extra = sorted(set(listed_dead) - set(failed))[:8]
            lacking = sorted(set(failed) - set(listed_dead))[:8]
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

    def _check_liveness(
        self, snap: Snapshot, outcomes: dict[tuple[str, str], Outcome]
    ) -> list[str]:
        """A live consumer with room gets what waits for it (in new/, or released); the
        router holds every live subscription (renewed after a router restart), no ended
        one, and a silent consumer's only until its session timed out."""
        out = []
        now, epoch = snap.at, self.world.router_epoch
        live = [s for s in self.world.subs if not s.ended and s.mode != "fetch"]
        last_kill = max((k for k, _ in self.world.restarts), default=-INF)
        silent = sum(
            1
            for s in self.world.subs
            if s.silenced is not None
            and s.silenced[0] > last_kill
            and now < s.silenced[1] + TIMEOUT_S + SWEEP_S + SLACK_S
        )
        if not len(live) <= snap.index.subscriptions <= len(live) + silent:
            out.append(
                f"the router holds {snap.index.subscriptions} subscriptions, the model {len(live)}"
                + (f" (+ up to {silent} of silent consumers)" if silent else "")
            )
        for sub in live:
            if sub.mode == "observe":
                continue
            seen = snap.seen.get(sub.key, [])
            held = sum(
                1 for s in seen if s.router_epoch == epoch and "held" in self.statuses(s, now)
            )
            if held >= sub.granted:
                continue
            for subject, h in sorted(self.registered.items()):
                if not matches(subject, sub.pattern):
                    continue
                waiting = snap.disk.ids(h, "new")
                released = [
                    i
                    for i in snap.disk.ids(h, "claimed")
                    if (i, h) in outcomes and outcomes[(i, h)].waiting[1]
                ]
                if waiting or released:
                    out.append(
                        f"stall: {sub.name} holds at most {held} of {sub.granted}, but "
                        f"{subject} has {len(waiting)} waiting in new/ {waiting[:5]} and "
                        f"{len(released)} released in cur/ {released[:5]}"
                        + (" (known bug 1?)" if "*" in sub.pattern or ">" in sub.pattern else "")
                    )
        return out

    # ------------------------------------------------------------------ deadlines

    def due(self, now: float) -> float:
        """The latest time by which something the model knows of must have happened and
        has not been seen yet: the release of a copy's last hand-out (a later one shows
        it happened), a silent consumer's session end, the end of the orphans' wait
        after a router restart; ``now`` when nothing is due."""
        last: dict[tuple[str, str], Receipt] = {}
        with self.world.lock:
            for sub in self.world.subs:
                if sub.mode == "observe":
                    continue
                for r in sub.receipts:
                    key = (r.id, r.endpoint)
                    if key not in last or r.at > last[key].at:
                        last[key] = r
        seen = [Seen.of(r) for r in last.values() if r.handled is None]
        times = [now] + [self.window(s)[1] for s in seen]
        for sub in self.world.subs:
            if sub.silenced is not None:
                times.append(sub.silenced[1] + TIMEOUT_S + SWEEP_S + SLACK_S)
        # Claims in cur/ at a router restart: orphans nobody names are released one
        # session timeout later; those named must not be. Either way, wait and see.
        for killed, ready in self.world.restarts:
            if any(s.at < killed for s in seen):
                times.append(ready + TIMEOUT_S + SWEEP_S + SLACK_S)
        return max(t for t in times if t < INF)

    def endpoints(self) -> list[str]:
        return sorted(HASHES.values())


def _pending(
    since: tuple[float, float],
    wait: float | None,
    death: tuple[float, float] | None,
    refused: float | None = None,
) -> tuple[float, float]:
    """(lo, hi) of a release by ack deadline (held since ``since``, for ``wait`` s), by
    the holder's death, or shown by an answer refused at ``refused``, whichever first."""
    lo = hi = INF
    if wait is not None:
        lo, hi = since[0] + wait, since[1] + wait + SWEEP_S + SLACK_S
    if death is not None:
        lo, hi = min(lo, death[0]), min(hi, death[1])
    if refused is not None:
        hi = min(hi, refused)
        lo = min(lo, hi)
    return lo, hi
