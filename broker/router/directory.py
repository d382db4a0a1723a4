"""The registered endpoints, by subject and by mailbox hash, and which of them a subject
or a pattern reaches. Pure; control.db is where they are kept (broker/control.py)."""

from __future__ import annotations

from typing import Any

from broker.sublist import Sublist
from sdk.errors import EndpointNotFound
from sdk.paths import UNROUTABLE
from sdk.subjects import has_wildcards, validate
from sdk.types import EndpointInfo


class Directory:
    def __init__(self) -> None:
        self.by_subject: dict[str, EndpointInfo] = {}
        self.by_hash: dict[str, EndpointInfo] = {}
        self._trie: Sublist[str] = Sublist()  # concrete subject -> hash

    def __len__(self) -> int:
        return len(self.by_subject)

    def __contains__(self, subject: str) -> bool:
        return subject in self.by_subject

    def add(self, info: EndpointInfo) -> None:
        self.by_subject[info.subject] = info
        self.by_hash[info.hash] = info
        self._trie.insert(info.subject, info.hash)

    def update(self, info: EndpointInfo) -> None:
        """A registered endpoint's new properties (its subject and hash are the same)."""
        self.by_subject[info.subject] = self.by_hash[info.hash] = info

    def remove(self, subject: str) -> EndpointInfo | None:
        info = self.by_subject.pop(subject, None)
        if info is not None:
            self.by_hash.pop(info.hash, None)
            self._trie.remove(subject, info.hash)
        return info

    def sorted(self) -> list[EndpointInfo]:
        return sorted(self.by_subject.values(), key=lambda e: e.subject)

    def subject_of(self, endpoint: str) -> str | None:
        info = self.by_hash.get(endpoint)
        return info.subject if info else None

    def targets(self, subject: str) -> list[EndpointInfo]:
        """The endpoints a publish to ``subject`` (wildcards allowed) reaches, by subject."""
        if has_wildcards(subject):
            hashes = self._trie.reverse_match(subject)
            return sorted((self.by_hash[h] for h in hashes), key=lambda e: e.subject)
        info = self.by_subject.get(subject)
        return [info] if info else []

    def matching(self, pattern: str) -> set[str]:
        """The mailbox hashes of the endpoints a subscription to ``pattern`` covers."""
        if has_wildcards(pattern):
            return set(self._trie.reverse_match(pattern))
        info = self.by_subject.get(pattern)
        return {info.hash} if info else set()

    def resolve(self, endpoint: Any) -> str | None:
        """An endpoint named by subject or hash (or None: all of them) as its hash."""
        if endpoint is None:
            return None
        if endpoint == UNROUTABLE or endpoint in self.by_hash:
            return endpoint
        info = self.by_subject.get(endpoint) if isinstance(endpoint, str) else None
        if info is None:
            raise EndpointNotFound(f"no endpoint {endpoint!r:.80} (give a subject or a hash)")
        return info.hash

    def require(self, subject: str) -> EndpointInfo:
        info = self.by_subject.get(validate(subject))
        if info is None:
            raise EndpointNotFound(f"endpoint {subject} is not registered")
        return info
