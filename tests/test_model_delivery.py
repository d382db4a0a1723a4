"""The stateful model test of delivery through a real broker (tests/model/, docs/testing.md).

Random sequences of operations (endpoints, publishes and bursts, consumers that ack, nack
or hold, some with an ack deadline, fetches and their confirmed answers, observers,
consumer processes killed with SIGKILL or silenced, writer and router restarts under
consumers that hold messages, stray connections to the sockets, credit, access rules and
delivery.maxDeliveries) each followed by a wait until the broker settles and a check of
the promise (the consumer's half as docs/architecture.md, "The life of a claim", states
it):

- every copy answered "delivered" ends done (acked), a dead letter (nacked: the
  handler's error; or `max_deliveries` once it was released after maxDeliveries
  hand-outs), held by a live consumer, or waiting: in new/, or released and waiting in
  cur/ to be handed out again; never held by a dead consumer (closed, killed, silent)
  past the session timeout and a sweep, nor past its ack deadline;
- a copy is held by one consumer at a time: handed out again only once its holder can
  have lost it (its client closed, its process was killed or went silent, its ack
  deadline passed, or it was an orphan nobody named after a router restart), never
  after its answer was applied; a live client keeps what it holds across a router
  restart and its answers after it count;
- `deliveries` is 1 the first time a copy is handed out and one more each time it is
  handed out again (a hand-out that may have been lost unseen, pushed to a consumer as
  it closed or died, may leave a gap), in the push, in the file name (N=), in
  pending() and in the dead letter;
- a fetched message's answer is confirmed: accepted while its client holds it, refused
  (invalid_state) once the router took it back; a fetch returns something when
  something waits for it;
- a consumer with credit left gets what waits for its patterns, in new/ or released
  (no stall);
- each consumer (a subscription; a client's fetches) gets each endpoint's messages in id
  order, except those handed out again; checked for first hand-outs of copies published
  one after the other from the test thread, within an "order epoch" of that endpoint (a
  new one starts when a consuming subscription matching it ends, when its writer or the
  router restarts: a claim in flight then may go back in line behind later ones);
- an observer sees every stored copy published while it was subscribed (and, after a
  router restart, once its subscription was renewed), once;
- while every process runs no publish is refused `unavailable`, and a publish made
  while a writer restarts waits for it and succeeds;
- the publish answers (delivered_to, rejected: access_denied, no_match) are what the
  registrations and deny rules predict;
- the index agrees with the Maildir read with os.listdir: pending() with cur/'s claimed
  files and their N=, dead_letters() with failed/, status depth with new/ plus what was
  released and waits in cur/, status unroutable with _unroutable/failed/; tmp/ is
  empty; the router counts every writer up and holds one subscription per live one
  (and a silent consumer's until its session timed out).

Budget: RELAY_MODEL_EXAMPLES sequences of up to RELAY_MODEL_STEPS steps (default 8 x 20,
about a minute and a half); `make soak` runs the same machine for long. A failure prints
the seed (replay with RELAY_MODEL_SEED=N), the shrunk sequence of steps (with the time
of each) and a @reproduce_failure blob; the failing example is also kept in
.hypothesis/relay-model/ and replayed first on the next run.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from tests.model.knobs import STATS, model_settings
from tests.model.machine import DeliveryMachine

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(int(os.environ.get("RELAY_MODEL_TIMEOUT", "900"))),
]


def test_delivery_model(request: pytest.FixtureRequest) -> None:
    forced = request.config.getoption("hypothesis_seed", None)
    chosen = os.environ.get("RELAY_MODEL_SEED") or (None if forced else str(random.getrandbits(32)))
    if chosen is not None:
        hypothesis_seed(int(chosen))(DeliveryMachine)
    used = chosen or forced
    before = {**STATS, "rules": dict(STATS["rules"]), "events": dict(STATS["events"])}
    started = time.monotonic()
    error = None
    try:
        run_state_machine_as_test(DeliveryMachine, settings=model_settings())
    except BaseException as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise
    finally:
        sequences = STATS["sequences"] - before["sequences"]
        steps = STATS["steps"] - before["steps"]
        rules = {k: v - before["rules"].get(k, 0) for k, v in sorted(STATS["rules"].items())}
        events = {k: v - before["events"].get(k, 0) for k, v in STATS["events"].items()}
        print(
            f"\nrelay model: seed {used}: {sequences} sequences, {steps} steps in "
            f"{time.monotonic() - started:.0f} s{'; FAILED: ' + error if error else ''}\n"
            f"rules run: {rules}\n"
            f"seen: {events}\n"
            f"replay: RELAY_MODEL_SEED={used} .venv/bin/pytest -s tests/test_model_delivery.py"
        )
        stats_file = os.environ.get("RELAY_MODEL_STATS")
        if stats_file:
            with open(stats_file, "a") as f:
                record = {"seed": used, "sequences": sequences, "steps": steps, "rules": rules}
                record["events"] = events
                record["error"] = error
                f.write(json.dumps(record) + "\n")
