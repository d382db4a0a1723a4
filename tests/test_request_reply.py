"""request(): a request, its reply by parentId, the reply inbox of each client, and the
refusals and timeouts a caller sees, through real processes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sdk import aio
from sdk.errors import Timeout
from sdk.subjects import inbox_sender
from sdk.types import Envelope
from tests.harness import wait_for

pytestmark = pytest.mark.integration

SERVICE = "relay.agent.req.service"
ASKER = "relay.agent.req.asker"


def serve(client, *, echo: str = "re") -> None:
    """A service that answers every request with a reply naming what it answered."""

    def answer(envelope: Envelope) -> None:
        client.reply(envelope, {echo: envelope.payload}, sender=SERVICE)

    client.register_endpoint(SERVICE)
    client.subscribe(SERVICE, answer)


def test_request_returns_the_reply_whose_parent_is_the_request(broker):
    service, asker = broker.client(), broker.client()
    serve(service)
    reply = asker.request(SERVICE, "ping", sender=ASKER, timeout=10)
    assert reply.payload == {"re": "ping"}
    assert reply.sender == SERVICE
    request_id = reply.parent_id
    assert asker.trace(request_id)["copies"][0]["subject"] == SERVICE
    inbox = reply.subject  # the reply was stored in the asker's own inbox
    assert inbox_sender(inbox) == ASKER
    assert [e.subject for e in asker.list_endpoints() if e.subject == inbox] == [inbox]


def test_two_clients_of_one_sender_each_get_their_own_replies(broker):
    service = broker.client()
    serve(service)
    askers = [broker.client(), broker.client()]
    got: dict[int, list] = {0: [], 1: []}

    def ask(n: int) -> None:
        for k in range(10):
            got[n].append(askers[n].request(SERVICE, f"{n}-{k}", sender=ASKER).payload)

    threads = [threading.Thread(target=ask, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert got == {n: [{"re": f"{n}-{k}"} for k in range(10)] for n in (0, 1)}


def test_a_wildcard_consumer_never_takes_a_reply_meant_for_a_request(broker):
    service, asker, greedy = broker.client(), broker.client(), broker.client()
    serve(service)
    taken: list[Envelope] = []
    greedy.subscribe("*.relay.agent.req.*.*", taken.append)  # matches the asker's inbox
    for n in range(5):
        assert asker.request(SERVICE, n, sender=ASKER, timeout=10).payload == {"re": n}
    assert taken == []


def test_a_request_to_no_endpoint_is_refused_at_once(broker):
    asker = broker.client()
    with pytest.raises(Exception) as refused:
        asker.request("relay.agent.req.nobody", "hello?", sender=ASKER, timeout=30)
    assert refused.value.code == "no_match"


def test_a_late_reply_is_a_dead_letter_never_handed_to_a_later_request(broker):
    slow, asker = broker.client(), broker.client()
    slow.register_endpoint(SERVICE)
    with pytest.raises(Timeout):
        asker.request(SERVICE, "first", sender=ASKER, timeout=0.5)
    (first,) = slow.fetch(SERVICE, wait=5)
    slow.reply(first.envelope, "too late", sender=SERVICE)
    first.ack()
    dead = wait_for(
        lambda: [d for d in asker.dead_letters() if d["code"] == "late_reply"],
        what="the late reply's dead letter",
    )
    assert len(dead) == 1
    serve(slow, echo="second")
    assert asker.request(SERVICE, "again", sender=ASKER, timeout=10).payload == {"second": "again"}


def test_request_as_a_coroutine(broker):
    serve(broker.client())

    async def main() -> None:
        async with aio.connect(broker.home.root) as asker:
            reply = await asker.request(SERVICE, "async", sender=ASKER, timeout=10)
            assert reply.payload == {"re": "async"}

    asyncio.run(main())
