"""Runs inside a confined harness's private network namespace (standard library
only; started by bubblewrap with the host's ``python3``, never imported by ale).

    python3 netns_relay.py --map PORT=SOCKET [--map ...] -- ARGV...

For each ``--map`` it listens on ``127.0.0.1:PORT`` inside the namespace and relays
every connection to the unix ``SOCKET`` bound into the sandbox (the model
gateway's, the MCP bridge's), then runs ARGV and exits with its exit code. The
namespace has only a loopback interface, so these ports are all the harness can
reach.
"""

import asyncio
import contextlib
import os
import signal
import sys


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


def _handler(path):
    async def handle(reader, writer):
        try:
            ur, uw = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, uw), _pipe(ur, writer))

    return handle


async def main(argv):
    maps, i = [], 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--map":
            port, path = argv[i + 1].split("=", 1)
            maps.append((int(port), path))
            i += 2
        else:
            sys.exit(f"netns_relay: unknown argument {argv[i]!r}")
    cmd = argv[i + 1:]
    if not cmd:
        sys.exit("netns_relay: no command after --")
    for port, path in maps:
        await asyncio.start_server(_handler(path), "127.0.0.1", port)
    proc = await asyncio.create_subprocess_exec(*cmd)
    loop = asyncio.get_running_loop()

    def forward(sig):
        if proc.returncode is None:
            proc.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, forward, sig)
    rc = await proc.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(asyncio.run(main(sys.argv[1:])))
