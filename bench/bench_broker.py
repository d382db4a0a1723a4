"""The broker end to end: real router and writer processes, driven through the SDK,
each figure beside the bare loop or bare socket pattern it is built on, measured in the
same run.

Ceilings (raw Python, no Relay code):
- (a) write + fsync + rename + directory fsync, one message at a time (msg/s, p50 µs);
- (b) the same batched by 100: write all, one ``syncfs``, rename all, one directory
  fsync per batch (msg/s);
- (c) pyzmq DEALER ⇄ ROUTER echo over ipc:// with another process (p50 µs, msgs/s with
  1 and with 100 in flight);
- (d) pyzmq PUB → SUB over ipc:// from another process (msgs/s received);
- (e) the architecture with no Relay code in it: client → middle process → two writer
  processes → middle → client over ipc://, each writer doing only the durable work,
  group-committed like Relay's ((a) for one message, (b)'s steps for several) plus
  one index transaction per commit (p50/p99 one at a time; msg/s with 100 in flight;
  publish → consumer at the offered rate, each message stored into one Maildir's cur/
  on one writer and acknowledged by the consumer: a durable rename to done, as Relay's
  ack). Relay cannot be faster than its own shape.

Relay: durable publish with 1 in flight (one endpoint) and with 100 in flight (8
endpoints spread over the shards), for 1 and 2 shards; a wildcard publish that fans
out to 10 endpoints, 100 in flight, as copies stored per second beside (b), which counts
files; publish → consumer handler latency at an offered 1,000 msg/s; signals received by
a second client's ``on_signal`` with 100 signal requests in flight, and the rate of
``client.signal`` in a loop; the router's VmRSS right after the broker is ready and
after all rounds ran (no ceiling; ``--only soak`` measures drift over time); the router's
CPU time (user + system, all its threads) per publish during the 100-in-flight run, the
figure to hold against a change of the router's code (no ceiling).

Pull and ask, on the 2-shard broker (`PullAndAsk`): a backlog of 1,000 messages drained
by ``fetch`` with confirmed acks (``ack()`` one at a time; ``ack_async()`` for a whole
batch) beside the same backlog drained by a push subscription, each until its last ack
is durable; one publish -> ``fetch(wait)`` -> ``ack()`` at a time beside the push rows
(publish -> handler) and a publish's round trip; ``request`` -> ``reply`` one at a time
beside a publish's round trip, and from 8 threads beside publishes from 8 threads; the
router's CPU per message or request beside its push or publish counterpart.

Every figure is the median of ``rounds`` interleaved rounds (all contenders once per
round, Relay beside its ceiling). The broker homes and the raw files live on a real disk
(``/tmp`` when it is not tmpfs, else ``bench/results/tmp``): fsync must cost what it costs.
Rate limiting and backpressure stay enabled with limits the bench cannot reach, so their
checks are on the measured path; every publish must come back delivered.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from bench.bench_storage import fs_type
from bench.common import Row, cpu_us, rate, remove_when_done, rss_mib, stop_broker
from broker.config import DEFAULT_CONFIG
from sdk.paths import shard_of
from sdk.subjects import endpoint_hash
from sdk.subscription import ACK_DELAY_S, answers_together
from sdk.types import Signal, SignalType
from workers.index import MessageIndex
from workers.records import State
from workers.syncfs import syncfs

SHARD_COUNTS = (1, 2)
SUBJECT = "relay.agent.bench"
PAYLOAD = {"content": "x" * 300, "performative": "inform"}  # ~ a chat turn
SENDER = f"{SUBJECT}.producer"
SINGLE_N = 1000  # 1-in-flight publishes (and raw single writes) per round
PIPELINED_N = 3000  # 100-in-flight publishes (and raw batched writes) per round
INFLIGHT = 100
RAW_BATCH = 100
ENDPOINTS = 8  # for 100 in flight, spread evenly over the shards
FANOUT = 10  # endpoints one wildcard publish reaches
FANOUT_N = 1000  # wildcard publishes per round (FANOUT copies each), 100 in flight
RT_N = 3000  # raw DEALER/ROUTER round trips, 1 in flight
RT_PIPELINED_N = 20_000  # raw DEALER/ROUTER messages, 100 in flight
PUBSUB_N = 50_000  # raw PUB/SUB messages
SIGNAL_N = 10_000  # signals through the broker, 100 requests in flight
# signal(wait=False): as many as (d) sends, so that both rates span a similar time (at
# 150,000/s, 10,000 signals took 70 ms, and one scheduling stall moved the figure).
SIGNAL_NO_REPLY_N = PUBSUB_N
SIGNAL_SYNC_N = 2000  # client.signal() in a loop
OFFERED_RATE = 1000  # msg/s, for the handler latency
OFFERED_SECONDS = 3.0
WARMUP = 200
# (e)'s consumer answers as the SDK's does with the default credit (sdk.subscription).
ACKS_TOGETHER = answers_together(DEFAULT_CONFIG["limits"]["defaultCredit"])
# Pull and ask (`PullAndAsk`, on the broker with the most shards).
DRAIN_N = 1000  # messages waiting on one endpoint, drained per round by each consumer
PUSH_CREDIT = DEFAULT_CONFIG["limits"]["defaultCredit"]  # a subscription's, by default
FETCH_BATCH = 10  # fetch's default batch
FETCH_BIG_BATCH = PUSH_CREDIT  # as many held at once as a push subscription may hold
FETCH_RT_N = 300  # publish -> fetch(wait) -> ack round trips per round
REQUEST_N = 300  # request -> reply round trips per round, one at a time
REQUEST_THREADS = 8  # threads of one client calling request() (or publish()) in a loop
REQUEST_THREADED_N = 800  # requests (or publishes) per round over those threads

_OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC
_TOPIC = b"relay.signal.bench"


# --------------------------------------------------------------------------- helpers


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def _interleave(rounds: int, contenders: dict[str, Callable[[], dict[str, float]]]):
    """Each contender once per round, in order; the median of each figure over rounds."""
    seen: dict[str, dict[str, list[float]]] = {name: {} for name in contenders}
    for _ in range(rounds):
        for name, run_once in contenders.items():
            for key, value in run_once().items():
                seen[name].setdefault(key, []).append(value)
    return {
        name: {key: statistics.median(values) for key, values in figures.items()}
        for name, figures in seen.items()
    }


def base_dir() -> Path:
    """A fresh directory on a real disk: under /tmp unless /tmp is tmpfs."""
    parent = "/tmp"
    if fs_type(parent) in ("tmpfs", "ramfs"):
        parent = str(Path(__file__).parent / "results" / "tmp")
        os.makedirs(parent, exist_ok=True)
    if fs_type(parent) in ("tmpfs", "ramfs"):
        raise SystemExit(f"{parent} is {fs_type(parent)}: fsync costs nothing there")
    return Path(tempfile.mkdtemp(prefix="relay-bench-", dir=parent))


def _envelope(n: int) -> bytes:
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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs_at(path: str) -> None:
    """Flush the whole filesystem that holds ``path`` (one syncfs for a batch)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


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


# --------------------------------------------------------------------------- raw disk


class RawDisk:
    """The bare write paths, each round in fresh directories (no deleted-file slots)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0
        self.data = [_envelope(n) for n in range(max(SINGLE_N, PIPELINED_N))]

    def _dirs(self) -> tuple[str, str]:
        self.count += 1
        root = self.base / f"raw-{self.count}"
        (root / "tmp").mkdir(parents=True)
        (root / "new").mkdir()
        return str(root / "tmp"), str(root / "new")

    def single(self) -> dict[str, float]:
        tmp, new = self._dirs()
        latencies = []
        start = time.perf_counter()
        for n in range(SINGLE_N):
            t0 = time.perf_counter_ns()
            path = f"{tmp}/{n}"
            fd = os.open(path, _OPEN_NEW, 0o600)
            os.write(fd, self.data[n])
            os.fsync(fd)
            os.close(fd)
            os.rename(path, f"{new}/{n}")
            _fsync_dir(new)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        elapsed = time.perf_counter() - start
        return {
            "rate": rate(SINGLE_N, elapsed),
            "p50": _pct(latencies, 50),
            "p99": _pct(latencies, 99),
        }

    def batched(self) -> dict[str, float]:
        tmp, new = self._dirs()
        start = time.perf_counter()
        for first in range(0, PIPELINED_N, RAW_BATCH):
            batch = range(first, min(first + RAW_BATCH, PIPELINED_N))
            for n in batch:
                fd = os.open(f"{tmp}/{n}", _OPEN_NEW, 0o600)
                os.write(fd, self.data[n])
                os.close(fd)
            _syncfs_at(tmp)
            for n in batch:
                os.rename(f"{tmp}/{n}", f"{new}/{n}")
            _fsync_dir(new)
        return {"rate": rate(PIPELINED_N, time.perf_counter() - start)}


# --------------------------------------------------------------------------- raw zmq


def _raw_peer(rt_address: str, pub_address: str) -> None:
    """Child process: a ROUTER that echoes, and a PUB that sends on command."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(rt_address)
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(pub_address)
    body = json.dumps(_signal_wire(0)).encode()  # the size of a Relay signal frame
    while True:
        frames = router.recv_multipart()
        if frames[1] == b"stop":
            router.send_multipart(frames)
            break
        if frames[1] != b"pub":
            router.send_multipart(frames)
            continue
        # Probe until the subscriber says go (its subscription has reached us), then send.
        count = int(frames[2])
        while not router.poll(1):
            pub.send_multipart([_TOPIC + b".probe", b""])
        go = router.recv_multipart()
        for _ in range(count):
            pub.send_multipart([_TOPIC + b".data", body])
        pub.send_multipart([_TOPIC + b".end", b""])
        router.send_multipart(go)
    ctx.destroy(0)


class RawZmq:
    def __init__(self, base: Path) -> None:
        self.rt_address = f"ipc://{base}/raw-rt.sock"
        self.pub_address = f"ipc://{base}/raw-pub.sock"
        self.peer = multiprocessing.get_context("spawn").Process(
            target=_raw_peer, args=(self.rt_address, self.pub_address), daemon=True
        )
        self.peer.start()
        self.ctx = zmq.Context()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.connect(self.rt_address)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, _TOPIC)
        self.sub.connect(self.pub_address)
        self.request = [b"RLY1", json.dumps({"op": "publish", **PAYLOAD}).encode()]
        self.dealer.send_multipart(self.request)  # wait for the peer to be up
        if not self.dealer.poll(30_000):
            raise RuntimeError("raw zmq peer did not start")
        self.dealer.recv_multipart()

    def round_trip(self) -> dict[str, float]:
        latencies = []
        send, recv = self.dealer.send_multipart, self.dealer.recv_multipart
        start = time.perf_counter()
        for _ in range(RT_N):
            t0 = time.perf_counter_ns()
            send(self.request)
            recv()
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        elapsed = time.perf_counter() - start
        return {"p50": _pct(latencies, 50), "rate": rate(RT_N, elapsed)}

    def pipelined(self) -> dict[str, float]:
        send, recv = self.dealer.send_multipart, self.dealer.recv_multipart
        start = time.perf_counter()
        for _ in range(INFLIGHT):
            send(self.request)
        for sent in range(INFLIGHT, RT_PIPELINED_N + INFLIGHT):
            recv()
            if sent < RT_PIPELINED_N:
                send(self.request)
        return {"rate": rate(RT_PIPELINED_N, time.perf_counter() - start)}

    def pubsub(self) -> dict[str, float]:
        self.dealer.send_multipart([b"pub", str(PUBSUB_N).encode()])
        while not self.sub.recv_multipart()[0].endswith(b".probe"):
            pass
        self.dealer.send_multipart([b"go"])
        received, first, last = 0, 0.0, 0.0
        while True:
            topic = self.sub.recv_multipart()[0]
            if topic.endswith(b".data"):
                last = time.perf_counter()
                if not received:
                    first = last
                received += 1
            elif topic.endswith(b".end"):
                break
        self.dealer.recv_multipart()
        if received != PUBSUB_N:
            raise RuntimeError(f"raw PUB/SUB lost messages: {received}/{PUBSUB_N}")
        return {"rate": rate(received - 1, last - first)}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.dealer.send_multipart([b"stop"])
            self.dealer.poll(2000)
        self.peer.join(5)
        if self.peer.is_alive():
            self.peer.terminate()
            self.peer.join(5)
        self.ctx.destroy(0)


# --------------------------------------------------------------------------- raw pipeline


PIPE_WRITERS = 2  # as Relay's 2 shards
PIPE_DIRS = 4  # mailboxes per writer: Relay's 8 endpoints over 2 shards


def _triplets(frames: list[bytes]) -> list[list[bytes]]:
    """[identity, kind, body] items of a flat frame list."""
    return [frames[i : i + 3] for i in range(0, len(frames), 3)]


def _drain_all(sock: zmq.Socket, first: list[bytes], limit: int = 1000) -> list[list[bytes]]:
    """``first`` and whatever else is queued on ``sock`` now."""
    got = [first]
    while len(got) < limit:
        try:
            got.append(sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            break
    return got


def _pipe_middle(client_address: str, to_writers: list[str], from_writers: str) -> None:
    """Child process: the router's place with nothing in it, batching as the router
    does. What a pass reads from clients goes to the writers in one message each: round
    robin, but a ``deliver`` to writer 0 (one endpoint lives on one shard) and an
    ``ack`` to the writer that stored its message (as the router sends a ``done``).
    What comes back leaves in one message per client; a stored message is answered to
    its publisher and, when it was sent as ``deliver``, also pushed to the consumer."""
    ctx = zmq.Context()
    clients, pull = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PULL)
    pushes = [ctx.socket(zmq.PUSH) for _ in to_writers]
    clients.bind(client_address)
    for push, address in zip(pushes, to_writers, strict=True):
        push.bind(address)
    pull.bind(from_writers)
    poller = zmq.Poller()
    poller.register(clients, zmq.POLLIN)
    poller.register(pull, zmq.POLLIN)
    consumer = b""
    while True:
        for sock, _ in poller.poll():
            if sock is clients:
                requests = _drain_all(clients, clients.recv_multipart())
                groups: list[list[bytes]] = [[] for _ in pushes]
                for n, (identity, kind, body) in enumerate(requests):
                    if kind == b"consume":
                        consumer = identity
                        clients.send_multipart([identity, kind, body])
                    elif kind == b"stop":
                        for push in pushes:
                            push.send_multipart([identity, kind, body])
                        clients.send_multipart([identity, kind, body])
                        ctx.destroy(linger=1000)  # the stops and the reply leave first
                        return
                    elif kind == b"ack":  # body: b"<writer>|<file name>"
                        groups[int(body.split(b"|", 1)[0])] += [identity, kind, body]
                    elif kind == b"deliver":  # one consumer's endpoint: one shard
                        groups[0] += [identity, kind, body]
                    else:
                        groups[n % len(pushes)] += [identity, kind, body]
                for push, group in zip(pushes, groups, strict=True):
                    if group:
                        push.send_multipart(group)
            else:
                replies: dict[bytes, list[bytes]] = {}
                for message in _drain_all(pull, pull.recv_multipart()):
                    for identity, kind, body in _triplets(message):
                        if kind == b"deliver":  # pushed, and its publisher told (as Relay)
                            replies.setdefault(consumer, []).extend((kind, body))
                            body = b""
                        replies.setdefault(identity, []).extend((kind, body))
                for target, frames in replies.items():
                    clients.send_multipart([target, *frames])


def _pipe_writer(writer: int, to_writer: str, from_writers: str, directory: str) -> None:
    """Child process: the writer's place with only the durable work in it. Takes what
    is queued (group commit); one message: anchor (a) (write, fsync, rename, fsync the
    directory); several: anchor (b)'s steps (write all, syncfs, rename all, then one
    fsync per directory, or a second syncfs past two, as the writer decides). A
    ``deliver`` is stored into ``cur/`` of one Maildir (as Relay stores a message for one
    endpoint claimed when its consumer waits); an ``ack`` renames its file there to done
    (as Relay's ``done``) before the renames whose directory flush then covers it. Then
    one index transaction (apsw, WAL, synchronous=NORMAL: the writer's pragmas) and one
    reply message for the whole commit."""
    import apsw

    index = apsw.Connection(f"{directory}/index.db")
    index.execute("PRAGMA journal_mode=WAL")
    index.execute("PRAGMA synchronous=NORMAL")
    index.execute("CREATE TABLE m (n INTEGER PRIMARY KEY, size INTEGER, done INTEGER)")
    dirs = [f"{directory}/{k}" for k in range(PIPE_DIRS)]
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(to_writer)
    push.connect(from_writers)
    n = 0
    while True:
        batch = [t for m in _drain_all(pull, pull.recv_multipart(), 512) for t in _triplets(m)]
        if any(kind == b"stop" for _, kind, _ in batch):
            break
        acked, touched = [], set()
        for _, kind, body in batch:
            if kind == b"ack":
                where, k = body.split(b"|", 1)[1].decode().split("/")  # "<dir number>/<n>"
                cur = f"{dirs[int(where)]}/cur"
                os.rename(f"{cur}/{k}", f"{cur}/{k}:2,S")
                acked.append(int(k))
                touched.add(cur)
        stores = [(kind, body) for _, kind, body in batch if kind != b"ack"]
        files = []
        for kind, body in stores:
            # A consumer's messages go to its endpoint's one Maildir; publishes spread.
            where, sub = (0, "cur") if kind == b"deliver" else (n % PIPE_DIRS, "new")
            files.append((where, sub, n, len(body)))
            fd = os.open(f"{dirs[where]}/tmp/{n}", _OPEN_NEW, 0o600)
            os.write(fd, body)
            if len(stores) == 1:
                os.fsync(fd)
            os.close(fd)
            n += 1
        if len(stores) > 1:
            _syncfs_at(directory)
        for where, sub, k, _ in files:
            os.rename(f"{dirs[where]}/tmp/{k}", f"{dirs[where]}/{sub}/{k}")
            touched.add(f"{dirs[where]}/{sub}")
        if len(touched) > 2:
            _syncfs_at(directory)
        else:
            for path in sorted(touched):
                _fsync_dir(path)
        with index:
            index.executemany(
                "INSERT INTO m VALUES (?, ?, 0)", [(k, size) for _, _, k, size in files]
            )
            index.executemany("UPDATE m SET done = 1 WHERE n = ?", [(k,) for k in acked])
        # A stored message is answered with its kind only (Relay's "stored" is a small
        # row), an ack with "acked"; the consumer of a ``deliver`` gets the message
        # itself, after "<writer>|<dir>/<n>|" to name it in its ack.
        reply, stored = [], iter(files)
        for identity, kind, body in batch:
            if kind == b"ack":
                reply += [identity, b"acked", b""]
                continue
            where, _, k, _ = next(stored)
            named = b"%d|%d/%d|" % (writer, where, k) + body if kind == b"deliver" else b""
            reply += [identity, kind, named]
        push.send_multipart(reply)
    ctx.destroy(0)


class RawPipeline:
    """(e) Relay's process shape with no Relay code: client -> middle -> two writers ->
    middle -> client over ipc://, each writer doing only the durable work (see
    _pipe_writer) and one index transaction per group commit (no policy, no JSON, no
    SDK threads). What "durable" (docs/design.md invariant 3: flushed, renamed, indexed)
    costs through four ipc hops and three kinds of process on this machine: the floor of
    the architecture, for the 1-in-flight, 100-in-flight and handler rows."""

    def __init__(self, base: Path) -> None:
        client_address = f"ipc://{base}/raw-pipe-in.sock"
        to_writers = [f"ipc://{base}/raw-pipe-w{w}.sock" for w in range(PIPE_WRITERS)]
        from_writers = f"ipc://{base}/raw-pipe-r.sock"
        spawn = multiprocessing.get_context("spawn")
        self.children = [
            spawn.Process(
                target=_pipe_middle, args=(client_address, to_writers, from_writers), daemon=True
            )
        ]
        for w, to_writer in enumerate(to_writers):
            directory = base / f"raw-pipeline-{w}"
            for k in range(PIPE_DIRS):
                for sub in ("tmp", "new", "cur"):
                    (directory / str(k) / sub).mkdir(parents=True)
            self.children.append(
                spawn.Process(
                    target=_pipe_writer,
                    args=(w, to_writer, from_writers, str(directory)),
                    daemon=True,
                )
            )
        for child in self.children:
            child.start()
        self.ctx = zmq.Context()
        self.publisher, self.consumer = self.ctx.socket(zmq.DEALER), self.ctx.socket(zmq.DEALER)
        for sock in (self.publisher, self.consumer):
            sock.connect(client_address)
        self.consumer.send_multipart([b"consume", b""])
        if not self.consumer.poll(30_000):
            raise RuntimeError("raw pipeline did not start")
        self.consumer.recv_multipart()
        # A writer that died would leave its requests unanswered: fail, never hang.
        self.publisher.setsockopt(zmq.RCVTIMEO, 30_000)
        self.body = _envelope(0)
        for _ in range(WARMUP):  # as Relay's broker is warmed before measuring
            self.publisher.send_multipart([b"publish", self.body])
            self.publisher.recv_multipart()

    def pipelined(self) -> dict[str, float]:
        """PIPELINED_N publishes, INFLIGHT at a time (as Relay's 100-in-flight row)."""
        send, recv = self.publisher.send_multipart, self.publisher.recv_multipart
        request = [b"publish", self.body]
        start = time.perf_counter()
        sent, answered = min(INFLIGHT, PIPELINED_N), 0
        for _ in range(sent):
            send(request)
        while answered < PIPELINED_N:
            replies = len(recv()) // 2  # one message may answer several
            answered += replies
            for _ in range(min(replies, PIPELINED_N - sent)):
                send(request)
                sent += 1
        return {"rate": rate(PIPELINED_N, time.perf_counter() - start)}

    def single(self) -> dict[str, float]:
        latencies = []
        send, recv = self.publisher.send_multipart, self.publisher.recv_multipart
        for _ in range(SINGLE_N):
            t0 = time.perf_counter_ns()
            send([b"publish", self.body])
            recv()
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        return {"p50": _pct(latencies, 50), "p99": _pct(latencies, 99)}

    def handler(self) -> dict[str, float]:
        """Publish at OFFERED_RATE; a thread receiving for the consumer notes each
        arrival and acknowledges it (the writer renames it done, durably), as Relay's
        consumer acks every message it handled: within ACK_DELAY_S, up to a quarter of
        the default credit together, as the SDK does."""
        count = int(OFFERED_RATE * OFFERED_SECONDS)
        latencies: list[float] = []

        acked = [0]

        def consume() -> None:
            unsent: list[bytes] = []
            deadline = 0.0

            def answer() -> None:
                for name in unsent:
                    self.consumer.send_multipart([b"ack", name])
                unsent.clear()

            # Until every ack is answered too: none is left to the next row's disk time.
            while len(latencies) < count or acked[0] < count:
                wait_ms = math.ceil((deadline - time.monotonic()) * 1000) if unsent else 30_000
                if not self.consumer.poll(max(0, wait_ms)):
                    if not unsent:
                        return
                    answer()
                    continue
                frames = self.consumer.recv_multipart()  # one or more (kind, body) pairs
                now = time.monotonic_ns()
                for kind, body in zip(frames[0::2], frames[1::2], strict=True):
                    if kind == b"acked":
                        acked[0] += 1
                        continue
                    writer, name, message = body.split(b"|", 2)
                    latencies.append((now - int(message[:20])) / 1000)
                    if not unsent:
                        deadline = time.monotonic() + ACK_DELAY_S
                    unsent.append(writer + b"|" + name)
                if len(unsent) >= ACKS_TOGETHER:
                    answer()

        receiver = threading.Thread(target=consume)
        receiver.start()
        answered = 0  # the publisher reads its "stored" replies while it waits to send

        def read_replies_until(moment: float) -> int:
            got = 0
            while (left_ms := (moment - time.monotonic()) * 1000) > 0:
                if self.publisher.poll(int(left_ms)):
                    got += len(self.publisher.recv_multipart()) // 2
                elif left_ms < 1:
                    time.sleep(left_ms / 1000)  # poll counts whole milliseconds
            return got

        start = time.monotonic()
        for n in range(count):
            answered += read_replies_until(start + n / OFFERED_RATE)
            stamp = b"%020d" % time.monotonic_ns()
            self.publisher.send_multipart([b"deliver", stamp + self.body[20:]])
        receiver.join(60)
        if len(latencies) != count:
            raise RuntimeError(f"raw pipeline consumer saw {len(latencies)}/{count}")
        while answered < count:  # the rest, so that no other row reads them
            answered += len(self.publisher.recv_multipart()) // 2
        return {"p50": _pct(latencies, 50), "p99": _pct(latencies, 99)}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.publisher.send_multipart([b"stop", b""])
            self.publisher.poll(2000)
        for child in self.children:
            child.join(5)
            if child.is_alive():
                child.terminate()
                child.join(5)
        self.ctx.destroy(0)


# --------------------------------------------------------------------------- Relay


def _signal_wire(n: int, round_no: int = 0) -> dict[str, Any]:
    return Signal(
        SignalType.PROGRESS,
        "running",
        f"{SUBJECT}.sig",
        int(time.time() * 1000),
        {"round": round_no, "n": n},
    ).to_wire()


def _send_signals(home: str, count: int, round_no: int) -> None:
    """Child process: ``count`` signals without reply; close() flushes them (its bye
    leaves after them)."""
    from sdk import connect

    # Built before the first leaves, as anchor (d) encodes its body once: the row
    # measures the bus, not the making of Signal objects.
    signals = [Signal.from_wire(_signal_wire(n, round_no)) for n in range(count)]
    with connect(home, timeout=30) as client:
        for signal in signals:
            client.signal(f"{SUBJECT}.sig", signal, wait=False)


class RelayBroker:
    """One broker (router + N writers) and the clients the contenders use."""

    def __init__(self, shards: int, home: Path) -> None:
        from tests.harness import Broker  # real processes, its own home

        self.shards = shards
        self.broker = Broker(shards=shards, home=home)
        self.round = 0
        self.lock = threading.Lock()
        try:
            self.broker.start()
            self.rss_start = self.rss()  # right after the router and writers are ready
            self._setup()
        except BaseException:
            stop_broker(self.broker)
            raise

    def _setup(self) -> None:
        self.publisher = self.broker.client(timeout=30)
        self.receiver = self.broker.client(timeout=30)
        self.publisher.set_config(
            {"rateLimit": {"maxPerWindow": 10**9}, "backpressure": {"maxMailboxSize": 10**9}}
        )
        self.single = f"{SUBJECT}.single"
        self.spread = spread_subjects(ENDPOINTS, self.shards)
        self.sink = f"{SUBJECT}.sink"
        self.fan = [f"{SUBJECT}.fan.e{n}" for n in range(FANOUT)]
        self.fan_pattern = f"{SUBJECT}.fan.*"  # a wildcard publish: every endpoint it matches
        for subject in [self.single, self.sink, *self.spread, *self.fan]:
            self.publisher.register_endpoint(subject)

        self.latencies: list[float] = []
        self.receiver.subscribe(self.sink, self._on_message)
        self.signals_seen = 0
        self.signal_times: list[float] = []
        self.receiver.on_signal(f"{SUBJECT}.sig", self._on_signal)
        # The SUB socket connects asynchronously: signal until the handler hears one.
        deadline = time.monotonic() + 10
        while not self.signals_seen:
            if time.monotonic() > deadline:
                raise RuntimeError("on_signal handler never received a signal")
            self.publisher.signal(f"{SUBJECT}.sig", Signal.from_wire(_signal_wire(0, -1)))
            time.sleep(0.01)
        # Warm every path once (imports, caches, SQLite pages) before measuring.
        self.publish_single(WARMUP)
        self.publish_pipelined(WARMUP)
        self.publish_fanout(WARMUP)

    def rss(self) -> float:
        """The router process's VmRSS, MiB."""
        return rss_mib(self.broker.procs["router"].pid)

    def _on_message(self, envelope: Any) -> None:
        now = time.monotonic_ns()
        payload = envelope.payload
        if payload.get("round") == self.round:
            with self.lock:
                self.latencies.append((now - payload["t"]) / 1000)

    def _on_signal(self, subject: str, signal: Signal) -> None:
        if signal.data and signal.data.get("round") == self.round:
            self.signal_times.append(time.perf_counter())
        self.signals_seen += 1

    @staticmethod
    def _check(result: Any, copies: int = 1) -> None:
        if result.delivered_to != copies or result.rejected:
            raise RuntimeError(f"publish not delivered to {copies}: {result}")

    def publish_single(self, count: int = SINGLE_N) -> dict[str, float]:
        publish, latencies = self.publisher.publish, []
        start = time.perf_counter()
        for _ in range(count):
            t0 = time.perf_counter_ns()
            result = publish(self.single, PAYLOAD, sender=SENDER)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
            self._check(result)
        elapsed = time.perf_counter() - start
        return {
            "rate": rate(count, elapsed),
            "p50": _pct(latencies, 50),
            "p99": _pct(latencies, 99),
        }

    def publish_pipelined(self, count: int = PIPELINED_N) -> dict[str, float]:
        """Publishes/s, and the router's CPU µs per publish over the same run (its whole
        process: the loop and ZeroMQ's I/O threads; counted in 10 ms clock ticks)."""
        router = self.broker.procs["router"].pid
        before = cpu_us(router)
        result = self._in_flight(count, self.spread, 1)
        return {**result, "router_cpu": (cpu_us(router) - before) / count}

    def publish_fanout(self, count: int = FANOUT_N) -> dict[str, float]:
        """Wildcard publishes reaching FANOUT endpoints each; rate = copies stored/s."""
        result = self._in_flight(count, [self.fan_pattern], FANOUT)
        return {"rate": result["rate"] * FANOUT}

    def _in_flight(self, count: int, targets: list[str], copies: int) -> dict[str, float]:
        """``count`` publishes over ``targets`` in turn, INFLIGHT at a time; publishes/s."""
        slots = threading.Semaphore(INFLIGHT)
        done = threading.Event()
        errors: list[BaseException] = []
        finished = [0]
        lock = threading.Lock()

        def on_done(future: Any) -> None:
            try:
                self._check(future.result(), copies)
            except BaseException as exc:
                errors.append(exc)
            slots.release()
            with lock:  # the I/O thread, or this one when the future is already done
                finished[0] += 1
                if finished[0] == count:
                    done.set()

        publish_async = self.publisher.publish_async
        start = time.perf_counter()
        for n in range(count):
            slots.acquire()
            publish_async(targets[n % len(targets)], PAYLOAD, sender=SENDER).add_done_callback(
                on_done
            )
        if not done.wait(60):
            raise RuntimeError(f"only {finished[0]}/{count} publishes answered within 60 s")
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        return {"rate": rate(count, elapsed)}

    def publish_pipelined_unguarded(self) -> dict[str, float]:
        """The same run with rate limits, breakers and backpressure all disabled."""
        off = {s: {"enabled": False} for s in ("rateLimit", "circuitBreaker", "backpressure")}
        on = {s: {"enabled": True} for s in off}
        self.publisher.set_config(off)
        try:
            return self.publish_pipelined()
        finally:
            self.publisher.set_config(on)

    def handler_latency(self) -> dict[str, float]:
        """Publish at a fixed offered rate; the consumer's handler notes each arrival."""
        self.round += 1
        with self.lock:
            self.latencies = []
        count = int(OFFERED_RATE * OFFERED_SECONDS)
        futures = []
        start = time.monotonic()
        for n in range(count):
            delay = start + n / OFFERED_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            payload = {**PAYLOAD, "round": self.round, "t": time.monotonic_ns()}
            futures.append(self.publisher.publish_async(self.sink, payload, sender=SENDER))
        for future in futures:
            self._check(future.result(30))
        deadline = time.monotonic() + 30
        while len(self.latencies) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"handler saw {len(self.latencies)}/{count} messages")
            time.sleep(0.01)
        with self.lock:
            latencies = list(self.latencies)
        return {"p50": _pct(latencies, 50), "p99": _pct(latencies, 99)}

    def signals_pipelined(self) -> dict[str, float]:
        """Signals received by the second client's on_signal, 100 requests in flight."""
        self.round += 1
        self.signal_times = []
        slots = threading.Semaphore(INFLIGHT)
        subject = f"{SUBJECT}.sig"
        send_request = self.publisher.send_request
        for n in range(SIGNAL_N):
            slots.acquire()
            future = send_request("signal", subject=subject, signal=_signal_wire(n, self.round))
            future.add_done_callback(lambda _f: slots.release())
        return self._signal_rate()

    def _signal_rate(self, count: int = SIGNAL_N, min_share: float = 0.99) -> dict[str, float]:
        """Wait for this round's signals to stop arriving; received/s and lost."""
        deadline, seen = time.monotonic() + 10, 0  # 10 s for the first, 2 s between
        while len(self.signal_times) < count and time.monotonic() < deadline:
            if len(self.signal_times) != seen:  # still arriving: wait on
                seen, deadline = len(self.signal_times), time.monotonic() + 2
            time.sleep(0.01)
        times = list(self.signal_times)
        if len(times) < count * min_share:
            raise RuntimeError(f"on_signal received {len(times)}/{count} signals")
        return {"rate": rate(len(times) - 1, times[-1] - times[0]), "lost": count - len(times)}

    def signals_no_reply(self) -> dict[str, float]:
        """Signals received by the second client's on_signal, sent with wait=False (no
        round trip: the SDK puts what queued together in one frame) by a client in
        another process, as anchor (d) sends from another process."""
        self.round += 1
        self.signal_times = []
        sender = multiprocessing.get_context("spawn").Process(
            target=_send_signals,
            args=(str(self.broker.home.root), SIGNAL_NO_REPLY_N, self.round),
        )
        sender.start()
        try:
            # Without replies nothing slows the sender down: when the receiver falls
            # behind, PUB drops past its high-water mark (signals are ephemeral). The
            # row reports how many were lost; only a path that lost most is an error.
            return self._signal_rate(SIGNAL_NO_REPLY_N, min_share=0.5)
        finally:
            sender.join(30)

    def signals_sync(self) -> dict[str, float]:
        signal = Signal.from_wire(_signal_wire(0, -1))
        subject, send = f"{SUBJECT}.sig", self.publisher.signal
        start = time.perf_counter()
        for _ in range(SIGNAL_SYNC_N):
            send(subject, signal)
        return {"rate": rate(SIGNAL_SYNC_N, time.perf_counter() - start)}

    def cleanup(self) -> None:
        stop_broker(self.broker)


# --------------------------------------------------------------------------- Relay: pull, ask


class PullAndAsk:
    """The consumer's half on one broker, with its own clients and endpoints (the rows
    of `RelayBroker` see the broker they always did):

    - a backlog of DRAIN_N messages on one endpoint (published 100 in flight, not
      timed), drained by a push subscription with the default credit (its acks leave
      together, sdk/subscription.py) and by ``fetch`` with confirmed acks: ``ack()`` one
      at a time, or ``ack_async()`` for the whole batch and then waiting for them all.
      Every drain is timed until its last ack is applied and durable, so the push
      figure includes its batched acks (`drain_push` says how it sees them);
    - one publish -> ``fetch(wait)`` -> ``ack()`` at a time: the fetch is asked first,
      on the client that then publishes (one connection's requests are handled in
      order, so the fetch is parked at the router when the message is stored);
    - ``request`` -> ``reply`` -> the reply in the asker's hands, one at a time, and
      from REQUEST_THREADS threads of one client beside plain publishes from as many.
      The replier is a push subscription in this process whose handler answers with
      ``reply_async`` (a blocking ``reply`` would make its one handler thread the bound:
      one durable publish at a time); a reply that failed fails the row.
    """

    def __init__(self, relay: RelayBroker) -> None:
        self.relay = relay
        self.router = relay.broker.procs["router"].pid
        self.consumer = relay.broker.client(timeout=30)  # subscribes, fetches, acks
        self.asker = relay.broker.client(timeout=30)  # requests, and the publishes beside
        self.replier = relay.broker.client(timeout=30)
        self.backlog = f"{SUBJECT}.backlog"
        self.pull = f"{SUBJECT}.pull"
        self.ask = f"{SUBJECT}.ask"
        self.told = f"{SUBJECT}.told"  # plain publishes beside the requests
        self.backlog_hash = endpoint_hash(self.backlog)
        home = relay.broker.home
        self.index_path = home.index_db(shard_of(self.backlog_hash, relay.shards))
        for subject in (self.backlog, self.pull, self.ask, self.told):
            self.consumer.register_endpoint(subject)
        self.reply_errors: list[BaseException] = []
        self.replier.subscribe(self.ask, self._answer)
        # Every path once before measuring (the first request also makes the asker's
        # reply inbox: a register and a subscribe).
        self.drain_push(WARMUP)
        self.drain_fetch(FETCH_BATCH, together=False, count=WARMUP)
        self.drain_fetch(FETCH_BATCH, together=True, count=WARMUP)
        self.fetch_round_trip(20)
        self.request_single(20)
        self.request_threaded(REQUEST_THREADS * 5)
        self.publish_threaded(REQUEST_THREADS * 5)

    def _answer(self, envelope: Any) -> None:
        reply = self.replier.reply_async(envelope, PAYLOAD, sender=self.ask)
        reply.add_done_callback(self._replied)

    def _replied(self, future: Any) -> None:
        try:
            RelayBroker._check(future.result())
        except BaseException as exc:
            self.reply_errors.append(exc)

    def _fill(self, count: int) -> None:
        """``count`` messages waiting on the backlog endpoint (not timed)."""
        self.relay._in_flight(count, [self.backlog], 1)

    def drain_push(self, count: int = DRAIN_N) -> dict[str, float]:
        """The backlog drained by subscribe(): msg/s until the last ack is durable.

        A subscription's acks are not confirmed to its client (the SDK drops their
        answers), so the end is read where the writer records it: the endpoint's shard
        index, polled read-only from this process (no work for the router) from the
        moment the handler saw the last message until no row is claimed. The writer
        commits a row done after the rename and its flush, as it answers a fetch's ack.
        """
        self._fill(count)
        seen = [0]
        all_seen = threading.Event()

        def handler(_envelope: Any) -> None:  # one handler thread: no lock needed
            seen[0] += 1
            if seen[0] == count:
                all_seen.set()

        index = MessageIndex(self.index_path, readonly=True)
        try:
            before = cpu_us(self.router)
            start = time.perf_counter()
            unsubscribe = self.consumer.subscribe(self.backlog, handler)
            try:
                if not all_seen.wait(60):
                    raise RuntimeError(f"subscription saw {seen[0]}/{count} waiting messages")
            finally:
                unsubscribe()  # its last acks leave now
            deadline = time.monotonic() + 30
            while index.count(endpoint=self.backlog_hash, state=State.CLAIMED):
                if time.monotonic() > deadline:
                    raise RuntimeError("the subscription's acks were not applied within 30 s")
                time.sleep(0.001)
            elapsed = time.perf_counter() - start
        finally:
            index.close()
        return {"rate": rate(count, elapsed), "router_cpu": (cpu_us(self.router) - before) / count}

    def drain_fetch(self, batch: int, *, together: bool, count: int = DRAIN_N) -> dict[str, float]:
        """The backlog drained by fetch(batch) and confirmed acks: one ``ack()`` at a
        time, or (``together``) every ``ack_async()`` of a batch, then waiting for them."""
        self._fill(count)
        fetch, wait = self.consumer.fetch, self.consumer.wait
        drained = 0
        before = cpu_us(self.router)
        start = time.perf_counter()
        while drained < count:
            messages = fetch(self.backlog, batch=batch, wait=5.0)
            if not messages:
                raise RuntimeError(f"fetch found {drained}/{count} waiting messages")
            if together:
                for future in [message.ack_async() for message in messages]:
                    wait(future, "ack")
            else:
                for message in messages:
                    message.ack()
            drained += len(messages)
        elapsed = time.perf_counter() - start
        if drained != count:
            raise RuntimeError(f"fetch drained {drained} messages, {count} were waiting")
        return {"rate": rate(count, elapsed), "router_cpu": (cpu_us(self.router) - before) / count}

    def fetch_round_trip(self, count: int = FETCH_RT_N) -> dict[str, float]:
        """publish -> the fetch(wait) in the caller's hands (µs) -> ack() returned (µs),
        one at a time."""
        client, to_fetch, to_ack = self.consumer, [], []
        for _ in range(count):
            fetching = client.fetch_async(self.pull, batch=1, wait=10.0)
            t0 = time.perf_counter_ns()
            published = client.publish_async(self.pull, PAYLOAD, sender=SENDER)
            (message,) = client.wait(fetching, "fetch")
            to_fetch.append((time.perf_counter_ns() - t0) / 1000)
            message.ack()
            to_ack.append((time.perf_counter_ns() - t0) / 1000)
            self.relay._check(client.wait(published, "publish"))
        return {
            "fetch_p50": _pct(to_fetch, 50),
            "p50": _pct(to_ack, 50),
            "p99": _pct(to_ack, 99),
        }

    def request_single(self, count: int = REQUEST_N) -> dict[str, float]:
        """request() -> reply in hand, one at a time (µs)."""
        request, latencies = self.asker.request, []
        for _ in range(count):
            t0 = time.perf_counter_ns()
            request(self.ask, PAYLOAD, sender=SENDER, timeout=30)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        if self.reply_errors:
            raise self.reply_errors[0]
        return {"p50": _pct(latencies, 50), "p99": _pct(latencies, 99)}

    def request_threaded(self, count: int = REQUEST_THREADED_N) -> dict[str, float]:
        """Requests/s from REQUEST_THREADS threads of one client; router CPU µs each."""
        request = self.asker.request
        result = self._threaded(
            lambda: request(self.ask, PAYLOAD, sender=SENDER, timeout=30), count
        )
        if self.reply_errors:
            raise self.reply_errors[0]
        return result

    def publish_threaded(self, count: int = REQUEST_THREADED_N) -> dict[str, float]:
        """Durable publishes/s from as many threads of the same client, to an endpoint
        nobody consumes; router CPU µs each."""
        publish, check = self.asker.publish, self.relay._check
        return self._threaded(lambda: check(publish(self.told, PAYLOAD, sender=SENDER)), count)

    def _threaded(self, call: Callable[[], Any], count: int) -> dict[str, float]:
        per_thread = count // REQUEST_THREADS
        errors: list[BaseException] = []

        def loop() -> None:
            try:
                for _ in range(per_thread):
                    call()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=loop) for _ in range(REQUEST_THREADS)]
        before = cpu_us(self.router)
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        if any(thread.is_alive() for thread in threads):
            raise RuntimeError(f"{count} calls from {REQUEST_THREADS} threads not done in 120 s")
        done = per_thread * REQUEST_THREADS
        return {"rate": rate(done, elapsed), "router_cpu": (cpu_us(self.router) - before) / done}


# --------------------------------------------------------------------------- rows


def rows(rounds: int = 3) -> list[Row]:
    base = base_dir()
    brokers: dict[int, RelayBroker] = {}
    raw_zmq: RawZmq | None = None
    pipeline: RawPipeline | None = None
    try:
        disk = RawDisk(base)
        raw_zmq = RawZmq(base)
        pipeline = RawPipeline(base)
        for shards in SHARD_COUNTS:
            brokers[shards] = RelayBroker(shards, base / f"home-{shards}")
        contenders: dict[str, Callable[[], dict[str, float]]] = {
            "raw_single": disk.single,
            "pipeline_single": pipeline.single,
        }
        for k, b in brokers.items():
            contenders[f"single_{k}"] = b.publish_single
        contenders["raw_batched"] = disk.batched
        contenders["pipeline_pipelined"] = pipeline.pipelined
        for k, b in brokers.items():
            contenders[f"pipelined_{k}"] = b.publish_pipelined
        biggest = max(brokers)
        contenders["unguarded"] = brokers[biggest].publish_pipelined_unguarded
        contenders["fanout"] = brokers[biggest].publish_fanout
        contenders["raw_rt"] = raw_zmq.round_trip
        contenders["raw_rt_pipelined"] = raw_zmq.pipelined
        for k, b in brokers.items():
            contenders[f"signal_sync_{k}"] = b.signals_sync
        contenders["raw_pubsub"] = raw_zmq.pubsub
        for k, b in brokers.items():
            contenders[f"signals_{k}"] = b.signals_pipelined
            contenders[f"signals_no_reply_{k}"] = b.signals_no_reply
        contenders["pipeline_handler"] = pipeline.handler
        for k, b in brokers.items():
            contenders[f"handler_{k}"] = b.handler_latency
        # Pull and ask beside push consumption and plain publishes, on one broker.
        pull = PullAndAsk(brokers[biggest])
        contenders["drain_push"] = pull.drain_push
        contenders["drain_fetch_ack"] = lambda: pull.drain_fetch(FETCH_BATCH, together=False)
        contenders["drain_fetch_async"] = lambda: pull.drain_fetch(FETCH_BATCH, together=True)
        contenders["drain_fetch_async_big"] = lambda: pull.drain_fetch(
            FETCH_BIG_BATCH, together=True
        )
        contenders["fetch_rt"] = pull.fetch_round_trip
        contenders["request"] = pull.request_single
        contenders["publish_threaded"] = pull.publish_threaded
        contenders["request_threaded"] = pull.request_threaded
        m = _interleave(rounds, contenders)
        # The router of the broker the fan-out and reliability rows used, after every round.
        m["rss"] = {"start": brokers[biggest].rss_start, "after": brokers[biggest].rss()}
    finally:
        for broker in brokers.values():
            broker.cleanup()
        if raw_zmq is not None:
            raw_zmq.close()
        if pipeline is not None:
            pipeline.close()
        remove_when_done(base)
    return _table(m, fs_type(str(base.parent)))


def _shards(k: int) -> str:
    return f"{k} shard{'s' if k > 1 else ''}"


def _table(m: dict[str, dict[str, float]], kind: str) -> list[Row]:
    a, b = m["raw_single"], m["raw_batched"]
    rt, rt_pipe, pubsub = m["raw_rt"], m["raw_rt_pipelined"], m["raw_pubsub"]
    floor, floor_handler = m["pipeline_single"], m["pipeline_handler"]
    floor_pipelined = m["pipeline_pipelined"]
    # The floor itself beside (a): when it is above 2x, so is anything built this way.
    out: list[Row] = [
        Row(
            "(e) the architecture, no Relay code, 1 in flight: p50",
            floor["p50"],
            "us",
            "(a) p50",
            a["p50"],
        ),
        Row(
            f"(e) the architecture, no Relay code, {INFLIGHT} in flight",
            floor_pipelined["rate"],
            "msg/s",
            f"(b) batched by {RAW_BATCH}: syncfs + 1 dir fsync",
            b["rate"],
        ),
    ]
    for k in SHARD_COUNTS:
        single, pipe = m[f"single_{k}"], m[f"pipelined_{k}"]
        shard = _shards(k)
        out += [
            Row(
                f"publish, 1 in flight, {shard} ({kind})",
                single["rate"],
                "msg/s",
                "(a) write+fsync+rename+dir fsync, one at a time",
                a["rate"],
            ),
            Row(
                f"publish, 1 in flight, {shard}: p50",
                single["p50"],
                "us",
                "(a) p50",
                a["p50"],
                "<= 2x (a) p50",
                single["p50"] <= 2 * a["p50"],
            ),
            Row(f"publish, 1 in flight, {shard}: p99", single["p99"], "us", "(a) p99", a["p99"]),
            Row(
                f"publish, 1 in flight, {shard}: p50",
                single["p50"],
                "us",
                "(e) the architecture, no Relay code: p50",
                floor["p50"],
            ),
            Row(
                f"publish, 1 in flight, {shard}: p50",
                single["p50"],
                "us",
                "(c) DEALER/ROUTER round trip p50",
                rt["p50"],
            ),
            Row(
                f"publish, {INFLIGHT} in flight, {ENDPOINTS} endpoints, {shard}",
                pipe["rate"],
                "msg/s",
                f"(b) batched by {RAW_BATCH}: syncfs + 1 dir fsync",
                b["rate"],
                ">= 80% of (b)",
                pipe["rate"] >= 0.8 * b["rate"],
            ),
            Row(
                f"publish, {INFLIGHT} in flight, {ENDPOINTS} endpoints, {shard}",
                pipe["rate"],
                "msg/s",
                f"(c) DEALER/ROUTER, {INFLIGHT} in flight",
                rt_pipe["rate"],
            ),
        ]
        out.append(
            Row(
                f"router CPU per publish, {INFLIGHT} in flight, {ENDPOINTS} endpoints, {shard}",
                pipe["router_cpu"],
                "us",
            )
        )
        if k == PIPE_WRITERS:  # (e) has as many writers as this broker has shards
            out.append(
                Row(
                    f"publish, {INFLIGHT} in flight, {ENDPOINTS} endpoints, {shard}",
                    pipe["rate"],
                    "msg/s",
                    f"(e) the architecture, no Relay code, {INFLIGHT} in flight",
                    floor_pipelined["rate"],
                )
            )
    guarded, unguarded = m[f"pipelined_{max(SHARD_COUNTS)}"], m["unguarded"]
    out.append(
        Row(
            f"publish, {INFLIGHT} in flight, {_shards(max(SHARD_COUNTS))}, reliability on",
            guarded["rate"],
            "msg/s",
            "same, rate limit + breakers + backpressure off",
            unguarded["rate"],
            ">= 90% of off",
            guarded["rate"] >= 0.9 * unguarded["rate"],
        )
    )
    biggest = _shards(max(SHARD_COUNTS))
    out.append(
        Row(
            f"fan-out to {FANOUT} endpoints, {INFLIGHT} in flight, {biggest}: copies stored",
            m["fanout"]["rate"],
            "copy/s",
            f"(b) batched by {RAW_BATCH}: syncfs + 1 dir fsync (per file)",
            b["rate"],
        )
    )
    rss = m["rss"]
    out += [
        Row(f"router RSS at start, {biggest}", rss["start"], "MiB", goal="flat (see soak)"),
        Row(f"router RSS after the run, {biggest}", rss["after"], "MiB", goal="flat (see soak)"),
    ]
    for k in SHARD_COUNTS:
        handler = m[f"handler_{k}"]
        what = f"publish -> handler @ {OFFERED_RATE:,}/s, {_shards(k)}"
        out += [
            Row(
                f"{what}: p50",
                handler["p50"],
                "us",
                "(a) p50",
                a["p50"],
                "<= 1 ms",
                handler["p50"] <= 1000,
            ),
            Row(f"{what}: p99", handler["p99"], "us", "(a) p99", a["p99"]),
            Row(
                f"{what}: p50",
                handler["p50"],
                "us",
                "(e) store claimed, push, ack per message: p50",
                floor_handler["p50"],
            ),
        ]
    out += _pull_and_ask(m, biggest)
    for k in SHARD_COUNTS:
        signals, sync = m[f"signals_{k}"], m[f"signal_sync_{k}"]
        lost = f", {signals['lost']:.0f} lost" if signals["lost"] else ""
        no_reply = m[f"signals_no_reply_{k}"]
        lost_no_reply = f", {no_reply['lost']:.0f} lost" if no_reply["lost"] else ""
        out += [
            Row(
                f"signals to on_signal, {INFLIGHT} in flight, {_shards(k)}{lost}",
                signals["rate"],
                "sig/s",
                "(d) PUB/SUB",
                pubsub["rate"],
                ">= 50% of (d)",
                signals["rate"] >= 0.5 * pubsub["rate"],
            ),
            Row(
                f"signals to on_signal, signal(wait=False), {_shards(k)}{lost_no_reply}",
                no_reply["rate"],
                "sig/s",
                "(d) PUB/SUB",
                pubsub["rate"],
                ">= 50% of (d)",
                # A rate bought by dropping signals does not count.
                no_reply["rate"] >= 0.5 * pubsub["rate"]
                and no_reply["lost"] <= SIGNAL_NO_REPLY_N / 100,
            ),
            Row(
                f"client.signal() in a loop, {_shards(k)}",
                sync["rate"],
                "req/s",
                "(c) DEALER/ROUTER, 1 in flight",
                rt["rate"],
            ),
        ]
    return out


def _pull_and_ask(m: dict[str, dict[str, float]], shard: str) -> list[Row]:
    """The `PullAndAsk` rows: fetch beside push, request beside publish (same broker)."""
    k = max(SHARD_COUNTS)
    push, single, handler = m["drain_push"], m[f"single_{k}"], m[f"handler_{k}"]
    drain = f"drain {DRAIN_N:,} waiting, {shard}"
    by_push = f"the same drained by subscribe (push, credit {PUSH_CREDIT})"
    out = [
        Row(f"{drain}, subscribe (push, credit {PUSH_CREDIT}), acks durable", push["rate"], "msg/s")
    ]
    for key, how in (
        ("drain_fetch_ack", f"fetch(batch={FETCH_BATCH}) + ack() each"),
        ("drain_fetch_async", f"fetch(batch={FETCH_BATCH}) + ack_async() all, then wait"),
        ("drain_fetch_async_big", f"fetch(batch={FETCH_BIG_BATCH}) + ack_async() all, then wait"),
    ):
        out.append(Row(f"{drain}, {how}", m[key]["rate"], "msg/s", by_push, push["rate"]))
    out += [
        Row(
            f"router CPU per message drained, fetch(batch={FETCH_BATCH}) + ack() each",
            m["drain_fetch_ack"]["router_cpu"],
            "us",
            "router CPU per message drained by push",
            push["router_cpu"],
        ),
        Row(
            f"router CPU per message drained, fetch(batch={FETCH_BIG_BATCH}) + ack_async()",
            m["drain_fetch_async_big"]["router_cpu"],
            "us",
            "router CPU per message drained by push",
            push["router_cpu"],
        ),
    ]
    rt, what = m["fetch_rt"], f"publish -> fetch(wait) -> ack(), 1 at a time, {shard}"
    handler_p50 = f"publish -> handler @ {OFFERED_RATE:,}/s: p50"
    out += [
        Row(
            f"publish -> fetch(wait) answered, 1 at a time, {shard}: p50",
            rt["fetch_p50"],
            "us",
            handler_p50,
            handler["p50"],
        ),
        Row(f"{what}: p50", rt["p50"], "us", handler_p50, handler["p50"]),
        Row(f"{what}: p50", rt["p50"], "us", "publish, 1 in flight: p50", single["p50"]),
        Row(f"{what}: p99", rt["p99"], "us", "publish, 1 in flight: p99", single["p99"]),
    ]
    request, threaded = m["request"], m["request_threaded"]
    publish_threaded = m["publish_threaded"]
    what = f"request -> reply, 1 at a time, {shard}"
    out += [
        Row(f"{what}: p50", request["p50"], "us", "publish, 1 in flight: p50", single["p50"]),
        Row(f"{what}: p99", request["p99"], "us", "publish, 1 in flight: p99", single["p99"]),
        Row(
            f"request -> reply, {REQUEST_THREADS} threads of one client, {shard}",
            threaded["rate"],
            "req/s",
            f"publish, {REQUEST_THREADS} threads of one client",
            publish_threaded["rate"],
        ),
        Row(
            f"router CPU per request, {REQUEST_THREADS} threads, {shard}",
            threaded["router_cpu"],
            "us",
            f"router CPU per publish, {REQUEST_THREADS} threads",
            publish_threaded["router_cpu"],
        ),
    ]
    return out


if __name__ == "__main__":
    for row in rows():
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        verdict = "" if row.met is None else ("met" if row.met else "NOT met")
        ceiling = "" if row.ceiling is None else f"{row.ceiling_name}: {row.ceiling:,.0f} "
        print(
            f"{row.metric:<56} {row.relay:>10,.1f} {row.unit:<6} "
            f"{ceiling}({ratio}) {row.goal} {verdict}"
        )
