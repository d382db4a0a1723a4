"""The `relay` command: the broker's processes and the operator's tools.

Process commands run in the foreground: `relay router`, `relay writer --shard K
--shards N` (one line each in the Procfile) and `relay up`, the whole group with a
supervisor that restarts a crashed writer. Every other command talks to a running
broker through the SDK; output is for people unless `--json` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sdk.client import Client, connect
from sdk.curve import load_public
from sdk.errors import RelayError
from sdk.paths import Home, write_private
from sdk.types import AccessRule, Envelope, Signal

DEFAULT_SHARDS = 2


# ---------------------------------------------------------------------- processes


def cmd_router(args: argparse.Namespace) -> int:
    from broker import router

    return router.main(
        Home(args.home), args.shards, address=args.address, signals_address=args.signals_address
    )


def cmd_writer(args: argparse.Namespace) -> int:
    from workers import writer

    return writer.main(Home(args.home), args.shard, args.shards)


def cmd_up(args: argparse.Namespace) -> int:
    """Run the router and N writers; restart a writer that dies; stop all on a signal."""
    home = Home(args.home).create()
    base = [sys.executable, "-m", "broker.cli", "--home", str(home.root)]
    router_cmd = [*base, "router", "--shards", str(args.shards)]
    if args.address:
        router_cmd += ["--address", args.address]
    if args.signals_address:
        router_cmd += ["--signals-address", args.signals_address]
    commands = {"router": router_cmd} | {
        f"writer.{k}": [*base, "writer", "--shard", str(k), "--shards", str(args.shards)]
        for k in range(args.shards)
    }
    procs = {name: subprocess.Popen(cmd) for name, cmd in commands.items()}
    stopping = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"relay up: home {home.root}, {args.shards} shards, pids "
        + ", ".join(f"{n}={p.pid}" for n, p in procs.items()),
        flush=True,
    )
    threading.Thread(
        target=_say_ready, args=(home, args.address, stopping), name="ready", daemon=True
    ).start()
    exit_code = 0
    while not stopping.wait(0.2):
        for name, proc in procs.items():
            code = proc.poll()
            if code is None:
                continue
            if name == "router":
                print(f"relay up: router exited with {code}; stopping", file=sys.stderr)
                exit_code = code or 1
                stopping.set()
                break
            print(f"relay up: {name} exited with {code}; restarting it", file=sys.stderr)
            procs[name] = subprocess.Popen(commands[name])
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in procs.values():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return exit_code


def _say_ready(home: Home, address: str | None, stopping: threading.Event) -> None:
    """Print "ready" once the router answers and every writer has said hello to it: a
    script that waits for that line can publish at once."""
    while not stopping.wait(0.1):
        try:
            with connect(home.root, address=address, timeout=1.0) as client:
                writers = client.status()["writers"]
        except RelayError:
            continue
        if all(w.get("state") == "up" for w in writers):
            print(f"relay up: ready ({len(writers)} writers up)", flush=True)
            return


# ---------------------------------------------------------------------- operator tools


def _client(args: argparse.Namespace) -> Client:
    return connect(
        args.home,
        address=args.address,
        timeout=args.timeout,
        key_file=args.key_file,
        server_key=args.server_key,
    )


def _out(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else human(data))


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[[("" if c is None else str(c)) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) if rows else "\n".join(lines[:1]) + "\n(none)"


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a plain string is a fine payload


def cmd_publish(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.publish(
            args.subject, _payload(args.payload), sender=args.sender, reply_to=args.reply_to
        )
    data = result.to_wire()
    _out(
        args,
        data,
        lambda d: (
            f"{d['messageId']}: delivered to {d['deliveredTo']}"
            + "".join(f"\n  rejected {h}: {r}" for h, r in d["rejected"])
        ),
    )
    return 0


def cmd_subscribe(args: argparse.Namespace) -> int:
    done = threading.Event()
    seen = 0

    def show(envelope: Envelope) -> None:
        nonlocal seen
        if args.json:
            print(json.dumps(envelope.to_wire()), flush=True)
        else:
            print(
                f"{envelope.id} {envelope.subject} from {envelope.sender}: "
                f"{json.dumps(envelope.payload)}",
                flush=True,
            )
        seen += 1
        if args.count and seen >= args.count:
            done.set()

    with _client(args) as client:
        subscribe = client.observe if args.observe else client.subscribe
        subscribe(args.pattern, show)
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


def cmd_endpoints(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "register":
            info = client.register_endpoint(args.subject).to_wire()
            _out(args, info, lambda d: f"{d['subject']} -> {d['maildirPath']}")
        elif args.action == "unregister":
            removed = client.unregister_endpoint(args.subject)
            _out(
                args,
                {"removed": removed},
                lambda d: "unregistered (mail kept)" if removed else "not registered",
            )
        else:
            rows = client.status()["endpoints"]
            _out(
                args,
                rows,
                lambda rs: _table(
                    [(r["subject"], r["hash"], r["depth"]) for r in rs],
                    ("SUBJECT", "HASH", "WAITING"),
                ),
            )
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "add":
            rule = AccessRule.from_wire(
                {
                    "from": args.from_pattern,
                    "to": args.to_pattern,
                    "action": args.rule_action,
                    "priority": args.priority,
                }
            )
            _out(args, client.add_rule(rule).to_wire(), lambda d: f"added {d}")
        elif args.action == "remove":
            removed = client.remove_rule(args.from_pattern, args.to_pattern)
            _out(args, {"removed": removed}, lambda d: "removed" if removed else "no such rule")
        else:
            rules = [r.to_wire() for r in client.list_rules()]
            _out(
                args,
                rules,
                lambda rs: _table(
                    [(r["priority"], r["action"], r["from"], r["to"]) for r in rs],
                    ("PRIORITY", "ACTION", "FROM", "TO"),
                ),
            )
    return 0


def _letters_table(items: list[dict[str, Any]]) -> str:
    return _table(
        [(i["id"], i["endpoint"], i["subject"], i["from"], i["code"], i["reason"]) for i in items],
        ("ID", "ENDPOINT", "SUBJECT", "FROM", "CODE", "REASON"),
    )


def cmd_dlq(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "purge":
            purged = client.purge_dead_letters(args.endpoint)
            _out(args, {"purged": purged}, lambda d: f"purged {purged} dead letters")
        else:
            items = client.dead_letters(args.endpoint, limit=args.limit)
            _out(args, items, _letters_table)
    return 0


def cmd_pending(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.complete or args.fail or args.requeue:
            info = client.status()["endpoints"]
            endpoint = next((e["hash"] for e in info if e["subject"] == args.subject), None)
            if endpoint is None:
                print(f"endpoint {args.subject} is not registered", file=sys.stderr)
                return 1
            for message_id in args.complete or []:
                client.complete(message_id, endpoint)
            for message_id in args.fail or []:
                client.fail(message_id, endpoint, args.reason)
            for message_id in args.requeue or []:
                client.requeue(message_id, endpoint)
            _out(
                args,
                {
                    "completed": args.complete or [],
                    "failed": args.fail or [],
                    "requeued": args.requeue or [],
                },
                lambda d: "ok",
            )
            return 0
        items = client.pending(args.subject)
        _out(
            args,
            items,
            lambda its: _table(
                [(i["id"], i["from"], i["claimedAt"]) for i in its], ("ID", "FROM", "CLAIMED AT")
            ),
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.status()

    def human(s: dict[str, Any]) -> str:
        writers = ", ".join(
            f"shard {w['shard']}: " + (f"pid {w['pid']}" if w["pid"] else w.get("state", "down"))
            for w in s["writers"]
        )
        lines = [
            f"router pid {s['router']['pid']} on {s['router']['address']}",
            f"writers: {writers}",
            f"clients {s['clients']}, subscriptions {s['subscriptions']}, "
            f"requests waiting on writers {s['pendingRequests']}",
        ]
        lines += [f"{name} REFUSED: {why}" for name, why in s.get("fileErrors", {}).items()]
        rows = [
            (e["subject"], e["hash"], e["depth"], f"{e['pressure']:.0%}", e["breaker"]["state"])
            for e in s["endpoints"]
        ]
        lines.append(_table(rows, ("ENDPOINT", "HASH", "WAITING", "PRESSURE", "BREAKER")))
        return "\n".join(lines)

    _out(args, status, human)
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    with _client(args) as client:
        trace = client.trace(args.id)

    def human(t: dict[str, Any]) -> str:
        if not t["copies"]:
            return f"{t['id']}: no copy found"
        return _table(
            [
                (
                    c["endpoint"],
                    c["subject"],
                    c["state"],
                    c["createdAt"],
                    c["storedAt"],
                    c["claimedAt"],
                    c["finishedAt"],
                    c["reason"],
                )
                for c in t["copies"]
            ],
            ("ENDPOINT", "SUBJECT", "STATE", "CREATED", "STORED", "CLAIMED", "FINISHED", "REASON"),
        )

    _out(args, trace, human)
    return 0


def cmd_signals(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.send:
            body = {
                "type": args.send,
                "state": args.state,
                "endpointSubject": args.pattern,
                "timestamp": int(time.time() * 1000),
            }
            client.signal(args.pattern, Signal.from_wire(body), sender=args.sender)
            return 0
        done = threading.Event()

        def show(subject: str, sig: Signal) -> None:
            if args.json:
                print(json.dumps({"subject": subject, **sig.to_wire()}), flush=True)
            else:
                print(f"{subject} {sig.type} {sig.state} {json.dumps(sig.data)}", flush=True)

        client.on_signal(args.pattern, show)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    with _client(args) as client:
        count = client.rebuild_index()
    _out(args, {"messages": count}, lambda d: f"index rebuilt from the Maildir: {count} messages")
    return 0


def _put_setting(partial: dict[str, Any], item: str) -> bool:
    """Add one ``section.key=value`` to ``partial``; False if ``item`` is not one."""
    key, _, value = item.partition("=")
    # Every dot nests, so the seeds' reliability.rateLimit.maxPerWindow works as well as
    # rateLimit.maxPerWindow (broker/control.py, RELIABILITY).
    path = key.split(".")
    *sections, name = path
    if not sections or not all(path):
        return False
    for section in sections:
        partial = partial.setdefault(section, {})
        if not isinstance(partial, dict):  # a.b=1 a.b.c=2: b cannot be both
            return False
    partial[name] = _payload(value)
    return True


def cmd_config(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "set":
            partial: dict[str, Any] = {}
            for item in args.settings:
                if not _put_setting(partial, item):
                    print(f"expected section.key=value, got {item!r}", file=sys.stderr)
                    return 2
            config = client.set_config(partial)
        else:
            config = client.get_config()
    _out(
        args,
        config,
        lambda c: "\n".join(
            f"{s}.{k} = {json.dumps(v)}" for s, vs in c.items() for k, v in vs.items()
        ),
    )
    return 0


def cmd_auth(args: argparse.Namespace) -> int:
    """Edit auth.json in the data directory; the running router applies it at once."""
    from broker.auth import AuthPolicy
    from sdk.curve import create_certificate, server_certificate

    home = Home(args.home).create()
    if os.getuid() != home.owner_uid:  # a file the broker's user could not read
        print(
            f"relay auth: run it as the data directory's owner (uid {home.owner_uid})",
            file=sys.stderr,
        )
        return 2
    data = json.loads(home.auth_file.read_text()) if home.auth_file.exists() else {}
    uids, keys = data.setdefault("uids", {}), data.setdefault("keys", {})
    entry = {"name": args.name, "senders": args.sender or [], "admin": args.admin}
    if args.consume:
        entry["consumes"] = args.consume
    if args.action in ("allow-uid", "add-key", "add-token", "remove") and not args.target:
        print(f"relay auth {args.action}: which uid, key name or key?", file=sys.stderr)
        return 2
    if args.action in ("allow-uid", "add-key", "add-token") and not args.sender:
        print("relay auth: give at least one --sender pattern", file=sys.stderr)
        return 2
    if args.action == "allow-uid":
        uids[args.target] = {**entry, "name": args.name or f"uid {args.target}"}
    elif args.action in ("add-key", "add-token"):
        # A token's key stays in <home>/keys: the HTTP gateway connects with it.
        directory = Path(args.dir) if args.dir and args.action == "add-key" else home.keys
        if (directory / f"{args.target}.key_secret").exists():
            print(f"relay auth: {directory}/{args.target}.key_secret exists", file=sys.stderr)
            return 2
        public_file, secret_file = create_certificate(directory, args.target)
        public = load_public(public_file).decode()
        keys[public] = {**entry, "name": args.name or args.target}
        if args.action == "add-token":
            from edges.http.credentials import new_token, token_hash

            token = new_token()
            keys[public]["tokens"] = [token_hash(token)]
            print(f"HTTP bearer token (shown once; auth.json keeps its hash): {token}")
        else:
            print(f"client certificate: {secret_file} (give it to the client, keep it secret)")
    elif args.action == "remove":
        gone = [k for k, v in keys.items() if args.target in (k, v.get("name"))]
        gone_uids = [u for u, v in uids.items() if args.target in (u, v.get("name"))]
        for k in gone:
            del keys[k]
        for u in gone_uids:
            del uids[u]
        if not gone and not gone_uids:
            print(f"relay auth: no uid or key named {args.target!r}", file=sys.stderr)
            return 1
    elif args.action == "server-key":
        public, _ = server_certificate(home.keys)
        print(f"{public.decode()}  ({home.server_public_key_file})")
        return 0
    if args.action != "list":
        AuthPolicy.from_json(data, home.owner_uid)  # refuse to write what the router would refuse
        write_private(home.auth_file, json.dumps(data, indent=2) + "\n")
    listed = [(f"uid {u}", v) for u, v in uids.items()] + [(f"key {k}", v) for k, v in keys.items()]
    rows = []
    for who, v in listed:
        receives = v.get("consumes", v["senders"])
        shown = " ".join(receives) or "nothing"
        rows.append((who, v["name"], " ".join(v["senders"]), shown, v["admin"]))
    print(_table(rows, ["who", "name", "may send as", "may receive", "admin"]))
    print(f"(uid {home.owner_uid}, the broker's owner, is admitted with every right unless listed)")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from edges.mcp_server import serve  # the mcp package is needed by this command only

    with _client(args) as client:
        serve(client, args.sender, http=args.http)
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
    )


def cmd_ops(args: argparse.Namespace) -> int:
    from ops.cli import main as ops_main  # imports nothing of Spark until a job runs

    return ops_main(args.ops_args, home=args.home)


# ---------------------------------------------------------------------- parser


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
    p = command("up", cmd_up, "run the router and all writers in the foreground", client=False)
    p.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    p.add_argument("--address")
    p.add_argument("--signals-address")

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
    p = command("rules", cmd_rules, "list, add or remove access rules")
    p.add_argument("action", nargs="?", default="list", choices=["list", "add", "remove"])
    p.add_argument("from_pattern", nargs="?")
    p.add_argument("to_pattern", nargs="?")
    p.add_argument("rule_action", nargs="?", choices=["allow", "deny"], default="deny")
    p.add_argument("--priority", type=int, default=0)
    p = command("dlq", cmd_dlq, "list or purge dead letters")
    p.add_argument("action", nargs="?", default="list", choices=["list", "purge"])
    p.add_argument("--endpoint", help="endpoint subject or hash")
    p.add_argument("--limit", type=int, default=100)
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
    p = command("config", cmd_config, "show or change reliability settings")
    p.add_argument("action", nargs="?", default="get", choices=["get", "set"])
    p.add_argument("settings", nargs="*", metavar="section.key=value")
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
    p.add_argument("--name", help="a name for people (default: the key name or uid)")
    p.add_argument("--dir", help="where add-key writes the certificate (default <home>/keys)")
    p = command("mcp", cmd_mcp, "an MCP server: Relay's tools for one agent (stdio)")
    p.add_argument("--as", dest="sender", required=True, help="the sender subject it acts as")
    p.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at /mcp instead")
    p = command("http", cmd_http, "the HTTP + SSE gateway and the live console (docs/http.md)")
    p.add_argument("--listen", default="127.0.0.1:7480", help="HOST:PORT (default 127.0.0.1:7480)")
    p = command("ops", cmd_ops, "Spark jobs: compaction and metrics", client=False)
    p.add_argument("ops_args", nargs=argparse.REMAINDER, help="compact|metrics [options]")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("RELAY_LOG", "INFO"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        return args.func(args)
    except RelayError as exc:
        print(f"relay: {exc.code}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
