"""The `relay` command as a newcomer meets it: what it says with no broker, where
--home goes, exit codes, pipes, and output people can read."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from cli.output import PIPE_CLOSED, ago, when, when_ago
from sdk.paths import Home
from tests.harness import ROOT, depth, wait_for

pytestmark = pytest.mark.integration

A = "relay.agent.cli.a"
SENDER = "relay.agent.cli.me"


def relay(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# Each with a --timeout far beyond the test's own: an answer at all means "at once".
OPERATOR_COMMANDS = [
    ["status"],
    ["endpoints"],
    ["endpoints", "register", A],
    ["publish", A, "hi", "--from", SENDER],
    ["subscribe", A],
    ["trace", "01JD0000000000000000000000"],
    ["dlq"],
    ["pending", A],
    ["rules"],
    ["config"],
    ["signals", A],
    ["rebuild-index"],
]


@pytest.mark.parametrize("command", OPERATOR_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_with_no_broker_every_operator_command_fails_at_once_saying_how_to_start_one(
    tmp_path, command
):
    home = Home(tmp_path / "h").create()
    result = relay("--home", str(home.root), *command, "--timeout", "600")
    assert result.returncode == 1
    assert "no broker runs on" in result.stderr
    assert f"relay --home {home.root} up" in result.stderr


def test_a_socket_file_nobody_listens_on_is_no_broker(tmp_path):
    home = Home(tmp_path / "h").create()
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(home.run / "router.sock"))  # what a broker killed with -9 leaves
    left.close()
    result = relay("--home", str(home.root), "status", "--timeout", "600")
    assert result.returncode == 1
    assert "nothing listens on" in result.stderr and "up" in result.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_home_is_taken_before_or_after_the_command(tmp_path, where):
    home = Home(tmp_path / "h").create()
    home_args = ["--home", str(home.root)]
    args = [*home_args, "down"] if where == "before" else ["down", *home_args]
    result = relay(*args)
    assert result.returncode == 0, result.stderr
    assert f"no broker runs on {home.root}" in result.stdout


def test_publish_to_no_endpoint_and_trace_of_no_message_exit_non_zero(broker):
    nowhere = broker.relay("publish", "relay.agent.cli.nobody", "hi", "--from", SENDER)
    assert nowhere.returncode == 1
    assert "reached no endpoint: no_match (no matching endpoints)" in nowhere.stderr
    assert "delivered to 0" in nowhere.stdout  # the id is still said: it is a dead letter
    as_json = broker.relay("publish", "relay.agent.cli.nobody", "hi", "--from", SENDER, "--json")
    assert as_json.returncode == 1 and '"deliveredTo": 0' in as_json.stdout
    assert broker.relay("endpoints", "register", A).returncode == 0
    somewhere = broker.relay("publish", A, "hi", "--from", SENDER)
    assert somewhere.returncode == 0, somewhere.stderr
    message_id = somewhere.stdout.split(":")[0]
    assert broker.relay("trace", message_id).returncode == 0
    unknown = broker.relay("trace", "01JD0000000000000000000000")
    assert unknown.returncode == 1 and "no copy found" in unknown.stdout


def test_subscribe_count_takes_exactly_that_many_from_a_backlog(broker):
    client = broker.client()
    client.register_endpoint(A)
    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(5)]
    taken = broker.relay("subscribe", A, "--count", "2")
    assert taken.returncode == 0, taken.stderr
    assert [line.split()[0] for line in taken.stdout.splitlines()] == ids[:2]
    assert client.pending(A) == []  # nothing more claimed, nothing left unacknowledged
    assert depth(client, A) == 3
    wait_for(
        lambda: [c["state"] for i in ids[:2] for c in client.trace(i)["copies"]] == ["done"] * 2,
        what="the two acks to be done",
    )


def run_into_closed_pipe(broker, *args: str) -> tuple[int, str]:
    """Run a command whose stdout is a pipe nobody reads any more (`| head` that has
    exited): the read end is closed before the command can write."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "--home", str(broker.home.root), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    try:
        return proc.wait(30), proc.stderr.read()
    finally:
        proc.stderr.close()


def test_output_into_a_closed_pipe_ends_quietly(broker):
    client = broker.client()
    client.register_endpoint(A)
    code, err = run_into_closed_pipe(broker, "endpoints")
    assert (code, err) == (PIPE_CLOSED, "")
    message_id = client.publish(A, 1, sender=SENDER).message_id
    code, err = run_into_closed_pipe(broker, "subscribe", A, "--count", "1")
    assert (code, err) == (PIPE_CLOSED, "")
    # Not shown, so neither acknowledged nor made a dead letter.
    assert client.dead_letters() == []
    assert client.trace(message_id)["copies"][0]["state"] in ("new", "claimed")


def test_config_get_prints_one_key_and_set_prints_what_changed(broker):
    one = broker.relay("config", "get", "rateLimit.maxPerWindow")
    assert (one.returncode, one.stdout) == (0, "100\n"), one.stderr
    seeds = broker.relay("config", "get", "reliability.rateLimit.maxPerWindow")
    assert seeds.stdout == "100\n"
    section = broker.relay("config", "get", "budget")
    assert section.stdout.splitlines() == [
        "budget.maxHops = 16",
        "budget.maxTtlMs = 86400000",
        "budget.maxCallBudget = 100",
    ]
    unknown = broker.relay("config", "get", "rateLimit.nope")
    assert unknown.returncode == 1 and "no setting 'rateLimit.nope'" in unknown.stderr
    changed = broker.relay(
        "config", "set", "rateLimit.maxPerWindow=500", "circuitBreaker.enabled=true"
    )
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout == "rateLimit.maxPerWindow: 100 -> 500\n"  # enabled was true
    again = broker.relay("config", "set", "rateLimit.maxPerWindow=500")
    assert again.stdout.startswith("nothing changed")


# ------------------------------------------------------------------ times for people

ISO = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("before_ms", "said"),
    [
        (None, ""),
        (400, "just now"),
        (12_000, "12 s ago"),
        (3 * 60_000 + 59_000, "3 min ago"),
        (5 * 3_600_000, "5 h ago"),
        (86_400_000, "1 day ago"),
        (3 * 86_400_000, "3 days ago"),
    ],
)
def test_ages_are_said_in_the_largest_whole_unit(before_ms, said):
    now = 1_800_000_000_000
    assert ago(None if before_ms is None else now - before_ms, now) == said


def test_times_are_local_iso_date_times(utc):
    assert when(1_800_000_000_123) == "2027-01-15 08:00:00"
    assert when(1_800_000_000_123, precise=True) == "2027-01-15 08:00:00.123"
    assert when_ago(1_800_000_000_123, 1_800_000_180_123) == "2027-01-15 08:00:00 (3 min ago)"


def test_people_read_dates_ages_and_pressure_scripts_read_ms(broker):
    client = broker.client()
    client.register_endpoint(A)
    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(6)]
    client.publish("relay.agent.cli.nobody", 1, sender=SENDER)
    status = broker.relay("status").stdout
    assert re.search(rf"started {ISO} \(", status), status
    assert re.search(rf"{A} .* 6 +0 +- +0\.6% ", status), status  # 6 of 1,000: not "1%"
    letters = broker.relay("dlq").stdout
    assert "FAILED" in letters.splitlines()[0]
    assert re.search(rf"{ISO} \((just now|\d+ s ago)\) +_unroutable", letters), letters
    as_json = json.loads(broker.relay("dlq", "--json").stdout)
    assert isinstance(as_json[0]["finishedAt"], int)
    release = threading.Event()
    client.subscribe(A, lambda _e: release.wait(30), credit=1)  # holds the first
    try:
        wait_for(lambda: client.pending(A), what="a message to be claimed")
        pending = broker.relay("pending", A).stdout
        assert re.search(rf"{ids[0]} +{SENDER} +{ISO} \(.*\) +1$", pending, re.M), pending
    finally:
        release.set()
    trace = broker.relay("trace", ids[0]).stdout
    assert re.search(rf"{ISO}\.\d{{3}} +{ISO}\.\d{{3}}", trace), trace
    copy = json.loads(broker.relay("trace", ids[0], "--json").stdout)["copies"][0]
    assert isinstance(copy["createdAt"], int) and isinstance(copy["storedAt"], int)


def test_a_trace_never_stores_before_it_creates_and_a_nack_says_when_it_was_claimed(broker):
    client = broker.client()
    client.register_endpoint(A)
    ids = [client.publish(A, i, sender=SENDER).message_id for i in range(40)]
    copies = [client.trace(i)["copies"][0] for i in ids]
    # With createdAt from time.time() and storedAt the file's (coarser) mtime, about
    # three in five were stored 1-5 ms before they were created.
    assert [c for c in copies if c["storedAt"] < c["createdAt"]] == []

    def refuse(_envelope):
        raise ValueError("not for me")

    client.subscribe(A, refuse)
    wait_for(
        lambda: all(client.trace(i)["copies"][0]["state"] == "failed" for i in ids),
        what="every copy nacked",
    )
    for message_id in ids:
        copy = client.trace(message_id)["copies"][0]
        assert copy["claimedAt"] is not None, copy
        assert copy["createdAt"] <= copy["storedAt"] <= copy["claimedAt"] <= copy["finishedAt"]
    before = [client.trace(i) for i in ids]
    client.rebuild_index()  # the claim time is in the dead letter's file, not only the index
    assert [client.trace(i) for i in ids] == before


def test_a_handlers_nack_is_no_warning_in_the_clients_log(broker, caplog):
    client = broker.client()
    client.register_endpoint(A)
    client.publish(A, 1, sender=SENDER)

    def refuse(_envelope):
        raise ValueError("not for me")

    with caplog.at_level(logging.INFO, logger="relay.client"):
        client.subscribe(A, refuse)
        wait_for(lambda: client.dead_letters(), what="the nack's dead letter")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "nacked" in r.getMessage()]
    assert [level for level, _ in said] == [logging.INFO], said
    assert "ValueError('not for me')" in said[0][1]
