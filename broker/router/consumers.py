"""Who is connected, what they subscribed to, and which message goes to whom. Pure.

Subscriptions belong to live client sessions and to nothing else: they are never
persisted, so a restart cannot bring back a subscription that consumes mail on
nobody's behalf (a mistake docs/design.md records). A session ends when its client says
``bye``, when a push to it finds no peer, or when it stays silent longer than
`SESSION_TIMEOUT_MS` (SDK clients with subscriptions send a ping every second).

Consuming subscriptions that match an endpoint compete for its messages: each message
goes to one of them, the one with the fewest unacknowledged messages (ties rotate), and
only while it has credit left. Observing subscriptions see every stored message and
hold no credit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.auth import AuthPolicy, Identity
from broker.sublist import Sublist

SESSION_TIMEOUT_MS = 5_000
CONSUME, OBSERVE = "consume", "observe"


@dataclass(eq=False)
class Subscription:
    id: int
    client: bytes
    pattern: str
    mode: str
    credit: int
    inflight: int = 0

    @property
    def has_credit(self) -> bool:
        return self.inflight < self.credit


@dataclass(eq=False)
class Session:
    identity: bytes
    last_seen: int
    user: str | None = None  # the ZAP user id its connection was admitted with
    # What auth.json grants that user, looked up afresh for each frame (the file may
    # change under an open connection); the operations check it.
    who: Identity | None = None
    subs: set[int] = field(default_factory=set)
    batches: bool = False  # asked (hello/ping "batch": true) for its replies batched
    # Messages handed to this client and not yet acknowledged:
    # (id, endpoint) -> (sub id, the message's sender, for its delivery receipt).
    unacked: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)


class Consumers:
    def __init__(self) -> None:
        self.sessions: dict[bytes, Session] = {}
        self.subs: dict[int, Subscription] = {}
        self._consumers: Sublist[int] = Sublist()
        self._observers: Sublist[int] = Sublist()
        self._next_sub = 1
        self._turn = 0
        # Subscriptions whose credit came back since the router last fed them: with a
        # wildcard they may take what waits in any endpoint they match, not only in the
        # one whose message they finished.
        self._refilled: set[int] = set()

    def touch(self, identity: bytes, now_ms: int, user: str | None = None) -> Session:
        session = self.sessions.get(identity)
        if session is not None and session.user != user:
            # A client-chosen routing id reused by other credentials: a new session,
            # never the old one's subscriptions and claims.
            self.end_session(identity)
            session = None
        if session is None:
            session = self.sessions[identity] = Session(identity, now_ms, user)
        session.last_seen = now_ms
        return session

    def subscribe(
        self, identity: bytes, pattern: str, mode: str, credit: int, now_ms: int
    ) -> Subscription:
        session = self.sessions.get(identity) or self.touch(identity, now_ms)
        session.last_seen = now_ms
        sub = Subscription(self._next_sub, identity, pattern, mode, credit)
        self._next_sub += 1
        self.subs[sub.id] = sub
        session.subs.add(sub.id)
        (self._consumers if mode == CONSUME else self._observers).insert(pattern, sub.id)
        return sub

    def unsubscribe(self, sub_id: int) -> Subscription | None:
        sub = self.subs.pop(sub_id, None)
        if sub is None:
            return None
        (self._consumers if sub.mode == CONSUME else self._observers).remove(sub.pattern, sub.id)
        session = self.sessions.get(sub.client)
        if session is not None:
            session.subs.discard(sub_id)
        return sub

    def end_session(self, identity: bytes) -> Session | None:
        """Forget a client and its subscriptions; its unacked messages stay claimed."""
        session = self.sessions.pop(identity, None)
        if session is not None:
            for sub_id in list(session.subs):
                self.unsubscribe(sub_id)
        return session

    def end_beyond_rights(self, policy: AuthPolicy) -> list[tuple[Subscription, str]]:
        """End the subscriptions whose client may no longer receive what they cover
        (auth.json narrowed, or its credentials revoked): pushes stop at once, not at
        the next subscribe. Messages already pushed stay held (ack them as usual); the
        client learns at its next heartbeat. Returns each ended one with who held it."""
        ended = []
        for session in list(self.sessions.values()):
            who = policy.identity(session.user)
            for sub_id in sorted(session.subs):
                sub = self.subs[sub_id]
                if who is None or not who.may_consume(sub.pattern):
                    self.unsubscribe(sub_id)
                    ended.append((sub, who.name if who else str(session.user)))
        return ended

    def expired(self, now_ms: int) -> list[bytes]:
        limit = now_ms - SESSION_TIMEOUT_MS
        return [s.identity for s in self.sessions.values() if s.last_seen < limit]

    def observers(self, subject: str) -> list[Subscription]:
        return [self.subs[i] for i in self._observers.match(subject)]

    def pick_consumer(self, subject: str) -> Subscription | None:
        """The competing consumer with credit and the fewest messages in hand."""
        candidates = [self.subs[i] for i in self._consumers.match(subject)]
        candidates = [s for s in candidates if s.has_credit]
        if not candidates:
            return None
        self._turn += 1
        fewest = min(s.inflight for s in candidates)
        tied = sorted((s for s in candidates if s.inflight == fewest), key=lambda s: s.id)
        return tied[self._turn % len(tied)]

    def handed_out(self, sub: Subscription, message_id: str, endpoint: str, sender: str) -> None:
        """Record a pushed message; its credit was reserved when the claim was sent."""
        session = self.sessions.get(sub.client)
        if session is not None:
            session.unacked[(message_id, endpoint)] = (sub.id, sender)

    def holder_of(self, message_id: str, endpoint: str) -> bytes | None:
        """The client a message was handed to and is not finished by (an operator's
        complete/fail/requeue settles it on that client's behalf)."""
        key = (message_id, endpoint)
        return next((s.identity for s in self.sessions.values() if key in s.unacked), None)

    def settled(self, identity: bytes, message_id: str, endpoint: str) -> str | None:
        """An ack or nack arrived: give the credit back and return the message's sender.

        None when this client did not hold the message.
        """
        session = self.sessions.get(identity)
        if session is None:
            return None
        held = session.unacked.pop((message_id, endpoint), None)
        if held is None:
            return None
        sub_id, sender = held
        self.give_back(sub_id)
        return sender

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
