"""What the broker bench sends, and how much: one place for the sizes that Relay's
figures and their floors share, so that a row and its floor measure the same work.

The message is a chat turn (~300 bytes of content); the floors write the message file
the broker would write for it (`envelope`) and send signal frames of a Relay signal's
size (`signal_wire`). The bench's NATS, HTTP and soak modules use the same subjects,
payload and spread so their figures stand beside the broker's.
"""

from __future__ import annotations

import json
import time
from typing import Any

from broker.config import DEFAULT_CONFIG
from sdk.paths import shard_of
from sdk.subjects import endpoint_hash
from sdk.subscription import answers_together
from sdk.types import Signal, SignalType

SHARD_COUNTS = (1, 2)  # a broker of each
SUBJECT = "relay.agent.bench"
PAYLOAD = {"content": "x" * 300, "performative": "inform"}  # ~ a chat turn
SENDER = f"{SUBJECT}.producer"
WARMUP = 200  # messages through every path before measuring

# Publishes, and the raw writes of floors (a) and (b), per round.
SINGLE_N = 1000  # 1-in-flight publishes (and raw single writes)
PIPELINED_N = 3000  # 100-in-flight publishes (and raw batched writes)
INFLIGHT = 100
RAW_BATCH = 100  # floor (b)'s batch
ENDPOINTS = 8  # for 100 in flight, spread evenly over the shards
FANOUT = 10  # endpoints one wildcard publish reaches
FANOUT_N = 1000  # wildcard publishes per round (FANOUT copies each), 100 in flight

# Floors (c) and (d): raw ZeroMQ.
RT_N = 3000  # raw DEALER/ROUTER round trips, 1 in flight
RT_PIPELINED_N = 20_000  # raw DEALER/ROUTER messages, 100 in flight
PUBSUB_N = 50_000  # raw PUB/SUB messages

# Signals.
SIGNAL_SUBJECT = f"{SUBJECT}.sig"
SIGNAL_N = 10_000  # signals through the broker, 100 requests in flight
# signal(wait=False): as many as (d) sends, so that both rates span a similar time (at
# 150,000/s, 10,000 signals took 70 ms, and one scheduling stall moved the figure).
SIGNAL_NO_REPLY_N = PUBSUB_N
SIGNAL_SYNC_N = 2000  # client.signal() in a loop

# Publish -> consumer handler.
OFFERED_RATE = 1000  # msg/s, for the handler latency
OFFERED_SECONDS = 3.0
# (e)'s consumer answers as the SDK's does with the default credit (sdk.subscription).
ACKS_TOGETHER = answers_together(DEFAULT_CONFIG["limits"]["defaultCredit"])

# Pull and ask (`bench.pull_and_ask`, on the broker with the most shards).
DRAIN_N = 1000  # messages waiting on one endpoint, drained per round by each consumer
PUSH_CREDIT = DEFAULT_CONFIG["limits"]["defaultCredit"]  # a subscription's, by default
FETCH_BATCH = 10  # fetch's default batch
FETCH_BIG_BATCH = PUSH_CREDIT  # as many held at once as a push subscription may hold
FETCH_RT_N = 300  # publish -> fetch(wait) -> ack round trips per round
REQUEST_N = 300  # request -> reply round trips per round, one at a time
REQUEST_THREADS = 8  # threads of one client calling request() (or publish()) in a loop
REQUEST_THREADED_N = 800  # requests (or publishes) per round over those threads


def envelope(n: int) -> bytes:
    """A message file about the size the broker writes for PAYLOAD."""
    return json.dumps(
        {
            "id": f"01JDQ3ZV9R6Q4W1T3M{n:08d}",
            "subject": f"{SUBJECT}.e0",
            "from": SENDER,
            "replyTo": None,
            "createdAt": 1_764_108_000_000 + n,
            "budget": {
                "hopCount": 1,
                "maxHops": 5,
                "ancestorChain": [f"{SUBJECT}.e0"],
                "ttl": 1_764_111_600_000,
                "callBudgetRemaining": 9,
            },
            "payload": PAYLOAD,
        }
    ).encode()


def signal_wire(n: int, round_no: int = 0) -> dict[str, Any]:
    """A progress signal as it travels, numbered for the round that sent it."""
    return Signal(
        SignalType.PROGRESS,
        "running",
        SIGNAL_SUBJECT,
        int(time.time() * 1000),
        {"round": round_no, "n": n},
    ).to_wire()


def spread_subjects(count: int, shards: int) -> list[str]:
    """``count`` endpoint subjects, as many on each shard as the count allows."""
    per_shard = count // shards
    taken: dict[int, list[str]] = {k: [] for k in range(shards)}
    n = 0
    while any(len(v) < per_shard for v in taken.values()):
        subject = f"{SUBJECT}.e{n}"
        shard = shard_of(endpoint_hash(subject), shards)
        if len(taken[shard]) < per_shard:
            taken[shard].append(subject)
        n += 1
    return [s for k in range(shards) for s in taken[k]]
