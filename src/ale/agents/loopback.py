"""In-process HTTP servers on loopback (the MCP bridge, the model gateway): one
way to open their socket, start uvicorn and stop it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import uvicorn

log = logging.getLogger(__name__)


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: Ctrl-C belongs to the run, not the server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def loopback_socket(backlog: int = 128) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 with a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit it: a small response is not held back by Nagle
    # against the client's delayed ACK (about 40 ms a call otherwise).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serve_asgi(
    app: Any, sockets: list[socket.socket], *, what: str, lifespan: Literal["on", "off"] = "off"
) -> AsyncIterator[int]:
    """Serve ``app`` on ``sockets`` (the first a loopback TCP socket) for the block's
    life; yields its port. On exit it stops accepting, gives open requests two
    seconds, then ends them, and closes the sockets. A failed shutdown is logged,
    never raised: it must not hide the block's own outcome."""
    port = sockets[0].getsockname()[1]
    config = uvicorn.Config(app, lifespan=lifespan, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=sockets), name=f"ale-{what.replace(' ', '-')}-{port}")
    try:
        while not server.started:
            if task.done():
                exc = task.exception() if not task.cancelled() else None
                raise RuntimeError(f"the {what} on 127.0.0.1:{port} failed to start: {exc!r}")
            await asyncio.sleep(0.005)
        yield port
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=5)
        except (TimeoutError, asyncio.CancelledError):
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except BaseException as e:
            log.warning("%s shutdown: %r", what, e)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.close()
