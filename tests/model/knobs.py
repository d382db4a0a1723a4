"""The state machine's knobs, counters, value lists and small helpers.

Knobs (environment; docs/testing.md): RELAY_MODEL_EXAMPLES, RELAY_MODEL_STEPS,
RELAY_MODEL_PHASES (e.g. "generate,shrink"), RELAY_MODEL_SKIP (what to leave out,
comma-separated: a rule's name, e.g. "stray_connection,restart_writer", or the trigger
of a bug one wants out of the way while exploring: "stray_shard" (stray connections to
run/shard-K.sock), "publish_while_down" (publishes while a writer restarts),
"wildcard_consume" (consuming subscriptions with a wildcard pattern),
"late_writers" (router restarts whose writers come back after the clients said hello),
or an expectation to relax: "resumed_ack_wait" (a claim its client named after a router
restart may be kept past its ack deadline), "resume_race" (a claim its live client
named after a router restart may be handed out again one session timeout later, as an
orphan: its hello came before the writer's)); settle.py reads RELAY_MODEL_STUCK_S and
RELAY_MODEL_SETTLE_S, world.py RELAY_MODEL_SESSION_MS.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import Future
from typing import Any

import zmq
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import precondition

from tests.harness import ROOT
from tests.model.world import POOL

SENDERS = ("s.alice", "s.bob", "s.carol")
PATTERNS = ("m.a.*", "m.>", "m.*.e0", "m.b.*", "m.*.e1", "*.c.*")
TARGETS = POOL + PATTERNS
FROM_PATTERNS = ("s.alice", "s.*", "s.bob", ">")
STRAY_KINDS = (zmq.PULL, zmq.PUSH, zmq.DEALER, zmq.SUB, zmq.REQ)
RESTART_EVERY = 4  # steps at least from one restart of a process to the next
PUBLISH_WAIT_S = 15.0  # a publish is answered within its 10 s deadline
# A consuming subscription: (pattern, behaviour, credit or None for the default, ack
# deadline in seconds or None). A held message whose deadline passes is handed out
# again (often to the same subscription, whose credit it gives back), until
# delivery.maxDeliveries makes it a dead letter.
CONSUMER = st.tuples(
    st.sampled_from(TARGETS),
    st.sampled_from(("ack", "nack", "hold")),
    st.one_of(st.none(), st.integers(1, 8)),
    st.sampled_from((None, None, None, 1.0, 2.0)),
)
FETCH_ACK_WAITS = (None, None, 0.5, 1.0, 2.0)  # a fetch's ack deadline, seconds
SKIP = set(filter(None, os.environ.get("RELAY_MODEL_SKIP", "").split(",")))
# In this process: sequences, steps, runs of each rule, and events of the consumer's
# contract seen (hand-outs, hand-outs again, fetched messages, ...).
STATS: dict[str, Any] = {"sequences": 0, "steps": 0, "rules": {}, "events": {}}


def model_settings() -> settings:
    phases = os.environ.get("RELAY_MODEL_PHASES")
    return settings(
        max_examples=int(os.environ.get("RELAY_MODEL_EXAMPLES", "8")),
        stateful_step_count=int(os.environ.get("RELAY_MODEL_STEPS", "20")),
        deadline=None,
        derandomize=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
        database=DirectoryBasedExampleDatabase(ROOT / ".hypothesis" / "relay-model"),
        print_blob=True,
        report_multiple_bugs=False,
        phases=[Phase[p] for p in phases.split(",")] if phases else tuple(Phase),
    )


def counted(step: Any) -> Any:
    """Count the rule's runs in STATS["rules"]; write it into the sequence's log (kept
    by the world, shown by a failure even when Hypothesis cannot replay it)."""

    @functools.wraps(step)
    def run(machine: Any, **kwargs: Any) -> Any:
        STATS["rules"][step.__name__] = STATS["rules"].get(step.__name__, 0) + 1
        arguments = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
        machine.world.steps.append(f"{machine.world.clock()} {step.__name__}({arguments})")
        machine.done += 1
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
