"""`relay bridge --forget NODE`: remove a node from the federation for good
(docs/federation.md, "Removing a node").

A node whose bridge stops keeps its keys in the directory and its stream: the messages
for it wait there, which is the point of JetStream. An operator who retires a node
removes both: its keys (every bridge then tells its router the node has no endpoints,
and publishes stop making copies for it) and its stream, with the messages that were
waiting for it. That loses those messages on purpose, so it is refused while the node's
bridge still runs: its keys are fresh, or its consumer has a pull request waiting.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from nats.js.errors import BucketNotFoundError, NotFoundError

from edges import bridge_names as names
from edges.bridge import read_adverts

PULL_SAMPLES = 3  # looks at the node's consumer, FETCH_WAIT_S apart


class NodeRunning(Exception):
    """The node to forget still has a bridge at work."""


@dataclass(frozen=True, slots=True)
class Forgotten:
    node: str
    endpoints: list[str]  # the subjects it advertised
    dropped: int | None  # messages that waited in its stream; None: it had no stream

    def to_wire(self) -> dict[str, Any]:
        return {"node": self.node, "endpoints": self.endpoints, "dropped": self.dropped}


async def forget(nc: Any, node: str, *, pull_wait_s: float = 1.0) -> Forgotten:
    """Remove ``node``'s directory keys and its stream; NodeRunning if its bridge runs."""
    names.check_node(node)
    js = nc.jetstream(timeout=10)
    keys, adverts = await _keys_of(js, node)
    if names.running(adverts, int(time.time() * 1000)) or await _pulling(js, node, pull_wait_s):
        raise NodeRunning(
            f"the bridge of node {node} is running (its directory keys are fresh or it is "
            "pulling its stream); stop it before forgetting the node"
        )
    kv = await js.key_value(names.BUCKET) if keys else None
    for key in keys:
        await kv.purge(key)
    try:
        info = await js.stream_info(names.stream_of(node))
    except NotFoundError:
        dropped = None
    else:
        dropped = info.state.messages
        await js.delete_stream(names.stream_of(node))
    subjects = sorted(a.subject for a in adverts if a is not None)
    return Forgotten(node, subjects, dropped)


async def _keys_of(js: Any, node: str) -> tuple[list[str], list[names.Advert | None]]:
    """The node's keys in the directory and what they say."""
    try:
        kv = await js.key_value(names.BUCKET)
        found = await read_adverts(js, kv, names.kv_subjects_of(node))
    except (BucketNotFoundError, NotFoundError):
        return [], []
    return list(found), list(found.values())


async def _pulling(js: Any, node: str, wait_s: float) -> bool:
    """A running bridge keeps a pull request waiting on its consumer, but not at every
    instant (between one fetch and the next): look a few times."""
    for sample in range(PULL_SAMPLES):
        if sample:
            await asyncio.sleep(wait_s)
        try:
            info = await js.consumer_info(names.stream_of(node), names.consumer_of(node))
        except NotFoundError:
            return False
        if info.num_waiting:
            return True
    return False
