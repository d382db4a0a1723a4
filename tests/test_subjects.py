"""The subject grammar: validation edge cases and NATS matching semantics."""

from __future__ import annotations

import hashlib

import pytest

from sdk.errors import InvalidSubject
from sdk.subjects import (
    MAX_SUBJECT_BYTES,
    MAX_TOKENS,
    covers,
    endpoint_hash,
    has_wildcards,
    is_valid,
    literal_prefix,
    matches,
    tokens,
    validate,
)

# (subject, wildcards allowed)
VALID = [
    pytest.param("foo", False, id="one-token"),
    pytest.param("relay.agent.myproject.backend", False, id="four-tokens"),
    pytest.param("A-b_9.Z", False, id="all-token-chars"),
    pytest.param("1.2.3", False, id="digits-only"),
    pytest.param(".".join(["t"] * MAX_TOKENS), False, id="max-tokens"),
    pytest.param("x" * MAX_SUBJECT_BYTES, False, id="max-bytes"),
    pytest.param("foo.*", True, id="star-last"),
    pytest.param("*.bar", True, id="star-first"),
    pytest.param("*", True, id="star-alone"),
    pytest.param(">", True, id="gt-alone"),
    pytest.param("foo.>", True, id="gt-last"),
    pytest.param("*.*.east.>", True, id="stars-and-gt"),
    pytest.param("foo.bar", True, id="literal-as-pattern"),
    pytest.param(".".join(["*"] * (MAX_TOKENS - 1) + [">"]), True, id="max-tokens-pattern"),
]

# (subject, wildcards allowed, fragments the message must contain)
INVALID = [
    pytest.param("", False, ["empty"], id="empty"),
    pytest.param("foo..bar", False, ["token 2", "empty", "two dots"], id="double-dot"),
    pytest.param(".foo", False, ["token 1", "empty", "leading dot"], id="leading-dot"),
    pytest.param("foo.", False, ["token 2", "empty", "trailing dot"], id="trailing-dot"),
    pytest.param(".", False, ["token 1", "empty"], id="only-dot"),
    pytest.param("foo bar", False, ["whitespace", "' '", "token 1"], id="space"),
    pytest.param("foo.b\tr", False, ["whitespace", "'\\t'", "token 2"], id="tab"),
    pytest.param("foo.bar\n", False, ["whitespace", "'\\n'", "token 2"], id="trailing-newline"),
    pytest.param(" ", False, ["whitespace", "token 1"], id="only-space"),
    pytest.param("foo.b@r", False, ["'@'", "token 2"], id="at-sign"),
    pytest.param("foo.bär", False, ["'ä'", "token 2"], id="non-ascii"),
    pytest.param("a.b.c/d", False, ["'/'", "token 3"], id="slash"),
    pytest.param("foo*", True, ["'*'", "inside token 1", "whole tokens"], id="star-in-token"),
    pytest.param("foo.*bar", True, ["'*'", "inside token 2"], id="star-prefixing-token"),
    pytest.param(">bar", True, ["'>'", "inside token 1"], id="gt-in-token"),
    pytest.param("foo.>>", True, ["'>'", "inside token 2"], id="double-gt"),
    pytest.param("foo.**", True, ["'*'", "inside token 2"], id="double-star"),
    pytest.param("foo.>.bar", True, ["'>'", "last token", "token 2 of 3"], id="gt-not-last"),
    pytest.param(">.bar", True, ["'>'", "last token", "token 1 of 2"], id="gt-first"),
    pytest.param("foo.*", False, ["'*'", "token 2", "not allowed"], id="star-when-concrete"),
    pytest.param("foo.>", False, ["'>'", "token 2", "not allowed"], id="gt-when-concrete"),
    pytest.param(">", False, ["'>'", "token 1", "not allowed"], id="gt-alone-when-concrete"),
    pytest.param(
        ".".join(["t"] * (MAX_TOKENS + 1)), False, ["17 tokens", "16"], id="too-many-tokens"
    ),
    pytest.param("x" * (MAX_SUBJECT_BYTES + 1), False, ["257 bytes", "256"], id="too-long"),
    pytest.param("é" * 200, False, ["400 bytes", "256"], id="too-long-in-bytes-not-chars"),
]


@pytest.mark.parametrize(("subject", "wildcards"), VALID)
def test_valid_subjects_are_returned_unchanged(subject: str, wildcards: bool) -> None:
    assert validate(subject, wildcards=wildcards) == subject
    assert is_valid(subject, wildcards=wildcards)


@pytest.mark.parametrize(("subject", "wildcards", "fragments"), INVALID)
def test_invalid_subjects_are_rejected_saying_what_and_where(
    subject: str, wildcards: bool, fragments: list[str]
) -> None:
    with pytest.raises(InvalidSubject) as caught:
        validate(subject, wildcards=wildcards)
    assert caught.value.code == "invalid_subject"
    for fragment in fragments:
        assert fragment in str(caught.value)
    assert not is_valid(subject, wildcards=wildcards)


@pytest.mark.parametrize(
    "subject",
    [
        pytest.param(None, id="none"),
        pytest.param(b"foo", id="bytes"),
        pytest.param(42, id="int"),
        pytest.param(["foo"], id="unhashable-list"),
    ],
)
def test_a_non_string_subject_is_rejected_not_crashed_on(subject: object) -> None:
    with pytest.raises(InvalidSubject, match="must be a string"):
        validate(subject)
    assert not is_valid(subject)


def test_a_10_mb_subject_is_rejected_by_its_length() -> None:
    huge = "a" * (10 * 1024 * 1024)
    with pytest.raises(InvalidSubject, match=r"10485760 bytes, over the 256-byte limit"):
        validate(huge)
    with pytest.raises(InvalidSubject, match="256-byte limit"):
        validate("é" * (10 * 1024 * 1024), wildcards=True)


def test_the_same_invalid_subject_fails_the_same_way_twice() -> None:
    """Cached diagnoses still raise; the cache never turns an error into success."""
    for _ in range(2):
        with pytest.raises(InvalidSubject, match="token 2"):
            validate("a..b")


# (subject, pattern, expected): NATS semantics, after nats-server's sublist tests.
MATCHING = [
    pytest.param("foo.bar", "foo.*", True, id="star-takes-one-token"),
    pytest.param("foo.bar.baz", "foo.*", False, id="star-not-two-tokens"),
    pytest.param("foo", "foo.*", False, id="star-not-zero-tokens"),
    pytest.param("foo.bar", "foo.>", True, id="gt-takes-one-token"),
    pytest.param("foo.bar.baz", "foo.>", True, id="gt-takes-many-tokens"),
    pytest.param("foo", "foo.>", False, id="gt-not-zero-tokens"),
    pytest.param("time.us.east.nyc", "*.*.east.>", True, id="stars-then-gt"),
    pytest.param("time.us.west.nyc", "*.*.east.>", False, id="stars-then-gt-literal-differs"),
    pytest.param("time.us.east", "*.*.east.>", False, id="stars-then-gt-nothing-left"),
    pytest.param("Foo.bar", "foo.bar", False, id="case-sensitive-literal"),
    pytest.param("foo.Bar", "foo.bar", False, id="case-sensitive-second-token"),
    pytest.param("FOO.bar", "foo.>", False, id="case-sensitive-before-gt"),
    pytest.param("foo", ">", True, id="gt-alone-one-token"),
    pytest.param("a.b.c.d.e", ">", True, id="gt-alone-many-tokens"),
    pytest.param("foo", "*", True, id="star-alone-one-token"),
    pytest.param("foo.bar", "*", False, id="star-alone-not-two-tokens"),
    pytest.param("foo.bar", "foo.bar", True, id="literal-equal"),
    pytest.param("foo.bar", "foo.baz", False, id="literal-differs"),
    pytest.param("foo.bar", "foo", False, id="literal-prefix-is-not-a-match"),
    pytest.param("foo", "foo.bar", False, id="literal-longer-pattern"),
    pytest.param("stats.test.22", "stats.*.*", True, id="two-stars"),
    pytest.param("stats.test", "stats.test.*", False, id="star-past-the-end"),
    pytest.param("stats.test.foos", "stats.*.*.foos", False, id="pattern-longer-with-stars"),
    pytest.param("foo.barn", "foo.bar", False, id="token-prefix-is-not-a-match"),
]


@pytest.mark.parametrize(("subject", "pattern", "expected"), MATCHING)
def test_matches_follows_nats_semantics(subject: str, pattern: str, expected: bool) -> None:
    assert matches(subject, pattern) is expected


@pytest.mark.parametrize(("subject", "pattern", "expected"), MATCHING)
def test_covers_is_matches_for_a_concrete_subject(subject: str, pattern: str, expected: bool):
    assert covers(pattern, subject) is expected


@pytest.mark.parametrize(
    ("pattern", "narrower", "expected"),
    [
        pytest.param("a.>", "a.*", True, id="gt-covers-star"),
        pytest.param("a.>", "a.b.>", True, id="gt-covers-deeper-gt"),
        pytest.param("a.>", "a.>", True, id="gt-covers-itself"),
        pytest.param(">", "*.x.>", True, id="gt-alone-covers-all"),
        pytest.param("a.*", "a.*", True, id="star-covers-star"),
        pytest.param("a.*.c", "a.b.c", True, id="star-covers-a-literal"),
        pytest.param("a.*", "a.>", False, id="star-not-gt"),
        pytest.param("a.b", "a.*", False, id="literal-not-star"),
        pytest.param("a.b.>", "a.>", False, id="deeper-gt-not-shallower"),
        pytest.param("a.>", "a", False, id="gt-needs-a-token"),
        pytest.param("a.*", "a.b.c", False, id="star-one-token-only"),
        pytest.param("*.b", "a.*", False, id="literal-where-narrower-has-star"),
    ],
)
def test_covers_says_whether_every_subject_of_one_pattern_matches_another(
    pattern: str, narrower: str, expected: bool
) -> None:
    assert covers(pattern, narrower) is expected


@pytest.mark.parametrize(
    ("subject", "pattern"),
    [
        pytest.param("foo.*", "foo.*", id="wildcard-subject"),
        pytest.param("foo..bar", ">", id="invalid-subject"),
        pytest.param("foo.bar", "foo.>.bar", id="invalid-pattern"),
    ],
)
def test_matches_rejects_invalid_input(subject: str, pattern: str) -> None:
    with pytest.raises(InvalidSubject):
        matches(subject, pattern)


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [
        pytest.param("relay.agent.*.x", "relay.agent.", id="star-in-middle"),
        pytest.param("foo.bar", "foo.bar", id="literal-is-its-own-prefix"),
        pytest.param("foo.>", "foo.", id="gt-last"),
        pytest.param("*", "", id="star-alone"),
        pytest.param(">", "", id="gt-alone"),
        pytest.param("*.bar", "", id="star-first"),
        pytest.param("a.b.*.c.>", "a.b.", id="stops-at-first-wildcard"),
    ],
)
def test_literal_prefix_stops_before_the_first_wildcard(pattern: str, prefix: str) -> None:
    assert literal_prefix(pattern) == prefix


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        pytest.param("foo.bar", False, id="literal"),
        pytest.param("foo.*", True, id="star"),
        pytest.param("foo.>", True, id="gt"),
    ],
)
def test_has_wildcards_sees_wildcard_tokens(pattern: str, expected: bool) -> None:
    assert has_wildcards(pattern) is expected


def test_has_wildcards_rejects_wildcard_characters_inside_a_token() -> None:
    with pytest.raises(InvalidSubject, match="inside token 1"):
        has_wildcards("foo*")


def test_tokens_splits_on_dots() -> None:
    assert tokens("relay.agent.*.>") == ["relay", "agent", "*", ">"]
    with pytest.raises(InvalidSubject):
        tokens("a..b")


def test_endpoint_hash_is_the_first_12_hex_chars_of_sha256() -> None:
    subject = "relay.agent.myproject.backend"
    assert endpoint_hash(subject) == hashlib.sha256(subject.encode()).hexdigest()[:12]
    assert len(endpoint_hash("foo")) == 12
    assert endpoint_hash("foo") != endpoint_hash("Foo")


def test_endpoint_hash_requires_a_concrete_subject() -> None:
    with pytest.raises(InvalidSubject):
        endpoint_hash("relay.agent.*")
