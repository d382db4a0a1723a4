"""Sending and receiving a multipart message with less Python per part than pyzmq's
``send_multipart`` and ``recv_multipart``.

``Socket.send_multipart`` goes through pyzmq's Python layer for every part and ORs the
flags as enums (``zmq.SNDMORE | flags``), which builds an enum object per part: 3.3 µs
for a three-part message here against 0.9 µs calling the compiled ``send`` with plain
int flags (docs/performance.md). Every message of the router, the writers and the
client's I/O thread on its hot paths is sent this way. Semantics are pyzmq's: every
part but the last with SNDMORE; a message is queued whole or not at all (EAGAIN raised
on the first part, a part that is not bytes-like refused before any is sent); parts
under the socket's copy threshold are copied even with ``copy=False``.

Receiving is the same story: ``recv_multipart`` asks ``getsockopt(zmq.RCVMORE)``
through pyzmq's Python layer after every part, and a loop that reads until ``zmq.Again``
pays for an exception (pyzmq builds a ``ZMQError`` in Python, about 6 µs here) each time
it finds the socket empty, that is once per socket per pass of the router's loop.
`recv_parts` and `recv_frames` read the parts through the compiled calls; `waiting`
asks whether another message waits with one ``zmq_poll`` that does not wait (about
1.2 µs). Measured in docs/performance.md ("Each pass of the router's loop").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq
from zmq.backend import Socket as _CompiledSocket
from zmq.backend import zmq_poll

NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
POLLIN = int(zmq.POLLIN)
_send = _CompiledSocket.send
_recv = _CompiledSocket.recv

# What `waiting` polls: [(socket, POLLIN)], built once per socket by `poll_item`.
PollItem = list[tuple[zmq.Socket, int]]


def send_parts(sock: zmq.Socket, parts: Sequence[Any], flags: int = 0, copy: bool = True) -> None:
    """``sock.send_multipart(parts, flags, copy=copy)``, cheaper (see the module)."""
    for part in parts:  # before any part leaves: half a message would glue onto the next
        if type(part) is not bytes and not isinstance(part, zmq.Frame):
            memoryview(part)  # TypeError unless bytes-like, as send_multipart checks
    flags = int(flags)
    more = flags | _SNDMORE
    for part in parts[:-1]:
        _send(sock, part, more, copy)
    _send(sock, parts[-1], flags, copy)


def recv_parts(sock: zmq.Socket, flags: int = NOBLOCK) -> list[bytes]:
    """``sock.recv_multipart(flags)``, cheaper (see the module). The parts of a message
    arrive together, so only the first can find the socket empty (``zmq.Again``). Each
    part is read as a frame, which says itself whether more follow, and copied out:
    asking ``RCVMORE`` of the compiled socket makes an enum of the option each time
    (3.8 against 2.8 µs for a three-part push, sent and read, here)."""
    return [frame.bytes for frame in recv_frames(sock, flags)]


def recv_frames(sock: zmq.Socket, flags: int = NOBLOCK) -> list[zmq.Frame]:
    """``sock.recv_multipart(flags, copy=False)``, cheaper: each frame says itself
    whether more follow, so no ``RCVMORE`` is asked through pyzmq's Python layer."""
    frame = _recv(sock, flags, False)
    frames = [frame]
    while frame.more:
        frame = _recv(sock, flags, False)
        frames.append(frame)
    return frames


def poll_item(sock: zmq.Socket) -> PollItem:
    """The argument of `waiting` for ``sock``."""
    return [(sock, POLLIN)]


def ready_in(items: list[tuple[Any, int]], timeout_ms: int) -> set[Any]:
    """The sockets and descriptors of ``items`` (each with `POLLIN`) that are readable
    within ``timeout_ms``: ``dict(zmq.Poller().poll(timeout_ms))`` without the Poller,
    whose poll is Python on every pass of a loop."""
    return {item for item, _ in zmq_poll(items, timeout_ms)}


def read_queued(item: PollItem, limit: int) -> list[list[bytes]]:
    """The messages queued on the socket of ``item``, up to ``limit``: the first read at
    once (a poll said one waits; empty if none does after all), each further one only
    once `waiting` says so, rather than reading until ``zmq.Again``: most reads find
    one message, and pyzmq's exception costs more than the message (docs/performance.md,
    "Each pass of the router's loop")."""
    sock = item[0][0]
    try:
        queued = [recv_parts(sock)]
    except zmq.Again:
        return []
    while len(queued) < limit and waiting(item):
        queued.append(recv_parts(sock))
    return queued


def waiting(item: PollItem) -> bool:
    """Whether a message waits on the socket of ``item`` (`poll_item`), without waiting:
    cheaper than a non-blocking receive that raises ``zmq.Again`` when none does."""
    return bool(zmq_poll(item, 0))
