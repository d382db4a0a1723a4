"""`relay auth`: who may connect and send as what, kept in auth.json in the data
directory; the running router applies each change at once (broker/watch.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
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
    if args.expires is not None and args.action != "add-token":
        print("relay auth: --expires is for add-token", file=sys.stderr)
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
    if args.delegate:
        entry["delegate"] = True
    if args.consume:
        entry["consumes"] = args.consume
    return entry


def _allow_uid(args: argparse.Namespace, home: Home, data: dict[str, Any]) -> int | None:
    """``allow-uid UID``: a local user, admitted over ipc:// by its uid."""
    data["uids"][args.target] = _entry(args, f"uid {args.target}")
    return None


def _add_key(args: argparse.Namespace, home: Home, data: dict[str, Any]) -> int | None:
    """``add-key NAME``: a CURVE certificate for a tcp:// client (in --dir, default
    <home>/keys)."""
    from sdk.curve import create_certificate

    directory = Path(args.dir) if args.dir else home.keys
    if (directory / f"{args.target}.key_secret").exists():
        print(f"relay auth: {directory}/{args.target}.key_secret exists", file=sys.stderr)
        return 2
    public_file, secret_file = create_certificate(directory, args.target)
    data["keys"][load_public(public_file).decode()] = _entry(args, args.target)
    print(f"client certificate: {secret_file} (give it to the client, keep it secret)")
    return None


def _add_token(args: argparse.Namespace, home: Home, data: dict[str, Any]) -> int | None:
    """``add-token NAME [--expires 30d]``: an identity reached only through its bearer
    token, which an edge verifies before acting for it (edges/tokens.py). Its entry is
    keyed by a fresh public key whose secret is thrown away: nobody connects with it."""
    import zmq

    from edges.tokens import new_token, token_hash

    if any(args.target == v.get("name") for v in [*data["keys"].values(), *data["uids"].values()]):
        print(f"relay auth: {args.target!r} is taken; remove it first", file=sys.stderr)
        return 2
    token = new_token()
    grant: Any = token_hash(token)
    if args.expires is not None:
        try:
            lasts = duration_s(args.expires)
        except ValueError as exc:
            print(f"relay auth: --expires: {exc}", file=sys.stderr)
            return 2
        until = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=lasts)
        grant = {"hash": token_hash(token), "expires": until.isoformat().replace("+00:00", "Z")}
    public, _ = zmq.curve_keypair()
    data["keys"][public.decode()] = {**_entry(args, args.target), "tokens": [grant]}
    print(f"bearer token (shown once; auth.json keeps its hash): {token}")
    return None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``45s`` in seconds; `ValueError` otherwise."""
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.isdigit() or int(number) == 0:
        raise ValueError(f"{text!r} is not a duration like 30d, 12h, 90m or 45s")
    return int(number) * _UNITS[unit]


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
    "add-token": _add_token,
    "remove": _remove,
    "server-key": _server_key,
}  # and "list", the default, which only lists


def _list(home: Home, data: dict[str, Any]) -> None:
    """Every uid and key admitted: what each may send as and receive, whether it is an
    operator or a delegate, and its tokens' expiry (never a token, nor its hash)."""
    uids, keys = data["uids"], data["keys"]
    listed = [(f"uid {u}", v) for u, v in uids.items()] + [(f"key {k}", v) for k, v in keys.items()]
    rows = []
    for who, v in listed:
        receives = v.get("consumes", v["senders"])
        shown = " ".join(receives) or "nothing"
        tokens = "; ".join(_expiry(t) for t in v.get("tokens", [])) or "-"
        rows.append(
            (
                who,
                v["name"],
                " ".join(v["senders"]),
                shown,
                v["admin"],
                v.get("delegate", False),
                tokens,
            )
        )
    headers = ["who", "name", "may send as", "may receive", "admin", "delegate", "tokens"]
    print(table(rows, headers))
    print(
        f"(uid {home.owner_uid}, the broker's owner, is admitted with every right, delegation "
        "included, unless listed)"
    )


def _expiry(grant: Any) -> str:
    if isinstance(grant, str):
        return "no expiry"
    expires = datetime.fromisoformat(grant["expires"])
    word = "expired" if expires <= datetime.now(UTC) else "expires"
    return f"{word} {grant['expires']}"
