"""A writer's own CPU per commit on issue 27's two paths, beside floor (e)'s steps, in one
process: no router, no client, so a counter of the whole process (``strace -f -c``,
``valgrind --tool=callgrind``) counts the writer.

``python -m bench.writer_cost [--only handler|frames|batch|floor] [--blocks N] [--per-block M]``

- ``handler`` (publish -> handler at 1,000/s): a real `Writer` (workers/writer.py) stores
  one copy claimed into ``cur/`` per commit, as the router has it do for a waiting
  consumer, and every `ACKS` copies takes their ``done`` operations (one frame each, as
  the router sends them) in one commit. Its answers are read back from its results
  socket.
- ``frames``: the bench's own part of ``handler``, without a writer: the ids, headers
  and frames it makes for the writer (the router's work in a broker). ``handler`` minus
  ``frames`` is the writer's.
- ``batch`` (100 in flight): a commit of 27 copies over four mailboxes into ``new/``, its
  own renames read back from inotify, as `bench.writer_commit` does.
- ``floor``: floor (e)'s writer steps for the handler path (bench/floors.py
  `_pipe_writer`): the file written and fsynced, renamed into ``cur/``, ``cur/``
  fsynced, one insert into a one-table index; the acks renamed, ``cur/`` fsynced, one
  update.

Prints one JSON line: per message (a batch: per commit) the thread's user and system
CPU (µs) and wall time. CPU counts ticks and wall time moves with the machine's load;
for figures that do not, count instructions or syscalls from the difference of two run
lengths (docs/performance.md, "The writer's own work per commit").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections.abc import Callable

import zmq

from bench.common import base_dir, remove_when_done
from bench.workload import SENDER, envelope
from bench.writer_commit import floor_index, relay_commit
from sdk.ids import new_id
from sdk.paths import Home
from sdk.sockets import recv_parts
from sdk.subjects import endpoint_hash
from workers import protocol as proto
from workers.fsio import fsync_dir
from workers.writer import Writer

ACKS = 4  # acks a commit: what the SDK's 5 ms together gathers at 1,000/s, about
BATCH = 27  # copies a commit at 100 in flight (bench.writer_commit)
_OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC


def handler(root: str) -> Callable[[], None]:
    """One message stored claimed, and every ACKS messages their acks' commit."""
    subject = "relay.agent.bench.sink"
    endpoint = endpoint_hash(subject)
    home = Home(f"{root}/handler")
    writer = Writer(home, 0, 1)
    answers = writer.ctx.socket(zmq.PULL)
    answers.bind(home.results_address)
    writer.start()
    writer._watch(endpoint)

    def answered(frames: list[list[bytes]]) -> None:
        writer._process(frames)
        for _ in frames:  # read as the router reads them (sdk/sockets.py)
            recv_parts(answers, 0)

    return _handler_frames(subject, endpoint, answered)


def frames(root: str) -> Callable[[], None]:
    """`handler`'s ids, headers and frames, handed to no writer."""
    subject = "relay.agent.bench.sink"
    return _handler_frames(subject, endpoint_hash(subject), lambda _frames: None)


def _handler_frames(
    subject: str, endpoint: str, process: Callable[[list[list[bytes]]], None]
) -> Callable[[], None]:
    """The handler path's frames, as the router sends them: a ``deliver`` of one copy
    stored claimed per message, and every ACKS messages their ``done`` operations in
    one batch; ``process`` hands them to the writer."""
    body, token, unacked = envelope(0), [0], []

    def message() -> None:
        token[0] += 1
        header = proto.DeliveryHeader(
            token[0], new_id(), endpoint, subject, SENDER, int(time.time() * 1000), "cur"
        )
        process([proto.deliver([(header, body)])])
        unacked.append(header.id)
        if len(unacked) == ACKS:
            process([proto.op(n, "done", id=i, endpoint=endpoint) for n, i in enumerate(unacked)])
            unacked.clear()

    return message


def batch(root: str) -> Callable[[], None]:
    """One group commit of BATCH copies into new/ over four mailboxes, as
    `bench.writer_commit` makes them."""
    return relay_commit(root, 0, BATCH)


def floor(root: str) -> Callable[[], None]:
    """(e)'s writer steps for the handler path."""
    directory = f"{root}/floor"
    for sub in ("tmp", "cur"):
        os.makedirs(f"{directory}/{sub}")
    index = floor_index(directory)
    body, count, unacked = envelope(0), [0], []
    cur = f"{directory}/cur"

    def message() -> None:
        n = count[0]
        count[0] += 1
        fd = os.open(f"{directory}/tmp/{n}", _OPEN_NEW, 0o600)
        os.write(fd, body)
        os.fsync(fd)
        os.close(fd)
        os.rename(f"{directory}/tmp/{n}", f"{cur}/{n}")
        fsync_dir(cur)
        with index:
            index.execute("INSERT INTO m VALUES (?, ?, 0)", (n, len(body)))
        unacked.append(n)
        if len(unacked) == ACKS:
            for k in unacked:
                os.rename(f"{cur}/{k}", f"{cur}/{k}:2,S")
            fsync_dir(cur)
            with index:
                index.executemany("UPDATE m SET done = 1 WHERE n = ?", [(k,) for k in unacked])
            unacked.clear()

    return message


CONTENDERS = {"handler": handler, "frames": frames, "batch": batch, "floor": floor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(CONTENDERS), action="append")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--per-block", type=int, default=100, help="messages (commits) a block")
    args = parser.parse_args()
    root = base_dir()
    remove_when_done(root)
    runs = {name: CONTENDERS[name](str(root)) for name in args.only or CONTENDERS}
    for run in runs.values():  # warm: imports, statement caches, the first pages
        for _ in range(2 * ACKS):
            run()
    used = {name: [0.0, 0.0, 0.0] for name in runs}
    for _ in range(args.blocks):  # in turn, so that a slow minute hits each alike
        for name, run in runs.items():
            before, start = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
            for _ in range(args.per_block):
                run()
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_THREAD)
            used[name][0] += after.ru_utime - before.ru_utime
            used[name][1] += after.ru_stime - before.ru_stime
            used[name][2] += wall
    count = args.blocks * args.per_block
    figures: dict[str, object] = {"load": round(os.getloadavg()[0], 2)}
    for name, (user, system, wall) in used.items():
        figures[name] = {
            "user_us": round(user / count * 1e6, 1),
            "sys_us": round(system / count * 1e6, 1),
            "wall_us": round(wall / count * 1e6),
        }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
