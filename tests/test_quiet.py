"""sdk/quiet.py: the queue of signals sent without reply, alone (threads, no sockets)."""

from __future__ import annotations

import threading

import pytest

from sdk.errors import Unavailable
from sdk.quiet import Full, QuietSignals


def test_a_request_in_between_opens_a_new_segment_and_each_marker_takes_one():
    quiet = QuietSignals(limit=10)
    assert quiet.add(b"s1", requests_sent=0) is True  # opened: send a marker
    assert quiet.add(b"s2", requests_sent=0) is False  # joined
    assert quiet.add(b"s3", requests_sent=1) is True  # a request went out in between
    assert quiet.take() == [b"s1", b"s2"]
    assert quiet.take() == [b"s3"]
    assert quiet.take() == []


def test_a_full_queue_refuses_at_once_with_no_wait_and_taking_makes_room():
    quiet = QuietSignals(limit=2)
    quiet.add(b"a", 0)
    quiet.add(b"b", 0)
    with pytest.raises(Full):
        quiet.wait_for_room(0)
    quiet.take()
    quiet.wait_for_room(0)  # room again


def test_a_caller_waiting_for_room_is_woken_by_take_and_by_close():
    quiet = QuietSignals(limit=1)
    quiet.add(b"a", 0)
    outcomes: list[str] = []

    def wait() -> None:
        try:
            quiet.wait_for_room(30)
            outcomes.append("room")
        except Unavailable:
            outcomes.append("closed")

    first = threading.Thread(target=wait)
    first.start()
    quiet.take()
    first.join(10)
    quiet.add(b"b", 0)
    second = threading.Thread(target=wait)
    second.start()
    quiet.close()
    second.join(10)
    assert outcomes == ["room", "closed"]


def test_a_withdrawn_segment_leaves_nothing_behind():
    quiet = QuietSignals(limit=1)
    quiet.add(b"kept", 0)
    quiet.take()
    quiet.add(b"unsent", 1)
    quiet.withdraw_last()
    assert quiet.take() == []
    quiet.wait_for_room(0)  # its count is gone too
