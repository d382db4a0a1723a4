"""`relay auth`: who may connect and send as what, kept in auth.json in the data
directory; the running router applies each change at once (broker/watch.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cli.output import table
from sdk.curve import load_public
from sdk.paths import Home, write_private


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
    print(table(rows, ["who", "name", "may send as", "may receive", "admin"]))
    print(f"(uid {home.owner_uid}, the broker's owner, is admitted with every right unless listed)")
    return 0
