"""The router's and writers' records (workers/protocol.py): built the cheap way, they
are the same records."""

from __future__ import annotations

from workers import protocol as proto


def test_a_delivery_header_built_as_a_tuple_is_the_named_record_of_the_same_fields():
    fields = {
        "token": 7,
        "id": "01KB0000000000000000000001",
        "endpoint": "3f0c5bd2a1e4",
        "subject": "relay.agent.a",
        "sender": "relay.agent.b",
        "created_at": 1_764_108_000_000,
        "target": proto.TARGET_FAILED,
        "reason": "access denied",
        "code": "access_denied",
        "failed_at": 1_764_108_000_001,
        "relayed_from": "node-b",
        "parent_id": "01KB0000000000000000000000",
    }
    assert list(fields) == list(proto.DeliveryHeader._fields)  # every field, in order
    header = proto.delivery_header(**fields)
    assert type(header) is proto.DeliveryHeader
    assert header == proto.DeliveryHeader(**fields)
    assert header._asdict() == fields
