"""The subject grammar: validation, matching and the small helpers built on them.

A subject is dot-separated tokens, ``relay.agent.myproject.backend``; a token is
``[A-Za-z0-9_-]+``. A pattern may also use ``*`` (exactly one token) and ``>`` (one or
more tokens, last token only). Matching is case-sensitive. These are NATS semantics, with
one deliberate difference: NATS accepts ``foo*`` or ``>bar`` as plain literal tokens,
Relay rejects them, because a wildcard character inside a token is almost always a typo
for a wildcard token and the token alphabet above has no room for it.

Bounds. A subject is at most ``MAX_SUBJECT_BYTES`` (256) UTF-8 bytes and
``MAX_TOKENS`` (16) tokens. Subjects arrive from the network and end up as cache keys,
index rows and trie paths, so an attacker must not be able to send a 10 MB subject and
make the router split, scan, hash or store it. The length check therefore runs first,
before any split, regex or cache lookup, and is O(1) whatever the input size: ``len()``
of a ``str`` is stored, and so is whether it is pure ASCII (``str.isascii()`` reads a
flag in CPython), which is when characters and bytes agree.

Speed. The router validates every publish, so validation is a compiled regular
expression for the common valid case behind a bounded LRU cache (4,096 subjects per
kind); the slow path that explains what is wrong only runs for invalid input. Cached
entries are at most 256 characters each, so the caches stay under a few MB.

Everything here is pure (no I/O) and imports nothing from the server side.
"""

from __future__ import annotations

import functools
import hashlib
import re

from sdk.errors import InvalidSubject

MAX_SUBJECT_BYTES = 256
MAX_TOKENS = 16

_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_LITERAL = r"[A-Za-z0-9_-]+"
_TOKEN = rf"(?:{_LITERAL}|\*)"
# Fast paths: one full match decides the common valid case, token count included.
_CONCRETE_RE = re.compile(rf"(?:{_LITERAL}\.){{0,{MAX_TOKENS - 1}}}{_LITERAL}")
_PATTERN_RE = re.compile(rf"(?:{_TOKEN}\.){{0,{MAX_TOKENS - 1}}}(?:{_TOKEN}|>)")

_CACHE_SIZE = 4096


def validate(subject: object, wildcards: bool = False) -> str:
    """Return ``subject`` if it is valid, else raise `InvalidSubject` saying what and where.

    With ``wildcards=False`` (a publish target, an endpoint) the subject must be concrete;
    with ``wildcards=True`` (a subscription, a rule) ``*`` and ``>`` are allowed.
    """
    problem = _precheck(subject)
    if problem is None and isinstance(subject, str):  # _precheck: it is a str
        problem = _check_pattern(subject) if wildcards else _check_concrete(subject)
        if problem is None:
            return subject
    raise InvalidSubject(problem or "subject must be a string")


def is_valid(subject: object, wildcards: bool = False) -> bool:
    """Whether `validate` would accept ``subject``; never raises."""
    if _precheck(subject) is not None or not isinstance(subject, str):
        return False
    return (_check_pattern(subject) if wildcards else _check_concrete(subject)) is None


def has_wildcards(subject: str) -> bool:
    """Whether a valid pattern contains a ``*`` or ``>`` token (raises if invalid)."""
    validate(subject, wildcards=True)
    return "*" in subject or ">" in subject  # valid => these only appear as whole tokens


def tokens(subject: str) -> list[str]:
    """The tokens of a valid subject or pattern (raises if invalid)."""
    return validate(subject, wildcards=True).split(".")


def matches(subject: str, pattern: str) -> bool:
    """Whether the concrete ``subject`` matches ``pattern``: the plain reference matcher.

    Token by token: a literal must be equal, ``*`` takes any one token, ``>`` takes one or
    more remaining tokens. `broker.sublist.Sublist` is the fast path; property tests hold
    it to this function.
    """
    validate(subject)
    validate(pattern, wildcards=True)
    return match_tokens(subject.split("."), pattern.split("."))


def match_tokens(subject_tokens: list[str], pattern_tokens: list[str]) -> bool:
    """`matches` on already-validated, already-split input, without the checks.

    For callers that hold split tokens already (the trie's cache invalidation).
    """
    n = len(subject_tokens)
    for i, p in enumerate(pattern_tokens):
        if p == ">":
            return n > i
        if i >= n or (p != "*" and p != subject_tokens[i]):
            return False
    return n == len(pattern_tokens)


def covers(pattern: str, narrower: str) -> bool:
    """Whether every subject that ``narrower`` matches is matched by ``pattern`` too.

    Both may hold wildcards; for a concrete ``narrower`` it is `matches`. ``a.>`` covers
    ``a.*`` and ``a.b.>``; ``a.*`` covers ``a.b`` but not ``a.>`` (which takes ``a.b.c``).
    """
    validate(pattern, wildcards=True)
    validate(narrower, wildcards=True)
    wide, narrow = pattern.split("."), narrower.split(".")
    for i, token in enumerate(wide):
        if token == ">":
            return len(narrow) > i
        if i >= len(narrow) or narrow[i] == ">" or token not in ("*", narrow[i]):
            return False
    return len(narrow) == len(wide)


def literal_prefix(pattern: str) -> str:
    """The part of ``pattern`` before its first wildcard token.

    ``relay.agent.*.x`` -> ``relay.agent.``; ``foo.>`` -> ``foo.``; ``*`` -> ``""``;
    ``foo.bar`` -> ``foo.bar``. Used as a ZeroMQ SUB prefix filter, which is a byte
    prefix: ``foo.bar`` also lets ``foo.barn`` through, so a subscriber still checks each
    message with `matches`.
    """
    parts = tokens(pattern)
    for i, token in enumerate(parts):
        if token in ("*", ">"):
            return "".join(t + "." for t in parts[:i])
    return pattern


INBOX = "_INBOX"  # the first token of every reply inbox


def reply_inbox(sender: str, nonce: str) -> str:
    """The reply inbox of one client requesting as ``sender``: ``_INBOX.<sender>.<nonce>``.
    Only the sender's own identity may consume it, and only consumers that name an
    inbox compete for its messages (a wildcard such as ``relay.>`` never takes a reply
    meant for someone else's request)."""
    return validate(f"{INBOX}.{sender}.{nonce}")


def inbox_sender(subject: str) -> str | None:
    """The sender whose reply inbox ``subject`` is, or None when it is not one."""
    if not subject.startswith(INBOX + "."):
        return None
    parts = subject.split(".")
    if len(parts) < 3 or has_wildcards(subject):
        return None
    return ".".join(parts[1:-1])


def endpoint_hash(subject: str) -> str:
    """The endpoint's mailbox directory name: first 12 hex chars of sha256(subject)."""
    return hashlib.sha256(validate(subject).encode("utf-8")).hexdigest()[:12]


# --- internals ---------------------------------------------------------------------------


def _precheck(subject: object) -> str | None:
    """Type and length, in O(1): runs before anything that looks at every character."""
    if not isinstance(subject, str):
        return f"subject must be a string, not {type(subject).__name__}"
    n = len(subject)
    if n > MAX_SUBJECT_BYTES:
        if subject.isascii():
            return f"subject is {n} bytes, over the {MAX_SUBJECT_BYTES}-byte limit"
        return (
            f"subject is at least {n} bytes ({n} characters), "
            f"over the {MAX_SUBJECT_BYTES}-byte limit"
        )
    return None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _check_concrete(subject: str) -> str | None:
    if _CONCRETE_RE.fullmatch(subject):
        return None
    return _diagnose(subject, wildcards=False)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _check_pattern(subject: str) -> str | None:
    if _PATTERN_RE.fullmatch(subject):
        return None
    return _diagnose(subject, wildcards=True)


def _diagnose(subject: str, wildcards: bool) -> str:
    """The slow path: find the first thing wrong and describe it with its position."""
    if subject == "":
        return "subject is empty"
    size = len(subject.encode("utf-8", "surrogatepass"))
    if size > MAX_SUBJECT_BYTES:
        return f"subject is {size} bytes, over the {MAX_SUBJECT_BYTES}-byte limit"
    problem = _first_problem(subject, wildcards)
    if problem is None:
        # The fast path refused what the diagnosis accepts: the two disagree, a bug here.
        raise AssertionError(f"subject grammar fast path and diagnosis disagree on {subject!r}")
    return f"invalid subject {subject!r}: {problem}"


def _first_problem(subject: str, wildcards: bool) -> str | None:
    parts = subject.split(".")
    if len(parts) > MAX_TOKENS:
        return f"{len(parts)} tokens, over the limit of {MAX_TOKENS}"
    last = len(parts)
    for position, token in enumerate(parts, start=1):
        if token == "":
            if position == 1:
                kind = "leading dot"
            elif position == last:
                kind = "trailing dot"
            else:
                kind = "two dots in a row"
            return f"token {position} is empty ({kind})"
        if token in ("*", ">"):
            if not wildcards:
                return (
                    f"wildcard {token!r} in token {position} is not allowed here; "
                    "a concrete subject is required"
                )
            if token == ">" and position != last:
                return f"'>' must be the last token, found at token {position} of {last}"
            continue
        for ch in token:
            if ch in _TOKEN_CHARS:
                continue
            if ch in "*>":
                return (
                    f"wildcard {ch!r} inside token {position} ({token!r}); "
                    "wildcards must be whole tokens"
                )
            if ch.isspace():
                return f"whitespace {ch!r} in token {position}"
            return (
                f"character {ch!r} in token {position} ({token!r}) is not allowed; "
                "a token is [A-Za-z0-9_-]+"
            )
    return None
