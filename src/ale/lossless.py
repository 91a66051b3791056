"""Lossless text in records: file names of any bytes, strings of any code points.

Every record ale writes is UTF-8 JSON. Two things a candidate controls do not fit
it as they are, and this module is the one place that says how they are kept:

- **File names are bytes.** A name that is valid UTF-8 is recorded as that string,
  exactly. Any other name is recorded as its *display form* (each byte that is not
  part of valid UTF-8 written ``\\xNN``) together with the exact bytes in base64
  (``name_fields``). The exact bytes of any recorded name are
  ``base64decode(b64)`` when the base64 is present, else ``path.encode("utf-8")``
  (``name_bytes``).
- **A Python str may hold lone surrogates** (``json.loads('"\\ud800"')`` makes one;
  so do names decoded with ``surrogateescape``). They cannot be encoded as UTF-8.
  ``json_safe`` replaces each such string with ``{"$utf8_surrogatepass_base64":
  B64}``, B64 being the base64 of ``s.encode("utf-8", "surrogatepass")``, from
  which ``s`` is decoded back exactly (``restore``); a dict key of that kind
  becomes the string ``"$utf8_surrogatepass_base64:" + B64``. Bytes become
  ``{"$base64": B64}``. So that no value is mistaken for a marker, a dict key
  that is a marker key, starts with the marker prefix, or starts with ``$$`` is
  written with one more ``$`` in front (``restore`` removes it). Everything else
  is left as it is, so a record without such values is byte-for-byte what it
  was before (``needs_json_safe`` tells, from the JSON text, when one may not be).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

SURROGATES_KEY = "$utf8_surrogatepass_base64"
BYTES_KEY = "$base64"
_KEY_PREFIX = SURROGATES_KEY + ":"
_MARKERS = frozenset({SURROGATES_KEY, BYTES_KEY})


def is_unicode(s: str) -> bool:
    """True when `s` can be encoded as UTF-8 (it holds no lone surrogate)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def display(s: str) -> str:
    """A valid-Unicode rendering of `s`: each lone surrogate written ``\\udXXX``."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def exact_bytes(s: str) -> bytes:
    """The lossless byte form of any str (UTF-8, lone surrogates passed through)."""
    return s.encode("utf-8", "surrogatepass")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def name_fields(raw: bytes) -> tuple[str, str | None]:
    """``(path, path_b64)`` of a name or relative path given as bytes: the exact
    string and None when it is valid UTF-8, else the ``\\xNN`` display form and
    the exact bytes in base64."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), b64(raw)


# C0 controls, DEL and C1 controls: a terminal acts on them (ESC starts a sequence;
# OSC 52 writes the clipboard; C1's CSI and OSC need no ESC at all).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}


def printable(s: str) -> str:
    """``s`` safe to print on a terminal: every C0 and C1 control and DEL written
    ``\\xNN`` and every lone surrogate ``\\udXXX``; a backslash stays as it is.
    For showing a recorded name (or any text a candidate chose) to an operator; the
    records keep the exact value."""
    return display(s).translate(_CONTROLS)


def display_name(raw: bytes) -> str:
    """A name given as bytes, printable (``name_fields``'s display form, ``printable``)."""
    return printable(name_fields(raw)[0])


def name_bytes(path: str, path_b64: str | None) -> bytes:
    """The exact bytes a ``(path, path_b64)`` pair records (inverse of ``name_fields``)."""
    if path_b64 is not None:
        return base64.b64decode(path_b64, validate=True)
    return path.encode("utf-8")


def json_safe(obj: Any, default: Callable[[Any], Any] | None = None) -> Any:
    """A copy of `obj` that JSON can hold as UTF-8, losing nothing (see the module
    doc). `default` converts objects JSON does not know (it is applied first and
    its result made safe too); without it they are returned unchanged."""
    if isinstance(obj, str):
        return obj if is_unicode(obj) else {SURROGATES_KEY: b64(exact_bytes(obj))}
    if isinstance(obj, bool | int | float) or obj is None:
        return obj
    if isinstance(obj, bytes | bytearray | memoryview):
        return {BYTES_KEY: b64(bytes(obj))}
    if isinstance(obj, dict):
        return {safe_key(k): json_safe(v, default) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v, default) for v in obj]
    if default is not None:
        return json_safe(default(obj), default)
    return obj


def safe_key(key: Any) -> Any:
    """A dict key as ``json_safe`` writes it."""
    if not isinstance(key, str):
        return key
    if not is_unicode(key):
        return _KEY_PREFIX + b64(exact_bytes(key))
    if key.startswith("$$") or key in _MARKERS or key.startswith(_KEY_PREFIX):
        return "$" + key
    return key


def needs_json_safe(json_text: str) -> bool:
    """Whether JSON text written without ``json_safe`` may hold a key that
    ``json_safe`` would escape (a cheap, conservative test on the text)."""
    return '"$$' in json_text or '"' + BYTES_KEY + '"' in json_text or '"' + SURROGATES_KEY in json_text


def restore(obj: Any) -> Any:
    """Undo ``json_safe``: the marker objects and keys become str and bytes again."""
    if isinstance(obj, dict):
        if set(obj) == {SURROGATES_KEY} and isinstance(obj[SURROGATES_KEY], str):
            return base64.b64decode(obj[SURROGATES_KEY]).decode("utf-8", "surrogatepass")
        if set(obj) == {BYTES_KEY} and isinstance(obj[BYTES_KEY], str):
            return base64.b64decode(obj[BYTES_KEY])
        return {_restore_key(k): restore(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [restore(v) for v in obj]
    return obj


def _restore_key(key: str) -> str:
    if key.startswith("$$"):
        return key[1:]
    if key.startswith(_KEY_PREFIX):
        return base64.b64decode(key[len(_KEY_PREFIX):]).decode("utf-8", "surrogatepass")
    return key
