"""The floors Relay's broker figures stand on: the same work done by raw Python with
no Relay code, measured in the same run as Relay (bench/bench_broker.py interleaves
them). A Relay figure divided by its floor is what Relay's own code costs.

- (a) `RawDisk.single`: write + fsync + rename + directory fsync, one message at a time
  (msg/s, p50/p99 µs);
- (b) `RawDisk.batched`: the same batched by 100: write all, one ``syncfs``, rename all,
  one directory fsync per batch (msg/s);
- (c) `RawZmq.round_trip` and `RawZmq.pipelined`: pyzmq DEALER ⇄ ROUTER echo over
  ipc:// with another process (p50 µs, msgs/s with 1 and with 100 in flight);
- (d) `RawZmq.pubsub`: pyzmq PUB → SUB over ipc:// from another process (msgs/s
  received);
- (e) `RawPipeline`: the architecture with no Relay code in it: client → middle process
  → two writer processes → middle → client over ipc://, each writer doing only the
  durable work, group-committed like Relay's ((a) for one message, (b)'s steps for
  several) plus one index transaction per commit (p50/p99 one at a time; msg/s with 100
  in flight; publish → consumer at the offered rate, each message stored into one
  Maildir's cur/ on one writer and acknowledged by the consumer: a durable rename to
  done, as Relay's ack). Relay cannot be faster than its own shape.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import threading
import time
from pathlib import Path

import zmq

from bench.common import Figures, fsync_dir, p50_p99, percentile, rate
from bench.workload import (
    ACKS_TOGETHER,
    INFLIGHT,
    OFFERED_RATE,
    OFFERED_SECONDS,
    PAYLOAD,
    PIPELINED_N,
    PUBSUB_N,
    RAW_BATCH,
    RT_N,
    RT_PIPELINED_N,
    SINGLE_N,
    WARMUP,
    envelope,
    signal_wire,
)
from sdk.subscription import ACK_DELAY_S
from workers.syncfs import syncfs

_OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC
_TOPIC = b"relay.signal.bench"


def _syncfs_at(path: str) -> None:
    """Flush the whole filesystem that holds ``path`` (one syncfs for a batch)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- (a), (b): the disk


class RawDisk:
    """The bare write paths, each round in fresh directories (no deleted-file slots)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0
        self.data = [envelope(n) for n in range(max(SINGLE_N, PIPELINED_N))]

    def _dirs(self) -> tuple[str, str]:
        self.count += 1
        root = self.base / f"raw-{self.count}"
        (root / "tmp").mkdir(parents=True)
        (root / "new").mkdir()
        return str(root / "tmp"), str(root / "new")

    def single(self) -> Figures:
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
            fsync_dir(new)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        elapsed = time.perf_counter() - start
        return {"rate": rate(SINGLE_N, elapsed), **p50_p99(latencies)}

    def batched(self) -> Figures:
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
            fsync_dir(new)
        return {"rate": rate(PIPELINED_N, time.perf_counter() - start)}


# --------------------------------------------------------------------------- (c), (d): ZeroMQ


def _raw_peer(rt_address: str, pub_address: str) -> None:
    """Child process: a ROUTER that echoes, and a PUB that sends on command."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(rt_address)
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(pub_address)
    body = json.dumps(signal_wire(0)).encode()  # the size of a Relay signal frame
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

    def round_trip(self) -> Figures:
        latencies = []
        send, recv = self.dealer.send_multipart, self.dealer.recv_multipart
        start = time.perf_counter()
        for _ in range(RT_N):
            t0 = time.perf_counter_ns()
            send(self.request)
            recv()
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        elapsed = time.perf_counter() - start
        return {"p50": percentile(latencies, 50), "rate": rate(RT_N, elapsed)}

    def pipelined(self) -> Figures:
        send, recv = self.dealer.send_multipart, self.dealer.recv_multipart
        start = time.perf_counter()
        for _ in range(INFLIGHT):
            send(self.request)
        for sent in range(INFLIGHT, RT_PIPELINED_N + INFLIGHT):
            recv()
            if sent < RT_PIPELINED_N:
                send(self.request)
        return {"rate": rate(RT_PIPELINED_N, time.perf_counter() - start)}

    def pubsub(self) -> Figures:
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


# --------------------------------------------------------------------------- (e): the architecture


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
                fsync_dir(path)
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
        self.body = envelope(0)
        for _ in range(WARMUP):  # as Relay's broker is warmed before measuring
            self.publisher.send_multipart([b"publish", self.body])
            self.publisher.recv_multipart()

    def pipelined(self) -> Figures:
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

    def single(self) -> Figures:
        latencies = []
        send, recv = self.publisher.send_multipart, self.publisher.recv_multipart
        for _ in range(SINGLE_N):
            t0 = time.perf_counter_ns()
            send([b"publish", self.body])
            recv()
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        return p50_p99(latencies)

    def handler(self) -> Figures:
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
        return p50_p99(latencies)

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
