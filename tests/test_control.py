"""broker.control: endpoints, rules and config in a real control.db under tmp_path."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import DEFAULT_CONFIG
from broker.control import MIGRATIONS, ControlPlane
from sdk.errors import InvalidConfig, InvalidMessage, InvalidSubject
from sdk.subjects import endpoint_hash
from sdk.types import AccessRule, EndpointInfo, RuleAction
from workers.sqlite import migrate, open_db, user_version

ALLOW, DENY = RuleAction.ALLOW, RuleAction.DENY
NOW = 1_764_108_000_000
BACKEND = "relay.agent.p.backend"
FRONTEND = "relay.agent.p.frontend"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def control(home: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(home / "control.db", home / "mailboxes")
    yield plane
    plane.close()


def reopen(control: ControlPlane, home: Path) -> ControlPlane:
    control.close()
    return ControlPlane(home / "control.db", home / "mailboxes")


# --- schema and files --------------------------------------------------------------------


def test_new_database_is_at_the_latest_schema_version(control: ControlPlane, home: Path) -> None:
    conn = open_db(home / "control.db", readonly=True)
    try:
        assert user_version(conn) == len(MIGRATIONS)
    finally:
        conn.close()


def test_database_files_are_private(control: ControlPlane, home: Path) -> None:
    control.register_endpoint(BACKEND, NOW)
    for path in home.glob("control.db*"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_closing_twice_is_harmless_and_use_after_close_fails(control: ControlPlane) -> None:
    control.close()
    control.close()
    with pytest.raises(RuntimeError, match="closed"):
        control.list_endpoints()


# --- endpoints -------------------------------------------------------------------------------


def test_register_endpoint_returns_its_info(control: ControlPlane, home: Path) -> None:
    info = control.register_endpoint(BACKEND, NOW)
    digest = endpoint_hash(BACKEND)
    assert info == EndpointInfo(BACKEND, digest, str(home / "mailboxes" / digest), NOW)
    assert control.get_endpoint(BACKEND) == info
    assert control.get_endpoint_by_hash(digest) == info


def test_an_endpoint_is_node_local_until_registered_shared(control: ControlPlane) -> None:
    assert not control.register_endpoint(BACKEND, NOW).shared
    shared = control.register_endpoint(BACKEND, NOW + 1, shared=True)
    assert shared.shared and shared.registered_at == NOW
    assert control.register_endpoint(BACKEND, NOW + 2).shared  # None: left as it is
    assert control.get_endpoint(BACKEND).shared
    assert not control.register_endpoint(BACKEND, NOW + 3, shared=False).shared
    assert not control.list_endpoints()[0].shared


def test_a_database_from_before_shared_endpoints_keeps_them_node_local(home: Path) -> None:
    conn = open_db(home / "control.db")
    migrate(conn, MIGRATIONS[:2])
    conn.execute(
        "INSERT INTO endpoints (subject, hash, maildir_path, registered_at) VALUES (?, ?, ?, ?)",
        (BACKEND, endpoint_hash(BACKEND), "/m", NOW),
    )
    conn.close()
    with ControlPlane(home / "control.db", home / "mailboxes") as plane:
        assert plane.get_endpoint(BACKEND).shared is False


def test_register_is_idempotent_and_keeps_the_first_registration(control: ControlPlane) -> None:
    first = control.register_endpoint(BACKEND, NOW)
    assert control.register_endpoint(BACKEND, NOW + 5000) == first
    assert control.list_endpoints() == [first]


def test_register_does_not_create_directories(control: ControlPlane, home: Path) -> None:
    info = control.register_endpoint(BACKEND, NOW)
    assert not os.path.exists(info.maildir_path)


@pytest.mark.parametrize("subject", ["relay.*", "relay.>", "relay..x", "", "a b"])
def test_register_refuses_patterns_and_bad_subjects(control: ControlPlane, subject: str) -> None:
    with pytest.raises(InvalidSubject):
        control.register_endpoint(subject, NOW)
    assert control.list_endpoints() == []


def test_unknown_endpoint_lookups_return_none(control: ControlPlane) -> None:
    assert control.get_endpoint(BACKEND) is None
    assert control.get_endpoint_by_hash("000000000000") is None
    assert control.unregister_endpoint(BACKEND) is False


def test_unregister_removes_the_row_and_leaves_the_mailbox_alone(control: ControlPlane) -> None:
    info = control.register_endpoint(BACKEND, NOW)
    mailbox = Path(info.maildir_path)
    for sub in ("tmp", "new", "cur", "failed"):
        (mailbox / sub).mkdir(parents=True)
    (mailbox / "new" / "01JD0000000000000000000000").write_bytes(b"{}")
    (mailbox / "failed" / "01JD0000000000000000000001").write_bytes(b"{}")

    assert control.unregister_endpoint(BACKEND) is True

    assert control.get_endpoint(BACKEND) is None
    assert (mailbox / "new" / "01JD0000000000000000000000").read_bytes() == b"{}"
    assert (mailbox / "failed" / "01JD0000000000000000000001").read_bytes() == b"{}"


def test_reregistering_after_unregister_gets_the_same_mailbox(control: ControlPlane) -> None:
    first = control.register_endpoint(BACKEND, NOW)
    control.unregister_endpoint(BACKEND)
    second = control.register_endpoint(BACKEND, NOW + 1)
    assert second.maildir_path == first.maildir_path
    assert second.registered_at == NOW + 1


def test_list_endpoints_is_sorted_by_subject(control: ControlPlane) -> None:
    for subject in ("relay.c", "relay.a", "relay.b"):
        control.register_endpoint(subject, NOW)
    assert [e.subject for e in control.list_endpoints()] == ["relay.a", "relay.b", "relay.c"]


def test_a_hash_collision_is_refused(control: ControlPlane, home: Path) -> None:
    # Forge a row that owns BACKEND's hash under another subject.
    conn = open_db(home / "control.db")
    conn.execute(
        "INSERT INTO endpoints VALUES (?, ?, ?, ?, 0)",
        ("relay.forged", endpoint_hash(BACKEND), "x", 1),
    )
    conn.close()
    with pytest.raises(InvalidSubject, match="same endpoint hash"):
        control.register_endpoint(BACKEND, NOW)


# --- rules -----------------------------------------------------------------------------------


def test_rules_crud_and_evaluation_order(control: ControlPlane) -> None:
    low = AccessRule(">", ">", DENY, 0)
    high = AccessRule(FRONTEND, BACKEND, ALLOW, 10)
    mid1 = AccessRule("relay.agent.>", "relay.agent.*.x", DENY, 5)
    mid2 = AccessRule("relay.human.>", ">", ALLOW, 5)
    for rule in (low, mid1, high, mid2):
        assert control.add_rule(rule) == rule
    assert control.list_rules() == [high, mid1, mid2, low]

    assert control.remove_rule("relay.agent.>", "relay.agent.*.x") is True
    assert control.remove_rule("relay.agent.>", "relay.agent.*.x") is False
    assert control.list_rules() == [high, mid2, low]


def test_adding_the_same_from_to_replaces_in_place(control: ControlPlane) -> None:
    first = AccessRule("a.>", ">", DENY, 1)
    second = AccessRule("b.>", ">", DENY, 1)
    control.add_rule(first)
    control.add_rule(second)
    replaced = AccessRule("a.>", ">", ALLOW, 1)
    control.add_rule(replaced)
    assert control.list_rules() == [replaced, second]  # kept its place among equals
    control.add_rule(AccessRule("a.>", ">", ALLOW, 0))
    assert control.list_rules() == [second, AccessRule("a.>", ">", ALLOW, 0)]


def test_add_rule_validates_like_the_wire(control: ControlPlane) -> None:
    with pytest.raises(InvalidSubject, match=r"rule\.from"):
        control.add_rule(AccessRule("a.>.b", ">", DENY))
    with pytest.raises(InvalidMessage, match=r"rule\.action"):
        control.add_rule(AccessRule("a", "b", "maybe"))  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match=r"rule\.priority"):
        control.add_rule(AccessRule("a", "b", DENY, True))
    assert control.list_rules() == []


def test_add_rule_accepts_a_wire_dict(control: ControlPlane) -> None:
    rule = control.add_rule({"from": "a.*", "to": "b", "action": "deny"})
    assert rule == AccessRule("a.*", "b", DENY, 0)
    assert control.list_rules() == [rule]


def test_replace_rules_swaps_the_whole_set(control: ControlPlane) -> None:
    control.add_rule(AccessRule("old", ">", DENY))
    new = [
        AccessRule("x", ">", DENY, 0),
        {"from": "y", "to": ">", "action": "allow", "priority": 3},
        AccessRule("x", ">", ALLOW, 0),  # later duplicate replaces the first in place
    ]
    assert control.replace_rules(new) == [
        AccessRule("y", ">", ALLOW, 3),
        AccessRule("x", ">", ALLOW, 0),
    ]


def test_replace_rules_with_an_invalid_rule_changes_nothing(control: ControlPlane) -> None:
    kept = control.add_rule(AccessRule("old", ">", DENY))
    with pytest.raises(InvalidSubject):
        control.replace_rules([AccessRule("x", ">", DENY), AccessRule("bad..", ">", DENY)])
    assert control.list_rules() == [kept]


# --- config ----------------------------------------------------------------------------------


def test_config_defaults(control: ControlPlane) -> None:
    config = control.get_config()
    assert config == DEFAULT_CONFIG
    assert config["limits"] == {
        "maxPayloadBytes": 1_048_576,
        "maxSubscriptionsPerClient": 256,
        "defaultCredit": 64,
        "maxCredit": 1024,
    }
    assert config["rateLimit"]["maxPerWindow"] == 100
    assert config["rateLimit"]["windowSecs"] == 60
    assert config["circuitBreaker"]["failureThreshold"] == 5
    assert config["circuitBreaker"]["cooldownMs"] == 30_000
    assert config["circuitBreaker"]["halfOpenProbeCount"] == 1
    assert config["circuitBreaker"]["successToClose"] == 2
    assert config["backpressure"] == {
        "enabled": True,
        "maxMailboxSize": 1000,
        "pressureWarningAt": 0.8,
    }


def test_get_config_returns_a_copy(control: ControlPlane) -> None:
    control.get_config()["rateLimit"]["perSenderOverrides"]["x"] = 1
    assert control.get_config()["rateLimit"]["perSenderOverrides"] == {}
    assert DEFAULT_CONFIG["rateLimit"]["perSenderOverrides"] == {}


def test_set_config_deep_merges(control: ControlPlane) -> None:
    result = control.set_config({"rateLimit": {"maxPerWindow": 500}})
    assert result["rateLimit"]["maxPerWindow"] == 500
    assert result["rateLimit"]["windowSecs"] == 60  # siblings keep their values
    result = control.set_config({"backpressure": {"pressureWarningAt": 1}, "rateLimit": {}})
    assert result["rateLimit"]["maxPerWindow"] == 500  # earlier settings stay
    assert result["backpressure"]["pressureWarningAt"] == 1.0
    assert control.get_config() == result


def test_per_sender_overrides_are_replaced_whole(control: ControlPlane) -> None:
    control.set_config({"rateLimit": {"perSenderOverrides": {"relay.agent.": 500}}})
    result = control.set_config({"rateLimit": {"perSenderOverrides": {"relay.human.": 50}}})
    assert result["rateLimit"]["perSenderOverrides"] == {"relay.human.": 50}


INVALID_CONFIGS = {
    "not-object": ([1], "config must be an object"),
    "unknown-section": ({"ratelimit": {}}, "unknown config key 'ratelimit'"),
    "unknown-key": ({"rateLimit": {"max": 1}}, "unknown config key 'rateLimit.max'"),
    "section-not-object": ({"limits": 5}, "config key 'limits' must be an object"),
    "str-for-int": ({"rateLimit": {"maxPerWindow": "10"}}, "rateLimit.maxPerWindow must be an int"),
    "bool-for-int": ({"limits": {"maxCredit": True}}, "limits.maxCredit must be an int"),
    "float-for-int": (
        {"limits": {"maxPayloadBytes": 1.5}},
        "limits.maxPayloadBytes must be an int",
    ),
    "cooldown-too-short": (
        {"circuitBreaker": {"cooldownMs": 999}},
        "circuitBreaker.cooldownMs must be an int >= 1000, got 999",
    ),
    "zero-probes": (
        {"circuitBreaker": {"halfOpenProbeCount": 0}},
        "circuitBreaker.halfOpenProbeCount must be an int >= 1",
    ),
    "int-for-bool": (
        {"backpressure": {"enabled": 1}},
        "backpressure.enabled must be true or false",
    ),
    "ratio-too-big": (
        {"backpressure": {"pressureWarningAt": 1.5}},
        "backpressure.pressureWarningAt must be a number from 0 to 1",
    ),
    "ratio-nan": (
        {"backpressure": {"pressureWarningAt": float("nan")}},
        "backpressure.pressureWarningAt must be a number from 0 to 1",
    ),
    "overrides-not-object": (
        {"rateLimit": {"perSenderOverrides": ["relay."]}},
        "rateLimit.perSenderOverrides must be an object",
    ),
    "override-negative": (
        {"rateLimit": {"perSenderOverrides": {"relay.": -1}}},
        "rateLimit.perSenderOverrides['relay.'] must be an int >= 0",
    ),
    "override-empty-prefix": (
        {"rateLimit": {"perSenderOverrides": {"": 5}}},
        "rateLimit.perSenderOverrides keys must be non-empty",
    ),
    "credit-over-max": (
        {"limits": {"defaultCredit": 2000}},
        "limits.defaultCredit (2000) must not exceed limits.maxCredit (1024)",
    ),
    "reliability-not-object": (
        {"reliability": 5},
        "config key 'reliability' must be an object",
    ),
    "reliability-unknown-section": (
        {"reliability": {"limits": {"maxCredit": 10}}},
        "unknown config key 'reliability.limits'; known: rateLimit, circuitBreaker, backpressure",
    ),
    "reliability-bad-value": (
        {"reliability": {"backpressure": {"maxMailboxSize": -1}}},
        "reliability.backpressure.maxMailboxSize must be an int >= 0",
    ),
    "both-layouts-for-one-section": (
        {"backpressure": {"enabled": True}, "reliability": {"backpressure": {"enabled": False}}},
        "config key 'backpressure' is given twice, at the top and as 'reliability.backpressure'",
    ),
}


@pytest.mark.parametrize(
    ("partial", "expected"), INVALID_CONFIGS.values(), ids=INVALID_CONFIGS.keys()
)
def test_set_config_refuses_invalid_values_and_changes_nothing(
    control: ControlPlane, partial: Any, expected: str
) -> None:
    with pytest.raises(InvalidConfig) as err:
        # A valid setting alongside: all of it or none of it is applied.
        control.set_config(
            {"rateLimit": {"windowSecs": 5}, **partial} if isinstance(partial, dict) else partial
        )
    assert expected in str(err.value)
    assert err.value.code == "invalid_config"
    assert control.get_config() == DEFAULT_CONFIG


def test_maximum_mailbox_size_zero_is_allowed(control: ControlPlane) -> None:
    assert (
        control.set_config({"backpressure": {"maxMailboxSize": 0}})["backpressure"][
            "maxMailboxSize"
        ]
        == 0
    )


def test_replace_config_resets_what_it_leaves_out(control: ControlPlane) -> None:
    control.set_config(
        {"rateLimit": {"maxPerWindow": 7}, "limits": {"maxCredit": 10, "defaultCredit": 5}}
    )
    result = control.replace_config({"backpressure": {"enabled": False}})
    assert result["rateLimit"]["maxPerWindow"] == 100
    assert result["limits"] == DEFAULT_CONFIG["limits"]
    assert result["backpressure"]["enabled"] is False
    assert control.get_config() == result


# The seeds' config.json nests the three reliability sections under "reliability".
SEEDS_CONFIG = {
    "reliability": {
        "rateLimit": {"maxPerWindow": 20, "perSenderOverrides": {"relay.agent.": 50}},
        "circuitBreaker": {"failureThreshold": 3, "cooldownMs": 5000},
        "backpressure": {"maxMailboxSize": 200, "pressureWarningAt": 0.5},
    },
    "limits": {"defaultCredit": 8},  # a section only the flat layout has, alongside
}


@pytest.mark.parametrize("change", ["replace_config", "set_config"])
def test_the_seeds_reliability_layout_is_accepted_and_read_back_flat(
    control: ControlPlane, change: str
) -> None:
    result = getattr(control, change)(SEEDS_CONFIG)
    assert "reliability" not in result
    assert result["rateLimit"]["maxPerWindow"] == 20
    assert result["rateLimit"]["perSenderOverrides"] == {"relay.agent.": 50}
    assert result["rateLimit"]["windowSecs"] == 60  # left out: default
    assert result["circuitBreaker"]["failureThreshold"] == 3
    assert result["circuitBreaker"]["cooldownMs"] == 5000
    assert result["backpressure"]["maxMailboxSize"] == 200
    assert result["backpressure"]["pressureWarningAt"] == 0.5
    assert result["limits"]["defaultCredit"] == 8
    assert control.get_config() == result


def test_replace_config_that_is_invalid_changes_nothing(control: ControlPlane) -> None:
    control.set_config({"rateLimit": {"maxPerWindow": 7}})
    with pytest.raises(InvalidConfig):
        control.replace_config({"rateLimit": {"maxPerWindow": -1}})
    assert control.get_config()["rateLimit"]["maxPerWindow"] == 7


# --- persistence ------------------------------------------------------------------------------


def test_reopening_keeps_everything(control: ControlPlane, home: Path) -> None:
    endpoint = control.register_endpoint(BACKEND, NOW)
    rules = [AccessRule(FRONTEND, BACKEND, ALLOW, 2), AccessRule(">", BACKEND, DENY, 1)]
    control.replace_rules(rules)
    config = control.set_config({"circuitBreaker": {"failureThreshold": 9}})

    control = reopen(control, home)
    try:
        assert control.list_endpoints() == [endpoint]
        assert control.list_rules() == rules
        assert control.get_config() == config
        assert control.register_endpoint(BACKEND, NOW + 1) == endpoint
    finally:
        control.close()


def test_a_clean_close_leaves_one_file(control: ControlPlane, home: Path) -> None:
    control.register_endpoint(BACKEND, NOW)
    control.close()
    assert not (home / "control.db-wal").exists() or (home / "control.db-wal").stat().st_size == 0
