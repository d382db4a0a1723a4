"""The stateful model test of delivery through a real broker (tests/model/, docs/testing.md).

Random sequences of operations (endpoints, publishes and bursts, consumers that ack, nack
or hold, observers, consumer processes killed with SIGKILL, writer and router restarts,
stray connections to the sockets, credit and access rules) each followed by a wait until
the broker settles and a check of the promise:

- a copy answered "delivered" is pushed to at most one consumer, ever, and ends up done
  (acked), a dead letter with the handler's error (nacked), pending (claimed and never
  answered: a held, closed or killed consumer, or an answer the restarted router could
  not take), or still in new/ when no live consumer with credit matches it;
- a consumer with credit left gets what waits for its patterns (no stall);
- each subscription and observer gets one endpoint's messages in id order, for copies
  published one after the other from the test thread, within an "order epoch" of that
  endpoint: a new epoch starts when a consuming subscription matching it ends
  (unsubscribe, close, SIGKILL), when its shard's writer restarts and when the router
  restarts, since a claim in flight then may go back to new/ and reach another consumer
  after later ones; copies published from background threads are not checked;
- an observer sees every stored copy published while it was subscribed (and, after a
  router restart, once its subscription was renewed), once;
- while every process runs no publish is refused `unavailable`, and a publish made
  while a writer restarts waits for it and succeeds;
- the publish answers (delivered_to, rejected: access_denied, no_match) are what the
  registrations and deny rules predict;
- the index agrees with the Maildir read with os.listdir: pending() with cur/'s claimed
  files, dead_letters() with failed/, status depth with new/, status unroutable with
  _unroutable/failed/; tmp/ is empty; the router counts every writer up and holds one
  subscription per live one.

Budget: RELAY_MODEL_EXAMPLES sequences of up to RELAY_MODEL_STEPS steps (default 8 x 20,
about a minute); `make soak` runs the same machine for long. A failure prints the seed
(replay with RELAY_MODEL_SEED=N), the shrunk sequence of steps and a
@reproduce_failure blob; the failing example is also kept in .hypothesis/relay-model/
and replayed first on the next run.
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
    before = {**STATS, "rules": dict(STATS["rules"])}
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
        print(
            f"\nrelay model: seed {used}: {sequences} sequences, {steps} steps in "
            f"{time.monotonic() - started:.0f} s{'; FAILED: ' + error if error else ''}\n"
            f"rules run: {rules}\n"
            f"replay: RELAY_MODEL_SEED={used} .venv/bin/pytest -s tests/test_model_delivery.py"
        )
        stats_file = os.environ.get("RELAY_MODEL_STATS")
        if stats_file:
            with open(stats_file, "a") as f:
                record = {"seed": used, "sequences": sequences, "steps": steps, "rules": rules}
                record["error"] = error
                f.write(json.dumps(record) + "\n")
