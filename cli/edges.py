"""Commands that run an edge: a process that speaks to the world outside in another
protocol and is an SDK client of the router (docs/design.md, "Processes"): `relay mcp`,
`relay http`, and `relay bridge`, the link to other hosts over NATS JetStream
(docs/federation.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from cli.operator import client_from_args
from cli.output import emit
from sdk.errors import RelayError
from sdk.paths import Home

if TYPE_CHECKING:
    from edges.bridge import Credentials


def cmd_mcp(args: argparse.Namespace) -> int:
    from edges.mcp_server import serve  # the mcp package is needed by this command only

    with client_from_args(args) as client:
        serve(
            client,
            args.sender,
            http=args.http,
            ack_wait=args.ack_wait,
            home=Home(args.home),
            connect_as=lambda user: client_from_args(args, acting_for=user),
        )
    return 0


def cmd_http(args: argparse.Namespace) -> int:
    try:
        from edges.http.app import serve
    except ImportError as exc:  # starlette, uvicorn: the `edges` extra
        print(
            f"relay http: {exc}; install the edges extra: pip install -e '.[edges]'",
            file=sys.stderr,
        )
        return 2
    return serve(
        Home(args.home).create(),
        args.listen,
        address=args.address,
        key_file=args.key_file,
        server_key=args.server_key,
        timeout=args.timeout,
        ack_wait=args.ack_wait,
    )


def cmd_bridge(args: argparse.Namespace) -> int:
    # nats-py is needed by this command only
    from edges.bridge import Bridge, Credentials, CredentialsError, serve, setup

    servers = [url for url in args.nats.split(",") if url]
    credentials = Credentials(creds=args.creds, nkey=args.nkey, tls_ca=args.tls_ca)
    try:  # now, not at the first connection: a bad file is a mistake to fix, not to wait out
        credentials.check()
    except CredentialsError as exc:
        print(f"relay bridge: {exc}", file=sys.stderr)
        return 2
    if args.forget:
        return _forget(args, servers, credentials)
    if not args.node:
        print("relay bridge: --node NAME is required (this host's node name)", file=sys.stderr)
        return 2
    if args.setup:  # NATS only: the router is not needed to make the bucket and streams
        try:
            asyncio.run(setup(servers, args.node, credentials, args.replicas))
        except Exception as exc:  # what failed is logged; the operator runs it again
            print(f"relay bridge --setup: {exc!r:.300}", file=sys.stderr)
            return 1
        return 0
    with client_from_args(args) as client:
        bridge = Bridge(
            client,
            servers,
            args.node,
            share=args.share,
            replicas=args.replicas,
            credentials=credentials,
        )
        serve(bridge)
    return 0


def _forget(args: argparse.Namespace, servers: list[str], credentials: Credentials) -> int:
    import nats

    from edges.bridge_forget import NodeRunning, forget

    async def run() -> Any:
        # an operator's user, not a node's: it deletes a stream (docs/federation.md)
        nc = await nats.connect(
            servers=servers,
            connect_timeout=5,
            allow_reconnect=False,
            **credentials.connect_options(),
        )
        try:
            return await forget(nc, args.forget)
        finally:
            await nc.close()

    try:
        done = asyncio.run(run())
    except (NodeRunning, RelayError, nats.errors.Error, OSError) as exc:
        print(f"relay bridge --forget: {exc}", file=sys.stderr)
        return 2
    emit(
        args,
        done.to_wire(),
        lambda d: (
            f"forgot node {d['node']}: {len(d['endpoints'])} endpoint(s) out of the "
            + "directory, "
            + (
                "no stream"
                if d["dropped"] is None
                else f"its stream deleted with {d['dropped']} message(s) waiting for it"
            )
        ),
    )
    return 0
