"""Keep other web sites out: the owner's browser runs as the owner.

Without tokens the gateway serves the data directory's owner over loopback, and a
browser the owner runs is the owner. A page from anywhere could then make that browser
send requests to 127.0.0.1: a form POST that publishes, an ``<img>`` whose GET claims an
inbox, an EventSource whose consume stream acks messages away. Three checks, on every
request, refuse that (with ``403 access_denied``) and cost scripts nothing, since they
send none of these headers:

- ``Sec-Fetch-Site`` (sent by browsers on every request): only ``same-origin`` and
  ``none`` (typed in the address bar) pass;
- ``Origin`` (sent on cross-origin requests, and on same-origin POSTs): it must be the
  gateway's own origin;
- ``Host`` must name the address the gateway listens on (or a loopback alias of it), so
  that a name an attacker points at 127.0.0.1 (DNS rebinding) does not make its page
  same-origin with the gateway. Skipped when listening on all interfaces, where the
  names the gateway is reached by are not known.

Pure (`refusal`) plus a small ASGI middleware (`CrossSiteGuard`) that streams untouched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from edges.http.errors import error_body

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
ALL_INTERFACES = ("0.0.0.0", "::", "[::]", "")


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host header values that name this gateway; None: any (all interfaces)."""
    if host in ALL_INTERFACES:
        return None
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    names = {shown, *LOOPBACK_NAMES} if shown in LOOPBACK_NAMES else {shown}
    return frozenset(f"{name}:{port}" for name in names)


def refusal(headers: Mapping[str, str], hosts: frozenset[str] | None) -> str | None:
    """Why a request must be refused as coming from another site; None if it may pass."""
    host = headers.get("host", "")
    if hosts is not None and host not in hosts:
        return f"Host {host!r} does not name this gateway (expected one of {sorted(hosts)})"
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a {site} request from a browser (Sec-Fetch-Site) is not served"
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != host:
        return f"Origin {origin!r} is not this gateway's"
    return None


class CrossSiteGuard:
    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            reason = refusal(headers, self.hosts)
            if reason is not None:
                await _refuse(send, reason)
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, reason: str) -> None:
    body = json.dumps(error_body("access_denied", reason)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
