"""Reading and checking the fields of wire objects, for the ``from_wire`` of every type
in sdk/types.py: a missing field, a wrong type, a bad subject or enum value, a value JSON
cannot hold, each refused with the field's wire path in the message
(``budget.maxHops must be an int, got 'x'``). Booleans are never accepted as numbers.

These run for every object that crosses a boundary (each publish's budget, each pushed
envelope), so the common case returns early, without building the error's label.
"""

from __future__ import annotations

import json
import json.scanner
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from sdk.errors import InvalidMessage, InvalidSubject
from sdk.subjects import validate

MISSING: Any = object()
_KIND_NAMES = {
    int: "an int",
    float: "a number",
    str: "a string",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
}


def label_of(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def is_kind(value: object, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:  # "a number": ints are numbers too
        return isinstance(value, int | float)
    return isinstance(value, kind)


def check_kind(value: Any, kind: type, label: str, *, minimum: int | None = None) -> Any:
    if not is_kind(value, kind):
        raise InvalidMessage(f"{label} must be {_KIND_NAMES[kind]}, got {value!r:.60}")
    if minimum is not None and value < minimum:
        raise InvalidMessage(f"{label} must be >= {minimum}, got {value!r}")
    return value


def get_field(
    d: Mapping[str, Any],
    name: str,
    kind: type,
    path: str,
    *,
    default: Any = MISSING,
    minimum: int | None = None,
) -> Any:
    """``d[name]`` checked against ``kind``; with a ``default``, missing or null gives it."""
    value = d.get(name, MISSING)
    if value is MISSING or (value is None and default is not MISSING):
        if default is MISSING:
            raise InvalidMessage(f"{label_of(path, name)} is missing")
        return default
    # `type(value) is kind` tells mypy only "object"; a minimum comes with kind int.
    if type(value) is kind and (minimum is None or value >= minimum):  # type: ignore[operator]
        return value  # the common case, without building a label
    return check_kind(value, kind, label_of(path, name), minimum=minimum)


def get_subject(
    d: Mapping[str, Any],
    name: str,
    path: str,
    *,
    wildcards: bool = False,
    default: Any = MISSING,
) -> Any:
    value = get_field(d, name, str, path, default=default)
    if value is not default:
        valid_subject(value, path, name, wildcards)
    return value


def valid_subject(value: str, path: str, name: str, wildcards: bool = False) -> str:
    try:
        return validate(value, wildcards=wildcards)
    except InvalidSubject as err:
        raise InvalidSubject(f"{label_of(path, name)}: {err.message}") from None


def as_mapping(d: object, path: str) -> Mapping[str, Any]:
    if type(d) is not dict and not isinstance(d, Mapping):  # dict: skip the ABC check
        raise InvalidMessage(f"{path or 'message'} must be an object, got {d!r:.60}")
    return d


def get_enum(d: Mapping[str, Any], name: str, enum: type[StrEnum], path: str) -> Any:
    value = get_field(d, name, str, path)
    member = enum._value2member_map_.get(value)  # what enum(value) finds, without its cost
    if member is not None:
        return member
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(enum)
        raise InvalidMessage(
            f"{label_of(path, name)} must be one of {allowed}; got {value!r:.60}"
        ) from None


def get_strings(d: Mapping[str, Any], name: str, path: str, *, default: Any = MISSING) -> Any:
    items = get_field(d, name, list, path, default=default)
    if items is default:
        return default
    for i, item in enumerate(items):
        if type(item) is not str:
            check_kind(item, str, f"{label_of(path, name)}[{i}]")
    return tuple(items)


def check_json_value(value: object, label: str) -> None:
    """Refuse what JSON cannot hold: non-string keys, bytes, NaN, sets, objects...

    Iterative, and a location is a cheap linked tuple turned into text only for the error,
    so a payload of 100,000 numbers costs no 100,000 label strings.
    """
    stack: list[tuple[object, Any]] = [(value, None)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, str | bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidMessage(f"{_where(label, where)} must be a finite number, got {item}")
        elif isinstance(item, list | tuple):
            stack.extend((v, (where, i)) for i, v in enumerate(item))
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise InvalidMessage(
                        f"{_where(label, where)} keys must be strings, got {k!r:.60}"
                    )
                stack.append((v, (where, k)))
        else:
            raise InvalidMessage(
                f"{_where(label, where)} must be JSON-representable, got {type(item).__name__}"
            )


def _where(label: str, where: Any) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return label + "".join(reversed(keys))


def dumps_json(obj: object) -> bytes:
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError) as err:  # UnicodeEncodeError is a ValueError
        raise InvalidMessage(f"message is not JSON-representable: {err}") from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON has no infinity
        raise ValueError(f"{text} is not a finite number")
    return value


# One decoder, not one per call (json.loads with options builds a new one each time):
# a pushed message is decoded on its handler's thread, 2-3 µs of it per message. What
# it returns holds only what JSON can (finite numbers): `check_json_value` passes.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)
# Its scanner, called directly for what Relay writes (`_compact_object`). The stub
# wants a scanner as the context; any object with the decoder's options will do.
_SCAN = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]


def loads_json(data: bytes) -> Mapping[str, Any]:
    """A JSON object from UTF-8 (or UTF-16/32) bytes, as `json.loads` reads them,
    holding only JSON values: NaN, Infinity and numbers too large for a float refused."""
    try:
        obj = _compact_object(data)
        return as_mapping(_loads(data) if obj is None else obj, "message file")
    except (ValueError, TypeError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidMessage(f"message file is not valid JSON: {err}") from None


def _compact_object(data: bytes) -> Any:
    """A UTF-8 object with nothing around it (what Relay writes, `dumps_json`), read by
    the decoder's C scanner alone: no encoding sniffed, no whitespace skipped, no
    Python frame of `json` on the way (a pushed message's path). None otherwise."""
    if data[:1] != b"{" or data[-1:] != b"}" or data[1:2] == b"\x00":
        return None
    text = data.decode("utf-8", "surrogatepass")
    try:
        obj, end = _SCAN(text, 0)
    except StopIteration:
        return None
    return obj if end == len(text) else None


def _loads(data: bytes) -> Any:
    return _DECODER.decode(data.decode(json.detect_encoding(data), "surrogatepass"))
