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

The pairs alternate their order (OLD NEW, NEW OLD, ...): the floors measured in the
second run of a pair were slower than in the first even with the same code in both
trees (docs/performance.md, "Which run of a pair"), so a fixed order would hand one tree
the slower floor. The disk is flushed (sync) between runs. A run that fails (a workload
refused, a broker that fell behind) is counted per tree and the comparison goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import TypeVar

from bench.common import Row
from bench.comparisons import goal_rows

T = TypeVar("T")


def measure(rounds: int) -> list[Row]:
    from bench.bench_broker import rows

    return rows(rounds, goal_rows())


def run_in(tree: Path, rounds: int) -> list[dict] | None:
    """One run of the goal rows in ``tree``, with its own interpreter and code; None
    (its error printed) when the run failed."""
    python = tree / ".venv" / "bin" / "python"
    command = [str(python), "-m", "bench.goals", "--json", "--rounds", str(rounds)]
    out = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    os.sync()  # what the run left to write back is not the next run's to flush
    if out.returncode != 0:
        print(f"{' '.join(command)} in {tree} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def pair_order(trees: list[T], pair: int) -> list[T]:
    """OLD NEW for even pairs, NEW OLD for odd ones: each tree runs second as often."""
    return trees if pair % 2 == 0 else trees[::-1]


def summary(runs: dict[str, list[list[dict]]], failed: dict[str, int] | None = None) -> str:
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
    for tree, count in (failed or {}).items():
        lines.append(f"{tree}: {count} run(s) failed, {len(runs.get(tree, []))} ran")
    return "\n".join(lines)


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
    runs: dict[str, list[list[dict]]] = {str(tree): [] for tree in args.trees}
    failed = dict.fromkeys(runs, 0)
    for pair in range(args.pairs):
        for slot, tree in enumerate(pair_order(args.trees, pair)):
            load = os.getloadavg()[0]
            rows = run_in(tree, args.rounds)
            print(f"pair {pair + 1}/{args.pairs}: {tree} done (load {load:.1f})", file=sys.stderr)
            if rows is None:
                failed[str(tree)] += 1
                continue
            runs[str(tree)].append(rows)
            print(json.dumps({"tree": str(tree), "slot": slot, "rows": rows}), flush=True)
    print(summary({t: r for t, r in runs.items() if r}, {t: n for t, n in failed.items() if n}))


if __name__ == "__main__":
    main()
