"""Message ids: monotonic ULIDs.

One id per message, used everywhere: the envelope's ``id``, the file name in the Maildir
and the index key. Ids from one generator strictly increase, even within one millisecond
and across a clock step backwards, so sorting ids sorts messages in the order the
generator issued them (FIFO per endpoint).
"""

from __future__ import annotations

import os
import re
import threading
import time

from ulid import ULID

from sdk.errors import InvalidMessage

_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1
# Matched whole (`fullmatch`): with match, "$" also matched before a final newline.
ULID_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # the ULID alphabet
_DIGIT_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 digits
_PAIR_SHIFTS = range(120, -1, -10)  # 13 pairs: the 26 digits of 130 bits


class MonotonicUlid:
    """A thread-safe generator of strictly increasing ULID strings."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._last_random = 0

    def new(self, now_ms: int | None = None) -> str:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            if ms <= self._last_ms:
                ms = self._last_ms
                random = self._last_random + 1
                if random > _RANDOM_MAX:  # 2^80 ids in one ms: move to the next ms
                    ms, random = ms + 1, int.from_bytes(os.urandom(10), "big") >> 1
            else:
                # Top bit clear leaves room to increment within the millisecond.
                random = int.from_bytes(os.urandom(10), "big") >> 1
            self._last_ms, self._last_random = ms, random
        return ulid_text((ms << _RANDOM_BITS) | random)


def ulid_text(value: int) -> str:
    """The 26 Crockford base32 digits of a 128-bit ULID: what ``str(ULID)`` gives, two
    digits per lookup (the router names every message it stores; python-ulid's encoder
    costs several times this)."""
    pairs = _DIGIT_PAIRS
    return "".join([pairs[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])


_default = MonotonicUlid()


def new_id(now_ms: int | None = None) -> str:
    """A new message id from the process-wide monotonic generator."""
    return _default.new(now_ms)


def is_id(value: object) -> bool:
    return isinstance(value, str) and ULID_RE.fullmatch(value) is not None


def check_id(value: object, field: str = "id") -> str:
    if not is_id(value):
        raise InvalidMessage(f"{field} must be a 26-character ULID, got {value!r:.60}")
    return value  # type: ignore[return-value]


def id_time_ms(message_id: str) -> int:
    """The millisecond timestamp an id carries."""
    return ULID.from_str(check_id(message_id)).milliseconds
