"""`relay mcp` through the official MCP SDK's own client, over stdio, against a real broker.

Each agent is a `relay mcp --as SUBJECT` process started by `mcp.Client` as an MCP host
starts it; the broker is `tests.harness.Broker` (router and writers, own data dir).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from edges.mcp_server import MAX_HELD
from edges.mcp_tools import TOOLS
from sdk.types import Envelope
from tests.harness import ROOT, Broker, depth, free_port, signals_flowing, wait_for

pytestmark = pytest.mark.integration

A = "relay.agent.proj.alice"
B = "relay.agent.proj.bob"


# `python -m cli ...` that first writes its pid to the file named by its first argument.
WITH_PID = (
    "import os, runpy, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
    "sys.argv = ['relay', *sys.argv[2:]]; runpy.run_module('cli', run_name='__main__')"
)


@contextlib.asynccontextmanager
async def agent(
    broker: Broker, sender: str, *extra: str, pid_file: Path | None = None
) -> AsyncIterator[Client]:
    """An MCP session with a `relay mcp --as sender` process on this broker; with
    ``pid_file``, the process writes its pid there (for a test that kills it)."""
    args = ["--home", str(broker.home.root), "mcp", "--as", sender, *extra]
    args = ["-c", WITH_PID, str(pid_file), *args] if pid_file else ["-m", "cli", *args]
    params = StdioServerParameters(
        command=sys.executable, args=args, cwd=ROOT, env={"RELAY_LOG": "WARNING"}
    )
    with (broker.logs / f"mcp-{sender}.log").open("a") as errlog:  # the server's stderr
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as client:
            yield client


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    """A tool's JSON result; fails the test on a tool error. The SDK's client has already
    checked its structured content against the tool's output schema; it must be the
    text's JSON too."""
    result = await client.call_tool(tool, arguments)
    text = result.content[0].text
    assert not result.is_error, text
    assert result.structured_content == json.loads(text), tool
    return result.structured_content


async def refusal(client: Client, tool: str, **arguments: Any) -> str:
    """A tool error's text; fails the test when the call succeeds."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content[0].text
    return result.content[0].text


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 10) -> Any:
    """Await check() until it returns something truthy; fail after timeout seconds."""
    with anyio.move_on_after(timeout):
        while not (value := await check()):
            await anyio.sleep(0.02)
        return value
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


async def read_one(client: Client, endpoint: str) -> dict[str, Any]:
    """The next message relay_inbox returns for endpoint."""

    async def messages() -> list[dict[str, Any]]:
        return (await call(client, "relay_inbox", endpoint=endpoint))["messages"]

    found = await eventually(messages, f"a message for {endpoint}")
    assert len(found) == 1, found
    return found[0]


async def into(result: dict[str, Any], pending: Awaitable[Any]) -> None:
    """Await a tool call (in a task of its own), its JSON result into ``result``."""
    result.update(await pending)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    anyio.run(scenario)


def test_list_tools_names_each_tool_with_a_description_and_a_schema(broker: Broker) -> None:
    async def scenario() -> None:
        async with agent(broker, A) as alice:
            listed = (await alice.list_tools()).tools
        assert [t.name for t in listed] == [t.name for t in TOOLS]
        for tool in listed:
            assert tool.description and "\n" not in tool.description, tool.name
            assert tool.input_schema["type"] == "object", tool.name
        send = next(t for t in listed if t.name == "relay_send")
        assert send.input_schema["required"] == ["subject", "payload"]
        for tool in listed:
            assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert "deliveredTo" in send.output_schema["required"]

    run(scenario)


def test_two_agents_exchange_a_request_and_its_reply(broker: Broker) -> None:
    """Alice asks with relay_send_and_wait; Bob reads it from his inbox, replies, acks."""

    async def scenario() -> None:
        async with agent(broker, A) as alice, agent(broker, B) as bob:
            await call(bob, "relay_register_endpoint", subject=B)
            answer: dict[str, Any] = {}
            ask = call(alice, "relay_send_and_wait", subject=B, payload={"content": "2+2?"})
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(into, answer, ask)
                request = await read_one(bob, B)
                assert request["payload"] == {"content": "2+2?"}
                assert request["from"] == A
                replied = await call(bob, "relay_reply", id=request["id"], payload={"content": "4"})
                assert replied["deliveredTo"] == 1
                acked = await call(bob, "relay_ack", endpoint=B, id=request["id"])
            assert acked["state"] == "done" and acked["deliveries"] == 1
            assert answer["requestId"] == request["id"]
            assert answer["reply"]["parentId"] == request["id"]
            assert answer["reply"]["payload"] == {"content": "4"}
            assert answer["reply"]["from"] == B
            # The reply carried the request's budget on: one more hop, Bob in its chain.
            assert answer["reply"]["budget"]["ancestorChain"][:1] == [B]
            # The ack was confirmed: done when relay_ack returned, no waiting.
            copies = (await call(alice, "relay_trace", id=request["id"]))["copies"]
            assert [c["state"] for c in copies] == ["done"]

    run(scenario)


def test_a_reply_loop_between_two_agents_is_stopped_by_the_budget(broker: Broker) -> None:
    """Alice → Bob, Bob replies → Alice, Alice replies → Bob: Bob is in the chain
    already, so the third leg is refused as a cycle, and kept as a dead letter."""

    async def scenario() -> None:
        async with agent(broker, A) as alice, agent(broker, B) as bob:
            await call(alice, "relay_register_endpoint", subject=A)
            await call(bob, "relay_register_endpoint", subject=B)
            await call(alice, "relay_send", subject=B, payload={"content": "ping"})
            first = await read_one(bob, B)
            await call(bob, "relay_reply", id=first["id"], payload={"content": "pong"})
            second = await read_one(alice, A)
            assert second["budget"]["hopCount"] == 2

            text = await refusal(alice, "relay_reply", id=second["id"], payload={"content": "x"})
            assert text.startswith("budget_exceeded: "), text
            letters = (await call(alice, "relay_dead_letters", endpoint=B))["items"]
            assert [d["code"] for d in letters] == ["cycle_detected"]

    run(scenario)


def test_a_send_while_holding_a_message_carries_its_budget(broker: Broker) -> None:
    """An agent that forwards what it read (relay_send, not a reply) carries the budget
    of what it holds, so a forwarding loop is stopped too."""

    async def scenario() -> None:
        async with agent(broker, A) as alice, agent(broker, B) as bob:
            await call(alice, "relay_register_endpoint", subject=A)
            await call(bob, "relay_register_endpoint", subject=B)
            await call(alice, "relay_send", subject=B, payload="hop 1")
            await read_one(bob, B)  # held, not acked
            await call(bob, "relay_send", subject=A, payload="hop 2")
            forwarded = await read_one(alice, A)
            assert forwarded["budget"]["ancestorChain"] == [B, A]
            assert forwarded["budget"]["hopCount"] == 2
            text = await refusal(alice, "relay_send", subject=B, payload="hop 3")
            assert text.startswith(f"budget_exceeded: cycle detected: {B} already in chain"), text

    run(scenario)


def test_a_sender_the_identity_may_not_use_is_a_tool_error() -> None:
    """The key projA may send as relay.agent.projA.> only; a server started with it
    --as another subject is refused by the router on every send."""
    keys = [("ops", [">"], True), ("projA", ["relay.agent.projA.>"], False)]
    with Broker.on_tcp(keys) as broker:
        address = broker.client_options["address"]
        key = str(broker.home.keys / "projA.key_secret")
        extra = ("--address", address, "--key-file", key)

        async def scenario() -> None:
            async with agent(broker, "relay.agent.other.mallory", *extra) as mallory:
                text = await refusal(
                    mallory, "relay_send", subject="relay.agent.projA.inbox", payload="hi"
                )
            assert text.startswith("sender_not_allowed: "), text
            assert "may not send as relay.agent.other.mallory" in text

        run(scenario)


def test_nack_makes_a_dead_letter_with_the_agents_reason(broker: Broker) -> None:
    async def scenario() -> None:
        async with agent(broker, B) as bob:
            await call(bob, "relay_register_endpoint", subject=B)
            await call(bob, "relay_send", subject=B, payload="unreadable")
            message = await read_one(bob, B)
            await call(bob, "relay_nack", endpoint=B, id=message["id"], reason="cannot parse")

            async def letters() -> list[dict[str, Any]]:
                return (await call(bob, "relay_dead_letters", endpoint=B))["items"]

            letter = (await eventually(letters, "the nacked message's dead letter"))[0]
            assert letter["id"] == message["id"]
            assert letter["code"] == "nack"
            assert "cannot parse" in letter["reason"]

    run(scenario)


def test_inbox_claims_no_more_than_its_limit_and_lists_what_is_still_held(
    broker: Broker,
) -> None:
    async def scenario() -> None:
        async with agent(broker, B) as bob:
            await call(bob, "relay_register_endpoint", subject=B)
            for n in range(3):
                await call(bob, "relay_send", subject=B, payload=n)
            first = await call(bob, "relay_inbox", endpoint=B, limit=2)
            assert [m["payload"] for m in first["messages"]] == [0, 1]
            rest = await call(bob, "relay_inbox", endpoint=B, limit=2)
            assert [m["payload"] for m in rest["messages"]] == [2]
            assert rest["stillHeld"] == [m["id"] for m in first["messages"]]

    run(scenario)


def test_inbox_holds_at_most_max_held_messages_then_asks_for_answers(broker: Broker) -> None:
    sdk = broker.client()
    sdk.register_endpoint(B)
    for n in range(MAX_HELD + 1):
        sdk.publish(B, n, sender=A)

    async def scenario() -> None:
        async with agent(broker, B) as bob:
            held = 0
            while held < MAX_HELD:
                held += len((await call(bob, "relay_inbox", endpoint=B, limit=50))["messages"])
            assert held == MAX_HELD
            text = await refusal(bob, "relay_inbox", endpoint=B)
            assert text.startswith(f"limit_exceeded: {MAX_HELD} messages read and not answered")
            oldest = min(p["id"] for p in sdk.pending(B))  # all claimed by bob by now
            await call(bob, "relay_ack", endpoint=B, id=oldest)
            last = await call(bob, "relay_inbox", endpoint=B)
            assert [m["payload"] for m in last["messages"]] == [MAX_HELD]

    run(scenario)


def test_inbox_says_which_hand_out_each_message_is(broker: Broker) -> None:
    async def scenario() -> None:
        async with agent(broker, B) as bob:
            await call(bob, "relay_register_endpoint", subject=B)
            await call(bob, "relay_send", subject=B, payload="first time")
            message = await read_one(bob, B)
            assert message["deliveries"] == 1

    run(scenario)


def test_a_message_read_and_never_answered_goes_to_the_next_reader_when_the_server_is_killed(
    broker: Broker, tmp_path: Path
) -> None:
    """Given a message Bob's server read and never answered, when the server is killed
    (-9, no goodbye), then the next reader gets it, handed out a second time."""
    pid_file = tmp_path / "mcp.pid"

    async def scenario() -> None:
        read: dict[str, Any] = {}
        with contextlib.suppress(Exception, BaseExceptionGroup):  # its pipe breaks
            async with agent(broker, B, pid_file=pid_file) as bob:
                await call(bob, "relay_register_endpoint", subject=B)
                await call(bob, "relay_send", subject=B, payload="read, never acked")
                read.update(await read_one(bob, B))
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        assert read["deliveries"] == 1
        async with agent(broker, B) as again:
            message = await read_one(again, B)
            assert (message["id"], message["deliveries"]) == (read["id"], 2)
            await call(again, "relay_ack", endpoint=B, id=message["id"])

    run(scenario)


def test_the_ack_deadline_gives_an_unanswered_message_to_the_next_reader(broker: Broker) -> None:
    """`--ack-wait`: an agent that read a message and went quiet (its host hung, say)
    holds it that long; then another reader gets it, and the first one's ack is refused."""

    async def scenario() -> None:
        async with agent(broker, B, "--ack-wait", "0.5") as bob, agent(broker, B) as other:
            await call(bob, "relay_register_endpoint", subject=B)
            await call(bob, "relay_send", subject=B, payload="slow")
            first = await read_one(bob, B)
            taken = await read_one(other, B)  # polled until the router took it back
            assert (taken["id"], taken["deliveries"]) == (first["id"], 2)
            late = await refusal(bob, "relay_ack", endpoint=B, id=first["id"])
            assert late.startswith(f"invalid_state: message {first['id']}"), late
            assert (await call(bob, "relay_inbox", endpoint=B))["stillHeld"] == []

    run(scenario)


def test_send_and_wait_without_a_reply_is_a_timeout_tool_error(broker: Broker) -> None:
    async def scenario() -> None:
        async with agent(broker, A) as alice:
            await call(alice, "relay_register_endpoint", subject=B)
            text = await refusal(
                alice, "relay_send_and_wait", subject=B, payload="anyone?", timeout_s=0.2
            )
            assert text.startswith("timeout: no reply to "), text

    run(scenario)


def test_a_reply_after_the_wait_ended_is_a_late_reply_dead_letter(broker: Broker) -> None:
    """A reply that comes after send_and_wait gave up is kept as a dead letter with code
    late_reply, never taken for the answer to a later request."""

    async def scenario() -> None:
        async with agent(broker, A) as alice, agent(broker, B) as bob:
            await call(bob, "relay_register_endpoint", subject=B)
            text = await refusal(alice, "relay_send_and_wait", subject=B, payload=1, timeout_s=0.5)
            assert text.startswith("timeout: "), text
            request = await read_one(bob, B)
            await call(bob, "relay_reply", id=request["id"], payload="too late")

            async def letters() -> list[dict[str, Any]]:
                found = await call(alice, "relay_dead_letters", endpoint=request["replyTo"])
                return found["items"]

            letter = (await eventually(letters, "the late reply's dead letter"))[0]
            assert letter["code"] == "late_reply"

    run(scenario)


def test_a_reply_is_matched_to_its_request_by_parent_id(broker: Broker) -> None:
    """What answers a request is the message whose parentId is its id, whatever budget it
    carries; a message in the reply inbox that answers nothing is a dead letter."""
    responder = broker.client()
    requests: list[Envelope] = []
    responder.register_endpoint(B)
    responder.subscribe(B, requests.append)

    async def scenario() -> None:
        async with agent(broker, A) as alice:
            answer: dict[str, Any] = {}
            ask = call(alice, "relay_send_and_wait", subject=B, payload="2+2?")
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(into, answer, ask)
                request = (await eventually(lambda: _now(requests), "the request"))[0]
                assert request.reply_to.startswith(f"_INBOX.{A}.")
                responder.publish(request.reply_to, "no parent", sender=B)

                async def letters() -> list[dict[str, Any]]:
                    found = await call(alice, "relay_dead_letters", endpoint=request.reply_to)
                    return found["items"]

                letter = (await eventually(letters, "the unmatched message's dead letter"))[0]
                assert letter["code"] == "late_reply"
                fresh = responder.publish_async(
                    request.reply_to, "4", sender=B, parent_id=request.id
                )
                assert fresh.result(10).delivered_to == 1  # a fresh budget, the right parent
            assert answer["reply"]["payload"] == "4"
            assert answer["requestId"] == request.id

    run(scenario)


async def _now(items: list[Any]) -> list[Any]:
    return items


BAD_CALLS = [  # tool, arguments, how its tool error starts
    ("relay_send", {"payload": 1}, "invalid_message: relay_send: 'subject' is a required"),
    ("relay_inbox", {"endpoint": B, "limit": 0}, "invalid_message: relay_inbox: argument 'limit'"),
    ("relay_send", {"subject": "a..b", "payload": 1}, "invalid_subject: "),
    ("relay_ack", {"endpoint": B, "id": "0" * 26}, "invalid_state: message 000"),
    ("relay_reply", {"id": "0" * 26, "payload": 1}, "message_not_found: "),
    ("relay_inbox", {"endpoint": "relay.agent.proj.nobody"}, "endpoint_not_found: "),
    ("relay_signal", {"subject": B, "type": "shout", "state": "x"}, "invalid_message: "),
    ("relay_teleport", {}, "unknown_operation: no tool 'relay_teleport'"),
]


def test_a_bad_call_is_a_tool_error_that_starts_with_the_relay_code(broker: Broker) -> None:
    """One server for the whole table: starting one costs seconds (importing mcp)."""

    async def scenario() -> list[str]:
        async with agent(broker, A) as alice:
            return [await refusal(alice, tool, **args) for tool, args, _ in BAD_CALLS]

    texts = anyio.run(scenario)
    for (tool, _, expected), text in zip(BAD_CALLS, texts, strict=True):
        assert text.startswith(expected), (tool, text)


def test_signal_reaches_a_subscriber_of_its_subject(broker: Broker) -> None:
    watcher = broker.client()
    seen: list[Any] = []
    signals_flowing(watcher, B)
    watcher.on_signal(B, lambda _subject, signal: seen.append(signal))

    async def scenario() -> None:
        async with agent(broker, A) as alice:
            await call(alice, "relay_signal", subject=B, type="typing", state="active")

    run(scenario)
    typing = wait_for(lambda: [s for s in seen if s.type == "typing"], what="the typing signal")
    assert typing[0].endpoint_subject == A


def test_inbox_with_wait_s_returns_a_message_sent_during_the_wait(broker: Broker) -> None:
    async def scenario() -> None:
        async with agent(broker, A) as alice, agent(broker, B) as bob:
            await call(bob, "relay_register_endpoint", subject=B)
            read: dict[str, Any] = {}
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(into, read, call(bob, "relay_inbox", endpoint=B, wait_s=30))
                await eventually(lambda: _subscribed(broker), "bob's inbox to wait")
                await call(alice, "relay_send", subject=B, payload="while you waited")
            assert [m["payload"] for m in read["messages"]] == ["while you waited"]

    run(scenario)


async def _subscribed(broker: Broker) -> bool:
    """Whether some client consumes: the waiting inbox's claim is in place."""
    return broker.client().status()["subscriptions"] > 0


def test_http_serves_the_same_tools_at_slash_mcp(broker: Broker) -> None:
    """`--http HOST:PORT`: streamable HTTP instead of stdio, same tools, same sender."""
    port = free_port()
    cmd = [sys.executable, "-m", "cli", "--home", str(broker.home.root), "mcp"]
    cmd += ["--as", A, "--http", f"127.0.0.1:{port}"]
    with (broker.logs / "mcp-http.log").open("a") as log:
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _listening(port), 30, what="relay mcp --http to listen")

        async def scenario() -> dict[str, Any]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as alice:
                assert len((await alice.list_tools()).tools) == len(TOOLS)
                await call(alice, "relay_register_endpoint", subject=B)
                return await call(alice, "relay_send", subject=B, payload="over http")

        sent = anyio.run(scenario)
        assert sent["deliveredTo"] == 1
        assert depth(broker.client(), B) == 1
    finally:
        server.terminate()
        server.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def mcp_http(broker: Broker) -> Iterator[str]:
    """A `relay mcp --as A --http` process on this broker; yields its /mcp URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "cli", "--home", str(broker.home.root), "mcp"]
    cmd += ["--as", A, "--http", f"127.0.0.1:{port}"]
    with (broker.logs / "mcp-http.log").open("a") as log:
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _listening(port), 30, what="relay mcp --http to listen")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(10)


def token_for(broker: Broker, name: str, sender: str) -> str:
    made = broker.relay("auth", "add-token", name, "--sender", sender)
    assert made.returncode == 0, made.stderr
    return made.stdout.split("shown once; auth.json keeps its hash): ")[1].split()[0]


def over_http(url: str, token: str | None, **headers: str) -> Client:
    """An MCP session over streamable HTTP that bears ``token``."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return Client(streamable_http_client(url, http_client=create_mcp_http_client(headers)))


def test_agents_with_their_own_tokens_talk_through_one_http_server(broker: Broker) -> None:
    """With tokens in auth.json each MCP session acts as its token's identity (its
    sender, its inbox, its rights) through one `relay mcp --http`, on ipc://."""
    alice_token = token_for(broker, "alice", A)
    bob_token = token_for(broker, "bob", B)
    mallory_token = token_for(broker, "mallory", "relay.agent.mallory.>")

    with mcp_http(broker) as url:

        async def scenario() -> None:
            async with over_http(url, alice_token) as alice, over_http(url, bob_token) as bob:
                await call(bob, "relay_register_endpoint", subject=B)
                answer: dict[str, Any] = {}
                ask = call(alice, "relay_send_and_wait", subject=B, payload="2+2?")
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(into, answer, ask)
                    request = await read_one(bob, B)
                    assert request["from"] == A  # alice's token's sender, not the --as one
                    await call(bob, "relay_reply", id=request["id"], payload="4")
                    await call(bob, "relay_ack", endpoint=B, id=request["id"])
                assert answer["reply"]["payload"] == "4" and answer["reply"]["from"] == B
                assert answer["requestId"] == request["id"]

            headers = {"Relay-Sender": A}  # mallory names a sender it may not use
            async with over_http(url, mallory_token, **headers) as mallory:
                text = await refusal(mallory, "relay_send", subject=B, payload="hi")
            assert text.startswith("sender_not_allowed: "), text
            assert "mallory may not send as relay.agent.proj.alice" in text

        run(scenario)


def test_with_tokens_configured_an_http_session_without_one_is_401(broker: Broker) -> None:
    token_for(broker, "alice", A)
    with mcp_http(broker) as url:
        response = httpx.post(url, json={}, headers={"Accept": "application/json"})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "not_authorized"
        bad = httpx.post(url, json={}, headers={"Authorization": "Bearer relay_nope"})
        assert bad.status_code == 401


def test_once_serving_by_token_a_request_without_one_stays_401_when_none_are_left(
    broker: Broker,
) -> None:
    """Removing the last token (or auth.json) must not open the server to anyone who
    reaches its port with the owner's rights: it fails closed."""
    token_for(broker, "alice", A)
    with mcp_http(broker) as url:
        removed = broker.relay("auth", "remove", "alice")
        assert removed.returncode == 0, removed.stderr
        response = httpx.post(url, json={}, headers={"Accept": "application/json"})
        assert response.status_code == 401
        assert "no token is left" in response.json()["error"]["message"]
        broker.home.auth_file.unlink()
        again = httpx.post(url, json={}, headers={"Accept": "application/json"})
        assert again.status_code == 401


def test_a_token_shown_to_a_server_without_tokens_is_refused_not_ignored(
    broker: Broker,
) -> None:
    """A client that believes it acts as a narrower identity is never served with the
    process's own rights instead (the rule the HTTP gateway follows: AuthFile.admit)."""
    with mcp_http(broker) as url:
        response = httpx.post(url, json={}, headers={"Authorization": "Bearer relay_nope"})
        assert response.status_code == 401
        assert response.json()["error"]["message"] == "unknown, expired or revoked bearer token"


def test_a_sender_the_token_may_not_use_is_refused_before_any_connection(
    broker: Broker,
) -> None:
    """A Relay-Sender the token's identity may not send as gets no tools and no
    connection of its own: the server's state cannot grow by naming senders."""
    mallory_token = token_for(broker, "mallory", "relay.agent.mallory.>")
    owner = broker.client()
    with mcp_http(broker) as url:

        async def scenario() -> None:
            async with over_http(url, mallory_token, **{"Relay-Sender": A}) as mallory:
                before = owner.status()["clients"]
                text = await refusal(mallory, "relay_list_endpoints")
                assert text.startswith("sender_not_allowed: mallory may not send as "), text
                assert owner.status()["clients"] == before

        run(scenario)


def test_one_identity_uses_a_bounded_number_of_senders_through_one_server(
    broker: Broker,
) -> None:
    from edges.mcp_agents import MAX_SENDERS

    token = token_for(broker, "many", "relay.agent.many.>")
    with mcp_http(broker) as url:

        async def as_sender(n: int) -> Any:
            async with over_http(url, token, **{"Relay-Sender": f"relay.agent.many.s{n}"}) as c:
                return await c.call_tool("relay_list_endpoints", {})

        async def scenario() -> None:
            for n in range(MAX_SENDERS):
                result = await as_sender(n)
                assert not result.is_error, result.content[0].text
            over = await as_sender(MAX_SENDERS)
            assert over.is_error
            assert over.content[0].text.startswith("limit_exceeded: many already sends as ")
            again = await as_sender(0)  # a sender in use still is
            assert not again.is_error, again.content[0].text

        run(scenario)


def test_what_an_expired_tokens_session_held_is_handed_out_again_without_a_call(
    broker: Broker,
) -> None:
    """Expiry changes no file and the session may never call again: the server's sweep
    closes that identity's connection, so what it held goes to the next reader long
    before its ack deadline (300 s)."""
    made = broker.relay("auth", "add-token", "bob", "--sender", B, "--expires", "8s")
    assert made.returncode == 0, made.stderr
    token = made.stdout.split("shown once; auth.json keeps its hash): ")[1].split()[0]
    owner = broker.client()
    owner.register_endpoint(B)
    owner.publish(B, "for bob", sender=A)
    with mcp_http(broker) as url:

        async def scenario() -> None:
            async with over_http(url, token) as bob:
                assert (await read_one(bob, B))["payload"] == "for bob"

        run(scenario)
        again = wait_for(lambda: owner.fetch(B, wait=1.0), 40, what="bob's claim released")
        assert [m.envelope.payload for m in again] == ["for bob"]
