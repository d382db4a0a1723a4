"""The `relay` command: the broker's processes and the operator's tools.

Process commands run in the foreground: `relay router`, `relay writer --shard K
--shards N` (one line each in the Procfile) and `relay up`, the whole group with a
supervisor that restarts a crashed writer. Every other command talks to a running
broker through the SDK; output is for people unless `--json` is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cli.auth import cmd_auth
from cli.edges import cmd_bridge, cmd_http, cmd_mcp
from cli.group import cmd_down, cmd_up
from cli.launch import cmd_ops, cmd_router, cmd_writer
from cli.operator import (
    cmd_config,
    cmd_dlq,
    cmd_endpoints,
    cmd_pending,
    cmd_publish,
    cmd_rebuild_index,
    cmd_rules,
    cmd_signals,
    cmd_status,
    cmd_subscribe,
    cmd_trace,
)
from cli.output import pipe_closed
from sdk.errors import RelayError

DEFAULT_SHARDS = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--home", default=None, help="data directory (default $RELAY_HOME or ~/.dork/relay)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, func: Callable[[argparse.Namespace], int], help: str, client: bool = True
    ) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help)
        p.set_defaults(func=func)
        # Also after the command (`relay status --home DIR`); SUPPRESS keeps a --home
        # given before it when this one is absent.
        p.add_argument("--home", default=argparse.SUPPRESS, help="data directory")
        if client:
            p.add_argument("--json", action="store_true", help="machine-readable output")
            p.add_argument("--address", default=None, help="router address (default: ipc in home)")
            p.add_argument(
                "--timeout", type=float, default=10.0, help="seconds to wait for replies"
            )
            p.add_argument(
                "--key-file", help="tcp:// only: this client's .key_secret ($RELAY_KEY_FILE)"
            )
            p.add_argument(
                "--server-key", help="tcp:// only: the broker's public key or server.key file"
            )
        return p

    p = command("router", cmd_router, "run the router process", client=False)
    p.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    p.add_argument("--address", help="client socket, e.g. tcp://127.0.0.1:7400")
    p.add_argument("--signals-address", help="signals (XPUB) socket, e.g. tcp://127.0.0.1:7401")
    p = command("writer", cmd_writer, "run the writer of one shard", client=False)
    p.add_argument("--shard", type=int, required=True)
    p.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    p = command(
        "up", cmd_up, "run the router and all writers (foreground, or --detach)", client=False
    )
    p.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    p.add_argument("--address")
    p.add_argument("--signals-address")
    p.add_argument(
        "--detach",
        action="store_true",
        help="run in the background (output in <home>/logs/up.log); return once ready",
    )
    p.add_argument(
        "--wait", type=float, default=60.0, help="--detach: seconds to wait for ready (default 60)"
    )
    p = command("down", cmd_down, "stop the broker of the data directory", client=False)
    p.add_argument(
        "--timeout",
        type=float,
        default=15.0,
        help="seconds to wait for a clean stop before killing (default 15)",
    )

    p = command("publish", cmd_publish, "publish a message")
    p.add_argument("subject")
    p.add_argument("payload", help="JSON, or any text (sent as a string)")
    p.add_argument("--from", dest="sender", required=True, help="sender subject")
    p.add_argument("--reply-to")
    p = command("subscribe", cmd_subscribe, "print messages as they arrive (and ack them)")
    p.add_argument("pattern")
    p.add_argument("--observe", action="store_true", help="watch only: no claim, no ack")
    p.add_argument("--count", type=int, default=0, help="exit after N messages")
    p = command("endpoints", cmd_endpoints, "list, register or unregister endpoints")
    p.add_argument("action", nargs="?", default="list", choices=["list", "register", "unregister"])
    p.add_argument("subject", nargs="?")
    p.add_argument(
        "--shared",
        action=argparse.BooleanOptionalAction,
        help="register: advertise to other nodes (federation), or --no-shared to stop",
    )
    p = command("rules", cmd_rules, "list, add or remove access rules")
    p.add_argument("action", nargs="?", default="list", choices=["list", "add", "remove"])
    p.add_argument("from_pattern", nargs="?")
    p.add_argument("to_pattern", nargs="?")
    p.add_argument("rule_action", nargs="?", choices=["allow", "deny"], default="deny")
    p.add_argument("--priority", type=int, default=0)
    p = command("dlq", cmd_dlq, "list, requeue or purge dead letters")
    p.add_argument("action", nargs="?", default="list", choices=["list", "requeue", "purge"])
    p.add_argument("id", nargs="?", help="requeue: the message whose dead letter goes back")
    p.add_argument("--endpoint", help="endpoint subject or hash")
    p.add_argument("--limit", type=int, default=100, help="list; requeue --all: at most 200")
    p.add_argument("--all", action="store_true", help="requeue: the endpoint's, oldest first")
    p.add_argument("--after", metavar="ID", help="requeue --all: go on after this id")
    p = command("pending", cmd_pending, "claimed, unacknowledged messages of an endpoint")
    p.add_argument("subject")
    p.add_argument("--complete", nargs="+", metavar="ID")
    p.add_argument("--fail", nargs="+", metavar="ID")
    p.add_argument("--requeue", nargs="+", metavar="ID", help="return to new/")
    p.add_argument("--reason", default="failed by operator")
    command("status", cmd_status, "processes, endpoints and their depth")
    p = command("trace", cmd_trace, "where a message went, and when")
    p.add_argument("id")
    p = command("signals", cmd_signals, "watch signals matching a pattern, or send one")
    p.add_argument("pattern")
    p.add_argument("--send", metavar="TYPE", help="send a signal of this type to the subject")
    p.add_argument("--state", default="active")
    p.add_argument("--from", dest="sender")
    command("rebuild-index", cmd_rebuild_index, "rebuild the message index from the Maildir")
    p = command("config", cmd_config, "show settings (all, a section or one), or change them")
    p.add_argument("action", nargs="?", default="get", choices=["get", "set"])
    p.add_argument(
        "settings", nargs="*", metavar="KEY", help="get: section or section.key; set: key=value"
    )
    p = command("auth", cmd_auth, "who may connect and send as what (auth.json)", client=False)
    p.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "allow-uid", "add-key", "add-token", "remove", "server-key"],
    )
    p.add_argument("target", nargs="?", help="a uid, a key name, or what to remove")
    p.add_argument("--sender", action="append", help="sender pattern it may use (repeat)")
    p.add_argument(
        "--consume",
        action="append",
        help="endpoint pattern whose messages it may receive (repeat; default: its senders)",
    )
    p.add_argument("--admin", action="store_true", help="may change config, rules, purge...")
    p.add_argument(
        "--delegate",
        action="store_true",
        help="may act for identities with tokens (an edge's own identity; docs/security.md)",
    )
    p.add_argument(
        "--expires", metavar="DURATION", help="add-token: the token expires after 30d, 12h, 90m"
    )
    p.add_argument("--name", help="a name for people (default: the key name or uid)")
    p.add_argument("--dir", help="where add-key writes the certificate (default <home>/keys)")
    p = command("mcp", cmd_mcp, "an MCP server: Relay's tools for one agent (stdio)")
    p.add_argument("--as", dest="sender", required=True, help="the sender subject it acts as")
    p.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at /mcp instead")
    _ack_wait_argument(p, "relay_inbox")
    p = command("http", cmd_http, "the HTTP + SSE gateway and the live console (docs/http.md)")
    p.add_argument("--listen", default="127.0.0.1:7480", help="HOST:PORT (default 127.0.0.1:7480)")
    _ack_wait_argument(p, "an inbox read")
    p = command("bridge", cmd_bridge, "federation: this host's link to others over NATS")
    p.add_argument("--nats", required=True, metavar="URL[,URL...]", help="NATS servers")
    p.add_argument("--node", help="this host's node name (one subject token); required to run")
    p.add_argument(
        "--share",
        action="append",
        default=[],
        metavar="PATTERN",
        help="advertise the local endpoints matching PATTERN to the other nodes (repeatable)",
    )
    p.add_argument(
        "--replicas", type=int, default=None, help="JetStream replicas (default: up to 3)"
    )
    p.add_argument(
        "--forget",
        metavar="NODE",
        help="remove NODE (its bridge stopped) from the directory, with its stream and the "
        "messages waiting in it, and exit (a NATS user that may delete streams)",
    )
    # Who this node is to NATS (docs/federation.md, "Identities"); without either, the
    # URLs' user:password@ if they carry one.
    who = p.add_mutually_exclusive_group()
    who.add_argument("--creds", type=Path, metavar="FILE", help="NATS .creds file (JWT + nkey)")
    who.add_argument("--nkey", type=Path, metavar="FILE", help="file holding an nkey seed")
    p.add_argument("--tls-ca", type=Path, metavar="FILE", help="CA of the servers' TLS certs")
    p.add_argument(
        "--setup",
        action="store_true",
        help="create the bucket, this node's stream and consumer, then exit (a NATS "
        "user that may; a node's own user need not)",
    )
    p = command("ops", cmd_ops, "Spark jobs: compaction and metrics", client=False)
    p.add_argument("ops_args", nargs=argparse.REMAINDER, help="compact|metrics [options]")
    return parser


def _ack_wait_argument(p: argparse.ArgumentParser, what: str) -> None:
    """An edge's ack deadline: it holds messages for clients it cannot see die."""
    p.add_argument(
        "--ack-wait",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help=f"a message {what} returned and nobody answered goes to the next reader "
        "after this long (default 300)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("RELAY_LOG", "INFO"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        return args.func(args)
    except BrokenPipeError:
        return pipe_closed()
    except RelayError as exc:
        print(f"relay: {exc.code}: {exc}", file=sys.stderr)
        return 1
