"""Rate limits, circuit breakers, backpressure and hot-reloaded files, through real processes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sdk.ids import is_id
from sdk.types import AccessRule, RuleAction, SignalType
from tests.harness import signals_flowing, wait_for

pytestmark = pytest.mark.integration

A, B, C = "relay.agent.demo.a", "relay.agent.demo.b", "relay.agent.demo.c"
SENDER = "relay.agent.demo.sender"
ALL_OFF = {
    "rateLimit": {"enabled": False},
    "circuitBreaker": {"enabled": False},
    "backpressure": {"enabled": False},
}


def test_a_multi_endpoint_publish_is_checked_once_and_the_result_has_the_shape(broker):
    client = broker.client()
    for subject in (A, B, C):
        client.register_endpoint(subject)
    client.set_config({"rateLimit": {"maxPerWindow": 2}})
    assert client.publish("relay.agent.demo.*", 1, sender=SENDER).delivered_to == 3
    assert client.publish("relay.agent.demo.*", 2, sender=SENDER).delivered_to == 3
    limited = client.publish("relay.agent.demo.*", 3, sender=SENDER)
    assert is_id(limited.message_id)
    assert limited.delivered_to == 0
    assert limited.rejected == (("*", "rate_limited"),)
    assert limited.details["*"] == "rate limit exceeded: 2/2 messages in 60s window"
    assert client.trace(limited.message_id)["copies"] == []  # nothing written
    assert client.dead_letters() == []  # not a dead letter
    # another sender has its own allowance
    assert client.publish(A, 4, sender="relay.agent.demo.other").delivered_to == 1


def test_dead_letters_do_not_count_toward_the_limit(broker):
    client = broker.client()
    client.register_endpoint(A)
    client.set_config({"rateLimit": {"maxPerWindow": 1}})
    for _ in range(3):
        assert client.publish("relay.agent.nobody", 0, sender=SENDER).rejected == (
            ("*", "no_match"),
        )
    assert client.publish(A, 1, sender=SENDER).delivered_to == 1


def test_the_rate_window_survives_a_router_restart(broker):
    client = broker.client()
    client.register_endpoint(A)
    client.set_config({"rateLimit": {"maxPerWindow": 3}})
    for i in range(3):
        assert client.publish(A, i, sender=SENDER).delivered_to == 1
    broker.stop()
    broker.start()
    client = broker.client()
    assert client.publish(A, 4, sender=SENDER).rejected == (("*", "rate_limited"),)


def test_a_full_mailbox_refuses_without_writing_and_others_still_get_theirs(broker):
    client = broker.client()
    info_a = client.register_endpoint(A)
    info_b = client.register_endpoint(B)
    client.set_config({"backpressure": {"maxMailboxSize": 2}})
    client.publish(A, 1, sender=SENDER)
    client.publish(A, 2, sender=SENDER)
    result = client.publish("relay.agent.demo.*", 3, sender=SENDER)
    assert result.delivered_to == 1
    assert result.rejected == ((info_a.hash, "backpressure"),)
    assert result.details[info_a.hash] == "backpressure: mailbox full (2/2)"
    assert result.mailbox_pressure == {info_a.hash: 1.0, info_b.hash: 0.5}
    assert len(os.listdir(os.path.join(info_a.maildir_path, "new"))) == 2
    assert client.dead_letters() == []
    assert [c["endpoint"] for c in client.trace(result.message_id)["copies"]] == [info_b.hash]


def test_the_sender_hears_a_backpressure_warning(broker):
    client = broker.client()
    client.register_endpoint(A)
    client.set_config({"backpressure": {"maxMailboxSize": 5, "pressureWarningAt": 0.6}})
    heard = []
    client.on_signal(SENDER, lambda subject, sig: heard.append(sig))
    signals_flowing(client, SENDER)
    for i in range(4):  # depth 3 of 5 reaches the warning ratio
        assert client.publish(A, i, sender=SENDER).delivered_to == 1
    warnings = wait_for(
        lambda: [s for s in heard if s.type == SignalType.BACKPRESSURE],
        what="a backpressure signal",
    )
    assert warnings[0].state == "warning" and warnings[0].endpoint_subject == A
    assert warnings[0].data == {"pressure": 0.6, "currentSize": 3, "maxMailboxSize": 5}


def test_breaker_opens_on_write_failures_and_recovers_through_one_probe(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    client.set_config({"circuitBreaker": {"cooldownMs": 1000}})
    tmp = os.path.join(info.maildir_path, "tmp")
    shutil.rmtree(tmp)  # every write into this mailbox now fails
    for _ in range(5):
        failed = client.publish(A, "x", sender=SENDER)
        assert failed.rejected == ((info.hash, "storage_error"),)
    refused = client.publish(A, "x", sender=SENDER)
    assert refused.rejected == ((info.hash, "circuit_open"),)
    assert refused.details[info.hash] == f"circuit open for endpoint {info.hash}"
    assert client.status()["endpoints"][0]["breaker"]["state"] == "open"
    os.mkdir(tmp, 0o700)  # the disk is fixed

    def cooled_down():
        breaker = client.status()["endpoints"][0]["breaker"]
        return breaker["state"] == "open" and breaker["reopensInMs"] == 0

    wait_for(cooled_down, what="the cool-down to pass")
    futures = [client.publish_async(A, i, sender=SENDER) for i in range(5)]
    results = [f.result(10) for f in futures]
    assert [r.delivered_to for r in results].count(1) == 1, "exactly one probe in flight"
    assert all(r.rejected == ((info.hash, "circuit_open"),) for r in results if r.delivered_to == 0)
    assert client.publish(A, "second probe", sender=SENDER).delivered_to == 1
    assert client.status()["endpoints"][0]["breaker"]["state"] == "closed"
    assert client.publish(A, "normal", sender=SENDER).delivered_to == 1


def test_everything_disabled_behaves_like_the_plain_broker(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    client.set_config({**ALL_OFF, "backpressure": {"enabled": False, "maxMailboxSize": 3}})
    futures = [client.publish_async(A, i, sender=SENDER) for i in range(150)]
    assert all(f.result(30).delivered_to == 1 for f in futures)
    shutil.rmtree(os.path.join(info.maildir_path, "tmp"))
    for _ in range(8):
        assert client.publish(A, "x", sender=SENDER).rejected == ((info.hash, "storage_error"),)


def test_a_config_file_edit_changes_a_limit_live(broker):
    client = broker.client()
    client.register_endpoint(A)
    path = broker.home.config_file
    path.write_text(json.dumps({"rateLimit": {"maxPerWindow": 1}}))
    wait_for(
        lambda: client.get_config()["rateLimit"]["maxPerWindow"] == 1,
        what="config.json to take effect",
    )
    assert client.get_config()["backpressure"]["maxMailboxSize"] == 1000  # defaults kept
    assert client.publish(A, 1, sender=SENDER).delivered_to == 1
    assert client.publish(A, 2, sender=SENDER).rejected == (("*", "rate_limited"),)
    path.write_text("{broken")
    wait_for(lambda: "config.json" in client.status()["fileErrors"], what="the refusal")
    assert client.get_config()["rateLimit"]["maxPerWindow"] == 1  # last good stays


def test_the_seeds_config_file_layout_is_applied_live(broker):
    client = broker.client()
    seeds = {
        "reliability": {
            "rateLimit": {"maxPerWindow": 7},
            "circuitBreaker": {"failureThreshold": 3},
            "backpressure": {"maxMailboxSize": 50},
        }
    }
    (broker.home.root / "config.json").write_text(json.dumps(seeds))
    wait_for(
        lambda: client.get_config()["rateLimit"]["maxPerWindow"] == 7,
        what="the seeds' config.json to take effect",
    )
    assert "config.json" not in client.status()["fileErrors"]
    config = client.get_config()
    assert "reliability" not in config  # read back in Relay's own layout
    assert config["circuitBreaker"]["failureThreshold"] == 3
    assert config["backpressure"]["maxMailboxSize"] == 50


def test_relay_config_set_takes_the_seeds_dotted_path(broker):
    done = broker.relay("config", "set", "reliability.backpressure.maxMailboxSize=9")
    assert done.returncode == 0, done.stderr
    assert broker.client().get_config()["backpressure"]["maxMailboxSize"] == 9


def test_a_corrupt_rules_file_denies_until_fixed(broker):
    client = broker.client()
    info = client.register_endpoint(A)
    path = broker.home.access_rules_file
    path.write_text("[{not json")
    wait_for(
        lambda: "access-rules.json" in client.status()["fileErrors"],
        what="the corrupt rules file to be noticed",
    )
    denied = client.publish(A, 1, sender=SENDER)
    assert denied.rejected == ((info.hash, "access_denied"),)
    path.write_text(json.dumps([{"from": "relay.agent.bad", "to": ">", "action": "deny"}]))
    wait_for(
        lambda: "access-rules.json" not in client.status()["fileErrors"],
        what="the fixed file to be applied",
    )
    assert client.publish(A, 2, sender=SENDER).delivered_to == 1
    assert client.publish(A, 3, sender="relay.agent.bad").rejected == (
        (info.hash, "access_denied"),
    )
    assert [r.from_pattern for r in client.list_rules()] == ["relay.agent.bad"]


def test_a_restart_does_not_reapply_an_unchanged_file_over_later_changes(broker):
    client = broker.client()
    broker.home.access_rules_file.write_text(
        json.dumps([{"from": "relay.agent.bad", "to": ">", "action": "deny"}])
    )
    wait_for(lambda: len(client.list_rules()) == 1, what="the rules file to be applied")
    client.add_rule(AccessRule("relay.agent.worse", ">", RuleAction.DENY))
    broker.stop()
    broker.start()
    client = broker.client()
    assert sorted(r.from_pattern for r in client.list_rules()) == [
        "relay.agent.bad",
        "relay.agent.worse",
    ]
