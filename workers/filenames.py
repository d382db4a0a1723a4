"""Message file names and what they say (docs/architecture.md, "File names and
states"): ``<id>[,C=<claimed ms>][,N=<deliveries>][,D=<done ms>][:2,<flags>]``, the
state a name means in its directory, how many times the copy was handed to a consumer,
and which state wins when one id has several files.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from sdk.errors import InvalidMessage
from sdk.ids import is_id
from workers.records import State


class FileName(NamedTuple):
    """A parsed message file name. ``flags`` is None when the name has no ``:2,`` part."""

    id: str
    claimed_at: int | None = None
    done_at: int | None = None
    flags: str | None = None
    deliveries: int | None = None  # the ,N= field: None when the name has none


_FIELD_RE = re.compile(r"^([A-Za-z]+)=(\d+)$")


def parse_name(name: str) -> FileName:
    """Split ``<id>[,K=V...][:2,<flags>]`` into its parts; InvalidMessage if it is not one.

    Fields other than C= (claimed ms), N= (deliveries) and D= (done ms) are kept out of
    the result but accepted, so a Dovecot-style ``,S=<size>`` written by another tool
    does not hide a file.
    """
    if len(name) == 26:  # the common case, new/<id> and failed/<id>
        if is_id(name):
            return FileName(name)
        raise InvalidMessage(f"file name {name!r} is not a message id")
    base, sep, flags = name.partition(":2,")
    if not sep and ":" in name:
        raise InvalidMessage(f"file name {name!r} has an unknown info part")
    message_id, *fields = base.split(",")
    if not is_id(message_id):
        raise InvalidMessage(f"file name {name!r} does not start with a message id")
    claimed_at = done_at = deliveries = None
    for field in fields:
        match = _FIELD_RE.match(field)
        if match is None:
            raise InvalidMessage(f"file name {name!r} has a malformed field {field!r}")
        key, value = match.group(1), int(match.group(2))
        if key == "C":
            claimed_at = value
        elif key == "D":
            done_at = value
        elif key == "N":
            deliveries = value
    return FileName(message_id, claimed_at, done_at, flags if sep else None, deliveries)


def format_name(
    message_id: str,
    claimed_at: int | None = None,
    done_at: int | None = None,
    flags: str | None = None,
    deliveries: int | None = None,
) -> str:
    """The inverse of `parse_name` (for the fields Relay writes). ``N=`` is written only
    from the second hand-out on: a file in cur/ without it was handed out once, so the
    common case keeps the name every other Maildir reader knows."""
    name = message_id
    if claimed_at is not None:
        name += f",C={claimed_at}"
    if deliveries is not None and deliveries >= 2:
        name += f",N={deliveries}"
    if done_at is not None:
        name += f",D={done_at}"
    if flags is not None:
        name += ":2," + flags
    return name


def place_of(
    state: State,
    message_id: str,
    claimed_at: int | None = None,
    done_at: int | None = None,
    deliveries: int = 0,
) -> tuple[str, str]:
    """(subdir, name) of the file an index row describes: a reader that has the row
    opens the file at once, without listing cur/ (which grows with history)."""
    if state is State.NEW:
        return "new", message_id
    if state is State.FAILED:
        return "failed", message_id
    if state is State.DONE:
        return "cur", format_name(message_id, claimed_at, done_at, "S", deliveries)
    return "cur", format_name(message_id, claimed_at, None, "", deliveries)


def state_of(subdir: str, parsed: FileName) -> State:
    """The state of a file named ``parsed`` in ``subdir`` ("new", "cur" or "failed")."""
    if subdir == "new":
        return State.NEW
    if subdir == "failed":
        return State.FAILED
    return State.DONE if parsed.flags and "S" in parsed.flags else State.CLAIMED


def deliveries_of(
    subdir: str, parsed: FileName, dead_letter: Mapping[str, Any] | None = None
) -> int:
    """How many times the copy in ``subdir`` named ``parsed`` was handed to a consumer.

    new/: 0 (never, or put back before anyone received it). cur/: the name's ``N=``,
    else 1 (a file reaches cur/ by being handed out; N is written from the second time
    on). failed/: ``deliveries`` of the file's ``deadLetter`` (``dead_letter``), else 0.
    """
    if subdir == "new":
        return 0
    if subdir == "failed":
        count = None if dead_letter is None else dead_letter.get("deliveries")
        return count if type(count) is int and count >= 0 else 0
    return 1 if parsed.deliveries is None else parsed.deliveries


# Precedence when one id has several files (a crash inside fail, or a power cut that
# undid half a rename): keep the most advanced state.
STATE_RANK = {State.NEW: 0, State.CLAIMED: 1, State.DONE: 2, State.FAILED: 3}
