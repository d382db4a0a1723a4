"""The router's loop: its sockets, its poll, and nothing else that decides.

Sockets (docs/architecture.md has the map): a ROUTER for clients (requests, replies,
pushed messages), an XPUB for signals, one ROUTER per shard writer
(broker/router/writer_links.py), one PULL for the writers' results. One thread, one
poll loop; every wait has a deadline. The poll holds the busy sockets (clients, signals,
writers' results), the watched files' descriptor, and one descriptor for the sockets
readable only at a hello, a handshake or a disconnect (broker/router/quiet_sockets.py).

Each pass reads what arrived and hands it to the units, which say what to do as data:
an operation (broker/router/operations.py) answers or queues work for the writers
(broker/router/jobs.py); a writer's report (broker/router/writer_events.py) answers
jobs and names messages to push; the delivery ledger (broker/router/delivery.py) names
claims and put-backs. At the end of the pass the loop sends all of it: claims and
copies to the writers, replies and pushes to the clients, signals to the subscribers.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import resource
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import zmq

from broker.auth import AuthPolicy
from broker.control import ControlPlane
from broker.rejections import RejectionLog
from broker.reliability import Reliability
from broker.router import dispatch
from broker.router import remote_parts as remote
from broker.router import writer_events as events
from broker.router.client_links import ClientLinks
from broker.router.consumers import FETCH, Consumers, Session
from broker.router.context import DEFERRED, Context, WriterWork, now_ms
from broker.router.delivery import Claim, DeadLetter, Ledger
from broker.router.directory import Directory
from broker.router.indexes import Indexes
from broker.router.jobs import WriterJobs
from broker.router.ops_admin import add_endpoint
from broker.router.ops_consume import answer_fetches
from broker.router.quiet_sockets import QuietSockets
from broker.router.replies import Replies
from broker.router.settings import Settings
from broker.router.signal_out import SignalOutbox
from broker.router.writer_links import WriterLinks
from broker.watch import AUTH_FILE, CONFIG_FILE, RULES_FILE, FileWatch
from broker.zap import ZapHandler
from sdk import wire
from sdk.errors import Unavailable
from sdk.paths import Home
from sdk.sockets import POLLIN, PollItem, poll_item, read_queued, ready_in, waiting
from workers import protocol as proto
from workers.maildir import Mailbox
from workers.process import run_until_stopped

log = logging.getLogger("relay.router")

POLL_MS = 250


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
        self.zmq = ctx or zmq.Context.instance()
        self.stopping = False
        self._ready = False  # every writer has said hello once
        self._bound: list[str] = []

        control = ControlPlane(home.control_db, home.mailboxes)
        settings = Settings(self.home.root, control, self.home.owner_uid)
        consumers = Consumers()
        jobs = WriterJobs()
        ledger = Ledger(consumers, shards, self._waiting_in, jobs.tokens)
        self.links = WriterLinks(self.zmq, shards)
        self.ctx = Context(
            home=self.home,
            shards=shards,
            control=control,
            settings=settings,
            directory=Directory(),
            consumers=consumers,
            ledger=ledger,
            reliability=Reliability(settings.config),
            jobs=jobs,
            replies=Replies(),
            signals=SignalOutbox(),
            rejections=RejectionLog(self.home.root / "rejections.db"),  # for ops metrics
            writers=self.links,
            indexes=Indexes(self.home, shards),
            about={
                "startedAt": now_ms(),
                "address": self.address,
                "signals": self.signals_address,
            },
        )
        self.watch = FileWatch(self.home.root)
        self._next_token_expiry: int | None = None  # unix ms; set as auth.json is applied

        # Before any client socket binds: libzmq asks it about every handshake.
        self.zap = ZapHandler(self.zmq, lambda: self.ctx.settings.auth)
        self.public = ClientLinks(self.zmq, self.home, self.address, self.signals_address)
        self.from_writers = self.zmq.socket(zmq.PULL)
        self.from_writers.setsockopt(zmq.LINGER, 0)
        # Readable at a hello, a handshake or a disconnect only: one descriptor in the
        # poll for all of them.
        self.quiet = QuietSockets(
            [*self.links.sockets, *self.links.monitors, self.zap.socket, self.public.monitor]
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        old = os.umask(0o077)  # ipc socket files: owner only
        try:
            self._bound += self.public.bind()
            self.from_writers.bind(self.home.results_address)
            self._bound.append(self.home.results_address)
            self._bound += self.links.bind(self.home.shard_address)
        finally:
            os.umask(old)
        for info in self.ctx.control.list_endpoints():
            add_endpoint(self.ctx, info)
        self._load_files({CONFIG_FILE, RULES_FILE}, only_if_changed=True)
        self.ctx.configure()
        self._load_auth_file()
        self._seed_rate_limiter()
        # What start-up built (control plane, tries, settings) lives as long as the
        # router: frozen out of the collector's sight, the older generations' collections
        # that a publish's young objects trigger no longer walk it (about 3.3 -> 1.3 µs
        # of collector per publish at 100 in flight, docs/performance.md, "The router's
        # and writers' CPU per publish").
        gc.freeze()
        log.info(
            "router on %s, %d shards, %d endpoints",
            self.address,
            self.shards,
            len(self.ctx.directory),
        )

    def serve(self) -> None:
        # The busy sockets, and one descriptor for the rest (broker/router/quiet_sockets.py).
        clients, signals = self.public.clients, self.public.signals
        quiet, watched = self.quiet.fileno(), self.watch.fileno()
        waitables = (clients, signals, self.from_writers, quiet, watched)
        polled = [(waitable, POLLIN) for waitable in waitables]
        signals_item, writers_item = poll_item(signals), poll_item(self.from_writers)
        next_sweep = 0
        while not self.stopping:
            events_ = ready_in(polled, POLL_MS)
            now = now_ms()
            # At each sweep too: a command the descriptor did not report (quiet_sockets.py)
            ready = self.quiet.ready() if quiet in events_ or now >= next_sweep else set()
            if watched in events_:
                self._files_changed(self.watch.changed())
            if self.zap.socket in ready:
                self.zap.handle()
            if signals in events_:
                self._drain(signals_item, lambda f: self.ctx.signals.subscription(f[0]))
            self._writer_links(ready)
            if self.from_writers in events_:
                self._drain(writers_item, self._on_writer)
            if clients in events_:
                self._drain_clients()
            if self.public.monitor in ready:
                self._clients_gone()
            self._end_of_pass()
            now = now_ms()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + POLL_MS
            self.ctx.indexes.release()  # the pass's index readers (broker/router/indexes.py)

    def _end_of_pass(self) -> None:
        """Send what the pass decided, claims and put-backs before the copies (a
        put-back after a claim of the same message would take it back), replies before
        pushes to the same client."""
        now = now_ms()
        self.ctx.ledger.feed_refilled()
        remote.answer_held(self.ctx, now)
        self._send_ledger_outbox()
        answer_fetches(self.ctx, now)
        self._send_copies()
        self._send_replies()
        self.ctx.signals.flush(self.public.signals)

    def _sweep(self, now: int) -> None:
        events.sweep(self.ctx, now)
        remote.answer_held(self.ctx, now)
        self.ctx.rejections.flush_due(now)
        if self._next_token_expiry is not None and now >= self._next_token_expiry:
            self._end_beyond_rights(self.ctx.settings.auth, now, "a token expired")
        consumers = self.ctx.consumers
        for identity in consumers.expired(now):
            log.info(
                "client %s silent for %d ms: session ended, what it held is handed out again",
                identity.hex(),
                consumers.session_timeout_ms,
            )
            consumers.end_session(identity)
        if consumers.overdue(now) or consumers.fetches:
            self._end_of_pass()  # hand out again what came back; answer the fetches
        self._send_replies()

    @staticmethod
    def _drain(item: PollItem, handle: Callable[[list[bytes]], None], limit: int = 1000) -> None:
        """Handle what waits on the socket of ``item`` (the poll said something does),
        up to ``limit`` messages (sdk/sockets.py `read_queued`)."""
        for frames in read_queued(item, limit):
            handle(frames)

    def close(self) -> None:
        self.ctx.rejections.close()
        self.ctx.control.close()
        self.watch.close()
        self.quiet.close()
        self.links.close()
        self.public.close()
        self.from_writers.close(0)
        self.zap.close()
        self.zmq.term()
        for address in self._bound:  # libzmq leaves ipc socket files behind
            if address.startswith("ipc://"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address[len("ipc://") :])

    # ------------------------------------------------------------------ clients

    def _drain_clients(self, limit: int = 2000) -> None:
        """At most about ``limit`` requests per pass (a batch counts as many), so the
        writers' results and the sweep get their turn."""
        handled = 0
        for frames, user in self.public.requests(limit):
            handled += dispatch.client_frame(self.ctx, frames, user, self._send_work)
            if handled >= limit:
                return

    def _clients_gone(self) -> None:
        """Connections closed: their clients are gone, what they held goes to others.
        Every event waiting is read (broker/router/quiet_sockets.py)."""
        for identities in _read_dry(self.public.monitor, self.public.gone):
            for identity in identities:
                if self.ctx.consumers.end_session(identity) is not None:
                    log.info("client %s disconnected: session ended", identity.hex())

    def _send_work(self, session: Session, rid: int, work: WriterWork) -> Any:
        """Send one operation to several writers (or keep it for those not up yet);
        the reply goes when all have answered."""
        jobs = self.ctx.jobs
        token, job = jobs.open(
            session.identity, rid, len(work.args_by_shard), work.on_done, now_ms()
        )
        job.on_reply = work.on_reply
        sent: set[int] = set()
        for shard, args in work.args_by_shard.items():
            job.shards.add(shard)
            frames = proto.op(token, work.name, **args)
            if self.links.send(shard, frames):
                sent.add(shard)
                continue
            if self.links.is_up(shard):  # up, and not taking work: its queue is full
                jobs.abandon(token, job, sent)
                raise Unavailable(f"writer for shard {shard} is not taking work")
            jobs.park_op(shard, token, frames)
        return DEFERRED

    # ------------------------------------------------------------------ sending

    def _send_replies(self) -> None:
        sessions = self.ctx.consumers.sessions
        for identity in self.ctx.replies.clients():
            self._send_replies_to(identity, sessions.get(identity))

    def _send_replies_to(self, identity: bytes, session: Session | None) -> bool:
        batches = session is not None and session.batches
        for frame in self.ctx.replies.take(identity, batches=batches):
            if not self._send(identity, [wire.MAGIC, frame]):
                return False
        return True

    def _push(self, identity: bytes, frames: list[bytes]) -> bool:
        """A message for a subscription: after the replies queued before it (a subscribe
        reply must reach the client before the backlog it announces)."""
        session = self.ctx.consumers.sessions.get(identity)
        return self._send_replies_to(identity, session) and self._send(identity, frames, copy=False)

    def _send(self, identity: bytes, frames: list[bytes], *, copy: bool = True) -> bool:
        sent = self.public.send(identity, frames, copy=copy)
        if sent is None:  # gone: what it held is handed out again
            self.ctx.consumers.end_session(identity)
        return bool(sent)

    def _send_pushes(self, pushes: list[events.Push]) -> None:
        for push in pushes:
            if isinstance(push, events.HandOut):
                self._hand_out(push)
            else:
                self._show(push)

    def _show(self, show: events.Show) -> None:
        if not self.ctx.consumers.observing:  # the common case: nobody watches
            return
        subject = self.ctx.directory.subject_of(show.endpoint)
        if subject is not None:
            for sub in self.ctx.consumers.observers(subject):
                self._push(sub.client, wire.encode_push(sub.id, show.id, show.endpoint, show.data))

    def _hand_out(self, hand_out: events.HandOut) -> None:
        """Push a message claimed for a subscription to its client (a fetch keeps it for
        its answer)."""
        sub_id, message_id, endpoint, data, deliveries, sender = hand_out
        consumers = self.ctx.consumers
        sub = consumers.subs.get(sub_id) if sub_id is not None else None
        if sub is not None and sub.mode == FETCH:
            sub.fetched.append((message_id, endpoint, deliveries, data))
        elif sub is None or not self._push(
            sub.client, wire.encode_push(sub.id, message_id, endpoint, data, deliveries)
        ):
            # No subscriber (it left while the claim was in flight), or its client is
            # gone or not reading: never handed out, so back in line (its count as it
            # was) rather than claimed by nobody.
            consumers.give_back(sub_id)
            self.ctx.ledger.hand_back(message_id, endpoint, deliveries - 1)
            return
        if sender is None:  # the file says (a claim from new/: parsing it costs ~10 µs)
            sender = _sender_of(data)
        consumers.handed_out(sub, message_id, endpoint, sender, deliveries, now_ms())

    def _send_ledger_outbox(self) -> None:
        """Send the ledger's claims and put-backs, in their order; what a writer does not
        take goes back to the ledger."""
        unsent = []
        for command in self.ctx.ledger.take_outbox():
            if isinstance(command, Claim):
                frames = proto.claim(command.sub, command.id, command.endpoint, command.deliveries)
            elif isinstance(command, DeadLetter):
                frames = proto.op(
                    command.token,
                    "fail",
                    id=command.id,
                    endpoint=command.endpoint,
                    reason=f"handed out {command.deliveries} times; its consumer died each time",
                    code="max_deliveries",
                    claimedOnly=True,
                    deliveries=command.deliveries,
                )
            else:
                frames = proto.requeue(command.token, command.id, command.endpoint)
            if not self.links.send(command.shard, frames):
                unsent.append(command)
        if unsent:
            self.ctx.ledger.unsent(unsent)

    def _send_copies(self) -> None:
        """The copies decided in this pass: one message per shard (protocol.deliver).

        A shard whose writer is not up (starting, restarting) keeps its copies until the
        writer's hello; one that is up and does not take them (its queue is full) fails
        them now."""
        jobs = self.ctx.jobs
        for shard, items in jobs.take_outgoing().items():
            if self.links.send(shard, proto.deliver(items)):
                continue
            if self.links.is_up(shard):
                events.copies_not_taken(self.ctx, shard, [header for header, _ in items])
                continue
            for message_id, endpoint in jobs.park_copies(shard, items):
                self.ctx.ledger.storing(message_id, endpoint)

    # ------------------------------------------------------------------ writers

    def _writer_links(self, ready: set[zmq.Socket]) -> None:
        """The shard sockets and their monitors that have something waiting: each read
        until nothing waits (broker/router/quiet_sockets.py)."""
        # Disconnects before hellos: a descriptor's close is reported before a new
        # connection can reuse it (broker/router/writer_links.py).
        for monitor in self.links.monitors:
            if monitor not in ready:
                continue
            for shard in _read_dry(monitor, functools.partial(self.links.gone, monitor)):
                if shard is not None:
                    events.writer_gone(self.ctx, shard)
        for shard in self.links.take_lost():
            events.writer_gone(self.ctx, shard)
        for shard, sock in enumerate(self.links.sockets):
            if sock not in ready:
                continue
            was_up = self.links.is_up(shard)
            if self.links.on_hello(shard, now_ms()) is None:
                continue
            if was_up:  # a writer that replaces one not seen going: it went
                events.writer_gone(self.ctx, shard)
            self._writer_up(shard)

    def _writer_up(self, shard: int) -> None:
        log.info(
            "writer for shard %d/%d is up (pid %d)", shard, self.shards, self.links.up[shard].pid
        )
        for frames in events.writer_up(self.ctx, shard):
            if not self.links.send(shard, frames):
                log.error("shard %d: work kept for its writer could not be sent", shard)
        if not self._ready and all(self.links.is_up(s) for s in range(self.shards)):
            self._ready = True
            log.info("ready: %d writers up", self.shards)

    def _on_writer(self, frames: list[bytes]) -> None:
        try:
            kind, header, data = proto.decode(frames)
        except Exception:
            log.exception("undecodable frames from a writer dropped")
            return
        if kind == proto.STORED:
            self._send_pushes(events.stored(self.ctx, header, now_ms()))
        elif kind == proto.CLAIMED:
            self._send_pushes(events.claimed(self.ctx, header, data))
        elif kind == proto.INGESTED:
            self._send_pushes(events.ingested(self.ctx, header, data))
        elif kind == proto.REPLY:
            events.replied(self.ctx, header)

    def _waiting_in(self, endpoint: str) -> list[str]:
        try:
            return Mailbox(self.home.mailbox(endpoint), endpoint).list_new()
        except OSError:
            return []

    # ------------------------------------------------------------------ files

    def _files_changed(self, changed: set[str]) -> None:
        self._load_files(changed)
        if AUTH_FILE in changed:
            self._load_auth_file()

    def _load_files(self, names: set[str], *, only_if_changed: bool = False) -> None:
        if self.ctx.settings.load(names, only_if_changed=only_if_changed):
            self.ctx.configure()

    def _load_auth_file(self) -> None:
        """auth.json applied: rights narrowed take effect at once, on every socket."""
        before = self.ctx.settings.auth.users
        policy = self.ctx.settings.load_auth()
        if policy is None:
            return
        if before - policy.users:
            self.public.rebind_signals()
        self._end_beyond_rights(policy, now_ms(), AUTH_FILE)
        self.public.admit_other_uids(len(policy.uids) > 1)

    def _end_beyond_rights(self, policy: AuthPolicy, now: int, why: str) -> None:
        """End the subscriptions the policy no longer allows now, and note when the next
        token expires: the sweep judges them again then (no file changes at expiry)."""
        for sub, name in self.ctx.consumers.end_beyond_rights(policy, now):
            log.warning(
                "subscription %d to %r ended: %s may no longer receive it (%s)",
                sub.id,
                sub.pattern,
                name,
                why,
            )
        self._next_token_expiry = policy.next_token_expiry(now)

    def _seed_rate_limiter(self) -> None:
        """The rate-limit window survives a restart: refill it from the indexes."""
        since = now_ms() - self.ctx.reliability.limiter.window_secs * 1000
        self.ctx.reliability.seed(self.ctx.indexes.recent_publishes(since))
        self.ctx.indexes.release()


T = TypeVar("T")


def _read_dry(sock: zmq.Socket, read: Callable[[], T]) -> Iterator[T]:
    """``read()`` (one event of ``sock``, where one waits), again while another waits: a
    quiet socket is read to the end each time it is named (broker/router/quiet_sockets.py)."""
    item = poll_item(sock)
    while True:
        yield read()
        if not waiting(item):
            return


def _sender_of(data: bytes) -> str:
    try:
        sender = json.loads(data).get("from")
    except (ValueError, AttributeError):
        return ""
    return sender if isinstance(sender, str) else ""


def main(
    home: Home, shards: int, *, address: str | None = None, signals_address: str | None = None
) -> int:
    # Each client connection is a file descriptor: allow as many as the system lets us.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return run_until_stopped(
        home,
        "router",
        shards,
        lambda: Router(home, shards, address=address, signals_address=signals_address),
    )
