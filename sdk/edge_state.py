"""What an edge process says about itself, for `relay status`: one small JSON file per
process under ``run/`` (``run/http-<pid>.json`` for `relay http`).

An edge that cannot do its job (the HTTP gateway whose address is taken) stays up and
retries rather than exit, because under honcho one process that exits stops the whole
broker. It writes here what it is doing, and the router's `status` reads every such
file, so `relay status`, ``GET /api/status`` and the SDK's ``status()`` all show it.

A file, not a message to the router, because an edge must be able to say "I cannot
work" before, or without, a connection to the router, and because a file is gone or
stale in ways a reader can tell: the edge removes its file when it stops, and a
reader ignores a file whose process no longer runs (killed with -9). Files are
written whole (`write_private`: temporary file, rename), so a reader never sees half.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sdk.paths import Home, write_private

LISTENING = "listening"
RETRYING = "retrying"  # cannot bind its address; retrying with backoff


@dataclass(frozen=True, slots=True)
class EdgeState:
    """One edge process: what it is (``kind``: ``http``), which address it serves,
    and whether it does; ``error`` and ``retryAt`` (unix ms) while it retries."""

    kind: str
    pid: int
    address: str
    state: str
    since: int  # unix ms: when it entered this state
    error: str | None = None
    retry_at: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pid": self.pid,
            "address": self.address,
            "state": self.state,
            "since": self.since,
            "error": self.error,
            "retryAt": self.retry_at,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> EdgeState:
        return cls(
            kind=str(d["kind"]),
            pid=int(d["pid"]),
            address=str(d["address"]),
            state=str(d["state"]),
            since=int(d["since"]),
            error=d.get("error"),
            retry_at=d.get("retryAt"),
        )


def describe(wire: dict[str, Any]) -> str:
    """One line for people (`relay status`), from a state's wire form."""
    since = datetime.fromtimestamp(wire["since"] / 1000).isoformat(sep=" ", timespec="seconds")
    head = f"{wire['kind']} pid {wire['pid']}"
    if wire["state"] == LISTENING:
        return f"{head}: listening on {wire['address']} since {since}"
    return (
        f"{head}: CANNOT BIND {wire['address']} ({wire.get('error') or '?'}) since {since}; "
        f"{wire['state']}"
    )


def state_file(home: Home, kind: str, pid: int) -> Path:
    return home.run / f"{kind}-{pid}.json"


def write(home: Home, state: EdgeState) -> None:
    write_private(state_file(home, state.kind, state.pid), json.dumps(state.to_wire()))


def remove(home: Home, kind: str, pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_file(home, kind, pid).unlink()


def pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def read_all(home: Home, runs: Callable[[int], bool] = pid_runs) -> list[EdgeState]:
    """The states of the edge processes that still run, by kind and pid. A file that
    does not parse (not one of ours) or whose pid is gone is left out."""
    found: list[EdgeState] = []
    for path in sorted(home.run.glob("*-*.json")):
        try:
            state = EdgeState.from_wire(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if path.name == f"{state.kind}-{state.pid}.json" and runs(state.pid):
            found.append(state)
    return sorted(found, key=lambda s: (s.kind, s.pid))


def forget_dead(home: Home, kind: str, runs: Callable[[int], bool] = pid_runs) -> None:
    """Remove the files of ``kind`` left by processes that no longer run (killed -9)."""
    for path in home.run.glob(f"{kind}-*.json"):
        pid = path.stem.removeprefix(f"{kind}-")
        if pid.isdigit() and not runs(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
