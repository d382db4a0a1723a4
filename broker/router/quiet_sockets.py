"""The router's rarely readable sockets, watched through one descriptor.

``zmq_poll`` asks every ZeroMQ socket it is given for its events twice per blocking call
(before it waits and after it wakes), each time a ``poll`` of the socket's mailbox and
a ``getpid`` (libzmq's check for a fork): about 1 µs per socket per pass of the
router's loop. Most of the router's sockets are readable only at a writer's hello (a
shard socket), a connection's handshake (ZAP) or a disconnect (the monitors): 2N + 2 of
them with N shards, each shard adding two to every pass (docs/performance.md, "What the
second shard cost the router"). So the loop polls
its busy sockets and one epoll descriptor over the ``ZMQ_FD`` of each of these, and asks
them for their events only when that descriptor is readable (and at each sweep).

A socket's ``ZMQ_FD`` is its command mailbox, not its messages: it becomes readable
when a command (such as "a message waits on a pipe that was empty") reaches a socket
that had processed all of its own, and stays readable until the socket processes its
commands (any operation on it, or `ready`). So the contract, as libzmq states it for
``ZMQ_FD``: the caller reads each socket `ready` names until no message waits on it, and
nothing else reads these sockets. A send processes the sending socket's commands too
(libzmq does so about once a millisecond of sends): the shard sockets are sent on while
their writer is up, so a second hello on one may wait for the sweep's call of `ready`
(every ``POLL_MS``), as junk from a stray peer does; a hello from a writer not up, which
gets nothing sent, is seen at once.
"""

from __future__ import annotations

import select
from collections.abc import Sequence

import zmq
from zmq.backend import zmq_poll

_POLLIN = int(zmq.POLLIN)


class QuietSockets:
    def __init__(self, sockets: Sequence[zmq.Socket]) -> None:
        self._items = [(sock, _POLLIN) for sock in sockets]
        self._epoll = select.epoll()
        for sock in sockets:
            self._epoll.register(int(sock.getsockopt(zmq.FD)), select.EPOLLIN)

    def fileno(self) -> int:
        """Readable when one of the sockets may have a message (ask `ready`)."""
        return self._epoll.fileno()

    def ready(self) -> set[zmq.Socket]:
        """The sockets a message waits on (their events asked, so the descriptor is
        quiet again until a new command reaches one of them)."""
        return {sock for sock, _ in zmq_poll(self._items, 0)}

    def close(self) -> None:
        self._epoll.close()
