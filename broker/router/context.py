"""What an operation sees: the router's units, joined once by the loop, and the shapes an
operation answers in. Nothing here touches a socket.

An operation returns its result (answered at once), `DEFERRED` (the answer comes when
the writers have answered: a publish, whose copies it queued with the writer jobs), or
a `WriterWork` (one operation for several writers; the loop sends it and answers when
all of them have).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.control import ControlPlane
from broker.rejections import RejectionLog
from broker.reliability import Reliability
from broker.router.consumers import Consumers, Session
from broker.router.delivery import Ledger
from broker.router.directory import Directory
from broker.router.federation import Federation
from broker.router.indexes import Indexes
from broker.router.jobs import Job, WriterJobs
from broker.router.replies import Replies
from broker.router.settings import Settings
from broker.router.signal_out import SignalOutbox
from sdk.errors import NotAuthorized, SenderNotAllowed
from sdk.paths import Home
from sdk.subjects import matches, validate
from sdk.types import EndpointInfo
from workers import clock


def now_ms() -> int:
    """The router's clock: the one file mtimes come from (workers/clock.py), so a
    message's createdAt is never after its storedAt."""
    return clock.now_ms()


DEFERRED = object()  # the reply is sent later, when the writers have answered


# Not frozen, and its own __init__, compiled: one per ack (sdk/wire.py `Request`).
@dataclass(init=False)
class WriterWork:
    """One operation (``name``) for the writers of some shards, with its arguments per
    shard; ``on_done`` builds the reply from their answers (``job.results``)."""

    name: str
    args_by_shard: dict[int, dict[str, Any]]
    on_done: Callable[[Job], Any]
    # Applied to each writer's answer (its result) as it comes, even after the request
    # was answered unavailable at its deadline: what a writer did is done, and the
    # router's state must follow (the ledger's queue of a requeued dead letter).
    on_reply: Callable[[Any], None] | None

    def __init__(
        self,
        name: str,
        args_by_shard: dict[int, dict[str, Any]],
        on_done: Callable[[Job], Any],
        on_reply: Callable[[Any], None] | None = None,
    ) -> None:
        self.name = name
        self.args_by_shard = args_by_shard
        self.on_done = on_done
        self.on_reply = on_reply


class WriterStates(Protocol):
    """Which writers are up (broker/router/writer_links.py), as operations may ask."""

    def is_up(self, shard: int) -> bool: ...

    def state(self, shard: int) -> str: ...

    def status(self) -> list[dict[str, Any]]: ...


@dataclass
class Context:
    home: Home
    shards: int
    control: ControlPlane
    settings: Settings
    directory: Directory
    consumers: Consumers
    ledger: Ledger
    reliability: Reliability
    jobs: WriterJobs
    replies: Replies
    signals: SignalOutbox
    rejections: RejectionLog
    writers: WriterStates
    indexes: Indexes
    about: dict[str, Any] = field(default_factory=dict)  # the router: pid, addresses, start
    federation: Federation = field(default_factory=Federation)  # other nodes, the bridge

    @property
    def config(self) -> dict[str, Any]:
        return self.settings.config

    def configure(self) -> None:
        """The units take the configuration as it is now (at start, and each change)."""
        config = self.config
        self.reliability.configure(config)
        self.ledger.max_deliveries = config["delivery"]["maxDeliveries"]
        self.consumers.session_timeout_ms = config["delivery"]["sessionTimeoutMs"]

    def endpoint_wire(self, info: EndpointInfo) -> dict[str, Any]:
        """An endpoint as clients see it: ``shared`` when registered shared or matched
        by the config's ``federation.shared`` patterns (what the bridge advertises)."""
        patterns = self.config["federation"]["shared"]
        shared = info.shared or any(matches(info.subject, p) for p in patterns)
        return {**info.to_wire(), "shared": shared}


# ---------------------------------------------------------------------- rights


def checked_sender(session: Session, sender: str) -> str:
    """``from`` checked against the connection's credentials (auth.json)."""
    validate(sender)
    who = session.who
    if who is None or not who.may_send_as(sender):
        allowed = ", ".join(who.senders) if who else "nothing"
        name = who.name if who else session.user
        raise SenderNotAllowed(f"{name} may not send as {sender}; it may use {allowed}")
    return sender


def checked_reply_to(session: Session, reply_to: str) -> str:
    """``replyTo`` checked like ``from``, except that the reply inbox of a sender the
    connection may use (``_INBOX.<sender>.<nonce>``, `request()`'s) is allowed too: a
    restricted identity may ask and be answered, never point replies elsewhere."""
    validate(reply_to)
    who = session.who
    if who is not None and who.owns_inbox(reply_to):
        return reply_to
    return checked_sender(session, reply_to)


def may_receive(session: Session, pattern: str, *, operator_too: bool = True) -> bool:
    """Whether this connection may receive the messages of the endpoints ``pattern``
    can match (auth.json ``consumes``); operators may read (not subscribe to) all."""
    who = session.who
    return who is not None and ((operator_too and who.admin) or who.may_consume(pattern))


def check_receives(session: Session, pattern: str, *, operator_too: bool = True) -> None:
    if may_receive(session, pattern, operator_too=operator_too):
        return
    who = session.who
    allowed = ", ".join(who.receives) if who is not None else ""
    raise NotAuthorized(
        f"{who.name if who else session.user!r} may not receive messages of {pattern!r};"
        f" it may receive {allowed or 'nothing'} (auth.json 'consumes')"
    )
