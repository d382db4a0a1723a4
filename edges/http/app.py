"""The ASGI app (Starlette) and `relay http`: routes, errors, the console, uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from signal import SIGINT, SIGTERM

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from edges.held import DEFAULT_ACK_WAIT_S
from edges.http.errors import HttpError, error_body, status_for
from edges.http.gateway import Gateway
from edges.http.guard import CrossSiteGuard, allowed_hosts
from edges.http.listener import Listener
from edges.http.openapi import document
from edges.http.routes import ROUTES
from edges.http.sse import KEEPALIVE_S
from sdk.errors import RelayError
from sdk.paths import Home

log = logging.getLogger("relay.http")

DEFAULT_LISTEN = "127.0.0.1:7480"
CONSOLE = Path(__file__).parent / "console"
SWEEP_S = 10.0  # how often idle observer hubs are looked for
VERSION = "1"
GRACE_S = 3.0  # how long a stopping gateway waits for its open requests and streams


async def relay_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RelayError)
    status = exc.status if isinstance(exc, HttpError) else status_for(exc.code)
    if status >= 500:
        log.warning("%s %s: %s: %s", request.method, request.url.path, exc.code, exc)
    return JSONResponse(error_body(exc.code, exc.message), status_code=status)


async def not_found(request: Request, exc: Exception) -> Response:
    code = getattr(exc, "status_code", 404)
    if code == 405:
        return JSONResponse(
            error_body(
                "unknown_operation", f"{request.method} is not allowed on {request.url.path}"
            ),
            status_code=405,
        )
    return JSONResponse(
        error_body("not_found", f"no route {request.method} {request.url.path}"), status_code=404
    )


async def internal(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse(error_body("internal", f"{type(exc).__name__}: {exc}"), status_code=500)


async def openapi(request: Request) -> Response:
    return JSONResponse(document(VERSION))


async def console(request: Request) -> Response:
    return FileResponse(CONSOLE / "index.html", headers={"Cache-Control": "no-cache"})


async def favicon(request: Request) -> Response:
    """The console's icon where browsers look for it first (an SVG: every browser that
    runs the console takes one, whatever the name says)."""
    return FileResponse(CONSOLE / "favicon.svg", media_type="image/svg+xml")


def build_app(
    gateway: Gateway, listen: tuple[str, int], *, keepalive: float = KEEPALIVE_S
) -> Starlette:
    """The app for a gateway listening on ``listen`` (host, port): the Host header a
    request may carry depends on it (edges/http/guard.py)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep(gateway))
        try:
            yield
        finally:
            sweeper.cancel()
            await gateway.close()

    app = Starlette(
        routes=[
            *ROUTES,
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/", console, methods=["GET"]),
            Route("/favicon.ico", favicon, methods=["GET"]),
            Mount("/console", StaticFiles(directory=CONSOLE), name="console"),
        ],
        exception_handlers={RelayError: relay_error, 404: not_found, 405: not_found, 500: internal},
        middleware=[Middleware(CrossSiteGuard, hosts=allowed_hosts(*listen))],
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.state.keepalive = keepalive
    return app


async def _sweep(gateway: Gateway) -> None:
    while True:
        await asyncio.sleep(SWEEP_S)
        try:
            await gateway.sweep(time.monotonic())
        except Exception:
            log.exception("sweeping idle observer hubs failed")


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen wants HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def serve(
    home: Home,
    listen: str = DEFAULT_LISTEN,
    *,
    address: str | None = None,
    key_file: str | None = None,
    server_key: str | None = None,
    timeout: float = 10.0,
    ack_wait: float = DEFAULT_ACK_WAIT_S,
) -> int:
    """Run the gateway in the foreground until SIGINT/SIGTERM (`relay http`). An address
    that is taken is retried until it is free (edges/http/listener.py): the process
    stays up, so a Procfile group is not stopped because of it. ``ack_wait``: how long
    a message an inbox read returned stays held unanswered (docs/http.md)."""
    import uvicorn

    host, port = parse_listen(listen)
    listener = Listener(home, host, port)
    stop = threading.Event()
    # Only a flag: uvicorn installs its own handlers while it serves, then puts these back
    # and raises the signal it caught again, which lands here: the state file is removed
    # and the exit code is 0, not death by SIGTERM.
    for signum in (SIGINT, SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        sock = listener.open(stop)
        if sock is None:  # stopped while retrying
            return 0
        gateway = Gateway(
            home,
            address=address,
            key_file=key_file,
            server_key=server_key,
            timeout=timeout,
            ack_wait=ack_wait,
        )
        app = build_app(gateway, (host, port))
        log.info("relay http on http://%s/ for the router at %s", listener.address, gateway.address)
        # No access log: a stream's URL may carry its token (?token=).
        # Open streams would hold a graceful shutdown forever: they get GRACE_S to end.
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=GRACE_S,
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        listener.close()
    return 0
