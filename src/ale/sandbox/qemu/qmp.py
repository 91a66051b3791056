"""A small synchronous QMP client over a unix socket: what the seal reads QEMU with.

QMP (the QEMU Machine Protocol) is one JSON object per line: QEMU greets with
``{"QMP": {...}}``, the client leaves negotiation mode with ``qmp_capabilities``, then
each ``{"execute": ..., "arguments": ...}`` is answered by ``{"return": ...}`` or
``{"error": {"class", "desc"}}``; asynchronous ``{"event": ...}`` messages may arrive
between them and are kept aside (`QmpClient.events`), never taken for an answer.

Why not `qemu.qmp` (PyPI, QEMU's own library): it is asyncio-only, still 0.0.x, and its
synchronous face (`qemu.qmp.legacy`) is marked as a transition aid for QEMU's own test
scripts. The seal needs a dozen sequential queries against a local socket, from
synchronous code (the capture runs in a worker thread of the provider and in tests),
with a hard deadline per command; the protocol part of that is the hundred lines below,
with no extra dependency to pin and audit in the harness's trusted base.

Every failure (no socket, a timeout, a closed connection, an ``error`` answer, a
malformed line) is an `ale.sandbox.base.SandboxError` (`QmpError` for an error answer,
which keeps QEMU's error class).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from types import TracebackType
from typing import Any

from ale.sandbox.base import SandboxError

DEFAULT_TIMEOUT = 10.0  # seconds per command: QMP answers from the main loop, in milliseconds
_MAX_LINE = 16 * 1024 * 1024  # a reply larger than this is not QEMU's (query-block is a few KB)


class QmpError(SandboxError):
    """QEMU answered a command with an error (`error_class`: its QMP error class)."""

    def __init__(self, command: str, error_class: str, desc: str):
        super().__init__(f"QMP {command}: {error_class}: {desc}")
        self.command = command
        self.error_class = error_class
        self.desc = desc


class QmpClient:
    """One QMP connection. Use as a context manager, or `connect()` and `close()`.

    ``greeting`` holds QEMU's greeting (its version and capabilities) once connected.
    """

    def __init__(self, path: str, *, timeout: float = DEFAULT_TIMEOUT):
        self.path = str(path)
        self.timeout = timeout
        self.greeting: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []
        self._sock: socket.socket | None = None
        self._buf = b""

    # -- connection ---------------------------------------------------------------
    def connect(self, *, wait: float = 0.0) -> QmpClient:
        """Connect, read the greeting and negotiate capabilities. ``wait``: keep retrying
        a missing or refusing socket for this many seconds (QEMU creates it as it starts)."""
        deadline = time.monotonic() + wait
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
                break
            except (FileNotFoundError, ConnectionRefusedError) as e:
                sock.close()
                if time.monotonic() >= deadline:
                    raise SandboxError(f"cannot connect to QMP at {self.path}: {e}") from e
                time.sleep(0.05)
            except OSError as e:
                sock.close()
                raise SandboxError(f"cannot connect to QMP at {self.path}: {e}") from e
        self._sock, self._buf = sock, b""
        try:
            greeting = self._read(time.monotonic() + self.timeout, "greeting")
            if "QMP" not in greeting:
                raise SandboxError(f"QMP at {self.path} did not greet: {greeting!r}")
            self.greeting = greeting["QMP"]
            self.execute("qmp_capabilities")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def __enter__(self) -> QmpClient:
        return self if self._sock is not None else self.connect()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def peer(self) -> dict[str, int]:
        """Who is at the other end of the socket, from the kernel (SO_PEERCRED): the QEMU
        process's pid, uid and gid, whatever pid the caller believes it started."""
        if self._sock is None:
            raise SandboxError("QMP: not connected")
        try:
            raw = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError as e:
            raise SandboxError(f"QMP: cannot read the peer's credentials: {e}") from e
        pid, uid, gid = struct.unpack("3i", raw)
        return {"pid": pid, "uid": uid, "gid": gid}

    # -- commands -----------------------------------------------------------------
    def execute(self, command: str, arguments: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Run one command; its ``return`` value. An ``error`` answer raises `QmpError`."""
        if self._sock is None:
            raise SandboxError(f"QMP {command}: not connected")
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        try:
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as e:
            raise SandboxError(f"QMP {command}: cannot send: {e}") from e
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            reply = self._read(deadline, command)
            if "event" in reply:
                self.events.append(reply)
                continue
            if "error" in reply:
                err = reply["error"] if isinstance(reply["error"], dict) else {}
                raise QmpError(command, str(err.get("class", "?")), str(err.get("desc", reply["error"])))
            if "return" in reply:
                return reply["return"]
            raise SandboxError(f"QMP {command}: unexpected reply {reply!r}")

    def hmp(self, command_line: str, *, timeout: float | None = None) -> str:
        """A human-monitor command through QMP (`human-monitor-command`); its text output."""
        out = self.execute("human-monitor-command", {"command-line": command_line}, timeout=timeout)
        if not isinstance(out, str):
            raise SandboxError(f"HMP {command_line!r}: not text: {out!r}")
        return out.replace("\r\n", "\n")

    # -- the wire -----------------------------------------------------------------
    def _read(self, deadline: float, what: str) -> dict[str, Any]:
        assert self._sock is not None
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(f"QMP {what}: no answer within {self.timeout:g} s")
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError as e:
                raise SandboxError(f"QMP {what}: no answer in time") from e
            except OSError as e:
                raise SandboxError(f"QMP {what}: {e}") from e
            if not chunk:
                raise SandboxError(f"QMP {what}: QEMU closed the connection")
            self._buf += chunk
            if len(self._buf) > _MAX_LINE:
                raise SandboxError(f"QMP {what}: a reply over {_MAX_LINE} bytes")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            doc = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SandboxError(f"QMP {what}: malformed line {line[:200]!r}: {e}") from e
        if not isinstance(doc, dict):
            raise SandboxError(f"QMP {what}: not a JSON object: {line[:200]!r}")
        return doc
