"""The delivery ledger against a model of the Maildir, at thousands of steps a second.

The test plays the router's loop around the pure `Ledger` (broker/router/delivery.py) and the
real `Consumers`, and simulates each shard's writer as a queue of commands applied to
sets of ids per directory (new/, cur/, done, failed). Hypothesis picks the sequences:
publishes (concrete and wildcard, into new/ or stored claimed), subscriptions with
various credits, unsubscribes, clients that vanish holding messages, acks and nacks,
writers that run a few commands, die after doing some of them without answering, and
come back, publish deadlines that pass while a copy waits, endpoints registered and
unregistered, an operator's requeue of finished (dead-lettered) messages back to new/.
What must hold:

- at every step: no message is held by two consumers at once, every message handed out
  is claimed in cur/ at that moment, and says how many times it was handed out;
- per subscription and endpoint, messages arrive oldest first, except a message that
  was put back (handed to nobody and returned to new/), returned (its holder left,
  or its ack deadline passed) or requeued from the dead letters, which may come after
  younger ones; a requeued message's hand-outs are counted afresh;
- a message returned `max_deliveries` times ends failed;
- whenever everything has settled (writers up, their queues run dry): the ledger's
  queue of each endpoint is exactly its new/, oldest first; no subscription with credit
  matches an endpoint with messages in new/ or returned (nothing stalls); every message
  claimed in cur/ is held by a live session or returned (waiting to be handed out
  again), none claimed for nobody.

RELAY_LEDGER_EXAMPLES sets the number of sequences (default 300, a few seconds); a long
run: ``make soak-ledger`` (RELAY_LEDGER_EXAMPLES=50000, about 15 minutes). A failure
prints the shortest sequence hypothesis found, as Python steps, and the seed.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.router.consumers import CONSUME, Consumers
from broker.router.delivery import Claim, DeadLetter, Ledger, PutBack
from sdk.ids import new_id
from sdk.paths import shard_of
from sdk.subjects import endpoint_hash, matches

SHARDS = 2
SUBJECTS = ["m.a.e0", "m.a.e1", "m.b.e2", "m.b.e3", "m.c.e4"]
PATTERNS = [*SUBJECTS, "m.a.*", "m.*.e2", "m.>", "m.b.>"]
ENDPOINT = {s: endpoint_hash(s) for s in SUBJECTS}
SUBJECT_OF = {h: s for s, h in ENDPOINT.items()}
CLIENTS = [b"c0", b"c1", b"c2"]
EXAMPLES = int(os.environ.get("RELAY_LEDGER_EXAMPLES", "300"))
STEPS = {"sequences": 0, "steps": 0}  # reported at the end of the module


@dataclass
class Store:
    """A copy on its way to a writer: into new/, or claimed (cur/) for ``sub``."""

    job: int
    id: str
    endpoint: str
    sub: int | None


@dataclass
class Redrive:
    """An operator's requeue of a dead letter: the writer moves it back to new/."""

    id: str
    endpoint: str


Command = Claim | PutBack | DeadLetter | Store | Redrive
MAX_DELIVERIES = 3


@dataclass
class Disk:
    new: set[tuple[str, str]] = field(default_factory=set)  # (id, endpoint)
    cur: set[tuple[str, str]] = field(default_factory=set)  # claimed, not finished
    count: dict[tuple[str, str], int] = field(default_factory=dict)  # N in its name
    finished: set[tuple[str, str]] = field(default_factory=set)  # done or failed

    def waiting_in(self, endpoint: str) -> list[str]:
        return sorted(i for i, e in self.new if e == endpoint)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        STEPS["sequences"] += 1
        self.disk = Disk()
        self.consumers = Consumers()
        self.ledger = Ledger(self.consumers, SHARDS, self.disk.waiting_in, itertools.count(1))
        self.ledger.max_deliveries = MAX_DELIVERIES
        self.inbox: dict[int, deque[Command]] = {s: deque() for s in range(SHARDS)}
        self.full: set[int] = set()  # writers that take nothing (their queue is full)
        self.parked: dict[int, list[Store]] = {s: [] for s in range(SHARDS)}
        self.jobs = itertools.count(1)
        self.answered: set[int] = set()  # publish copies whose deadline passed
        self.handed: dict[tuple[str, str], int] = {}  # held now -> subscription
        self.times: dict[tuple[str, str], int] = {}  # hand-outs so far
        self.returned: set[tuple[str, str]] = set()  # ever handed out again
        self.deadline: dict[tuple[str, str], bool] = {}  # held with an ack deadline
        self.held: dict[int, list[tuple[str, str]]] = {}  # subscription -> in hand
        self.owner: dict[int, bytes] = {}  # subscription -> its client
        self.seen: dict[tuple[int, str], list[str]] = {}  # (sub, endpoint) -> ids in order
        self.put_back: set[tuple[str, str]] = set()  # ever returned to new/
        for shard in range(SHARDS):
            self.ledger.writer_up(shard)
        for subject in SUBJECTS[:3]:
            self.ledger.add_endpoint(ENDPOINT[subject], subject)
        self.registered = set(SUBJECTS[:3])

    # ------------------------------------------------------------------ the router's part

    def _pass(self) -> None:
        """The end of a router pass: credit given back is offered, the outbox sent."""
        self.ledger.feed_refilled()
        unsent = []
        for command in self.ledger.take_outbox():
            if self.ledger.is_up(command.shard) and command.shard not in self.full:
                self.inbox[command.shard].append(command)
            else:
                unsent.append(command)
        if unsent:
            self.ledger.unsent(unsent)

    def _hand_out(self, sub_id: int | None, message: tuple[str, str], deliveries: int) -> None:
        sub = self.consumers.subs.get(sub_id) if sub_id is not None else None
        if sub is None:  # its subscriber left meanwhile
            self.consumers.give_back(sub_id)
            self.ledger.hand_back(*message, deliveries - 1)
            return
        assert message in self.disk.cur, f"{message} handed out but not claimed in cur/"
        assert message not in self.handed, f"{message} held by two at once"
        assert deliveries == self.times.get(message, 0) + 1, f"{message} says {deliveries}"
        self.times[message] = deliveries
        if deliveries > 1:
            self.returned.add(message)
        self.handed[message] = sub.id
        self.deadline[message] = sub.ack_wait is not None
        self.held[sub.id].append(message)
        self.seen.setdefault((sub.id, message[1]), []).append(message[0])
        self.consumers.handed_out(sub, *message, "sender", deliveries, 0)

    def _finish(self, sub_id: int, message: tuple[str, str]) -> None:
        assert self.consumers.settled(self.owner[sub_id], *message) is not None
        del self.handed[message]
        self.disk.cur.discard(message)
        self.disk.finished.add(message)

    def _released(self, messages: list[tuple[str, str]]) -> None:
        """Messages their holder no longer holds (it left, or its deadline passed)."""
        for message in messages:
            sub_id = self.handed.pop(message)
            if sub_id in self.held and message in self.held[sub_id]:
                self.held[sub_id].remove(message)

    # ------------------------------------------------------------------ the writers

    def _run(self, shard: int, command: Command) -> None:
        """What the writer does and answers."""
        message = (command.id, command.endpoint)
        if isinstance(command, Store):
            (self.disk.cur if command.sub is not None else self.disk.new).add(message)
            if command.job in self.answered:
                self.ledger.stored_late(*message, claimed=command.sub is not None)
            elif command.sub is not None:
                self._hand_out(self.ledger.copy_settled(*message), message, 1)
            else:
                self.ledger.copy_settled(*message)
                self.ledger.stored_new(*message)
        elif isinstance(command, Claim):
            ok = self._claim(command, message)
            if self.ledger.claimed(command.sub, *message, ok=ok):
                self._hand_out(command.sub, message, command.deliveries + 1)
        elif isinstance(command, Redrive):
            if self._redrive(message):  # the router hears it: in line by its id
                self.ledger.requeued(*message)
        elif isinstance(command, DeadLetter):
            assert message not in self.handed, f"{message} dead-lettered from its holder"
            assert command.deliveries >= MAX_DELIVERIES
            if message in self.disk.cur:
                self.disk.cur.discard(message)
                self.disk.finished.add(message)
            self.ledger.dead_letter_done(command.token)
        else:
            ok = message in self.disk.cur and message not in self.handed
            assert message not in self.handed or message not in self.disk.cur, (
                f"{message} put back while {self.handed.get(message)} holds it"
            )
            if ok:
                self.disk.cur.discard(message)
                self.disk.new.add(message)
                self.put_back.add(message)
            self.ledger.put_back_done(command.token, ok=ok)

    def _redrive(self, message: tuple[str, str]) -> bool:
        """The writer's requeue of a dead letter: refused unless it is one (requeued
        twice, the second finds none)."""
        if message not in self.disk.finished:
            return False
        self.disk.finished.discard(message)
        self.disk.new.add(message)
        self.disk.count.pop(message, None)
        self.times[message] = 0  # hand-outs counted afresh
        self.put_back.add(message)  # back in line by its id, after younger ones went
        return True

    def _claim(self, command: Claim, message: tuple[str, str]) -> bool:
        """The writer's claim: from new/, or again in cur/ (a returned message)."""
        if command.deliveries == 0:
            ok = message in self.disk.new
            if ok:
                self.disk.new.discard(message)
                self.disk.cur.add(message)
        else:
            ok = message in self.disk.cur
            assert message not in self.handed, f"{message} claimed again from its holder"
        if ok:
            self.disk.count[message] = command.deliveries + 1
        return ok

    def _silently(self, command: Command) -> None:
        """A command done by a writer that died before answering."""
        message = (command.id, command.endpoint)
        if isinstance(command, Store):
            (self.disk.cur if command.sub is not None else self.disk.new).add(message)
        elif isinstance(command, Claim):
            self._claim(command, message)
        elif isinstance(command, DeadLetter) and message in self.disk.cur:
            self.disk.cur.discard(message)
            self.disk.finished.add(message)
        elif isinstance(command, Redrive):
            self._redrive(message)  # nobody is told: the writer's hello reads new/
        elif isinstance(command, PutBack) and message in self.disk.cur:
            assert message not in self.handed, f"{message} put back from its holder"
            self.disk.cur.discard(message)
            self.disk.new.add(message)
            self.put_back.add(message)

    # ------------------------------------------------------------------ rules

    @rule(subject=st.sampled_from(SUBJECTS))
    def register(self, subject: str) -> None:
        self.registered.add(subject)
        self.ledger.add_endpoint(ENDPOINT[subject], subject)
        self._pass()

    @rule(subject=st.sampled_from(SUBJECTS))
    def unregister(self, subject: str) -> None:
        self.registered.discard(subject)
        self.ledger.remove_endpoint(ENDPOINT[subject])
        self._pass()

    @rule(target_=st.sampled_from(PATTERNS), count=st.integers(1, 8))
    def publish(self, target_: str, count: int) -> None:
        endpoints = [ENDPOINT[s] for s in sorted(self.registered) if matches(s, target_)]
        for _ in range(count):
            job, message_id = next(self.jobs), new_id()
            for endpoint in endpoints:
                shard = shard_of(endpoint, SHARDS)
                sub = self.ledger.store_target(message_id, endpoint)
                store = Store(job, message_id, endpoint, sub.id if sub else None)
                if self.ledger.is_up(shard) and shard not in self.full:
                    self.inbox[shard].append(store)
                elif self.ledger.is_up(shard):  # a full queue: the copy fails now
                    self.answered.add(job)
                    self.ledger.copy_abandoned(message_id, endpoint, sent=False)
                else:  # kept for the writer's hello; stored claimed becomes new/
                    self.ledger.storing(message_id, endpoint)
                    store.sub = None
                    self.parked[shard].append(store)
        self._pass()

    @rule(
        client=st.sampled_from(CLIENTS),
        pattern=st.sampled_from(PATTERNS),
        credit=st.integers(1, 6),
        ack_wait=st.sampled_from([None, None, 1000]),
    )
    def subscribe(
        self, client: bytes, pattern: str, credit: int, ack_wait: int | None = None
    ) -> None:
        self.consumers.touch(client, 0)
        sub = self.consumers.subscribe(client, pattern, CONSUME, credit, 0, ack_wait)
        self.held[sub.id] = []
        self.owner[sub.id] = client
        endpoints = sorted(ENDPOINT[s] for s in self.registered if matches(s, pattern))
        self.ledger.subscribed(sub, endpoints)
        self._pass()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(sorted(self.held)))
        self.consumers.unsubscribe(sub_id)
        self._pass()

    @rule(client=st.sampled_from(CLIENTS))
    def client_vanishes(self, client: bytes) -> None:
        """Its session ends; what it holds is handed out again."""
        session = self.consumers.end_session(client)
        for sub_id in [s for s, c in self.owner.items() if c == client]:
            self.held.pop(sub_id, None)
            del self.owner[sub_id]
        if session is not None:
            self._released([m for m, s in self.handed.items() if self.owner.get(s) is None])
        self._pass()

    @rule()
    def ack_deadlines_pass(self) -> None:
        """Every claim held by a subscription with an ack deadline is taken back."""
        late = [m for m in self.handed if self.deadline[m]]
        self.consumers.overdue(10**12)
        self._released(late)
        self._pass()

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), count=st.integers(1, 4))
    def ack(self, data: st.DataObject, count: int) -> None:
        sub_id = data.draw(st.sampled_from(sorted(s for s, h in self.held.items() if h)))
        for message in self.held[sub_id][:count]:
            self._finish(sub_id, message)
        del self.held[sub_id][:count]
        self._pass()

    @rule(shard=st.integers(0, SHARDS - 1), count=st.integers(1, 20))
    def writer_runs(self, shard: int, count: int) -> None:
        for _ in range(count):
            if not self.inbox[shard]:
                break
            self._run(shard, self.inbox[shard].popleft())
            self._pass()

    @precondition(lambda self: any(self.ledger.is_up(s) for s in range(SHARDS)))
    @rule(shard=st.integers(0, SHARDS - 1), done=st.integers(0, 10), late=st.booleans())
    def writer_dies(self, shard: int, done: int, late: bool) -> None:
        """It did ``done`` of its queued commands, then died; their answers are lost, or
        (``late``) reach the router after it saw the writer go."""
        if not self.ledger.is_up(shard):
            return
        inbox = self.inbox[shard]
        executed = [inbox.popleft() for _ in range(min(done, len(inbox)))]
        for command in executed:
            self._silently(command)
        for command in [*executed, *inbox]:  # the router answers copies unavailable
            if isinstance(command, Store):
                self.answered.add(command.job)
        inbox.clear()
        self.ledger.writer_gone(shard)
        if late:
            for command in executed:
                self._answer_late(command)
        self._pass()

    def _answer_late(self, command: Command) -> None:
        message = (command.id, command.endpoint)
        if isinstance(command, Store):
            self.ledger.stored_late(*message, claimed=command.sub is not None)
        elif isinstance(command, Claim):
            assert not self.ledger.claimed(command.sub, *message, ok=message in self.disk.cur)
        elif isinstance(command, DeadLetter):
            self.ledger.dead_letter_done(command.token)
        elif isinstance(command, Redrive):
            pass  # its request was answered unavailable when the writer went
        else:
            self.ledger.put_back_done(command.token, ok=message in self.disk.new)

    @rule(shard=st.integers(0, SHARDS - 1))
    def writer_starts(self, shard: int) -> None:
        if self.ledger.is_up(shard):
            return
        self.ledger.writer_up(shard)
        for store in self.parked.pop(shard):
            if store.job not in self.answered:
                self.ledger.storing(store.id, store.endpoint)
                self.inbox[shard].append(store)
        self.parked[shard] = []
        self._pass()

    @precondition(lambda self: self.disk.finished)
    @rule(data=st.data())
    def operator_requeues_a_dead_letter(self, data: st.DataObject) -> None:
        """Sent to its writer if it is up and taking work (else refused unavailable),
        for an endpoint still registered (else refused by the router)."""
        message_id, endpoint = data.draw(st.sampled_from(sorted(self.disk.finished)))
        shard = shard_of(endpoint, SHARDS)
        registered = SUBJECT_OF[endpoint] in self.registered
        if registered and self.ledger.is_up(shard) and shard not in self.full:
            self.inbox[shard].append(Redrive(message_id, endpoint))
        self._pass()

    @rule(shard=st.integers(0, SHARDS - 1), full=st.booleans())
    def writer_queue_full(self, shard: int, full: bool) -> None:
        (self.full.add if full else self.full.discard)(shard)
        self._pass()

    @rule(shard=st.integers(0, SHARDS - 1), data=st.data())
    def a_publish_deadline_passes(self, shard: int, data: st.DataObject) -> None:
        """A copy still queued or parked is answered unavailable; if it is stored after
        all, its late answer must put it right."""
        waiting = [c for c in self.inbox[shard] if isinstance(c, Store)] + self.parked[shard]
        waiting = [c for c in waiting if c.job not in self.answered]
        if not waiting:
            return
        store = data.draw(st.sampled_from(waiting))
        self.answered.add(store.job)
        self.ledger.copy_abandoned(store.id, store.endpoint, sent=store in self.inbox[shard])
        self.parked[shard] = [c for c in self.parked[shard] if c is not store]
        self._pass()

    # ------------------------------------------------------------------ what must hold

    @invariant()
    def order_per_subscription_and_endpoint(self) -> None:
        STEPS["steps"] += 1  # hypothesis checks invariants after every step
        for (sub_id, endpoint), ids in self.seen.items():
            again = self.put_back | self.returned
            plain = [i for i in ids if (i, endpoint) not in again]
            assert plain == sorted(plain), f"sub {sub_id} got {SUBJECT_OF[endpoint]} out of order"

    def teardown(self) -> None:
        """Settle: writers up, queues not full, everything run; then check."""
        self.full.clear()
        self._pass()  # the next pass retries what a full queue refused
        for shard in range(SHARDS):
            self.writer_starts(shard)
        for _ in range(10_000):
            busy = [s for s in range(SHARDS) if self.inbox[s]]
            if not busy:
                break
            for shard in busy:
                self.writer_runs(shard, 50)
        else:
            raise AssertionError("the writers never ran dry")
        self._check_settled()

    def _check_settled(self) -> None:
        disk, ledger = self.disk, self.ledger
        for subject in SUBJECTS:
            endpoint = ENDPOINT[subject]
            queue = ledger.queues.get(endpoint)
            waiting = list(queue.waiting) if queue else []
            if subject in self.registered or queue is not None:
                assert waiting == disk.waiting_in(endpoint), (
                    f"{subject}: ledger waits {waiting}, new/ holds {disk.waiting_in(endpoint)}"
                )
            returned = sorted(i for i, _ in queue.returned) if queue else []
            if subject in self.registered and (waiting or returned):
                hungry = [
                    s.id
                    for s in self.consumers.subs.values()
                    if s.mode == CONSUME and s.has_credit and matches(subject, s.pattern)
                ]
                assert not hungry, f"{subject} has {len(waiting)} waiting; subs {hungry} idle"
        held = {m for session in self.consumers.sessions.values() for m in session.unacked}
        assert held == set(self.handed), "the model and the sessions disagree on who holds what"
        returned = {(i, e) for e, q in ledger.queues.items() for i, _ in q.returned}
        assert not held & returned, f"returned while held: {sorted(held & returned)}"
        stranded = disk.cur - held - returned
        assert not stranded, f"claimed for nobody: {sorted(stranded)}"
        for message in returned:
            assert self.times.get(message, 0) < MAX_DELIVERIES, f"{message} handed out too often"


LedgerMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_the_ledger_keeps_its_promises_against_a_model = LedgerMachine.TestCase


def teardown_module() -> None:
    print(f"\nledger model: {STEPS['sequences']} sequences, {STEPS['steps']} steps")


def test_a_claim_a_full_writer_refused_goes_to_a_consumer_with_credit():
    """Found by the model: a claim a full writer did not take gave its credit back to
    the one subscription it was for, and only that one was offered the message again;
    when its client left first, a message waited while another consumer had credit."""
    machine = LedgerMachine()
    machine.publish(count=1, target_="m.b.e2")
    for client in (b"c0", b"c0", b"c1"):
        machine.subscribe(client=client, credit=1, pattern="m.b.e2")
    machine.writer_dies(done=1, late=False, shard=0)
    machine.writer_queue_full(full=True, shard=0)
    machine.writer_starts(shard=0)  # the claim goes to one of c0's, and is refused
    machine.client_vanishes(client=b"c0")
    machine.teardown()  # c1's subscription has the message; nothing stalls
    assert list(machine.handed.values()) == [3]
