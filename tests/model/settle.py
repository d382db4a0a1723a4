"""Waiting until the broker settles, checking it against the model, and the report of
a failure (which ids are where, the subscriptions, each process's log)."""

from __future__ import annotations

import os
import time
from typing import NoReturn

from tests.model.model import Model, Seen, Snapshot
from tests.model.snapshot import read_disk, read_index
from tests.model.world import Sub, World

SETTLE_S = float(os.environ.get("RELAY_MODEL_SETTLE_S", "15"))  # the longest wait
STUCK_S = float(os.environ.get("RELAY_MODEL_STUCK_S", "4"))  # problems, and nothing moves


def snapshot(world: World, model: Model) -> Snapshot:
    """What the system says now. Its time is when it was begun: whatever was due by
    then shows in every part read after (the pushes recorded are read last)."""
    at = time.monotonic()
    for sub in world.subs:
        if sub.mode == "process" and sub.killed_at is None:
            world.read_consumer(sub)
    index = read_index(world.checker, dict(model.registered))
    disk = read_disk(world.broker.home.mailboxes, model.endpoints())
    with world.lock:
        seen = {sub.key: [Seen.of(r) for r in sub.receipts] for sub in world.subs}
    return Snapshot(disk, index, seen, at)


def settle(world: World, model: Model) -> None:
    """Poll until nothing is wrong, two snapshots in a row are equal and everything the
    model knew to be due when it began (a release by ack deadline, an orphan's, a silent
    session's end) has had its time; fail at once on what cannot heal, after STUCK_S
    when nothing changes (counted from that time), after SETTLE_S in any case (plus
    that wait)."""
    start = time.monotonic()
    due = model.due(start)
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
        elif not problems and snap.at >= due:  # checked as of a time past everything due
            return
        elif problems and now - max(changed, due) > STUCK_S:  # waiting longer will not help
            fail(world, model, f"stuck for {STUCK_S:g} s", problems)
        if now - start > SETTLE_S + (due - start):
            fail(
                world, model, f"not settled after {SETTLE_S:g} s", problems or ["it kept changing"]
            )
        time.sleep(0.02)


def fail(world: World, model: Model, title: str, lines: list[str]) -> NoReturn:
    subs = "\n".join(
        f"  {s.name}{_end_of(s)}: handed {len(s.receipts)}" + _last_receipts(world, s)
        for s in world.subs
    )
    clients = "\n".join(
        f"  {c.name}{' closed' if c.closed else ''}: "
        f"subscription ids {sorted(c.client._subscriptions.workers)}"
        for c in world.clients
    )
    raise AssertionError(
        f"{title}:\n  " + "\n  ".join(lines[:40]) + f"\nregistered: {sorted(model.registered)}"
        f"\ndeny rules: {model.rules}\ndefault credit: {model.default_credit}"
        f"\nsubscriptions:\n{subs}\nclients:\n{clients}"
        "\nsteps of this sequence:\n  " + "\n  ".join(world.steps) + f"\n{world.log_tail()}"
    )


def _end_of(sub: Sub) -> str:
    if sub.killed_at is not None:
        return " killed"
    if sub.silenced is not None:
        return " silenced"
    return " ended" if sub.ended and sub.mode != "fetch" else ""


def _last_receipts(world: World, sub: Sub, count: int = 8) -> str:
    """The last hand-outs of a consumer: id, endpoint, deliveries, arrival, answer."""
    if sub.mode == "observe":
        return ""
    with world.lock:
        tail = list(sub.receipts[-count:])
    return "".join(
        f"\n      {r.id} {r.endpoint} d={r.deliveries} at {world.clock(r.at).strip()}"
        + (f" {r.handled} at {world.clock(r.handled_at).strip()}" if r.handled_at else "")
        + (f" refused at {world.clock(r.refused_at).strip()}" if r.refused_at else "")
        for r in tail
    )
