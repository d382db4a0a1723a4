"""The Hypothesis state machine: random operations on a real broker, each followed by a
wait until the system settles and a check of everything against the model.

One broker per sequence (a Hypothesis example): a failure shrinks to a short sequence
that starts from an empty data directory. Knobs (environment): RELAY_MODEL_EXAMPLES,
RELAY_MODEL_STEPS, RELAY_MODEL_SETTLE_S, RELAY_MODEL_PHASES (e.g. "generate,shrink"),
RELAY_MODEL_SKIP (what to leave out, comma-separated: a rule's name, e.g.
"stray_connection,restart_writer", or one of the known bugs' triggers: "stray_shard"
(stray connections to run/shard-K.sock), "publish_while_down" (publishes while a writer
restarts), "wildcard_consume" (consuming subscriptions with a wildcard pattern)).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from concurrent.futures import Future
from typing import Any

import zmq
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sdk.subjects import matches
from sdk.types import AccessRule, RuleAction
from tests.harness import ROOT
from tests.model.model import Model
from tests.model.settle import fail, settle
from tests.model.world import HASHES, POOL, Sub, World

SENDERS = ("s.alice", "s.bob", "s.carol")
PATTERNS = ("m.a.*", "m.>", "m.*.e0", "m.b.*", "m.*.e1", "*.c.*")
TARGETS = POOL + PATTERNS
FROM_PATTERNS = ("s.alice", "s.*", "s.bob", ">")
STRAY_KINDS = (zmq.PULL, zmq.PUSH, zmq.DEALER, zmq.SUB, zmq.REQ)
PUBLISH_WAIT_S = 15.0  # a publish is answered within its 10 s deadline
SKIP = set(filter(None, os.environ.get("RELAY_MODEL_SKIP", "").split(",")))
STATS: dict[str, Any] = {"sequences": 0, "steps": 0, "rules": {}}  # in this process


def model_settings() -> settings:
    phases = os.environ.get("RELAY_MODEL_PHASES")
    return settings(
        max_examples=int(os.environ.get("RELAY_MODEL_EXAMPLES", "4")),
        stateful_step_count=int(os.environ.get("RELAY_MODEL_STEPS", "12")),
        deadline=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=DirectoryBasedExampleDatabase(ROOT / ".hypothesis" / "relay-model"),
        print_blob=True,
        report_multiple_bugs=False,
        phases=[Phase[p] for p in phases.split(",")] if phases else tuple(Phase),
    )


def counted(step: Any) -> Any:
    """Count the rule's runs in STATS["rules"]; write it into the sequence's log (kept
    by the world, shown by a failure even when Hypothesis cannot replay it)."""

    @functools.wraps(step)
    def run(machine: DeliveryMachine, **kwargs: Any) -> Any:
        STATS["rules"][step.__name__] = STATS["rules"].get(step.__name__, 0) + 1
        arguments = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
        machine.world.steps.append(f"{step.__name__}({arguments})")
        return step(machine, **kwargs)

    return run


def allowed(name: str) -> Any:
    return precondition(lambda self: name not in SKIP)


def consume_pattern(pattern: str) -> str:
    """The pattern itself, or a concrete subject when wildcard consumers are skipped."""
    if "wildcard_consume" in SKIP and pattern not in POOL:
        return POOL[TARGETS.index(pattern) % len(POOL)]
    return pattern


def outcome(future: Future) -> Any:
    try:
        return future.result(PUBLISH_WAIT_S)
    except BaseException as exc:
        return exc


class DeliveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        STATS["sequences"] += 1
        self.world = World()
        self.model = Model(self.world)

    def teardown(self) -> None:
        self.world.close()

    # ------------------------------------------------------------------ helpers

    @property
    def open_clients(self) -> list:
        return [c for c in self.world.clients if not c.closed]

    def live(self, *modes: str) -> list[Sub]:
        return [s for s in self.world.subs if not s.ended and s.mode in modes]

    def note(self, text: str) -> None:
        note(text)
        self.world.steps.append(f"  # {text}")

    def _pick(self, items: list, which: int) -> Any:
        return items[which % len(items)]

    def _fail(self, title: str, lines: list[str]) -> None:
        fail(self.world, self.model, title, lines)

    def _ending(self, subs: list[Sub]) -> None:
        """Subscriptions are about to end: a claim in flight may go back to new/ and
        reach another consumer after later messages, so their endpoints start a new
        order epoch; observers stop covering publishes."""
        for sub in subs:
            if sub.mode == "observe":
                sub.windows[-1] = (sub.windows[-1][0], self.model.seq + 1)
            else:
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
            self._fail("publish answered wrongly", wrong)

    def settle(self) -> None:
        settle(self.world, self.model)

    @invariant()
    def settled(self) -> None:
        STATS["steps"] += 1
        self.settle()

    # ------------------------------------------------------------------ endpoints, policy

    @initialize(subjects=st.lists(st.sampled_from(POOL), min_size=1, max_size=6, unique=True))
    @counted
    def setup(self, subjects: list[str]) -> None:
        for subject in subjects:
            self._register(subject)

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
        target = to
        client = self.world.publishers[publisher]
        if count == 1:
            try:
                result: Any = client.publish(
                    target, {"n": 0}, sender=sender, timeout=PUBLISH_WAIT_S
                )
            except BaseException as exc:
                result = exc
            self._published([(target, sender, result)], ordered=True)
            return
        futures = [client.publish_async(target, {"n": n}, sender=sender) for n in range(count)]
        self._published([(target, sender, outcome(f)) for f in futures], ordered=True)

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

    @allowed("subscribe")
    @precondition(lambda self: self.open_clients)
    @rule(
        which=st.integers(0, 3),
        pattern=st.sampled_from(TARGETS),
        behaviour=st.sampled_from(("ack", "nack", "hold")),
        credit=st.one_of(st.none(), st.integers(1, 8)),
    )
    @counted
    def subscribe(self, which: int, pattern: str, behaviour: str, credit: int | None) -> None:
        handle = self._pick(self.open_clients, which)
        pattern = consume_pattern(pattern)
        sub = self.world.subscribe(handle, pattern, behaviour, credit, self.model.default_credit)
        self.note(f"{sub.name}")

    @allowed("observe")
    @precondition(lambda self: self.open_clients)
    @rule(which=st.integers(0, 3), pattern=st.sampled_from(TARGETS))
    @counted
    def observe(self, which: int, pattern: str) -> None:
        sub = self.world.observe(self._pick(self.open_clients, which), pattern, self.model.seq + 1)
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
    @precondition(
        lambda self: any(
            s.behaviour == "hold" and not s.released.is_set() for s in self.world.subs if s.client
        )
    )
    @rule(which=st.integers(0, 7))
    @counted
    def release(self, which: int) -> None:
        held = [
            s
            for s in self.world.subs
            if s.client and s.behaviour == "hold" and not s.released.is_set()
        ]
        sub = self._pick(held, which)
        self.note(f"release {sub.name}")
        sub.released.set()

    @allowed("spawn_consumer")
    @precondition(lambda self: len(self.live("process")) < 2)
    @rule(pattern=st.sampled_from(TARGETS), credit=st.integers(1, 5))
    @counted
    def spawn_consumer(self, pattern: str, credit: int) -> None:
        sub = self.world.spawn_consumer(consume_pattern(pattern), credit)
        self.note(f"{sub.name}")

    @allowed("kill_consumer")
    @precondition(lambda self: self.live("process"))
    @rule(which=st.integers(0, 1))
    @counted
    def kill_consumer(self, which: int) -> None:
        sub = self._pick(self.live("process"), which)
        self.note(f"kill -9 {sub.name}")
        self._ending([sub])
        self.world.kill_consumer(sub)

    # ------------------------------------------------------------------ faults

    @allowed("restart_writer")
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
    @rule()
    @counted
    def restart_router(self) -> None:
        """kill -9 the router and start it again: clients renew their subscriptions."""
        live = [s for s in self.world.subs if not s.ended]
        self._ending(live)
        self._new_order_epoch(HASHES.values())  # its queues are read again from new/
        self.world.restart_router()
        self.model.router_started = time.monotonic()
        for sub in live:  # the new router grants credit afresh to the renewed ones
            sub.granted = sub.credit or self.model.default_credit
            sub.router_epoch = self.world.router_epoch
        self.settle()
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
