"""The HTTP gateway for tests: `relay http`'s app under uvicorn in a thread, on a free
port, in front of a `tests.harness.Broker`; and a small reader of server-sent events."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from edges.http.app import build_app
from edges.http.gateway import Gateway
from tests.harness import Broker, free_port, wait_for


class RunningGateway:
    """A running gateway; ``http`` is an httpx client on its base URL."""

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
        self.http = httpx.Client(base_url=self.url, timeout=20.0)

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
