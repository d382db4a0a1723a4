"""The paths of one mailbox, as the modules that move its files see them.

`Mailbox` (workers/maildir.py) hands its `MailboxPaths` to the dead letters
(workers/dead_letters.py) and to recovery (workers/recovery.py): they need where the
files are, not the mailbox itself, so they do not import workers/maildir.py and the
storage modules import each other in one direction only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MailboxPaths:
    """``endpoint`` is the mailbox's hash (or ``_unroutable``); each ``*_dir`` is a path
    string (``mailboxes/<hash>/tmp``, ...), as the storage code passes them to ``os``."""

    endpoint: str
    tmp_dir: str
    new_dir: str
    cur_dir: str
    failed_dir: str
