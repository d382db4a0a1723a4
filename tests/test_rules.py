"""broker.rules: priority, first match, default allow, insertion order, the memo."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.rules import Decision, RuleSet
from sdk.subjects import matches
from sdk.types import AccessRule, RuleAction

ALLOW, DENY = RuleAction.ALLOW, RuleAction.DENY
A = "relay.agent.p.a"
B = "relay.agent.p.b"
SECRET = "relay.agent.vault.secret"


def test_no_rules_allows() -> None:
    assert RuleSet().decide(A, B) == Decision(allowed=True, rule=None)


def test_no_matching_rule_allows() -> None:
    rules = RuleSet([AccessRule("relay.human.>", ">", DENY)])
    assert rules.decide(A, B) == Decision(True, None)


def test_matching_deny_denies_and_names_the_rule() -> None:
    deny = AccessRule("relay.agent.>", "relay.agent.vault.>", DENY)
    assert RuleSet([deny]).decide(A, SECRET) == Decision(False, deny)


def test_both_patterns_must_match() -> None:
    deny = AccessRule(A, SECRET, DENY)
    rules = RuleSet([deny])
    assert rules.decide(A, SECRET).allowed is False
    assert rules.decide(B, SECRET).allowed is True
    assert rules.decide(A, B).allowed is True


def test_higher_priority_allow_beats_deny() -> None:
    deny = AccessRule(">", "relay.agent.vault.>", DENY, priority=0)
    allow = AccessRule(A, "relay.agent.vault.*", ALLOW, priority=10)
    rules = RuleSet([deny, allow])  # added after, still evaluated first
    assert rules.decide(A, SECRET) == Decision(True, allow)
    assert rules.decide(B, SECRET) == Decision(False, deny)


def test_higher_priority_deny_beats_allow() -> None:
    allow = AccessRule(">", ">", ALLOW, priority=1)
    deny = AccessRule(A, ">", DENY, priority=2)
    assert RuleSet([allow, deny]).decide(A, B) == Decision(False, deny)


def test_ties_are_broken_by_insertion_order() -> None:
    first = AccessRule(A, ">", DENY, priority=3)
    second = AccessRule(">", B, ALLOW, priority=3)
    assert RuleSet([first, second]).decide(A, B).rule == first
    assert RuleSet([second, first]).decide(A, B).rule == second


def test_first_match_wins_over_later_more_specific_rules() -> None:
    broad = AccessRule(">", ">", DENY, priority=5)
    specific = AccessRule(A, B, ALLOW, priority=5)
    assert RuleSet([broad, specific]).decide(A, B) == Decision(False, broad)


def test_rules_property_is_in_evaluation_order() -> None:
    r1 = AccessRule("a", ">", DENY, priority=0)
    r2 = AccessRule("b", ">", DENY, priority=9)
    r3 = AccessRule("c", ">", DENY, priority=0)
    r4 = AccessRule("d", ">", DENY, priority=9)
    assert RuleSet([r1, r2, r3, r4]).rules == (r2, r4, r1, r3)


def test_fail_closed_rule_set_denies_everything() -> None:
    rules = RuleSet([AccessRule(">", ">", DENY)])
    assert not rules.decide(A, B).allowed
    assert not rules.decide("x", "y").allowed


def test_memo_is_bounded_and_answers_stay_correct() -> None:
    deny = AccessRule("relay.agent.p.*", "relay.agent.p.t1", DENY)
    rules = RuleSet([deny], memo_size=8)
    for round_ in range(3):
        for i in range(50):
            decision = rules.decide(f"relay.agent.p.s{i}", f"relay.agent.p.t{i % 3}")
            assert decision.allowed is (i % 3 != 1), (round_, i)
        assert len(rules._memo) <= 8


def test_memo_can_be_disabled() -> None:
    rules = RuleSet([AccessRule(A, B, DENY)], memo_size=0)
    assert not rules.decide(A, B).allowed
    assert not rules.decide(A, B).allowed
    assert rules._memo == {}


tokens = st.sampled_from(["a", "b", "c"])
subjects = st.lists(tokens, min_size=1, max_size=3).map(".".join)
patterns = st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=3).map(
    ".".join
) | st.lists(tokens, max_size=2).map(lambda ts: ".".join([*ts, ">"]))
rules_lists = st.lists(
    st.builds(AccessRule, patterns, patterns, st.sampled_from(RuleAction), st.integers(-2, 2)),
    max_size=8,
)


@given(rules_lists, st.lists(st.tuples(subjects, subjects), min_size=1, max_size=20))
def test_decide_agrees_with_the_obvious_definition(
    rules: list[AccessRule], queries: list[tuple[str, str]]
) -> None:
    ruleset = RuleSet(rules, memo_size=4)
    for sender, target in queries * 2:  # twice: the second pass may come from the memo
        expected = Decision(True, None)
        for priority in sorted({r.priority for r in rules}, reverse=True):
            hit = next(
                (
                    r
                    for r in rules
                    if r.priority == priority
                    and matches(sender, r.from_pattern)
                    and matches(target, r.to_pattern)
                ),
                None,
            )
            if hit is not None:
                expected = Decision(hit.action == ALLOW, hit)
                break
        assert ruleset.decide(sender, target) == expected
