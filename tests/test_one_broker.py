"""One broker per data directory: the locks in run/ (workers/locks.py), and the
processes they refuse, through real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ops.removal import running_processes
from sdk.paths import Home
from tests.harness import ROOT, Broker, wait_for
from workers import locks
from workers.process import LOCKED

A = "relay.agent.one.a"
SENDER = "relay.agent.one.cli"


# ------------------------------------------------------------------ the locks alone


def test_a_lock_taken_twice_is_refused_naming_its_holder(tmp_path):
    home = Home(tmp_path / "h")
    with locks.take(home, "router", 2):
        with pytest.raises(locks.DirectoryLocked, match=f"router \\(pid {os.getpid()}\\)"):
            locks.take(home, "router", 2)
        assert locks.holders(home) == {"router": locks.Holder("router", os.getpid(), 2)}
    assert locks.holders(home) == {}
    locks.take(home, "router", 2).release()  # released: free again


def test_a_process_for_another_shard_count_may_not_join(tmp_path):
    home = Home(tmp_path / "h")
    with locks.take(home, "router", 2), locks.take(home, "writer-0", 2):
        with pytest.raises(locks.DirectoryLocked, match="served with 2 shards"):
            locks.take(home, "writer-2", 3)
        assert sorted(locks.holders(home)) == ["router", "writer-0"]


def test_alone_refuses_while_any_process_of_the_directory_runs(tmp_path):
    home = Home(tmp_path / "h")
    with (
        locks.take(home, "writer-1", 2),
        pytest.raises(locks.DirectoryLocked, match="writer-1"),
    ):
        locks.take(home, "up", 2, alone=True)


def test_lock_files_are_owner_only_whatever_they_were(tmp_path):
    home = Home(tmp_path / "h").create()
    path = locks.lock_file(home, "router")
    path.write_text("{}")
    path.chmod(0o644)
    with locks.take(home, "router", 1):
        assert path.stat().st_mode & 0o777 == 0o600


# ------------------------------------------------------------------ real processes


def relay(home: Home, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli", "--home", str(home.root), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sockets(home: Home) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in home.run.glob("*.sock")}


@pytest.mark.integration
def test_a_second_router_is_refused_and_touches_nothing_of_the_first(broker):
    before = sockets(broker.home)
    second = broker.relay("router", "--shards", "2")
    assert second.returncode == LOCKED
    assert f"pid {broker.procs['router'].pid}" in second.stderr
    assert sockets(broker.home) == before  # not rebound, not removed
    client = broker.client()
    client.register_endpoint(A)
    assert client.publish(A, 1, sender=SENDER).delivered_to == 1


@pytest.mark.integration
def test_a_second_writer_for_a_served_shard_is_refused(broker):
    second = broker.relay("writer", "--shard", "0", "--shards", "2")
    assert second.returncode == LOCKED
    assert f"writer-0 (pid {broker.procs['writer0'].pid})" in second.stderr
    other_count = broker.relay("writer", "--shard", "2", "--shards", "3")
    assert other_count.returncode == LOCKED
    assert "served with 2 shards" in other_count.stderr
    assert "replaces" not in broker.log("router")
    assert running_processes(broker.home) == {
        "router": broker.procs["router"].pid,
        "writer-0": broker.procs["writer0"].pid,
        "writer-1": broker.procs["writer1"].pid,
    }


@pytest.mark.integration
def test_a_router_killed_with_sigkill_leaves_nothing_that_stops_the_next():
    broker = Broker(shards=1).start()
    try:
        broker.kill("router", signal.SIGKILL)
        assert "router" not in running_processes(broker.home)
        broker.start_router()
        broker.wait_ready()
        assert broker.client().status()["router"]["pid"] == broker.procs["router"].pid
    finally:
        broker.cleanup()


def start_up(home: Home) -> subprocess.Popen:
    """`relay up` in the foreground, returned once it says ready."""
    up = subprocess.Popen(
        [sys.executable, "-m", "cli", "--home", str(home.root), "up", "--shards", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = ""
    while not line.startswith("relay up: ready"):
        line = up.stdout.readline()
        assert line, "relay up ended without saying ready"
    return up


@pytest.mark.integration
def test_relay_up_twice_the_second_is_refused_and_the_first_keeps_serving(tmp_path):
    home = Home(tmp_path / "h")
    first = start_up(home)
    try:
        second = relay(home, "up", "--shards", "2")
        assert second.returncode == LOCKED
        assert f"up (pid {first.pid})" in second.stderr
        assert relay(home, "endpoints", "register", A).returncode == 0
        published = relay(home, "publish", A, "hi", "--from", SENDER)
        assert published.returncode == 0, published.stderr
        assert "delivered to 1" in published.stdout
    finally:
        first.terminate()
        assert first.wait(20) == 0  # the router's code: it was asked to stop
    wait_for(lambda: not locks.holders(home), what="every lock to be released")


# ------------------------------------------------------------------ up --detach, down


@pytest.mark.integration
def test_up_detach_returns_once_ready_and_down_returns_once_all_is_gone(tmp_path):
    home = Home(tmp_path / "h")
    up = relay(home, "up", "--detach", "--shards", "2", timeout=90)
    try:
        assert up.returncode == 0, up.stderr
        assert "ready" in up.stdout and str(home.root / "logs" / "up.log") in up.stdout
        status = relay(home, "status", "--json")  # ready means served, at once
        assert status.returncode == 0, status.stderr
        assert status.stdout.count('"state": "up"') == 2
        assert sorted(locks.holders(home)) == ["router", "up", "writer-0", "writer-1"]
        again = relay(home, "up", "--detach")
        assert again.returncode == LOCKED and "served already" in again.stderr
        assert "relay up: ready" in (home.root / "logs" / "up.log").read_text()
    finally:
        down = relay(home, "down")
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    assert locks.holders(home) == {}  # every process gone when it returns
    assert list(home.run.glob("*.sock")) == []


@pytest.mark.integration
def test_down_stops_a_broker_started_process_by_process(broker):
    down = broker.relay("down")
    assert down.returncode == 0, down.stderr
    assert {name: proc.wait(10) for name, proc in broker.procs.items()} == {
        "router": 0,
        "writer0": 0,
        "writer1": 0,
    }
    assert list(broker.home.run.glob("*.sock")) == []


@pytest.mark.integration
def test_down_after_kill_9_removes_the_sockets_left_behind(broker):
    for name in ("router", "writer0", "writer1"):
        broker.kill(name, signal.SIGKILL)
    assert list(broker.home.run.glob("*.sock"))  # libzmq leaves them to whoever binds next
    down = broker.relay("down")
    assert down.returncode == 0, down.stderr
    assert "no broker runs" in down.stdout and "removed 5 stale socket files" in down.stdout
    assert list(broker.home.run.glob("*.sock")) == []


@pytest.mark.integration
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGKILL, 128 + 9)])
def test_relay_up_exits_with_the_routers_code(tmp_path, sig, code):
    home = Home(tmp_path / "h")
    up = start_up(home)
    try:
        os.kill(locks.holders(home)["router"].pid, sig)
        assert up.wait(30) == code
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
