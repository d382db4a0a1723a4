"""What operator commands print: a table for people, or JSON when `--json` is given.

People read times as local ISO date-times (`when`) and, where it helps, ages (`ago`:
"claimed 3 min ago"); JSON keeps the unix milliseconds the broker answers with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    """Print ``data`` as JSON with `--json`, else as ``human(data)``."""
    print(json.dumps(data, indent=2, default=str) if args.json else human(data))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def when(ms: int | None, *, precise: bool = False) -> str:
    """A unix-ms time as a local ISO date-time, to the millisecond when ``precise``
    (a trace, where the steps are milliseconds apart); "" for None."""
    if ms is None:
        return ""
    at = datetime.fromtimestamp(ms / 1000)
    return at.isoformat(sep=" ", timespec="milliseconds" if precise else "seconds")


def ago(ms: int | None, now: int) -> str:
    """How long before ``now`` (both unix ms) ``ms`` was, rounded down: "12 s ago",
    "3 min ago", "5 h ago", "2 days ago"; "just now" under a second; "" for None."""
    if ms is None:
        return ""
    seconds = (now - ms) // 1000
    if seconds < 1:
        return "just now"
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if unit == 'day' and count > 1 else ''} ago"
    return f"{seconds} s ago"


def when_ago(ms: int | None, now: int) -> str:
    """`when`, then `ago` in brackets: "2026-05-09 07:35:25 (3 min ago)"."""
    return "" if ms is None else f"{when(ms)} ({ago(ms, now)})"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """Left-aligned columns under ``header``; "(none)" under it when there are no rows."""
    cells = [[str(c) for c in header], *[[("" if c is None else str(c)) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) if rows else "\n".join(lines[:1]) + "\n(none)"


PIPE_CLOSED = 128 + 13  # the status of a process SIGPIPE ended, as `cat` would have


def pipe_closed() -> int:
    """The reader of our output went away (`relay endpoints | head -3`): end quietly.
    What is still buffered goes to /dev/null, so that flushing it at exit raises no
    second BrokenPipeError; returns the exit status to use."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return PIPE_CLOSED
