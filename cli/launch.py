"""Commands that run in the foreground until stopped: `relay router`, `relay writer
--shard K --shards N` (one line each in the Procfile) and `relay ops` (the Spark jobs).
`relay up` and `relay down`, the whole group, are cli/group.py."""

from __future__ import annotations

import argparse

from sdk.paths import Home


def cmd_router(args: argparse.Namespace) -> int:
    from broker import router

    return router.main(
        Home(args.home), args.shards, address=args.address, signals_address=args.signals_address
    )


def cmd_writer(args: argparse.Namespace) -> int:
    from workers import writer

    return writer.main(Home(args.home), args.shard, args.shards)


def cmd_ops(args: argparse.Namespace) -> int:
    from ops.cli import main as ops_main  # imports nothing of Spark until a job runs

    return ops_main(args.ops_args, home=args.home)
