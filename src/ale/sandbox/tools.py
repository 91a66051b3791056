"""The one tool interface every agent uses to reach the sandbox.

Tools (names are what an allowlist names): ``shell``, ``read_file``,
``write_file``, ``list_dir``, and ``computer`` (the desktop, when the sandbox has
one: see ``sandbox/computer.py``). The file and shell tools run inside the
container as the candidate user; ``computer`` is executed by the harness itself,
as the desktop user. Every call is checked against the allowlist and is
recorded as a trajectory step (a screenshot as a PNG file beside it). Limits:
stdout and stderr of ``shell`` are each capped at ``output_limit`` bytes (cut with
a marker); ``read_file`` refuses files past ``read_limit``; ``shell`` kills the
command's process group on timeout.

Bytes: outputs are handed to agents as text (invalid UTF-8 replaced), and the
exact bytes the container produced travel with the outcome (``stdout_bytes``,
``stderr_bytes``, ``output_bytes``) to the recorder, which keeps them when the
text is not exact. A command, path or text content holding lone surrogates (not
valid Unicode, so it cannot reach the container as sent) is refused with an error.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ale.lossless import is_unicode
from ale.sandbox.base import DEFAULT_OUTPUT_LIMIT, ExecResult, Sandbox
from ale.sandbox.computer import Computer, ComputerError
from ale.sandbox.cua.client import CuaClient, CuaCommandFailed, CuaError

log = logging.getLogger(__name__)

ALL_TOOLS = ("shell", "read_file", "write_file", "list_dir", "computer")
TRUNCATION_MARKER = "\n[... output truncated by ale at {limit} bytes ...]\n"
DEFAULT_READ_LIMIT = 10 * 1024 * 1024
# Task code on the trusted side (start(), evaluate()) reads and runs far more than
# an agent's turn: ALE graders read images of tens of MB and print MB-long reports.
TASK_READ_LIMIT = 1024 * 1024 * 1024
TASK_OUTPUT_LIMIT = 256 * 1024 * 1024
DEFAULT_SHELL_TIMEOUT = 600.0


class ToolRefused(Exception):
    """A call outside the allowlist, or with unusable arguments."""


@dataclass
class ToolOutcome:
    """What a tool returns to the agent (also stored in the trajectory)."""

    ok: bool
    output: str = ""
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    timed_out: bool = False
    data: bytes | None = None
    error: str | None = None
    # The exact bytes behind stdout, stderr and output (before decoding and markers).
    stdout_bytes: bytes | None = None
    stderr_bytes: bytes | None = None
    output_bytes: bytes | None = None
    #: A PNG the tool produced (the computer tool's screenshot): recorded as a file.
    image: bytes | None = None
    info: dict[str, Any] | None = None

    def for_model(self) -> str:
        """A plain-text rendering for language models and MCP clients."""
        if self.error:
            return f"error: {self.error}"
        if self.exit_code is not None:
            parts = [f"exit_code: {self.exit_code}" + (" (timed out)" if self.timed_out else "")]
            if self.stdout:
                parts.append(f"stdout:\n{self.stdout}")
            if self.stderr:
                parts.append(f"stderr:\n{self.stderr}")
            return "\n".join(parts)
        return self.output


StepRecorder = Callable[[dict[str, Any]], None]


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _text(tool: str, arg: str, value: Any) -> str:
    """An argument as text the container can receive exactly: lone surrogates refused."""
    text = str(value)
    if not is_unicode(text):
        bad = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
        raise ToolRefused(f"{tool}: {arg} is not valid Unicode (a lone surrogate at index {bad}); send UTF-8 text")
    return text


def _decode(data: bytes, truncated: bool, limit: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text + TRUNCATION_MARKER.format(limit=limit) if truncated else text


class ToolBox:
    """The constrained execution interface over one sandbox."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        workdir: str,
        allowlist: tuple[str, ...] = ALL_TOOLS,
        recorder: StepRecorder | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        read_limit: int = DEFAULT_READ_LIMIT,
        default_timeout: float = DEFAULT_SHELL_TIMEOUT,
        deadline: float | None = None,
        computer: Computer | None = None,
    ):
        unknown = set(allowlist) - set(ALL_TOOLS)
        if unknown:
            raise ValueError(f"unknown tools in allowlist: {sorted(unknown)}; known: {ALL_TOOLS}")
        self.sandbox = sandbox
        self.workdir = workdir
        self.allowlist = tuple(allowlist)
        self.recorder = recorder
        self.output_limit = output_limit
        self.read_limit = read_limit
        self.default_timeout = default_timeout
        self.deadline = deadline  # time.monotonic() value after which commands get no time
        self.steps = 0
        self.computer = computer  # the desktop's tool; None: the sandbox has no desktop

    @property
    def offered(self) -> tuple[str, ...]:
        """The tools to show an agent: the allowlist, without ``computer`` when the
        sandbox has no desktop (a call to it is still refused and recorded)."""
        return tuple(t for t in self.allowlist if t != "computer" or self.computer is not None)

    # -- dispatch --------------------------------------------------------------
    async def call(self, tool: str, args: dict[str, Any]) -> ToolOutcome:
        """Run one tool call by name (the path every agent takes); always recorded."""
        started = _now()
        t0 = time.monotonic()
        if tool not in self.allowlist:
            outcome = ToolOutcome(ok=False,
                                  error=f"tool {tool!r} is not allowed (allowed: {', '.join(self.allowlist)})")
            self._record(tool, args, outcome, started, t0, refused=True)
            return outcome
        try:
            outcome = await self._dispatch(tool, args)
        except ToolRefused as e:
            # The call ran and failed (unreadable path, read-only target, bad args):
            # not an allowlist refusal, so `refused` stays False.
            outcome = ToolOutcome(ok=False, error=str(e))
        except CuaError as e:
            # The sandbox's computer-server went away under the call (the candidate may
            # kill it: it is a candidate process); the next call starts a fresh one.
            await self.sandbox.protocol_lost()  # type: ignore[attr-defined]
            outcome = ToolOutcome(ok=False, error=f"{tool}: the sandbox's computer-server was lost during the call "
                                                  f"({e}); it is started again for the next call")
        except BaseException as e:
            # The exec raised (the sandbox stopped, the engine failed) or the turn was
            # ended mid-call: the call is still a step of the record, then it propagates.
            why = "the call was cancelled (the agent's turn ended)" if isinstance(e, asyncio.CancelledError) \
                else f"the call raised {type(e).__name__}: {e}"
            self._record(tool, args, ToolOutcome(ok=False, error=why), started, t0)
            raise
        self._record(tool, args, outcome, started, t0)
        return outcome

    def refuse(self, tool: str, args: dict[str, Any], reason: str) -> ToolOutcome:
        """Record a call refused before it could run (a step limit, unusable arguments)."""
        outcome = ToolOutcome(ok=False, error=reason)
        self._record(tool, args, outcome, _now(), time.monotonic(), refused=True)
        return outcome

    async def _dispatch(self, tool: str, args: dict[str, Any]) -> ToolOutcome:
        try:
            if tool == "shell":
                return await self.shell(_text(tool, "command", args["command"]), args.get("timeout"))
            if tool == "read_file":
                return await self.read_file(_text(tool, "path", args["path"]))
            if tool == "write_file":
                content = args.get("content", "")
                if "content_b64" in args:
                    try:
                        content = base64.b64decode(args["content_b64"])
                    except (binascii.Error, ValueError, TypeError) as e:
                        raise ToolRefused(f"write_file: content_b64 is not base64: {e}") from e
                elif isinstance(content, str):
                    content = _text(tool, "content", content)
                return await self.write_file(_text(tool, "path", args["path"]), content)
            if tool == "list_dir":
                return await self.list_dir(_text(tool, "path", args.get("path", self.workdir)))
            if tool == "computer":
                return await self.use_computer(args)
        except KeyError as e:
            raise ToolRefused(f"{tool}: missing argument {e.args[0]!r}") from e
        raise ToolRefused(f"unknown tool {tool!r}")

    def _record(self, tool: str, args: dict, outcome: ToolOutcome, started: str, t0: float,
                refused: bool = False) -> None:
        self.steps += 1
        if self.recorder is None:
            return
        raw: dict[str, Any] = {f"{k}_bytes": v
                               for k, v in (("stdout", outcome.stdout_bytes), ("stderr", outcome.stderr_bytes),
                                            ("output", outcome.output_bytes)) if v is not None}
        if outcome.image is not None:
            raw["image_png"] = outcome.image  # the trajectory stores it as a .png file
        if outcome.info:
            raw["computer"] = outcome.info
        step = {
                **raw,
                "index": self.steps,
                "tool": tool,
                "args": {k: v for k, v in args.items()},
                "ok": outcome.ok,
                "refused": refused,
                "exit_code": outcome.exit_code,
                "stdout": outcome.stdout,
                "stderr": outcome.stderr,
                "output": outcome.output,
                "truncated": outcome.truncated,
                "timed_out": outcome.timed_out,
                "error": outcome.error,
                "started_at": started,
                "ended_at": _now(),
                "seconds": round(time.monotonic() - t0, 4),
            }
        try:
            self.recorder(step)
        except Exception as e:  # noqa: BLE001 - a recorder's failure never becomes the tool call's
            log.error("recording step %d (%s) failed: %r", self.steps, tool, e)

    def _time_left(self, wanted: float | None) -> float:
        t = float(wanted) if wanted else self.default_timeout
        if self.deadline is not None:
            t = min(t, max(0.1, self.deadline - time.monotonic()))
        return t

    # -- the way in: the engine's exec, or a sandbox's computer-server ----------------
    async def protocol(self) -> CuaClient | None:
        """The sandbox's computer-server client (a cua-compatible image's sandbox,
        ``ale.sandbox.cua.sandbox``), or None: then every call is an exec."""
        get = getattr(self.sandbox, "protocol", None)
        return None if get is None else await get()

    async def run(self, argv: list[str], *, workdir: str | None = None, timeout: float | None = None,
                  stdin: bytes | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        """``argv`` as the candidate user: through computer-server where the sandbox has one."""
        cua = await self.protocol()
        if cua is None:
            return await self.sandbox.exec(argv, workdir=workdir, timeout=timeout, stdin=stdin,
                                           output_limit=output_limit)
        return await cua.run_command(argv, cwd=workdir, timeout=timeout, stdin=stdin, output_limit=output_limit)

    def _abs(self, path: str) -> str:
        return posixpath.join(self.workdir, path)

    # -- tools -----------------------------------------------------------------
    async def shell(self, command: str, timeout: float | None = None) -> ToolOutcome:
        r = await self.run(
            ["sh", "-c", command],
            workdir=self.workdir,
            timeout=self._time_left(timeout),
            output_limit=self.output_limit,
        )
        out = _decode(r.stdout, r.stdout_truncated, self.output_limit)
        err = _decode(r.stderr, r.stderr_truncated, self.output_limit)
        return ToolOutcome(
            ok=r.ok,
            exit_code=r.exit_code,
            stdout=out,
            stderr=err,
            truncated=r.stdout_truncated or r.stderr_truncated,
            timed_out=r.timed_out,
            stdout_bytes=r.stdout,
            stderr_bytes=r.stderr,
        )

    async def read_bytes(self, path: str) -> bytes:
        cua = await self.protocol()
        if cua is not None:
            try:
                return await cua.read_bytes(self._abs(path), limit=self.read_limit)
            except ValueError as e:
                raise ToolRefused(f"{path} is larger than the read limit of {self.read_limit} bytes") from e
            except (FileNotFoundError, IsADirectoryError) as e:
                raise ToolRefused(f"not a regular file: {path}") from e
            except CuaCommandFailed as e:
                raise ToolRefused(f"not a regular file: {path}" if "Errno 21]" in e.error else e.error) from e
            except PermissionError as e:
                raise ToolRefused(f"cannot read {path}: permission denied") from e
        r = await self.sandbox.exec(
            ["sh", "-c", 'test -f "$1" || { echo "not a regular file: $1" >&2; exit 2; }; '
             'head -c "$2" -- "$1"', "read", path, str(self.read_limit + 1)],
            workdir=self.workdir, timeout=self._time_left(120), output_limit=self.read_limit + 1,
        )
        if r.exit_code != 0:
            raise ToolRefused(r.stderr.decode(errors="replace").strip() or f"cannot read {path} (exit {r.exit_code})")
        if len(r.stdout) > self.read_limit:
            raise ToolRefused(f"{path} is larger than the read limit of {self.read_limit} bytes")
        return r.stdout

    async def read_file(self, path: str) -> ToolOutcome:
        data = await self.read_bytes(path)
        return ToolOutcome(ok=True, output=data.decode("utf-8", errors="replace"), data=data, output_bytes=data)

    async def write_file(self, path: str, content: str | bytes) -> ToolOutcome:
        data = content.encode() if isinstance(content, str) else content
        cua = await self.protocol()
        if cua is not None:
            try:
                await cua.make_dir(posixpath.dirname(self._abs(path)) or "/")
                await cua.write_bytes(self._abs(path), data)
            except (OSError, CuaCommandFailed) as e:
                raise ToolRefused(f"cannot write {path}: {e}") from e
            return ToolOutcome(ok=True, output=f"wrote {len(data)} bytes to {path}")
        r = await self.sandbox.exec(
            ["sh", "-c", 'd=$(dirname -- "$1"); mkdir -p -- "$d" && cat > "$1"', "write", path],
            workdir=self.workdir, timeout=self._time_left(120), stdin=data,
        )
        if r.exit_code != 0:
            raise ToolRefused(r.stderr.decode(errors="replace").strip() or f"cannot write {path} (exit {r.exit_code})")
        return ToolOutcome(ok=True, output=f"wrote {len(data)} bytes to {path}")

    async def list_dir(self, path: str) -> ToolOutcome:
        cua = await self.protocol()
        if cua is not None:
            try:
                names = await cua.list_dir(self._abs(path))
            except (OSError, CuaCommandFailed) as e:
                raise ToolRefused(f"not a directory: {path}") from e
            listing = "".join(n + "\n" for n in names).encode()
            cut = len(listing) > self.output_limit
            return ToolOutcome(ok=True, output=_decode(listing[: self.output_limit], cut, self.output_limit),
                               output_bytes=listing)
        r = await self.sandbox.exec(
            ["sh", "-c", 'test -d "$1" || { echo "not a directory: $1" >&2; exit 2; }; ls -1A -- "$1"', "ls", path],
            workdir=self.workdir, timeout=self._time_left(60), output_limit=self.output_limit,
        )
        if r.exit_code != 0:
            raise ToolRefused(r.stderr.decode(errors="replace").strip() or f"cannot list {path}")
        return ToolOutcome(ok=True, output=_decode(r.stdout, r.stdout_truncated, self.output_limit),
                           output_bytes=r.stdout)

    async def use_computer(self, args: dict[str, Any]) -> ToolOutcome:
        if self.computer is None:
            raise ToolRefused("computer: this sandbox has no desktop")
        try:
            out = await self.computer.act(args)
        except ComputerError as e:
            raise ToolRefused(f"computer: {e}") from e
        return ToolOutcome(ok=True, output=out.text, image=out.image, info=out.info)

    async def task_gui(self, op: str, args: dict[str, Any]) -> Any:
        """A GUI call only task code makes (``launch_window``, ``execute_javascript``,
        ...): served by the desktop and recorded as a ``task.<op>`` step."""
        started, t0 = _now(), time.monotonic()
        if self.computer is None:
            outcome = ToolOutcome(ok=False, error="this sandbox has no desktop")
            self._record(f"task.{op}", args, outcome, started, t0)
            raise NotImplementedError("this sandbox has no desktop: " + op + "() is not available")
        try:
            value = await self.computer.task_call(op, args)
        except ComputerError as e:
            self._record(f"task.{op}", args, ToolOutcome(ok=False, error=str(e)), started, t0)
            raise
        self._record(f"task.{op}", args, ToolOutcome(ok=True, output=_short(value)), started, t0)
        return value

    async def exists(self, path: str, kind: str) -> bool:
        cua = await self.protocol()
        if cua is not None and kind in ("f", "d"):
            return await (cua.file_exists if kind == "f" else cua.directory_exists)(self._abs(path))
        r = await self.run(["test", "-" + kind, path], workdir=self.workdir, timeout=self._time_left(30))
        return r.exit_code == 0


def _short(value: Any, limit: int = 4000) -> str:
    import json

    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text)} characters]"
