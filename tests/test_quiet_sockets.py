"""broker/router/quiet_sockets.py against real ZeroMQ sockets (inproc): one descriptor
that says when one of several sockets may have a message, and `ready` that says which."""

from __future__ import annotations

import select

import pytest
import zmq

from broker.router.quiet_sockets import QuietSockets
from sdk.sockets import NOBLOCK, poll_item, waiting

WAIT_S = 5.0


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


@pytest.fixture
def links():
    """Two quiet sockets with a peer each, as the router's shard sockets have writers."""
    ctx = zmq.Context()
    quiet, peers = [], []
    for n in range(2):
        router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        router.bind(f"inproc://quiet-{n}")
        dealer.connect(f"inproc://quiet-{n}")
        quiet.append(router)
        peers.append(dealer)
    watched = QuietSockets(quiet)
    watched.ready()  # the connections' own commands processed: quiet from here
    yield watched, quiet, peers
    watched.close()
    ctx.destroy(0)


def read_all(sock: zmq.Socket) -> int:
    """Read until nothing waits, as the loop does with each socket `ready` names."""
    item, count = poll_item(sock), 0
    while waiting(item):
        sock.recv_multipart(NOBLOCK)
        count += 1
    return count


def test_a_message_on_one_socket_wakes_the_descriptor_and_ready_names_that_socket(links):
    watched, quiet, peers = links
    assert not readable(watched.fileno(), 0)
    peers[1].send(b"hello")
    assert readable(watched.fileno(), WAIT_S)
    assert watched.ready() == {quiet[1]}


def test_the_descriptor_is_quiet_once_read_and_wakes_again_at_the_next_message(links):
    watched, quiet, peers = links
    peers[0].send(b"hello")
    assert readable(watched.fileno(), WAIT_S)
    assert watched.ready() == {quiet[0]}
    assert read_all(quiet[0]) == 1
    assert not readable(watched.fileno(), 0)
    peers[0].send(b"again")
    assert readable(watched.fileno(), WAIT_S)  # nothing the loop must see is missed
    assert watched.ready() == {quiet[0]}


def test_ready_names_a_socket_whose_messages_were_not_all_read(links):
    """The sweep's call: what a partial read left is found by asking, not by waiting."""
    watched, quiet, peers = links
    peers[0].send(b"one")
    peers[0].send(b"two")
    assert readable(watched.fileno(), WAIT_S)
    assert watched.ready() == {quiet[0]}
    quiet[0].recv_multipart(NOBLOCK)
    assert watched.ready() == {quiet[0]}
    assert read_all(quiet[0]) == 1
    assert watched.ready() == set()
