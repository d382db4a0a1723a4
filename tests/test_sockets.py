"""sdk.sockets against real ZeroMQ sockets (inproc): pyzmq's semantics, with less Python."""

from __future__ import annotations

import pytest
import zmq

from sdk.sockets import NOBLOCK, poll_item, recv_frames, recv_parts, send_parts, waiting


@pytest.fixture
def pair():
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.sndhwm = 1
    pull.rcvhwm = 1
    push.bind("inproc://parts")
    pull.connect("inproc://parts")
    yield push, pull
    ctx.destroy(0)


@pytest.mark.parametrize("copy", [True, False])
def test_the_parts_arrive_as_one_message_in_order(pair, copy):
    push, pull = pair
    big = bytes(range(256)) * 1024  # over the copy threshold: zero-copy when asked
    send_parts(push, [b"id", b"", memoryview(b"body"), big], copy=copy)
    assert pull.recv_multipart() == [b"id", b"", b"body", big]


def test_a_full_queue_refuses_the_whole_message_without_blocking(pair):
    push, pull = pair
    sent = 0
    with pytest.raises(zmq.Again):
        for _ in range(100):  # the high-water marks hold a few messages at most
            send_parts(push, [b"a", b"b"], NOBLOCK)
            sent += 1
    received = []
    while pull.poll(100):
        received.append(pull.recv_multipart())
    assert received == [[b"a", b"b"]] * sent


def test_a_part_that_is_not_bytes_refuses_the_whole_message(pair):
    push, pull = pair
    with pytest.raises(TypeError):
        send_parts(push, [b"id", "text is not bytes"])
    send_parts(push, [b"next", b"message"])
    assert pull.recv_multipart() == [b"next", b"message"]  # nothing glued in front


def test_recv_parts_reads_one_whole_message_at_a_time(pair):
    push, pull = pair
    pull.rcvhwm = 10
    send_parts(push, [b"id", b"", b"body"])
    send_parts(push, [b"next"])
    assert pull.poll(5000)
    assert recv_parts(pull) == [b"id", b"", b"body"]
    assert pull.poll(5000)
    assert recv_parts(pull) == [b"next"]
    with pytest.raises(zmq.Again):
        recv_parts(pull)


def test_recv_frames_reads_one_whole_message_as_frames(pair):
    push, pull = pair
    send_parts(push, [b"id", b"", b"body"])
    assert pull.poll(5000)
    frames = recv_frames(pull)
    assert [frame.bytes for frame in frames] == [b"id", b"", b"body"]
    with pytest.raises(zmq.Again):
        recv_frames(pull)


def test_waiting_says_whether_a_message_waits_without_reading_it(pair):
    push, pull = pair
    item = poll_item(pull)
    assert not waiting(item)
    send_parts(push, [b"a", b"b"])
    assert pull.poll(5000)
    assert waiting(item)
    assert waiting(item)  # asking again reads nothing
    assert recv_parts(pull) == [b"a", b"b"]
    assert not waiting(item)
