"""The session object task code receives (cua-bench method names), in three roles.

- ``ContainerSession``: every call goes through a ToolBox into a container (the
  oracle's ``solve`` gets this one: the same constrained interface an agent has).
- ``RoutedSession``: file calls under given container paths are served from
  host folders (the staged input, the private reference store, the deliverables
  copy); everything else, commands included, goes to a container session.
  ``start()`` gets one over the candidate container; ``evaluate()`` gets one over
  a fresh grading container, created only if the grader runs a command.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.sandbox.tools import ToolBox, ToolRefused


class CommandFailed(RuntimeError):
    """`run_command(..., check=True)` saw a non-zero exit or a timeout."""


class CommandResult(dict):
    """cua-bench's result shape (`return_code`, `stdout`, `stderr`), plus
    `exit_code`, `success` and `timed_out`."""


def _result(exit_code: int, stdout: str, stderr: str, timed_out: bool) -> CommandResult:
    return CommandResult(
        return_code=exit_code,
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        success=exit_code == 0 and not timed_out,
        timed_out=timed_out,
    )


class ContainerSession:
    """Task-facing session whose every call runs inside a container."""

    def __init__(self, tools: ToolBox, *, default_timeout: float = 600.0):
        self.tools = tools
        self.default_timeout = default_timeout

    async def run_command(self, command: str, timeout: float | None = None, check: bool = False, **_: Any) -> CommandResult:
        out = await self.tools.call("shell", {"command": command, "timeout": timeout or self.default_timeout})
        if out.error:
            raise CommandFailed(out.error)
        res = _result(out.exit_code if out.exit_code is not None else -1, out.stdout, out.stderr, out.timed_out)
        if check and not res["success"]:
            raise CommandFailed(
                f"command failed (exit {res['exit_code']}{', timed out' if out.timed_out else ''}): "
                f"{command[:200]}\n{out.stderr[-2000:]}"
            )
        return res

    async def read_bytes(self, path: str) -> bytes:
        try:
            return await self.tools.read_bytes(path)
        except ToolRefused as e:
            raise FileNotFoundError(str(e)) from e

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding, errors="replace")

    async def write_bytes(self, path: str, content: bytes) -> None:
        out = await self.tools.call("write_file", {"path": path, "content": content})
        if not out.ok:
            raise PermissionError(out.error or f"cannot write {path}")

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.write_bytes(path, content.encode() if isinstance(content, str) else content)

    async def file_exists(self, path: str) -> bool:
        return await self.tools.exists(path, "f")

    async def directory_exists(self, path: str) -> bool:
        return await self.tools.exists(path, "d")

    async def list_dir(self, path: str) -> list[str]:
        out = await self.tools.call("list_dir", {"path": path})
        if not out.ok:
            raise FileNotFoundError(out.error or f"cannot list {path}")
        return [line for line in out.output.splitlines() if line and not line.startswith("[... output")]

    async def screenshot(self) -> bytes:
        raise NotImplementedError("this sandbox has no display: screenshot() is not available")


@dataclass(frozen=True)
class Route:
    """Container path prefix `target` is served from host folder `host`."""

    target: str
    host: Path
    writable: bool


class RoutedSession:
    """File calls under routed paths hit host folders; the rest goes to a container."""

    def __init__(self, routes: list[Route], container: Callable[[], Awaitable[ContainerSession]]):
        # Longest prefix first, so /input/sub routes win over /input.
        self.routes = sorted(routes, key=lambda r: len(r.target), reverse=True)
        self._container_factory = container
        self._container: ContainerSession | None = None

    async def _c(self) -> ContainerSession:
        if self._container is None:
            self._container = await self._container_factory()
        return self._container

    def _route(self, path: str) -> tuple[Route, Path] | None:
        norm = posixpath.normpath(path)
        for r in self.routes:
            if norm == r.target or norm.startswith(r.target.rstrip("/") + "/"):
                rel = posixpath.relpath(norm, r.target)
                host = (r.host / rel) if rel != "." else r.host
                # Never leave the routed folder, even through a symlink.
                real = Path(os.path.realpath(host))
                root = Path(os.path.realpath(r.host))
                if real != root and root not in real.parents:
                    raise PermissionError(f"{path} resolves outside {r.target}")
                return r, host
        return None

    async def run_command(self, command: str, timeout: float | None = None, check: bool = False, **kw: Any) -> CommandResult:
        return await (await self._c()).run_command(command, timeout=timeout, check=check, **kw)

    async def read_bytes(self, path: str) -> bytes:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).read_bytes(path)
        _, host = hit
        if host.is_symlink() or not host.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        return host.read_bytes()

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding, errors="replace")

    async def write_bytes(self, path: str, content: bytes) -> None:
        hit = self._route(path)
        if hit is None:
            await (await self._c()).write_bytes(path, content)
            return
        route, host = hit
        if not route.writable:
            raise PermissionError(f"{path} is read-only here ({route.target} is not writable in this phase)")
        host.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        host.write_bytes(content)
        os.chmod(host, 0o644)

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.write_bytes(path, content.encode() if isinstance(content, str) else content)

    async def file_exists(self, path: str) -> bool:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).file_exists(path)
        return hit[1].is_file() and not hit[1].is_symlink()

    async def directory_exists(self, path: str) -> bool:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).directory_exists(path)
        return hit[1].is_dir() and not hit[1].is_symlink()

    async def list_dir(self, path: str) -> list[str]:
        hit = self._route(path)
        if hit is None:
            return await (await self._c()).list_dir(path)
        if not hit[1].is_dir():
            raise FileNotFoundError(f"no such directory: {path}")
        return sorted(os.listdir(hit[1]))

    async def screenshot(self) -> bytes:
        raise NotImplementedError("this sandbox has no display: screenshot() is not available")
