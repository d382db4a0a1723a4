"""Issue 27's goals alone, in this tree or in two trees in turn.

    python -m bench.goals [--rounds N] [--json]
    python -m bench.goals --trees OLD NEW [--pairs P] [--rounds N]

The first form measures only the rows of bench/comparisons.py that carry a goal of
issue 27 (`goal_rows`: publish p50 with 1 in flight and the rate with 100 in flight
beside (e), publish -> handler p50 beside (e), the router's CPU per publish), by running
the broker bench (bench/bench_broker.py) with only the workloads those rows read, in
``N`` interleaved rounds. ``--json`` prints the rows as one JSON line instead of a table.

The second runs the first with ``--json`` in each tree in turn for ``P`` pairs (each run
a fresh process whose working directory is the tree, so it imports that tree's code and
starts that tree's broker), then prints, per row and tree, the median over the runs of
Relay's figure and of its ratio to the floor measured in the same run, their ranges,
and whether the goal holds as a median. Both trees need this module: to compare with an
older commit, check it out (`git worktree add`) and copy this tree's bench/ into it, so
that both sides run the same bench code.

How the two trees alternate: bench/trees.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.common import Row
from bench.comparisons import goal_rows
from bench.trees import Runs, alternate, failures


def measure(rounds: int) -> list[Row]:
    from bench.bench_broker import rows

    return rows(rounds, goal_rows())


def summary(runs: Runs, failed: dict[str, int] | None = None) -> str:
    """Per row, per tree: median (range) of Relay's figure and of its ratio, and whether
    the goal holds as a median (a relative goal is judged on the median ratio); then the
    runs that failed, per tree."""
    goals = goal_rows()
    lines = []
    for i, comparison in enumerate(goals):
        lines.append(f"{comparison.label} ({comparison.unit})")
        for tree, tree_runs in runs.items():
            figures = [run[i]["relay"] for run in tree_runs]
            ratios = [run[i]["ratio"] for run in tree_runs if run[i]["ratio"] is not None]
            median = statistics.median(figures)
            text = f"  {tree}: {median:,.1f} [{min(figures):,.1f}-{max(figures):,.1f}]"
            assert comparison.goal is not None
            if ratios:
                ratio = statistics.median(ratios)
                text += f", ratio {ratio:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
                met = comparison.goal.met(ratio, 1.0, 0)
            else:
                met = comparison.goal.met(median, None, 0)
            lines.append(f"{text}  {comparison.goal.words}: {'yes' if met else 'NO'}")
    return "\n".join([*lines, *failures(runs, failed or {})])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--trees", nargs=2, type=Path, metavar=("OLD", "NEW"))
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    if args.trees is None:
        rows = measure(args.rounds)
        if args.json:
            print(json.dumps([row.as_dict() for row in rows]))
        else:
            from bench.__main__ import table

            print(table(rows))
        return
    goals = ["bench.goals", "--json", "--rounds", str(args.rounds)]
    runs, failed = alternate(args.trees, args.pairs, goals)
    print(summary({tree: r for tree, r in runs.items() if r}, failed))


if __name__ == "__main__":
    main()
