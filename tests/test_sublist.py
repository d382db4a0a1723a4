"""The subject trie: insert/remove/match/reverse_match, its cache, and a property test
holding it (cached and uncached) to the reference matcher `sdk.subjects.matches`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.sublist import Sublist
from sdk.errors import InvalidSubject
from sdk.subjects import matches


@pytest.fixture(params=[1024, 0], ids=["cached", "uncached"])
def sublist(request: pytest.FixtureRequest) -> Sublist[str]:
    return Sublist(cache_size=request.param)


def test_literal_wildcard_and_full_wildcard_patterns_all_match(sublist: Sublist[str]) -> None:
    # Given a literal, a "*" and a ">" pattern that all cover a.b.c.d
    sublist.insert("a.b.c.d", "literal")
    sublist.insert("a.b.*.d", "star")
    sublist.insert("a.b.>", "gt")
    sublist.insert("a.x.>", "elsewhere")
    # Then a match on a.b.c.d returns the three of them, and no other
    assert sublist.match("a.b.c.d") == {"literal", "star", "gt"}
    assert sublist.match("a.b.z.d") == {"star", "gt"}
    assert sublist.match("a.b") == frozenset()
    assert sublist.match("q") == frozenset()
    assert len(sublist) == 4


def test_one_pattern_can_hold_several_values_and_a_repeat_is_stored_once(
    sublist: Sublist[str],
) -> None:
    sublist.insert("foo.*", "one")
    sublist.insert("foo.*", "two")
    sublist.insert("foo.*", "one")
    assert len(sublist) == 2
    assert sublist.match("foo.bar") == {"one", "two"}


def test_remove_reports_whether_the_entry_existed(sublist: Sublist[str]) -> None:
    sublist.insert("foo.bar", "v")
    assert sublist.remove("foo.bar", "other") is False
    assert sublist.remove("foo.baz", "v") is False
    assert sublist.remove("foo.bar.baz", "v") is False
    assert sublist.remove("foo.bar", "v") is True
    assert sublist.remove("foo.bar", "v") is False
    assert len(sublist) == 0


def test_remove_prunes_nodes_left_empty(sublist: Sublist[str]) -> None:
    sublist.insert("a.b.c.d", "deep")
    sublist.insert("a.b", "shallow")
    sublist.insert("a.*.>", "wild")
    for pattern, value in [("a.b.c.d", "deep"), ("a.*.>", "wild"), ("a.b", "shallow")]:
        assert sublist.remove(pattern, value)
    assert len(sublist) == 0
    assert sublist.patterns() == []
    assert sublist._root.is_empty()


def test_remove_keeps_nodes_other_patterns_still_use(sublist: Sublist[str]) -> None:
    sublist.insert("a.b.c", "long")
    sublist.insert("a.b", "short")
    assert sublist.remove("a.b.c", "long")
    assert sublist.match("a.b") == {"short"}
    assert sublist.patterns() == ["a.b"]


def test_patterns_lists_each_distinct_pattern_once(sublist: Sublist[str]) -> None:
    for pattern in ["relay.agent.p.x", "relay.agent.*.x", "relay.>", "*"]:
        sublist.insert(pattern, "v1")
        sublist.insert(pattern, "v2")
    assert sublist.patterns() == sorted(["relay.agent.p.x", "relay.agent.*.x", "relay.>", "*"])
    assert len(sublist) == 8


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        pytest.param("insert", "foo..bar", id="insert-empty-token"),
        pytest.param("insert", "foo.>.bar", id="insert-gt-not-last"),
        pytest.param("remove", "foo*", id="remove-star-in-token"),
        pytest.param("match", "foo.*", id="match-a-wildcard-subject"),
        pytest.param("match", "x" * 10_000, id="match-too-long"),
        pytest.param("reverse_match", "a..b", id="reverse-match-empty-token"),
    ],
)
def test_invalid_subjects_are_rejected(sublist: Sublist[str], call: str, argument: str) -> None:
    method = getattr(sublist, call)
    with pytest.raises(InvalidSubject):
        if call in ("insert", "remove"):
            method(argument, "v")
        else:
            method(argument)


def test_a_cached_result_gains_a_matching_pattern_inserted_later() -> None:
    # Given a cached match result for foo.bar
    sublist: Sublist[str] = Sublist(cache_size=16)
    sublist.insert("foo.bar", "literal")
    assert sublist.match("foo.bar") == {"literal"}
    assert sublist.cache_count() == 1
    # When patterns covering foo.bar are inserted
    sublist.insert("foo.*", "star")
    sublist.insert(">", "gt")
    # Then the next match sees them
    assert sublist.match("foo.bar") == {"literal", "star", "gt"}


def test_a_cached_result_loses_a_matching_pattern_removed_later() -> None:
    sublist: Sublist[str] = Sublist(cache_size=16)
    sublist.insert("foo.>", "gt")
    sublist.insert("foo.bar", "literal")
    assert sublist.match("foo.bar") == {"gt", "literal"}
    assert sublist.remove("foo.>", "gt")
    assert sublist.match("foo.bar") == {"literal"}
    assert sublist.remove("foo.bar", "literal")
    assert sublist.match("foo.bar") == frozenset()


def test_a_change_keeps_the_cached_results_it_cannot_affect() -> None:
    sublist: Sublist[str] = Sublist(cache_size=16)
    sublist.insert("a.>", "a")
    sublist.insert("b.>", "b")
    sublist.match("a.x")
    sublist.match("b.x")
    sublist.insert("a.*", "a-star")
    assert sublist.cache_count() == 1  # only a.x was dropped
    assert sublist.match("b.x") == {"b"}
    assert sublist.match("a.x") == {"a", "a-star"}


def test_the_cache_stays_within_its_bound() -> None:
    sublist: Sublist[str] = Sublist(cache_size=8)
    sublist.insert(">", "all")
    for i in range(100):
        assert sublist.match(f"s{i}") == {"all"}
        assert sublist.cache_count() <= 8


def test_a_zero_cache_size_caches_nothing() -> None:
    sublist: Sublist[str] = Sublist(cache_size=0)
    sublist.insert("foo", "v")
    sublist.match("foo")
    assert sublist.cache_count() == 0


def test_a_negative_cache_size_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_size"):
        Sublist(cache_size=-1)


ENDPOINTS = [
    "relay.agent.p1.backend",
    "relay.agent.p1.frontend",
    "relay.agent.p2.backend",
    "relay.system.console",
    "relay",
    "other.thing",
]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        pytest.param("relay.agent.p1.backend", {"relay.agent.p1.backend"}, id="literal"),
        pytest.param(
            "relay.agent.*.backend",
            {"relay.agent.p1.backend", "relay.agent.p2.backend"},
            id="star-in-middle",
        ),
        pytest.param(
            "relay.>",
            {
                "relay.agent.p1.backend",
                "relay.agent.p1.frontend",
                "relay.agent.p2.backend",
                "relay.system.console",
            },
            id="gt-excludes-the-prefix-itself",
        ),
        pytest.param("*", {"relay"}, id="star-alone-one-token-only"),
        pytest.param(">", set(ENDPOINTS), id="gt-alone-everything"),
        pytest.param("*.*", {"other.thing"}, id="two-stars"),
        pytest.param("relay.agent.*", set(), id="star-too-short"),
        pytest.param("nothing.here", set(), id="no-such-endpoint"),
        pytest.param("Relay.>", set(), id="case-sensitive"),
    ],
)
def test_reverse_match_finds_the_endpoints_a_pattern_covers(
    sublist: Sublist[str], pattern: str, expected: set[str]
) -> None:
    for endpoint in ENDPOINTS:
        sublist.insert(endpoint, endpoint)
    assert sublist.reverse_match(pattern) == expected


def test_reverse_match_ignores_wildcard_entries() -> None:
    sublist: Sublist[str] = Sublist()
    sublist.insert("foo.bar", "concrete")
    sublist.insert("foo.*", "wild")
    sublist.insert("foo.>", "wilder")
    assert sublist.reverse_match("foo.*") == {"concrete"}
    assert sublist.reverse_match("foo.>") == {"concrete"}


# --- property tests -----------------------------------------------------------------------

# A tiny alphabet, so random subjects and patterns match often.
_TOKENS = st.sampled_from(["a", "b", "c"])
_SUBJECTS = st.lists(_TOKENS, min_size=1, max_size=4).map(".".join)
_PATTERNS = st.builds(
    lambda parts, tail: ".".join(parts + tail),
    st.lists(st.sampled_from(["a", "b", "*"]), min_size=0, max_size=3),
    st.sampled_from([[], [">"], ["c"], ["*"]]),
).filter(bool)
_VALUES = st.integers(min_value=0, max_value=5)
_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), _PATTERNS, _VALUES),
        st.tuples(st.just("remove"), _PATTERNS, _VALUES),
        st.tuples(st.just("match"), _SUBJECTS, st.none()),
    ),
    max_size=60,
)


def _expected(entries: set[tuple[str, int]], subject: str) -> frozenset[int]:
    return frozenset(value for pattern, value in entries if matches(subject, pattern))


@settings(max_examples=300, deadline=None)
@given(operations=_OPERATIONS, probes=st.lists(_SUBJECTS, max_size=12))
def test_trie_with_and_without_cache_agrees_with_the_reference_matcher(
    operations: list[tuple[str, str, int | None]], probes: list[str]
) -> None:
    """Given random inserts, removes and matches, interleaved so the cache is live while
    the trie changes, both tries give what filtering all entries with matches() gives."""
    cached: Sublist[int] = Sublist(cache_size=4)  # small, so eviction happens too
    uncached: Sublist[int] = Sublist(cache_size=0)
    model: set[tuple[str, int]] = set()
    for kind, text, value in operations:
        if kind == "insert":
            cached.insert(text, value)
            uncached.insert(text, value)
            model.add((text, value))
        elif kind == "remove":
            existed = (text, value) in model
            assert cached.remove(text, value) is existed
            assert uncached.remove(text, value) is existed
            model.discard((text, value))
        else:
            expected = _expected(model, text)
            assert cached.match(text) == expected
            assert uncached.match(text) == expected
        assert len(cached) == len(uncached) == len(model)
    assert cached.patterns() == uncached.patterns() == sorted({p for p, _ in model})
    for subject in probes:
        expected = _expected(model, subject)
        assert cached.match(subject) == expected
        assert uncached.match(subject) == expected


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.sets(_SUBJECTS, max_size=20),
    removed=st.sets(_SUBJECTS, max_size=8),
    pattern=_PATTERNS,
)
def test_reverse_match_agrees_with_filtering_the_entries(
    endpoints: set[str], removed: set[str], pattern: str
) -> None:
    sublist: Sublist[str] = Sublist()
    for endpoint in endpoints:
        sublist.insert(endpoint, endpoint)
    for endpoint in removed:
        sublist.remove(endpoint, endpoint)
    remaining = endpoints - removed
    assert sublist.reverse_match(pattern) == {e for e in remaining if matches(e, pattern)}
