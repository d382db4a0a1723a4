"""Delegation, the pure half: who may act for whom (broker/delegation.py), tokens that
expire (broker/auth.py, edges/tokens.py). The router's side is in
tests/test_delegation_router.py; the edges' in tests/test_edges_http.py and
tests/test_edges_mcp.py."""

from __future__ import annotations

import pytest
import zmq

from broker.auth import AuthPolicy, Identity, TokenGrant, key_user, uid_user
from broker.delegation import acting_identity, refusal
from cli.auth import duration_s
from edges.tokens import TokenBook, token_hash
from sdk.errors import InvalidConfig, InvalidMessage, NotAuthorized

OWNER = 1000
NOW = 1_800_000_000_000
TOKEN = "relay_the-token"
GOOD = TokenGrant(token_hash(TOKEN))
GONE = TokenGrant(token_hash("relay_old"), expires_ms=NOW - 1)

AGENT_A = Identity("agent-a", ("relay.agent.a.>",), tokens=(GOOD,))
EDGE = Identity("edge", ("relay.agent.>",), delegate=True)
BRIDGE = Identity(
    "bridge", ("relay.agent.a.>",), relays={"node-b": ("relay.agent.a.>",)}, tokens=(GOOD,)
)


def key() -> str:
    return zmq.curve_keypair()[0].decode()


@pytest.mark.parametrize(
    ("delegate", "target", "why"),
    [
        (Identity("plain", (">",), admin=True), AGENT_A, "may not act for other identities"),
        (EDGE, Identity("no-token", ("relay.agent.a.>",)), "no bearer token that is still good"),
        (EDGE, Identity("expired", ("relay.agent.a.>",), tokens=(GONE,)), "still good"),
        (EDGE, Identity("op", ("relay.agent.a.>",), admin=True, tokens=(GOOD,)), "operator"),
        (EDGE, Identity("wide", ("relay.>",), tokens=(GOOD,)), "may send as relay.>"),
        (
            EDGE,
            Identity("reader", ("relay.agent.a.x",), consumes=("relay.human.>",), tokens=(GOOD,)),
            "may receive relay.human.>",
        ),
        (EDGE, BRIDGE, "relays messages"),
        (Identity("owner", (">",), admin=True, delegate=True), BRIDGE, "relays messages"),
    ],
    ids=[
        "no-right",
        "no-token",
        "token-expired",
        "admin",
        "wider-senders",
        "wider-receives",
        "bridge",
        "bridge-even-for-the-owner",
    ],
)
def test_a_delegate_is_refused_for_what_it_may_not_hand_on(delegate, target, why):
    assert why in (refusal(delegate, target, NOW) or "")


def test_a_delegate_may_act_for_a_token_bearer_within_its_own_rights():
    assert refusal(EDGE, AGENT_A, NOW) is None
    one_good = Identity("a", ("relay.agent.a.x",), tokens=(GONE, GOOD))
    assert refusal(EDGE, one_good, NOW) is None
    owner = AuthPolicy(OWNER).identity(uid_user(OWNER))
    assert owner is not None and owner.delegate  # the owner serves tokens on ipc://
    assert refusal(owner, Identity("op", ("x",), admin=True, tokens=(GOOD,)), NOW) is None


def test_acting_identity_judges_a_request_by_the_identity_it_names():
    a_key, plain_key = key(), key()
    policy = AuthPolicy.from_json(
        {
            "keys": {
                a_key: {"name": "agent-a", "senders": ["relay.agent.a.>"], "tokens": [GOOD.digest]},
                plain_key: {"name": "plain", "senders": [">"]},
            }
        },
        OWNER,
    )
    owner = uid_user(OWNER)
    who, acting = acting_identity(policy, owner, key_user(a_key), NOW)
    assert who is not None and who.name == "agent-a" and acting == key_user(a_key)
    assert who.may_send_as("relay.agent.a.x") and not who.may_send_as("relay.agent.b.x")
    assert acting_identity(policy, owner, owner, NOW)[1] is None  # naming itself: no right
    with pytest.raises(NotAuthorized, match="may not act for other identities"):
        acting_identity(policy, key_user(plain_key), key_user(a_key), NOW)
    with pytest.raises(NotAuthorized, match="revoked"):
        acting_identity(policy, owner, key_user(key()), NOW)
    with pytest.raises(InvalidMessage):
        acting_identity(policy, owner, 42, NOW)


def test_auth_json_keeps_the_delegation_right_and_token_expiry():
    k = key()
    policy = AuthPolicy.from_json(
        {
            "uids": {"1001": {"senders": [">"], "delegate": True}},
            "keys": {
                k: {
                    "senders": ["relay.agent.a.>"],
                    "tokens": [{"hash": GOOD.digest, "expires": "2027-01-15T08:00:00Z"}],
                }
            },
        },
        OWNER,
    )
    assert policy.uids[1001].delegate and not policy.keys[k].delegate
    (grant,) = policy.keys[k].tokens
    assert grant.expires_ms == 1_800_000_000_000
    assert grant.valid_at(grant.expires_ms - 1) and not grant.valid_at(grant.expires_ms)


@pytest.mark.parametrize(
    "tokens",
    [
        [{"hash": GOOD.digest, "expires": "2027-01-15T08:00:00"}],  # no zone
        [{"hash": GOOD.digest, "expires": "soon"}],
        [{"hash": GOOD.digest}],
        [{"hash": "md5:1", "expires": "2027-01-15T08:00:00Z"}],
    ],
    ids=["no-zone", "not-a-time", "no-expires", "bad-hash"],
)
def test_a_token_expiry_auth_json_cannot_honour_is_refused(tokens):
    with pytest.raises(InvalidConfig):
        AuthPolicy.from_json({"keys": {key(): {"senders": [">"], "tokens": tokens}}}, OWNER)
    with pytest.raises(InvalidConfig):
        AuthPolicy.from_json({"uids": {"1001": {"senders": [">"], "delegate": "yes"}}}, OWNER)


def test_the_token_book_finds_a_good_token_and_refuses_an_expired_one():
    k = key()
    policy = AuthPolicy.from_json(
        {
            "keys": {
                k: {
                    "name": "agent-a",
                    "senders": ["relay.agent.a.>"],
                    "tokens": [
                        GOOD.digest,
                        {"hash": token_hash("relay_old"), "expires": "2020-01-01T00:00:00Z"},
                    ],
                }
            }
        },
        OWNER,
    )
    book = TokenBook(policy)
    assert book.configured
    found = book.verify(TOKEN, NOW)
    assert found is not None and found.user == key_user(k) and found.name == "agent-a"
    assert book.verify("relay_old", NOW) is None  # expired: as unknown
    assert book.verify("relay_unknown", NOW) is None
    assert book.still_good(key_user(k), NOW)
    assert not TokenBook().configured


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45)]
)
def test_durations_for_expires(text, seconds):
    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["30", "d", "0d", "-1d", "1w", "1.5h"])
def test_durations_that_are_not_are_refused(text):
    with pytest.raises(ValueError):
        duration_s(text)
