"""Messages between the harness and a task process: one frame each.

A frame is one JSON object on one line, followed by the raw bytes of its blobs:
a ``str`` or ``bytes`` value of at least ``BLOB_MIN`` characters or bytes leaves
the JSON as ``{"$blob": i, "$t": "s" | "b"}`` and travels after the line as is
(text as UTF-8, lone surrogates kept), the line's ``"$blobs"`` listing each blob's
length. So a 200 MiB file read whole crosses the channel as 200 MiB, not as 1.2 GB
of JSON escapes (``\\u0000`` per NUL byte) the other side has to parse. Smaller
bytes travel as ``{"$bytes": "<base64>"}``; tuples become lists; any other value
JSON cannot hold travels as its ``repr`` under ``{"$repr": ...}`` (never
executed). Floats keep NaN and infinities (Python's JSON extension), so a grader
returning NaN is seen as NaN, not as an error of the channel.

A frame (line and blobs) larger than ``MAX_MESSAGE`` bytes is a protocol error.
"""

from __future__ import annotations

import base64
import json
from typing import Any

MAX_MESSAGE = 2 * 1024 * 1024 * 1024  # bytes of one frame, its line and blobs together
MAX_LINE = MAX_MESSAGE  # the line alone can be no longer
BLOB_MIN = 64 * 1024  # a str or bytes value this long or longer travels as a blob


def _encode(value: Any, blobs: list[bytes] | None) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        if blobs is not None and len(value) >= BLOB_MIN:
            blobs.append(bytes(value))
            return {"$blob": len(blobs) - 1, "$t": "b"}
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, str):
        if blobs is not None and len(value) >= BLOB_MIN:
            blobs.append(value.encode("utf-8", "surrogatepass"))
            return {"$blob": len(blobs) - 1, "$t": "s"}
        return value
    if isinstance(value, dict):
        return {str(k): _encode(v, blobs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v, blobs) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return _encode(value.item(), blobs)
        except Exception:
            pass
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays
        try:
            return _encode(value.tolist(), blobs)
        except Exception:
            pass
    return {"$repr": repr(value)[:10_000]}


def _decode(value: Any, blobs: list[bytes]) -> Any:
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"$bytes"}:
            return base64.b64decode(value["$bytes"])
        if keys == {"$blob", "$t"} and blobs:
            i, kind = value["$blob"], value["$t"]
            if type(i) is not int or not 0 <= i < len(blobs) or kind not in ("s", "b"):
                raise ValueError(f"a blob reference to {i!r} ({kind!r}) of {len(blobs)} blob(s)")
            return blobs[i] if kind == "b" else blobs[i].decode("utf-8", "surrogatepass")
        return {k: _decode(v, blobs) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, blobs) for v in value]
    return value


def frame(message: dict[str, Any]) -> list[bytes]:
    """The frame of ``message``: its line, then its blobs (write them in this order)."""
    blobs: list[bytes] = []
    head = _encode(message, blobs)
    if blobs:
        head["$blobs"] = [len(b) for b in blobs]
    return [json.dumps(head, separators=(",", ":")).encode() + b"\n", *blobs]


def dumps(message: dict[str, Any]) -> bytes:
    """The whole frame of ``message`` as one bytes object."""
    return b"".join(frame(message))


def head(line: bytes) -> tuple[dict[str, Any], list[int]]:
    """A frame's line parsed: the JSON object and the lengths of the blobs that follow
    it. ``ValueError`` when the line is no frame's, or announces more than
    ``MAX_MESSAGE`` bytes in all."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"a protocol message must be a JSON object, got {type(obj).__name__}")
    sizes = obj.pop("$blobs", [])
    if not isinstance(sizes, list) or not all(type(n) is int and n >= 0 for n in sizes):
        raise ValueError("a frame's $blobs must be a list of lengths")
    if len(line) + sum(sizes) > MAX_MESSAGE:
        raise ValueError(f"a frame of {len(line) + sum(sizes)} bytes, above the channel's limit of {MAX_MESSAGE}")
    return obj, sizes


def decode(obj: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
    """The message of a frame, its blobs put back in place."""
    out = _decode(obj, blobs)
    assert isinstance(out, dict)
    return out


def loads(data: bytes) -> dict[str, Any]:
    """The message of one whole frame held in memory (``dumps``'s inverse)."""
    end = data.index(b"\n") + 1 if b"\n" in data else len(data)
    obj, sizes = head(data[:end])
    if end + sum(sizes) != len(data):
        raise ValueError(f"a frame announces {sum(sizes)} bytes of blobs, {len(data) - end} follow")
    blobs, at = [], end
    for n in sizes:
        blobs.append(data[at : at + n])
        at += n
    return decode(obj, blobs)
