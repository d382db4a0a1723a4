"""The publishing client's wake-ups and CPU per `publish_async` at a paced rate, against
a stand-in broker that answers each publish a set time after it came, as a broker
answers once the disk has.

    python -m bench.publish_wakes [--reply-after-ms D] [--rate R] [--count N] [--rounds K]

Per round of ``--count`` publishes at ``--rate`` per second (the handler row's pace),
every future awaited at the end: the voluntary context switches of this process per
publish (getrusage: each time one of its threads blocks and is woken again, the
caller's paced sleep included) and its CPU time per publish, user and system together
(the kernel splits them by sampling ticks, which moves between rounds). A reply
that comes before the next publish leaves nothing in flight between two publishes;
one that comes later leaves one in flight (the handler row's case when the disk is
slower than 1 ms). The stand-in is another process (bench/common.py `stand_in_at`),
not counted. A measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import tempfile
import time
from collections import deque
from pathlib import Path

import zmq

from bench import sdk_path
from bench.common import paced, stand_in_at, stand_in_hello
from sdk import wire
from sdk.client import Client

WARM = 200


def stand_in(address: str, reply_after_s: float) -> None:
    """A router that answers hello and ping at once and a publish ``reply_after_s``
    after it came, as a stored publish. Runs until killed."""
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(address)
    session = stand_in_hello(address, [])
    due: deque[tuple[float, list[bytes]]] = deque()  # (when, frames), in order
    while True:
        while due and due[0][0] <= time.monotonic():
            sock.send_multipart(due.popleft()[1])
        left_s = due[0][0] - time.monotonic() if due else 1.0
        if left_s < 0.001:  # poll counts whole milliseconds
            if not sock.poll(0):
                time.sleep(max(0.0, left_s))
                continue
        elif not sock.poll(int(left_s * 1000)):
            continue
        peer, _magic, body = sock.recv_multipart()
        requests = wire.unpackb(body)
        many = isinstance(requests, list)
        for r in requests if many else [requests]:
            at_once = r["op"] in ("hello", "ping")
            reply = wire.ok_body(r["rid"], session if at_once else sdk_path.STORED)
            frames = [peer, wire.MAGIC, wire.batch([reply]) if many else reply]
            if at_once:
                sock.send_multipart(frames)
            else:
                due.append((time.monotonic() + reply_after_s, frames))


def rounds(address: str, count: int, rate: float, how_many: int) -> list[dict[str, float]]:
    client = Client(address, timeout=30)
    publish = client.publish_async
    try:
        for _ in range(WARM):
            publish(sdk_path.SUBJECT, sdk_path.PAYLOAD, sender=sdk_path.SENDER).result(10)
        figures = []
        for _ in range(how_many):
            before = resource.getrusage(resource.RUSAGE_SELF)
            futures = [
                publish(sdk_path.SUBJECT, sdk_path.PAYLOAD, sender=sdk_path.SENDER)
                for _ in paced(count, rate)
            ]
            for future in futures:
                future.result(30)
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            figures.append(
                {
                    "wakes": round((after.ru_nvcsw - before.ru_nvcsw) / count, 2),
                    "cpu_us": round(cpu_s / count * 1e6, 1),
                }
            )
        return figures
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.publish_wakes", description=__doc__)
    parser.add_argument("--reply-after-ms", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="relay-publish-wakes-"))
    serve = functools.partial(stand_in, reply_after_s=args.reply_after_ms / 1000)
    with stand_in_at(home, serve) as address:
        figures = rounds(address, args.count, args.rate, args.rounds)
    print(json.dumps({"reply_after_ms": args.reply_after_ms, "rounds": figures}), flush=True)


if __name__ == "__main__":
    main()
