"""The bridge's stages overlap (edges/bridge.py) without weakening what they promise
(docs/federation.md): a part is confirmed ``relayed`` only once its PubAck came, a
stream message is acked only once the router answered its ingest, and at most a window
of each is in flight. Driven with stand-ins for the SDK client and nats-py whose
answers the test gives, one by one; every wait is on a condition, with a deadline."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from nats.errors import TimeoutError as NatsTimeout

from edges import bridge_names as names
from edges.bridge import Bridge
from sdk.errors import SenderNotAllowed, Unavailable
from sdk.ids import new_id
from sdk.types import Budget, Envelope, PublishResult

DEADLINE_S = 10


class Router:
    """The SDK client: each request is queued for the test, which answers it."""

    def __init__(self) -> None:
        self.asked: asyncio.Queue[tuple[str, dict[str, Any], Future]] = asyncio.Queue()

    def send_request(self, op: str, **fields: Any) -> Future:
        future: Future = Future()
        self.asked.put_nowait((op, fields, future))
        return future

    def ingest_async(self, envelope: Envelope, subjects: list[str], *, node: str) -> Future:
        return self.send_request("ingest", id=envelope.id, node=node)

    async def next(self, op: str) -> tuple[dict[str, Any], Future]:
        asked, fields, future = await asyncio.wait_for(self.asked.get(), DEADLINE_S)
        assert asked == op, f"expected {op}, the bridge asked {asked} {fields}"
        return fields, future


class JetStream:
    """nats-py's JetStream context: publish_async hands back a future the test answers."""

    def __init__(self) -> None:
        self.published: asyncio.Queue[tuple[str, asyncio.Future]] = asyncio.Queue()
        self.headers: list[dict | None] = []  # of each publish, in order

    async def publish_async(
        self, subject: str, payload: bytes, headers: dict | None = None
    ) -> asyncio.Future:
        ack = asyncio.get_running_loop().create_future()
        self.headers.append(headers)
        self.published.put_nowait((json.loads(payload)["envelope"]["id"], ack))
        return ack

    async def next(self) -> tuple[str, asyncio.Future]:
        return await asyncio.wait_for(self.published.get(), DEADLINE_S)


class Stream:
    """The pull subscription: each fetch is queued for the test, which answers it."""

    def __init__(self) -> None:
        self.fetches: asyncio.Queue[tuple[int, asyncio.Future]] = asyncio.Queue()

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        answer = asyncio.get_running_loop().create_future()
        self.fetches.put_nowait((batch, answer))
        return await answer

    async def next(self) -> tuple[int, asyncio.Future]:
        return await asyncio.wait_for(self.fetches.get(), DEADLINE_S)


class Message:
    """A stream message; records how it was settled."""

    def __init__(self, message_id: str) -> None:
        self.subject = names.outbound("b", "a")
        self.data = names.encode_part(
            {"subjects": ["relay.agent.b.bob"], "envelope": envelope(message_id).to_wire()}
        )
        self.settled = asyncio.get_running_loop().create_future()

    async def ack(self) -> None:
        self.settled.set_result("ack")

    async def nak(self, delay: float) -> None:
        self.settled.set_result("nak")

    async def term(self) -> None:
        self.settled.set_result("term")


def envelope(message_id: str) -> Envelope:
    return Envelope(
        id=message_id,
        subject="relay.agent.b.bob",
        sender="relay.agent.a.alice",
        reply_to=None,
        budget=Budget(0, 5, (), 4_102_444_800_000, 10),
        created_at=0,
        payload={},
    )


def part(token: int, message_id: str) -> dict[str, Any]:
    return {
        "token": token,
        "node": "b",
        "subjects": ["relay.agent.b.bob"],
        "envelope": envelope(message_id).to_wire(),
    }


def bridge(router: Router) -> Bridge:
    b = Bridge(router, ["nats://127.0.0.1:4222"], "a")  # type: ignore[arg-type]
    b.nc = SimpleNamespace(connected_url=None, servers=[])
    b.js, b.sub = JetStream(), Stream()
    return b


async def running(coroutine: Any, test: Any) -> None:
    task = asyncio.create_task(coroutine)
    try:
        await test()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_a_part_goes_to_jetstream_with_no_deduplication_id():
    """A node's stream takes the parts of every node, and JetStream drops a message
    whose Nats-Msg-Id an earlier one named, whoever named it: with the message id as
    that header, another node could have this node's part dropped by naming its id
    first. The far router de-duplicates by (origin node, id) instead."""

    async def scenario() -> None:
        router = Router()
        b = bridge(router)
        js: JetStream = b.js

        async def test() -> None:
            _, answer = await router.next("relay_take")
            message_id = new_id()
            answer.set_result({"parts": [part(1, message_id)]})
            published, _ = await js.next()
            assert published == message_id
            assert "Nats-Msg-Id" not in (js.headers[0] or {})

        await running(b._outbound(), test)

    asyncio.run(scenario())


def test_the_next_take_is_asked_while_pubacks_wait_and_only_pubacked_parts_are_relayed():
    async def scenario() -> None:
        router = Router()
        b = bridge(router)
        js: JetStream = b.js

        async def test() -> None:
            take, answer = await router.next("relay_take")
            assert take["limit"] == names.OUTBOUND_WINDOW
            m1, m2, m3 = new_id(), new_id(), new_id()
            answer.set_result({"parts": [part(1, m1), part(2, m2), part(3, m3)]})
            acks = dict([await js.next() for _ in range(3)])
            # Given three parts in JetStream's hands, none answered yet,
            # Then the bridge asks for more, for what room its window has left.
            take, _ = await router.next("relay_take")
            assert take["limit"] == names.OUTBOUND_WINDOW - 3
            assert router.asked.empty(), "nothing is confirmed before its PubAck"
            # When one PubAck comes, that part alone is relayed;
            acks[m2].set_result(SimpleNamespace(seq=1))
            relayed, answer = await router.next("relayed")
            assert relayed["parts"] == [[2, "b", None]]
            # while that confirmation is on its way, the others land, and go together.
            acks[m1].set_exception(RuntimeError("no quorum"))
            acks[m3].set_result(SimpleNamespace(seq=2))
            answer.set_result({})
            relayed, _ = await router.next("relayed")
            (token, node, why), three = relayed["parts"]
            assert (token, node) == (1, "b") and "no quorum" in why
            assert three == [3, "b", None]

        await running(b._outbound(), test)

    asyncio.run(scenario())


def test_the_next_fetch_is_asked_while_ingests_wait_and_each_message_is_settled_on_its_answer(
    monkeypatch,
):
    monkeypatch.setattr(names, "INBOUND_WINDOW", 3)

    async def scenario() -> None:
        router = Router()
        b = bridge(router)
        stream: Stream = b.sub

        async def test() -> None:
            batch, answer = await stream.next()
            assert batch == 3  # the window's room, under FETCH_BATCH
            first, second, third = (Message(new_id()) for _ in range(3))
            answer.set_result([first, second])
            ingests = [await router.next("ingest") for _ in range(2)]
            assert [i["node"] for i, _ in ingests] == ["a", "a"]  # from the stream subject
            # Given two ingests the router has not answered,
            # Then the bridge fetches again, for the one place its window has left;
            batch, answer = await stream.next()
            assert batch == 1
            answer.set_result([third])
            ingests.append(await router.next("ingest"))
            # and no more until one of the three is settled.
            assert stream.fetches.empty()
            assert not any(m.settled.done() for m in (first, second, third))
            # When the router answers, each message is settled by its own answer:
            (_, stored), (_, busy), (_, refused) = ingests
            busy.set_exception(Unavailable("being stored"))
            assert await asyncio.wait_for(second.settled, DEADLINE_S) == "nak"
            assert not first.settled.done() and not third.settled.done()
            batch, _ = await stream.next()  # the place it left, taken again
            assert batch == 1
            stored.set_result(PublishResult(id_of(first), 1))
            refused.set_exception(SenderNotAllowed("not from node a"))
            assert await asyncio.wait_for(first.settled, DEADLINE_S) == "ack"
            assert await asyncio.wait_for(third.settled, DEADLINE_S) == "term"

        await running(b._inbound(), test)

    asyncio.run(scenario())


def id_of(message: Message) -> str:
    return names.decode_part(message.data)[1].id


def test_a_fetch_that_times_out_either_way_is_asked_again():
    """nats-py's fetch raises its own TimeoutError, or asyncio's bare one when the
    server's answer comes right at the deadline: neither may end the inbound stage."""

    async def scenario() -> None:
        b = bridge(Router())
        stream: Stream = b.sub

        async def test() -> None:
            for timeout in (NatsTimeout(), TimeoutError()):
                _, answer = await stream.next()
                answer.set_exception(timeout)
            await stream.next()

        await running(b._inbound(), test)

    asyncio.run(scenario())
