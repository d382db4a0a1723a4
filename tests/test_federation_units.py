"""The pure units of federation (broker/router/federation.py, requests): which remote
endpoints a subject reaches, and the bridge's held relay_take, with time as an argument."""

from __future__ import annotations

import pytest

from broker.router.federation import BRIDGE_GONE_MS, TAKE_HOLD_MS, Federation, RemotePart
from broker.router.requests import Ingest, Relayed, RelayTake, RemoteEndpoints
from sdk.errors import InvalidMessage, InvalidSubject


def federation() -> Federation:
    fed = Federation()
    fed.set_remote("b", frozenset({"relay.agent.b.x", "relay.agent.b.y"}))
    fed.set_remote("c", frozenset({"relay.agent.c.x", "relay.agent.shared"}))
    return fed


def nothing_local(subject: str) -> bool:
    return False


@pytest.mark.parametrize(
    "subject, expected",
    [
        ("relay.agent.b.x", {"b": ["relay.agent.b.x"]}),
        ("relay.agent.*.x", {"b": ["relay.agent.b.x"], "c": ["relay.agent.c.x"]}),
        ("relay.agent.b.>", {"b": ["relay.agent.b.x", "relay.agent.b.y"]}),
        ("relay.agent.nobody", {}),
    ],
    ids=["literal", "star", "tail", "none"],
)
def test_a_subject_reaches_the_remote_endpoints_it_matches_by_node(subject, expected):
    assert federation().targets(subject, nothing_local) == expected


def test_an_endpoint_registered_here_too_and_this_nodes_own_entries_are_not_remote():
    fed = federation()
    fed.node = "c"
    found = fed.targets("relay.agent.>", lambda s: s == "relay.agent.b.y")
    assert found == {"b": ["relay.agent.b.x"]}


def test_a_new_list_replaces_a_nodes_endpoints_and_an_empty_one_forgets_it():
    fed = federation()
    fed.set_remote("b", frozenset({"relay.agent.b.z"}))
    assert fed.targets("relay.agent.b.>", nothing_local) == {"b": ["relay.agent.b.z"]}
    fed.set_remote("b", frozenset())
    assert fed.targets("relay.agent.b.>", nothing_local) == {}
    assert "b" not in fed.remote


def part(token: int) -> RemotePart:
    return RemotePart(token, "b", ("relay.agent.b.x",), {})


def test_an_empty_take_is_held_until_a_part_comes_or_its_time_is_up():
    fed, alive = Federation(), (lambda p: p.token != 2)
    assert fed.take(b"bridge", 1, 10, 0, alive) is None
    assert fed.answer_held(10, alive) is None
    fed.add(part(1))
    fed.add(part(2))  # its publish was answered meanwhile: never handed out
    held, parts = fed.answer_held(20, alive)
    assert (held.rid, [p.token for p in parts]) == (1, [1])
    assert fed.take(b"bridge", 2, 10, 30, alive) is None
    assert fed.answer_held(30 + TAKE_HOLD_MS - 1, alive) is None
    assert fed.answer_held(30 + TAKE_HOLD_MS, alive)[1] == []


def test_a_bridge_is_connected_while_it_asks():
    fed = Federation()
    assert not fed.connected(0)
    fed.take(b"bridge", 1, 10, 1000, lambda p: True)
    assert fed.connected(1000 + 10 * BRIDGE_GONE_MS)  # held: it is asking
    fed.answer_held(1000 + TAKE_HOLD_MS, lambda p: True)
    assert fed.connected(1000 + TAKE_HOLD_MS + BRIDGE_GONE_MS - 1)
    assert not fed.connected(1000 + TAKE_HOLD_MS + BRIDGE_GONE_MS)


@pytest.mark.parametrize(
    "decode, body, error",
    [
        (RemoteEndpoints.decode, {"node": "a.b", "subjects": []}, InvalidMessage),
        (RemoteEndpoints.decode, {"node": "a", "subjects": ["relay.*"]}, InvalidSubject),
        (RemoteEndpoints.decode, {"node": "a", "subjects": "relay.x"}, InvalidMessage),
        (Relayed.decode, {"parts": [[1, "b"]]}, InvalidMessage),
        (Relayed.decode, {"parts": [["1", "b", None]]}, InvalidMessage),
        (Ingest.decode, {"node": "a", "subjects": [], "envelope": {}}, InvalidMessage),
        (Ingest.decode, {"node": "a", "subjects": ["relay.x"], "envelope": {}}, InvalidMessage),
    ],
    ids=["dotted-node", "wildcard", "not-a-list", "short-part", "token", "no-subject", "bad-env"],
)
def test_a_malformed_bridge_request_is_refused_with_its_field_named(decode, body, error):
    with pytest.raises(error):
        decode(body)


@pytest.mark.parametrize(
    "cluster",
    [{"servers": []}, {"server": "x", "lag": {"b": "12"}}, "127.0.0.1:4222"],
    ids=["no-server", "lag-not-int", "not-a-map"],
)
def test_what_a_bridge_says_it_sees_must_have_the_documented_shape(cluster):
    with pytest.raises(InvalidMessage):
        RelayTake.decode({"node": "a", "cluster": cluster})


def test_status_shows_what_the_bridge_last_said_it_sees():
    fed = Federation()
    seen = {"server": "127.0.0.1:4222", "servers": ["127.0.0.1:4222"], "lag": {"b": 3}}
    fed.take(b"bridge", 1, 10, 0, lambda p: True)
    fed.cluster = RelayTake.decode({"node": "a", "cluster": seen}).cluster
    status = fed.status(0)
    assert (status["server"], status["servers"], status["lag"]) == (
        "127.0.0.1:4222",
        ["127.0.0.1:4222"],
        {"b": 3},
    )
