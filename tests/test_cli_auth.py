"""`relay auth` edits auth.json: one case per subcommand, no broker needed (the running
router's reaction to the file is tests/test_security.py's)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from cli.main import main


def relay_auth(home, *args):
    return main(["--home", str(home), "auth", *args])


def auth_json(home) -> dict:
    return json.loads((home / "auth.json").read_text())


def test_allow_uid_writes_an_entry_and_lists_it(tmp_path, capsys):
    code = relay_auth(tmp_path, "allow-uid", "1001", "--sender", "relay.agent.b.>")
    assert code == 0
    assert auth_json(tmp_path) == {
        "uids": {"1001": {"name": "uid 1001", "senders": ["relay.agent.b.>"], "admin": False}},
        "keys": {},
    }
    out = capsys.readouterr().out
    assert "uid 1001" in out and "relay.agent.b.>" in out


def test_consume_and_admin_are_kept_and_a_name_given_wins(tmp_path):
    args = ("--sender", "a.b", "--consume", "a.>", "--admin", "--name", "ops")
    assert relay_auth(tmp_path, "allow-uid", "1002", *args) == 0
    entry = auth_json(tmp_path)["uids"]["1002"]
    assert entry == {"name": "ops", "senders": ["a.b"], "admin": True, "consumes": ["a.>"]}


def test_add_key_makes_a_certificate_and_add_token_a_token(tmp_path, capsys):
    assert relay_auth(tmp_path, "add-key", "agent", "--sender", "relay.agent.a.>") == 0
    assert (tmp_path / "keys" / "agent.key_secret").exists()
    assert "client certificate" in capsys.readouterr().out
    assert relay_auth(tmp_path, "add-token", "web", "--sender", "relay.web.>") == 0
    assert "bearer token (shown once" in capsys.readouterr().out
    keys = auth_json(tmp_path)["keys"]
    assert sorted(v["name"] for v in keys.values()) == ["agent", "web"]
    assert [len(v.get("tokens", [])) for v in keys.values()] == [0, 1]
    assert relay_auth(tmp_path, "add-key", "agent", "--sender", "x") == 2  # exists


def test_add_token_expires_and_list_shows_each_tokens_expiry_never_the_token(tmp_path, capsys):
    before = datetime.now(UTC)
    assert (
        relay_auth(tmp_path, "add-token", "web", "--sender", "relay.web.>", "--expires", "30d") == 0
    )
    token = capsys.readouterr().out.split("keeps its hash): ")[1].split()[0]
    assert relay_auth(tmp_path, "add-token", "cli", "--sender", "relay.cli.>") == 0
    capsys.readouterr()
    web = next(v for v in auth_json(tmp_path)["keys"].values() if v["name"] == "web")
    (grant,) = web["tokens"]
    expires = datetime.fromisoformat(grant["expires"])
    assert before + timedelta(days=30) - timedelta(seconds=1) <= expires
    assert expires <= datetime.now(UTC) + timedelta(days=30)

    assert relay_auth(tmp_path, "list") == 0
    listed = capsys.readouterr().out
    assert f"expires {grant['expires']}" in listed and "no expiry" in listed
    assert "relay.web.>" in listed
    assert token not in listed and grant["hash"] not in listed and "sha256" not in listed


def test_add_token_refuses_a_taken_name_and_a_bad_duration(tmp_path):
    assert relay_auth(tmp_path, "add-token", "web", "--sender", "relay.web.>") == 0
    assert relay_auth(tmp_path, "add-token", "web", "--sender", "relay.web.>") == 2
    assert relay_auth(tmp_path, "add-token", "w2", "--sender", "x", "--expires", "soon") == 2
    assert relay_auth(tmp_path, "add-key", "k", "--sender", "x", "--expires", "30d") == 2
    assert len(auth_json(tmp_path)["keys"]) == 1


def test_delegate_grants_the_right_to_act_for_token_identities(tmp_path, capsys):
    assert relay_auth(tmp_path, "add-key", "edge", "--sender", ">", "--delegate") == 0
    (entry,) = auth_json(tmp_path)["keys"].values()
    assert entry["delegate"] is True
    relay_auth(tmp_path, "list")
    assert "delegate" in capsys.readouterr().out


def test_remove_by_name_and_a_name_nobody_has(tmp_path):
    relay_auth(tmp_path, "allow-uid", "1001", "--sender", "a.b", "--name", "bob")
    assert relay_auth(tmp_path, "remove", "bob") == 0
    assert auth_json(tmp_path)["uids"] == {}
    assert relay_auth(tmp_path, "remove", "bob") == 1


def test_missing_arguments_and_list_change_nothing(tmp_path, capsys):
    assert relay_auth(tmp_path, "allow-uid", "--sender", "a.b") == 2  # no uid
    assert relay_auth(tmp_path, "allow-uid", "1001") == 2  # no --sender
    assert relay_auth(tmp_path) == 0  # list
    assert not (tmp_path / "auth.json").exists()
    assert "the broker's owner" in capsys.readouterr().out


def test_server_key_prints_the_key_and_leaves_auth_json_alone(tmp_path, capsys):
    assert relay_auth(tmp_path, "server-key") == 0
    assert (tmp_path / "keys").is_dir()
    assert not (tmp_path / "auth.json").exists()
    assert "server" in capsys.readouterr().out
