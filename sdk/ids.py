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
# The random part is kept as two 40-bit halves: compiled (sdk/compiled.py), each fits a
# machine word, where the 80-bit part and the 128-bit id are arbitrary-precision ints
# whose every shift allocates. The router names every message it stores.
_HALF_BITS = _RANDOM_BITS // 2
_HALF_MAX = (1 << _HALF_BITS) - 1
# Matched whole (`fullmatch`): with match, "$" also matched before a final newline.
ULID_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # the ULID alphabet
_DIGIT_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 digits


class MonotonicUlid:
    """A thread-safe generator of strictly increasing ULID strings."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._last_high = 0
        self._last_low = 0

    def new(self, now_ms: int | None = None) -> str:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            if ms <= self._last_ms:
                ms, high, low = following(self._last_ms, self._last_high, self._last_low)
            else:
                high, low = _fresh_random()
            self._last_ms, self._last_high, self._last_low = ms, high, low
        return _text(ms, high, low)


def following(ms: int, high: int, low: int) -> tuple[int, int, int]:
    """The id after (ms, high, low) within one millisecond: the random part plus one,
    carried from the low half into the high; past 80 bits (2^79 ids in one ms at
    least), the next millisecond with a fresh random part."""
    if low < _HALF_MAX:
        return ms, high, low + 1
    if high < _HALF_MAX:
        return ms, high + 1, 0
    return (ms + 1, *_fresh_random())


def _fresh_random() -> tuple[int, int]:
    """80 random bits as two halves, the top bit clear: room to increment within the
    millisecond."""
    data = os.urandom(10)
    return int.from_bytes(data[:5], "big") >> 1, int.from_bytes(data[5:], "big")


def ulid_text(value: int) -> str:
    """The 26 Crockford base32 digits of a 128-bit ULID: what ``str(ULID)`` gives."""
    return _text(value >> _RANDOM_BITS, (value >> _HALF_BITS) & _HALF_MAX, value & _HALF_MAX)


def _text(ms: int, high: int, low: int) -> str:
    """The ULID of a 48-bit time and two 40-bit random halves: two digits per lookup,
    five pairs for the time (two zero bits above its 48), four for each half."""
    pairs = _DIGIT_PAIRS
    return "".join(
        [
            pairs[(ms >> 40) & 1023],
            pairs[(ms >> 30) & 1023],
            pairs[(ms >> 20) & 1023],
            pairs[(ms >> 10) & 1023],
            pairs[ms & 1023],
            pairs[high >> 30],
            pairs[(high >> 20) & 1023],
            pairs[(high >> 10) & 1023],
            pairs[high & 1023],
            pairs[low >> 30],
            pairs[(low >> 20) & 1023],
            pairs[(low >> 10) & 1023],
            pairs[low & 1023],
        ]
    )


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
