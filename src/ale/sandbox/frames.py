"""The frames ale's exec-stream channels carry (``channel.py`` to a run's model
gateway, ``cua/tunnel.py`` to a sandbox's computer-server), inside Docker's
multiplexed exec stream (an 8-byte header per chunk):
``op (1 byte) | connection (4, big-endian) | length (4) | payload``."""

from __future__ import annotations

import struct

OPEN, DATA, EOF, CLOSE, READY = 1, 2, 3, 4, 5
HEADER = struct.Struct(">BII")
DOCKER_HEADER = 8
MAX_FRAME = 1 << 20
