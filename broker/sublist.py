"""The subject trie: which stored patterns match a subject, in O(tokens).

This is the NATS sublist design (nats-server ``server/sublist.go``): one trie level per
token; a node has a dict of literal children, one child for ``*`` and one for ``>``, and
the set of values whose pattern ends at it. Matching a concrete subject walks the
literal child and the ``*`` child of every live node, one token at a time, and collects
the values of every ``>`` child it passes, so its cost depends on the number of tokens and
on how many wildcards branch, not on the number of patterns stored.

A bounded cache of recent match results sits in front, as in NATS: the router matches the
same few subjects over and over. Values are arbitrary hashable objects (endpoint
subjects, subscription ids, ...); a (pattern, value) pair is stored at most once.

Not thread-safe: a Sublist belongs to one owner (the router's loop), which serialises
calls.

Performance is guarded by ``bench/bench_subjects.py`` (trie with and without cache
against the linear matcher over 10,000 patterns): run it before changing the match walk,
the node layout or the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from sdk.subjects import match_tokens, validate

V = TypeVar("V", bound=Hashable)

DEFAULT_CACHE_SIZE = 1024

_EMPTY: frozenset = frozenset()


class _Node:
    """One trie position: children by next token, and the values whose pattern ends here."""

    __slots__ = ("gt", "literal", "star", "values")

    def __init__(self) -> None:
        self.literal: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.gt: _Node | None = None  # a ">" node is always a leaf: ">" is the last token
        self.values: set = set()

    def is_empty(self) -> bool:
        return not self.values and not self.literal and self.star is None and self.gt is None

    def child(self, token: str) -> _Node | None:
        if token == "*":
            return self.star
        if token == ">":
            return self.gt
        return self.literal.get(token)

    def add_child(self, token: str) -> _Node:
        node = _Node()
        if token == "*":
            self.star = node
        elif token == ">":
            self.gt = node
        else:
            self.literal[token] = node
        return node

    def drop_child(self, token: str) -> None:
        if token == "*":
            self.star = None
        elif token == ">":
            self.gt = None
        else:
            del self.literal[token]


class Sublist(Generic[V]):
    """A trie of subject patterns with values, and a bounded cache of match results.

    ``cache_size`` bounds the number of cached subjects (0 disables the cache). When the
    cache is full the oldest entry is dropped (FIFO, O(1)): cheaper on a hit than LRU
    bookkeeping, and the router's working set of subjects is small.
    """

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, not {cache_size}")
        self._root = _Node()
        self._count = 0
        self._cache_size = cache_size
        self._cache: OrderedDict[str, frozenset[V]] = OrderedDict()

    def __len__(self) -> int:
        """The number of (pattern, value) entries."""
        return self._count

    # --- changes ---------------------------------------------------------------------

    def insert(self, pattern: str, value: V) -> None:
        """Store ``value`` under ``pattern`` (wildcards allowed); a repeat is a no-op."""
        parts = validate(pattern, wildcards=True).split(".")
        node = self._root
        for token in parts:
            node = node.child(token) or node.add_child(token)
        if value in node.values:
            return
        node.values.add(value)
        self._count += 1
        self._invalidate(pattern, parts)

    def remove(self, pattern: str, value: V) -> bool:
        """Remove one entry; return whether it was there. Nodes left empty are pruned."""
        parts = validate(pattern, wildcards=True).split(".")
        path: list[_Node] = [self._root]
        for token in parts:
            node = path[-1].child(token)
            if node is None:
                return False
            path.append(node)
        leaf = path[-1]
        if value not in leaf.values:
            return False
        leaf.values.discard(value)
        self._count -= 1
        # Prune from the leaf up, so a trie that churns endpoints does not grow forever.
        for depth in range(len(parts), 0, -1):
            if not path[depth].is_empty():
                break
            path[depth - 1].drop_child(parts[depth - 1])
        self._invalidate(pattern, parts)
        return True

    def _invalidate(self, pattern: str, parts: list[str]) -> None:
        """Drop the cached results a change to ``pattern`` can affect, as NATS does.

        Cost: a literal pattern can only affect the subject equal to it, so that is one
        dict pop, O(1); a wildcard pattern is checked against every cached subject,
        O(cache_size x tokens), about a millisecond for a full 1,024-entry cache. Inserts
        and removes (register, subscribe) are rare next to matches (every publish), and
        clearing the whole cache instead would make each of them cost the next 1,024
        publishes a cold walk.
        """
        cache = self._cache
        if not cache:
            return
        if "*" not in parts and ">" not in parts:
            cache.pop(pattern, None)
            return
        stale = [s for s in cache if match_tokens(s.split("."), parts)]
        for subject in stale:
            del cache[subject]

    # --- queries ---------------------------------------------------------------------

    def match(self, subject: str) -> frozenset[V]:
        """The values of every stored pattern that matches the concrete ``subject``."""
        cache = self._cache
        hit = cache.get(subject) if type(subject) is str else None
        if hit is not None:  # only valid subjects are cached: no need to check it again
            return hit
        validate(subject)
        result = self._match(subject.split("."))
        if self._cache_size:
            if len(cache) >= self._cache_size:
                cache.popitem(last=False)
            cache[subject] = result
        return result

    def _match(self, parts: list[str]) -> frozenset[V]:
        found: set[V] = set()
        level = [self._root]
        for token in parts:
            following: list[_Node] = []
            for node in level:
                if node.gt is not None:  # ">" takes this token and all after it
                    found.update(node.gt.values)
                child = node.literal.get(token)
                if child is not None:
                    following.append(child)
                if node.star is not None:
                    following.append(node.star)
            level = following
            if not level:
                break
        for node in level:
            found.update(node.values)
        return frozenset(found) if found else _EMPTY

    def reverse_match(self, pattern: str) -> frozenset[V]:
        """The values of every stored concrete subject that ``pattern`` matches.

        For a trie whose entries are concrete subjects (the router's registered
        endpoints): a publish to ``relay.agent.*.backend`` reaches every endpoint that
        pattern matches. Entries that are themselves wildcard patterns are not expected in
        such a trie and are never returned (the walk follows literal children only).
        Not cached; cost is the size of the subtrees the pattern's wildcards open.
        """
        parts = validate(pattern, wildcards=True).split(".")
        found: set[V] = set()
        level = [self._root]
        for token in parts:
            if token == ">":  # every literal entry at least one token below these nodes
                stack = [child for node in level for child in node.literal.values()]
                while stack:
                    node = stack.pop()
                    found.update(node.values)
                    stack.extend(node.literal.values())
                return frozenset(found) if found else _EMPTY
            if token == "*":
                level = [child for node in level for child in node.literal.values()]
            else:
                level = [c for node in level if (c := node.literal.get(token)) is not None]
            if not level:
                return _EMPTY
        for node in level:
            found.update(node.values)
        return frozenset(found) if found else _EMPTY

    def patterns(self) -> list[str]:
        """The distinct stored patterns, sorted."""
        return sorted({pattern for pattern, _ in self.entries()})

    def entries(self) -> Iterator[tuple[str, V]]:
        """Every (pattern, value) entry, in no particular order."""
        stack: list[tuple[str, _Node]] = [("", self._root)]
        while stack:
            prefix, node = stack.pop()
            for value in node.values:
                yield prefix, value
            children = list(node.literal.items())
            if node.star is not None:
                children.append(("*", node.star))
            if node.gt is not None:
                children.append((">", node.gt))
            for token, child in children:
                stack.append((f"{prefix}.{token}" if prefix else token, child))

    def cache_count(self) -> int:
        """How many subjects the match cache holds (for tests and metrics)."""
        return len(self._cache)
