"""The federation bridge's vocabulary on NATS (docs/federation.md), and its decisions as
data: names of the bucket, streams, subjects and consumers; the stream message's
encoding; what to do with JetStream's copy once the router has answered an ingest.
Pure: edges/bridge.py does the I/O."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from sdk.errors import InvalidMessage, RelayError
from sdk.subjects import validate
from sdk.types import Envelope, PublishResult

BUCKET = "relay-endpoints"
STREAM_MAX_BYTES = 1 << 30  # 1 GiB of messages waiting for one node
STREAM_MAX_AGE_S = 7 * 24 * 3600  # how long a node may be away
ACK_WAIT_S = 30.0  # JetStream redelivers what a bridge took and did not ack by then
MAX_ACK_PENDING = 256  # messages one bridge holds unacknowledged
# The bridge's stages overlap (edges/bridge.py): it takes or fetches more while what it
# took is still being published or ingested, up to these many in flight. Inbound: what
# JetStream lets it hold, far below the router's 1,024 requests in flight per client.
INBOUND_WINDOW = MAX_ACK_PENDING  # stream messages fetched, not yet acked (or naked)
OUTBOUND_WINDOW = 256  # parts taken from the router, not yet confirmed (relayed)
PUBLISH_TIMEOUT_S = 10.0  # no PubAck by then: the part is not confirmed
BACKPRESSURE_RETRY_S = 1.0  # a nak's delay when only a full mailbox refused it
RETRY_DELAY_S = 10.0  # a nak's delay: at least the router's 10 s publish deadline, so a
# copy still being stored when its ingest timed out is in the index when it comes back
# Refusals a later attempt may not meet: the bridge naks (JetStream redelivers later).
TRANSIENT = frozenset({"unavailable", "timeout", "storage_error", "backpressure", "circuit_open"})


def check_node(node: str) -> str:
    """A node name is one subject token: it is part of NATS subjects and KV keys."""
    if "." in node or not node:
        raise InvalidMessage(f"a node name is one subject token, got {node!r:.40}")
    return validate(node)


def stream_of(node: str) -> str:
    return f"RELAY_{node}"


def inbound(node: str) -> str:
    """The subjects of the stream ``node`` consumes: the last token is the origin node,
    which NATS permissions tie to the publishing user (one node cannot pose as another)."""
    return f"relay.fed.{node}.from.*"


def outbound(far: str, origin: str) -> str:
    return f"relay.fed.{far}.from.{origin}"


def origin_of(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


def signal_subject(node: str, origin: str, subject: str) -> str:
    """Core NATS subject of a signal from ``origin`` for an endpoint of ``node`` (never
    stored). The origin is a token of the subject, not a field of the body, so that NATS
    permissions tie it to the publishing user, as for the streams."""
    return f"relay.signal.{node}.from.{origin}.{subject}"


def signals_for(node: str) -> str:
    return f"relay.signal.{node}.from.*.>"


def split_signal(subject: str) -> tuple[str, str]:
    """The origin node and the endpoint subject of a signal's NATS subject."""
    tokens = subject.split(".", SIGNAL_PREFIX_TOKENS)
    return tokens[4], tokens[-1]


SIGNAL_PREFIX_TOKENS = 5  # relay.signal.<node>.from.<origin>.
RELAYED_MARK = "relayedFrom"  # in a re-emitted signal's data: never forwarded again


def forwardable(data: dict[str, Any] | None) -> bool:
    """A signal is forwarded to another node unless it came from one: two nodes with an
    endpoint of the same subject would otherwise pass it back and forth for ever."""
    return not (data and RELAYED_MARK in data)


def consumer_of(node: str) -> str:
    return f"relay-{node}"


def key_of(node: str, endpoint_hash: str) -> str:
    return f"{node}.{endpoint_hash}"


KV_STREAM = f"KV_{BUCKET}"  # the stream behind the bucket (nats-py's naming)
KV_SUBJECTS = f"$KV.{BUCKET}.>"


def kv_subjects_of(node: str) -> str:
    return f"$KV.{BUCKET}.{node}.>"


def key_of_subject(subject: str) -> str:
    """``$KV.relay-endpoints.<node>.<hash>`` -> ``<node>.<hash>``."""
    return subject.split(".", 2)[2]


def inbox_prefix(node: str) -> str:
    """Where NATS answers this node's bridge (PubAcks, API replies, fetched messages):
    one prefix per node, so that a node's user subscribes to its own replies only and
    cannot read what another node fetches from its stream."""
    return f"_INBOX.relay.{node}"


def permissions(node: str) -> dict[str, dict[str, list[str]]]:
    """The NATS permissions a node's bridge needs, and no more (docs/federation.md,
    "Running it with an existing NATS deployment"; tests/test_federation_auth.py runs
    the bridges under exactly these). No right to create or change a stream or a
    consumer: a user who may create a push consumer can have the server deliver stored
    messages to a subject it may not publish to (nats-server issue 8274), and one who
    may create a stream can republish or source into another's; so the bucket, the
    streams and the durable consumers are made beforehand (`relay bridge --setup`, by
    a user with those rights)."""
    stream, consumer = stream_of(node), consumer_of(node)
    api = "$JS.API"
    return {
        "publish": {
            "allow": [
                f"relay.fed.*.from.{node}",  # parts for any node, as origin <node> only
                f"relay.signal.*.from.{node}.>",
                f"$KV.{BUCKET}.{node}.>",  # its own endpoints in the directory
                f"{api}.STREAM.INFO.{KV_STREAM}",  # open the bucket, list its keys
                f"{api}.DIRECT.GET.{KV_STREAM}.>",  # read the other nodes' keys
                f"{api}.STREAM.INFO.{stream}",
                f"{api}.CONSUMER.INFO.*.*",  # its consumer, and every node's lag
                f"{api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",  # fetch
                f"$JS.ACK.{stream}.{consumer}.>",  # ack, nak, term
            ]
        },
        "subscribe": {"allow": [f"{inbox_prefix(node)}.>", signals_for(node)]},
    }


def encode_part(part: dict[str, Any]) -> bytes:
    """A remote part (relay_take) as the stream message: subjects and envelope."""
    return json.dumps(
        {"subjects": part["subjects"], "envelope": part["envelope"]},
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()


def decode_part(data: bytes) -> tuple[list[str], Envelope]:
    try:
        body = json.loads(data)
        subjects, envelope = body["subjects"], body["envelope"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidMessage(f"not a relay stream message: {exc}") from None
    if not isinstance(subjects, list) or not all(isinstance(s, str) for s in subjects):
        raise InvalidMessage("a relay stream message's subjects must be a list of strings")
    return subjects, Envelope.from_wire(envelope, path="envelope")


@dataclass(frozen=True, slots=True)
class Advert:
    """One endpoint in the KV bucket, put again by its node's bridge every ADVERTISE_S."""

    subject: str
    node: str
    registered_at: int
    depth: int
    advertised_at: int = 0  # unix ms of this put: a node whose keys are fresh is running

    def encode(self) -> bytes:
        return json.dumps(
            {
                "subject": self.subject,
                "node": self.node,
                "registeredAt": self.registered_at,
                "depth": self.depth,
                "advertisedAt": self.advertised_at,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Advert | None:
        try:
            d = json.loads(data)
            return cls(
                validate(d["subject"]),
                check_node(d["node"]),
                d["registeredAt"],
                d["depth"],
                d.get("advertisedAt", 0),
            )
        except (ValueError, KeyError, TypeError, RelayError):
            return None  # a foreign or damaged key: not an endpoint


ADVERTISE_S = 2.0  # how often a bridge puts its node's keys again
LIVE_MS = int(5 * ADVERTISE_S * 1000)  # a key put more recently: its bridge is running


def running(adverts: list[Advert | None], now_ms: int) -> bool:
    """Whether a node's bridge looks alive from its keys (hosts' clocks agree, as for
    TTLs: docs/federation.md)."""
    return any(a is not None and now_ms - a.advertised_at < LIVE_MS for a in adverts)


class Settle(enum.Enum):
    ACK = "ack"  # stored (or settled as a dead letter) on this node: done
    NAK = "nak"  # try again later: JetStream redelivers after RETRY_DELAY_S
    TERM = "term"  # never acceptable here (rights, malformed): stop redelivering


# An ingest's copy refused because its endpoint has that id from another node (or
# published there): final, and said at WARNING level by the bridge, since a node may be
# relaying ids that are not its own.
ID_CONFLICT = "id_conflict"


def settle_result(result: PublishResult) -> Settle:
    """A PublishResult: ack, unless a copy met a refusal that may pass later."""
    if any(reason in TRANSIENT for _, reason in result.rejected):
        return Settle.NAK
    return Settle.ACK


def settle_error(error: RelayError) -> Settle:
    return Settle.NAK if error.code in TRANSIENT else Settle.TERM


def nak_delay(reasons: list[str]) -> float:
    """How long JetStream waits before it hands a nak'd message in again. A mailbox
    that was full (backpressure) stored nothing and drains as its consumer works: try
    again soon. Anything else waits RETRY_DELAY_S, for a copy that may still be on its
    way to a writer (unavailable, timeout) or a breaker's cooldown."""
    transient = [r for r in reasons if r in TRANSIENT]
    if transient and all(r == "backpressure" for r in transient):
        return BACKPRESSURE_RETRY_S
    return RETRY_DELAY_S
