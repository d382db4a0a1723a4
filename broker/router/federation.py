"""The sending node's side of federation (docs/federation.md): which endpoints live on
other nodes, and the remote parts of publishes waiting for the bridge. Pure: the
operations (broker/router/ops_federation.py) and the publish ask it, the loop sends.

A remote part is all the copies of one publish for one far node: the bridge takes it
(``relay_take``), publishes it to that node's JetStream stream and answers
(``relayed``) once JetStream has acknowledged it. The bridge asks with a held request:
when nothing waits, its ``relay_take`` is answered by the next publish that makes a
part, or empty after ``TAKE_HOLD_MS``, so a bridge that stops asking is noticed within
``BRIDGE_GONE_MS`` and publishes stop counting on it (``unavailable`` at once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.sublist import Sublist
from sdk.subjects import has_wildcards, matches

TAKE_HOLD_MS = 1_000  # how long an empty relay_take is held before an empty answer
BRIDGE_GONE_MS = 3_000  # no relay_take for this long: no bridge
MAX_TAKE = 1_000  # parts per relay_take answer
MAX_QUEUED = 10_000  # parts waiting for the bridge; beyond, a publish's part is unavailable


@dataclass(frozen=True, slots=True)
class RemotePart:
    token: int  # the publish's job
    node: str
    subjects: tuple[str, ...]  # endpoint subjects on that node
    envelope: dict[str, Any]  # wire form, budget not advanced (the far router does that)

    def to_wire(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "node": self.node,
            "subjects": list(self.subjects),
            "envelope": self.envelope,
        }


@dataclass
class HeldTake:
    client: bytes
    rid: int
    limit: int
    until: int


class Federation:
    def __init__(self) -> None:
        self.remote: dict[str, frozenset[str]] = {}  # node -> its advertised subjects
        self._trie: Sublist[str] = Sublist()  # subject -> node
        self.parts: deque[RemotePart] = deque()
        self.held: HeldTake | None = None
        self.bridge: bytes | None = None  # the client that last asked for parts
        self.node: str | None = None  # the local node, as the bridge names it
        self.last_take = -BRIDGE_GONE_MS  # ms
        self.cluster: dict[str, Any] = {}  # what the bridge last said it sees (status)

    # ------------------------------------------------------------------ directory

    def set_remote(self, node: str, subjects: frozenset[str]) -> None:
        """The full list of ``node``'s advertised endpoints (replaces the last one)."""
        for subject in self.remote.get(node, frozenset()) - subjects:
            self._trie.remove(subject, node)
        for subject in subjects - self.remote.get(node, frozenset()):
            self._trie.insert(subject, node)
        if subjects:
            self.remote[node] = subjects
        else:
            self.remote.pop(node, None)

    def targets(self, subject: str, local: Callable[[str], bool]) -> dict[str, list[str]]:
        """The remote endpoints a publish to ``subject`` reaches, by node, leaving out
        subjects registered here too (``local``) and this node's own entries."""
        found: dict[str, list[str]] = {}
        if not self.remote:
            return found
        if has_wildcards(subject):
            nodes = self._trie.reverse_match(subject)
            pairs = [
                (n, s)
                for n in sorted(nodes)
                for s in sorted(self.remote.get(n, ()))
                if matches(s, subject)
            ]
        else:
            pairs = [(n, subject) for n in sorted(self._trie.match(subject))]
        for node, endpoint in pairs:
            if node != self.node and not local(endpoint):
                found.setdefault(node, []).append(endpoint)
        return found

    # ------------------------------------------------------------------ the bridge

    def connected(self, now: int) -> bool:
        return self.held is not None or now - self.last_take < BRIDGE_GONE_MS

    def add(self, part: RemotePart) -> bool:
        """Queue a part for the bridge; False when the queue is full."""
        if len(self.parts) >= MAX_QUEUED:
            return False
        self.parts.append(part)
        return True

    def take(
        self, client: bytes, rid: int, limit: int, now: int, alive: Callable[[RemotePart], bool]
    ) -> list[RemotePart] | None:
        """Parts for the bridge, or None: the request is held (answered by `answer_held`).
        A bridge asking again replaces a held request (answered empty, by `release`)."""
        self.bridge, self.last_take = client, now
        parts = self._pop(limit, alive)
        if parts:
            return parts
        self.held = HeldTake(client, rid, limit, now + TAKE_HOLD_MS)
        return None

    def release(self) -> HeldTake | None:
        held, self.held = self.held, None
        return held

    def answer_held(
        self, now: int, alive: Callable[[RemotePart], bool]
    ) -> tuple[HeldTake, list[RemotePart]] | None:
        """The held take to answer now: parts have come, or it was held long enough."""
        held = self.held
        if held is None:
            return None
        parts = self._pop(held.limit, alive) if self.parts else []
        if not parts and now < held.until:
            return None
        self.held, self.last_take = None, now
        return held, parts

    def _pop(self, limit: int, alive: Callable[[RemotePart], bool]) -> list[RemotePart]:
        parts: list[RemotePart] = []
        while self.parts and len(parts) < limit:
            part = self.parts.popleft()
            if alive(part):  # its publish still waits (not answered unavailable)
                parts.append(part)
        return parts

    def status(self, now: int) -> dict[str, Any]:
        return {
            "node": self.node,
            "connected": self.connected(now),
            "queued": len(self.parts),
            "remoteEndpoints": {n: len(s) for n, s in sorted(self.remote.items())},
            "server": self.cluster.get("server"),
            "servers": list(self.cluster.get("servers", [])),
            "lag": dict(self.cluster.get("lag", {})),
        }
