"""The writer's reader of inotify events (workers/inotify_events.py), on a real watch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from inotify_simple import INotify
from inotify_simple import flags as iflags

from workers.inotify_events import READ_BYTES, read_events

MOVED_TO = int(iflags.MOVED_TO)


@pytest.fixture
def watched(tmp_path: Path):
    """(inotify, its watch descriptor on new/, tmp/, new/): a Maildir's two directories."""
    tmp, new = tmp_path / "tmp", tmp_path / "new"
    tmp.mkdir()
    new.mkdir()
    inotify = INotify(nonblocking=True)
    wd = inotify.add_watch(str(new), iflags.MOVED_TO | iflags.CLOSE_WRITE)
    yield inotify, wd, tmp, new
    inotify.close()


def drop(tmp: Path, new: Path, name: str) -> None:
    (tmp / name).write_bytes(b"{}")
    os.rename(tmp / name, new / name)


def test_renames_into_new_are_read_in_order_with_their_names(watched) -> None:
    inotify, wd, tmp, new = watched
    names = ["01JDQ3ZV9R6Q4W1T3M00000001", "a-longer-name-from-another-program.json", "é"]
    for name in names:
        drop(tmp, new, name)
    events = read_events(inotify.fileno())
    assert [(w, mask & MOVED_TO, name) for w, mask, name in events] == [
        (wd, MOVED_TO, name) for name in names
    ]


def test_nothing_queued_reads_nothing_and_does_not_block(watched) -> None:
    inotify, _wd, tmp, new = watched
    assert read_events(inotify.fileno()) == []
    drop(tmp, new, "one")
    assert len(read_events(inotify.fileno())) == 1
    assert read_events(inotify.fileno()) == []


def test_more_events_than_one_read_holds_are_all_read(watched) -> None:
    inotify, _wd, tmp, new = watched
    # 16 bytes of header and a name padded to 32: 48 bytes an event, three reads' worth.
    count = 3 * READ_BYTES // 48
    names = [f"{n:026d}" for n in range(count)]
    for name in names:
        drop(tmp, new, name)
    assert [name for _, _, name in read_events(inotify.fileno())] == names
