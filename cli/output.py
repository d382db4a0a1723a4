"""What operator commands print: a table for people, or JSON when `--json` is given."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    """Print ``data`` as JSON with `--json`, else as ``human(data)``."""
    print(json.dumps(data, indent=2, default=str) if args.json else human(data))


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
