"""Who is connected, what they subscribed to, what each holds, and which message goes to
whom. Pure: time is an argument.

Subscriptions belong to live client sessions and to nothing else: they are never
persisted, so a restart cannot bring back a subscription that consumes mail on
nobody's behalf. A client is gone when it says ``bye``, when a push finds no peer, or
when it stays silent longer than the session timeout (config
``delivery.sessionTimeoutMs``; SDK clients ping every second). A push that finds the
client's queue full is a slow client, not a gone one: it keeps what it holds.

What a gone client held (`Held`, handed out and not answered) is *released*: the ledger
takes it back (`take_released`) and hands it out again, first in line, saying how many
times it has been handed out. The same happens to a claim held past its subscription's
ack deadline, and to a claim found in ``cur/`` after a router restart (an *orphan*)
whose holder does not come back within the session timeout. A client that comes back
presents its session token (`resume`): a live session's claims move to its new
connection, and the orphans it names as its own are its again.

Consuming subscriptions that match an endpoint compete for its messages: each message
goes to one of them, the one with the fewest unacknowledged messages (ties rotate), and
only while it has credit left. Observing subscriptions see every stored message and
hold no credit. A fetch is a consuming subscription whose credit is its batch; it lasts
until it has been handed something (or its wait ends) and answers with what it got
instead of pushing it (`fetches_to_answer`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.auth import AuthPolicy, Identity
from broker.delegation import acting_identity
from broker.sublist import Sublist
from sdk.errors import RelayError
from sdk.subjects import INBOX

SESSION_TIMEOUT_MS = 5_000  # the default of config delivery.sessionTimeoutMs
CONSUME, OBSERVE, FETCH = "consume", "observe", "fetch"
INBOX_DOT = INBOX + "."

Key = tuple[str, str]  # (message id, endpoint hash)
# A claim a client says it holds: (id, endpoint, deliveries, ack deadline ms or None).
Holding = tuple[str, str, int, int | None]


class Released(NamedTuple):
    """A claim nobody holds any more: hand it out again (``deliveries`` so far)."""

    id: str
    endpoint: str
    deliveries: int
    why: str  # "gone", "ack_wait", "orphan", "handed back"


@dataclass(slots=True, init=False)  # its own __init__, compiled: sdk/wire.py `Request`
class Held:
    """A message handed to a client and not answered yet."""

    sub: int | None  # the subscription whose credit it takes; None: none any more
    sender: str  # the message's sender, for its delivery receipt
    deliveries: int  # which hand-out this is (1: the first)
    since: int  # ms: handed out, or last said to be in progress
    ack_wait: int | None  # ms; past since + ack_wait it is taken back

    def __init__(
        self, sub: int | None, sender: str, deliveries: int, since: int, ack_wait: int | None = None
    ) -> None:
        self.sub = sub
        self.sender = sender
        self.deliveries = deliveries
        self.since = since
        self.ack_wait = ack_wait


@dataclass(eq=False)
class Subscription:
    id: int
    client: bytes
    pattern: str
    mode: str
    credit: int
    inflight: int = 0
    ack_wait: int | None = None  # ms, for what it is handed
    # The identity it was made for (a delegated request's actingFor); None: the
    # connection's own. Its rights are checked again when auth.json changes.
    acting: str | None = None
    # A fetch: what it was handed so far (id, endpoint, deliveries, file bytes), and
    # the time its wait ends.
    fetched: list[tuple[str, str, int, bytes]] = field(default_factory=list)
    wait_until: int = 0
    fetch_rid: int = 0  # the fetch request to answer

    @property
    def has_credit(self) -> bool:
        return self.inflight < self.credit


@dataclass(eq=False)
class Session:
    identity: bytes
    last_seen: int
    user: str | None = None  # the ZAP user id its connection was admitted with
    # What auth.json grants that user, looked up afresh for each frame (the file may
    # change under an open connection); the operations check it. While a request that
    # names another identity (actingFor) runs, that identity's, and ``acting`` its user id.
    who: Identity | None = None
    acting: str | None = None
    subs: set[int] = field(default_factory=set)
    batches: bool = False  # asked (hello/ping "batch": true) for its replies batched
    # The token a client presents when it connects again (`resume`); secret enough
    # that only the client it was given to knows it.
    token: str = field(default_factory=lambda: os.urandom(12).hex())
    unacked: dict[Key, Held] = field(default_factory=dict)


class Consumers:
    def __init__(self, session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.sessions: dict[bytes, Session] = {}
        self.subs: dict[int, Subscription] = {}
        self._tokens: dict[str, bytes] = {}  # session token -> identity
        self._consumers: Sublist[int] = Sublist()
        self._observers: Sublist[int] = Sublist()
        self._next_sub = 1
        self._turn = 0
        # Subscriptions whose credit came back since the router last fed them: with a
        # wildcard they may take what waits in any endpoint they match, not only in the
        # one whose message they finished.
        self._refilled: set[int] = set()
        self._released: list[Released] = []
        self.fetches: set[int] = set()  # the fetch subscriptions not answered yet
        # Claims found in cur/ that no session holds (after a router restart): each
        # waits until its deadline for a client to say it holds it.
        self.orphans: dict[Key, tuple[int, int]] = {}  # -> (deliveries, deadline ms)

    # ------------------------------------------------------------------ sessions

    def touch(self, identity: bytes, now_ms: int, user: str | None = None) -> Session:
        session = self.sessions.get(identity)
        if session is not None and session.user != user:
            # A client-chosen routing id reused by other credentials: a new session,
            # never the old one's subscriptions and claims.
            self.end_session(identity)
            session = None
        if session is None:
            session = self.sessions[identity] = Session(identity, now_ms, user)
            self._tokens[session.token] = identity
        session.last_seen = now_ms
        return session

    def resume(
        self,
        session: Session,
        token: str | None,
        holding: list[Holding],
        now_ms: int,
        *,
        unknown: Callable[[str, str], bool] = lambda message_id, endpoint: False,
    ) -> int:
        """A client connected again, presenting the token of its earlier session and
        what it holds. The earlier session's claims, if it lives on another connection
        (same credentials), move to this one, which takes its token; orphans it names
        with their hand-out are its again, and so are claims the router cannot know yet
        (``unknown``: their writer has not said hello since the router started, so no
        orphan was found for them); each keeps its ack deadline, from now. Returns how
        many claims it holds now."""
        earlier_id = self._tokens.get(token) if token else None
        earlier = self.sessions.get(earlier_id) if earlier_id is not None else None
        if (
            token is not None
            and earlier is not None
            and earlier is not session
            and earlier.user == session.user
        ):
            for key, held in earlier.unacked.items():
                held.sub = None  # its subscriptions end with the old connection
                session.unacked[key] = held
            earlier.unacked = {}
            self.end_session(earlier.identity)
            del self._tokens[session.token]
            session.token = token
            self._tokens[token] = session.identity
        for message_id, endpoint, deliveries, ack_wait in holding:
            key = (message_id, endpoint)
            orphan = self.orphans.get(key)
            if orphan is not None and orphan[0] == deliveries:
                del self.orphans[key]
            elif not unknown(message_id, endpoint) or self.holder_of(*key) is not None:
                continue
            session.unacked[key] = Held(None, "", deliveries, now_ms, ack_wait)
        return len(session.unacked)

    def subscribe(
        self,
        identity: bytes,
        pattern: str,
        mode: str,
        credit: int,
        now_ms: int,
        ack_wait: int | None = None,
        acting: str | None = None,
    ) -> Subscription:
        session = self.sessions.get(identity) or self.touch(identity, now_ms)
        session.last_seen = now_ms
        sub = Subscription(
            self._next_sub, identity, pattern, mode, credit, ack_wait=ack_wait, acting=acting
        )
        self._next_sub += 1
        self.subs[sub.id] = sub
        session.subs.add(sub.id)
        if mode == FETCH:
            self.fetches.add(sub.id)
        (self._observers if mode == OBSERVE else self._consumers).insert(pattern, sub.id)
        return sub

    def unsubscribe(self, sub_id: int) -> Subscription | None:
        sub = self.subs.pop(sub_id, None)
        if sub is None:
            return None
        self.fetches.discard(sub_id)
        (self._observers if sub.mode == OBSERVE else self._consumers).remove(sub.pattern, sub.id)
        session = self.sessions.get(sub.client)
        if session is not None:
            session.subs.discard(sub_id)
        return sub

    def end_session(self, identity: bytes) -> Session | None:
        """Forget a client and its subscriptions; what it held is released."""
        session = self.sessions.pop(identity, None)
        if session is None:
            return None
        for sub_id in list(session.subs):
            self.unsubscribe(sub_id)
        if self._tokens.get(session.token) == identity:
            del self._tokens[session.token]
        for (message_id, endpoint), held in session.unacked.items():
            self._released.append(Released(message_id, endpoint, held.deliveries, "gone"))
        session.unacked = {}
        return session

    def end_beyond_rights(self, policy: AuthPolicy, now_ms: int) -> list[tuple[Subscription, str]]:
        """End the subscriptions whose client may no longer receive what they cover
        (auth.json narrowed, or its credentials revoked; for one made acting for another
        identity, that identity's rights and the delegation itself, which ends when its
        last token expires): pushes stop at once, not at the next subscribe. Messages
        already pushed stay held (ack them as usual); the client learns at its next
        heartbeat. Returns each ended one with who held it."""
        ended = []
        for session in list(self.sessions.values()):
            for sub_id in sorted(session.subs):
                sub = self.subs[sub_id]
                try:
                    who, _ = acting_identity(policy, session.user, sub.acting, now_ms)
                except RelayError:
                    who = None
                if who is None or not who.may_consume(sub.pattern):
                    self.unsubscribe(sub_id)
                    ended.append((sub, who.name if who else str(sub.acting or session.user)))
        return ended

    def expired(self, now_ms: int) -> list[bytes]:
        limit = now_ms - self.session_timeout_ms
        return [s.identity for s in self.sessions.values() if s.last_seen < limit]

    # ------------------------------------------------------------------ claims held

    def take_released(self) -> list[Released]:
        """The claims nobody holds any more since the last call, oldest first."""
        released, self._released = self._released, []
        return sorted(released, key=lambda r: r.id)

    def overdue(self, now_ms: int) -> int:
        """Take back the claims held past their ack deadline and the orphans nobody
        came back for; they are released. Returns how many."""
        count = 0
        for session in self.sessions.values():
            late = [
                key
                for key, held in session.unacked.items()
                if held.ack_wait is not None and now_ms > held.since + held.ack_wait
            ]
            for key in late:
                held = session.unacked.pop(key)
                self.give_back(held.sub)
                self._released.append(Released(*key, held.deliveries, "ack_wait"))
            count += len(late)
        due = [key for key, (_, deadline) in self.orphans.items() if now_ms > deadline]
        for key in due:
            deliveries, _ = self.orphans.pop(key)
            self._released.append(Released(*key, deliveries, "orphan"))
        return count + len(due)

    def add_orphans(self, claims: list[tuple[str, str, int]], now_ms: int) -> int:
        """Claims found in cur/: those no session holds (none named them since the
        restart) are orphans, whose holder has one session timeout to come back and say
        so. Returns how many became orphans now."""
        deadline = now_ms + self.session_timeout_ms
        added = 0
        for message_id, endpoint, deliveries in claims:
            key = (message_id, endpoint)
            if key not in self.orphans and self.holder_of(*key) is None:
                self.orphans[key] = (deliveries, deadline)
                added += 1
        return added

    def fetches_to_answer(self, now_ms: int) -> list[Subscription]:
        """The fetches to answer now: every claim made for them is answered and they
        got something, or they got nothing and their wait is over."""
        ready = []
        for sub_id in sorted(self.fetches):
            sub = self.subs[sub_id]
            settled = len(sub.fetched) >= sub.inflight
            if settled and (sub.fetched or now_ms >= sub.wait_until):
                ready.append(sub)
        return ready

    @property
    def observing(self) -> bool:
        """Whether any subscription observes (watches without claiming)."""
        return bool(self._observers)

    def observers(self, subject: str) -> list[Subscription]:
        return [self.subs[i] for i in self._observers.match(subject)]

    def pick_consumer(self, subject: str) -> Subscription | None:
        """The competing consumer with credit and the fewest messages in hand. A reply
        inbox's messages go only to consumers that name an inbox, never to a wildcard
        that happens to match it (sdk/subjects.py, `reply_inbox`)."""
        if not self._consumers:  # nobody consumes: every stored copy of a publish asks
            return None
        candidates = [self.subs[i] for i in self._consumers.match(subject)]
        inbox = subject.startswith(INBOX_DOT)
        candidates = [
            s for s in candidates if s.has_credit and (not inbox or s.pattern.startswith(INBOX_DOT))
        ]
        if not candidates:
            return None
        self._turn += 1
        fewest = min(s.inflight for s in candidates)
        tied = sorted((s for s in candidates if s.inflight == fewest), key=lambda s: s.id)
        return tied[self._turn % len(tied)]

    def handed_out(
        self,
        sub: Subscription,
        message_id: str,
        endpoint: str,
        sender: str,
        deliveries: int,
        now_ms: int,
    ) -> None:
        """Record a message handed out; its credit was reserved when the claim was sent."""
        session = self.sessions.get(sub.client)
        if session is not None:
            held = Held(sub.id, sender, deliveries, now_ms, sub.ack_wait)
            session.unacked[(message_id, endpoint)] = held

    def claimed_per_endpoint(self) -> dict[str, tuple[int, int]]:
        """Per endpoint, how many messages are held (by live clients, or orphans after a
        restart) and since when the oldest of them (ms): for status, not a hot path."""
        counts: dict[str, tuple[int, int]] = {}
        held = [(e, h.since) for s in self.sessions.values() for (_, e), h in s.unacked.items()]
        held += [
            (e, deadline - self.session_timeout_ms)
            for (_, e), (_, deadline) in self.orphans.items()
        ]
        for endpoint, since in held:
            count, oldest = counts.get(endpoint, (0, since))
            counts[endpoint] = (count + 1, min(oldest, since))
        return counts

    def holder_of(self, message_id: str, endpoint: str) -> bytes | None:
        """The client a message was handed to and is not finished by (an operator's
        complete/fail/requeue settles it on that client's behalf)."""
        key = (message_id, endpoint)
        return next((s.identity for s in self.sessions.values() if key in s.unacked), None)

    def holds(self, identity: bytes, message_id: str, endpoint: str) -> Held | None:
        session = self.sessions.get(identity)
        return session.unacked.get((message_id, endpoint)) if session is not None else None

    def settled(
        self,
        identity: bytes | None,
        message_id: str,
        endpoint: str,
        deliveries: int | None = None,
    ) -> Held | None:
        """An answer (ack, nack) arrived for a hand-out: give the credit back and
        return what was held. None when this client does not hold that hand-out: it was
        answered already, taken back, or it is a later one (``deliveries`` names which;
        None: whichever it holds). An orphan is settled by whoever names its hand-out."""
        key = (message_id, endpoint)
        session = self.sessions.get(identity) if identity is not None else None
        held = session.unacked.get(key) if session is not None else None
        if session is None or held is None:
            orphan = self.orphans.get(key)
            if orphan is not None and deliveries is not None and orphan[0] == deliveries:
                del self.orphans[key]
                return Held(None, "", deliveries, 0)
            return None
        if deliveries is not None and held.deliveries != deliveries:
            return None
        del session.unacked[key]
        self.give_back(held.sub)
        return held

    def in_progress(
        self, identity: bytes, message_id: str, endpoint: str, deliveries: int | None, now_ms: int
    ) -> Held | None:
        """The holder is still working on it: its ack deadline starts again."""
        held = self.holds(identity, message_id, endpoint)
        if held is None or (deliveries is not None and held.deliveries != deliveries):
            return None
        held.since = now_ms
        return held

    def give_back(self, sub_id: int | None) -> None:
        """One unit of a subscription's credit returns: a message of it was finished, or a
        claim for it handed nothing out."""
        sub = self.subs.get(sub_id) if sub_id is not None else None
        if sub is not None:
            sub.inflight = max(0, sub.inflight - 1)
            self._refilled.add(sub.id)

    def take_refilled(self) -> list[Subscription]:
        """The live subscriptions that got credit back since the last call, with credit."""
        refilled, self._refilled = self._refilled, set()
        subs = (self.subs.get(i) for i in sorted(refilled))
        return [s for s in subs if s is not None and s.has_credit]
