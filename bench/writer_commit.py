"""The writers' wall time per group commit, beside floor (e)'s writer, in the same minutes.

``python -m bench.writer_commit [--blocks N] [--batch B] [--no-index] [--tmpfile]``
starts two processes, as the broker's two shards. Each holds a real `Writer` (workers/writer.py,
in a home of its own, with no router: a commit's deliveries are handed to its
``_process`` as the router's ``deliver`` frame, and its ``stored`` answer is read back
from its results socket) and the steps of floor (e)'s writer (bench/floors.py
`_pipe_writer`: write every file into ``tmp/``, ``syncfs``, rename each into ``new/``,
``syncfs`` for the four directories, one insert transaction into a one-table index).
Both store B copies a commit over four mailboxes, as the 100-in-flight row does.

They run in blocks of `PER_BLOCK` commits, each contender's blocks in turn, the two
processes in lockstep (a barrier before each block), so that both contend with each
other as the two writers of a broker do, and a slow minute of the disk hits every
contender alike. The first commit of a block is not counted: it flushes what the
contender before it left dirty. ``--no-index`` adds a Writer whose index transaction
is left out (its ``write`` does nothing): what the index costs a commit, not something
Relay could ship. ``--tmpfile`` adds (e)'s steps with each file opened unnamed
(``O_TMPFILE``) in its target directory and linked there (``linkat``) instead of
created in ``tmp/`` and renamed: a candidate, not what Relay does
(docs/performance.md, "The writers' wall time per group commit").

Prints, per contender, the median, quartiles and mean wall time of a commit (ms), and
the floor's time creating files. No router, SDK or client runs: the figure is the
writers' own, the part of the 100-in-flight round trip that the disk sets.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from typing import Any

from bench.common import base_dir, remove_when_done
from bench.workload import SENDER, envelope

PER_BLOCK = 16  # commits per block, the first not counted
DIRS = 4  # mailboxes per writer: the 100-in-flight row's 8 endpoints over 2 shards
_OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC


class _NoIndex:
    """In place of a Writer's index: takes a group commit's rows and writes nothing."""

    def write(self, **_changes: object) -> None:
        pass


def relay_commit(root: str, writer: int, batch: int, index: bool = True) -> Callable[[], None]:
    """A real Writer's group commit of ``batch`` deliveries (index, fsyncs, answer)."""
    import zmq

    from sdk.ids import new_id
    from sdk.paths import Home
    from sdk.sockets import recv_parts
    from sdk.subjects import endpoint_hash
    from workers import protocol as proto
    from workers.writer import Writer

    home = Home(f"{root}/relay-{writer}")
    relay = Writer(home, 0, 1)
    answers = relay.ctx.socket(zmq.PULL)
    answers.bind(home.results_address)
    relay.start()
    subjects = [f"relay.agent.bench.w{writer}.e{k}" for k in range(DIRS)]
    endpoints = [endpoint_hash(subject) for subject in subjects]
    for endpoint in endpoints:
        relay._watch(endpoint)
    if not index:
        relay.index.close()
        relay.index = _NoIndex()  # type: ignore[assignment]
    body = envelope(0)
    token = [0]

    def commit() -> None:
        items = []
        for n in range(batch):
            token[0] += 1
            k = n % DIRS
            header = proto.DeliveryHeader(
                token[0], new_id(), endpoints[k], subjects[k], SENDER, int(time.time() * 1000)
            )
            items.append((header, body))
        relay._process([proto.deliver(items)])
        relay._on_inotify()  # its own renames, read back as the serving loop does
        recv_parts(answers, 0)  # as the router reads it (sdk/sockets.py)

    return commit


def floor_index(directory: str) -> Any:
    """(e)'s index: one small table in ``directory``, with the writer's pragmas."""
    import apsw

    index = apsw.Connection(f"{directory}/index.db")
    index.execute("PRAGMA journal_mode=WAL")
    index.execute("PRAGMA synchronous=NORMAL")
    index.execute("CREATE TABLE m (n INTEGER PRIMARY KEY, size INTEGER, done INTEGER)")
    return index


def _floor_commit(
    root: str, writer: int, batch: int, tmpfile: bool, created: list[float]
) -> Callable[[], None]:
    """(e)'s writer steps for ``batch`` files; adds its file-creating time to ``created``."""

    from workers.syncfs import syncfs

    directory = f"{root}/{'tmpfile' if tmpfile else 'floor'}-{writer}"
    for k in range(DIRS):
        for sub in ("tmp", "new"):
            os.makedirs(f"{directory}/{k}/{sub}")
    index = floor_index(directory)
    body = envelope(0)
    count = [0]

    def commit() -> None:
        root_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        start, files = time.perf_counter(), []
        for n in range(count[0], count[0] + batch):
            where = f"{directory}/{n % DIRS}"
            if tmpfile:
                fd = os.open(f"{where}/new", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600)
            else:
                fd = os.open(f"{where}/tmp/{n}", _OPEN_NEW, 0o600)
            os.write(fd, body)
            if not tmpfile:
                os.close(fd)
            files.append((where, n, fd))
        count[0] += batch
        created.append(time.perf_counter() - start)
        syncfs(root_fd)
        for where, n, fd in files:
            if tmpfile:  # linkat(2) of the open file; a dir fd makes os.link call linkat
                os.link(f"/proc/self/fd/{fd}", f"{where}/new/{n}", src_dir_fd=root_fd)
                os.close(fd)
            else:
                os.rename(f"{where}/tmp/{n}", f"{where}/new/{n}")
        syncfs(root_fd)
        os.close(root_fd)
        with index:
            index.executemany(
                "INSERT INTO m VALUES (?, ?, 0)", [(n, len(body)) for _, n, _ in files]
            )

    return commit


def _writer(
    writer: int, root: str, barrier: Barrier, out: Any, blocks: int, batch: int, flags: set[str]
) -> None:
    created: list[float] = []
    contenders = {"relay": relay_commit(root, writer, batch)}
    if "no_index" in flags:
        contenders["relay, no index"] = relay_commit(root, writer + 2, batch, index=False)
    contenders["floor"] = _floor_commit(root, writer, batch, False, created)
    if "tmpfile" in flags:
        contenders["floor, O_TMPFILE"] = _floor_commit(root, writer, batch, True, [])
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(blocks):
        for name, commit in contenders.items():
            barrier.wait()
            commit()
            for _ in range(PER_BLOCK - 1):
                start = time.perf_counter()
                commit()
                times[name].append(time.perf_counter() - start)
    out.put((times, created))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--batch", type=int, default=27, help="copies per group commit")
    parser.add_argument("--no-index", action="store_true", help="add a Writer with no index")
    parser.add_argument("--tmpfile", action="store_true", help="add the O_TMPFILE floor")
    args = parser.parse_args()
    flags = {name for name in ("no_index", "tmpfile") if getattr(args, name)}
    root = base_dir()
    spawn = multiprocessing.get_context("spawn")
    barrier, out = spawn.Barrier(2), spawn.Queue()
    procs = [
        spawn.Process(
            target=_writer,
            args=(w, str(root), barrier, out, args.blocks, args.batch, flags),
            daemon=True,
        )
        for w in range(2)
    ]
    try:
        for proc in procs:
            proc.start()
        times: dict[str, list[float]] = {}
        created: list[float] = []
        for _ in procs:
            theirs, floor_created = out.get(timeout=1800)
            for name, values in theirs.items():
                times.setdefault(name, []).extend(values)
            created += floor_created
        print(f"load {os.getloadavg()[0]:.1f}; ms per commit of {args.batch} copies, 2 writers")
        for name, values in times.items():
            q1, median, q3 = (v * 1000 for v in statistics.quantiles(values, n=4))
            mean = statistics.mean(values) * 1000
            print(f"{name:18s} median {median:6.2f}  [{q1:6.2f}, {q3:6.2f}]  mean {mean:6.2f}")
        print(f"floor: creating its files, mean {statistics.mean(created) * 1000:.2f} ms")
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        remove_when_done(root)


if __name__ == "__main__":
    main()
