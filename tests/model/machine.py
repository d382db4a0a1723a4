"""The Hypothesis state machine: random operations on a real broker, each followed by a
wait until the system settles and a check of everything against the model.

One broker per sequence (a Hypothesis example): a failure shrinks to a short sequence
that starts from an empty data directory. The knobs are in knobs.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sdk.errors import Unavailable
from sdk.ids import new_id
from sdk.subjects import matches
from sdk.types import AccessRule, Envelope, PublishResult, RuleAction, default_budget
from tests.model.knobs import (
    CONSUMER,
    FETCH_ACK_WAITS,
    FROM_PATTERNS,
    PUBLISH_WAIT_S,
    RESTART_EVERY,
    SENDERS,
    SKIP,
    STATS,
    STRAY_KINDS,
    TARGETS,
    allowed,
    consume_pattern,
    counted,
    outcome,
)
from tests.model.model import Model, Seen
from tests.model.settle import fail, settle
from tests.model.snapshot import read_disk
from tests.model.world import HASHES, POOL, SUBJECT_OF, ClientHandle, Receipt, Sub, World


class DeliveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        STATS["sequences"] += 1
        self.world = World()
        self.model = Model(self.world)
        self.done = 0  # steps so far
        # The step of the last restart: restarts cost a second or more and Hypothesis
        # may enable few rules in a sequence, so at most one every RESTART_EVERY steps.
        self.restarted = {"router": -RESTART_EVERY, "writer": -RESTART_EVERY}
        self.relayed: list[Envelope] = []  # messages handed in from another node

    def teardown(self) -> None:
        self._count_events()
        self.world.close()

    def _count_events(self) -> None:
        """What the sequence exercised of the consumer's contract, for the run's summary."""
        events = STATS["events"]
        with self.world.lock:
            receipts = [r for s in self.world.subs if s.mode != "observe" for r in s.receipts]
        counts = {
            "hand-outs": len(receipts),
            "handed out again": sum(1 for r in receipts if r.deliveries > 1),
            "fetched": sum(1 for r in receipts if r.message is not None),
            "answers refused": sum(1 for r in receipts if r.refused_at is not None),
            "max_deliveries": self.model.dead_letter_codes().count("max_deliveries"),
        }
        for name, count in counts.items():
            events[name] = events.get(name, 0) + count

    # ------------------------------------------------------------------ helpers

    @property
    def open_clients(self) -> list:
        return [c for c in self.world.clients if not c.closed]

    def live(self, *modes: str) -> list[Sub]:
        return [s for s in self.world.subs if not s.ended and s.mode in modes]

    def holding(self) -> list[Sub]:
        """Subscriptions whose handler holds what it is pushed (in this process)."""
        return [
            s
            for s in self.world.subs
            if s.client
            and s.mode == "consume"
            and s.behaviour == "hold"
            and not s.released.is_set()
        ]

    def processes(self) -> list[Sub]:
        """Consumer processes not killed (live, or silent)."""
        return [s for s in self.world.subs if s.mode == "process" and s.killed_at is None]

    def fetched(self) -> list[Receipt]:
        """Messages fetched by open clients and not answered yet."""
        with self.world.lock:
            return [
                r
                for s in self.world.subs
                if s.mode == "fetch" and s.client is not None and not s.client.closed
                for r in s.receipts
                if r.handled is None and r.refused_at is None
            ]

    def note(self, text: str) -> None:
        note(text)
        self.world.steps.append(f"  # {text}")

    def _pick(self, items: list, which: int) -> Any:
        return items[which % len(items)]

    def _ending(self, subs: list[Sub]) -> None:
        """Subscriptions are about to end: a claim in flight may go back to new/ and
        reach another consumer after later messages, so their endpoints start a new
        order epoch; observers stop covering publishes."""
        for sub in subs:
            if sub.mode == "observe":
                sub.windows[-1] = (sub.windows[-1][0], self.model.seq + 1)
            elif sub.mode != "fetch":
                self._new_order_epoch(h for s, h in HASHES.items() if matches(s, sub.pattern))

    def _new_order_epoch(self, endpoints: Any) -> None:
        with self.world.lock:
            for h in set(endpoints):
                self.world.order_epoch[h] += 1

    def _published(self, records: list[tuple[str, str, Any]], *, ordered: bool) -> None:
        wrong = []
        for target, sender, result in records:
            wrong += self.model.published(target, sender, result, ordered=ordered)
        if wrong:
            fail(self.world, self.model, "publish answered wrongly", wrong)

    @invariant()
    def settled(self) -> None:
        STATS["steps"] += 1
        settle(self.world, self.model)

    # ------------------------------------------------------------------ endpoints, policy

    @initialize(
        subjects=st.lists(st.sampled_from(POOL), min_size=1, max_size=6, unique=True),
        backlog=st.integers(0, 12),
        consumers=st.lists(CONSUMER, max_size=3),
        processes=st.lists(st.tuples(st.sampled_from(TARGETS), st.integers(1, 5)), max_size=1),
    )
    @counted
    def setup(
        self,
        subjects: list[str],
        backlog: int,
        consumers: list[tuple[Any, ...]],
        processes: list[tuple[str, int]],
    ) -> None:
        """Endpoints, a backlog (a burst to m.>), and consumers from the start:
        Hypothesis enables a random subset of the rules in each sequence, so one that has
        to publish, open a client, subscribe, then release or unsubscribe (or spawn a
        consumer process, then kill it) would otherwise rarely get that far."""
        for subject in subjects:
            self._register(subject)
        if backlog:
            self.publish(publisher=0, sender=SENDERS[0], to="m.>", count=backlog)
        for consumer in consumers:
            self._subscribe(0, *consumer)
        for pattern, credit in processes:
            self._spawn(pattern, credit)

    @allowed("register")
    @rule(subject=st.sampled_from(POOL))
    @counted
    def register(self, subject: str) -> None:
        self._register(subject)

    def _register(self, subject: str) -> None:
        info = self.world.checker.register_endpoint(subject)
        assert info.hash == HASHES[subject]
        self.model.registered[subject] = info.hash

    @allowed("unregister")
    @precondition(lambda self: self.model.registered)
    @rule(which=st.integers(0, 5))
    @counted
    def unregister(self, which: int) -> None:
        subject = self._pick(sorted(self.model.registered), which)
        self.note(f"unregister {subject}")
        assert self.world.checker.unregister_endpoint(subject)
        del self.model.registered[subject]

    @allowed("set_default_credit")
    @rule(credit=st.sampled_from((64, 1, 2, 3, 8)))
    @counted
    def set_default_credit(self, credit: int) -> None:
        self.world.checker.set_config({"limits": {"defaultCredit": credit}})
        self.model.default_credit = credit

    @allowed("deny")
    @precondition(lambda self: len(self.model.rules) < 3)
    @rule(sender=st.sampled_from(FROM_PATTERNS), to=st.sampled_from(TARGETS))
    @counted
    def deny(self, sender: str, to: str) -> None:
        if (sender, to) not in self.model.rules:
            self.world.checker.add_rule(AccessRule(sender, to, RuleAction.DENY, 10))
            self.model.rules.append((sender, to))

    @allowed("allow_again")
    @precondition(lambda self: self.model.rules)
    @rule(which=st.integers(0, 2))
    @counted
    def allow_again(self, which: int) -> None:
        sender, target = self.model.rules.pop(which % len(self.model.rules))
        assert self.world.checker.remove_rule(sender, target)

    # ------------------------------------------------------------------ publishing

    @allowed("publish")
    @rule(
        publisher=st.integers(0, 2),
        sender=st.sampled_from(SENDERS),
        to=st.sampled_from(TARGETS),
        count=st.one_of(st.just(1), st.integers(2, 60)),
    )
    @counted
    def publish(self, publisher: int, sender: str, to: str, count: int) -> None:
        client = self.world.publishers[publisher]
        if count == 1:  # the synchronous call
            try:
                result: Any = client.publish(to, {"n": 0}, sender=sender, timeout=PUBLISH_WAIT_S)
            except BaseException as exc:
                result = exc
            self._published([(to, sender, result)], ordered=True)
            return
        futures = [client.publish_async(to, {"n": n}, sender=sender) for n in range(count)]
        self._published([(to, sender, outcome(f)) for f in futures], ordered=True)

    @allowed("relay_in")
    @rule(
        sender=st.sampled_from(SENDERS),
        to=st.sampled_from(POOL),
        again=st.one_of(st.none(), st.integers(0, 7)),
        deliveries=st.integers(1, 3),
    )
    @counted
    def relay_in(self, sender: str, to: str, again: int | None, deliveries: int) -> None:
        """A message relayed from another node (ingest, as a federation bridge hands it
        in), new or one handed in before, delivered 1-3 times at once as JetStream may:
        stored once per endpoint however often it comes. The first delivery is answered
        like a publish (nothing refused while everything runs); those at the same time
        may be told to come back (``unavailable``: a copy is being stored)."""
        first_time = again is None or not self.relayed
        if first_time:
            now = int(time.time() * 1000)
            envelope = Envelope(new_id(), to, sender, None, default_budget(now), now, {"n": 0})
            self.relayed.append(envelope)
        else:
            envelope = self._pick(self.relayed, again)
            self.note(f"again {envelope.id} to {envelope.subject}")
        checker = self.world.checker
        futures = [
            checker.ingest_async(envelope, [envelope.subject], node="far")
            for _ in range(deliveries)
        ]
        results = [outcome(f) for f in futures]
        if first_time:
            self._published([(envelope.subject, envelope.sender, results[0])], ordered=False)
        elif isinstance(results[0], PublishResult):
            wrong = self.model.relayed_again(envelope.subject, envelope.sender, results[0])
            if wrong:
                fail(self.world, self.model, "ingest answered wrongly", wrong)
        else:
            fail(self.world, self.model, "ingest refused", [repr(results[0])])
        others = [r for r in results[1:] if not isinstance(r, PublishResult | Unavailable)]
        if others:
            fail(self.world, self.model, "a repeated ingest answered wrongly", [*map(repr, others)])

    @allowed("publish_concurrently")
    @rule(
        jobs=st.lists(
            st.tuples(st.sampled_from(SENDERS), st.sampled_from(TARGETS), st.integers(1, 30)),
            min_size=2,
            max_size=3,
        )
    )
    @counted
    def publish_concurrently(self, jobs: list[tuple[str, str, int]]) -> None:
        done: list[list[tuple[str, str, Any]]] = [[] for _ in jobs]

        def run(k: int, sender: str, target: str, count: int) -> None:
            client = self.world.publishers[k]
            futures = [client.publish_async(target, {"n": n}, sender=sender) for n in range(count)]
            done[k] = [(target, sender, outcome(f)) for f in futures]

        threads = [threading.Thread(target=run, args=(k, *job)) for k, job in enumerate(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self._published([record for records in done for record in records], ordered=False)

    # ------------------------------------------------------------------ consuming

    @allowed("open_client")
    @precondition(lambda self: len(self.open_clients) < 4)
    @rule()
    @counted
    def open_client(self) -> None:
        self.world.open_client()

    @allowed("close_client")
    @precondition(lambda self: self.open_clients)
    @rule(which=st.integers(0, 3))
    @counted
    def close_client(self, which: int) -> None:
        handle = self._pick(self.open_clients, which)
        self.note(f"close {handle.name}")
        self._ending([s for s in handle.subs if not s.ended])
        self.world.close_client(handle)

    def _client(self, which: int) -> ClientHandle:
        """One of the open clients; a new one when none is open."""
        return self._pick(self.open_clients or [self.world.open_client()], which)

    @allowed("subscribe")
    @rule(which=st.integers(0, 3), consumer=CONSUMER)
    @counted
    def subscribe(self, which: int, consumer: tuple[Any, ...]) -> None:
        self._subscribe(which, *consumer)

    def _subscribe(
        self,
        which: int,
        pattern: str,
        behaviour: str,
        credit: int | None,
        ack_wait: float | None,
    ) -> None:
        pattern = consume_pattern(pattern)
        handle = self._client(which)
        sub = self.world.subscribe(
            handle, pattern, behaviour, credit, self.model.default_credit, ack_wait
        )
        self.note(f"{sub.name}")

    @allowed("fetch")
    @rule(
        which=st.integers(0, 3),
        pattern=st.sampled_from(TARGETS),
        batch=st.integers(1, 5),
        wait=st.sampled_from((0.0, 0.2)),
        ack_wait=st.sampled_from(FETCH_ACK_WAITS),
        then=st.sampled_from((None, None, "ack", "nack", "in_progress")),
    )
    @counted
    def fetch(
        self,
        which: int,
        pattern: str,
        batch: int,
        wait: float,
        ack_wait: float | None,
        then: str | None,
    ) -> None:
        """Pull: claim up to ``batch`` of what waits; the client holds them until it
        answers (``then``, at once, or `answer` later), closes, or their ack deadline
        passes."""
        pattern = consume_pattern(pattern)
        handle = self._client(which)
        waiting = self._waiting_for(pattern)
        try:
            sub = self.world.fetch(handle, pattern, batch, wait, ack_wait)
        except Exception as exc:
            fail(self.world, self.model, "fetch failed", [f"fetch({pattern!r}): {exc!r}"])
        self.note(f"{sub.name}: {[(r.id, r.deliveries) for r in sub.receipts]}")
        if len(sub.receipts) > batch:
            fail(self.world, self.model, "fetch returned too much", [sub.name])
        if waiting and not sub.receipts:
            fail(
                self.world,
                self.model,
                "fetch returned nothing",
                [f"{sub.name} got nothing while new/ held {waiting[:8]}"],
            )
        if then is not None:
            for receipt in list(sub.receipts):
                self._answer(receipt, then)

    def _waiting_for(self, pattern: str) -> list[str]:
        """What waits in new/ for the endpoints a fetch of ``pattern`` takes from, when
        nothing else can take it meanwhile (no consumer with an ack deadline, whose
        credit comes back by itself)."""
        endpoints = [h for s, h in self.model.registered.items() if matches(s, pattern)]
        timed = [
            s
            for s in self.live("consume")
            if s.ack_wait is not None and any(matches(SUBJECT_OF[h], s.pattern) for h in endpoints)
        ]
        if timed:
            return []
        disk = read_disk(self.world.broker.home.mailboxes, endpoints)
        return [i for h in endpoints for i in disk.ids(h, "new")]

    @allowed("answer")
    @precondition(lambda self: self.fetched())
    @rule(which=st.integers(0, 15), how=st.sampled_from(("ack", "nack", "in_progress")))
    @counted
    def answer(self, which: int, how: str) -> None:
        """Answer a fetched message (confirmed): accepted while its client holds it,
        refused (invalid_state) once the router took it back."""
        self._answer(self._pick(self.fetched(), which), how)

    def _answer(self, receipt: Receipt, how: str) -> None:
        lo, hi = self.model.window(Seen.of(receipt))
        called = time.monotonic()
        try:
            result = self.world.answer(receipt, how)
        except Exception as exc:
            fail(self.world, self.model, f"{how} failed", [f"{receipt.id}: {exc!r}"])
        returned = time.monotonic()
        what = f"{how} {receipt.id} (hand-out {receipt.deliveries} to {receipt.sub.name})"
        self.note(f"{what}: {result}")
        if result == "ok" and called > hi:
            fail(
                self.world,
                self.model,
                "an answer was accepted for a hand-out the router had taken back",
                [
                    f"{what} at {self.world.clock(called)}: taken back by {self.world.clock(hi)}"
                    + (
                        " (known: a claim named after a router restart has no ack deadline?"
                        " RELAY_MODEL_SKIP=resumed_ack_wait)"
                        if any(k > receipt.at for k, _ in self.world.restarts)
                        else ""
                    )
                ],
            )
        if result == "refused" and returned < lo:
            fail(
                self.world,
                self.model,
                "an answer was refused while its client held the message",
                [f"{what} at {self.world.clock(called)}: held until {self.world.clock(lo)}"],
            )

    @allowed("observe")
    @rule(which=st.integers(0, 3), pattern=st.sampled_from(TARGETS))
    @counted
    def observe(self, which: int, pattern: str) -> None:
        sub = self.world.observe(self._client(which), pattern, self.model.seq + 1)
        self.note(f"{sub.name}")

    @allowed("unsubscribe")
    @precondition(lambda self: self.live("consume", "observe"))
    @rule(which=st.integers(0, 7))
    @counted
    def unsubscribe(self, which: int) -> None:
        sub = self._pick(self.live("consume", "observe"), which)
        self.note(f"unsubscribe {sub.name}")
        self._ending([sub])
        self.world.end(sub)

    @allowed("release")
    @precondition(lambda self: self.holding())
    @rule(which=st.integers(0, 7))
    @counted
    def release(self, which: int) -> None:
        sub = self._pick(self.holding(), which)
        self.note(f"release {sub.name}")
        sub.released.set()

    @allowed("spawn_consumer")
    @precondition(lambda self: len(self.live("process")) < 2 and len(self.processes()) < 3)
    @rule(pattern=st.sampled_from(TARGETS), credit=st.integers(1, 5))
    @counted
    def spawn_consumer(self, pattern: str, credit: int) -> None:
        self._spawn(pattern, credit)

    def _spawn(self, pattern: str, credit: int) -> None:
        sub = self.world.spawn_consumer(consume_pattern(pattern), credit)
        self.note(f"{sub.name}")

    @allowed("kill_consumer")
    @precondition(lambda self: self.processes())
    @rule(which=st.integers(0, 2))
    @counted
    def kill_consumer(self, which: int) -> None:
        """kill -9 a consumer process (live or silent): what it held is handed out again."""
        sub = self._pick(self.processes(), which)
        self.note(f"kill -9 {sub.name}")
        self._ending([sub])
        self.world.kill_consumer(sub)

    @allowed("silence_consumer")
    @precondition(lambda self: self.live("process"))
    @rule(which=st.integers(0, 1))
    @counted
    def silence_consumer(self, which: int) -> None:
        """A consumer process stops its heartbeat but stays connected: after the session
        timeout the router ends its session and hands out again what it held."""
        sub = self._pick(self.live("process"), which)
        self.note(f"silence {sub.name}")
        self._ending([sub])
        self.world.silence_consumer(sub)

    @allowed("set_max_deliveries")
    @rule(value=st.sampled_from((2, 3, 5)))
    @counted
    def set_max_deliveries(self, value: int) -> None:
        self.world.set_max_deliveries(value)

    # ------------------------------------------------------------------ faults

    @allowed("restart_writer")
    @precondition(lambda self: self.done - self.restarted["writer"] >= RESTART_EVERY)
    @rule(
        shard=st.integers(0, 1),
        during=st.one_of(
            st.none(),
            st.tuples(
                st.sampled_from(SENDERS),
                st.sampled_from(TARGETS),
                st.sampled_from((0.0, 0.05, 0.3, 1.0)),
            ),
        ),
    )
    @counted
    def restart_writer(self, shard: int, during: tuple[str, str, float] | None) -> None:
        """kill -9 a writer and start it again; maybe publish while it is down (the
        publish must wait for the writer, within its deadline, and succeed)."""
        self.restarted["writer"] = self.done
        self._new_order_epoch(h for h in HASHES.values() if int(h, 16) % 2 == shard)
        if during is None or "publish_while_down" in SKIP:
            self.world.restart_writer(shard, None, 0.0)
            return
        sender, target, delay = during
        publisher = self.world.publishers[2]
        result = self.world.restart_writer(
            shard,
            lambda: publisher.publish(target, {"n": 0}, sender=sender, timeout=PUBLISH_WAIT_S),
            delay,
        )
        self._published([(target, sender, result)], ordered=False)

    @allowed("restart_router")
    @precondition(lambda self: self.done - self.restarted["router"] >= RESTART_EVERY)
    @rule(writers=st.sampled_from((None, None, "together", "after_hello")))
    @counted
    def restart_router(self, writers: str | None) -> None:
        """kill -9 the router (and maybe its writers, started again with it or once the
        clients said hello) and start it again: clients say hello again naming what they
        hold (theirs still; what nobody names is handed out again one session timeout
        later) and renew their subscriptions."""
        if writers == "after_hello" and "late_writers" in SKIP:
            writers = "together"
        self.restarted["router"] = self.done
        if writers is not None:
            self.restarted["writer"] = self.done
        live = [s for s in self.world.subs if not s.ended and s.mode != "fetch"]
        self._ending(live)
        self._new_order_epoch(HASHES.values())  # its queues are read again from new/
        self.world.restart_router(writers)
        for sub in live:  # the new router grants credit afresh to the renewed ones
            sub.granted = sub.credit or self.model.default_credit
            sub.router_epoch = self.world.router_epoch
        settle(self.world, self.model)
        for sub in live:
            if sub.mode == "observe":
                sub.windows.append((self.model.seq + 1, None))

    @allowed("stray_connection")
    @rule(
        index=st.integers(0, 4),
        kind=st.sampled_from(STRAY_KINDS),
        junk=st.booleans(),
        hold=st.sampled_from((0.0, 0.05, 0.3)),
    )
    @counted
    def stray_connection(self, index: int, kind: int, junk: bool, hold: float) -> None:
        name = self.world.stray(index, kind, junk, hold, shards="stray_shard" not in SKIP)
        self.note(f"stray {zmq.SocketType(kind).name} to run/{name}")
