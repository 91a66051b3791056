"""ale's client for cua's ``computer-server`` (the PyPI package ``cua-computer-server``).

The server (run inside the machine, as cua's and ALE's images do) answers

- ``GET /status``: ``{"status": "ok", "os_type": "linux", "features": [...]}``;
- ``POST /cmd`` with ``{"command": NAME, "params": {...}}``: one ``data: {json}`` line,
  ``{"success": true, ...}`` or ``{"success": false, "error": ...}`` (an unknown
  command is an HTTP 400 with ``{"detail": ...}``); the server drops parameters its
  handler does not take.

Commands used here (the calls ALE's and cua-bench's task code make): ``run_command``,
``file_exists``, ``directory_exists``, ``list_dir``, ``read_bytes`` (``offset``,
``length``; ``content_b64``), ``write_bytes`` (``content_b64``, ``append``),
``get_file_size``, ``create_dir``, ``delete_file``, ``delete_dir``, ``screenshot``
(``image_data``, base64), ``get_screen_size``, ``get_cursor_position``, the mouse
(``left_click`` ``right_click`` ``double_click`` ``move_cursor`` ``mouse_down``
``mouse_up`` ``drag_to`` ``drag`` ``scroll`` ``scroll_direction``) and the keyboard
(``type_text`` ``press_key`` ``hotkey`` ``key_down`` ``key_up``).

The server's own ``run_command`` runs a shell string with no working folder, no
environment, no input, kills only the shell on a timeout and decodes the output as
strict UTF-8. ``CuaClient.run_command`` gives ale's ``ExecResult`` contract over it:
the command runs under coreutils ``timeout -s KILL`` (its whole process group dies),
every process it left that still carries its tag (``ALE_EXEC_ID``) is killed after a
timeout, the output goes to files (a background child holding it open delays
nothing) and comes back base64-encoded (exact bytes, each stream capped), with the
real exit status. It needs ``sh``, coreutils and a writable ``tmp_dir`` in the machine.

Transport: a base URL over TCP (``http://127.0.0.1:8000``), a unix socket (``uds``:
how ale reaches a server inside a sealed container, through ``tunnel``), or any
``httpx.AsyncBaseTransport`` (a virtio-serial or exec stream).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import shlex
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx2 as httpx

from ale.sandbox.base import DEFAULT_OUTPUT_LIMIT, ExecResult, SandboxError

DEFAULT_URL = "http://127.0.0.1:8000"
EXEC_TAG_VAR = "ALE_EXEC_ID"
# Bytes per read_bytes/write_bytes message (base64 makes it a third larger).
CHUNK = 4 * 1024 * 1024
# One argument (the command `sh -c` runs) is capped at 128 KiB by Linux: a longer one runs from a file.
MAX_INLINE_SCRIPT = 64 * 1024
# Over a command's own timeout: the wrapper's clean-up (server side), the answer (host side).
SERVER_GRACE_S = 10.0
HOST_GRACE_S = 20.0
CALL_TIMEOUT_S = 120.0


class CuaError(SandboxError):
    """The server could not be reached, or its answer is not the protocol's."""


class CuaCommandFailed(CuaError):
    """The server answered ``success: false`` (or refused the command)."""

    def __init__(self, command: str, error: str):
        super().__init__(f"computer-server {command}: {error}")
        self.command = command
        self.error = error


def _missing(error: str) -> bool:
    return "No such file or directory" in error or "Errno 2]" in error


def _parse_cmd_body(command: str, status: int, body: bytes) -> dict[str, Any]:
    """The answer of one ``POST /cmd``: its ``data:`` line's JSON, or the HTTP error's."""
    text = body.decode("utf-8", errors="replace")
    if status != 200:
        try:
            detail = json.loads(text).get("detail", text)
        except (ValueError, AttributeError):
            detail = text
        raise CuaCommandFailed(command, f"HTTP {status}: {str(detail)[:2000]}")
    for line in text.splitlines():
        if line.startswith("data:"):
            try:
                answer = json.loads(line[5:].strip())
            except ValueError as e:
                raise CuaError(f"computer-server {command}: its answer is not JSON: {line[:200]!r}") from e
            if not isinstance(answer, dict):
                raise CuaError(f"computer-server {command}: its answer is not an object: {line[:200]!r}")
            return answer
    raise CuaError(f"computer-server {command}: no data line in its answer: {text[:300]!r}")


class CuaClient:
    """One computer-server, over one transport. Use as ``async with`` or ``aclose()``."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        uds: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = CALL_TIMEOUT_S,
        tmp_dir: str = "/tmp",
    ):
        if uds is not None and transport is not None:
            raise ValueError("give uds or transport, not both")
        if uds is not None:
            transport = httpx.AsyncHTTPTransport(uds=uds)
        self.base_url = base_url.rstrip("/")
        self.uds = uds
        self.timeout = timeout
        self.tmp_dir = tmp_dir.rstrip("/") or "/"
        self._http = httpx.AsyncClient(base_url=self.base_url, transport=transport, timeout=timeout)
        self.calls = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> CuaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the protocol ------------------------------------------------------------
    async def status(self, *, timeout: float = 10.0) -> dict[str, Any]:
        """``GET /status`` (``CuaError`` unless it answers ``status: ok``)."""
        try:
            r = await self._http.get("/status", timeout=timeout)
        except httpx.HTTPError as e:
            raise CuaError(f"computer-server at {self._where()} does not answer: {type(e).__name__}: {e}") from e
        try:
            answer = r.json()
        except ValueError as e:
            raise CuaError(f"computer-server /status: not JSON (HTTP {r.status_code}): {r.text[:200]!r}") from e
        if r.status_code != 200 or not isinstance(answer, dict) or answer.get("status") != "ok":
            raise CuaError(f"computer-server /status: HTTP {r.status_code}: {str(answer)[:300]}")
        return answer

    async def wait_ready(self, timeout: float = 60.0, *, interval: float = 0.1) -> dict[str, Any]:
        """Poll ``/status`` until it answers (``CuaError`` with the last failure after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await self.status(timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            except CuaError:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(interval)

    async def call(self, command: str, params: dict[str, Any] | None = None, *,
                   timeout: float | None = None) -> dict[str, Any]:
        """One command; its answer without ``success`` (``CuaCommandFailed`` when it failed)."""
        self.calls += 1
        try:
            r = await self._http.post("/cmd", json={"command": command, "params": params or {}},
                                      timeout=self.timeout if timeout is None else timeout)
        except httpx.TimeoutException as e:
            raise CuaError(f"computer-server {command}: no answer in {timeout or self.timeout:g}s") from e
        except httpx.HTTPError as e:
            raise CuaError(f"computer-server at {self._where()}: {command} failed: {type(e).__name__}: {e}") from e
        answer = _parse_cmd_body(command, r.status_code, r.content)
        if answer.pop("success", None) is not True:
            raise CuaCommandFailed(command, str(answer.get("error") or answer)[:4000])
        return answer

    def _where(self) -> str:
        return f"{self.uds} ({self.base_url})" if self.uds else self.base_url

    async def version(self) -> dict[str, Any]:
        return await self.call("version")

    async def commands(self) -> dict[str, Any]:
        """``GET /commands``: the server's command names, parameters and aliases."""
        try:
            r = await self._http.get("/commands")
            return dict(r.json())
        except (httpx.HTTPError, ValueError, TypeError) as e:
            raise CuaError(f"computer-server /commands: {e}") from e

    # -- shell -------------------------------------------------------------------
    async def run_command(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        """Run ``command`` (a shell string, or an argv run without a shell) as the
        server's user: ale's ``ExecResult`` (exact bytes, real exit status, the
        timeout honoured over the whole process group and every tagged process)."""
        inner = command if isinstance(command, str) else shlex.join(list(command))
        tag = uuid.uuid4().hex
        d = f"{self.tmp_dir}/.ale-cua-{tag}"
        started = time.monotonic()
        q = shlex.quote
        run = f"sh -c {q(inner)}"
        if stdin is not None or len(inner.encode()) > MAX_INLINE_SCRIPT:
            await self.make_dir(d)
        if stdin is not None:
            await self.write_bytes(f"{d}/i", stdin)
        if len(inner.encode()) > MAX_INLINE_SCRIPT:  # too long for one argument: run it from a file
            await self.write_bytes(f"{d}/c", inner.encode())
            run = f"sh {q(d + '/c')}"
        envs = " ".join(shlex.quote(f"{k}={v}") for k, v in {**(env or {}), EXEC_TAG_VAR: tag}.items())
        wrap = f"timeout -s KILL {max(timeout, 0.1):.3f} " if timeout is not None else ""
        cd = f"cd -- {q(cwd)} || exit 2; " if cwd else ""
        src = f"{q(d + '/i')}" if stdin is not None else "/dev/null"
        cap = int(output_limit) + 1
        script = (
            f"umask 077; mkdir -p -- {q(d)} || exit 97; "
            f"( {cd}exec env {envs} {wrap}{run} ) <{src} >{q(d + '/o')} 2>{q(d + '/e')}; rc=$?; "
            f"printf '%s\\n' \"$rc\"; "
            f"head -c {cap} {q(d + '/o')} | base64 | tr -d '\\n'; echo; "
            f"head -c {cap} {q(d + '/e')} | base64 | tr -d '\\n'; echo; "
            f"rm -rf -- {q(d)}"
        )
        params: dict[str, Any] = {"command": script}
        host_timeout = None
        if timeout is not None:
            params["timeout"] = timeout + SERVER_GRACE_S
            host_timeout = timeout + HOST_GRACE_S
        try:
            answer = await self.call("run_command", params, timeout=host_timeout or 24 * 3600.0)
        except CuaError:
            if timeout is None or time.monotonic() - started < timeout:
                raise
            await self.kill_tagged(tag)  # no answer by the host's deadline
            return ExecResult(exit_code=-1, timed_out=True, duration_s=time.monotonic() - started,
                              extra={"transport": "computer-server", "error": "no answer by the deadline"})
        duration = time.monotonic() - started
        lines = str(answer.get("stdout", "")).split("\n")
        try:
            exit_code = int(lines[0])
            out = base64.b64decode(lines[1], validate=True)
            err = base64.b64decode(lines[2], validate=True)
        except (IndexError, ValueError, binascii.Error) as e:
            raise CuaError(f"computer-server run_command: the wrapper's answer is unreadable "
                           f"(return code {answer.get('return_code')}): {str(answer)[:500]}") from e
        timed_out = timeout is not None and exit_code in (124, 137) and duration >= timeout * 0.95
        if timed_out:
            await self.kill_tagged(tag)
        return ExecResult(
            exit_code=exit_code,
            stdout=out[:output_limit],
            stderr=err[:output_limit],
            timed_out=timed_out,
            stdout_truncated=len(out) > output_limit,
            stderr_truncated=len(err) > output_limit,
            duration_s=duration,
            extra={"transport": "computer-server"},
        )

    async def kill_tagged(self, tag: str) -> None:
        """Kill every process whose environment carries ``ALE_EXEC_ID=tag`` (a timed-out
        command's children that left its process group), sweeping until none is left."""
        var = shlex.quote(f"{EXEC_TAG_VAR}={tag}")
        script = (
            f"i=0; while [ $i -lt 20 ]; do i=$((i+1)); k=0; for p in /proc/[0-9]*; do "
            f"[ \"${{p#/proc/}}\" = $$ ] && continue; "
            f"grep -qzx {var} \"$p/environ\" 2>/dev/null && kill -9 \"${{p#/proc/}}\" 2>/dev/null && k=1; done; "
            f"[ $k = 0 ] && [ $i -ge 3 ] && break; sleep 0.05; done; true"
        )
        await self.call("run_command", {"command": script, "timeout": 30}, timeout=60)

    # -- files -------------------------------------------------------------------
    async def _file_call(self, command: str, path: str, **params: Any) -> dict[str, Any]:
        try:
            return await self.call(command, {"path": path, **params})
        except CuaCommandFailed as e:
            if _missing(e.error):
                raise FileNotFoundError(2, "No such file or directory", path) from e
            if "Permission denied" in e.error or "Errno 13]" in e.error:
                raise PermissionError(13, "Permission denied", path) from e
            if "Errno 30]" in e.error:
                raise PermissionError(30, "Read-only file system", path) from e
            raise

    async def file_exists(self, path: str) -> bool:
        return bool((await self.call("file_exists", {"path": path})).get("exists"))

    async def directory_exists(self, path: str) -> bool:
        return bool((await self.call("directory_exists", {"path": path})).get("exists"))

    async def list_dir(self, path: str) -> list[str]:
        """The names in ``path`` (files and folders; the server leaves out other kinds), sorted."""
        return sorted(str(n) for n in (await self._file_call("list_dir", path)).get("files", []))

    async def file_size(self, path: str) -> int:
        return int((await self._file_call("get_file_size", path))["size"])

    async def read_bytes(self, path: str, *, limit: int | None = None) -> bytes:
        """The whole file, in ``CHUNK`` pieces; ``ValueError`` past ``limit`` bytes."""
        data = bytearray()
        while True:
            want = CHUNK if limit is None else min(CHUNK, limit + 1 - len(data))
            answer = await self._file_call("read_bytes", path, offset=len(data), length=want)
            try:
                piece = base64.b64decode(str(answer.get("content_b64", "")), validate=True)
            except (binascii.Error, ValueError) as e:
                raise CuaError(f"computer-server read_bytes {path}: content_b64 is not base64") from e
            data += piece
            if limit is not None and len(data) > limit:
                raise ValueError(f"{path} is larger than {limit} bytes")
            if len(piece) < want:
                return bytes(data)

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (its folder must exist), in ``CHUNK`` pieces."""
        for i in range(0, max(len(data), 1), CHUNK):
            piece = data[i: i + CHUNK]
            await self._file_call("write_bytes", path, content_b64=base64.b64encode(piece).decode(), append=i > 0)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding, errors="replace")

    async def write_text(self, path: str, text: str) -> None:
        await self.write_bytes(path, text.encode())

    async def make_dir(self, path: str) -> None:
        """``mkdir -p``."""
        await self._file_call("create_dir", path)

    async def delete_file(self, path: str) -> None:
        await self._file_call("delete_file", path)

    async def delete_dir(self, path: str) -> None:
        """Remove an empty folder."""
        await self._file_call("delete_dir", path)

    # -- screen, mouse, keyboard -------------------------------------------------
    async def screenshot(self) -> bytes:
        """A PNG of the screen."""
        answer = await self.call("screenshot", {"format": "png"})
        try:
            return base64.b64decode(str(answer["image_data"]), validate=True)
        except (KeyError, binascii.Error, ValueError) as e:
            raise CuaError("computer-server screenshot: no base64 image_data in its answer") from e

    async def screen_size(self) -> tuple[int, int]:
        size = (await self.call("get_screen_size"))["size"]
        return int(size["width"]), int(size["height"])

    async def cursor_position(self) -> tuple[int, int]:
        pos = (await self.call("get_cursor_position"))["position"]
        return int(pos["x"]), int(pos["y"])

    @staticmethod
    def _xy(x: int | None, y: int | None) -> dict[str, int]:
        return {} if x is None or y is None else {"x": int(x), "y": int(y)}

    async def left_click(self, x: int | None = None, y: int | None = None) -> None:
        await self.call("left_click", self._xy(x, y))

    async def right_click(self, x: int | None = None, y: int | None = None) -> None:
        await self.call("right_click", self._xy(x, y))

    async def double_click(self, x: int | None = None, y: int | None = None) -> None:
        await self.call("double_click", self._xy(x, y))

    async def move_cursor(self, x: int, y: int) -> None:
        await self.call("move_cursor", self._xy(x, y))

    async def mouse_down(self, x: int | None = None, y: int | None = None, button: str = "left") -> None:
        await self.call("mouse_down", {**self._xy(x, y), "button": button})

    async def mouse_up(self, x: int | None = None, y: int | None = None, button: str = "left") -> None:
        await self.call("mouse_up", {**self._xy(x, y), "button": button})

    async def drag_to(self, x: int, y: int, *, button: str = "left", duration: float = 0.5) -> None:
        await self.call("drag_to", {**self._xy(x, y), "button": button, "duration": duration})

    async def drag(self, path: Sequence[tuple[int, int]], *, button: str = "left", duration: float = 0.5) -> None:
        await self.call("drag", {"path": [[int(x), int(y)] for x, y in path], "button": button, "duration": duration})

    async def scroll(self, dx: int, dy: int) -> None:
        await self.call("scroll", {"x": int(dx), "y": int(dy)})

    async def scroll_direction(self, direction: str, clicks: int = 1) -> None:
        await self.call("scroll_direction", {"direction": direction, "clicks": int(clicks)})

    async def type_text(self, text: str) -> None:
        await self.call("type_text", {"text": text})

    async def press_key(self, key: str) -> None:
        await self.call("press_key", {"key": key})

    async def hotkey(self, keys: Sequence[str]) -> None:
        await self.call("hotkey", {"keys": list(keys)})

    async def key_down(self, key: str) -> None:
        await self.call("key_down", {"key": key})

    async def key_up(self, key: str) -> None:
        await self.call("key_up", {"key": key})
