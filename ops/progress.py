"""Progress of a job on a terminal: stage, rows, elapsed time.

On a terminal the line is rewritten in place (at most 10 times a second); otherwise
(a log, a pipe) one line is printed per stage, with its final counts, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.started = time.monotonic()
        self._stage = ""
        self._last = 0.0
        self._width = 0
        self._pending = ""  # not a terminal: the current stage's latest line

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def update(self, stage: str, rows: int | None = None, note: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        changed = stage != self._stage
        if self.tty and not changed and now - self._last < 0.1:
            return
        line = f"[{self.elapsed:7.1f} s] {stage:<12}"
        if rows is not None:
            line += f" {rows:>12,} rows"
        if note:
            line += f"  {note}"
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
            self.stream.flush()
        else:
            if changed and self._pending:
                self.stream.write(self._pending + "\n")
                self.stream.flush()
            self._pending = line
        self._stage, self._last = stage, now

    def done(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
        elif self._pending:
            self.stream.write(self._pending + "\n")
        self.stream.flush()
        self._width, self._pending, self._stage = 0, "", ""
