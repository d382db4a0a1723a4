"""The delivery ledger: which waiting message goes to which consumer, and when. Pure.

It holds, per endpoint (`EndpointQueue`), the ids waiting in ``new/`` oldest first, the
claims in flight, the copies on their way into ``new/`` and the messages being put back;
across endpoints, the claims sent and not answered (per shard), the put-backs not
confirmed, the endpoints with messages waiting ("starved", least recently served first)
and the shards whose writer is up. Consumers (broker/router/consumers.py) says who may take a
message; the ledger decides what to claim for whom, and the router's loop sends what
it returns (`take_outbox`: `Claim`, `PutBack`) and tells it what happened.

The rules it keeps:

- FIFO per endpoint: a message is handed out only when nothing older of its endpoint is
  waiting, being stored or being put back (a put-back holds its endpoint's dispatch until
  the writer confirms it, so the message stays first in line). One exception, stated in
  docs/architecture.md ("Order"): a message *returned* (its holder died, left, or let its
  ack deadline pass) was handed out before, and newer ones may have been handed out
  since; it goes to the front of the line, and comes as soon as a consumer is free.
- Returned messages stay in cur/ (claimed by nobody) and are claimed again there: the
  writer renames them with their hand-out count (``N=``), which is how ``deliveries``
  survives a restart. One handed out ``maxDeliveries`` times and returned again is a
  dead letter (``max_deliveries``) instead.
- Credit: a claim takes one unit of its subscription's credit; an ack, a nack, or a claim
  that handed nothing out gives it back, and credit that comes back goes to the starved
  endpoints the subscription matches, one message each in turn, so that a wildcard
  consumer drains every backlog and a busy endpoint starves no other.
- Never claimed for nobody: a claim whose subscriber left, or whose writer died before
  answering, is put back (cur/ -> new/); a put-back of a claim that never happened is
  refused by the writer, harmlessly. Put-backs for a writer that is down wait for its
  hello and go out before any claim of the same message could.
- The Maildir is the truth: when a writer comes up, what waits in its mailboxes' new/
  (``waiting_in``, the one read of the disk) becomes their queues.

Time plays no part, so there is no ``now``; tests drive it without sockets
(tests/test_ledger_model.py runs it against a model of the Maildir).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from broker.router.consumers import Consumers, Subscription
from sdk.paths import shard_of
from sdk.subjects import has_wildcards, matches


@dataclass(frozen=True)
class Claim:
    """Ask shard's writer to claim id for subscription sub: from new/ (``deliveries``
    0), or, for a returned message handed out ``deliveries`` times, again in cur/."""

    shard: int
    sub: int
    id: str
    endpoint: str
    deliveries: int = 0


@dataclass(frozen=True)
class PutBack:
    """Ask shard's writer to move id from cur/ back to new/; it answers with token."""

    shard: int
    token: int
    id: str
    endpoint: str


@dataclass(frozen=True)
class DeadLetter:
    """Ask shard's writer to dead-letter a claimed message handed out too often."""

    shard: int
    token: int
    id: str
    endpoint: str
    deliveries: int


Command = Claim | PutBack | DeadLetter


@dataclass(eq=False)
class EndpointQueue:
    """Messages waiting in an endpoint's new/, oldest first, claims in flight, and the
    ids of copies on their way into new/: stored (not confirmed yet) or put back from
    cur/ (handed to nobody)."""

    waiting: deque[str] = field(default_factory=deque)
    claiming: int = 0
    storing: set[str] = field(default_factory=set)
    requeuing: set[str] = field(default_factory=set)
    # Returned messages, in cur/ and held by nobody: (id, hand-outs so far), oldest
    # first; they go before anything in new/.
    returned: list[tuple[str, int]] = field(default_factory=list)

    @property
    def depth(self) -> int:
        """Messages waiting to be handed out: in new/ (a claim in flight has not moved
        its file yet) or returned."""
        return len(self.waiting) + self.claiming + len(self.returned)

    @property
    def idle(self) -> bool:
        """Nothing of this endpoint waits, is being claimed, stored or put back."""
        return not (
            self.waiting or self.claiming or self.storing or self.requeuing or self.returned
        )


class Ledger:
    def __init__(
        self,
        consumers: Consumers,
        shards: int,
        waiting_in: Callable[[str], list[str]],
        tokens: Iterator[int],
    ) -> None:
        self.consumers = consumers
        self.shards = shards
        self._waiting_in = waiting_in  # an endpoint's new/, oldest first (the disk)
        self._tokens = tokens  # shared with the router's requests: one reply namespace
        self.queues: dict[str, EndpointQueue] = {}
        self._subjects: dict[str, str] = {}  # endpoint -> subject, while registered
        self._endpoints: dict[str, str] = {}  # subject -> endpoint, the same
        self._up: set[int] = set()
        # Claims sent and not yet answered, per shard: (id, endpoint) -> subscription.
        # A copy sent to be stored claimed counts as one; its subscription is None once
        # its publish was answered without it (its deadline passed).
        self._claims: dict[int, dict[tuple[str, str], int | None]] = {}
        self.put_backs: dict[int, tuple[str, str]] = {}  # token -> (id, endpoint)
        # Dead letters of messages handed out too often, not confirmed: token -> command.
        self.dead_letters: dict[int, DeadLetter] = {}
        # Re-claims in flight (of returned messages): (id, endpoint) -> hand-outs before.
        self._reclaims: dict[tuple[str, str], int] = {}
        self.max_deliveries = 5  # config delivery.maxDeliveries; 0: no limit
        self._starved: dict[str, None] = {}  # an ordered set
        self._outbox: list[Command] = []
        self._unsent: list[PutBack | DeadLetter] = []

    def take_outbox(self) -> list[Command]:
        """What to send to the writers, in order (a put-back before a later claim); put-
        backs and dead letters a writer that is up did not take before come first,
        tried again."""
        retry = [
            c
            for c in self._unsent
            if c.shard in self._up and (c.token in self.put_backs or c.token in self.dead_letters)
        ]
        outbox, self._outbox, self._unsent = retry + self._outbox, [], []
        return outbox

    def unsent(self, commands: list[Command]) -> None:
        """What its writer did not take (its queue is full, or it is gone). A claim is
        undone: first in line again, its credit back. A put-back or a dead letter is
        tried again with the next outbox while its writer is up, and sent again at its
        next hello."""
        claims = [c for c in commands if isinstance(c, Claim)]
        self._unsent += [c for c in commands if not isinstance(c, Claim)]
        undone: dict[str, None] = {}
        for claim in reversed(claims):  # appendleft, newest first: their order holds
            if self._pop_claim(claim.id, claim.endpoint) is None:
                continue  # its writer's departure released it already
            queue = self._queue(claim.endpoint)
            queue.claiming = max(0, queue.claiming - 1)
            before = self._reclaims.pop((claim.id, claim.endpoint), None)
            if before is None:
                queue.waiting.appendleft(claim.id)
            else:
                _in_order(queue.returned, claim.id, before)
            self.consumers.give_back(claim.sub)
            undone[claim.endpoint] = None
        # Claimed again now, for the next outbox, among every consumer with credit:
        # waiting for the credit given back would strand the message if that one
        # subscription ended first while others had credit all along.
        for endpoint in reversed(undone):
            self._dispatch(endpoint)

    def depth(self, endpoint: str) -> int:
        queue = self.queues.get(endpoint)
        return queue.depth if queue else 0

    def _queue(self, endpoint: str) -> EndpointQueue:
        """The endpoint's queue, made on first use (without building one to throw away
        on every call, as setdefault would: this is on the publish path)."""
        queue = self.queues.get(endpoint)
        if queue is None:
            queue = self.queues[endpoint] = EndpointQueue()
        return queue

    def _shard_queues(self, shard: int) -> list[tuple[str, EndpointQueue]]:
        return [(e, q) for e, q in self.queues.items() if shard_of(e, self.shards) == shard]

    # ------------------------------------------------------------------ endpoints

    def add_endpoint(self, endpoint: str, subject: str) -> None:
        """A registered endpoint: its queue is seeded from new/ the first time."""
        self._subjects[endpoint] = subject
        self._endpoints[subject] = endpoint
        if endpoint not in self.queues:
            self.queues[endpoint] = EndpointQueue(waiting=deque(self._waiting_in(endpoint)))
        self._dispatch(endpoint)

    def remove_endpoint(self, endpoint: str) -> None:
        """Unregistered: nothing more is handed out; its queue stays (its mail stays)."""
        subject = self._subjects.pop(endpoint, None)
        self._endpoints.pop(subject, None)
        self._starved.pop(endpoint, None)

    # ------------------------------------------------------------------ writers

    def is_up(self, shard: int) -> bool:
        return shard in self._up

    def writer_gone(self, shard: int) -> None:
        """What the shard's writer had not answered never will be. Claims it held may or
        may not have happened: their credit comes back, and each is put back by the
        next writer (refused harmlessly if it never happened). Put-backs it held are
        sent again then too; copies it was storing were answered by the caller."""
        self._up.discard(shard)
        for (message_id, endpoint), sub_id in self._claims.pop(shard, {}).items():
            self.consumers.give_back(sub_id)
            before = self._reclaims.pop((message_id, endpoint), None)
            if before is None:
                self.put_back(message_id, endpoint)
            else:  # in cur/ whether it happened or not: returned again
                _in_order(self._queue(endpoint).returned, message_id, before)
        for _, queue in self._shard_queues(shard):
            queue.claiming = 0
            queue.storing.clear()

    def writer_up(self, shard: int) -> None:
        """A writer said hello: its mailboxes' new/ becomes their queues (read before
        anything is sent to it), the put-backs kept for it go out, then the claims."""
        self._up.add(shard)
        queues = self._shard_queues(shard)
        for endpoint, queue in queues:
            queue.waiting = deque(self._waiting_in(endpoint))
        for token, (message_id, endpoint) in self.put_backs.items():
            if shard_of(endpoint, self.shards) == shard:
                self._outbox.append(PutBack(shard, token, message_id, endpoint))
        self._outbox += [d for d in self.dead_letters.values() if d.shard == shard]
        for endpoint, _ in queues:
            self._dispatch(endpoint)

    # ------------------------------------------------------------------ storing

    def store_target(self, message_id: str, endpoint: str) -> Subscription | None:
        """The consumer a new copy is stored claimed for (straight into cur/, one group
        commit instead of two), when one with credit waits and nothing older of its
        endpoint is in the way; None: the copy goes into new/."""
        queue = self._queue(endpoint)
        shard = shard_of(endpoint, self.shards)
        subject = self._subjects.get(endpoint)
        if subject is not None and queue.idle and shard in self._up:
            sub = self.consumers.pick_consumer(subject)
            if sub is not None:
                sub.inflight += 1
                self._claims.setdefault(shard, {})[(message_id, endpoint)] = sub.id
                return sub
        queue.storing.add(message_id)
        return None

    def storing(self, message_id: str, endpoint: str) -> None:
        """A copy on its way into new/ (one kept for a writer that was down): it holds
        back its endpoint's stored-claimed copies. A claim taken for it is given back."""
        self.consumers.give_back(self._pop_claim(message_id, endpoint))
        self._queue(endpoint).storing.add(message_id)

    def copy_settled(self, message_id: str, endpoint: str) -> int | None:
        """A copy's store was answered or given up on: it no longer holds back its
        endpoint. Returns the subscription it was stored claimed for, if any."""
        queue = self.queues.get(endpoint)
        if queue is not None:
            queue.storing.discard(message_id)
        return self._pop_claim(message_id, endpoint)

    def copy_abandoned(self, message_id: str, endpoint: str, *, sent: bool) -> None:
        """A copy whose store was given up on: never sent, or sent and its deadline
        passed. The credit of a consumer it was meant for comes back. A copy sent to be
        stored claimed may still be stored: it stays a claim of nobody's, put back by
        its late answer (`stored_late`) or, if its writer dies first, by the next one."""
        queue = self.queues.get(endpoint)
        if queue is not None:
            queue.storing.discard(message_id)
        claims = self._claims.get(shard_of(endpoint, self.shards), {})
        if (message_id, endpoint) in claims:
            self.consumers.give_back(claims.pop((message_id, endpoint)))
            if sent:
                claims[(message_id, endpoint)] = None
        self._dispatch(endpoint)

    def stored_new(self, message_id: str, endpoint: str) -> None:
        """A message is durable in new/ (stored there, or dropped in by another program)."""
        self._queue(endpoint).waiting.append(message_id)
        self._dispatch(endpoint)

    def stored_late(self, message_id: str, endpoint: str, *, claimed: bool) -> None:
        """A store answered after its publish was: stored claimed, nobody was told of it,
        so it goes back to new/; stored in new/, the disk says where it stands in line."""
        self.consumers.give_back(self.copy_settled(message_id, endpoint))
        if claimed:
            self.put_back(message_id, endpoint)
        elif endpoint in self.queues:
            self._requeue_from_disk(endpoint)
        self._dispatch(endpoint)

    def store_failed(self, message_id: str, endpoint: str) -> None:
        self.consumers.give_back(self.copy_settled(message_id, endpoint))
        self._dispatch(endpoint)

    def _requeue_from_disk(self, endpoint: str) -> None:
        """What waits in new/ (the truth), minus claims in flight, becomes the queue."""
        claiming = {
            i for (i, e) in self._claims.get(shard_of(endpoint, self.shards), {}) if e == endpoint
        }
        queue = self.queues[endpoint]
        queue.waiting = deque(i for i in self._waiting_in(endpoint) if i not in claiming)

    # ------------------------------------------------------------------ claims

    def claimed(
        self, sub_id: int, message_id: str, endpoint: str, *, ok: bool, unchanged: bool = False
    ) -> bool:
        """A writer answered a claim. True: hand the message to the subscription. False:
        nothing to hand out (the claim failed, and its credit is back; or the ledger no
        longer waited for it: its writer went away meanwhile, and it is put back).
        ``unchanged``: the claim failed and the writer left the file where it was (a
        storage error), so it is in line again."""
        if self._pop_claim(message_id, endpoint) is None:
            return False
        queue = self._queue(endpoint)
        queue.claiming = max(0, queue.claiming - 1)
        before = self._reclaims.pop((message_id, endpoint), None)
        if not ok:
            self.consumers.give_back(sub_id)
            if unchanged and before is None:
                _in_line(queue.waiting, message_id)
            elif unchanged:
                _in_order(queue.returned, message_id, before)
            self._dispatch(endpoint)
        return ok

    def return_released(self) -> None:
        """What gone clients held, claims past their ack deadline and orphans nobody came
        back for (`Consumers.take_released`): to the front of their endpoints' lines, or
        dead letters when handed out ``max_deliveries`` times already."""
        touched: dict[str, None] = {}
        for released in self.consumers.take_released():
            self.hand_back(released.id, released.endpoint, released.deliveries)
            touched[released.endpoint] = None
        for endpoint in touched:
            self._dispatch(endpoint)

    def hand_back(self, message_id: str, endpoint: str, deliveries: int) -> None:
        """A claimed message nobody holds, handed out ``deliveries`` times: first in
        line again (it stays in cur/); a claim never handed out goes back to new/."""
        if deliveries == 0:
            self.put_back(message_id, endpoint)
        elif self.max_deliveries and deliveries >= self.max_deliveries:
            shard = shard_of(endpoint, self.shards)
            command = DeadLetter(shard, next(self._tokens), message_id, endpoint, deliveries)
            self.dead_letters[command.token] = command
            if shard in self._up:
                self._outbox.append(command)
        else:
            _in_order(self._queue(endpoint).returned, message_id, deliveries)

    def dead_letter_done(self, token: int) -> DeadLetter | None:
        """The writer answered a dead letter of ours (whatever it said, it is done)."""
        return self.dead_letters.pop(token, None)

    def holds_claim(self, message_id: str, endpoint: str) -> bool:
        """Whether the ledger accounts for this claimed message: being claimed, returned,
        put back or dead-lettered (so it is not an orphan)."""
        key = (message_id, endpoint)
        queue = self.queues.get(endpoint)
        return (
            key in self._claims.get(shard_of(endpoint, self.shards), {})
            or (queue is not None and any(i == message_id for i, _ in queue.returned))
            or key in self.put_backs.values()
            or any((d.id, d.endpoint) == key for d in self.dead_letters.values())
        )

    def requeued(self, message_id: str, endpoint: str) -> None:
        """An operator put a pending message, or a dead letter, back in new/: in line
        where its id puts it (usually first), as if read from new/ at start; once,
        though a writer's hello may have read it from new/ already."""
        queue = self.queues.get(endpoint)
        if queue is not None:
            if message_id not in queue.waiting:
                _in_line(queue.waiting, message_id)
            self._dispatch(endpoint)

    def put_back(self, message_id: str, endpoint: str) -> None:
        """Return a claimed message nobody received to new/ (the writer's answer puts
        it first in line); until then it holds back its endpoint (FIFO). For a writer
        that is down it waits for its hello."""
        token = next(self._tokens)
        self.put_backs[token] = (message_id, endpoint)
        self._queue(endpoint).requeuing.add(message_id)
        shard = shard_of(endpoint, self.shards)
        if shard in self._up:
            self._outbox.append(PutBack(shard, token, message_id, endpoint))

    def put_back_done(self, token: int, *, ok: bool) -> tuple[str, str] | None:
        """The writer answered a put-back; the (id, endpoint) it was, None if the token
        is not a put-back's. Not ok: it never left new/ (a claim that did not happen),
        or it is gone; either way it is where the disk says."""
        put_back = self.put_backs.pop(token, None)
        if put_back is None:
            return None
        message_id, endpoint = put_back
        queue = self._queue(endpoint)
        queue.requeuing.discard(message_id)
        if ok:
            _in_line(queue.waiting, message_id)
        self._dispatch(endpoint)
        return put_back

    def _pop_claim(self, message_id: str, endpoint: str) -> int | None:
        """Forget a claim in flight; the subscription it was for, if it was in flight."""
        claims = self._claims.get(shard_of(endpoint, self.shards))
        return claims.pop((message_id, endpoint), None) if claims else None

    # ------------------------------------------------------------------ credit

    def subscribed(self, sub: Subscription, endpoints: list[str]) -> None:
        """A new consuming subscription: the endpoints it matches take turns."""
        self._feed(sub, endpoints)

    def feed_refilled(self) -> None:
        """Credit came back to subscriptions (acks, nacks, claims that handed nothing
        out): offer it to the starved endpoints each matches; claims released since the
        last pass go back in line first."""
        self.return_released()
        for sub in self.consumers.take_refilled():
            self._feed(sub, self._starved_for(sub))

    def _feed(self, sub: Subscription, endpoints: list[str]) -> None:
        """One message per endpoint in turn while the subscription has credit, so that
        a wildcard consumer of several backlogs drains them all."""
        while endpoints and sub.has_credit:
            endpoints = [e for e in endpoints if self._dispatch(e, limit=1)]

    def _starved_for(self, sub: Subscription) -> list[str]:
        """The starved endpoints a subscription's pattern matches, least recently served
        first."""
        if not has_wildcards(sub.pattern):
            endpoint = self._endpoints.get(sub.pattern)
            return [endpoint] if endpoint in self._starved else []
        return [
            e
            for e in self._starved
            if (subject := self._subjects.get(e)) is not None and matches(subject, sub.pattern)
        ]

    def _dispatch(self, endpoint: str, limit: int | None = None) -> bool:
        """Claim what waits in an endpoint's new/ for consumers with credit, oldest first,
        at most ``limit`` messages; True when it stopped at the limit with more waiting.

        An endpoint left with messages waiting is starved: credit that comes back to a
        subscription matching it is offered there (_feed), the least recently served
        endpoint first."""
        subject = self._subjects.get(endpoint)
        queue = self.queues.get(endpoint)
        if subject is None or queue is None:
            self._starved.pop(endpoint, None)
            return False
        shard = shard_of(endpoint, self.shards)
        if shard not in self._up or queue.requeuing:
            # Its writer's hello, or the put-back's answer, dispatches again: a message
            # put back is first in line (FIFO holds).
            return False
        sent = 0
        while (queue.returned or queue.waiting) and sent != limit:
            sub = self.consumers.pick_consumer(subject)
            if sub is None:
                break
            if queue.returned:  # handed out before: first in line, claimed again in cur/
                message_id, before = queue.returned.pop(0)
                self._reclaims[(message_id, endpoint)] = before
            else:
                message_id, before = queue.waiting.popleft(), 0
            self._outbox.append(Claim(shard, sub.id, message_id, endpoint, before))
            sent += 1
            queue.claiming += 1
            sub.inflight += 1
            self._claims.setdefault(shard, {})[(message_id, endpoint)] = sub.id
        left = bool(queue.waiting or queue.returned)
        if sent or not left:  # served: to the back of the line, if still in it
            self._starved.pop(endpoint, None)
        if left:
            self._starved.setdefault(endpoint)
        return sent == limit and left


def _in_order(returned: list[tuple[str, int]], message_id: str, deliveries: int) -> None:
    """Keep a returned message among the others in id order (oldest first), once."""
    if all(i != message_id for i, _ in returned):
        bisect.insort(returned, (message_id, deliveries))


def _in_line(waiting: deque[str], message_id: str) -> None:
    """Queue a message back where its id puts it: before every younger one waiting
    (usually first: it was claimed before them). Two put back in turn keep their order."""
    for position, other in enumerate(waiting):
        if other > message_id:
            waiting.insert(position, message_id)
            return
    waiting.append(message_id)
