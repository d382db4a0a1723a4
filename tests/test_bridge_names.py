"""The bridge's decisions as data (edges/bridge_names.py): names on NATS, the stream
message's encoding, and what becomes of JetStream's copy after an ingest."""

from __future__ import annotations

import pytest

from edges import bridge_names as names
from sdk.errors import InvalidMessage, RelayError, SenderNotAllowed, StorageError, Unavailable
from sdk.ids import new_id
from sdk.types import PublishResult, default_budget


def test_the_origin_node_is_the_last_token_of_the_stream_subject():
    subject = names.outbound("b", "a")
    assert subject == "relay.fed.b.from.a" and names.origin_of(subject) == "a"
    assert names.inbound("b") == "relay.fed.b.from.*"


@pytest.mark.parametrize("node", ["", "a.b", "a b", "*", ">"], ids=repr)
def test_a_node_name_is_one_plain_token(node):
    with pytest.raises(RelayError):
        names.check_node(node)


def test_a_part_survives_the_stream_unchanged():
    envelope = {
        "id": new_id(),
        "subject": "relay.agent.b.x",
        "from": "relay.agent.a.y",
        "replyTo": None,
        "budget": default_budget(1).to_wire(),
        "createdAt": 1,
        "payload": {"content": "é"},
    }
    subjects, decoded = names.decode_part(
        names.encode_part({"subjects": ["relay.agent.b.x"], "envelope": envelope, "token": 1})
    )
    assert subjects == ["relay.agent.b.x"] and decoded.to_wire() == envelope


@pytest.mark.parametrize("data", [b"", b"[]", b'{"subjects": "x", "envelope": {}}'], ids=repr)
def test_a_foreign_stream_message_is_refused(data):
    with pytest.raises(InvalidMessage):
        names.decode_part(data)


def result(*rejected: tuple[str, str]) -> PublishResult:
    return PublishResult(new_id(), 1, rejected)


@pytest.mark.parametrize(
    "outcome, settle",
    [
        (result(), names.Settle.ACK),
        (result(("h", "budget_exceeded")), names.Settle.ACK),  # a dead letter: settled
        (result(("*", "no_match")), names.Settle.ACK),
        (result(("h", "backpressure")), names.Settle.NAK),  # may pass later
        (result(("h", "unavailable"), ("g", "access_denied")), names.Settle.NAK),
        (Unavailable("writer down"), names.Settle.NAK),
        (StorageError("disk full"), names.Settle.NAK),
        (SenderNotAllowed("b may not relay c"), names.Settle.TERM),
        (InvalidMessage("bad envelope"), names.Settle.TERM),
    ],
    ids=["stored", "dead", "no-match", "pressure", "partial", "down", "disk", "rights", "bad"],
)
def test_jetstreams_copy_is_acked_only_when_settled_here(outcome, settle):
    if isinstance(outcome, PublishResult):
        assert names.settle_result(outcome) is settle
    else:
        assert names.settle_error(outcome) is settle


def test_an_advert_round_trips_and_a_foreign_key_is_ignored():
    advert = names.Advert("relay.agent.a.x", "a", 5, 2)
    assert names.Advert.decode(advert.encode()) == advert
    assert names.Advert.decode(b"not json") is None


def test_a_signal_from_another_node_is_never_forwarded_again():
    subject = names.signal_subject("b", "a", "relay.agent.b.x")
    assert subject == "relay.signal.b.from.a.relay.agent.b.x"
    assert names.split_signal(subject) == ("a", "relay.agent.b.x")
    assert names.forwardable(None) and names.forwardable({"progress": 1})
    assert not names.forwardable({names.RELAYED_MARK: "a"})


def test_a_node_is_running_while_one_of_its_keys_is_fresh():
    now = 1_000_000

    def put(ago_ms: int) -> names.Advert:
        return names.Advert("relay.agent.a.x", "a", 5, 2, now - ago_ms)

    assert names.running([put(names.LIVE_MS * 3), put(names.ADVERTISE_S * 1000)], now)
    assert not names.running([put(names.LIVE_MS), None], now)
    assert not names.running([], now)
    older = b'{"subject": "relay.agent.a.x", "node": "a", "registeredAt": 5, "depth": 2}'
    assert names.Advert.decode(older).advertised_at == 0  # put by a bridge before this one


def test_a_full_mailbox_is_tried_again_soon_and_anything_else_later():
    assert names.nak_delay(["backpressure"]) == names.BACKPRESSURE_RETRY_S
    assert names.nak_delay(["backpressure", "access_denied"]) == names.BACKPRESSURE_RETRY_S
    # a copy perhaps still on its way to a writer must be in the index when it comes back
    for reasons in (["backpressure", "unavailable"], ["timeout"], ["circuit_open"]):
        assert names.nak_delay(reasons) == names.RETRY_DELAY_S
