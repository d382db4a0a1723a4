"""Commands that run an edge: a process that speaks to the world outside in another
protocol and is an SDK client of the router (DESIGN.md, "Edges"): `relay mcp`, and
`relay bridge`, the link to other hosts over NATS JetStream (docs/federation.md)."""

from __future__ import annotations

import argparse

from cli.operator import client_from_args


def cmd_mcp(args: argparse.Namespace) -> int:
    from edges.mcp_server import serve  # the mcp package is needed by this command only

    with client_from_args(args) as client:
        serve(client, args.sender, http=args.http)
    return 0


def cmd_bridge(args: argparse.Namespace) -> int:
    from edges.bridge import Bridge, serve  # nats-py is needed by this command only

    servers = [url for url in args.nats.split(",") if url]
    with client_from_args(args) as client:
        serve(Bridge(client, servers, args.node, share=args.share, replicas=args.replicas))
    return 0
