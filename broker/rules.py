"""The access rules engine (pure): may ``sender`` deliver to ``target``?

Rules are evaluated highest priority first; among equal priorities the rule added first
comes first. The first rule whose ``from`` pattern matches the sender and whose ``to``
pattern matches the target decides; when none matches, delivery is allowed.

A `RuleSet` is immutable: changing the rules means building a new one and swapping it in,
so the memo of decisions never needs invalidating and a reader never sees a half-applied
rules file. Failing closed (an invalid rules file) is a one-rule set,
``RuleSet([AccessRule(">", ">", RuleAction.DENY)])``.

Cost: the router asks once per publish and matched endpoint, and a decision is a linear
scan of the rules with two pattern matches each. A bounded memo of recent
``(sender, target)`` decisions makes the common case (the same few agents talking) one
dict lookup. When the memo is full the oldest entry is evicted (FIFO: O(1), no
bookkeeping on hits, unlike LRU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sdk.subjects import matches
from sdk.types import AccessRule, RuleAction

DEFAULT_MEMO_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    rule: AccessRule | None  # the rule that decided; None when no rule matched


_NO_MATCH = Decision(allowed=True, rule=None)


class RuleSet:
    def __init__(self, rules: Iterable[AccessRule] = (), *, memo_size: int = DEFAULT_MEMO_SIZE):
        # sorted() is stable, so equal priorities keep their insertion order.
        self._rules = tuple(sorted(rules, key=lambda rule: -rule.priority))
        self._memo: dict[tuple[str, str], Decision] = {}
        self._memo_size = max(0, memo_size)

    @property
    def rules(self) -> tuple[AccessRule, ...]:
        """The rules in evaluation order."""
        return self._rules

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"RuleSet({len(self._rules)} rules)"

    def decide(self, sender: str, target: str) -> Decision:
        key = (sender, target)
        decision = self._memo.get(key)
        if decision is None:
            decision = self._evaluate(sender, target)
            if self._memo_size:
                if len(self._memo) >= self._memo_size:
                    self._memo.pop(next(iter(self._memo)), None)
                self._memo[key] = decision
        return decision

    def _evaluate(self, sender: str, target: str) -> Decision:
        for rule in self._rules:
            if matches(sender, rule.from_pattern) and matches(target, rule.to_pattern):
                return Decision(allowed=rule.action == RuleAction.ALLOW, rule=rule)
        return _NO_MATCH
