"""The transport's leader/follower (sdk/transport.py): a synchronous call alone in flight
sends its request and reads its reply on the caller's thread, and lets go of the socket
when the I/O thread needs it; a request sent without waiting, with few in flight, leaves
from its caller's thread and its reply is the I/O thread's to read. Against real router
and writer processes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sdk import wire
from sdk.client import _fetch_fields, _publish_fields
from sdk.sockets import waiting
from sdk.transport import SENT_HERE_IN_FLIGHT, Request, Transport
from tests.harness import StandIn, wait_for

pytestmark = pytest.mark.integration

A = "relay.agent.leader.a"
B = "relay.agent.leader.b"
SENDER = "relay.agent.leader.cli"


class StuckIoThread:
    """A `Consumer` whose `answers_due`, which the I/O thread calls on every turn of its
    loop, holds that thread once armed: it then sends and reads nothing."""

    def __init__(self) -> None:
        self.armed = False
        self.stuck = threading.Event()
        self.release = threading.Event()

    def pushed(self, push: wire.Push) -> None:
        pass

    def router_holds(self, subs: set[int]) -> None:
        pass

    def expects_pushes(self, besides: object = None) -> bool:
        return False

    def answers_due(self, now: float, send: Callable[[list[Request]], None]) -> float | None:
        if self.armed:
            self.stuck.set()
            self.release.wait(30)
        return None


@contextlib.contextmanager
def held_io_thread(broker: Any, timeout: float) -> Iterator[tuple[Transport, StuckIoThread]]:
    """A transport to the broker whose I/O thread is held (sends and reads nothing)
    until the block lets it go (``release``) or ends."""
    io_thread = StuckIoThread()
    transport = Transport(broker.home.router_address, timeout=timeout, quiet_limit=10)
    transport.open(io_thread, lambda messages: None)
    try:
        io_thread.armed = True
        wait_for(io_thread.stuck.is_set, what="the I/O thread held")
        yield transport, io_thread
    finally:
        io_thread.release.set()
        transport.close()


def test_a_call_alone_in_flight_is_answered_while_the_io_thread_is_busy(broker):
    """Given the I/O thread held elsewhere, when a caller makes a call with nothing else
    in flight, then it is answered: the caller sent it and read its reply itself."""
    with held_io_thread(broker, timeout=3) as (transport, _):
        assert "endpoints" in transport.call("endpoints")


def _reply_waits(transport: Transport) -> bool:
    """Whether a message waits on the transport's socket, asked as its holder."""
    with transport._dealer_lock:
        return waiting(transport._dealer_item)


def test_a_request_sent_without_waiting_leaves_from_its_caller_while_few_are_in_flight(
    broker,
):
    """Given the I/O thread held elsewhere, when a caller sends a request without waiting
    (`sent_here`, as `publish_async` does) with nothing in flight, then it reaches the
    router: its caller sent it. Once SENT_HERE_IN_FLIGHT requests await replies, the
    next one is queued for the I/O thread instead, to leave with others as one batch."""
    client = broker.client()
    for subject in (A, B):
        client.register_endpoint(subject)
    with held_io_thread(broker, timeout=20) as (transport, io_thread):
        fields = _publish_fields(A, "first", SENDER, None, None, None)
        first = transport.send_request("publish", sent_here=True, **fields)
        assert [m.envelope.payload for m in client.fetch(A, wait=10)] == ["first"]

        for _ in range(SENT_HERE_IN_FLIGHT - 1):  # parked by the router: none waits on B
            transport.send_request("fetch", sent_here=True, **_fetch_fields(B, 1, 15, None))
        assert transport._queued == 0
        fields = _publish_fields(A, "second", SENDER, None, None, None)
        second = transport.send_request("publish", sent_here=True, **fields)
        assert transport._queued == 1
        io_thread.release.set()
        assert first.result(10)["deliveredTo"] == 1
        assert second.result(10)["deliveredTo"] == 1


def test_a_caller_that_sent_without_waiting_leaves_the_replies_to_the_io_thread(broker):
    """Given a reply waiting on the socket for a request whose done-callback takes a
    lock, when a caller holding that lock sends a request without waiting, then its send
    returns without reading that reply (its callback would wait for the lock inside the
    call), and the I/O thread reads it once free: nothing read by nobody."""
    client = broker.client()
    client.register_endpoint(A)
    lock, seen, sent = threading.Lock(), [], threading.Event()

    def record(done: Any) -> None:
        with lock:
            seen.append((done.result()["deliveredTo"], threading.current_thread().name))

    def send_holding_the_lock(transport: Transport) -> None:
        with lock:
            fields = _publish_fields(A, 2, SENDER, None, None, None)
            transport.send_request("publish", sent_here=True, **fields)
            sent.set()

    with held_io_thread(broker, timeout=20) as (transport, io_thread):
        fields = _publish_fields(A, 1, SENDER, None, None, None)
        transport.send_request("publish", sent_here=True, **fields).add_done_callback(record)
        wait_for(lambda: _reply_waits(transport), what="the first publish's reply")
        threading.Thread(target=send_holding_the_lock, args=(transport,), daemon=True).start()
        wait_for(sent.is_set, what="the send under the lock returned")
        assert seen == []
        io_thread.release.set()
        wait_for(lambda: seen == [(1, "relay-client-io")], what="the callback, by the I/O thread")


def _waiting_fetch(client: Any) -> tuple[threading.Thread, list[Any]]:
    """A fetch on A that waits up to 10 s, on a thread of its own, once it holds the
    client's socket (nothing waits on A, and nothing else is in flight)."""
    fetched: list[Any] = []
    thread = threading.Thread(target=lambda: fetched.append(client.fetch(A, wait=10)))
    thread.start()
    lock = client._transport._dealer_lock
    wait_for(lambda: lock.locked() and client._transport._futures, what="the fetch leading")
    return thread, fetched


def test_a_caller_waiting_on_the_socket_lets_other_callers_through(broker):
    """Given a caller reading the socket for a long fetch, when another thread publishes,
    then its publish is answered while the fetch still waits."""
    client = broker.client()
    for subject in (A, B):
        client.register_endpoint(subject)
    thread, fetched = _waiting_fetch(client)
    assert client.publish(B, 1, sender=SENDER).delivered_to == 1
    assert thread.is_alive() and not fetched  # the fetch still waits
    message_id = client.publish(A, 2, sender=SENDER).message_id
    thread.join(10)
    assert [m.id for m in fetched[0]] == [message_id]


def test_pings_leave_while_a_caller_waits_on_the_socket(broker):
    """Given a router that ends a session silent for 1 s, when a caller reads the socket
    for 2 s, then the client's pings still leave: the router kept its session."""
    client = broker.client()
    client.register_endpoint(A)
    client.set_config({"delivery": {"sessionTimeoutMs": 1000}})
    wait_for(lambda: client._transport._ping_every <= 0.25, what="pings every 250 ms")
    session = client._transport.session
    assert client.fetch(A, wait=2) == []  # nothing else in flight: it leads
    assert client._transport.call("ping")["session"] == session


def _threads_reading_pushes(client: Any) -> list[str]:
    """The names of the threads that dispatch the client's pushed messages, in order."""
    subscriptions, names = client._subscriptions, []

    def noting(push: wire.Push) -> None:
        names.append(threading.current_thread().name)
        subscriptions.pushed(push)

    client._transport._consumer = StandIn(subscriptions, pushed=noting)
    return names


def test_a_subscription_s_handler_thread_reads_its_messages_from_the_socket(broker):
    """Given a client whose one subscription waits for messages, when they come one at a
    time, then its handler thread reads each from the socket itself: none is handed over
    by the I/O thread (docs/performance.md, "The SDK's hand-offs")."""
    publisher, consumer = broker.client(), broker.client()
    publisher.register_endpoint(A)
    handled: list[Any] = []
    consumer.subscribe(A, handled.append)
    readers = _threads_reading_pushes(consumer)
    for n in range(5):
        publisher.publish(A, n, sender=SENDER)
        wait_for(lambda n=n: len(handled) == n + 1, what=f"message {n} handled")
    assert [e.payload for e in handled] == list(range(5))
    assert readers == ["relay-handler"] * 5, readers


def test_while_a_handler_runs_the_socket_is_read_for_another_subscription(broker):
    """Given a handler thread that read its message from the socket and is busy with it,
    when a message for another subscription of the same client comes, then that one is
    handled meanwhile: a busy handler does not keep the socket unread for others."""
    publisher, consumer = broker.client(), broker.client()
    for subject in (A, B):
        publisher.register_endpoint(subject)
    entered, release, on_b = threading.Event(), threading.Event(), threading.Event()

    def busy(_envelope: Any) -> None:
        entered.set()
        release.wait(30)

    consumer.subscribe(B, lambda _envelope: on_b.set())
    consumer.subscribe(A, busy)
    try:
        publisher.publish(A, "work", sender=SENDER)
        assert entered.wait(10), "A's handler started"
        publisher.publish(B, "other", sender=SENDER)
        assert on_b.wait(10), "B's message handled while A's handler is busy"
    finally:
        release.set()
