"""The pure half of authentication: auth.json parsing, admission, sender rights, ZAP
decisions. The sockets are exercised in tests/test_security.py."""

from __future__ import annotations

import pytest
import zmq
from zmq.utils import z85

from broker.auth import AuthPolicy, Identity, key_user, uid_user
from broker.router.consumers import Consumers
from broker.zap import IPC_DOMAIN, OK, REFUSED, TCP_DOMAIN, decide, peer_uid
from sdk.errors import InvalidConfig

OWNER = 1000
PUBLIC, _ = zmq.curve_keypair()
KEY = PUBLIC.decode()


def policy(**data) -> AuthPolicy:
    return AuthPolicy.from_json(data, OWNER)


def test_without_a_file_only_the_owner_is_admitted_with_every_right():
    p = AuthPolicy(OWNER)
    assert p.admit_uid(OWNER) == "uid:1000"
    assert p.admit_uid(1001) is None
    assert p.admit_key(KEY) is None
    owner = p.identity("uid:1000")
    assert owner.admin and owner.may_send_as("any.sender.at.all")


def test_a_message_without_a_zap_user_id_has_no_identity():
    # Every client socket is under ZAP; a message without a user id means it was bypassed.
    assert AuthPolicy(OWNER).identity(None) is None


def test_listed_uids_and_keys_get_their_senders_and_no_admin_by_default():
    p = policy(
        uids={"1001": {"name": "b", "senders": ["relay.agent.b.>"]}},
        keys={KEY: {"name": "projA", "senders": ["relay.agent.projA.*", "relay.human.x"]}},
    )
    b = p.identity(p.admit_uid(1001))
    assert b == Identity("b", ("relay.agent.b.>",), admin=False)
    assert b.may_send_as("relay.agent.b.worker.1")
    assert not b.may_send_as("relay.agent.c.worker")
    proj = p.identity(p.admit_key(KEY))
    assert proj.may_send_as("relay.agent.projA.x") and proj.may_send_as("relay.human.x")
    assert not proj.may_send_as("relay.agent.projA.x.y")  # * is one token
    assert p.identity(p.admit_uid(OWNER)).admin  # still implicit


def test_an_identity_receives_what_it_may_send_as_unless_consumes_says_otherwise():
    p = policy(
        uids={
            "1001": {"senders": ["relay.agent.b.>"]},
            "1002": {"senders": ["relay.agent.c.x"], "consumes": ["relay.agent.c.>", "relay.log"]},
            "1003": {"senders": [">"], "consumes": []},
        },
    )
    b, c, mute = (p.identity(uid_user(u)) for u in (1001, 1002, 1003))
    assert b.may_consume("relay.agent.b.inbox") and b.may_consume("relay.agent.b.*")
    assert not b.may_consume("relay.agent.>") and not b.may_consume("relay.agent.c.inbox")
    assert c.may_consume("relay.agent.c.>") and c.may_consume("relay.log")
    assert not c.may_consume("relay.*")
    assert mute.may_send_as("anything") and not mute.may_consume("relay.agent.b.inbox")
    assert p.identity(uid_user(OWNER)).may_consume(">")


def test_the_owner_can_be_restricted_by_listing_it():
    p = policy(uids={"1000": {"senders": ["relay.ops.>"], "admin": False}})
    owner = p.identity(uid_user(OWNER))
    assert not owner.admin
    assert not owner.may_send_as("relay.agent.x")


def test_a_revoked_credential_has_no_identity():
    assert AuthPolicy(OWNER).identity(key_user(KEY)) is None
    assert AuthPolicy(OWNER).identity("uid:1001") is None


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([], "must be an object"),
        ({"users": {}}, "unknown field"),
        ({"uids": {"bob": {"senders": [">"]}}}, "uids.bob: a uid is a non-negative integer"),
        ({"uids": {"1": {"senders": ">"}}}, "uids.1.senders must be a list"),
        ({"uids": {"1": {"senders": ["a..b"]}}}, "uids.1.senders"),
        ({"uids": {"1": {"senders": [">"], "consumes": "a.>"}}}, "uids.1.consumes must be a list"),
        ({"uids": {"1": {"senders": [">"], "consumes": ["a.>.b"]}}}, "uids.1.consumes"),
        ({"uids": {"1": {"senders": [">"], "admin": "yes"}}}, "uids.1.admin"),
        ({"uids": {"1": {"senders": [">"], "root": True}}}, "unknown field"),
        ({"keys": {"short": {"senders": [">"]}}}, "40 Z85 characters"),
        ({"keys": []}, "keys must be an object"),
    ],
)
def test_a_bad_auth_file_is_refused_naming_the_field(data, problem):
    with pytest.raises(InvalidConfig, match=problem):
        AuthPolicy.from_json(data, OWNER)


@pytest.mark.parametrize(
    ("address", "uid"),
    [
        (b"localhost:1000:1000:4242", 1000),
        (b":0:0:1", 0),
        (b"127.0.0.1", None),
        (b"", None),
        (b"host:x:1:2", None),
    ],
)
def test_peer_uid_is_read_from_the_ipc_peer_address(address, uid):
    assert peer_uid(address) == uid


def test_zap_admits_the_owner_on_ipc_and_refuses_other_uids():
    p = AuthPolicy(OWNER)
    assert decide(IPC_DOMAIN, b"NULL", b"localhost:1000:1000:7", [], p) == (OK, "OK", "uid:1000")
    status, text, user = decide(IPC_DOMAIN, b"NULL", b"localhost:1001:1001:7", [], p)
    assert (status, user) == (REFUSED, "") and "uid 1001" in text


def test_zap_refuses_null_without_peer_credentials():
    # tcp:// sockets are CURVE servers; a NULL handshake there has no uid to check.
    status, text, _ = decide(IPC_DOMAIN, b"NULL", b"127.0.0.1", [], AuthPolicy(OWNER))
    assert status == REFUSED and "no peer credentials" in text


def test_zap_judges_each_mechanism_only_in_its_transports_domain():
    p = policy(keys={KEY: {"senders": [">"]}})
    # An address that merely looks like it carries a uid does not count on tcp://.
    assert decide(TCP_DOMAIN, b"NULL", b"fd00::1000:0:1", [], p)[0] == REFUSED
    assert decide(IPC_DOMAIN, b"CURVE", b"", [z85.decode(PUBLIC)], p)[0] == REFUSED
    assert decide(b"other", b"NULL", b"localhost:1000:1000:7", [], p)[0] == REFUSED


def test_zap_admits_known_curve_keys_only():
    p = policy(keys={KEY: {"senders": [">"]}})
    curve = decide(TCP_DOMAIN, b"CURVE", b"127.0.0.1", [z85.decode(PUBLIC)], p)
    assert curve == (OK, "OK", f"key:{KEY}")
    other, _ = zmq.curve_keypair()
    status, text, _ = decide(TCP_DOMAIN, b"CURVE", b"127.0.0.1", [z85.decode(other)], p)
    assert status == REFUSED and other.decode() in text


def test_zap_refuses_plain_and_malformed_curve():
    p = AuthPolicy(OWNER)
    assert decide(IPC_DOMAIN, b"PLAIN", b"localhost:1000:1000:1", [b"u", b"p"], p)[0] == REFUSED
    assert decide(TCP_DOMAIN, b"CURVE", b"127.0.0.1", [b"short"], p)[0] == REFUSED


def test_a_routing_id_reused_with_other_credentials_starts_a_fresh_session():
    consumers = Consumers()
    consumers.subscribe(b"id", "a.>", "consume", 8, 0)
    consumers.touch(b"id", 1, None)
    assert consumers.sessions[b"id"].subs
    fresh = consumers.touch(b"id", 2, "key:other")
    assert fresh.user == "key:other" and not fresh.subs and not consumers.subs


def test_every_admin_operation_is_a_real_operation():
    from broker.router import ADMIN_OPS, OPERATIONS

    assert OPERATIONS.keys() >= ADMIN_OPS
