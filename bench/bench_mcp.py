"""The MCP edge's round trip: `relay_send_and_wait` between two agents (issue 17).

    python -m bench.bench_mcp [--rounds 200]      (or: python -m bench --only mcp)

Two `relay mcp` processes on one broker, each driven by the mcp SDK's stdio client as
an MCP host would: agent A asks with relay_send_and_wait; agent B answers through its
own tools in a loop (relay_inbox with wait_s, relay_reply, relay_ack). Beside it, in
the same run and on the same broker, one round each at a time (A B C A B C ...), so a
slow moment of the machine hits all three alike:

- the SDK's publish: one durable publish, the client's round trip;
- the SDK's request and reply: a publish with replyTo, a subscribed handler answering
  with `Client.reply`, the asker's handler seeing the answer; the same path as the MCP
  round trip without the MCP processes and their JSON-RPC over pipes.

Prints p50 and p90 of each (ms) and returns the p50s as rows for `python -m bench`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from bench.common import Row, stop_broker
from sdk.client import Client as RelayClient
from sdk.types import Envelope

ALICE = "relay.agent.bench.alice"
BOB = "relay.agent.bench.bob"
ASKER, RESPONDER = "relay.agent.bench.sdk-asker", "relay.agent.bench.sdk-responder"
SINK = "relay.agent.bench.sink"
WARMUP = 10
UNLIMITED = {"rateLimit": {"maxPerWindow": 10**9}, "backpressure": {"maxMailboxSize": 10**9}}


@contextlib.asynccontextmanager
async def mcp_agent(broker: Any, sender: str) -> AsyncIterator[Client]:
    args = ["-m", "cli", "--home", str(broker.home.root), "mcp", "--as", sender]
    params = StdioServerParameters(command=sys.executable, args=args, env={"RELAY_LOG": "WARNING"})
    with (broker.logs / f"mcp-{sender}.log").open("a") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as agent:
            yield agent


async def call(agent: Client, tool: str, **arguments: Any) -> Any:
    result = await agent.call_tool(tool, arguments)
    if result.is_error:
        raise RuntimeError(f"{tool}: {result.content[0].text}")
    return json.loads(result.content[0].text)


async def answer_forever(bob: Client) -> None:
    """Agent B: read one message at a time, reply to it, acknowledge it."""
    while True:
        read = await call(bob, "relay_inbox", endpoint=BOB, limit=1, wait_s=5)
        for message in read["messages"]:
            await call(bob, "relay_reply", id=message["id"], payload={"content": "pong"})
            await call(bob, "relay_ack", endpoint=BOB, id=message["id"])


class SdkRoundTrips:
    """The SDK's own figures: a publish, and a request answered with Client.reply."""

    def __init__(self, broker: Any) -> None:
        self.client: RelayClient = broker.client(timeout=30)
        self.answered = threading.Event()
        for subject in (SINK, ASKER, RESPONDER):
            self.client.register_endpoint(subject)
        self.client.subscribe(ASKER, lambda _envelope: self.answered.set())
        self.client.subscribe(RESPONDER, self._respond)

    def _respond(self, envelope: Envelope) -> None:
        self.client.reply(envelope, {"content": "pong"}, sender=RESPONDER)

    def publish(self) -> float:
        start = time.perf_counter()
        self.client.publish(SINK, {"content": "ping"}, sender=ASKER)
        return time.perf_counter() - start

    def request_reply(self) -> float:
        self.answered.clear()
        start = time.perf_counter()
        self.client.publish(RESPONDER, {"content": "ping"}, sender=ASKER, reply_to=ASKER)
        if not self.answered.wait(30):
            raise RuntimeError("no reply to the SDK request within 30 s")
        return time.perf_counter() - start


async def measure(broker: Any, rounds: int) -> dict[str, list[float]]:
    sdk = SdkRoundTrips(broker)
    times: dict[str, list[float]] = {"publish": [], "request_reply": [], "mcp": []}
    async with mcp_agent(broker, ALICE) as alice, mcp_agent(broker, BOB) as bob:
        await call(bob, "relay_register_endpoint", subject=BOB)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(answer_forever, bob)

            async def ask() -> float:
                start = time.perf_counter()
                await call(alice, "relay_send_and_wait", subject=BOB, payload={"n": 1})
                return time.perf_counter() - start

            for n in range(WARMUP + rounds):
                publish = await anyio.to_thread.run_sync(sdk.publish)
                request_reply = await anyio.to_thread.run_sync(sdk.request_reply)
                mcp = await ask()
                if n >= WARMUP:
                    times["publish"].append(publish)
                    times["request_reply"].append(request_reply)
                    times["mcp"].append(mcp)
            tasks.cancel_scope.cancel()
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(rounds: int) -> dict[str, list[float]]:
    """Each round trip's times (s), measured on a broker of its own."""
    from tests.harness import Broker  # real processes, its own home

    broker = Broker(shards=2)
    try:
        broker.start()
        broker.client().set_config(UNLIMITED)
        return anyio.run(measure, broker, rounds)
    finally:
        stop_broker(broker)


def rows(rounds: int = 200) -> list[Row]:
    times = run(rounds)
    print(table(times), file=sys.stderr)
    p50 = {name: statistics.median(values) * 1000 for name, values in times.items()}
    return [
        Row(
            f"MCP send_and_wait round trip p50, {rounds} rounds",
            p50["mcp"],
            "ms",
            "SDK publish p50",
            p50["publish"],
        ),
        Row(
            f"SDK request + Client.reply p50, {rounds} rounds",
            p50["request_reply"],
            "ms",
            "SDK publish p50",
            p50["publish"],
        ),
    ]


def table(times: dict[str, list[float]]) -> str:
    names = {
        "publish": "SDK publish (durable)",
        "request_reply": "SDK request -> Client.reply -> handler",
        "mcp": "MCP relay_send_and_wait (two relay mcp)",
    }
    lines = [f"{'round trip':42} {'p50 ms':>8} {'p90 ms':>8} {'n':>5}"]
    for key, label in names.items():
        values = times[key]
        p50, p90 = statistics.median(values) * 1000, percentile(values, 0.9) * 1000
        lines.append(f"{label:42} {p50:8.2f} {p90:8.2f} {len(values):5d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_mcp", description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    print(table(run(parser.parse_args(argv).rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
