"""The in-sandbox end of a native harness's channel to the run's model gateway.

Copied into the harness's image layer (``/opt/ale-harness/relay.py``) and started
by the host with ``docker exec`` as the candidate user; standard library only, never
imported by ale:

    python3 relay.py PORT

It listens on ``127.0.0.1:PORT`` in the sandbox's own network namespace (the
sandbox has no other interface: its network mode is ``none``) and carries every
connection over its own stdin and stdout, which are the exec's attached stream on
the trusted side: nothing else of the host is reachable through it, and the host
end connects each one to the run's gateway only. Frames, both ways:
``op (1 byte) | connection (4 bytes, big-endian) | length (4) | payload``, with
``op`` 1 open, 2 data, 3 end of data (half close), 4 close, 5 ready (relay to host,
once listening).
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
    def __init__(self, out):
        self.out = out
        self.conns = {}
        self.next_id = 0

    def send(self, op, conn, payload=b""):
        self.out.write(HEADER.pack(op, conn, len(payload)) + payload)

    async def accept(self, reader, writer):
        self.next_id += 1
        cid = self.next_id
        sock = writer.get_extra_info("socket")
        if sock is not None:  # each response chunk goes out as it comes (no Nagle wait on the loopback)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns[cid] = writer
        self.send(OPEN, cid)
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                self.send(DATA, cid, data)
        except (ConnectionError, OSError):
            pass
        self.send(EOF, cid)

    def from_host(self, op, cid, payload):
        w = self.conns.get(cid)
        if w is None:
            return
        try:
            if op == DATA:
                w.write(payload)
            elif op == EOF:
                if w.can_write_eof():
                    w.write_eof()
            elif op == CLOSE:
                self.conns.pop(cid, None)
                w.close()
        except (ConnectionError, OSError, RuntimeError):
            pass


async def main(port):
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2 * CHUNK)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    out_transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(os.dup(1), "wb", buffering=0))
    relay = Relay(out_transport)
    server = await asyncio.start_server(relay.accept, "127.0.0.1", port)
    relay.send(READY, 0, str(port).encode())
    try:
        while True:
            head = await reader.readexactly(HEADER.size)
            op, cid, n = HEADER.unpack(head)
            payload = await reader.readexactly(n) if n else b""
            relay.from_host(op, cid, payload)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the host closed the channel: the run's turn is over
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(int(sys.argv[1]))))
