"""Subject matching: the trie (with and without its cache) against the linear matcher.

One run builds 10,000 patterns shaped like the router's: mostly endpoints
``relay.agent.<project>.<name>``, plus subscriptions with ``*`` and ``>`` at various
depths. Subjects come from a working set of 500 that publishers keep hitting (so the
1,024-entry cache can hit, as it does in the router), a tenth of them matching nothing.
The linear matcher, `sdk.subjects.matches` over all 10,000 patterns, is the anchor: the
obvious implementation the trie replaces.

Goals: >= 200,000 matches/s with the cache, >= 50,000/s without. Keeps under ~20 s.
Guards `broker/sublist.py` and the validation fast path in `sdk/subjects.py`.
"""

from __future__ import annotations

import random
import time

from bench.common import Row, interleave, rate
from broker.sublist import Sublist
from sdk.subjects import matches

PATTERN_COUNT = 10_000
WORKING_SET = 500
LOOKUPS = 20_000  # trie lookups per round
LINEAR_LOOKUPS = 20  # linear lookups per round (each scans all 10,000 patterns)

CACHED_GOAL = 200_000
UNCACHED_GOAL = 50_000


def build_patterns(rng: random.Random) -> list[str]:
    """10,000 distinct patterns: ~90% endpoints, the rest wildcard subscriptions."""
    projects = [f"proj{i}" for i in range(100)]
    patterns: set[str] = set()
    for project in projects:
        patterns.add(f"relay.agent.{project}.*")
        patterns.add(f"relay.agent.{project}.>")
        patterns.add(f"relay.signal.{project}.*.typing")
    for name in range(40):
        patterns.add(f"relay.agent.*.agent{name}")
    patterns.update(["relay.>", "relay.agent.>", "relay.*.*.*", "audit.>"])
    while len(patterns) < PATTERN_COUNT:
        project = rng.choice(projects)
        name = f"agent{rng.randrange(120)}"
        if rng.random() < 0.05:
            patterns.add(f"relay.agent.{project}.{name}.>")
        else:
            patterns.add(f"relay.agent.{project}.{name}")
    return sorted(patterns)


def build_lookups(rng: random.Random, patterns: list[str], count: int) -> list[str]:
    """``count`` subjects drawn from a working set of endpoints and a few misses."""
    endpoints = [p for p in patterns if "*" not in p and ">" not in p]
    working = rng.sample(endpoints, int(WORKING_SET * 0.9))
    working += [f"tasks.queue{i}.run" for i in range(WORKING_SET - len(working))]
    return [rng.choice(working) for _ in range(count)]


def rows(rounds: int = 5) -> list[Row]:
    rng = random.Random(1729)
    patterns = build_patterns(rng)
    lookups = build_lookups(rng, patterns, LOOKUPS)
    linear_lookups = lookups[:LINEAR_LOOKUPS]

    cached: Sublist[str] = Sublist(cache_size=1024)
    uncached: Sublist[str] = Sublist(cache_size=0)
    for pattern in patterns:
        cached.insert(pattern, pattern)
        uncached.insert(pattern, pattern)

    # The fast paths must give the anchor's answers before their speed means anything.
    for subject in linear_lookups:
        expected = frozenset(p for p in patterns if matches(subject, p))
        if cached.match(subject) != expected or uncached.match(subject) != expected:
            raise RuntimeError(f"trie and linear matcher disagree on {subject!r}")

    def run_trie(sublist: Sublist[str]) -> float:
        match = sublist.match
        start = time.perf_counter()
        for subject in lookups:
            match(subject)
        return rate(len(lookups), time.perf_counter() - start)

    def run_linear() -> float:
        start = time.perf_counter()
        for subject in linear_lookups:
            [p for p in patterns if matches(subject, p)]
        return rate(len(linear_lookups), time.perf_counter() - start)

    medians = interleave(
        rounds,
        cached=lambda: run_trie(cached),
        uncached=lambda: run_trie(uncached),
        linear=run_linear,
    )
    linear = medians["linear"]
    return [
        Row(
            metric=f"trie match, {len(patterns):,} patterns, cached",
            relay=medians["cached"],
            unit="match/s",
            ceiling_name="linear matcher",
            ceiling=linear,
            goal=f">= {CACHED_GOAL:,}/s",
            met=medians["cached"] >= CACHED_GOAL,
        ),
        Row(
            metric=f"trie match, {len(patterns):,} patterns, no cache",
            relay=medians["uncached"],
            unit="match/s",
            ceiling_name="linear matcher",
            ceiling=linear,
            goal=f">= {UNCACHED_GOAL:,}/s",
            met=medians["uncached"] >= UNCACHED_GOAL,
        ),
    ]


if __name__ == "__main__":
    for row in rows():
        ratio = f"{row.ratio:,.0f}x" if row.ratio is not None else "-"
        print(
            f"{row.metric:<42} {row.relay:>12,.0f} {row.unit:<8} "
            f"{row.ceiling_name}: {row.ceiling:,.0f} ({ratio})  goal {row.goal}: "
            f"{'met' if row.met else 'NOT met'}"
        )
