"""Delegation at the router, on a default install (ipc://): a connection whose identity
may delegate (the owner) names on each request the identity it acts for (actingFor),
and the router judges the request by that identity's rights (docs/security.md,
"Delegation")."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import pytest

from broker.auth import key_user
from edges.tokens import token_hash
from sdk.errors import NotAuthorized, SenderNotAllowed
from tests.harness import Broker, wait_for, write_auth

pytestmark = pytest.mark.integration

A_KEY = "A" * 40  # the public key that names agent-a's identity in auth.json
B_KEY = "B" * 40
AGENT_A, AGENT_B = key_user(A_KEY), key_user(B_KEY)


def with_token_identities(broker: Broker, **owner: object) -> None:
    """auth.json with agent-a and agent-b, each with a token; ``owner``: the owner's
    uid entry (default: not listed, so it keeps every right, delegation included)."""
    data: dict = {
        "keys": {
            A_KEY: {"name": "agent-a", "senders": ["relay.agent.a.>"], "tokens": [token_hash("a")]},
            B_KEY: {"name": "agent-b", "senders": ["relay.agent.b.>"], "tokens": [token_hash("b")]},
        }
    }
    if owner:
        data["uids"] = {str(os.getuid()): owner}
    write_auth(broker.home, data)


def applied(broker: Broker, user: str) -> bool:
    """Whether the router has read auth.json naming ``user`` (a request acting for it
    passes the delegation check)."""
    try:
        broker.client(acting_for=user).list_endpoints()
    except NotAuthorized:
        return False
    return True


def test_a_request_acting_for_an_identity_has_that_identitys_rights_and_no_more(
    broker: Broker,
) -> None:
    owner = broker.client()
    owner.register_endpoint("relay.agent.a.x")
    owner.register_endpoint("relay.agent.b.x")
    with_token_identities(broker)
    wait_for(lambda: applied(broker, AGENT_A), what="auth.json to apply")
    a = broker.client(acting_for=AGENT_A)

    assert a.publish("relay.agent.a.x", 1, sender="relay.agent.a.me").delivered_to
    with pytest.raises(SenderNotAllowed, match=r"agent-a may not send as relay\.agent\.b\.me"):
        a.publish("relay.agent.a.x", 1, sender="relay.agent.b.me")
    with pytest.raises(NotAuthorized, match="may not receive"):
        a.subscribe("relay.agent.b.x", lambda envelope: None)
    with pytest.raises(NotAuthorized, match="operator rights"):
        a.set_config({"rateLimit": {"enabled": False}})
    assert [m.envelope.payload for m in a.fetch("relay.agent.a.x")] == [1]


def test_an_identity_without_the_delegation_right_may_not_name_another(broker: Broker) -> None:
    with_token_identities(broker, senders=[">"], admin=True)  # the owner listed: no delegate
    wait_for(lambda: not applied(broker, AGENT_A), what="auth.json to apply")
    with pytest.raises(NotAuthorized, match="may not act for other identities"):
        broker.client(acting_for=AGENT_A).list_endpoints()
    assert broker.client().list_endpoints() == []  # its own identity is untouched


def test_naming_an_identity_that_auth_json_does_not_list_is_not_authorized(
    broker: Broker,
) -> None:
    with pytest.raises(NotAuthorized, match="revoked"):
        broker.client(acting_for=AGENT_A).list_endpoints()


def test_a_subscription_made_for_an_identity_ends_when_its_token_is_removed(
    broker: Broker,
) -> None:
    owner = broker.client()
    owner.register_endpoint("relay.agent.a.x")
    with_token_identities(broker)
    wait_for(lambda: applied(broker, AGENT_A), what="auth.json to apply")
    a = broker.client(acting_for=AGENT_A)
    a.subscribe("relay.agent.a.x", lambda envelope: None)
    wait_for(lambda: owner.status()["subscriptions"] >= 1, what="the subscription")

    data = json.loads(broker.home.auth_file.read_text())
    del data["keys"][A_KEY]["tokens"]  # still listed, but no token: out of a delegate's reach
    write_auth(broker.home, data)
    wait_for(lambda: "may no longer receive it" in broker.log("router"), what="it to end")


def test_a_subscription_made_for_an_identity_ends_when_its_token_expires(
    broker: Broker,
) -> None:
    """Expiry changes no file: the router's sweep judges the subscription again once the
    earliest token expiry has passed."""
    owner = broker.client()
    owner.register_endpoint("relay.agent.a.x")
    expires = datetime.now(UTC) + timedelta(seconds=4)
    grant = {"hash": token_hash("a"), "expires": expires.isoformat()}
    agent_a = {"name": "agent-a", "senders": ["relay.agent.a.>"], "tokens": [grant]}
    write_auth(broker.home, {"keys": {A_KEY: agent_a}})
    wait_for(lambda: applied(broker, AGENT_A), what="auth.json to apply")
    a = broker.client(acting_for=AGENT_A)
    a.subscribe("relay.agent.a.x", lambda envelope: None)
    assert owner.status()["subscriptions"] == 1

    wait_for(lambda: "may no longer receive it" in broker.log("router"), 30, what="it to end")
    assert owner.status()["subscriptions"] == 0


def test_a_request_and_its_reply_between_two_identities_acted_for(broker: Broker) -> None:
    """`request()`'s reply inbox, _INBOX.<sender>.<nonce>, is registered and consumed
    as the identity acted for: it may, since it may send as that sender."""
    owner = broker.client()
    owner.register_endpoint("relay.agent.b.desk")
    with_token_identities(broker)
    wait_for(lambda: applied(broker, AGENT_B), what="auth.json to apply")
    a, b = broker.client(acting_for=AGENT_A), broker.client(acting_for=AGENT_B)
    b.subscribe(
        "relay.agent.b.desk",
        lambda envelope: b.reply(envelope, f"re: {envelope.payload}", sender="relay.agent.b.desk"),
    )
    reply = a.request("relay.agent.b.desk", "hello", sender="relay.agent.a.me", timeout=10)
    assert reply.payload == "re: hello" and reply.sender == "relay.agent.b.desk"
