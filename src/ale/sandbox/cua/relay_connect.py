"""The in-sandbox end of ale's tunnel to a computer-server inside a sealed sandbox.

Never imported by ale: its source is passed to the sandbox's ``python3 -c`` by a
``docker exec`` as the candidate user, stdin attached (so no file of ale's has to be
in the image); standard library only:

    python3 -c SOURCE PORT

For each connection the host opens (an ``OPEN`` frame), it connects to
``127.0.0.1:PORT`` in the sandbox's own network namespace (the sandbox has no other
interface) and carries the bytes both ways over its stdin and stdout, which are the
exec's attached stream on the trusted side. It connects to nothing else, whatever
the frames say. Frames: ``op (1 byte) | connection (4, big-endian) | length (4) |
payload``; ``op`` 1 open, 2 data, 3 end of data, 4 close, 5 ready (once, at start).
"""

import asyncio
import os
import socket
import struct
import sys

OPEN, DATA, EOF, CLOSE, READY = 1, 2, 3, 4, 5
HEADER = struct.Struct(">BII")
CHUNK = 65536


class Relay:
    def __init__(self, out, port):
        self.out, self.port = out, port
        self.writers = {}
        self.pending = {}

    def send(self, op, cid, payload=b""):
        self.out.write(HEADER.pack(op, cid, len(payload)) + payload)

    async def connect(self, cid):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.pending.pop(cid, None)
            self.send(CLOSE, cid)
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.writers[cid] = writer
        for op, payload in self.pending.pop(cid, []):
            self.to_server(op, cid, payload)
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                self.send(DATA, cid, data)
        except (ConnectionError, OSError):
            pass
        self.send(EOF, cid)

    def to_server(self, op, cid, payload):
        w = self.writers.get(cid)
        if w is None:
            if cid in self.pending:  # still connecting: keep the bytes in order
                self.pending[cid].append((op, payload))
            return
        try:
            if op == DATA:
                w.write(payload)
            elif op == EOF:
                if w.can_write_eof():
                    w.write_eof()
            elif op == CLOSE:
                self.writers.pop(cid, None)
                w.close()
        except (ConnectionError, OSError, RuntimeError):
            pass

    def from_host(self, op, cid, payload):
        if op == OPEN:
            if cid not in self.writers and cid not in self.pending:
                self.pending[cid] = []
                asyncio.ensure_future(self.connect(cid))
        else:
            self.to_server(op, cid, payload)


async def main(port):
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2 * CHUNK)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(os.dup(1), "wb", buffering=0))
    relay = Relay(out, port)
    relay.send(READY, 0, str(port).encode())
    try:
        while True:
            op, cid, n = HEADER.unpack(await reader.readexactly(HEADER.size))
            relay.from_host(op, cid, await reader.readexactly(n) if n else b"")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the host closed the tunnel
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(int(sys.argv[1]))))
