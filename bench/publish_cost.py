"""The router's CPU for one publish, in process: its request and its stored answer.

``python -m bench.publish_cost [--publishes N] [--reps R]`` builds a real `Router` (2
shards, a temporary home, no sockets served) and drives its units as its loop does:
batch frames of 16 publishes to the 8 endpoints of the broker bench
(`dispatch.client_frame`), the copies' ``deliver`` frames encoded, each copy answered
``stored`` as a writer would (`writer_events.stored`), the replies taken in batch
frames. No ZeroMQ, no writer, no other process: the figure is the Python the router
runs per publish, warm, without the loop's poll and sends. Prints the best of R
repetitions (thread CPU time, µs per publish): the request (decode, checks, plan,
queued copies), the deliver frames, and the answers (stored, reply). Each timing
reads the thread's CPU clock, a system call of several µs on this VM, once per frame
of 16 publishes. Compare two trees by running it in each in turn.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from bench.workload import ENDPOINTS, PAYLOAD, SENDER, spread_subjects
from broker.auth import uid_user
from broker.router import dispatch
from broker.router import writer_events as events
from broker.router.loop import Router
from broker.router.ops_admin import add_endpoint
from sdk import wire
from sdk.paths import Home
from workers import protocol as proto

BATCH = 16  # publishes per request frame, as the SDK batches them at 100 in flight


def _no_work(*_args: object) -> None:
    raise AssertionError("a publish asks the loop for no writer operation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--publishes", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    home = Home(tempfile.mkdtemp(prefix="relay-publish-cost-"))
    router = Router(home, 2)
    try:
        router.start()
        ctx = router.ctx
        subjects = spread_subjects(ENDPOINTS, 2)
        for subject in subjects:
            add_endpoint(ctx, ctx.control.register_endpoint(subject, int(time.time() * 1000)))
        for shard in range(2):
            ctx.ledger.writer_up(shard)
        ctx.config["rateLimit"]["maxPerWindow"] = 10**9  # as the broker bench sets them
        ctx.config["backpressure"]["maxMailboxSize"] = 10**9
        ctx.configure()
        client, user = b"\x00bench", uid_user(os.getuid())

        def frame(first: int) -> list[bytes]:
            bodies = [
                wire.packb(
                    {"rid": rid, "op": "publish", "subject": subjects[rid % len(subjects)]}
                    | {"from": SENDER, "payload": PAYLOAD}
                )
                for rid in range(first, first + BATCH)
            ]
            return [client, wire.MAGIC, wire.batch(bodies)]

        frames = [frame(n * BATCH) for n in range(args.publishes // BATCH)]
        clock = time.thread_time_ns

        def run() -> tuple[int, int, int]:
            request = deliver = answer = 0
            for f in frames:
                t0 = clock()
                dispatch.client_frame(ctx, f, user, _no_work)
                t1 = clock()
                outgoing = ctx.jobs.take_outgoing()
                for items in outgoing.values():
                    proto.deliver(items)
                t2 = clock()
                for items in outgoing.values():
                    rows = [
                        proto.Stored(h.token, h.id, h.endpoint, 1, None, None, h.target)
                        for h, _ in items
                    ]
                    router._send_pushes(events.stored(ctx, rows, 1))
                for replied in ctx.replies.clients():
                    list(ctx.replies.take(replied, batches=True))
                t3 = clock()
                request, deliver, answer = request + t1 - t0, deliver + t2 - t1, answer + t3 - t2
            return request, deliver, answer

        run()  # warm: caches, the trie, the first allocations
        best = [min(column) for column in zip(*[run() for _ in range(args.reps)], strict=True)]
        count = len(frames) * BATCH
        request, deliver, answer = (ns / count / 1000 for ns in best)
        print(
            f"µs per publish: request {request:.2f}, deliver frames {deliver:.2f}, "
            f"answers {answer:.2f}, total {request + deliver + answer:.2f}"
        )
    finally:
        router.close()
        shutil.rmtree(home.root, ignore_errors=True)


if __name__ == "__main__":
    main()
