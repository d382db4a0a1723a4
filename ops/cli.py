"""`relay ops`: the Spark jobs. `relay ops compact --help`, `relay ops metrics --help`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def build_parser(home: str | None = None) -> argparse.ArgumentParser:
    from ops import compact, metrics

    parser = argparse.ArgumentParser(prog="relay ops", description=__doc__.split("\n")[0])
    jobs = parser.add_subparsers(dest="job", required=True, metavar="JOB")
    for name, module, text in (
        ("compact", compact, "archive finished history into Parquet, remove it from the store"),
        ("metrics", metrics, "delivery metrics over the archive and the live index: JSON + HTML"),
    ):
        p = jobs.add_parser(name, help=text, description=module.__doc__.split("\n")[0])
        p.add_argument("--home", default=home, help="data directory (default $RELAY_HOME)")
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None, home: str | None = None) -> int:
    args = build_parser(home).parse_args(argv)
    return args.run(args)
