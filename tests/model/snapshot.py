"""What the system says at one moment: the Maildir, read with os.listdir (the truth), and
the index's answers (pending, dead_letters, status) through the SDK."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdk.client import Client
from sdk.paths import UNROUTABLE

PENDING_LIMIT = 100  # what pending() lists at most (the SDK sends no limit)
DEAD_LIMIT = 1000  # the most dead_letters() lists


@dataclass
class Disk:
    # (id, endpoint hash) -> its places: "new", "claimed", "done", "failed", "tmp"
    places: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    tmp: dict[str, int] = field(default_factory=dict)  # endpoint -> files in tmp/
    # (id, endpoint) -> the hand-outs its name in cur/ says (no N=: 1), read by hand
    deliveries: dict[tuple[str, str], int] = field(default_factory=dict)

    def key(self) -> Any:
        return (
            sorted((k, tuple(v)) for k, v in self.places.items()),
            sorted(self.tmp.items()),
            sorted(self.deliveries.items()),
        )

    def where(self, message_id: str, endpoint: str) -> list[str]:
        return self.places.get((message_id, endpoint), [])

    def ids(self, endpoint: str, place: str) -> list[str]:
        return sorted(
            i for (i, e), where in self.places.items() if e == endpoint and place in where
        )


def read_disk(mailboxes: Path, endpoints: list[str]) -> Disk:
    disk = Disk()
    for endpoint in [*endpoints, UNROUTABLE]:
        root = mailboxes / endpoint
        for directory in ("new", "cur", "failed"):
            try:
                names = os.listdir(root / directory)
            except FileNotFoundError:
                continue
            for name in names:
                message_id = name.split(",")[0].split(":")[0]
                if directory == "cur":
                    place = "done" if ",D=" in name else "claimed"
                    disk.deliveries[(message_id, endpoint)] = deliveries_in(name)
                else:
                    place = directory
                disk.places.setdefault((message_id, endpoint), []).append(place)
        try:
            disk.tmp[endpoint] = len(os.listdir(root / "tmp"))
        except FileNotFoundError:
            disk.tmp[endpoint] = 0
    return disk


def deliveries_in(name: str) -> int:
    """The N= field of a name in cur/ (docs/architecture.md, "File names and states"):
    how many times the copy was handed out; a claimed name without it says once."""
    fields = name.split(":")[0].split(",")[1:]
    return next((int(f[2:]) for f in fields if f.startswith("N=")), 1)


def dead_letter_of(mailboxes: Path, message_id: str, endpoint: str) -> dict[str, Any]:
    """The ``deadLetter`` part of a file in failed/ ({} when unreadable)."""
    try:
        data = json.loads((mailboxes / endpoint / "failed" / message_id).read_bytes())
        return data.get("deadLetter") or {}
    except (OSError, ValueError):
        return {}


@dataclass
class Index:
    depth: dict[str, int]  # registered endpoint -> depth (status)
    pending: dict[str, list[str]]  # registered endpoint -> pending ids (first 100)
    pending_deliveries: dict[tuple[str, str], int]  # (id, endpoint) -> pending's deliveries
    dead: dict[tuple[str, str], tuple[str, str]]  # (id, endpoint) -> (code, reason)
    unroutable: int
    writers: list[bool]  # shard -> the router counts its writer as up
    subscriptions: int

    def key(self) -> Any:
        return (
            sorted(self.depth.items()),
            sorted((k, tuple(v)) for k, v in self.pending.items()),
            sorted(self.pending_deliveries.items()),
            sorted(self.dead),
            self.unroutable,
            self.writers,
            self.subscriptions,
        )


def read_index(client: Client, registered: dict[str, str]) -> Index:
    """``registered``: subject -> hash of the endpoints registered now."""
    status = client.status()
    depth = {e["hash"]: e["depth"] for e in status["endpoints"]}
    items = {h: client.pending(subject) for subject, h in registered.items()}
    pending = {h: sorted(p["id"] for p in listed) for h, listed in items.items()}
    deliveries = {(p["id"], h): p["deliveries"] for h, listed in items.items() for p in listed}
    dead = {
        (d["id"], d["endpoint"]): (d.get("code") or "", d.get("reason") or "")
        for d in client.dead_letters(limit=DEAD_LIMIT)
    }
    return Index(
        depth=depth,
        pending=pending,
        pending_deliveries=deliveries,
        dead=dead,
        unroutable=status["unroutable"],
        writers=[bool(w["pid"]) for w in status["writers"]],
        subscriptions=status["subscriptions"],
    )
