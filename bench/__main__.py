"""`python -m bench` (`make bench`): every bench module, one table, one JSON file.

    python -m bench [--only subjects|storage|broker|ops|nats|soak|mcp|http|federation] [--rounds N]
                    [--soak-seconds S] [--json]

Prints one table (metric, Relay, unit, ceiling, ratio, goal, met) and writes the same
rows with machine info to bench/results/<UTC timestamp>.json (git-ignored); ``--json``
prints the rows as one last line of JSON too (what bench/trees.py reads). Exits 1 when
a module fails; a goal not met is a row of the table, not an error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

MODULES = {
    "subjects": "bench.bench_subjects",
    "storage": "bench.bench_storage",
    "broker": "bench.bench_broker",
    # nats before ops: compaction deletes a great many files, and on this disk the next
    # seconds of file creation pay for it (docs/performance.md).
    "nats": "bench.bench_nats",
    "ops": "bench.bench_ops",
    "soak": "bench.bench_soak",
    "mcp": "bench.bench_mcp",
    "http": "bench.bench_http",  # the gateway beside the SDK (edges/http)
    "federation": "bench.bench_federation",
}
RESULTS = Path(__file__).parent / "results"
HEADER = ("metric", "Relay", "unit", "ceiling name", "ceiling", "ratio", "goal", "met")


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _cells(row) -> tuple[str, ...]:
    ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
    met = "" if row.met is None else ("yes" if row.met else "NO")
    return (
        row.metric,
        _num(row.relay),
        row.unit,
        row.ceiling_name,
        _num(row.ceiling),
        ratio,
        row.goal,
        met,
    )


def table(rows: list) -> str:
    cells = [HEADER, *(_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    right = {1, 4, 5}  # numbers
    lines = [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cell, widths, strict=True))
        ).rstrip()
        for cell in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "node": platform.node(),
        "loadavg": os.getloadavg(),  # other work on the box skews every figure
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(MODULES), action="append")
    parser.add_argument("--rounds", type=int, help="rounds per figure (default: per module)")
    parser.add_argument(
        "--soak-seconds", type=float, help="length of the soak (default: 600, the issue's 10 min)"
    )
    parser.add_argument("--json", action="store_true", help="the rows as a last line of JSON")
    args = parser.parse_args(argv)

    started, info = datetime.now(UTC), machine()
    rows, records, failed = [], [], []
    for name in args.only or MODULES:
        print(f"bench {name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            module = importlib.import_module(MODULES[name])
            options = {} if args.rounds is None else {"rounds": args.rounds}
            if name == "soak" and args.soak_seconds is not None:
                options["seconds"] = args.soak_seconds
            got = module.rows(**options)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        print(f"bench {name}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        rows += got
        records += [{"module": name, **r.as_dict()} for r in got]

    print(table(rows))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{started:%Y%m%dT%H%M%SZ}.json"
    report = {
        "started": started.isoformat(),
        "seconds": round((datetime.now(UTC) - started).total_seconds(), 1),
        "argv": sys.argv[1:],
        "machine": info,
        "loadavg_after": os.getloadavg(),
        "failed": failed,
        "rows": records,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    load = "/".join(f"{x:.1f}" for x in info["loadavg"])
    print(f"\n{info['cpus']} CPUs, load {load} at start; written to {out}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    if args.json:
        print(json.dumps(records))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
