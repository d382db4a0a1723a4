"""The asyncio SDK (sdk/aio.py) against real router and writer processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from sdk.aio import AsyncClient, connect
from sdk.errors import InvalidMessage, InvalidState, Timeout, Unavailable
from sdk.types import Envelope, Signal, SignalType
from tests.harness import park_io_thread, wait_for

pytestmark = pytest.mark.integration

A = "relay.agent.demo.a"
B = "relay.agent.demo.b"
SENDER = "relay.agent.demo.cli"


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 10.0, what: str = "condition"
) -> Any:
    """Await check() until it returns something truthy; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


async def state_of(client: AsyncClient, message_id: str) -> str:
    return (await client.trace(message_id))["copies"][0]["state"]


@contextlib.contextmanager
def writers_stopped(broker) -> Iterator[None]:
    """Freeze every writer (SIGSTOP): the router waits for them, so requests hang."""
    procs = [p for name, p in broker.procs.items() if name.startswith("writer")]
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)


def test_coroutine_handler_runs_on_the_callers_loop_and_acks(broker):
    async def main() -> None:
        async with connect(broker.home.root) as client:
            await client.register_endpoint(A)
            loop = asyncio.get_running_loop()
            got: list[tuple[Envelope, bool]] = []
            arrived = asyncio.Event()

            async def handler(envelope: Envelope) -> None:
                await asyncio.sleep(0)  # a real coroutine, suspended once
                got.append((envelope, asyncio.get_running_loop() is loop))
                arrived.set()

            await client.subscribe(A, handler)
            result = await client.publish(A, {"content": "hi"}, sender=SENDER, reply_to=SENDER)
            assert result.delivered_to == 1
            await asyncio.wait_for(arrived.wait(), 10)
            envelope, on_loop = got[0]
            assert on_loop, "a coroutine handler runs on the loop that subscribed"
            assert envelope.id == result.message_id and envelope.payload == {"content": "hi"}
            assert envelope.reply_to == SENDER
            await eventually(
                lambda: _is(state_of(client, result.message_id), "done"), what="the ack"
            )

    asyncio.run(main())


def test_plain_function_handlers_and_observers_work_too(broker):
    async def main() -> None:
        async with connect(broker.home.root) as client:
            await client.register_endpoint(A)
            consumed, watched = [], []
            await client.subscribe(A, lambda e: consumed.append(e.payload))
            await client.observe("relay.agent.>", lambda e: watched.append(e.payload))
            for i in range(3):
                await client.publish(A, i, sender=SENDER)
            await eventually(
                _now(lambda: len(consumed) == 3 and len(watched) == 3), what="all three, twice"
            )
            assert consumed == watched == [0, 1, 2]

    asyncio.run(main())


def test_coroutine_handler_that_raises_nacks_into_dead_letters(broker):
    async def main() -> None:
        async with connect(broker.home.root) as client:
            info = await client.register_endpoint(A)

            async def handler(envelope: Envelope) -> None:
                await asyncio.sleep(0)
                if envelope.payload == "poison":
                    raise ValueError("cannot digest poison")

            await client.subscribe(A, handler)
            bad = (await client.publish(A, "poison", sender=SENDER)).message_id
            good = (await client.publish(A, "fine", sender=SENDER)).message_id
            letters = await eventually(
                lambda: client.dead_letters(info.hash), what="the dead letter"
            )
            assert [d["id"] for d in letters] == [bad]
            assert letters[0]["code"] == "nack"
            assert "ValueError: cannot digest poison" in letters[0]["reason"]
            await eventually(
                lambda: _is(state_of(client, good), "done"), what="the next message to be acked"
            )

    asyncio.run(main())


def test_a_dead_letter_requeued_with_the_async_client_is_fetched_again(broker):
    async def main() -> None:
        async with connect(broker.home.root) as client:
            info = await client.register_endpoint(A)
            sent = (await client.publish(A, "retry", sender=SENDER)).message_id
            (held,) = await client.fetch(A, wait=5)
            await held.nack("not yet")
            answer = await client.requeue_dead_letters(info.hash, message_id=sent)
            assert answer["requeued"] == [{"id": sent, "endpoint": info.hash}]
            (again,) = await client.fetch(A, wait=5)
            assert (again.id, again.deliveries) == (sent, 1)
            await again.ack()

    asyncio.run(main())


def test_reply_from_a_coroutine_handler_reaches_the_asker(broker):
    async def main() -> None:
        async with connect(broker.home.root) as server, connect(broker.home.root) as asker:
            await server.register_endpoint(A)
            await asker.register_endpoint(B)

            async def serve(envelope: Envelope) -> None:
                await server.reply(envelope, {"answer": envelope.payload["n"] * 2}, sender=A)

            answers: asyncio.Queue[Envelope] = asyncio.Queue()
            await server.subscribe(A, serve)
            await asker.subscribe(B, answers.put)  # a bound coroutine method is fine too
            question = await asker.publish(A, {"n": 21}, sender=B, reply_to=B)
            answer = await asyncio.wait_for(answers.get(), 10)
            assert answer.payload == {"answer": 42}
            assert answer.subject == B and answer.sender == A and answer.reply_to == A
            # the budget travelled with the conversation: one hop per leg
            assert answer.budget.hop_count == 2 and answer.budget.ancestor_chain == (A, B)
            assert await state_of(server, question.message_id) in ("claimed", "done")
            with pytest.raises(InvalidMessage, match="no replyTo"):
                await server.reply(dataclasses.replace(answer, reply_to=None), 1, sender=A)

    asyncio.run(main())


def test_on_signal_with_a_coroutine_handler_and_async_unsubscribe(broker):
    async def main() -> None:
        async with connect(broker.home.root) as client:
            await client.register_endpoint(A)
            loop = asyncio.get_running_loop()
            first: list[Signal] = []
            second: asyncio.Queue[tuple[str, Signal]] = asyncio.Queue()

            async def on_first(subject: str, sig: Signal) -> None:
                await asyncio.sleep(0)
                first.append(sig)

            stop_first = await client.on_signal("relay.agent.demo.*", on_first)
            await client.on_signal(
                A, lambda subject, sig: loop.call_soon_threadsafe(second.put_nowait, (subject, sig))
            )

            def typing(state: str) -> Signal:
                return Signal(SignalType.TYPING, state, A, int(time.time() * 1000), {"k": 1})

            async def joined() -> bool:  # PUB/SUB joins asynchronously: probe until through
                await client.signal(A, typing("probe"))
                return bool(first)

            await eventually(joined, what="the signal path to join")
            await client.signal(A, typing("active"), sender=SENDER)
            await eventually(
                _now(lambda: any(s.state == "active" for s in first)), what="the active signal"
            )
            sig = next(s for s in first if s.state == "active")
            assert sig.type == SignalType.TYPING and sig.data == {"k": 1}

            await stop_first()
            seen = len(first)
            await client.signal(A, typing("after"))
            while (await asyncio.wait_for(second.get(), 10))[1].state != "after":
                pass
            assert len(first) == seen, "an unsubscribed handler gets nothing more"

    asyncio.run(main())


def test_connect_without_a_broker_raises_unavailable_within_the_timeout(tmp_path):
    async def main() -> None:
        # The message names the deadline that fired: the client's own, 0.5 s.
        with pytest.raises(Unavailable, match=r"broker unavailable .* within 0\.5 s"):
            await connect(tmp_path, timeout=0.5)
        with pytest.raises(Unavailable, match=r"within 0\.5 s"):
            async with connect(tmp_path, timeout=0.5):
                raise AssertionError("not reached")

    asyncio.run(main())


def test_await_connect_and_async_with_await_connect(broker):
    async def main() -> None:
        client = await connect(broker.home.root)
        try:
            assert client.server["server"] == "relay"
            assert [e.subject for e in await client.list_endpoints()] == []
        finally:
            await client.close()
        with pytest.raises(Unavailable, match="closed"):
            await client.status()
        async with await connect(address=broker.home.router_address) as again:
            assert (await again.register_endpoint(A)).subject == A
        await again.close()  # closing twice is harmless

    asyncio.run(main())


def test_a_hung_broker_raises_timeout_and_a_cancelled_wait_leaves_the_client_usable(broker):
    async def main() -> None:
        async with connect(broker.home.root, timeout=10) as client:
            await client.register_endpoint(A)
            with writers_stopped(broker):
                with pytest.raises(Timeout, match=r"within 0\.3 s"):  # that deadline, no other
                    await client.publish(A, 1, sender=SENDER, timeout=0.3)
                task = asyncio.ensure_future(client.publish(A, 2, sender=SENDER))
                await asyncio.sleep(0)  # the task runs up to its wait: the request is sent
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            # the abandoned requests still complete; the client is unharmed
            result = await client.publish(A, 3, sender=SENDER)
            assert result.delivered_to == 1
            assert (await client.status())["clients"] >= 1

    asyncio.run(main())


def test_concurrent_publishes_and_async_unsubscribe(broker):
    async def main() -> None:
        async with connect(broker.home.root) as client:
            info = await client.register_endpoint(A)
            results = await asyncio.gather(
                *(client.publish(A, i, sender=SENDER) for i in range(50))
            )
            assert len({r.message_id for r in results}) == 50
            got: list[int] = []
            done = asyncio.Event()

            async def handler(envelope: Envelope) -> None:
                got.append(envelope.payload)
                if len(got) == 50:
                    done.set()

            unsubscribe = await client.subscribe(A, handler)
            await asyncio.wait_for(done.wait(), 10)
            assert got == list(range(50)), "one subscription's messages are handled in order"
            await unsubscribe()
            late = (await client.publish(A, "late", sender=SENDER)).message_id
            assert await state_of(client, late) == "new"
            waiting = os.listdir(os.path.join(info.maildir_path, "new"))
            assert len(waiting) == 1 and waiting[0].startswith(late)
            assert got == list(range(50))

    asyncio.run(main())


def test_a_client_outliving_its_loop_closes_instead_of_nacking(broker):
    info = {}

    async def setup() -> AsyncClient:
        client = await connect(broker.home.root)
        info["endpoint"] = await client.register_endpoint(A)

        async def handler(envelope: Envelope) -> None:
            pass

        await client.subscribe(A, handler)
        return client  # never closed: its loop ends with asyncio.run

    client = asyncio.run(setup())
    with broker.client() as other:
        message_id = other.publish(A, "orphan", sender=SENDER).message_id
        pending = wait_for(lambda: other.pending(A), what="the claimed message")
        assert [p["id"] for p in pending] == [message_id]
        assert other.dead_letters(info["endpoint"].hash) == []
    wait_for(lambda: _raises(client.sync.status, Unavailable), what="the client to close")


# ------------------------------------------------------------------------------ helpers


async def _is(value: Awaitable[Any], expected: Any) -> bool:
    return await value == expected


def _now(predicate: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    async def check() -> Any:
        return predicate()

    return check


def _raises(call: Callable[[], Any], error: type[BaseException]) -> bool:
    try:
        call()
    except error:
        return True
    return False


def test_a_signal_without_reply_waits_for_room_off_the_event_loop(broker, monkeypatch):
    monkeypatch.setattr("sdk.client.QUIET_SIGNALS_LIMIT", 1)  # one waiting fills it

    async def main() -> None:
        async with connect(broker.home.root) as client:
            release = park_io_thread(client.sync)  # nothing leaves the buffer meanwhile
            signal_ = Signal(SignalType.PROGRESS, "on", A, 0)
            await client.signal(A, signal_, wait=False)
            loop_ran = asyncio.Event()

            async def tick() -> None:  # runs only while nothing blocks the loop
                for _ in range(20):
                    await asyncio.sleep(0.001)
                loop_ran.set()

            # Tasks start in order: the signal finds the buffer full before the ticker runs.
            waiting = asyncio.create_task(client.signal(A, signal_, wait=False))
            ticker = asyncio.create_task(tick())
            await asyncio.wait_for(loop_ran.wait(), 10)
            assert not waiting.done()  # it waits for room, and the loop goes on meanwhile
            release.set()
            await asyncio.wait_for(waiting, 10)
            await ticker

    asyncio.run(main())


def test_fetch_and_its_confirmed_answers_as_coroutines(broker):
    async def main() -> None:
        async with connect(broker.home.root) as client:
            await client.register_endpoint(A)
            ids = [(await client.publish(A, n, sender=SENDER)).message_id for n in range(2)]
            first, second = await client.fetch(A, batch=5)
            assert [first.id, second.id] == ids and first.deliveries == 1
            await first.ack()
            assert await state_of(client, ids[0]) == "done"  # confirmed: no waiting
            await second.in_progress()
            await second.nack("not today")
            assert await state_of(client, ids[1]) == "failed"
            with pytest.raises(InvalidState):
                await second.ack()
            assert await client.fetch(A, wait=0.1) == []

    asyncio.run(main())
