"""The HTTP gateway for tests: `relay http`'s app under uvicorn in a thread, on a free
port, in front of a `tests.harness.Broker`; a small reader of server-sent events; and a
schema-validating client check (openapi-core) of every answer against /openapi.json."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import httpx
import uvicorn
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict

from edges.http.app import build_app
from edges.http.gateway import Gateway
from edges.http.openapi import document
from tests.harness import Broker, free_port, wait_for


class OpenAPIRequest:
    """An httpx request as openapi-core reads one (its `Request` protocol)."""

    def __init__(self, request: httpx.Request) -> None:
        self._request = request
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(parse_qs(request.url.query.decode())),
            header=Headers(dict(request.headers)),
            cookie=ImmutableMultiDict(),
        )

    host_url = property(
        lambda self: f"{self._request.url.scheme}://{self._request.url.netloc.decode()}"
    )
    path = property(lambda self: self._request.url.path)
    method = property(lambda self: self._request.method.lower())
    body = property(lambda self: self._request.content or None)
    content_type = property(lambda self: self._request.headers.get("content-type", ""))


class OpenAPIResponse:
    """An httpx response (read) as openapi-core reads one."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    status_code = property(lambda self: self._response.status_code)
    content_type = property(lambda self: self._response.headers.get("content-type", ""))
    headers = property(lambda self: Headers(dict(self._response.headers)))
    data = property(lambda self: self._response.content)


SPEC = OpenAPI.from_dict(document("1"))  # also checks the document is valid OpenAPI 3.1
# (method, route template, status) of every answer validated, for a test to check that
# it saw every documented one.
VALIDATED: set[tuple[str, str, int]] = set()


def _template(path: str) -> str:
    from edges.http.routes import ROUTES

    return next((r.path for r in ROUTES if r.path_regex.match(path)), path)


def check_against_openapi(response: httpx.Response) -> None:
    """Raise (openapi-core's errors) unless ``response`` is what /openapi.json says its
    route answers. Routes the document does not cover (/, /console, /openapi.json) and
    streams are left alone."""
    path = response.request.url.path
    if not path.startswith("/api/") or "text/event-stream" in response.headers.get(
        "content-type", ""
    ):
        return
    response.read()  # response hooks run before the body is read
    if response.status_code in (404, 405) and response.json()["error"]["code"] in (
        "not_found",
        "unknown_operation",
    ):
        return  # no such route: nothing in the document to hold it to
    SPEC.validate_response(OpenAPIRequest(response.request), OpenAPIResponse(response))
    VALIDATED.add((response.request.method, _template(path), response.status_code))


class RunningGateway:
    """A running gateway; ``http`` is an httpx client on its base URL that holds every
    answer to the OpenAPI document (`check_against_openapi`)."""

    def __init__(self, broker: Broker, keepalive: float = 15.0, **options: Any) -> None:
        self.broker = broker
        self.gateway = Gateway(broker.home, timeout=10.0, **options)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            build_app(self.gateway, ("127.0.0.1", self.port), keepalive=keepalive),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.http = httpx.Client(
            base_url=self.url,
            timeout=20.0,
            event_hooks={"response": [check_against_openapi]},
        )

    def __enter__(self) -> RunningGateway:
        self.thread.start()
        wait_for(lambda: self.server.started, 10, what="uvicorn to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)


@dataclass
class Event:
    event: str
    data: Any
    id: str | None


def read_events(lines: Iterator[str]) -> Iterator[Event | str]:
    """Events of an SSE stream (and its comments, as strings), as they come."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "event" in fields or "data" in fields:
                yield Event(
                    fields.get("event", "message"),
                    json.loads(fields["data"]) if "data" in fields else None,
                    fields.get("id"),
                )
            fields = {}
        elif line.startswith(":"):
            yield line[1:].strip()
        else:
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


class EventReader:
    """Reads a stream on a thread into a list, so a test can wait for what it expects."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.events: list[Event | str] = []
        self.status: int | None = None
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(20.0, read=None))
        self._url, self._headers = url, headers or {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_for(lambda: self.status is not None, what="the stream to open")

    def _run(self) -> None:
        try:
            with self._client.stream("GET", self._url, headers=self._headers) as response:
                self.status = response.status_code
                for item in read_events(response.iter_lines()):
                    self.events.append(item)
                    if self._stop.is_set():
                        return
        except Exception:  # closed from another thread: the stream is over
            if self.status is None:
                self.status = -1

    def messages(self) -> list[Event]:
        return [e for e in self.events if isinstance(e, Event) and e.event == "relay_message"]

    def of(self, name: str) -> list[Event]:
        return [e for e in self.events if isinstance(e, Event) and e.event == name]

    def close(self) -> None:
        self._stop.set()
        self._client.close()
        self._thread.join(5)
