"""What the MCP server and the HTTP gateway hold for their clients (edges/held.py):
pure, time as an argument, no broker."""

from __future__ import annotations

from dataclasses import dataclass

from edges.held import HeldMessages
from sdk.types import Envelope, default_budget

A, B = "relay.agent.p.a", "relay.agent.p.b"


@dataclass(eq=False)
class Fake:
    """Stands for the SDK's Message: what the table reads of one."""

    envelope: Envelope
    endpoint: str
    deliveries: int = 1

    @property
    def id(self) -> str:
        return self.envelope.id


def message(message_id: str, subject: str = A, endpoint: str = "aaaaaaaaaaaa") -> Fake:
    envelope = Envelope(message_id, subject, B, None, default_budget(0), 0, "x")
    return Fake(envelope, endpoint)


ONE, TWO, THREE = (f"01JDQ3ZV9R6Q4W1T3M5N7P8K2{c}" for c in "ABC")


def test_held_messages_are_listed_oldest_first_per_endpoint() -> None:
    held: HeldMessages[Fake] = HeldMessages(ack_wait=60)
    held.hold([message(TWO), message(THREE, B, "bbbbbbbbbbbb"), message(ONE)], now=0)
    assert [m.id for m in held.of(A, now=1)] == [ONE, TWO]
    assert [m.id for m in held.of(B, now=1)] == [THREE]
    assert [m.id for m in held.all(now=1)] == [ONE, TWO, THREE]


def test_a_message_is_forgotten_when_its_ack_deadline_passes() -> None:
    """Given ack_wait 60 s, when 60 s pass unanswered, then it is no longer listed or
    found: the router has handed it out again."""
    held: HeldMessages[Fake] = HeldMessages(ack_wait=60)
    held.hold([message(ONE)], now=100)
    held.hold([message(TWO)], now=130)
    assert [m.id for m in held.all(now=159.9)] == [ONE, TWO]
    assert [m.id for m in held.all(now=160)] == [TWO]
    assert held.find(ONE, None, now=160) == []
    assert held.all(now=190) == []


def test_find_names_a_copy_by_endpoint_hash_or_subject() -> None:
    """A fan-out can hold one id for two endpoints: the endpoint tells them apart."""
    held: HeldMessages[Fake] = HeldMessages()
    a, b = message(ONE, A, "aaaaaaaaaaaa"), message(ONE, B, "bbbbbbbbbbbb")
    held.hold([a, b], now=0)
    assert held.find(ONE, None, now=0) == [a, b]
    assert held.find(ONE, "bbbbbbbbbbbb", now=0) == [b]
    assert held.find(ONE, A, now=0) == [a]
    assert held.find(TWO, None, now=0) == []


def test_forget_removes_only_the_message_it_names() -> None:
    """A message handed out again to this same edge (a new hand-out, a new object) is
    not forgotten by the answer to the old one."""
    held: HeldMessages[Fake] = HeldMessages()
    old = message(ONE)
    held.hold([old], now=0)
    again = message(ONE)
    again.deliveries = 2
    held.hold([again], now=1)
    held.forget(old)
    assert held.find(ONE, None, now=1) == [again]
    held.forget(again)
    assert held.all(now=1) == []
