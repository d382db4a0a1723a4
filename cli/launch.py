"""Commands that run in the foreground until stopped: `relay router`, `relay writer
--shard K --shards N` (one line each in the Procfile), `relay up` (the whole group with a
supervisor that restarts a crashed writer) and `relay ops` (the Spark jobs)."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time

from sdk.client import connect
from sdk.errors import RelayError
from sdk.paths import Home


def cmd_router(args: argparse.Namespace) -> int:
    from broker import router

    return router.main(
        Home(args.home), args.shards, address=args.address, signals_address=args.signals_address
    )


def cmd_writer(args: argparse.Namespace) -> int:
    from workers import writer

    return writer.main(Home(args.home), args.shard, args.shards)


def cmd_up(args: argparse.Namespace) -> int:
    """Run the router and N writers; restart a writer that dies; stop all on a signal."""
    home = Home(args.home).create()
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
                exit_code = code or 1
                stopping.set()
                break
            print(f"relay up: {name} exited with {code}; restarting it", file=sys.stderr)
            procs[name] = subprocess.Popen(commands[name])
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
            print(f"relay up: ready ({len(writers)} writers up)", flush=True)
            return


def cmd_ops(args: argparse.Namespace) -> int:
    from ops.cli import main as ops_main  # imports nothing of Spark until a job runs

    return ops_main(args.ops_args, home=args.home)
