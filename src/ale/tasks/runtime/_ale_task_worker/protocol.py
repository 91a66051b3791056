"""Messages between the harness and a task process: one JSON object per line.

Bytes travel as ``{"$bytes": "<base64>"}``; tuples become lists; any other value
JSON cannot hold travels as its ``repr`` under ``{"$repr": ...}`` (never executed).
Floats keep NaN and infinities (Python's JSON extension), so a grader returning
NaN is seen as NaN, not as an error of the channel.
"""

from __future__ import annotations

import base64
import json
from typing import Any

MAX_LINE = 2 * 1024 * 1024 * 1024  # a message larger than this is a protocol error (a 1 GiB read, base64)


def _encode(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return _encode(value.item())
        except Exception:
            pass
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays
        try:
            return _encode(value.tolist())
        except Exception:
            pass
    return {"$repr": repr(value)[:10_000]}


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return base64.b64decode(value["$bytes"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(_encode(message), separators=(",", ":")).encode() + b"\n"


def loads(line: bytes) -> dict[str, Any]:
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"a protocol message must be a JSON object, got {type(obj).__name__}")
    return _decode(obj)
