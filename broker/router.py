"""The router process: decides where every message goes; the writers do the I/O.

Sockets (docs/architecture.md has the map): a ROUTER for clients (requests, replies,
pushed messages), an XPUB for signals, one PUSH per shard writer, one PULL for the
writers' results. One thread, one poll loop; every wait has a deadline.

A publish is answered only when every writer involved has reported its copy durable
(or failed), so "delivered" in a PublishResult means fsynced and indexed. Work sent to
a writer that does not answer within `WRITER_DEADLINE_MS` is answered with an
``unavailable`` error instead of silence.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq

from broker import consumers as cons
from broker.auth import AuthPolicy
from broker.budget import clamp
from broker.consumers import Consumers, Session
from broker.control import ControlPlane
from broker.delivery import Claim, Ledger
from broker.publish import Copy, PublishPlan, PublishRequest, Refusal, encode_payload, plan_publish
from broker.rejections import RATE_LIMITED, RejectionLog
from broker.reliability import Reliability
from broker.rules import RuleSet
from broker.signal_out import SignalOutbox
from broker.sublist import Sublist
from broker.watch import AUTH_FILE, CONFIG_FILE, RULES_FILE, FileWatch
from broker.writer_links import WriterLinks
from broker.zap import ZapHandler, message_user, secure
from sdk import wire
from sdk.errors import (
    AccessDenied,
    EndpointNotFound,
    InvalidConfig,
    InvalidMessage,
    InvalidState,
    LimitExceeded,
    NotAuthorized,
    RelayError,
    SenderNotAllowed,
    StorageError,
    Unavailable,
    UnknownOperation,
    from_code,
)
from sdk.ids import check_id, is_id, new_id
from sdk.paths import UNROUTABLE, Home
from sdk.sockets import NOBLOCK, send_parts
from sdk.subjects import has_wildcards, validate
from sdk.types import (
    AccessRule,
    Budget,
    EndpointInfo,
    RuleAction,
    Signal,
    SignalType,
    default_budget,
)
from workers import protocol as proto
from workers.index import MAX_QUERY_LIMIT, MessageIndex
from workers.maildir import Mailbox
from workers.process import run_until_stopped
from workers.records import MessageRecord, State
from workers.writer import is_mailbox_name, shard_of

log = logging.getLogger("relay.router")

WRITER_DEADLINE_MS = 10_000
MAX_INFLIGHT_PER_CLIENT = 1024  # requests awaiting a writer, per client
MAX_COMPACT_ITEMS = 10_000  # per compact_remove request (~0.5 MB of msgpack)
POLL_MS = 250
SERVER_NAME = "relay"
# Signals the router itself emits: a client forging them would mislead every watcher.
ROUTER_SIGNALS = frozenset({SignalType.DELIVERY_RECEIPT, SignalType.BACKPRESSURE})
# Operations that change what everyone sees: only identities with "admin" (auth.json).
ADMIN_OPS = frozenset(
    {
        "set_config",
        "add_rule",
        "remove_rule",
        "unregister",
        "purge_dead_letters",
        "rebuild_index",
        "compact_remove",
        "complete",
        "fail",
        "requeue",
    }
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Pending:
    """A client request waiting for writers: a publish, or an operation on N shards."""

    client: bytes
    rid: int
    deadline: int
    remaining: int
    on_done: Callable[[Pending], Any]  # builds the reply result (or raises RelayError)
    results: list[Any] = field(default_factory=list)
    shards: set[int] = field(default_factory=set)
    error: RelayError | None = None
    message_id: str = ""  # a publish's message
    copies: dict[str, Copy] = field(default_factory=dict)  # a publish's writes, by endpoint
    # endpoint -> None (durable) or (code, message) when the copy was not stored
    outcomes: dict[str, tuple[str, str] | None] = field(default_factory=dict)


class Router:
    def __init__(
        self,
        home: Home,
        shards: int,
        *,
        address: str | None = None,
        signals_address: str | None = None,
        ctx: zmq.Context | None = None,
    ):
        if shards < 1:
            raise ValueError("shards must be >= 1")
        self.home = home.create()
        self.shards = shards
        self.address = address or home.router_address
        self.signals_address = signals_address or home.signals_address
        self.ctx = ctx or zmq.Context.instance()
        self.stopping = False

        self.control = ControlPlane(home.control_db, home.mailboxes)
        self.rules = RuleSet(self.control.list_rules())
        self.rejections = RejectionLog(self.home.root / "rejections.db")  # for ops metrics
        self.file_errors: dict[str, str] = {}  # config.json / access-rules.json -> problem
        self.config = self.control.get_config()
        self.reliability = Reliability(self.config, self._depth_of)
        self.watch = FileWatch(self.home.root)
        self.endpoints: dict[str, EndpointInfo] = {}  # subject -> info
        self.by_hash: dict[str, EndpointInfo] = {}
        self.endpoint_trie: Sublist[str] = Sublist()  # concrete subject -> hash
        self.consumers = Consumers()
        self.pending: dict[int, Pending] = {}
        self._tokens = itertools.count(1)  # requests to writers, answered by token
        self.ledger = Ledger(self.consumers, shards, self._waiting_in, self._tokens)
        # Copies decided while reading the client socket, per shard, sent after the pass.
        self._outgoing: dict[int, list[tuple[proto.DeliveryHeader, bytes]]] = {}
        # Work for a shard whose writer is expected but not up (starting, restarting):
        # sent at its hello, or answered `unavailable` at the request's deadline.
        self._parked_copies: dict[int, list[tuple[proto.DeliveryHeader, bytes]]] = {}
        self._parked_ops: dict[int, list[tuple[int, list[bytes]]]] = {}
        self._ready = False  # every writer has said hello once
        self._replies: dict[bytes, list[bytes]] = {}  # client -> reply bodies to batch
        self._signals_out = SignalOutbox()  # sent at the end of each pass
        self.started_at = now_ms()
        self._bound: list[str] = []

        # Before any client socket binds: libzmq asks it about every handshake.
        self.auth = AuthPolicy(self.home.owner_uid)
        self.zap = ZapHandler(self.ctx, lambda: self.auth)
        self.clients = self._socket(zmq.ROUTER)
        self.clients.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.clients.setsockopt(zmq.SNDHWM, 100_000)
        # XPUB: the router sees the topics subscribed to (broker/signal_out.py).
        self.signals = self._socket(zmq.XPUB)
        secure(self.clients, self.address, home.keys)
        secure(self.signals, self.signals_address, home.keys)
        self.links = WriterLinks(self.ctx, shards)
        self.from_writers = self._socket(zmq.PULL)

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        old = os.umask(0o077)  # ipc socket files: owner only
        try:
            self._bind(self.clients, self.address)
            self._bind(self.signals, self.signals_address)
            self._bind(self.from_writers, self.home.results_address)
            self._bound += self.links.bind(self.home.shard_address)
        finally:
            os.umask(old)
        for info in self.control.list_endpoints():
            self._add_endpoint(info)
        self._load_files({CONFIG_FILE, RULES_FILE}, only_if_changed=True)
        self._load_auth_file()
        self._seed_rate_limiter()
        log.info(
            "router on %s, %d shards, %d endpoints", self.address, self.shards, len(self.endpoints)
        )

    def _bind(self, sock: zmq.Socket, address: str) -> None:
        sock.bind(address)
        self._bound.append(address)

    def _add_endpoint(self, info: EndpointInfo) -> None:
        Mailbox(self.home.mailbox(info.hash), info.hash).create()
        self.endpoints[info.subject] = info
        self.by_hash[info.hash] = info
        self.endpoint_trie.insert(info.subject, info.hash)
        self.ledger.add_endpoint(info.hash, info.subject)

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.clients, zmq.POLLIN)
        poller.register(self.from_writers, zmq.POLLIN)
        for monitor in self.links.monitors:  # a writer that goes away is down at once
            poller.register(monitor, zmq.POLLIN)
        for sock in self.links.sockets:
            poller.register(sock, zmq.POLLIN)
        poller.register(self.watch.fileno(), zmq.POLLIN)
        poller.register(self.zap.socket, zmq.POLLIN)
        poller.register(self.signals, zmq.POLLIN)
        next_sweep = 0
        while not self.stopping:
            events = dict(poller.poll(POLL_MS))
            if self.watch.fileno() in events:
                changed = self.watch.changed()
                self._load_files(changed)
                if AUTH_FILE in changed:
                    self._load_auth_file()
            if self.zap.socket in events:
                self.zap.handle()
            if self.signals in events:
                self._drain(self.signals, lambda frames: self._signals_out.subscription(frames[0]))
            # Disconnects before hellos: a descriptor's close is reported before a new
            # connection can reuse it (broker/writer_links.py).
            for monitor in self.links.monitors:
                if monitor in events and (shard := self.links.gone(monitor)) is not None:
                    self._writer_gone(shard)
            for shard in self.links.take_lost():
                self._writer_gone(shard)
            for shard, sock in enumerate(self.links.sockets):
                if sock not in events:
                    continue
                was_up = self.links.is_up(shard)
                if self.links.on_hello(shard, now_ms()) is not None:
                    if was_up:  # a writer that replaces one not seen going: it went
                        self._writer_gone(shard)
                    self._writer_up(shard)
            if self.from_writers in events:
                self._drain(self.from_writers, self._on_writer)
            if self.clients in events:
                self._drain_clients()
            self.ledger.feed_refilled()
            self._send_ledger_outbox()
            self._flush_deliveries()
            now = now_ms()
            if now >= next_sweep:
                self._sweep(now)
                self.rejections.flush_due(now)
                next_sweep = now + POLL_MS
            self._flush_replies()
            self._signals_out.flush(self.signals)

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Callable[[list[bytes]], None], limit: int = 1000) -> None:
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handle(frames)

    def _drain_clients(self, limit: int = 2000) -> None:
        """At most about ``limit`` requests per pass (a batch counts as many), so the
        writers' results and the sweep get their turn."""
        handled = 0
        while handled < limit:
            try:
                frames = self.clients.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handled += self._on_client([f.bytes for f in frames], message_user(frames[0]))

    def close(self) -> None:
        self.rejections.close()
        self.control.close()
        self.watch.close()
        self.links.close()
        for sock in (self.clients, self.signals, self.from_writers):
            sock.close(0)
        self.zap.close()
        self.ctx.term()
        for address in self._bound:  # libzmq leaves ipc socket files behind
            if address.startswith("ipc://"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address[len("ipc://") :])

    def _sweep(self, now: int) -> None:
        expired = False
        for token, job in list(self.pending.items()):
            if job.deadline > now:
                break  # insertion order is deadline order
            expired = True
            self._forget(token)
            if not job.copies:  # an operation fails as a whole
                self._reply_error(job.client, job.rid, Unavailable(self._timed_out(job.shards)))
                continue
            # A publish: the copies stored are delivered, the others unavailable.
            for endpoint, copy in job.copies.items():
                if endpoint in job.outcomes:
                    continue
                shard = shard_of(endpoint, self.shards)
                if self.links.is_up(shard):  # a writer that does not answer: a failure
                    self.reliability.outcome(copy, success=False, now=now)
                else:  # kept for a writer that never came: not its endpoint's fault
                    self.reliability.never_tried(copy)
                job.outcomes[endpoint] = ("unavailable", self._timed_out({shard}))
                self.ledger.copy_abandoned(job.message_id, endpoint, sent=self.links.is_up(shard))
            self._reply(job.client, wire.ok_body(job.rid, job.on_done(job)))
        if expired:
            self._drop_parked_of_finished_jobs()
        self.reliability.prune(now)
        for identity in self.consumers.expired(now):
            log.info(
                "client %s silent for %d ms: session ended", identity.hex(), cons.SESSION_TIMEOUT_MS
            )
            self._end_session(identity)

    def _timed_out(self, shards: set[int]) -> str:
        waited = f"{WRITER_DEADLINE_MS / 1000:g} s"
        down = sorted(s for s in shards if not self.links.is_up(s))
        if down:
            named = ", ".join(f"{s} ({self.links.state(s)})" for s in down)
            return f"writer for shard {named} did not come up within {waited}; is it running?"
        named = ", ".join(str(s) for s in sorted(shards)) or "?"
        return f"writer for shard {named} did not confirm within {waited}"

    # ------------------------------------------------------------------ client side

    def _on_client(self, frames: list[bytes], user: str | None) -> int:
        """Handle one frame from a client; returns how many requests it held."""
        identity, body = frames[0], frames[1:]
        try:
            requests = wire.decode_requests(body)
        except RelayError as exc:
            self._reply_error(identity, wire.peek_rid(body), exc)
            return 1
        who = self.auth.identity(user)
        if who is None:  # admitted once, revoked since (auth.json changed)
            self._end_session(identity)
            error = NotAuthorized(f"the credentials of this connection ({user}) are not admitted")
            for request in requests:
                self._reply_error(identity, request.rid, error)
            return len(requests)
        session = self.consumers.touch(identity, now_ms(), user)
        session.who = who
        for request in requests:
            if self.consumers.sessions.get(identity) is not session:
                # `bye` (or a failed send) ended the session mid-batch: what follows
                # must not run on a detached session.
                error = InvalidState("the session ended earlier in this batch")
                self._reply_error(identity, request.rid, error)
            elif isinstance(request, wire.BadRequest):
                self._reply_error(identity, request.rid, request.error)
            else:
                self._handle(session, request)
        return len(requests)

    def _handle(self, session: Session, request: wire.Request) -> None:
        # A signal sent with "reply": false gets no answer, not even an error: a refusal
        # is only logged (docs/protocol.md, "signal").
        quiet = request.op == "signal" and request.get("reply") is False
        handler = self._ops.get(request.op)
        try:
            if handler is None:
                raise UnknownOperation(f"unknown operation {request.op!r:.60}")
            who = session.who
            if request.op in ADMIN_OPS and not (who and who.admin):
                name = who.name if who else session.user
                raise NotAuthorized(f"{request.op!r} needs operator rights; {name} has none")
            result = handler(self, session, request)
        except RelayError as exc:
            error = exc
        except Exception as exc:  # a bug here must cost one reply, not the router
            log.exception("operation %s failed", request.op)
            error = RelayError(f"internal error: {exc}")
        else:
            if result is not _DEFERRED and not quiet:
                self._reply(session.identity, wire.ok_body(request.rid, result))
            return
        if quiet:
            log.debug("%s without reply refused: %s %s", request.op, error.code, error.message)
        else:
            self._reply_error(session.identity, request.rid, error)

    def _reply(self, identity: bytes, body: bytes) -> None:
        """Replies to a client that asked for batches wait for the end of this loop
        iteration and leave as one frame; others leave at once, unless replies to the
        same client already wait (a reply never overtakes an earlier one)."""
        session = self.consumers.sessions.get(identity)
        if identity in self._replies or (session is not None and session.batches):
            self._replies.setdefault(identity, []).append(body)
        else:
            self._send(identity, [wire.MAGIC, body])

    def _flush_replies(self, only: bytes | None = None) -> bool:
        """Send what waits (for one client, or all); False if a send to ``only`` failed."""
        identities = [only] if only is not None else list(self._replies)
        for identity in identities:
            bodies = self._replies.pop(identity, None)
            if not bodies:
                continue
            for _, frame in wire.frames(bodies):
                if not self._send(identity, [wire.MAGIC, frame]):
                    if identity == only:
                        return False
                    break
        return True

    def _push(self, identity: bytes, frames: list[bytes]) -> bool:
        """A message for a subscription: after the replies queued before it (a subscribe
        reply must reach the client before the backlog it announces)."""
        return self._flush_replies(identity) and self._send(identity, frames, copy=False)

    def _send(self, identity: bytes, frames: list[bytes], *, copy: bool = True) -> bool:
        # Zero-copy only for pushes, whose file bytes may be a megabyte; small frames
        # are cheaper copied.
        try:
            send_parts(self.clients, [identity, *frames], NOBLOCK, copy)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client is gone; EAGAIN: not reading
            log.info("client %s unreachable (%s): session ended", identity.hex(), exc)
            self._end_session(identity)
            return False

    def _reply_error(self, identity: bytes, rid: int, error: RelayError) -> None:
        self._reply(identity, wire.error_body(rid, error))

    def _end_session(self, identity: bytes) -> None:
        self.consumers.end_session(identity)

    # ------------------------------------------------------------------ operations

    def _op_hello(self, session: Session, req: wire.Request) -> Any:
        session.batches = req.get("batch") is True
        return {
            "server": SERVER_NAME,
            "version": wire.PROTOCOL_VERSION,
            "signals": self.signals_address,
            "shards": self.shards,
            "limits": dict(self.config["limits"]),
            "batch": wire.MAX_BATCH,  # requests per frame this broker accepts
            "signalRuns": True,  # subscribe to "+" topics for runs of signals
        }

    def _op_ping(self, session: Session, req: wire.Request) -> Any:
        # A router that restarted knows the client only from its next request: pings
        # carry the batch choice too.
        session.batches = session.batches or req.get("batch") is True
        # The subscriptions this connection holds: a client that finds one of its own
        # missing (router restart, session timeout) knows to subscribe again.
        return {"now": now_ms(), "subs": sorted(session.subs)}

    def _op_bye(self, session: Session, req: wire.Request) -> Any:
        self._end_session(session.identity)
        return {}

    def _op_publish(self, session: Session, req: wire.Request) -> Any:
        now = now_ms()
        limits = self.config["limits"]
        subject = validate(_str(req, "subject"), wildcards=True)
        sender = self._sender(session, _str(req, "from"))
        reply_to = req.get("replyTo")
        if reply_to is not None:
            # Replies go out under the consumer's name: only to where we may send.
            reply_to = self._sender(session, _str(req, "replyTo"))
        if "payload" not in req.body:
            raise InvalidMessage("request field 'payload' is missing")
        payload_json = encode_payload(req.get("payload"), limits["maxPayloadBytes"])
        budget = self._publish_budget(req, sender, now)
        message_id = new_id(now)
        verdict = self.reliability.rate(sender, now)
        if verdict is not None:  # before fan-out; nothing is written
            self.rejections.record(now, RATE_LIMITED, "*", sender)
            return {
                "messageId": message_id,
                "deliveredTo": 0,
                "rejected": [["*", "rate_limited"]],
                "mailboxPressure": {},
                "details": {"*": verdict.reason},
            }
        request = PublishRequest(message_id, subject, sender, reply_to, budget, now, payload_json)
        plan = plan_publish(
            request,
            self._targets(subject),
            self.rules,
            payload_json,
            now,
            gate=lambda target: self._gate(target, sender, now),
        )
        if plan.stores_something:
            self.reliability.count(sender, now)
        writes = plan.writes
        if not writes:
            return self._publish_result(message_id, plan, {})
        job = self._new_job(
            session,
            req,
            len(writes),
            lambda job: self._publish_result(message_id, plan, job.outcomes),
        )
        job.message_id = message_id
        token = self._register(job)
        for copy in writes:
            # A copy for a writer not up yet waits for it (_flush_deliveries).
            shard = shard_of(copy.endpoint, self.shards)
            dead = copy.dead
            header = proto.DeliveryHeader(
                token,
                message_id,
                copy.endpoint,
                copy.subject,
                sender,
                now,
                target=proto.TARGET_FAILED if dead else self._store_target(message_id, copy),
                reason=dead.reason if dead else None,
                code=dead.code if dead else None,
                failed_at=dead.failed_at if dead else None,
            )
            job.copies[copy.endpoint] = copy
            job.shards.add(shard)
            self._outgoing.setdefault(shard, []).append((header, copy.data))
        return _DEFERRED

    def _sender(self, session: Session, sender: str) -> str:
        """``from`` checked against the connection's credentials (auth.json)."""
        validate(sender)
        who = session.who
        if who is None or not who.may_send_as(sender):
            allowed = ", ".join(who.senders) if who else "nothing"
            name = who.name if who else session.user
            raise SenderNotAllowed(f"{name} may not send as {sender}; it may use {allowed}")
        return sender

    def _publish_budget(self, req: wire.Request, sender: str, now: int) -> Budget:
        """The budget a publish travels with. Budgets never grow: a reply naming its
        parent (``parentId``) sent by the endpoint the parent was delivered to carries
        the parent's stored budget, whatever the client sent; any other client budget is
        clamped to the configured maxima; none at all gets the defaults."""
        parent_id = req.get("parentId")
        if parent_id is not None:
            inherited = self._stored_budget(check_id(parent_id, "parentId"), sender)
            if inherited is not None:
                return inherited
        raw = req.get("budget")
        if raw is None:
            return default_budget(now)
        return clamp(Budget.from_wire(raw), now, self.config["budget"])

    def _stored_budget(self, message_id: str, endpoint_subject: str) -> Budget | None:
        info = self.endpoints.get(endpoint_subject)
        if info is None:
            return None
        try:
            _, data = Mailbox(self.home.mailbox(info.hash), info.hash).read(message_id)
            return Budget.from_wire(json.loads(data)["budget"])
        except (RelayError, OSError, ValueError, KeyError, TypeError):
            return None  # moved meanwhile, compacted, or not a Relay envelope

    def _store_target(self, message_id: str, copy: Copy) -> str:
        """Where a delivered copy goes: straight into cur/, claimed, when a consumer with
        credit waits for its endpoint and nothing older for it is in the way (the
        ledger decides); else into new/."""
        if self.ledger.store_target(message_id, copy.endpoint) is not None:
            return proto.TARGET_CUR
        return proto.TARGET_NEW

    def _flush_deliveries(self) -> None:
        """Send the copies decided in this pass: one message per shard (protocol.deliver).

        A shard whose writer is not up (starting, restarting) keeps its copies until the
        writer's hello; one that is up and does not take them (its queue is full) fails
        them now."""
        outgoing, self._outgoing = self._outgoing, {}
        for shard, items in outgoing.items():
            if self.links.send(shard, proto.deliver(items)):
                continue
            if not self.links.is_up(shard):
                self._park_copies(shard, items)
                continue
            for header, _ in items:
                token, endpoint = header.token, header.endpoint
                self.ledger.copy_abandoned(header.id, endpoint, sent=False)
                job = self.pending.get(token)
                if job is not None and endpoint not in job.outcomes:
                    job.outcomes[endpoint] = self._writer_down(job.copies[endpoint], shard)
                    self._progress(token, job)

    def _park_copies(self, shard: int, items: list[tuple[proto.DeliveryHeader, bytes]]) -> None:
        """Keep copies for the shard's hello. One meant to be stored claimed goes to new/
        instead: its consumer's credit comes back now, not after the writer's start."""
        parked = self._parked_copies.setdefault(shard, [])
        for header, data in items:
            if header.target == proto.TARGET_CUR:
                self.ledger.storing(header.id, header.endpoint)
                header = header._replace(target=proto.TARGET_NEW)
            parked.append((header, data))

    def _send_or_park(self, shard: int, token: int, frames: list[bytes]) -> bool:
        """An operation for a shard's writer: sent, or kept for its hello while it is not
        up. False when it is up and does not take it (its queue is full)."""
        if self.links.send(shard, frames):
            return True
        if self.links.is_up(shard):
            return False
        self._parked_ops.setdefault(shard, []).append((token, frames))
        return True

    def _drop_parked_of_finished_jobs(self) -> None:
        """Parked work whose request was answered meanwhile (its deadline passed) is never
        sent: a publish answered `unavailable` must not be stored after all."""
        for shard, items in self._parked_copies.items():
            self._parked_copies[shard] = [(h, d) for h, d in items if self._awaited(h)]
        for shard, ops in self._parked_ops.items():
            self._parked_ops[shard] = [(t, f) for t, f in ops if t in self.pending]

    def _awaited(self, header: proto.DeliveryHeader) -> bool:
        """Whether a copy's publish still waits for it."""
        job = self.pending.get(header.token)
        return job is not None and header.endpoint not in job.outcomes

    def _writer_down(self, copy: Copy, shard: int) -> tuple[str, str]:
        """The outcome of a copy that never reached a writer: not a failure of its
        endpoint (the breaker does not count it)."""
        self.reliability.never_tried(copy)
        return ("unavailable", f"writer for shard {shard} is not taking work (its queue is full)")

    def _publish_result(
        self, message_id: str, plan: PublishPlan, outcomes: dict[str, tuple[str, str] | None]
    ) -> dict[str, Any]:
        delivered, rejected, details = 0, [], {}
        for copy in plan.copies:
            rejection = copy.rejection
            failure = outcomes.get(copy.endpoint)
            if rejection is None and failure is not None:
                rejection = (copy.endpoint, *failure)
            if rejection is None:
                delivered += 1
            else:
                rejected.append([rejection[0], rejection[1]])
                details[rejection[0]] = rejection[2]
        touched = [c.endpoint for c in plan.copies if c.endpoint != UNROUTABLE]
        return {
            "messageId": message_id,
            "deliveredTo": delivered,
            "rejected": rejected,
            "mailboxPressure": {e: self.reliability.pressure_of(e).ratio for e in touched},
            "details": details,
        }

    # ------------------------------------------------------------------ reliability

    def _apply_config(self, config: dict[str, Any]) -> None:
        self.config = config
        self.reliability.configure(config)

    def _depth_of(self, endpoint: str) -> int:
        return self.ledger.depth(endpoint)

    def _gate(self, target: EndpointInfo, sender: str, now: int) -> tuple[Refusal | None, bool]:
        """Backpressure, then the circuit breaker, for one target of a publish."""
        refusal, probe, signals = self.reliability.gate(target.hash, target.subject, sender, now)
        for subject, signal_ in signals:
            self._signals_out.add(subject, signal_.to_wire())
        if refusal is not None:
            self.rejections.record(now, refusal.reason, target.hash, sender)
        return refusal, probe

    def _seed_rate_limiter(self) -> None:
        """The rate-limit window survives a restart: refill it from the indexes."""
        since = now_ms() - self.reliability.limiter.window_secs * 1000
        seen: dict[str, tuple[str, int]] = {}
        with self._shard_indexes() as indexes:
            for index in indexes:
                for message_id, sender, created_at in index.recent_publishes(since):
                    seen[message_id] = (sender, created_at)
        self.reliability.seed(seen.values())

    def _load_files(self, names: set[str], *, only_if_changed: bool = False) -> None:
        """Apply config.json / access-rules.json; a bad file is reported, never half-applied.

        At start (``only_if_changed``) a file identical to the one last applied is
        skipped: control.db already holds it, plus any change made since through the
        CLI or the SDK, which a blind re-apply would undo.
        """
        loaders = {CONFIG_FILE: self._load_config_file, RULES_FILE: self._load_rules_file}
        for name in sorted(names & loaders.keys()):
            path = self.home.root / name
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except FileNotFoundError:
                self._file_removed(name)
                continue
            except OSError as exc:
                digest = f"unreadable: {exc}"
            if only_if_changed and self.control.applied_digest(name) == digest:
                continue
            if loaders[name]():
                self.control.set_applied_digest(name, digest)

    def _file_removed(self, name: str) -> None:
        """A deleted file changes nothing, except that a refused one no longer counts: what
        was last applied (control.db, kept through CLI and SDK changes) is in force again.
        For the rules that ends the deny-everything a broken rules file meant."""
        problem = self.file_errors.pop(name, None)
        if problem is None:
            return
        if name == RULES_FILE:
            self.rules = RuleSet(self.control.list_rules())
        log.info("%s (refused) was removed: the settings last applied, in control.db, hold", name)

    def _load_auth_file(self) -> None:
        """auth.json: who may connect and send as what. A bad file keeps the last good
        policy (at start: the owner only), so a typo never opens the door."""
        try:
            if (self.home.root / AUTH_FILE).exists():
                policy = AuthPolicy.from_json(self._read_json(AUTH_FILE), self.home.owner_uid)
            else:
                policy = AuthPolicy(self.home.owner_uid)
        except RelayError as exc:
            self.file_errors[AUTH_FILE] = str(exc)
            log.error("%s refused, the last good policy stays in force: %s", AUTH_FILE, exc)
            return
        revoked = self.auth.users - policy.users
        self.auth = policy
        self.file_errors.pop(AUTH_FILE, None)
        log.info("%s applied: %d uids, %d keys", AUTH_FILE, len(policy.uids), len(policy.keys))
        if revoked:
            self._rebind_signals()
        self._end_subscriptions_beyond_rights()
        self._open_sockets_to_admitted_uids()

    def _end_subscriptions_beyond_rights(self) -> None:
        """Narrowed rights (or revoked credentials) stop pushes at once, not at the next
        subscribe. Messages already pushed stay held (ack them as usual); the client
        learns at its next heartbeat, and subscribing again is refused."""
        for session in list(self.consumers.sessions.values()):
            who = self.auth.identity(session.user)
            for sub_id in sorted(session.subs):
                sub = self.consumers.subs[sub_id]
                if who is None or not who.may_consume(sub.pattern):
                    log.warning(
                        "subscription %d to %r ended: %s may no longer receive it (%s)",
                        sub_id,
                        sub.pattern,
                        who.name if who else session.user,
                        AUTH_FILE,
                    )
                    self.consumers.unsubscribe(sub_id)

    def _rebind_signals(self) -> None:
        """Requests are checked one by one, but a SUB connection only at its handshake:
        drop every signal subscriber so each reconnects (libzmq does, by itself) through
        ZAP again. Signals are ephemeral; the others miss a few milliseconds of them."""
        self.signals.unbind(self.signals_address)
        old = os.umask(0o077)
        try:
            # libzmq closes the listener on its I/O thread: the address frees up within
            # milliseconds, not at once.
            for _ in range(200):
                try:
                    self.signals.bind(self.signals_address)
                    break
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EADDRINUSE:
                        raise
                    time.sleep(0.005)
            else:
                log.error("could not rebind %s: signals are down", self.signals_address)
                return
        finally:
            os.umask(old)
        log.info("signal subscribers dropped to re-check their credentials")

    def _open_sockets_to_admitted_uids(self) -> None:
        # Other uids admitted: their connect(2) must reach ZAP, which is then the gate.
        mode = 0o666 if len(self.auth.uids) > 1 else 0o600
        for address in (self.address, self.signals_address):
            if address.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    os.chmod(address[len("ipc://") :], mode)

    def _read_json(self, name: str) -> Any:
        try:
            return json.loads((self.home.root / name).read_bytes())
        except (OSError, ValueError) as exc:
            raise InvalidConfig(f"{name} is not valid JSON: {exc}") from None

    def _load_config_file(self) -> bool:
        try:
            config = self.control.replace_config(self._read_json(CONFIG_FILE))
        except RelayError as exc:
            self.file_errors[CONFIG_FILE] = str(exc)
            log.error(
                "%s refused, the last good configuration stays in force: %s", CONFIG_FILE, exc
            )
            return False
        self.file_errors.pop(CONFIG_FILE, None)
        self._apply_config(config)
        log.info("%s applied", CONFIG_FILE)
        return True

    def _load_rules_file(self) -> bool:
        try:
            data = self._read_json(RULES_FILE)
            if isinstance(data, dict):
                data = data.get("rules")
            if not isinstance(data, list):
                raise InvalidConfig(f'{RULES_FILE} must be a list of rules (or {{"rules": [...]}})')
            rules = [AccessRule.from_wire(r, path=f"rules[{i}]") for i, r in enumerate(data)]
            self.rules = RuleSet(self.control.replace_rules(rules))
        except RelayError as exc:
            # Fail closed: a rules file that cannot be read must not mean "allow everything".
            self.rules = RuleSet([AccessRule(">", ">", RuleAction.DENY, priority=2**31)])
            self.file_errors[RULES_FILE] = (
                f"{exc}; denying every publish until it is fixed or removed (removed, the "
                "rules last applied, kept in control.db, hold again)"
            )
            log.error("%s refused: %s", RULES_FILE, self.file_errors[RULES_FILE])
            return False
        self.file_errors.pop(RULES_FILE, None)
        log.info("%s applied: %d rules", RULES_FILE, len(self.rules))
        return True

    def _targets(self, subject: str) -> list[EndpointInfo]:
        if has_wildcards(subject):
            hashes = self.endpoint_trie.reverse_match(subject)
            return sorted((self.by_hash[h] for h in hashes), key=lambda e: e.subject)
        info = self.endpoints.get(subject)
        return [info] if info else []

    def _new_job(
        self, session: Session, req: wire.Request, remaining: int, on_done: Callable[[Pending], Any]
    ) -> Pending:
        if session.waiting >= MAX_INFLIGHT_PER_CLIENT:
            raise LimitExceeded(
                f"{session.waiting} requests of this connection are already waiting on "
                f"writers; the limit is {MAX_INFLIGHT_PER_CLIENT}"
            )
        return Pending(session.identity, req.rid, now_ms() + WRITER_DEADLINE_MS, remaining, on_done)

    def _register(self, job: Pending) -> int:
        token = next(self._tokens)
        self.pending[token] = job
        self._waiting(job.client, +1)
        return token

    def _forget(self, token: int) -> Pending | None:
        job = self.pending.pop(token, None)
        if job is not None:
            self._waiting(job.client, -1)
        return job

    def _waiting(self, identity: bytes, delta: int) -> None:
        session = self.consumers.sessions.get(identity)
        if session is not None:
            session.waiting = max(0, session.waiting + delta)

    def _writer_op(
        self,
        session: Session,
        req: wire.Request,
        shards: list[int],
        name: str,
        on_done: Callable[[Pending], Any],
        **args: Any,
    ) -> Any:
        """Send one operation to several writers; reply when all have answered."""
        job = self._new_job(session, req, len(shards), on_done)
        token = self._register(job)
        for shard in shards:
            job.shards.add(shard)
            if not self._send_or_park(shard, token, proto.op(token, name, **args)):
                self._forget(token)
                raise Unavailable(f"writer for shard {shard} is not taking work")
        return _DEFERRED

    def _op_register(self, session: Session, req: wire.Request) -> Any:
        subject = validate(_str(req, "subject"))
        who = session.who
        if who is None or not (who.admin or who.may_send_as(subject)):
            raise NotAuthorized(
                f"{who.name if who else session.user} may register endpoints only under "
                "its own sender patterns"
            )
        info = self.control.register_endpoint(subject, now_ms())
        if subject in self.endpoints:
            return info.to_wire()
        self._add_endpoint(info)
        shard = shard_of(info.hash, self.shards)
        if not self.links.is_up(shard):
            return info.to_wire()  # a writer adopts every mailbox of its shard at start
        # Reply once the writer watches the new mailbox, so a file dropped into its new/
        # right after register() returns is noticed.
        return self._writer_op(
            session,
            req,
            [shard],
            "watch",
            lambda job: info.to_wire(),
            endpoint=info.hash,
            subject=subject,
        )

    def _op_unregister(self, session: Session, req: wire.Request) -> Any:
        subject = validate(_str(req, "subject"))
        removed = self.control.unregister_endpoint(subject)
        info = self.endpoints.pop(subject, None)
        if info is not None:
            self.by_hash.pop(info.hash, None)
            self.endpoint_trie.remove(subject, info.hash)
            self.ledger.remove_endpoint(info.hash)
        # The mailbox and everything in it stays: unread mail and dead letters are kept.
        return {"removed": removed}

    def _op_endpoints(self, session: Session, req: wire.Request) -> Any:
        return {
            "endpoints": [
                self._endpoint_status(info)
                for info in sorted(self.endpoints.values(), key=lambda e: e.subject)
            ]
        }

    def _endpoint_status(self, info: EndpointInfo) -> dict[str, Any]:
        load = self.reliability.pressure_of(info.hash)
        return {
            **info.to_wire(),
            "depth": load.depth,
            "pressure": load.ratio,
            "breaker": self.reliability.describe(info.hash, now_ms()),
        }

    def _op_subscribe(self, session: Session, req: wire.Request) -> Any:
        limits = self.config["limits"]
        pattern = validate(_str(req, "pattern"), wildcards=True)
        self._check_receives(session, pattern, operator_too=False)
        mode = req.get("mode", cons.CONSUME)
        if mode not in (cons.CONSUME, cons.OBSERVE):
            raise InvalidMessage(
                f"request field 'mode' must be 'consume' or 'observe', got {mode!r:.40}"
            )
        credit = req.get("credit", limits["defaultCredit"])
        if not isinstance(credit, int) or isinstance(credit, bool) or credit < 1:
            raise InvalidMessage(f"request field 'credit' must be a positive int, got {credit!r}")
        if credit > limits["maxCredit"]:
            raise LimitExceeded(f"credit {credit} exceeds the maximum of {limits['maxCredit']}")
        if len(session.subs) >= limits["maxSubscriptionsPerClient"]:
            raise LimitExceeded(
                f"this client already has {len(session.subs)} subscriptions; "
                f"the limit is {limits['maxSubscriptionsPerClient']}"
            )
        sub = self.consumers.subscribe(session.identity, pattern, mode, credit, now_ms())
        if mode == cons.CONSUME:
            # The reply goes out first, then the backlog (pushes follow in order).
            self._reply(session.identity, wire.ok_body(req.rid, {"sub": sub.id, "credit": credit}))
            self.ledger.subscribed(sub, sorted(self._endpoints_matching(pattern)))
            return _DEFERRED
        return {"sub": sub.id}

    def _endpoints_matching(self, pattern: str) -> set[str]:
        if has_wildcards(pattern):
            return set(self.endpoint_trie.reverse_match(pattern))
        info = self.endpoints.get(pattern)
        return {info.hash} if info else set()

    def _op_unsubscribe(self, session: Session, req: wire.Request) -> Any:
        sub_id = _int(req, "sub")
        sub = self.consumers.subs.get(sub_id)
        if sub is None or sub.client != session.identity:
            raise InvalidState(f"no subscription {sub_id!r:.20} on this connection")
        self.consumers.unsubscribe(sub_id)
        return {}

    def _finish_message(
        self, session: Session, req: wire.Request, name: str, *, operator: bool, **args: Any
    ) -> Any:
        """Mark a claimed message done or failed: a consumer's ack/nack, or an operator's
        complete/fail/requeue of a pending one. Either way the holder's credit comes back."""
        message_id = check_id(req.get("id"))
        endpoint = self._mailbox_arg(req)
        if operator:
            holder = next(
                (
                    s
                    for s in self.consumers.sessions.values()
                    if (message_id, endpoint) in s.unacked
                ),
                None,
            )
            sender = (
                self.consumers.settled(holder.identity, message_id, endpoint) if holder else None
            )
            args["claimedOnly"] = True  # an operator finishes pending messages only
        else:
            sender = self.consumers.settled(session.identity, message_id, endpoint)
            if sender is None:
                raise InvalidState(
                    f"message {message_id} of endpoint {endpoint} is not held by "
                    "this connection (already acknowledged, never delivered, or held by a "
                    "session that ended after 5 s of silence)"
                )

        def finish(job: Pending) -> Any:
            if not operator:  # an ack or a nack teaches the endpoint's breaker
                self.reliability.consumer_outcome(endpoint, success=name == "done", now=now_ms())
            if name == "done" and sender:
                self._delivery_receipt(message_id, endpoint, sender)
            if name == "requeue":
                self.ledger.requeued(message_id, endpoint)
            # The credit given back takes the next message at the end of this pass.
            return job.results[0]

        shard = shard_of(endpoint, self.shards)
        return self._writer_op(
            session, req, [shard], name, finish, id=message_id, endpoint=endpoint, **args
        )

    def _mailbox_arg(self, req: wire.Request) -> str:
        endpoint = req.get("endpoint")
        if not isinstance(endpoint, str) or not is_mailbox_name(endpoint):
            raise EndpointNotFound(f"no endpoint {endpoint!r:.60} (give its 12-hex hash)")
        return endpoint

    def _op_ack(self, session: Session, req: wire.Request) -> Any:
        return self._finish_message(session, req, "done", operator=False)

    def _op_nack(self, session: Session, req: wire.Request) -> Any:
        reason = req.get("reason") or "rejected by consumer"
        if not isinstance(reason, str):
            raise InvalidMessage("request field 'reason' must be a string")
        return self._finish_message(
            session, req, "fail", operator=False, reason=reason[:1000], code="nack"
        )

    def _delivery_receipt(self, message_id: str, endpoint: str, sender: str) -> None:
        """Tell the publisher, on its own subject, that a consumer finished its message."""
        info = self.by_hash.get(endpoint)
        if info is None or not sender:
            return
        signal_ = Signal(
            SignalType.DELIVERY_RECEIPT,
            "done",
            info.subject,
            now_ms(),
            {"messageId": message_id, "endpoint": endpoint},
        )
        self._signals_out.add(sender, signal_.to_wire())

    def _op_signal(self, session: Session, req: wire.Request) -> Any:
        subject = validate(_str(req, "subject"))
        signal_ = Signal.checked_wire(req.get("signal"))
        sender = req.get("from")
        who = session.who
        if sender is None and not (who and who.unrestricted):
            raise SenderNotAllowed("a signal from a restricted identity must name its 'from'")
        if signal_["type"] in ROUTER_SIGNALS and not (who and who.admin):
            raise NotAuthorized(f"{signal_['type']} signals come from the broker only")
        if sender is not None:
            decision = self.rules.decide(self._sender(session, _str(req, "from")), subject)
            if not decision.allowed:
                raise AccessDenied(f"signals from {sender} to {subject} are denied by a rule")
        self._signals_out.add(subject, signal_)
        return {}

    def _op_dead_letters(self, session: Session, req: wire.Request) -> Any:
        endpoint = self._endpoint_arg(req)
        limit = _limit(req)
        info = self.by_hash.get(endpoint) if endpoint is not None else None
        if info is not None:
            self._check_receives(session, info.subject)
        if info is not None or self._may_receive(session, ">"):
            records = self._query(state=State.FAILED, endpoint=endpoint, limit=limit)
        else:
            records = self._dead_letters_received(session, endpoint, limit)
        return {"items": [self._with_file(r) for r in records]}

    def _dead_letters_received(
        self, session: Session, endpoint: str | None, limit: int
    ) -> list[MessageRecord]:
        """The dead letters of an identity with restricted rights: those of each endpoint
        it may receive (an index lookup each), and of the unroutable ones (``endpoint``
        `UNROUTABLE` or None) those sent to a subject it may receive, looked for among
        the first MAX_QUERY_LIMIT of each shard (a bound on what one request reads)."""
        failed = State.FAILED.value
        mine = (
            []
            if endpoint is not None
            else [h for h, i in self.by_hash.items() if self._may_receive(session, i.subject)]
        )
        found: list[MessageRecord] = []
        with self._shard_indexes() as indexes:
            for index in indexes:
                for endpoint_hash in mine:
                    found += index.query(state=failed, endpoint=endpoint_hash, limit=limit)[0]
                unroutable, _ = index.query(
                    state=failed, endpoint=UNROUTABLE, limit=MAX_QUERY_LIMIT
                )
                found += [r for r in unroutable if self._may_receive(session, r.subject)]
        found.sort(key=lambda r: (r.id, r.endpoint))
        return found[:limit]

    def _op_purge_dead_letters(self, session: Session, req: wire.Request) -> Any:
        endpoint = self._endpoint_arg(req)
        shards = [shard_of(endpoint, self.shards)] if endpoint else list(range(self.shards))
        return self._writer_op(
            session,
            req,
            shards,
            "purge",
            lambda job: {"purged": sum(r["purged"] for r in job.results)},
            endpoint=endpoint,
        )

    def _op_compact_remove(self, session: Session, req: wire.Request) -> Any:
        """Ops compaction (docs/ops.md): the owning writers delete archived copies.

        ``items`` is ``[[id, endpoint], ...]`` (at most `MAX_COMPACT_ITEMS`); each writer
        removes only done and failed files. With ``checkpoint`` every writer, items or
        not, then checkpoints its index and vacuums it past ``vacuumPages`` free pages.
        """
        items = req.get("items", [])
        if not isinstance(items, list) or len(items) > MAX_COMPACT_ITEMS:
            raise InvalidMessage(
                f"request field 'items' must be a list of at most {MAX_COMPACT_ITEMS} "
                "[id, endpoint] pairs"
            )
        vacuum_pages = req.get("vacuumPages", 0)
        if not isinstance(vacuum_pages, int) or isinstance(vacuum_pages, bool) or vacuum_pages < 0:
            raise InvalidMessage("request field 'vacuumPages' must be an int >= 0")
        by_shard: dict[int, list[list[str]]] = {}
        for item in items:
            if not (
                isinstance(item, list | tuple)
                and len(item) == 2
                and is_id(item[0])
                and isinstance(item[1], str)
                and is_mailbox_name(item[1])
            ):
                raise InvalidMessage(f"compact_remove item {item!r:.80} is not [id, endpoint]")
            by_shard.setdefault(shard_of(item[1], self.shards), []).append(list(item))
        checkpoint = bool(req.get("checkpoint", False))
        shards = list(range(self.shards)) if checkpoint else sorted(by_shard)
        if not shards:
            return {"removed": 0, "files": 0, "bytes": 0, "skipped": 0}

        def merge(job: Pending) -> dict[str, Any]:
            total: dict[str, Any] = {"removed": 0, "files": 0, "bytes": 0, "skipped": 0}
            for result in job.results:
                for key in ("removed", "files", "bytes", "skipped"):
                    total[key] += result[key]
                if "index" in result:
                    total.setdefault("indexes", []).append(result["index"])
            return total

        job = self._new_job(session, req, len(shards), merge)
        token = self._register(job)
        for shard in shards:
            job.shards.add(shard)
            frames = proto.op(
                token,
                "compact_remove",
                items=by_shard.get(shard, []),
                checkpoint=checkpoint,
                vacuumPages=vacuum_pages,
            )
            if not self._send_or_park(shard, token, frames):
                self._forget(token)
                raise Unavailable(f"writer for shard {shard} is not taking work")
        return _DEFERRED

    def _op_pending(self, session: Session, req: wire.Request) -> Any:
        info = self._endpoint(req)
        self._check_receives(session, info.subject)
        records = self._query(state=State.CLAIMED, endpoint=info.hash, limit=_limit(req))
        return {"items": [self._with_file(r) for r in records]}

    @staticmethod
    def _may_receive(session: Session, pattern: str, *, operator_too: bool = True) -> bool:
        """Whether this connection may receive the messages of the endpoints ``pattern``
        can match (auth.json ``consumes``); operators may read (not subscribe to) all."""
        who = session.who
        return who is not None and ((operator_too and who.admin) or who.may_consume(pattern))

    def _check_receives(self, session: Session, pattern: str, *, operator_too: bool = True) -> None:
        if self._may_receive(session, pattern, operator_too=operator_too):
            return
        who = session.who
        allowed = ", ".join(who.receives) if who is not None else ""
        raise NotAuthorized(
            f"{who.name if who else session.user!r} may not receive messages of {pattern!r};"
            f" it may receive {allowed or 'nothing'} (auth.json 'consumes')"
        )

    def _op_complete(self, session: Session, req: wire.Request) -> Any:
        return self._finish_message(session, req, "done", operator=True)

    def _op_fail(self, session: Session, req: wire.Request) -> Any:
        reason = req.get("reason") or "failed by operator"
        return self._finish_message(
            session, req, "fail", operator=True, reason=str(reason)[:1000], code="operator"
        )

    def _op_requeue(self, session: Session, req: wire.Request) -> Any:
        """Return a pending message to new/, to be handed out again (never automatic)."""
        return self._finish_message(session, req, "requeue", operator=True)

    def _op_add_rule(self, session: Session, req: wire.Request) -> Any:
        rule = self.control.add_rule(AccessRule.from_wire(req.get("rule")))
        self._reload_rules()
        return rule.to_wire()

    def _op_remove_rule(self, session: Session, req: wire.Request) -> Any:
        removed = self.control.remove_rule(_str(req, "from"), _str(req, "to"))
        self._reload_rules()
        return {"removed": removed}

    def _reload_rules(self) -> None:
        if RULES_FILE not in self.file_errors:  # a broken rules file keeps denying
            self.rules = RuleSet(self.control.list_rules())

    def _op_list_rules(self, session: Session, req: wire.Request) -> Any:
        return {"rules": [r.to_wire() for r in self.rules.rules]}

    def _op_get_config(self, session: Session, req: wire.Request) -> Any:
        return self.config

    def _op_set_config(self, session: Session, req: wire.Request) -> Any:
        partial = req.get("config")
        if not isinstance(partial, dict):
            raise InvalidMessage("request field 'config' must be a map")
        self._apply_config(self.control.set_config(partial))
        return self.config

    def _op_status(self, session: Session, req: wire.Request) -> Any:
        return {
            "router": {
                "pid": os.getpid(),
                "startedAt": self.started_at,
                "address": self.address,
                "signals": self.signals_address,
            },
            "shards": self.shards,
            "writers": [self._writer_status(s) for s in range(self.shards)],
            "clients": len(self.consumers.sessions),
            "subscriptions": len(self.consumers.subs),
            "pendingRequests": len(self.pending),
            "endpoints": [
                self._endpoint_status(i)
                for i in sorted(self.endpoints.values(), key=lambda e: e.subject)
            ],
            "unroutable": self._count(State.FAILED, UNROUTABLE),
            "fileErrors": dict(self.file_errors),
        }

    def _writer_status(self, shard: int) -> dict[str, Any]:
        writer = self.links.up.get(shard)
        return {
            "shard": shard,
            "pid": writer.pid if writer else None,
            "state": self.links.state(shard),
            "since": writer.since if writer else None,
        }

    def _op_trace(self, session: Session, req: wire.Request) -> Any:
        message_id = check_id(req.get("id"))
        copies = []
        with self._shard_indexes() as indexes:
            for index in indexes:
                copies.extend(index.get(message_id))
        # The copies of what it sent, or may receive (a failed copy's reason is a
        # handler's error text, which may quote the message).
        who = session.who
        shown = [
            r
            for r in copies
            if self._may_receive(session, r.subject) or (who and who.may_send_as(r.sender))
        ]
        return {
            "id": message_id,
            "copies": [self._record_wire(r) for r in sorted(shown, key=lambda r: r.endpoint)],
        }

    def _op_rebuild_index(self, session: Session, req: wire.Request) -> Any:
        return self._writer_op(
            session,
            req,
            list(range(self.shards)),
            "rebuild",
            lambda job: {"messages": sum(r["messages"] for r in job.results)},
        )

    _ops: dict[str, Callable[[Router, Session, wire.Request], Any]] = {}

    # ------------------------------------------------------------------ queries

    @contextlib.contextmanager
    def _shard_indexes(self, endpoint: str | None = None) -> Iterator[list[MessageIndex]]:
        """The shards' indexes, opened read-only for one query (their writers own them).

        Not kept open: a reader that stays would stop a writer's checkpoint at shutdown
        from truncating its WAL. Opening costs ~0.1 ms; queries are operator requests.
        """
        shards = [shard_of(endpoint, self.shards)] if endpoint else range(self.shards)
        indexes = []
        for path in map(self.home.index_db, shards):
            if not path.exists():
                continue
            try:
                index = MessageIndex(path, readonly=True)
            except StorageError as exc:  # damaged: its writer rebuilds it at start
                log.warning("index %s unreadable, skipped: %s", path, exc)
                continue
            if index.schema_version == 0:  # its writer has not made the tables yet
                index.close()
                continue
            indexes.append(index)
        try:
            yield indexes
        finally:
            for index in indexes:
                index.close()

    def _count(self, state: State, endpoint: str) -> int:
        with self._shard_indexes(endpoint) as indexes:
            return sum(i.count(endpoint=endpoint, state=state) for i in indexes)

    def _query(self, *, state: State, endpoint: str | None, limit: int) -> list[MessageRecord]:
        found: list[MessageRecord] = []
        with self._shard_indexes(endpoint) as indexes:
            for index in indexes:
                records, _ = index.query(state=state.value, endpoint=endpoint, limit=limit)
                found.extend(records)
        found.sort(key=lambda r: (r.id, r.endpoint))
        return found[:limit]

    def _record_wire(self, record: MessageRecord) -> dict[str, Any]:
        info = self.by_hash.get(record.endpoint)
        return {
            "id": record.id,
            "endpoint": record.endpoint,
            "subject": record.subject,
            "endpointSubject": info.subject if info else None,
            "from": record.sender,
            "state": record.state.value,
            "createdAt": record.created_at,
            "storedAt": record.stored_at,
            "claimedAt": record.claimed_at,
            "finishedAt": record.finished_at,
            "reason": record.reason,
            "code": record.reason_code,
            "size": record.size,
        }

    def _with_file(self, record: MessageRecord) -> dict[str, Any]:
        wire_record = self._record_wire(record)
        mailbox = Mailbox(self.home.mailbox(record.endpoint), record.endpoint)
        with contextlib.suppress(RelayError, OSError, ValueError):
            _, data = mailbox.read(record.id)
            wire_record["envelope"] = json.loads(data)
        return wire_record

    def _endpoint_arg(self, req: wire.Request) -> str | None:
        endpoint = req.get("endpoint")
        if endpoint is None:
            return None
        if endpoint == UNROUTABLE or endpoint in self.by_hash:
            return endpoint
        info = self.endpoints.get(endpoint) if isinstance(endpoint, str) else None
        if info is None:
            raise EndpointNotFound(f"no endpoint {endpoint!r:.80} (give a subject or a hash)")
        return info.hash

    def _endpoint(self, req: wire.Request) -> EndpointInfo:
        subject = validate(_str(req, "subject"))
        info = self.endpoints.get(subject)
        if info is None:
            raise EndpointNotFound(f"endpoint {subject} is not registered")
        return info

    # ------------------------------------------------------------------ writer side

    def _on_writer(self, frames: list[bytes]) -> None:
        try:
            kind, header, data = proto.decode(frames)
        except Exception:
            log.exception("undecodable frames from a writer dropped")
            return
        if kind == proto.STORED:
            for row in header:
                self._on_stored(*row)
        elif kind == proto.CLAIMED:
            self._on_claimed(*header, data)
        elif kind == proto.INGESTED:
            message_id, endpoint = header
            self._on_new_message(message_id, endpoint, data)
        elif kind == proto.REPLY:
            self._on_reply(*header)

    def _writer_gone(self, shard: int) -> None:
        """A writer went away: what it had not confirmed will never be confirmed.

        Publishes and operations it held are answered `unavailable` (a copy's outcome is
        unknown: it may be durable, so never "delivered"). Claims it held may or may not
        have happened: their credit comes back now, and each message is put back
        (cur/ -> new/; refused harmlessly if it never left new/) by the next writer,
        before any claim of its (_writer_up), so none stays claimed for nobody. The
        put-backs it held are sent again then too.
        """
        log.warning("writer for shard %d disconnected", shard)
        error = f"writer for shard {shard} stopped before confirming"
        for token, job in list(self.pending.items()):
            if shard not in job.shards:
                continue
            if not job.copies:  # an operation: it fails as a whole
                self._forget(token)
                self._reply_error(job.client, job.rid, Unavailable(error))
                continue
            for endpoint, copy in job.copies.items():
                if endpoint not in job.outcomes and shard_of(endpoint, self.shards) == shard:
                    # Its outcome is unknown (it may be durable): an error, never "delivered".
                    job.outcomes[endpoint] = ("unavailable", error)
                    self.reliability.never_tried(copy)
                    self._progress(token, job)
        self.ledger.writer_gone(shard)

    def _writer_up(self, shard: int) -> None:
        """A writer said hello: what waits in its mailboxes' new/ (the truth) becomes
        their queues, read before anything is sent to it; then the work kept for it goes
        out, put-backs before any claim (a put-back after a claim of the same message
        would take it back from its consumer)."""
        writer = self.links.up[shard]
        log.info("writer for shard %d/%d is up (pid %d)", shard, self.shards, writer.pid)
        self.ledger.writer_up(shard)  # reads new/ before anything is sent
        for token, frames in self._parked_ops.pop(shard, []):
            if token in self.pending and not self.links.send(shard, frames):
                log.error("shard %d: work kept for its writer could not be sent", shard)
        copies = [(h, d) for h, d in self._parked_copies.pop(shard, []) if self._awaited(h)]
        for header, _ in copies:
            self.ledger.storing(header.id, header.endpoint)
        if copies:
            self._outgoing.setdefault(shard, []).extend(copies)
        if all(self.links.is_up(s) for s in range(self.shards)) and not self._ready:
            self._ready = True
            log.info("ready: %d writers up", self.shards)

    def _waiting_in(self, endpoint: str) -> list[str]:
        try:
            return Mailbox(self.home.mailbox(endpoint), endpoint).list_new()
        except OSError:
            return []

    def _on_stored(
        self,
        token: int,
        message_id: str,
        endpoint: str,
        stored_at: int | None,
        code: str | None,
        message: str | None,
        target: str,
    ) -> None:
        job = self.pending.get(token)
        copy = job.copies.get(endpoint) if job is not None else None
        # Answered late: the publisher had its answer already (deadline passed, or the
        # writer's disconnect was seen first), but the copy may be durable all the same.
        late = copy is None or endpoint in job.outcomes
        if stored_at is None:
            self.ledger.store_failed(message_id, endpoint)
        elif late:
            self.ledger.stored_late(message_id, endpoint, claimed=target == proto.TARGET_CUR)
        elif target == proto.TARGET_CUR:
            sub_id = self.ledger.copy_settled(message_id, endpoint)
            self._show_observers(message_id, endpoint, copy.data)
            self._hand_out(sub_id, message_id, endpoint, copy.data)
        elif copy.dead is None:
            self.ledger.copy_settled(message_id, endpoint)
            self._on_new_message(message_id, endpoint, copy.data)
        if late:
            return
        self.reliability.outcome(copy, success=stored_at is not None, now=now_ms())
        job.outcomes[endpoint] = None if stored_at is not None else (code, message)
        self._progress(token, job)

    def _on_new_message(self, message_id: str, endpoint: str, data: bytes | None) -> None:
        """A message is durable in new/: show it to observers, hand it to a consumer."""
        if data is not None:
            self._show_observers(message_id, endpoint, data)
        self.ledger.stored_new(message_id, endpoint)

    def _show_observers(self, message_id: str, endpoint: str, data: bytes) -> None:
        info = self.by_hash.get(endpoint)
        if info is not None:
            for sub in self.consumers.observers(info.subject):
                self._push(sub.client, wire.encode_push(sub.id, message_id, endpoint, data))

    def _on_claimed(
        self,
        sub_id: int,
        message_id: str,
        endpoint: str,
        code: str | None,
        message: str | None,
        data: bytes | None,
    ) -> None:
        if code is not None and code != "already_claimed":
            log.warning("claim of %s/%s failed: %s %s", endpoint, message_id, code, message)
        if self.ledger.claimed(sub_id, message_id, endpoint, ok=code is None):
            self._hand_out(sub_id, message_id, endpoint, data or b"")

    def _hand_out(self, sub_id: int | None, message_id: str, endpoint: str, data: bytes) -> None:
        """Push a message claimed for a subscription to its client."""
        sub = self.consumers.subs.get(sub_id) if sub_id is not None else None
        if sub is None:  # the subscriber left while the claim was in flight
            self.ledger.put_back(message_id, endpoint)
            return
        if not self._push(sub.client, wire.encode_push(sub.id, message_id, endpoint, data)):
            # Its client is gone (the push found no peer): the message was never handed
            # out, so it goes back to new/ rather than stay claimed by nobody.
            self.ledger.put_back(message_id, endpoint)
            return
        self.consumers.handed_out(sub, message_id, endpoint, _sender_of(data))

    def _send_ledger_outbox(self) -> None:
        """Send the ledger's claims and put-backs, in their order; what a writer does not
        take goes back to the ledger."""
        unsent = []
        for command in self.ledger.take_outbox():
            if isinstance(command, Claim):
                frames = proto.claim(command.sub, command.id, command.endpoint)
            else:
                frames = proto.requeue(command.token, command.id, command.endpoint)
            if not self.links.send(command.shard, frames):
                unsent.append(command)
        if unsent:
            self.ledger.unsent(unsent)

    def _on_reply(self, token: int, ok: bool, result: Any) -> None:
        put_back = self.ledger.put_back_done(token, ok=ok)
        if put_back is not None:
            if not ok and result.get("code") != "invalid_state":  # never left new/: fine
                log.warning("%s/%s not put back: %s", put_back[1], put_back[0], result)
            return
        if token == 0:  # an operation of the router's own: watch
            if not ok:
                log.warning("writer operation failed: %s", result)
            return
        job = self.pending.get(token)
        if job is None:
            return
        if ok:
            job.results.append(result)
        else:
            job.error = from_code(result.get("code", "internal"), result.get("message", ""))
        self._progress(token, job)

    def _progress(self, token: int, job: Pending) -> None:
        job.remaining -= 1
        if job.remaining > 0:
            return
        self._forget(token)
        try:
            if job.error is not None:
                raise job.error
            result = job.on_done(job)
        except RelayError as exc:
            self._reply_error(job.client, job.rid, exc)
            return
        self._reply(job.client, wire.ok_body(job.rid, result))


_DEFERRED = object()  # the reply is sent later, when the writers have answered

Router._ops = {name[4:]: func for name, func in vars(Router).items() if name.startswith("_op_")}


def _sender_of(data: bytes) -> str:
    try:
        sender = json.loads(data).get("from")
    except (ValueError, AttributeError):
        return ""
    return sender if isinstance(sender, str) else ""


def _str(req: wire.Request, name: str) -> str:
    value = req.get(name)
    if not isinstance(value, str):
        raise InvalidMessage(f"request field {name!r} must be a string, got {value!r:.40}")
    return value


def _int(req: wire.Request, name: str) -> int:
    value = req.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidMessage(f"request field {name!r} must be an int, got {value!r:.40}")
    return value


def _limit(req: wire.Request, default: int = 100, maximum: int = 1000) -> int:
    limit = req.get("limit", default)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= maximum:
        raise InvalidMessage(f"request field 'limit' must be an int in 1..{maximum}")
    return limit


def main(
    home: Home, shards: int, *, address: str | None = None, signals_address: str | None = None
) -> int:
    # Each client connection is a file descriptor: allow as many as the system lets us.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    router = Router(home, shards, address=address, signals_address=signals_address)
    return run_until_stopped(router, home.pid_file("router"))
