"""`relay mcp --as SENDER`: Relay's tools for an agent, over the Model Context Protocol.

One process serves one agent: one SDK client (so one identity in auth.json, checked by
the router like any client's), and one sender subject fixed at start, used as ``from``
of everything it sends and as the default ``replyTo``. stdio by default (the MCP host
starts the process); ``--http HOST:PORT`` serves streamable HTTP at ``/mcp`` instead:
without tokens every session shares that client, sender and inbox; with tokens in
auth.json each session acts as its bearer token's identity (edges/mcp_agents.py).

The tools are described in edges.mcp_tools. `relay_inbox` fetches (the SDK's `fetch`,
with an ack deadline) and keeps what it handed the agent in edges.held until
`relay_ack` or `relay_nack` answers it, each a confirmed answer; `relay_send_and_wait`
is the SDK's `request` (a reply inbox, the reply matched by ``parentId``). Results are
JSON, twice: as text (for hosts and models that read
text) and as ``structuredContent`` matching the tool's ``outputSchema`` (MCP 2025-06-18
and later; hosts use it without parsing). A refusal is a tool error whose text starts
with the Relay code (``sender_not_allowed: ...``), see docs/mcp.md.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import mcp.types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

from edges.held import DEFAULT_ACK_WAIT_S, HeldMessages
from edges.mcp_agents import Agents, TokenGate
from edges.mcp_tools import (
    TOOLS,
    TOOLS_BY_NAME,
    as_text,
    carried_budget,
    checked_arguments,
    error_text,
    publish_refusal,
)
from edges.tokens import AuthFile
from sdk import subjects
from sdk.client import Client
from sdk.errors import (
    EndpointNotFound,
    InvalidState,
    LimitExceeded,
    MessageNotFound,
    RelayError,
    UnknownOperation,
)
from sdk.message import Message
from sdk.paths import Home
from sdk.types import Budget, Envelope, PublishResult, Signal, SignalType

log = logging.getLogger("relay.mcp")
MAX_HELD = 64  # messages read and not yet answered, per server
REMEMBERED = 256  # envelopes kept after their answer, so that a late relay_reply works


class RelayTools:
    """The tools, carried out with one SDK client as one sender. Every method but
    `send_and_wait` blocks on the broker: the server runs them on worker threads."""

    def __init__(self, client: Client, sender: str, ack_wait: float = DEFAULT_ACK_WAIT_S) -> None:
        self.client = client
        self.sender = subjects.validate(sender)
        self.held: HeldMessages[Message] = HeldMessages(ack_wait)
        self._seen: OrderedDict[str, Envelope] = OrderedDict()  # read here, for relay_reply
        self._seen_lock = threading.Lock()

    # ------------------------------------------------------------------ sending

    def _budget(self) -> Budget | None:
        return carried_budget(m.envelope.budget for m in self.held.all(time.monotonic()))

    def send(self, subject: str, payload: Any, reply_to: str | None = None) -> dict[str, Any]:
        result = self.client.publish(
            subject,
            payload,
            sender=self.sender,
            reply_to=reply_to or self.sender,
            budget=self._budget(),
        )
        return _delivered(result)

    def send_and_wait(self, subject: str, payload: Any, timeout_s: float) -> dict[str, Any]:
        """The SDK's `request`: refused at once when no endpoint takes it, `timeout`
        when no reply comes; a later reply is a dead letter (``late_reply``)."""
        reply = self.client.request(
            subject, payload, sender=self.sender, timeout=timeout_s, budget=self._budget()
        )
        return {"requestId": reply.parent_id, "reply": reply.to_wire()}

    def reply(self, id: str, payload: Any) -> dict[str, Any]:
        with self._seen_lock:
            envelope = self._seen.get(id)
        if envelope is None:
            raise MessageNotFound(f"message {id} was not read here with relay_inbox")
        return _delivered(self.client.reply(envelope, payload, sender=self.sender))

    # ------------------------------------------------------------------ receiving

    def read_inbox(self, endpoint: str, limit: int, wait_s: float) -> dict[str, Any]:
        """Fetch up to ``limit`` messages of ``endpoint`` (when none waits, wait up to
        ``wait_s`` for one); they are held until answered or the ack deadline."""
        subjects.validate(endpoint)
        now = time.monotonic()
        earlier = [m.id for m in self.held.of(endpoint, now)]
        held = len(self.held.all(now))
        if held >= MAX_HELD:
            raise LimitExceeded(
                f"{held} messages read and not answered (the limit is {MAX_HELD}): "
                "relay_ack or relay_nack some first"
            )
        batch = min(limit, MAX_HELD - held)
        fetched = self._fetch(endpoint, batch, 0.0)
        if not fetched:
            self._check_registered(endpoint)
            if wait_s > 0:
                fetched = self._fetch(endpoint, batch, wait_s)
        self.held.hold(fetched, time.monotonic())
        with self._seen_lock:
            for message in fetched:
                self._seen[message.id] = message.envelope
            while len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
        return {"messages": [_shown(m) for m in fetched], "stillHeld": earlier}

    def _fetch(self, endpoint: str, batch: int, wait: float) -> list[Message]:
        return self.client.fetch(endpoint, batch=batch, wait=wait, ack_wait=self.held.ack_wait)

    def _check_registered(self, endpoint: str) -> None:
        """Nothing to fetch: say so apart from an endpoint that does not exist (a fetch
        of a subject no endpoint has just finds nothing)."""
        if all(info.subject != endpoint for info in self.client.list_endpoints()):
            raise EndpointNotFound(f"no endpoint {endpoint} is registered")

    def ack(self, endpoint: str, id: str) -> dict[str, Any]:
        message = self._answer(endpoint, id, lambda m: m.ack())
        return {**_answered(message, "ack"), "endpoint": endpoint, "state": "done"}

    def nack(self, endpoint: str, id: str, reason: str) -> dict[str, Any]:
        message = self._answer(endpoint, id, lambda m: m.nack(reason))
        answer = _answered(message, "nack")
        return {**answer, "endpoint": endpoint, "state": "failed", "reason": reason}

    def _answer(self, endpoint: str, id: str, answer: Callable[[Message], None]) -> Message:
        """Answer a held message; it returns once the router has applied the answer."""
        found = self.held.find(id, endpoint, time.monotonic())
        if not found:
            raise InvalidState(
                f"message {id} of {endpoint} is not held by this server (never read with "
                "relay_inbox, answered already, or its ack deadline of "
                f"{self.held.ack_wait:g} s passed and it was handed out again)"
            )
        message = found[0]
        try:
            answer(message)
        except InvalidState as exc:
            self.held.forget(message)
            raise InvalidState(
                f"message {id} of {endpoint} is no longer held by this server: {exc.message}"
            ) from None
        self.held.forget(message)
        return message

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
        signal = Signal(SignalType(type), state, self.sender, time.time_ns() // 1_000_000)
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


def _shown(message: Message) -> dict[str, Any]:
    """A message as relay_inbox returns it: its envelope, and which hand-out this is."""
    return {**message.envelope.to_wire(), "deliveries": message.deliveries}


def _answered(message: Message, answer: str) -> dict[str, Any]:
    return {"id": message.id, "answer": answer, "deliveries": message.deliveries}


def _result(text: str, *, error: bool = False, structured: Any = None) -> types.CallToolResult:
    """The text always (older hosts read only that); the same data as structured content
    on success. A tool error has none: its schema is the text's ``code: sentence``."""
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured, is_error=error
    )


def build_server(tools: RelayTools, agents: Agents | None = None) -> Server:
    """The MCP server object: tools/list and tools/call over ``tools``, or over the
    tools of each call's token identity (``agents``, MCP over HTTP)."""
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

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if agents is None:
            return await tools.call(params.name, params.arguments)
        try:
            chosen = await agents.for_request(ctx.request)
        except RelayError as exc:  # no sender to act as, the router refused the client
            return _result(error_text(exc.code, exc.message), error=True)
        return await chosen.call(params.name, params.arguments)

    return Server(
        "relay",
        version="0.1.0",
        instructions=(
            f"Relay message bus; you send as {tools.sender}"
            + (
                ""
                if agents is None
                else " (with a bearer token: as its Relay-Sender header names, or as the "
                "token's one sender subject)"
            )
            + f". Read your messages with relay_inbox(endpoint={tools.sender!r} or your "
            "own), answer each with relay_reply when asked, then relay_ack it."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(server: Server) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(server: Server, host: str, port: int, auth: AuthFile) -> None:
    import uvicorn  # a dependency of mcp; only the HTTP transport needs it

    app = TokenGate(server.streamable_http_app(host=host), auth)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def serve(
    client: Client,
    sender: str,
    http: str | None = None,
    ack_wait: float = DEFAULT_ACK_WAIT_S,
    *,
    home: Home | None = None,
    connect_as: Callable[[str], Client] | None = None,
) -> None:
    """Serve the tools until the host closes stdin (stdio) or the process is stopped.
    ``ack_wait``: seconds a message read with relay_inbox stays held unanswered before
    the router hands it out again (docs/mcp.md, "Reading and answering"). Over HTTP,
    ``connect_as(user)`` makes a client acting for a token's identity (``home`` says
    where auth.json is)."""
    tools = RelayTools(client, sender, ack_wait)
    if http is None:
        anyio.run(serve_stdio, build_server(tools))
        return
    if home is None or connect_as is None:
        raise ValueError("MCP over HTTP needs the data directory and a way to act for tokens")
    auth = AuthFile(home.auth_file, home.owner_uid)
    auth.refresh()  # started with tokens listed: it serves by token from the first request
    agents = Agents(tools, auth, connect_as, lambda c, s: RelayTools(c, s, ack_wait))
    host, _, port = http.rpartition(":")

    async def run() -> None:
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(agents.sweep)
                await serve_http(build_server(tools, agents), host or "127.0.0.1", int(port), auth)
                tasks.cancel_scope.cancel()
        finally:
            await agents.close()

    anyio.run(run)
