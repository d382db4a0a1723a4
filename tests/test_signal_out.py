"""The router's outgoing signals: runs on one subject leave as one message, in order, and
version 1 subscribers still get one signal per message.

A real XPUB/SUB pair over inproc (ZeroMQ runs in microseconds; nothing to mock).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
import zmq

from broker.router.signal_out import SignalOutbox
from sdk import wire

_addresses = itertools.count()
RUNS = wire.SIGNAL_RUN


class Bus:
    """An XPUB feeding an outbox's subscription tracking, and SUBs to read what leaves."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.address = f"inproc://signal-out-{next(_addresses)}"
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.bind(self.address)
        self.out = SignalOutbox()

    def subscriber(self, topic: bytes) -> zmq.Socket:
        sub = self.ctx.socket(zmq.SUB)
        sub.connect(self.address)
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.take_subscriptions(expect=1)
        return sub

    def take_subscriptions(self, expect: int) -> None:
        """Feed the outbox the XPUB's subscription messages, ``expect`` of them."""
        deadline = time.monotonic() + 5
        while expect:
            assert self.pub.poll(max(1, int((deadline - time.monotonic()) * 1000)))
            self.out.subscription(self.pub.recv())
            expect -= 1


@pytest.fixture
def bus() -> Iterator[Bus]:
    bus = Bus()
    yield bus
    bus.ctx.destroy(0)


def _messages(sub: zmq.Socket) -> list[tuple[bytes, list[object]]]:
    got = []
    while sub.poll(100):
        frames = sub.recv_multipart()
        got.append((frames[0], wire.decode_signals(frames)[1]))
    return got


def test_signals_on_one_subject_in_a_row_leave_as_one_run(bus):
    sub = bus.subscriber(RUNS + b"a")
    for n in range(5):
        bus.out.add("a.b", {"n": n})
    bus.out.flush(bus.pub)
    assert _messages(sub) == [(RUNS + b"a.b", [{"n": n} for n in range(5)])]


def test_only_neighbours_are_joined_so_every_subscriber_sees_the_emitted_order(bus):
    sub = bus.subscriber(RUNS)
    for n, subject in enumerate(["a", "a", "b", "a", "b", "b"]):
        bus.out.add(subject, {"n": n})
    bus.out.flush(bus.pub)
    assert _messages(sub) == [
        (RUNS + b"a", [{"n": 0}, {"n": 1}]),
        (RUNS + b"b", [{"n": 2}]),
        (RUNS + b"a", [{"n": 3}]),
        (RUNS + b"b", [{"n": 4}, {"n": 5}]),
    ]


def test_a_run_longer_than_the_limit_is_cut_and_a_flush_empties_the_outbox(bus):
    sub = bus.subscriber(RUNS)
    bus.out.limit = 3
    for n in range(7):
        bus.out.add("a", {"n": n})
    bus.out.flush(bus.pub)
    bus.out.flush(bus.pub)  # nothing left: sends nothing
    assert [len(signals) for _, signals in _messages(sub)] == [3, 3, 1]


def test_a_version_1_subscription_gets_single_signals_only_while_it_lasts(bus):
    runs, single = bus.subscriber(RUNS + b"a"), bus.subscriber(b"a")
    bus.out.add("a.b", {"n": 0})
    bus.out.add("a.b", {"n": 1})
    bus.out.add("x.y", {"n": 2})  # nobody asked for x.y one by one
    bus.out.flush(bus.pub)
    assert _messages(single) == [(b"a.b", [{"n": 0}]), (b"a.b", [{"n": 1}])]
    assert _messages(runs) == [(RUNS + b"a.b", [{"n": 0}, {"n": 1}])]

    single.close()  # XPUB reports the topic gone when its last subscriber leaves
    bus.take_subscriptions(expect=1)
    bus.out.add("a.b", {"n": 3})
    assert not bus.out._single("a.b")
    bus.out.flush(bus.pub)
    assert _messages(runs) == [(RUNS + b"a.b", [{"n": 3}])]


def test_the_outbox_hears_a_subscriber_while_one_is_subscribed(bus):
    assert not bus.out.heard  # nobody subscribed: the router makes no receipts
    sub = bus.subscriber(RUNS + b"relay.agent")  # a subscriber that takes runs
    assert bus.out.heard
    sub.setsockopt(zmq.UNSUBSCRIBE, RUNS + b"relay.agent")
    bus.take_subscriptions(expect=1)
    assert not bus.out.heard


def test_a_version_1_subscriber_is_heard_too(bus):
    sub = bus.subscriber(b"")
    assert bus.out.heard
    sub.close(0)  # gone: XPUB reports its topics unsubscribed
    bus.take_subscriptions(expect=1)
    assert not bus.out.heard
