from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from sdk.paths import Home
from tests.harness import Broker
from workers.writer import Writer


@pytest.fixture
def broker() -> Iterator[Broker]:
    """A running router and two shard writers on a private data directory."""
    b = Broker(shards=2)
    try:
        b.start()
        yield b
    finally:
        b.cleanup()


@pytest.fixture
def shard_writer(tmp_path) -> Iterator[tuple[Writer, zmq.Socket]]:
    """The writer of a one-shard home, in this process (frames handed to `_process`),
    and the socket its results come back on."""
    home = Home(tmp_path / "home").create()
    ctx = zmq.Context()  # the writer terms its own context when it closes
    results = ctx.socket(zmq.PULL)
    results.setsockopt(zmq.RCVTIMEO, 10_000)
    results.bind(home.results_address)
    writer = Writer(home, 0, 1, ctx=zmq.Context())
    try:
        writer.start()
        yield writer, results
    finally:
        writer.close()
        ctx.destroy(0)
