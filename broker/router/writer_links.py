"""The router's sockets to its writers, and which writer is up: one ROUTER per shard.

A writer connects a DEALER to ``run/shard-<K>.sock`` and says ``hello`` there; from then
on the router sends that shard's work to that one connection and to no other. Anything
else that connects (a mistyped address, a monitoring probe, a client of the wrong type)
gets nothing, and its going away is not taken for the writer's: the disconnect event
names a file descriptor, and a writer is down only when the descriptor its hello came
on closes, or when a send finds its connection gone.

Before this, the shard sockets were PUSH sockets: a stray peer took its round-robin
share of the deliveries, and any disconnect marked the writer down for good.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from sdk.sockets import NOBLOCK, send_parts
from workers import protocol as proto

log = logging.getLogger("relay.router")

# A writer's queue: bounded by the per-client in-flight limit; EAGAIN means it stopped
# reading.
WRITER_HWM = 100_000


@dataclass(frozen=True)
class Writer:
    pid: int
    peer: bytes  # its routing id on the shard's ROUTER socket
    fd: int | None  # the descriptor its hello came on (None: libzmq did not say)
    since: int


class WriterLinks:
    def __init__(self, ctx: zmq.Context, shards: int) -> None:
        self.shards = shards
        self.sockets: list[zmq.Socket] = []
        for _ in range(shards):
            sock = ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # EHOSTUNREACH, never a silent drop
            sock.setsockopt(zmq.SNDHWM, WRITER_HWM)
            self.sockets.append(sock)
        self.monitors = {
            sock.get_monitor_socket(zmq.EVENT_DISCONNECTED): shard
            for shard, sock in enumerate(self.sockets)
        }
        self.up: dict[int, Writer] = {}
        self.seen: set[int] = set()  # shards whose writer said hello since the router started
        self._lost: list[int] = []  # found gone by a send, not yet reported

    def is_up(self, shard: int) -> bool:
        return shard in self.up

    def state(self, shard: int) -> str:
        """up; starting (not seen yet since the router started); down (it went away)."""
        if shard in self.up:
            return "up"
        return "down" if shard in self.seen else "starting"

    def status(self) -> list[dict[str, Any]]:
        """Each shard's writer as ``relay status`` shows it."""
        return [
            {
                "shard": shard,
                "pid": writer.pid if writer else None,
                "state": self.state(shard),
                "since": writer.since if writer else None,
            }
            for shard, writer in ((s, self.up.get(s)) for s in range(self.shards))
        ]

    def send(self, shard: int, frames: list[bytes]) -> bool:
        """Hand frames to the shard's writer; False if it is not up or not reading."""
        writer = self.up.get(shard)
        if writer is None:
            return False
        try:
            send_parts(self.sockets[shard], [writer.peer, *frames], NOBLOCK, False)
            return True
        except zmq.Again:
            return False  # its queue is full: alive, but not reading
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            # Gone before its disconnect event reached us: report it with the events.
            self._gone(shard)
            return False

    def on_hello(self, shard: int, now: int, limit: int = 100) -> Writer | None:
        """Read what arrived on a shard's socket (at most ``limit`` frames a pass: a stray
        peer sending junk must not hold the loop); the writer that said hello, if any."""
        sock = self.sockets[shard]
        hello = None
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(NOBLOCK, copy=False)
            except zmq.Again:
                break
            hello = self._hello(shard, frames, now) or hello
        return hello

    def _hello(self, shard: int, frames: list[zmq.Frame], now: int) -> Writer | None:
        if len(frames) < 3 or frames[1].bytes != proto.HELLO:
            log.warning("shard %d socket: a frame that is not a writer's hello dropped", shard)
            return None
        try:
            said_shard, shards, pid = proto.decode([f.bytes for f in frames[1:]])[1]  # Hello
            if not all(type(v) is int for v in (said_shard, shards, pid)):
                raise TypeError("hello fields must be ints")
        except Exception as exc:  # bytes from any peer: never a crash of the router
            log.warning("shard %d socket: an undecodable hello dropped (%s)", shard, exc)
            return None
        if (said_shard, shards) != (shard, self.shards):
            log.error(
                "a writer for shard %s/%s (pid %s) connected to shard %d/%d's socket: ignored",
                said_shard,
                shards,
                pid,
                shard,
                self.shards,
            )
            return None
        fd = None
        with contextlib.suppress(zmq.ZMQError):
            fd = frames[1].get(zmq.SRCFD)
        old = self.up.get(shard)
        if old is not None and old.pid != pid:
            log.warning("shard %d: writer pid %d replaces pid %d", shard, pid, old.pid)
        writer = self.up[shard] = Writer(pid, frames[0].bytes, fd, now)
        self.seen.add(shard)
        return writer

    def gone(self, monitor: zmq.Socket) -> int | None:
        """A disconnect on a shard's socket: the shard, if it was its writer's."""
        shard = self.monitors[monitor]
        event = parse_monitor_message(monitor.recv_multipart())
        writer = self.up.get(shard)
        if writer is None:
            return None
        if writer.fd is not None and event["value"] != writer.fd:
            return None  # another peer of this socket left
        if writer.fd is None and _alive(writer.pid):
            return None  # no descriptor to tell by: the writer is gone when its process is
        del self.up[shard]
        return shard

    def _gone(self, shard: int) -> None:
        if self.up.pop(shard, None) is not None:
            self._lost.append(shard)

    def take_lost(self) -> list[int]:
        """Shards whose writer a send found gone since the last call."""
        lost, self._lost = self._lost, []
        return lost

    def bind(self, address_of: Any) -> list[str]:
        addresses = [address_of(shard) for shard in range(self.shards)]
        for sock, address in zip(self.sockets, addresses, strict=True):
            sock.bind(address)
        return addresses

    def close(self) -> None:
        for sock in self.sockets:
            sock.disable_monitor()
        for sock in (*self.monitors, *self.sockets):
            sock.close(0)


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, exited and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
