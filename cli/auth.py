"""`relay auth`: who may connect and send as what, kept in auth.json in the data
directory; the running router applies each change at once (broker/watch.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.output import table
from sdk.curve import load_public
from sdk.paths import Home, write_private


def cmd_auth(args: argparse.Namespace) -> int:
    """Edit auth.json in the data directory; the running router applies it at once.

    Each action is one function below that changes the parsed auth.json (``data``) and
    returns None to have it checked, written and listed, or an exit code to stop there.
    """
    from broker.auth import AuthPolicy

    home = Home(args.home).create()
    if os.getuid() != home.owner_uid:  # a file the broker's user could not read
        print(
            f"relay auth: run it as the data directory's owner (uid {home.owner_uid})",
            file=sys.stderr,
        )
        return 2
    data = json.loads(home.auth_file.read_text()) if home.auth_file.exists() else {}
    data.setdefault("uids", {})
    data.setdefault("keys", {})
    if args.action in ("allow-uid", "add-key", "add-token", "remove") and not args.target:
        print(f"relay auth {args.action}: which uid, key name or key?", file=sys.stderr)
        return 2
    if args.action in ("allow-uid", "add-key", "add-token") and not args.sender:
        print("relay auth: give at least one --sender pattern", file=sys.stderr)
        return 2
    action = ACTIONS.get(args.action)
    if action is not None:
        code = action(args, home, data)
        if code is not None:
            return code
        AuthPolicy.from_json(data, home.owner_uid)  # refuse to write what the router would refuse
        write_private(home.auth_file, json.dumps(data, indent=2) + "\n")
    _list(home, data)
    return 0


def _entry(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """The auth.json entry the options describe; ``name`` when --name is not given."""
    entry: dict[str, Any] = {
        "name": args.name or name,
        "senders": args.sender or [],
        "admin": args.admin,
    }
    if args.consume:
        entry["consumes"] = args.consume
    return entry


def _allow_uid(args: argparse.Namespace, home: Home, data: dict[str, Any]) -> int | None:
    """``allow-uid UID``: a local user, admitted over ipc:// by its uid."""
    data["uids"][args.target] = _entry(args, f"uid {args.target}")
    return None


def _add_key(args: argparse.Namespace, home: Home, data: dict[str, Any]) -> int | None:
    """``add-key NAME``: a CURVE certificate for a tcp:// client (in --dir, default
    <home>/keys); ``add-token NAME`` also makes an HTTP bearer token for that key."""
    from sdk.curve import create_certificate

    # A token's key stays in <home>/keys: the HTTP gateway connects with it.
    directory = Path(args.dir) if args.dir and args.action == "add-key" else home.keys
    if (directory / f"{args.target}.key_secret").exists():
        print(f"relay auth: {directory}/{args.target}.key_secret exists", file=sys.stderr)
        return 2
    public_file, secret_file = create_certificate(directory, args.target)
    public = load_public(public_file).decode()
    data["keys"][public] = _entry(args, args.target)
    if args.action == "add-token":
        from edges.http.credentials import new_token, token_hash

        token = new_token()
        data["keys"][public]["tokens"] = [token_hash(token)]
        print(f"HTTP bearer token (shown once; auth.json keeps its hash): {token}")
    else:
        print(f"client certificate: {secret_file} (give it to the client, keep it secret)")
    return None


def _remove(args: argparse.Namespace, home: Home, data: dict[str, Any]) -> int | None:
    """``remove WHO``: every uid and key whose id or name is WHO."""
    keys, uids = data["keys"], data["uids"]
    gone = [k for k, v in keys.items() if args.target in (k, v.get("name"))]
    gone_uids = [u for u, v in uids.items() if args.target in (u, v.get("name"))]
    for k in gone:
        del keys[k]
    for u in gone_uids:
        del uids[u]
    if not gone and not gone_uids:
        print(f"relay auth: no uid or key named {args.target!r}", file=sys.stderr)
        return 1
    return None


def _server_key(args: argparse.Namespace, home: Home, data: dict[str, Any]) -> int | None:
    """``server-key``: the router's public CURVE key (made on first use); auth.json is
    left as it is."""
    from sdk.curve import server_certificate

    public, _ = server_certificate(home.keys)
    print(f"{public.decode()}  ({home.server_public_key_file})")
    return 0


ACTIONS: dict[str, Callable[[argparse.Namespace, Home, dict[str, Any]], int | None]] = {
    "allow-uid": _allow_uid,
    "add-key": _add_key,
    "add-token": _add_key,
    "remove": _remove,
    "server-key": _server_key,
}  # and "list", the default, which only lists


def _list(home: Home, data: dict[str, Any]) -> None:
    """Every uid and key admitted, with what each may send as and receive."""
    uids, keys = data["uids"], data["keys"]
    listed = [(f"uid {u}", v) for u, v in uids.items()] + [(f"key {k}", v) for k, v in keys.items()]
    rows = []
    for who, v in listed:
        receives = v.get("consumes", v["senders"])
        shown = " ".join(receives) or "nothing"
        rows.append((who, v["name"], " ".join(v["senders"]), shown, v["admin"]))
    print(table(rows, ["who", "name", "may send as", "may receive", "admin"]))
    print(f"(uid {home.owner_uid}, the broker's owner, is admitted with every right unless listed)")
