"""Message ids: the ULID text the router writes is the ULID library's, and ids increase."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from ulid import ULID

from sdk.ids import MonotonicUlid, following, id_time_ms, is_id, ulid_text

HALF = 2**40 - 1
# A half of the random part: its carries are at the edges, which plain draws rarely hit.
halves = st.sampled_from([0, HALF - 1, HALF]) | st.integers(min_value=0, max_value=HALF)


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_ulid_text_is_the_ulid_librarys_text_of_the_same_128_bits(value):
    assert ulid_text(value) == str(ULID.from_bytes(value.to_bytes(16, "big")))


def test_ids_of_one_millisecond_strictly_increase_and_carry_it():
    ids = MonotonicUlid()
    issued = [ids.new(1_764_108_000_000) for _ in range(1000)]
    assert issued == sorted(set(issued))
    assert all(is_id(i) and id_time_ms(i) == 1_764_108_000_000 for i in issued)


@given(st.integers(min_value=0, max_value=2**48 - 1), halves, halves)
def test_the_id_after_another_in_its_millisecond_is_one_more(ms, high, low):
    value = (ms << 80) | (high << 40) | low
    after_ms, after_high, after_low = following(ms, high, low)
    after = (after_ms << 80) | (after_high << 40) | after_low
    if (high, low) == (HALF, HALF):  # the random part is spent: the next millisecond
        assert after_ms == ms + 1
    else:
        assert after == value + 1
    assert ulid_text(after) > ulid_text(value)


@given(st.text(alphabet="0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcz\n\x00é-", max_size=30))
def test_is_id_accepts_exactly_26_upper_case_crockford_digits(text):
    crockford = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    assert is_id(text) == (len(text) == 26 and set(text) <= crockford)


def test_an_id_with_a_trailing_newline_is_not_an_id():
    # a regex's "$" matches before a final newline; an id becomes a file name
    assert not is_id("01KB0000000000000000000000\n")
    assert is_id("01KB0000000000000000000000")
