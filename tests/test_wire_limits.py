"""The bounds on what a request body may make the router build, at and past the size
from which they are passed to msgpack (below it, msgpack's own bounds are tighter)."""

from __future__ import annotations

import msgpack
import pytest

from sdk import wire
from sdk.errors import MalformedFrame

MAP_LIMIT = 100_000  # entries of one map in a request body (sdk/wire.py _UNPACK_LIMITS)


def _request_with_map(entries: int) -> list[bytes]:
    body = {"op": "publish", "rid": 1, "payload": {str(n): 0 for n in range(entries)}}
    return [wire.MAGIC, msgpack.packb(body)]


def test_a_map_of_the_limits_size_is_decoded():
    (request,) = wire.decode_requests(_request_with_map(MAP_LIMIT))
    assert len(request.body["payload"]) == MAP_LIMIT


def test_a_map_past_the_limit_is_a_malformed_frame():
    with pytest.raises(MalformedFrame, match="max_map_len"):
        wire.decode_requests(_request_with_map(MAP_LIMIT + 1))


@pytest.mark.parametrize(
    "header",
    [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff"],
    ids=["array", "map", "str"],
)
def test_a_small_body_claiming_a_huge_length_is_a_malformed_frame(header):
    with pytest.raises(MalformedFrame, match="not valid msgpack"):
        wire.decode_requests([wire.MAGIC, header])
