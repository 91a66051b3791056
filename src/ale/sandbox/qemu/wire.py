"""The control channel's framing, shared by the host (``channel.py``) and the guest
agent (``guest_agent.py``, which carries its own copy of these few lines: it runs on
the guest's Python with nothing of ale installed).

One message: ``MAGIC (4) | header length (4, big-endian) | payload length (4) |
header (JSON, UTF-8) | payload (bytes)``. The header always has ``op`` and ``ch``
(the stream it belongs to: an exec, a tunnel connection, a ping). A reader that
loses its place (the host reconnected mid-message) scans for the next ``MAGIC``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

MAGIC = b"ALE\x01"
HEAD = struct.Struct(">4sII")
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 64 << 20
#: The virtio-serial port's name (``/sys/class/virtio-ports/*/name`` in the guest).
PORT_NAME = "org.ale.ctl"


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return HEAD.pack(MAGIC, len(h), len(payload)) + h + payload


class Decoder:
    """Feed bytes, take whole messages (header, payload); resyncs on a bad magic."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self.buf += data
        out: list[tuple[dict[str, Any], bytes]] = []
        while True:
            if len(self.buf) < HEAD.size:
                return out
            magic, hl, pl = HEAD.unpack_from(self.buf)
            if magic != MAGIC or hl > MAX_HEADER or pl > MAX_PAYLOAD:
                i = self.buf.find(MAGIC, 1)
                del self.buf[: i if i > 0 else max(0, len(self.buf) - 3)]
                continue
            end = HEAD.size + hl + pl
            if len(self.buf) < end:
                return out
            try:
                header = json.loads(bytes(self.buf[HEAD.size: HEAD.size + hl]))
            except ValueError:
                del self.buf[:4]
                continue
            payload = bytes(self.buf[HEAD.size + hl: end])
            del self.buf[:end]
            if isinstance(header, dict):
                out.append((header, payload))
