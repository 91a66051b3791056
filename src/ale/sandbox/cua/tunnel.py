"""The host end of ale's tunnel to a computer-server inside a sealed container.

The container keeps its seal (network mode ``none``, its two mounts, no port, no
socket): ``ExecTunnel`` starts ``relay_connect.py`` in it with ``docker exec`` as the
candidate user, stdin attached, and listens on a unix socket in a private folder of
the host's (mode 0700). Each connection to that socket becomes a connection, inside
the container, to ``127.0.0.1:PORT`` (computer-server) and to nothing else; the
frames travel on the exec's stream (the engine's, on the trusted side). The relay
is a candidate process: the end-of-turn kill ends it, and ``ExecTunnel`` is then
closed (``alive`` is False); a new one is opened when needed.

``CuaClient(uds=tunnel.socket_path)`` speaks the protocol through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import docker.errors

from ale.sandbox.base import SandboxError
from ale.sandbox.frames import CLOSE, DATA, DOCKER_HEADER, EOF, HEADER, MAX_FRAME, OPEN, READY

RELAY_SOURCE = (Path(__file__).parent / "relay_connect.py").read_text()
READY_TIMEOUT_S = 60.0


class TunnelError(SandboxError):
    """The tunnel could not be opened."""


class ExecTunnel:
    def __init__(self, sandbox: Any, port: int, *, user: str | None = None, python: str = "python3"):
        self.sandbox, self.port = sandbox, port
        self.user = user or sandbox.policy.user
        self.python = python
        self.exec_id: str | None = None
        self.socket_path = ""
        self.stats = {"connections": 0, "bytes_up": 0, "bytes_down": 0, "protocol_errors": 0}
        self.errors: list[str] = []
        self.stderr = bytearray()
        self.started_s: float | None = None
        self._dir: str | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._conns: dict[int, asyncio.StreamWriter] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._next = 0
        self._ready = asyncio.Event()

    @property
    def alive(self) -> bool:
        return self._reading is not None and not self._reading.done()

    @property
    def argv(self) -> list[str]:
        return [self.python, "-c", RELAY_SOURCE, str(self.port)]

    async def open(self) -> ExecTunnel:
        t0 = time.perf_counter()
        api = self.sandbox.client.api
        try:
            ex = await asyncio.to_thread(api.exec_create, self.sandbox.id, self.argv, stdin=True, user=self.user,
                                         workdir="/", environment={"ALE_CUA_TUNNEL": "1"})
            self.exec_id = ex["Id"]
            sock = await asyncio.to_thread(api.exec_start, self.exec_id, socket=True)
        except docker.errors.DockerException as e:
            raise TunnelError(f"cannot start the tunnel's relay in {self.sandbox.name}: {e}") from e
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(None)
        reader, self._writer = await asyncio.open_connection(sock=raw)
        self._reading = asyncio.ensure_future(self._read_stream(reader))
        ready = asyncio.ensure_future(self._ready.wait())
        done, _ = await asyncio.wait({ready, self._reading}, timeout=READY_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if ready not in done:
            ready.cancel()
            await self.close()
            raise TunnelError(f"the tunnel's relay did not start in {self.sandbox.name}: "
                              f"{bytes(self.stderr).decode(errors='replace')[-1500:] or 'no output'}")
        self._dir = tempfile.mkdtemp(prefix="ale-cua-")
        os.chmod(self._dir, 0o700)
        self.socket_path = os.path.join(self._dir, "computer-server.sock")
        self._server = await asyncio.start_unix_server(self._accept, path=self.socket_path)
        self.started_s = round(time.perf_counter() - t0, 4)
        return self

    def _send(self, op: int, cid: int, payload: bytes = b"") -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(HEADER.pack(op, cid, len(payload)) + payload)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One host connection: up to the relay (it connects inside), both ways."""
        if not self.alive:
            writer.close()
            return
        self._next += 1
        cid = self._next
        self.stats["connections"] += 1
        self._conns[cid] = writer
        self._send(OPEN, cid)
        try:
            while data := await reader.read(65536):
                self.stats["bytes_up"] += len(data)
                self._send(DATA, cid, data)
                if self._writer is not None:
                    await self._writer.drain()
            self._send(EOF, cid)
        except (ConnectionError, OSError):
            self._send(CLOSE, cid)
        except asyncio.CancelledError:  # the tunnel closed under a connection
            return

    async def _read_stream(self, reader: asyncio.StreamReader) -> None:
        """Docker's multiplexed stream; its stdout frames carry the relay's frames."""
        buf = bytearray()
        try:
            while True:
                head = await reader.readexactly(DOCKER_HEADER)
                stream, size = head[0], struct.unpack(">I", head[4:])[0]
                data = await reader.readexactly(size)
                if stream == 2:
                    self.stderr += data[: max(0, 16384 - len(self.stderr))]
                    continue
                buf += data
                while len(buf) >= HEADER.size:
                    op, cid, n = HEADER.unpack_from(buf)
                    if n > MAX_FRAME or op not in (DATA, EOF, CLOSE, READY):
                        self.stats["protocol_errors"] += 1
                        self.errors.append(f"malformed frame from the sandbox (op {op}, length {n}); tunnel closed")
                        return
                    if len(buf) < HEADER.size + n:
                        break
                    payload = bytes(buf[HEADER.size: HEADER.size + n])
                    del buf[: HEADER.size + n]
                    self._frame(op, cid, payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return
        finally:
            for w in self._conns.values():  # the relay is gone: so is every connection through it
                with contextlib.suppress(Exception):
                    w.close()
            self._conns.clear()

    def _frame(self, op: int, cid: int, payload: bytes) -> None:
        if op == READY:
            self._ready.set()
            return
        w = self._conns.get(cid)
        if w is None:
            return
        if op == DATA:
            self.stats["bytes_down"] += len(payload)
            w.write(payload)
        elif op == EOF:
            with contextlib.suppress(OSError, RuntimeError):
                if w.can_write_eof():
                    w.write_eof()
        elif op == CLOSE:
            self._conns.pop(cid, None)
            w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._reading is not None:
            self._reading.cancel()
        for w in list(self._conns.values()):
            with contextlib.suppress(Exception):
                w.close()
        self._conns.clear()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def record(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self.exec_id is not None:
            with contextlib.suppress(docker.errors.DockerException):
                info = await asyncio.to_thread(self.sandbox.client.api.exec_inspect, self.exec_id)
        pc = info.get("ProcessConfig") or {}
        return {
            "kind": "exec-stream",
            "exec_id": self.exec_id,
            "process": {"user": pc.get("user"), "privileged": pc.get("privileged"), "tty": pc.get("tty"),
                        "entrypoint": pc.get("entrypoint")},
            "expected_user": self.user,
            "target_inside": f"127.0.0.1:{self.port} (computer-server, the only target)",
            "host_end": "a unix socket in a private folder (mode 0700) of the harness's",
            "relay_running": info.get("Running"),
            "start_s": self.started_s,
            **self.stats,
            "errors": self.errors[:20],
            "relay_stderr": bytes(self.stderr).decode(errors="replace")[-4000:],
        }
