"""Issue 27's goals alone, in this tree or in two trees in turn.

    python -m bench.goals [--rounds N] [--json]
    python -m bench.goals --trees OLD NEW [--pairs P] [--rounds N]

The first form measures only the rows of bench/comparisons.py that carry a goal of
issue 27 (`goal_rows`: publish p50 with 1 in flight and the rate with 100 in flight
beside (e), publish -> handler p50 beside (e), the router's CPU per publish), by running
the broker bench (bench/bench_broker.py) with only the workloads those rows read, in
``N`` interleaved rounds. ``--json`` prints the rows as one JSON line instead of a table.

The second runs the first with ``--json`` in each tree in turn, OLD NEW OLD NEW ... for
``P`` pairs (each run a fresh process whose working directory is the tree, so it imports
that tree's code and starts that tree's broker), then prints, per row and tree, the
median over the runs of Relay's figure and of its ratio to the floor measured in the
same run, their ranges, and whether the goal holds as a median. Both trees need this
module: to compare with an older commit, check it out (`git worktree add`) and copy
this tree's bench/ into it, so that both sides run the same bench code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import Row
from bench.comparisons import goal_rows


def measure(rounds: int) -> list[Row]:
    from bench.bench_broker import rows

    return rows(rounds, goal_rows())


def run_in(tree: Path, rounds: int) -> list[dict]:
    """One run of the goal rows in ``tree``, with its own interpreter and code."""
    python = tree / ".venv" / "bin" / "python"
    command = [str(python), "-m", "bench.goals", "--json", "--rounds", str(rounds)]
    out = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(runs: dict[str, list[list[dict]]]) -> str:
    """Per row, per tree: median (range) of Relay's figure and of its ratio, and whether
    the goal holds as a median (a relative goal is judged on the median ratio)."""
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
    for pair in range(args.pairs):
        for tree in args.trees:
            load = os.getloadavg()[0]
            runs[str(tree)].append(run_in(tree, args.rounds))
            print(f"pair {pair + 1}/{args.pairs}: {tree} done (load {load:.1f})", file=sys.stderr)
            print(json.dumps({"tree": str(tree), "rows": runs[str(tree)][-1]}), flush=True)
    print(summary(runs))


if __name__ == "__main__":
    main()
