"""Watching the operator's files in the data directory: config.json, access-rules.json,
auth.json.

The router reads each at start and again whenever it is written (closed after writing,
or renamed into place, as editors do), through inotify on the data directory itself,
so a change takes effect within milliseconds without a restart. Parsing and validation
are the router's business; this module only says which files changed.
"""

from __future__ import annotations

from pathlib import Path

from inotify_simple import INotify
from inotify_simple import flags as iflags

CONFIG_FILE = "config.json"
RULES_FILE = "access-rules.json"
AUTH_FILE = "auth.json"
WATCHED = (CONFIG_FILE, RULES_FILE, AUTH_FILE)


class FileWatch:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._inotify = INotify()
        # Deletions too: a removed auth.json must stop admitting what it listed.
        mask = iflags.CLOSE_WRITE | iflags.MOVED_TO | iflags.DELETE | iflags.MOVED_FROM
        self._inotify.add_watch(str(directory), mask)

    def fileno(self) -> int:
        return self._inotify.fileno()

    def changed(self) -> set[str]:
        """The watched files written since the last call (non-blocking)."""
        return {e.name for e in self._inotify.read(timeout=0) if e.name in WATCHED}

    def close(self) -> None:
        self._inotify.close()
