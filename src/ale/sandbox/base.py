"""The sandbox contract every provider implements (docker today).

All methods are async. Limits and failure modes:

- ``exec`` runs ``argv`` as ``user`` in ``workdir``; stdout and stderr are each capped
  at ``output_limit`` bytes (the rest is drained and dropped, ``*_truncated`` set).
  On ``timeout`` the command's process group is killed and ``timed_out`` is set;
  the call returns, it never raises for a non-zero exit or a timeout.
- Provider failures (engine down, container gone) raise ``SandboxError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_OUTPUT_LIMIT = 1024 * 1024


class SandboxError(RuntimeError):
    """The provider itself failed (engine unreachable, container vanished, ...)."""


@dataclass
class ExecResult:
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Mount:
    """A bind mount: host ``source`` at container ``target``."""

    source: str
    target: str
    read_only: bool


class Sandbox(Protocol):
    name: str

    async def exec(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        env: dict[str, str] | None = None,
    ) -> ExecResult: ...

    async def kill_user_processes(self) -> int:
        """Kill every process but the container's init; return how many were left after."""
        ...

    async def stop(self) -> None: ...

    async def remove(self) -> None: ...
