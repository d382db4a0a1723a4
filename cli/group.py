"""The whole broker of one data directory: `relay up` (the router and N writers, in the
foreground or, with --detach, in the background) and `relay down` (stop it).

One broker per data directory (workers/locks.py): `relay up` holds ``run/up.lock`` and
refuses to start while any process of the directory holds its lock; each child takes
its own. `relay down` finds the broker through those locks, whoever started it (`relay
up`, honcho, a supervisor of your own).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sdk.client import connect
from sdk.errors import RelayError
from sdk.paths import Home
from workers import locks
from workers.process import LOCKED

RESTART_GAP_S = 1.0  # a writer that keeps dying at start-up is restarted once a second
READY_LINE = "relay up: ready"
DOWN_GRACE_S = 5.0  # after --timeout, SIGKILL; then this long for the kernel to reap


def cmd_up(args: argparse.Namespace) -> int:
    if args.detach:
        return _detach(args)
    return _run_group(args)


def _run_group(args: argparse.Namespace) -> int:
    """Run the router and N writers; restart a writer that dies; stop all on a signal.
    Exits with the router's code (0 when it was asked to stop)."""
    home = Home(args.home)
    try:
        lock = locks.take(home, "up", args.shards, alone=True)
    except locks.DirectoryLocked as exc:
        print(f"relay up: {exc}", file=sys.stderr)
        return LOCKED
    _held.append(lock)  # released by the kernel when this process ends, not before
    return _supervise(home, args)


_held: list[locks.Lock] = []


def _supervise(home: Home, args: argparse.Namespace) -> int:
    base = [sys.executable, "-m", "cli", "--home", str(home.root)]
    router_cmd = [*base, "router", "--shards", str(args.shards)]
    if args.address:
        router_cmd += ["--address", args.address]
    if args.signals_address:
        router_cmd += ["--signals-address", args.signals_address]
    commands = {"router": router_cmd} | {
        f"writer.{k}": [*base, "writer", "--shard", str(k), "--shards", str(args.shards)]
        for k in range(args.shards)
    }
    procs = {name: subprocess.Popen(cmd) for name, cmd in commands.items()}
    started = dict.fromkeys(procs, time.monotonic())
    stopping = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"relay up: home {home.root}, {args.shards} shards, pids "
        + ", ".join(f"{n}={p.pid}" for n, p in procs.items()),
        flush=True,
    )
    threading.Thread(
        target=_say_ready, args=(home, args.address, stopping), name="ready", daemon=True
    ).start()
    exit_code = 0
    while not stopping.wait(0.2):
        for name, proc in procs.items():
            code = proc.poll()
            if code is None:
                continue
            if name == "router":
                print(f"relay up: router exited with {code}; stopping", file=sys.stderr)
                exit_code = code if code >= 0 else 128 - code  # killed: as a shell says it
                stopping.set()
                break
            if time.monotonic() - started[name] < RESTART_GAP_S:
                continue  # dead at start-up (refused, a bad disk): not at fork speed
            print(f"relay up: {name} exited with {code}; restarting it", file=sys.stderr)
            procs[name] = subprocess.Popen(commands[name])
            started[name] = time.monotonic()
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in procs.values():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return exit_code


def _say_ready(home: Home, address: str | None, stopping: threading.Event) -> None:
    """Print "ready" once the router answers and every writer has said hello to it: a
    script that waits for that line can publish at once."""
    while not stopping.wait(0.1):
        try:
            with connect(home.root, address=address, timeout=1.0) as client:
                writers = client.status()["writers"]
        except RelayError:
            continue
        if all(w.get("state") == "up" for w in writers):
            print(f"{READY_LINE} ({len(writers)} writers up)", flush=True)
            return


def log_file(home: Home) -> Path:
    """Where `relay up --detach` writes the group's output (appended to)."""
    return home.root / "logs" / "up.log"


def _detach(args: argparse.Namespace) -> int:
    """Start `relay up` in a session of its own, its output in `log_file`; return once
    it says ready (0), or with its exit code if it ends first."""
    home = Home(args.home).create()
    running = locks.holders(home)
    if running:
        names = ", ".join(str(h) for h in running.values())
        print(f"relay up: {home.root} is served already: {names}", file=sys.stderr)
        return LOCKED
    log = log_file(home)
    log.parent.mkdir(mode=0o700, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "cli",
        "--home",
        str(home.root),
        "up",
        "--shards",
        str(args.shards),
    ]
    if args.address:
        cmd += ["--address", args.address]
    if args.signals_address:
        cmd += ["--signals-address", args.signals_address]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    start = os.fstat(fd).st_size
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no terminal's hangup or Ctrl-C reaches it
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    finally:
        os.close(fd)
    deadline = time.monotonic() + args.wait
    while True:
        code = proc.poll()
        text = _read_from(log, start)
        if READY_LINE in text:
            print(f"relay up: ready, pid {proc.pid}, home {home.root}; log {log}")
            return 0
        if code is not None:
            tail = "\n".join(text.splitlines()[-20:])
            print(f"relay up: the broker exited with {code}; {log} says:\n{tail}", file=sys.stderr)
            return code or 1
        if time.monotonic() > deadline:
            print(
                f"relay up: not ready after {args.wait:g} s (pid {proc.pid} keeps starting; "
                f"see {log}, stop it with `relay down`)",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.05)


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the broker of a data directory, whoever started it; return when each of its
    processes has exited and run/ holds no socket."""
    home = Home(args.home)
    found = locks.holders(home)
    # `relay up` stops its children itself (and would restart a writer stopped under it).
    targets = [found["up"]] if "up" in found else list(found.values())
    for holder in targets:
        _signal(holder.pid, signal.SIGTERM)
    left = _wait_gone(home, args.timeout)
    if left:
        names = ", ".join(str(h) for h in left.values())
        print(
            f"relay down: still running after {args.timeout:g} s: {names}; killing", file=sys.stderr
        )
        for holder in left.values():
            _signal(holder.pid, signal.SIGKILL)
        left = _wait_gone(home, DOWN_GRACE_S)
        if left:
            names = ", ".join(str(h) for h in left.values())
            print(f"relay down: could not stop {names}", file=sys.stderr)
            return 1
    removed = _remove_sockets(home)
    if not found:
        print(f"relay down: no broker runs on {home.root}" + (f" ({removed})" if removed else ""))
    else:
        names = ", ".join(str(h) for h in found.values())
        print(f"relay down: stopped {names}" + (f"; {removed}" if removed else ""))
    return 0


def _signal(pid: int, sig: int) -> None:
    if pid > 0:  # 0 would signal our own process group
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(home: Home, timeout: float) -> dict[str, locks.Holder]:
    deadline = time.monotonic() + timeout
    while (left := locks.holders(home)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def _remove_sockets(home: Home) -> str:
    """Socket files no process owns any more (a router killed with -9 leaves them),
    removed while no broker process can start."""
    if not home.run.is_dir():
        return ""
    with locks.quiet(home) as held:
        if held:
            return ""
        stale = sorted(home.run.glob("*.sock"))
        for path in stale:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return f"removed {len(stale)} stale socket files" if stale else ""
