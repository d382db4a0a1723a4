"""Two checkouts measured in turn: the same bench run in each, medians per tree.

    python -m bench.trees OLD NEW [--pairs P] [--rounds N] [--only MODULE ...]

Runs ``python -m bench --json`` (every module, or those named) in each tree for ``P``
pairs and prints, per row, each tree's median figure with its range, NEW's median over
OLD's, and each tree's median ratio to the row's ceiling: what a change did to every
figure of the bench, not only to the ones it was for (issue 27: "nothing regresses
elsewhere"). `bench.goals --trees` is the same alternation over issue 27's rows alone,
judged against their goals.

How the runs alternate (`alternate`): each run is a fresh process whose working
directory is the tree, so it imports that tree's code and starts that tree's broker;
both trees need the bench modules used (copy this tree's bench/ into an older checkout,
so both sides run the same bench code). The pairs alternate their order (OLD NEW, NEW
OLD, ...): a floor measured in the second run of a pair was slower than in the first
even with the same code in both trees (docs/performance.md, "Which run of a pair"), so a
fixed order would hand one tree the slower floor. The disk is flushed (sync) between
runs, and no run deletes its files: they go under one directory, deleted after the last
run, since with a mass delete at each run's exit the floor swung by the run's place and
without it did not (the same section). A run that fails (a workload refused, a broker
that fell behind) is counted per tree and the comparison goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from bench.common import KEEP_UNDER, base_dir

T = TypeVar("T")
Runs = dict[str, list[list[dict]]]  # tree -> its runs -> their rows (Row.as_dict)


def pair_order(trees: Sequence[T], pair: int) -> list[T]:
    """OLD NEW for even pairs, NEW OLD for odd ones: each tree runs second as often."""
    return list(trees) if pair % 2 == 0 else list(trees)[::-1]


def run_in(tree: Path, args: list[str], keep_under: Path) -> list[dict] | None:
    """``python -m <args>`` in ``tree`` with its own interpreter and code, its files
    left under ``keep_under``: the rows it prints as its last line of JSON, or None (its
    error printed) when it failed."""
    command = [str(tree / ".venv" / "bin" / "python"), "-m", *args]
    env = {**os.environ, KEEP_UNDER: str(keep_under)}
    out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    os.sync()  # what the run left to write back is not the next run's to flush
    if out.returncode != 0:
        print(f"{' '.join(command)} in {tree} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def alternate(trees: Sequence[Path], pairs: int, args: list[str]) -> tuple[Runs, dict[str, int]]:
    """Run ``args`` in each tree, ``pairs`` times, each pair's order alternating; the
    rows of the runs that passed, and the count of those that failed, per tree. The runs'
    files are deleted once the last is over: a mass delete slows this disk's next
    seconds (bench/common.py `remove_when_done`)."""
    runs: Runs = {str(tree): [] for tree in trees}
    failed = dict.fromkeys(runs, 0)
    keep_under = base_dir()
    try:
        for pair in range(pairs):
            for slot, tree in enumerate(pair_order(trees, pair)):
                load = os.getloadavg()[0]
                rows = run_in(tree, args, keep_under)
                print(f"pair {pair + 1}/{pairs}: {tree} done (load {load:.1f})", file=sys.stderr)
                if rows is None:
                    failed[str(tree)] += 1
                    continue
                runs[str(tree)].append(rows)
                print(json.dumps({"tree": str(tree), "slot": slot, "rows": rows}), flush=True)
    finally:
        shutil.rmtree(keep_under, ignore_errors=True)
    return runs, failed


def failures(runs: Runs, failed: dict[str, int]) -> list[str]:
    """A line per tree with failed runs."""
    return [f"{t}: {n} run(s) failed, {len(runs.get(t, []))} ran" for t, n in failed.items() if n]


def compare(runs: Runs, failed: dict[str, int] | None = None) -> str:
    """Per metric (rows matched by name; a metric some tree never measured is left out):
    each tree's median and range, NEW ÷ OLD, and each tree's median ratio to the ceiling
    where the row has one."""
    old, new = list(runs)
    rows: dict[str, dict[str, list[dict]]] = {}  # metric -> tree -> its rows over the runs
    for tree, tree_runs in runs.items():
        for run in tree_runs:
            for row in run:
                rows.setdefault(row["metric"], {}).setdefault(tree, []).append(row)
    lines = [f"old {old}, new {new}"]
    for metric, by_tree in rows.items():
        if old not in by_tree or new not in by_tree:
            continue
        cells, medians = [], []
        for tree in (old, new):
            figures = [r["relay"] for r in by_tree[tree]]
            ratios = [r["ratio"] for r in by_tree[tree] if r["ratio"] is not None]
            medians.append(statistics.median(figures))
            cell = f"{medians[-1]:,.1f} [{min(figures):,.1f}-{max(figures):,.1f}]"
            if ratios:
                cell += f" ({statistics.median(ratios):.2f}x ceiling)"
            cells.append(cell)
        change = f"{medians[1] / medians[0]:.2f}" if medians[0] else "-"
        unit = by_tree[old][0]["unit"]
        lines.append(f"{metric} ({unit}): {cells[0]} -> {cells[1]}  new/old {change}")
    return "\n".join([*lines, *failures(runs, failed or {})])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs=2, type=Path, metavar="TREE")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--only", action="append")
    args = parser.parse_args()
    bench = ["bench", "--json"]
    for name in args.only or []:
        bench += ["--only", name]
    if args.rounds is not None:
        bench += ["--rounds", str(args.rounds)]
    runs, failed = alternate(args.trees, args.pairs, bench)
    print(compare(runs, failed))


if __name__ == "__main__":
    main()
