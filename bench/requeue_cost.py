"""How long one operator's requeue of N dead letters takes, from request to answer.

``python -m bench.requeue_cost [--dead N] [--reps R] [--tree DIR]``: for each repetition
a fresh one-shard broker (tests/harness.py, real processes) gets N messages on one
endpoint, fetched and nacked (N dead letters, each durable when its nack returns), then
times `requeue_dead_letters(endpoint, limit=N)`: one request, one writer batch
(workers/dead_letters.py, `redrive_batch`). Prints each time in ms and the median.

``--tree DIR`` runs the code of another checkout (its router, writer and SDK), so two
trees are compared with one script: run it for each in turn, A B A B. The figure waits
on the disk (fsyncs), so it moves with the machine's load: only pairs taken in the
same minutes mean something.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

SUBJECT = "relay.agent.bench.requeue"
SENDER = "relay.agent.bench.src"


def one_requeue(dead: int) -> float:
    """Seconds one requeue of ``dead`` dead letters takes on a fresh broker."""
    from tests.harness import Broker

    with Broker(shards=1) as broker:
        client = broker.client(timeout=60)
        info = client.register_endpoint(SUBJECT)
        client.set_config({"rateLimit": {"maxPerWindow": 100_000}})
        for n in range(dead):
            result = client.publish(SUBJECT, {"n": n, "pad": "x" * 500}, sender=SENDER)
            if result.delivered_to != 1:
                raise RuntimeError(f"publish not delivered: {result}")
        held = []
        while len(held) < dead:
            held += client.fetch(SUBJECT, batch=dead - len(held), wait=5)
        for message in held:
            message.nack("bench")
        start = time.perf_counter()
        answer = client.requeue_dead_letters(info.hash, limit=dead)
        seconds = time.perf_counter() - start
        if len(answer["requeued"]) != dead:
            raise RuntimeError(f"not all requeued: {answer}")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dead", type=int, default=200, help="dead letters (at most 200)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    tree = str(args.tree.resolve())
    sys.path.insert(0, tree)
    os.chdir(tree)  # the harness starts `python -m cli` from its own tree
    times = [one_requeue(args.dead) * 1000 for _ in range(args.reps)]
    print(" ".join(f"{t:.1f}" for t in times), f"median {statistics.median(times):.1f} ms")


if __name__ == "__main__":
    main()
