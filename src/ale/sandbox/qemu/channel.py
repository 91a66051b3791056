"""The host's end of a VM's control channel: the virtio-serial port ``org.ale.ctl``,
which QEMU exposes as a unix socket in the VM's 0700 state folder and which, in the
guest, only root (ale's guest agent) can open.

One connection per VM per event loop, shared by every handle on it (QEMU's socket
chardev serves one client at a time). Requests and answers are ``wire.py`` messages;
each request gets its own channel number. ``Relay`` serves a unix socket whose
connections become TCP streams to a guest port (computer-server's), so that any
HTTP client (``CuaClient(uds=...)``) reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from typing import Any

from ale.sandbox.base import SandboxError, SandboxGone
from ale.sandbox.qemu.wire import Decoder, encode


class ChannelClosed(SandboxGone):
    """The control connection ended (QEMU exited, or the sandbox was removed)."""


class Channel:
    def __init__(self, path: str):
        self.path = path
        self.loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._streams: dict[int, asyncio.Queue[tuple[dict[str, Any], bytes]]] = {}
        self._wlock = asyncio.Lock()
        self.closed = False
        self.boot_id: str | None = None

    async def open(self) -> Channel:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            await self.loop.sock_connect(s, self.path)
        except OSError as e:
            s.close()
            raise SandboxError(f"cannot connect to the VM's control socket {self.path}: {e}") from e
        self._sock = s
        self._reader, self._writer = await asyncio.open_unix_connection(sock=s)
        self._task = asyncio.ensure_future(self._read_loop())
        return self

    async def _read_loop(self) -> None:
        assert self._reader is not None
        dec = Decoder()
        try:
            while True:
                data = await self._reader.read(1 << 16)
                if not data:
                    break
                for header, payload in dec.feed(data):
                    ch = int(header.get("ch", 0))
                    q = self._streams.get(ch)
                    if q is not None:
                        q.put_nowait((header, payload))
                        continue
                    fut = self._waiters.pop(ch, None)
                    if fut is not None and not fut.done():
                        fut.set_result((header, payload))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._fail()

    def _fail(self) -> None:
        self.closed = True
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(ChannelClosed("the VM's control channel closed"))
        self._waiters.clear()
        for q in self._streams.values():
            q.put_nowait(({"op": "close", "error": "channel closed"}, b""))

    def new_ch(self) -> int:
        return next(self._ids)

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        if self.closed or self._writer is None:
            raise ChannelClosed("the VM's control channel is closed")
        async with self._wlock:
            try:
                self._writer.write(encode(header, payload))
                await self._writer.drain()
            except (OSError, RuntimeError) as e:
                self._fail()
                raise ChannelClosed(f"the VM's control channel failed: {e}") from e

    async def request(self, header: dict[str, Any], payload: bytes = b"", *,
                      timeout: float | None = None) -> tuple[dict[str, Any], bytes]:
        ch = self.new_ch()
        fut: asyncio.Future[tuple[dict[str, Any], bytes]] = self.loop.create_future()
        self._waiters[ch] = fut
        try:
            await self.send({**header, "ch": ch}, payload)
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters.pop(ch, None)

    async def wait_ready(self, timeout: float, alive: Any = None) -> dict[str, Any]:
        """Ping until the agent answers (it opens its port once the guest has booted)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise SandboxGone("the VM exited while booting")
            try:
                h, _ = await self.request({"op": "ping"}, timeout=0.5)
                self.boot_id = h.get("boot_id")
                return h
            except TimeoutError:
                continue
        raise SandboxError(f"the VM's guest agent did not answer within {timeout:.0f}s")

    def stream(self, ch: int) -> asyncio.Queue[tuple[dict[str, Any], bytes]]:
        q: asyncio.Queue[tuple[dict[str, Any], bytes]] = asyncio.Queue()
        self._streams[ch] = q
        return q

    def end_stream(self, ch: int) -> None:
        self._streams.pop(ch, None)

    def close(self) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._fail()


# One channel per (control socket, event loop): every handle in this process shares it.
_CHANNELS: dict[str, Channel] = {}


async def channel_for(path: str) -> Channel:
    loop = asyncio.get_running_loop()
    ch = _CHANNELS.get(path)
    if ch is not None and ch.loop is loop and not ch.closed:
        return ch
    if ch is not None:
        # another (perhaps closed) loop's connection: close its socket so QEMU takes ours
        if ch._sock is not None:
            with contextlib.suppress(OSError):
                ch._sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                ch._sock.close()
        ch.closed = True
    ch = await Channel(path).open()
    _CHANNELS[path] = ch
    return ch


def drop_channel(path: str) -> None:
    ch = _CHANNELS.pop(path, None)
    if ch is not None:
        try:
            running = asyncio.get_running_loop() is ch.loop
        except RuntimeError:
            running = False
        if running:
            ch.close()
        elif ch._sock is not None:
            with contextlib.suppress(OSError):
                ch._sock.close()


class Relay:
    """A unix socket (0600, in the VM's state folder) whose every connection is a TCP
    stream to ``port`` on the guest's loopback, through the agent."""

    def __init__(self, channel: Channel, path: str, port: int):
        self.channel, self.path, self.port = channel, path, port
        self.server: asyncio.base_events.Server | None = None
        self.opened = 0

    async def start(self) -> Relay:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ch = self.channel.new_ch()
        q = self.channel.stream(ch)
        self.opened += 1
        try:
            await self.channel.send({"op": "open", "ch": ch, "port": self.port})
            h, _ = await asyncio.wait_for(q.get(), 30)
            if h.get("op") != "opened":
                return

            async def up() -> None:
                while True:
                    d = await reader.read(1 << 16)
                    if not d:
                        await self.channel.send({"op": "eof", "ch": ch})
                        return
                    await self.channel.send({"op": "data", "ch": ch}, d)

            pump = asyncio.ensure_future(up())
            try:
                while True:
                    h, payload = await q.get()
                    if h.get("op") == "data":
                        writer.write(payload)
                        await writer.drain()
                    else:  # eof or close
                        break
            finally:
                pump.cancel()
        except (OSError, SandboxError, TimeoutError):
            pass
        finally:
            self.channel.end_stream(ch)
            with contextlib.suppress(SandboxError):
                await self.channel.send({"op": "close", "ch": ch})
            with contextlib.suppress(Exception):
                writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
