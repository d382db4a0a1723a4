"""Operator commands: they talk to a running broker through the SDK (publish,
subscribe, endpoints, rules, dlq, pending, status, trace, signals, rebuild-index,
config); output is for people unless `--json` is given (cli/output.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from broker.config import RELIABILITY, RELIABILITY_SECTIONS
from cli.output import emit, now_ms, pipe_closed, table, when, when_ago
from sdk import edge_state
from sdk.client import Client, connect
from sdk.errors import Unavailable
from sdk.paths import Home
from sdk.types import AccessRule, Envelope, Signal


def client_from_args(args: argparse.Namespace, acting_for: str | None = None) -> Client:
    """The client the common options of a command that talks to the broker describe
    (--address, --timeout, --key-file, --server-key; cli/main.py). Edges use it as is:
    started next to the router (a Procfile line), they wait for it to bind; with
    ``acting_for``, its requests act for that identity (docs/security.md, "Delegation")."""
    return connect(
        args.home,
        address=args.address,
        timeout=args.timeout,
        key_file=args.key_file,
        server_key=args.server_key,
        acting_for=acting_for,
    )


def broker_client(args: argparse.Namespace) -> Client:
    """`client_from_args` for an operator command: with no broker listening on an ipc://
    address, Unavailable at once, saying how to start one, not after --timeout."""
    home = Home(args.home)
    address = args.address or home.router_address
    if address.startswith("ipc://"):
        how = "relay up" if args.home is None else f"relay --home {home.root} up"
        _check_listening(home, address[len("ipc://") :], how)
    return client_from_args(args)


def _check_listening(home: Home, path: str, how: str) -> None:
    start = f"start one with `{how}` (or `{how} --detach`)"
    if not os.path.exists(path):
        raise Unavailable(f"no broker runs on {home.root} (no {path}): {start}")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)  # a listening socket accepts at once; ZeroMQ drops us quietly
    except ConnectionRefusedError:
        raise Unavailable(
            f"no broker runs on {home.root} (nothing listens on {path}, left by a broker "
            f"that was killed): {start}"
        ) from None
    except OSError:
        pass  # not ours to judge (a path too long, a permission): connect() will say
    finally:
        probe.close()


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a plain string is a fine payload


def cmd_publish(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        result = client.publish(
            args.subject, _payload(args.payload), sender=args.sender, reply_to=args.reply_to
        )
    data = result.to_wire()
    emit(
        args,
        data,
        lambda d: (
            f"{d['messageId']}: delivered to {d['deliveredTo']}"
            + "".join(f"\n  rejected {h}: {r}" for h, r in d["rejected"])
        ),
    )
    if data["deliveredTo"] == 0:  # a script must not take "stored nowhere" for success
        reasons = ", ".join(
            f"{reason} ({data['details'].get(where, where)})" for where, reason in data["rejected"]
        )
        print(
            f"relay: publish reached no endpoint: {reasons or 'no reason given'}", file=sys.stderr
        )
        return 1
    return 0


def cmd_subscribe(args: argparse.Namespace) -> int:
    done, broken = threading.Event(), threading.Event()
    subscribed = threading.Event()
    unsubscribe: list[Callable[[], None]] = []
    seen = 0

    def show(envelope: Envelope) -> None:
        nonlocal seen
        if args.count and seen >= args.count:
            return  # --observe: a message seen after the last one counted
        if args.json:
            line = json.dumps(envelope.to_wire())
        else:
            line = f"{envelope.id} {envelope.subject} from {envelope.sender}: "
            line += json.dumps(envelope.payload)
        try:
            print(line, flush=True)
        except BrokenPipeError:
            # Nobody reads: this message was not shown, so it is neither acked nor
            # nacked (a nack would make it a dead letter). The handler never returns;
            # the process ends, and the message is the broker's to hand out again.
            broken.set()
            done.set()
            threading.Event().wait()
        seen += 1
        if args.count and seen >= args.count:
            # Before this message's ack leaves: with a credit of one, nothing more is
            # handed to us, so exactly --count messages are taken (and acknowledged).
            if subscribed.wait(args.timeout):
                unsubscribe[0]()
            done.set()

    with broker_client(args) as client:
        if args.observe:
            unsubscribe.append(client.observe(args.pattern, show))
        else:
            # --count N takes exactly N: one message in hand at a time. A credit of N
            # is not enough: each ack gives credit back before the N-th is handled.
            credit = 1 if args.count else None
            unsubscribe.append(client.subscribe(args.pattern, show, credit=credit))
        subscribed.set()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return pipe_closed() if broken.is_set() else 0


def cmd_endpoints(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        if args.action == "register":
            info = client.register_endpoint(args.subject, shared=args.shared).to_wire()
            emit(args, info, lambda d: f"{d['subject']} -> {d['maildirPath']}")
        elif args.action == "unregister":
            removed = client.unregister_endpoint(args.subject)
            emit(
                args,
                {"removed": removed},
                lambda d: "unregistered (mail kept)" if removed else "not registered",
            )
        else:
            rows = client.status()["endpoints"]
            emit(
                args,
                rows,
                lambda rs: table(
                    [
                        (r["subject"], r["hash"], r["depth"], "yes" if r["shared"] else "no")
                        for r in rs
                    ],
                    ("SUBJECT", "HASH", "WAITING", "SHARED"),
                ),
            )
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        if args.action == "add":
            rule = AccessRule.from_wire(
                {
                    "from": args.from_pattern,
                    "to": args.to_pattern,
                    "action": args.rule_action,
                    "priority": args.priority,
                }
            )
            emit(args, client.add_rule(rule).to_wire(), lambda d: f"added {d}")
        elif args.action == "remove":
            removed = client.remove_rule(args.from_pattern, args.to_pattern)
            emit(args, {"removed": removed}, lambda d: "removed" if removed else "no such rule")
        else:
            rules = [r.to_wire() for r in client.list_rules()]
            emit(
                args,
                rules,
                lambda rs: table(
                    [(r["priority"], r["action"], r["from"], r["to"]) for r in rs],
                    ("PRIORITY", "ACTION", "FROM", "TO"),
                ),
            )
    return 0


def _letters_table(items: list[dict[str, Any]]) -> str:
    now = now_ms()
    return table(
        [
            (
                i["id"],
                when_ago(i["finishedAt"], now),
                i["endpoint"],
                i["subject"],
                i["from"],
                i["code"],
                i["reason"],
            )
            for i in items
        ],
        ("ID", "FAILED", "ENDPOINT", "SUBJECT", "FROM", "CODE", "REASON"),
    )


def cmd_dlq(args: argparse.Namespace) -> int:
    if args.action == "requeue":
        return _dlq_requeue(args)
    with broker_client(args) as client:
        if args.action == "purge":
            purged = client.purge_dead_letters(args.endpoint)
            emit(args, {"purged": purged}, lambda d: f"purged {purged} dead letters")
        else:
            items = client.dead_letters(args.endpoint, limit=args.limit)
            emit(args, items, _letters_table)
    return 0


def _dlq_requeue(args: argparse.Namespace) -> int:
    """`relay dlq requeue ID [--endpoint S]` or `--all --endpoint S [--limit N]
    [--after ID]`: one request, at most --limit dead letters (docs/operations.md)."""
    if (args.id is None) == (not args.all):
        print("relay dlq requeue: give a message id, or --all with --endpoint", file=sys.stderr)
        return 2
    if args.all and args.endpoint is None:
        print("relay dlq requeue --all: name the endpoint (--endpoint)", file=sys.stderr)
        return 2
    with broker_client(args) as client:
        answer = client.requeue_dead_letters(
            args.endpoint, message_id=args.id, limit=args.limit, after=args.after
        )

    def human(a: dict[str, Any]) -> str:
        where = args.endpoint or "their endpoints"
        count = len(a["requeued"])
        lines = [f"requeued {count} dead letter{'' if count == 1 else 's'} of {where}"]
        lines += [f"refused {r['id']}: {r['code']}: {r['message']}" for r in a["refused"]]
        if a["more"]:
            lines.append(f"more remain: run again with --after {a['after']}")
        return "\n".join(lines)

    emit(args, answer, human)
    return 0


def cmd_pending(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
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
            emit(
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
        emit(
            args,
            items,
            lambda its: table(
                [
                    (
                        i["id"],
                        i["from"],
                        when_ago(i["claimedAt"], now_ms()),
                        i.get("deliveries", ""),
                    )
                    for i in its
                ],
                ("ID", "FROM", "CLAIMED", "DELIVERIES"),
            ),
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        status = client.status()

    def human(s: dict[str, Any]) -> str:
        now = now_ms()
        writers = ", ".join(
            f"shard {w['shard']}: "
            + (f"pid {w['pid']}" if w["pid"] else w.get("state", "down"))
            + (f" ({w.get('state', 'up')} since {when(w['since'])})" if w.get("since") else "")
            for w in s["writers"]
        )
        router = s["router"]
        started = router.get("startedAt")
        lines = [
            f"router pid {router['pid']} on {router['address']}"
            + (f", started {when_ago(started, now)}" if started else ""),
            f"writers: {writers}",
            f"clients {s['clients']}, subscriptions {s['subscriptions']}, "
            f"requests waiting on writers {s['pendingRequests']}",
        ]
        lines += [f"{name} REFUSED: {why}" for name, why in s.get("fileErrors", {}).items()]
        lines += [edge_state.describe(e) for e in s.get("edges", [])]
        fed = s.get("federation") or {}
        if fed.get("node") or fed.get("remoteEndpoints"):
            nodes = ", ".join(f"{n} ({k} endpoints)" for n, k in fed["remoteEndpoints"].items())
            state = "connected" if fed["connected"] else "NOT CONNECTED"
            lines.append(
                f"bridge: node {fed['node']}, {state} to NATS {fed.get('server') or '?'} "
                f"(cluster {', '.join(fed.get('servers', [])) or '?'}), "
                f"{fed['queued']} parts waiting; other nodes: {nodes or 'none'}"
            )
            lag = ", ".join(f"{n} {k}" for n, k in sorted(fed.get("lag", {}).items()))
            lines.append(f"lag (messages not yet taken in, by node): {lag or 'unknown'}")
        rows = [
            (
                e["subject"],
                e["hash"],
                e["depth"],
                e.get("claimed", ""),  # handed out, not answered (a router before 25: none)
                when_ago(e["oldestClaimedAt"], now) if e.get("oldestClaimedAt") else "-",
                f"{e['pressure']:.1%}",
                e["breaker"]["state"],
            )
            for e in s["endpoints"]
        ]
        header = ("ENDPOINT", "HASH", "WAITING", "CLAIMED", "OLDEST CLAIM", "PRESSURE", "BREAKER")
        lines.append(table(rows, header))
        return "\n".join(lines)

    emit(args, status, human)
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        trace = client.trace(args.id)

    def human(t: dict[str, Any]) -> str:
        if not t["copies"]:
            return f"{t['id']}: no copy found"
        return table(
            [
                (
                    c["endpoint"],
                    c["subject"],
                    c["state"],
                    c.get("deliveries", ""),  # a router before issue 25 sends neither
                    c.get("parentId") or "-",
                    when(c["createdAt"], precise=True),
                    when(c["storedAt"], precise=True),
                    when(c["claimedAt"], precise=True),
                    when(c["finishedAt"], precise=True),
                    c["reason"],
                    _requeued(c.get("requeues") or []),
                )
                for c in t["copies"]
            ],
            (
                "ENDPOINT",
                "SUBJECT",
                "STATE",
                "DELIVERIES",
                "PARENT",
                "CREATED",
                "STORED",
                "CLAIMED",
                "FINISHED",
                "REASON",
                "REQUEUED",
            ),
        )

    emit(args, trace, human)
    return 0 if trace["copies"] else 1


def _requeued(requeues: list[dict[str, Any]]) -> str:
    """When a copy was last requeued from the dead letters, and how often if more than
    once ("" for never)."""
    if not requeues:
        return ""
    last = when(requeues[-1].get("requeuedAt"), precise=True)
    return last if len(requeues) == 1 else f"{last} ({len(requeues)} times)"


def cmd_signals(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        if args.send:
            body = {
                "type": args.send,
                "state": args.state,
                "endpointSubject": args.pattern,
                "timestamp": int(time.time() * 1000),
            }
            client.signal(args.pattern, Signal.from_wire(body), sender=args.sender)
            return 0
        done, broken = threading.Event(), threading.Event()

        def show(subject: str, sig: Signal) -> None:
            if args.json:
                line = json.dumps({"subject": subject, **sig.to_wire()})
            else:
                line = f"{subject} {sig.type} {sig.state} {json.dumps(sig.data)}"
            try:
                print(line, flush=True)
            except BrokenPipeError:
                broken.set()
                done.set()

        client.on_signal(args.pattern, show)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return pipe_closed() if broken.is_set() else 0


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        count = client.rebuild_index()
    emit(args, {"messages": count}, lambda d: f"index rebuilt from the Maildir: {count} messages")
    return 0


def _put_setting(partial: dict[str, Any], item: str) -> bool:
    """Add one ``section.key=value`` to ``partial``; False if ``item`` is not one."""
    key, _, value = item.partition("=")
    # Every dot nests, so the seeds' reliability.rateLimit.maxPerWindow works as well as
    # rateLimit.maxPerWindow (broker/config.py, RELIABILITY).
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


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """``section.key`` -> value: the config's two levels, flattened."""
    return {f"{s}.{k}": v for s, values in config.items() for k, v in values.items()}


def _own_layout(key: str) -> str:
    """The seeds' reliability.rateLimit.x read as Relay's rateLimit.x (the layout that
    get_config answers in; docs/operations.md)."""
    section, _, rest = key.partition(".")
    if section == RELIABILITY and rest.partition(".")[0] in RELIABILITY_SECTIONS:
        return rest
    return key


def _show(settings: dict[str, Any]) -> str:
    return "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())


def cmd_config(args: argparse.Namespace) -> int:
    with broker_client(args) as client:
        if args.action == "set":
            partial: dict[str, Any] = {}
            for item in args.settings:
                if not _put_setting(partial, item):
                    print(f"expected section.key=value, got {item!r}", file=sys.stderr)
                    return 2
            before = _settings(client.get_config())
            config = client.set_config(partial)
        else:
            config = client.get_config()
    settings = _settings(config)
    if args.action == "set":
        changed = [k for k, v in settings.items() if before.get(k) != v]
        emit(
            args,
            config,
            lambda _c: (
                "\n".join(
                    f"{k}: {json.dumps(before.get(k))} -> {json.dumps(settings[k])}"
                    for k in changed
                )
                or "nothing changed: every setting had that value already"
            ),
        )
        return 0
    if not args.settings:
        emit(args, config, lambda _c: _show(settings))
        return 0
    asked: dict[str, Any] = {}
    for key in map(_own_layout, args.settings):
        if key in settings:
            asked[key] = settings[key]
        elif key in config:  # a whole section
            asked.update({k: v for k, v in settings.items() if k.startswith(f"{key}.")})
        else:
            print(f"relay: no setting {key!r}; sections: {', '.join(config)}", file=sys.stderr)
            return 1
    if len(args.settings) == 1 and _own_layout(args.settings[0]) in settings:
        emit(args, next(iter(asked.values())), json.dumps)  # the value alone, for scripts
    else:
        emit(args, asked, _show)
    return 0
