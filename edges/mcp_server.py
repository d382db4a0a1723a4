"""`relay mcp --as SENDER`: Relay's tools for an agent, over the Model Context Protocol.

One process serves one agent: one SDK client (so one identity in auth.json, checked by
the router like any client's), and one sender subject fixed at start, used as ``from``
of everything it sends and as the default ``replyTo``. stdio by default (the MCP host
starts the process); ``--http HOST:PORT`` serves streamable HTTP at ``/mcp`` instead,
every session then sharing that client, sender and inbox.

The tools are described in edges.mcp_tools; what an agent reads and has not yet
answered is held by edges.mcp_inbox; send-and-wait replies come through
edges.mcp_replies. Results are JSON, twice: as text (for hosts and models that read
text) and as ``structuredContent`` matching the tool's ``outputSchema`` (MCP 2025-06-18
and later; hosts use it without parsing). A refusal is a tool error whose text starts
with the Relay code (``sender_not_allowed: ...``), see docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import anyio
import mcp.types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

from edges.mcp_inbox import Inbox
from edges.mcp_replies import Replies, now_ms
from edges.mcp_tools import (
    TOOLS,
    TOOLS_BY_NAME,
    as_text,
    carried_budget,
    checked_arguments,
    error_text,
    publish_refusal,
)
from sdk import subjects
from sdk.client import Client
from sdk.errors import RelayError, Timeout, UnknownOperation
from sdk.types import Budget, Envelope, PublishResult, Signal, SignalType, default_budget

log = logging.getLogger("relay.mcp")
REPLY_ENDPOINT_SUFFIX = "replies"


class RelayTools:
    """The tools, carried out with one SDK client as one sender. Every method but
    `send_and_wait` blocks on the broker: the server runs them on worker threads."""

    def __init__(self, client: Client, sender: str) -> None:
        self.client = client
        self.sender = subjects.validate(sender)
        self.inbox = Inbox(client)
        self.replies = Replies(client, f"{sender}.{REPLY_ENDPOINT_SUFFIX}")

    # ------------------------------------------------------------------ sending

    def _budget(self) -> Budget | None:
        return carried_budget(self.inbox.held_budgets())

    def send(self, subject: str, payload: Any, reply_to: str | None = None) -> dict[str, Any]:
        result = self.client.publish(
            subject,
            payload,
            sender=self.sender,
            reply_to=reply_to or self.sender,
            budget=self._budget(),
        )
        return _delivered(result)

    def request(self, subject: str, payload: Any, timeout_s: float) -> tuple[str, int, Future]:
        """Publish a request whose reply `send_and_wait` awaits: (id, ticket, reply)."""
        self.replies.start()
        now = now_ms()
        budget = self._budget() or default_budget(now)
        ttl, reply = self.replies.ticket(min(budget.ttl, now + int(timeout_s * 1000)), now)
        try:
            result = self.client.publish(
                subject,
                payload,
                sender=self.sender,
                reply_to=self.replies.subject,
                budget=dataclasses.replace(budget, ttl=ttl),
            )
            _delivered(result)
        except BaseException:
            self.replies.forget(ttl)
            raise
        return result.message_id, ttl, reply

    async def send_and_wait(self, subject: str, payload: Any, timeout_s: float) -> dict[str, Any]:
        message_id, ttl, reply = await anyio.to_thread.run_sync(
            self.request, subject, payload, timeout_s
        )
        try:
            envelope: Envelope = await asyncio.wait_for(asyncio.wrap_future(reply), timeout_s)
        except TimeoutError:
            raise Timeout(
                f"no reply to {message_id} from {subject} within {timeout_s:g} s "
                "(the request expires now: a later reply is refused)"
            ) from None
        finally:
            self.replies.forget(ttl)
        return {"requestId": message_id, "reply": envelope.to_wire()}

    def reply(self, id: str, payload: Any) -> dict[str, Any]:
        envelope = self.inbox.envelope(id)
        return _delivered(self.client.reply(envelope, payload, sender=self.sender))

    # ------------------------------------------------------------------ receiving

    def read_inbox(self, endpoint: str, limit: int, wait_s: float) -> dict[str, Any]:
        messages, earlier = self.inbox.read(endpoint, limit, wait_s)
        return {"messages": [m.to_wire() for m in messages], "stillHeld": earlier}

    def ack(self, endpoint: str, id: str) -> dict[str, Any]:
        self.inbox.answer(endpoint, id, None)
        return {"id": id, "endpoint": endpoint, "answer": "ack"}

    def nack(self, endpoint: str, id: str, reason: str) -> dict[str, Any]:
        self.inbox.answer(endpoint, id, reason)
        return {"id": id, "endpoint": endpoint, "answer": "nack", "reason": reason}

    # ------------------------------------------------------------------ the rest

    def list_endpoints(self) -> dict[str, Any]:
        shown = ("subject", "hash", "depth", "pressure")
        endpoints = self.client.status()["endpoints"]
        return {"endpoints": [{k: e[k] for k in shown if k in e} for e in endpoints]}

    def register_endpoint(self, subject: str) -> dict[str, Any]:
        return self.client.register_endpoint(subject).to_wire()

    def unregister_endpoint(self, subject: str) -> dict[str, Any]:
        return {"subject": subject, "removed": self.client.unregister_endpoint(subject)}

    def dead_letters(self, endpoint: str | None = None) -> dict[str, Any]:
        return {"items": self.client.dead_letters(endpoint)}

    def trace(self, id: str) -> dict[str, Any]:
        return self.client.trace(id)

    def signal(self, subject: str, type: str, state: str) -> dict[str, Any]:
        signal = Signal(SignalType(type), state, self.sender, now_ms())
        self.client.signal(subject, signal, sender=self.sender)
        return {"subject": subject, "signal": signal.to_wire()}

    def handler(self, tool: str) -> Callable[..., Any]:
        """The method carrying out a tool, by the tool's name."""
        return {
            "relay_send": self.send,
            "relay_send_and_wait": self.send_and_wait,
            "relay_inbox": self.read_inbox,
            "relay_ack": self.ack,
            "relay_nack": self.nack,
            "relay_reply": self.reply,
            "relay_list_endpoints": self.list_endpoints,
            "relay_register_endpoint": self.register_endpoint,
            "relay_unregister_endpoint": self.unregister_endpoint,
            "relay_dead_letters": self.dead_letters,
            "relay_trace": self.trace,
            "relay_signal": self.signal,
        }[tool]

    async def call(self, tool: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        """Carry out one tool call: its JSON result, or a tool error with the code."""
        try:
            if tool not in TOOLS_BY_NAME:
                raise UnknownOperation(f"no tool {tool!r}; list_tools names them")
            args = checked_arguments(tool, arguments)
            run = self.handler(tool)
            if inspect.iscoroutinefunction(run):
                data = await run(**args)
            else:
                # Abandoned when the session ends; close() then ends the waits in it.
                data = await anyio.to_thread.run_sync(lambda: run(**args), abandon_on_cancel=True)
        except RelayError as exc:
            return _result(error_text(exc.code, exc.message), error=True)
        except Exception as exc:  # a bug here must not end the agent's session
            log.exception("tool %s failed", tool)
            return _result(error_text("internal", f"{type(exc).__name__}: {exc}"), error=True)
        return _result(as_text(data), structured=data)


class Refused(RelayError):
    """A publish that reached no endpoint; ``code`` is the rejection's reason."""


def _delivered(result: PublishResult) -> dict[str, Any]:
    """The publish result as data; `Refused` when it reached no endpoint."""
    data = result.to_wire()
    refusal = publish_refusal(data)
    if refusal is not None:
        code, sentence = refusal
        raise Refused(f"{sentence} (message {result.message_id})", code=code)
    return data


def _result(text: str, *, error: bool = False, structured: Any = None) -> types.CallToolResult:
    """The text always (older hosts read only that); the same data as structured content
    on success. A tool error has none: its schema is the text's ``code: sentence``."""
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured, is_error=error
    )


def build_server(tools: RelayTools) -> Server:
    """The MCP server object: tools/list and tools/call over ``tools``."""
    listed = types.ListToolsResult(
        tools=[
            types.Tool(
                name=t.name,
                description=t.description,
                input_schema=t.input_schema,
                output_schema=t.output_schema,
            )
            for t in TOOLS
        ]
    )

    async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
        return listed

    async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await tools.call(params.name, params.arguments)

    return Server(
        "relay",
        version="0.1.0",
        instructions=(
            f"Relay message bus; you send as {tools.sender}. Read your messages with "
            f"relay_inbox(endpoint={tools.sender!r}), answer each with relay_reply when "
            "asked, then relay_ack it."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(server: Server) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(server: Server, host: str, port: int) -> None:
    import uvicorn  # a dependency of mcp; only the HTTP transport needs it

    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def serve(client: Client, sender: str, http: str | None = None) -> None:
    """Serve the tools until the host closes stdin (stdio) or the process is stopped."""
    tools = RelayTools(client, sender)
    server = build_server(tools)
    try:
        if http is None:
            anyio.run(serve_stdio, server)
        else:
            host, _, port = http.rpartition(":")
            anyio.run(serve_http, server, host or "127.0.0.1", int(port))
    finally:
        tools.inbox.close()  # a relay_inbox still waiting would hold the exit up
