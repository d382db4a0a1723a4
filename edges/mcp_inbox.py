"""What `relay_inbox` claims for an agent, held until it acks or nacks by id.

The SDK answers a consumed message when its handler returns (ack) or raises (nack); it
has no "claim now, answer in a later call". So a message is held by keeping its
handler open: each claim is a subscription with credit 1 whose handler records the
message and then waits for the agent's verdict. Credit 1 means the subscription takes
nothing more while it holds one, and it is unsubscribed as soon as the read is over,
so nothing is claimed that no read asked for (a message pushed after the read gave up
waiting is kept and returned by the next read). The cost is a parked thread per held
message, hence `MAX_HELD`.

When the server exits, what is held unanswered stays claimed: Relay's rule for any
consumer that goes away (listed by `relay pending`, requeued by an operator); Relay
never redelivers by itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from sdk import subjects
from sdk.client import Client
from sdk.errors import EndpointNotFound, InvalidState, LimitExceeded, MessageNotFound
from sdk.types import Budget, Envelope

MAX_HELD = 64  # messages read and not yet answered, per server (one parked thread each)
CLAIM_WAIT_S = 1.0  # how long a read waits for messages another consumer may take first
REMEMBERED = 256  # envelopes kept after their answer, so that a late relay_reply works


class AgentNack(Exception):
    """Raised in a held message's handler so that the SDK nacks it with the reason."""


@dataclass
class Held:
    envelope: Envelope
    verdict: Future = field(default_factory=Future)  # None: ack; a string: nack reason
    returned: bool = False  # handed to the agent by a read


class Inbox:
    """The messages this server claimed for its agent, by id."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._held: dict[str, Held] = {}
        self._seen: OrderedDict[str, Envelope] = OrderedDict()
        self._arrivals: dict[str, int] = {}  # messages held so far, by endpoint subject
        self._arrived = threading.Condition()  # notified at each arrival, and at close
        self._closed = False

    # ------------------------------------------------------------------ reading

    def read(
        self, endpoint: str, limit: int, wait_s: float = 0.0
    ) -> tuple[list[Envelope], list[str]]:
        """Claim up to ``limit`` messages waiting for ``endpoint``, or when none waits,
        wait up to ``wait_s`` for one; returns them (oldest first) and the ids of those
        read earlier and still not answered."""
        subjects.validate(endpoint)
        earlier = [h.envelope.id for h in self._held_of(endpoint) if h.returned]
        room = MAX_HELD - len(self._held)
        if room <= 0:
            raise LimitExceeded(
                f"{len(self._held)} messages read and not answered (the limit is {MAX_HELD}): "
                "relay_ack or relay_nack some first"
            )
        unreturned = len([h for h in self._held_of(endpoint) if not h.returned])
        wanted = min(limit - unreturned, room, self._waiting(endpoint))
        if wanted > 0:
            self._claim(endpoint, wanted, CLAIM_WAIT_S)
        elif unreturned == 0 and wait_s > 0:
            self._claim(endpoint, 1, wait_s)
        with self._arrived:
            taken = [h for h in self._held_of(endpoint) if not h.returned][:limit]
            for held in taken:
                held.returned = True
        return [h.envelope for h in taken], earlier

    def _waiting(self, endpoint: str) -> int:
        """Messages in the endpoint's new/ (an `endpoint_not_found` when unregistered)."""
        for info in self._client.status()["endpoints"]:
            if info["subject"] == endpoint:
                return int(info["depth"])
        raise EndpointNotFound(f"no endpoint {endpoint} is registered")

    def _claim(self, endpoint: str, count: int, patience: float) -> None:
        """Open ``count`` credit-1 subscriptions, wait until each holds a message or
        ``patience`` seconds passed (another consumer took some), then end them all."""
        with self._arrived:
            before = self._arrivals.get(endpoint, 0)
        stops: list[Callable[[], None]] = []
        try:
            for _ in range(count):
                stops.append(self._client.subscribe(endpoint, self._hold, credit=1))
            with self._arrived:
                self._arrived.wait_for(
                    lambda: self._closed or self._arrivals.get(endpoint, 0) - before >= count,
                    timeout=patience,
                )
        finally:
            for stop in stops:
                stop()  # a message pushed before this still reaches _hold and is kept

    def _hold(self, envelope: Envelope) -> None:
        """A claim subscription's handler: keep the message, wait for the agent's verdict."""
        held = Held(envelope)
        with self._arrived:
            self._held[envelope.id] = held
            self._arrivals[envelope.subject] = self._arrivals.get(envelope.subject, 0) + 1
            self._remember(envelope)
            self._arrived.notify_all()
        reason = held.verdict.result()  # parks this subscription's thread until answered
        if reason is not None:
            raise AgentNack(reason)

    def _held_of(self, endpoint: str) -> list[Held]:
        with self._arrived:
            found = [h for h in self._held.values() if h.envelope.subject == endpoint]
        return sorted(found, key=lambda h: h.envelope.id)  # ULIDs: oldest first

    def _remember(self, envelope: Envelope) -> None:
        self._seen[envelope.id] = envelope
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)

    def close(self) -> None:
        """End the reads that wait (the server is going away): nothing more is claimed."""
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()

    # ------------------------------------------------------------------ answering

    def answer(self, endpoint: str, message_id: str, reason: str | None) -> None:
        """Ack (reason None) or nack a held message: its handler returns, or raises with
        the reason, and the SDK sends the answer."""
        with self._arrived:
            held = self._held.get(message_id)
            if held is None or held.envelope.subject != endpoint:
                raise InvalidState(
                    f"message {message_id} of {endpoint} is not held by this server "
                    "(never read with relay_inbox, or already answered)"
                )
            del self._held[message_id]
        held.verdict.set_result(reason)

    def envelope(self, message_id: str) -> Envelope:
        """A message read here (held or recently answered), for relay_reply."""
        with self._arrived:
            found = self._seen.get(message_id)
        if found is None:
            raise MessageNotFound(f"message {message_id} was not read here with relay_inbox")
        return found

    def held_budgets(self) -> list[Budget]:
        with self._arrived:
            return [h.envelope.budget for h in self._held.values()]
