"""Reading the events of the writer's inotify watches on its mailboxes' ``new/``.

Most events a writer reads are its own renames into ``new/``, read back and dropped
(workers/writer.py, ``_own_renames``): one per copy stored there, 27 a group commit at
100 in flight. inotify_simple's ``read`` asks the kernel how much is queued (an
``ioctl``) before reading it, decodes each name through ``os.fsdecode`` and builds a
named tuple per event; here the descriptor is non-blocking, one ``read`` takes what is
queued and each event is a plain tuple (docs/performance.md, "The writer's own work
per commit"). The layout is inotify(7)'s ``struct inotify_event``.
"""

from __future__ import annotations

import os
import struct

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (of the NUL-padded name)
READ_BYTES = 65536  # a read takes whole events only; what does not fit waits for the next

Event = tuple[int, int, str]  # (watch descriptor, mask, name: "" for the directory itself)


def read_events(fd: int) -> list[Event]:
    """Every event queued on the non-blocking inotify descriptor ``fd``, in order."""
    events: list[Event] = []
    unpack = _HEADER.unpack_from
    while True:
        try:
            data = os.read(fd, READ_BYTES)
        except BlockingIOError:
            return events
        offset, end = 0, len(data)
        while offset < end:
            wd, mask, _cookie, size = unpack(data, offset)
            offset += _HEADER.size
            name = data[offset : offset + size].rstrip(b"\0")
            offset += size
            events.append((wd, mask, name.decode(errors="surrogateescape")))
        if end < READ_BYTES // 2:  # a short read took everything queued: no second read
            return events
