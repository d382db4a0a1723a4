"""Waiting until the broker settles, checking it against the model, and the report of
a failure (which ids are where, the subscriptions, each process's log)."""

from __future__ import annotations

import os
import time
from typing import NoReturn

from tests.model.model import Model, Seen, Snapshot
from tests.model.snapshot import read_disk, read_index
from tests.model.world import World

SETTLE_S = float(os.environ.get("RELAY_MODEL_SETTLE_S", "15"))  # the longest wait
STUCK_S = float(os.environ.get("RELAY_MODEL_STUCK_S", "4"))  # problems, and nothing moves


def snapshot(world: World, model: Model) -> Snapshot:
    for sub in world.subs:
        if sub.mode == "process" and not sub.ended:
            world.read_consumer(sub)
    index = read_index(world.checker, dict(model.registered))
    disk = read_disk(world.broker.home.mailboxes, model.endpoints())
    with world.lock:
        seen = {sub.key: [Seen.of(r) for r in sub.receipts] for sub in world.subs}
    return Snapshot(disk, index, seen)


def settle(world: World, model: Model) -> None:
    """Poll until nothing is wrong and two snapshots in a row are equal; fail at once on
    what cannot heal, after STUCK_S when nothing changes, after SETTLE_S in any case."""
    start = time.monotonic()
    previous, changed = None, start
    while True:
        snap = snapshot(world, model)
        fatal, problems = model.check(snap, world.broker.home.mailboxes)
        if fatal:
            fail(world, model, "broken promise", fatal)
        key = snap.key()
        now = time.monotonic()
        if key != previous:
            previous, changed = key, now
        elif not problems:
            return
        elif now - changed > STUCK_S:  # waiting longer will not help
            fail(world, model, f"stuck for {STUCK_S:g} s", problems)
        if now - start > SETTLE_S:
            fail(
                world, model, f"not settled after {SETTLE_S:g} s", problems or ["it kept changing"]
            )
        time.sleep(0.02)


def fail(world: World, model: Model, title: str, lines: list[str]) -> NoReturn:
    subs = "\n".join(
        f"  {s.name}{' ended' if s.ended else ''}: pushed {len(s.receipts)}" for s in world.subs
    )
    clients = "\n".join(
        f"  {c.name}{' closed' if c.closed else ''}: subscription ids {sorted(c.client._subs)}"
        for c in world.clients
    )
    raise AssertionError(
        f"{title}:\n  " + "\n  ".join(lines[:40]) + f"\nregistered: {sorted(model.registered)}"
        f"\ndeny rules: {model.rules}\ndefault credit: {model.default_credit}"
        f"\nsubscriptions:\n{subs}\nclients:\n{clients}"
        "\nsteps of this sequence:\n  " + "\n  ".join(world.steps) + f"\n{world.log_tail()}"
    )
