"""Delegation: a connection acting for another identity of auth.json. Pure.

One connection is one identity (broker/auth.py), with one exception: an identity with
``"delegate": true`` (the owner has it) may name, on any request, the identity it acts
for (the request field ``actingFor``: that identity's user id, ``key:<z85>``); the
router then judges the request by the named identity's senders, consume rights and
operator rights, exactly as if that identity had connected itself. It is how the edges
(the HTTP gateway, MCP over HTTP) serve bearer tokens through their own connection, on
ipc:// and tcp:// alike: they verify the token (edges/tokens.py) and name its identity.

A delegate can never do more than it could do itself, nor act for just anyone:

- only an identity granted ``delegate`` may name another (others: `NotAuthorized`);
- it may act only for an identity that has a bearer token still good now (the edges
  act for token bearers; a uid, a bridge's key or a token that expired is out of reach);
- it may act only for an identity whose rights it holds itself: every sender pattern,
  every endpoint it may receive, and operator rights only if it has them;
- it may never act for a bridge (an identity with ``relays``), not even the owner:
  bridges connect with their own key and are not token bearers, and acting for one
  would hand in messages as another node.

Naming one's own identity needs no right. What the session holds (subscriptions,
claims) stays the connection's: docs/security.md, "Delegation".
"""

from __future__ import annotations

from typing import Any

from broker.auth import AuthPolicy, Identity
from sdk.errors import InvalidMessage, NotAuthorized
from sdk.subjects import covers

ACTING_FOR = "actingFor"  # the request field (docs/protocol.md, "Acting for an identity")


def refusal(delegate: Identity, target: Identity, now_ms: int) -> str | None:
    """Why ``delegate`` may not act for ``target`` now; None when it may."""
    if not delegate.delegate:
        return f"{delegate.name} may not act for other identities (auth.json 'delegate')"
    if not target.has_token_at(now_ms):
        return f"{target.name} has no bearer token that is still good: only token bearers"
    if target.relays is not None:
        return f"{target.name} relays messages of other nodes: no delegate acts for a bridge"
    if target.admin and not delegate.admin:
        return f"{target.name} has operator rights and {delegate.name} has none"
    for pattern in target.senders:
        if not any(covers(own, pattern) for own in delegate.senders):
            return f"{target.name} may send as {pattern}, which {delegate.name} may not"
    for pattern in target.receives:
        if not delegate.may_consume(pattern):
            return f"{target.name} may receive {pattern}, which {delegate.name} may not"
    return None


def acting_identity(
    policy: AuthPolicy, user: str | None, named: Any, now_ms: int
) -> tuple[Identity | None, str | None]:
    """The identity a request of a connection admitted as ``user`` is judged by, and the
    user id it acts for (None: its own). ``named`` is the request's ``actingFor``."""
    own = policy.identity(user)
    if named is None or named == user:
        return own, None
    if not isinstance(named, str):
        raise InvalidMessage(f"request field {ACTING_FOR!r} must be a user id string")
    target = policy.identity(named)
    if own is None or target is None:
        raise NotAuthorized(f"no identity {named!r:.60} in auth.json to act for (revoked?)")
    why = refusal(own, target, now_ms)
    if why is not None:
        raise NotAuthorized(why)
    return target, named
