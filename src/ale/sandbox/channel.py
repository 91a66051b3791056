"""The host end of a native harness's only way out: an exec-attached stream to the
run's model gateway.

``async with ExecChannel(sandbox, gateway=("127.0.0.1", port)).serve() as ch``
starts ``python3 /opt/ale-harness/relay.py PORT`` in the sandbox with ``docker exec``
as the candidate user, stdin attached (``ale.sandbox.channel_relay``: it listens on
``127.0.0.1:PORT`` in the sandbox's own network namespace). Each connection the
relay accepts arrives here as frames on the exec's stream, and is connected to the
gateway, and to nothing else: the host end has no other target, whatever the frames
say. So the sealed sandbox keeps its configuration (network mode ``none``, exactly
its two mounts, no port, no socket): the channel is a process, killed with every
other candidate process at the end of the agent's turn, and its stream is the
engine's, on the trusted side.

The candidate may talk to the relay's port, or to the relay's own stdin (same uid):
either way it reaches the gateway and only the gateway, where the run's token, the
endpoints, the model, the tools and the budgets are checked. A malformed frame
closes the channel (the harness then loses its model; the record says why).

``record()`` is what the run keeps (``agent/confinement.json``): the exec's
configuration as the engine reports it (user, privileged, tty, argv), the port, the
target, the counts of connections and bytes, protocol errors, the relay's stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import docker.errors

from ale.sandbox.base import SandboxError
from ale.sandbox.frames import CLOSE, DATA, DOCKER_HEADER, EOF, HEADER, MAX_FRAME, OPEN, READY
from ale.sandbox.harness_image import RELAY_PATH

CHANNEL_PORT = 8417  # inside the sandbox: 127.0.0.1:8417
READY_TIMEOUT_S = 30.0


class ChannelError(SandboxError):
    """The channel could not be started."""


class _Conn:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None


class ExecChannel:
    def __init__(self, sandbox: Any, *, gateway: tuple[str, int], port: int = CHANNEL_PORT, user: str | None = None):
        if not hasattr(sandbox, "client") or not hasattr(sandbox, "id"):
            raise ChannelError("native mode needs the Docker provider (the channel is a docker exec stream)")
        self.sandbox, self.gateway, self.port = sandbox, gateway, port
        self.user = user or sandbox.policy.user
        self.exec_id: str | None = None
        self.conns: dict[int, _Conn] = {}
        self.stats = {"connections": 0, "bytes_up": 0, "bytes_down": 0, "protocol_errors": 0}
        self.errors: list[str] = []
        self.stderr = bytearray()
        self.ready = asyncio.Event()
        self.started_s: float | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._sock: Any = None

    @property
    def argv(self) -> list[str]:
        return ["python3", RELAY_PATH, str(self.port)]

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        api = self.sandbox.client.api
        try:
            ex = await asyncio.to_thread(api.exec_create, self.sandbox.id, self.argv, stdin=True, user=self.user,
                                         workdir="/", environment={"ALE_CHANNEL": "1"})
            self.exec_id = ex["Id"]
            sock = await asyncio.to_thread(api.exec_start, self.exec_id, socket=True)
        except docker.errors.DockerException as e:
            raise ChannelError(f"cannot start the channel's relay in {self.sandbox.name}: {e}") from e
        self._sock = getattr(sock, "_sock", sock)
        self._sock.settimeout(None)
        return await asyncio.open_connection(sock=self._sock)

    def _send(self, op: int, cid: int, payload: bytes = b"") -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(HEADER.pack(op, cid, len(payload)) + payload)

    async def _read_stream(self, reader: asyncio.StreamReader) -> None:
        """Docker's multiplexed stream (stdout frames carry the relay's frames)."""
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
                    if n > MAX_FRAME or op not in (OPEN, DATA, EOF, CLOSE, READY):
                        self.stats["protocol_errors"] += 1
                        self.errors.append(f"malformed frame from the sandbox (op {op}, length {n}); channel closed")
                        return
                    if len(buf) < HEADER.size + n:
                        break
                    payload = bytes(buf[HEADER.size: HEADER.size + n])
                    del buf[: HEADER.size + n]
                    self._frame(op, cid, payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return

    def _frame(self, op: int, cid: int, payload: bytes) -> None:
        if op == READY:
            self.ready.set()
        elif op == OPEN:
            if cid in self.conns:
                return
            self.stats["connections"] += 1
            conn = self.conns[cid] = _Conn()
            conn.task = asyncio.ensure_future(self._pump(cid, conn))
        elif op == DATA and cid in self.conns:
            self.stats["bytes_up"] += len(payload)
            self.conns[cid].queue.put_nowait(payload)
        elif op in (EOF, CLOSE) and cid in self.conns:
            self.conns[cid].queue.put_nowait(None)

    async def _pump(self, cid: int, conn: _Conn) -> None:
        """One connection: to the gateway (its only target), both ways."""
        try:
            gr, gw = await asyncio.open_connection(*self.gateway)
            sock = gw.get_extra_info("socket")
            if sock is not None:  # a request's headers and body go out as they come
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            self.errors.append(f"connection {cid}: the gateway cannot be reached: {e}")
            self._send(CLOSE, cid)
            return

        async def down() -> None:
            while data := await gr.read(65536):
                self.stats["bytes_down"] += len(data)
                self._send(DATA, cid, data)
            self._send(EOF, cid)

        back = asyncio.ensure_future(down())
        try:
            while (data := await conn.queue.get()) is not None:
                gw.write(data)
                await gw.drain()
            if gw.can_write_eof():
                gw.write_eof()
            await back
        except (ConnectionError, OSError):
            pass
        finally:
            back.cancel()
            gw.close()
            self._send(CLOSE, cid)
            self.conns.pop(cid, None)

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[ExecChannel]:
        t0 = time.perf_counter()
        reader, self._writer = await self._open()
        reading = asyncio.ensure_future(self._read_stream(reader))
        try:
            ready = asyncio.ensure_future(self.ready.wait())
            done, _ = await asyncio.wait({ready, reading}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            if ready not in done:
                ready.cancel()
                raise ChannelError(f"the channel's relay did not start in the sandbox: "
                                   f"{bytes(self.stderr).decode(errors='replace')[-1500:] or 'no output'}")
            self.started_s = round(time.perf_counter() - t0, 4)
            yield self
        finally:
            reading.cancel()
            for conn in list(self.conns.values()):
                if conn.task is not None:
                    conn.task.cancel()
            with contextlib.suppress(Exception):
                self._writer.close()

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
                        "argv": [pc.get("entrypoint"), *(pc.get("arguments") or [])]},
            "expected_user": self.user,
            "listen_inside": f"127.0.0.1:{self.port}",
            "target": f"{self.gateway[0]}:{self.gateway[1]} (the run's model gateway, the only target)",
            "relay_running": info.get("Running"),
            "relay_exit_code": info.get("ExitCode"),
            "start_s": self.started_s,
            **self.stats,
            "errors": self.errors[:20],
            "relay_stderr": bytes(self.stderr).decode(errors="replace")[-4000:],
        }
