from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import Broker


@pytest.fixture
def broker() -> Iterator[Broker]:
    """A running router and two shard writers on a private data directory."""
    b = Broker(shards=2)
    try:
        b.start()
        yield b
    finally:
        b.cleanup()
