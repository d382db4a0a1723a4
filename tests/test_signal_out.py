"""The router's outgoing signals: runs on one subject leave as one PUB message, in order.

A real PUB/SUB pair over inproc (ZeroMQ runs in microseconds; nothing to mock).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import zmq

from broker.signal_out import SignalOutbox
from sdk import wire

_addresses = itertools.count()


@pytest.fixture
def pub_sub() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    address = f"inproc://signal-out-{next(_addresses)}"
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    pub.bind(address)
    sub.connect(address)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    # inproc connects at once, but the subscription still travels: probe until it lands.
    while True:
        pub.send_multipart([b"probe", wire.packb({})])
        if sub.poll(10):
            sub.recv_multipart()
            break
    while sub.poll(50):  # the other probes
        sub.recv_multipart()
    yield pub, sub
    ctx.destroy(0)


def _messages(sub: zmq.Socket) -> list[tuple[str, list[object]]]:
    got = []
    while sub.poll(100):
        got.append(wire.decode_signals(sub.recv_multipart()))
    return got


def test_signals_on_one_subject_in_a_row_leave_as_one_message(pub_sub):
    pub, sub = pub_sub
    out = SignalOutbox()
    for n in range(5):
        out.add("a.b", {"n": n})
    out.flush(pub)
    assert _messages(sub) == [("a.b", [{"n": n} for n in range(5)])]


def test_only_neighbours_are_joined_so_every_subscriber_sees_the_emitted_order(pub_sub):
    pub, sub = pub_sub
    out = SignalOutbox()
    for n, subject in enumerate(["a", "a", "b", "a", "b", "b"]):
        out.add(subject, {"n": n})
    out.flush(pub)
    assert _messages(sub) == [
        ("a", [{"n": 0}, {"n": 1}]),
        ("b", [{"n": 2}]),
        ("a", [{"n": 3}]),
        ("b", [{"n": 4}, {"n": 5}]),
    ]


def test_a_run_longer_than_the_limit_is_cut_and_a_flush_empties_the_outbox(pub_sub):
    pub, sub = pub_sub
    out = SignalOutbox(limit=3)
    for n in range(7):
        out.add("a", {"n": n})
    out.flush(pub)
    out.flush(pub)  # nothing left: sends nothing
    assert [len(signals) for _, signals in _messages(sub)] == [3, 3, 1]
