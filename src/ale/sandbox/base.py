"""The sandbox contract: what the lifecycle, the grader, the orchestrator and
``verify-container`` need from a provider, and nothing more.

A provider (``SandboxProvider``) creates sandboxes from a ``SandboxSpec`` and
describes its engine. A sandbox (``Sandbox``) is one isolated machine for one run
(or one grading session). Every provider passes the conformance suite in
``tests/sandbox_conformance.py``; ``docs/architecture.md`` says how to add one.

Errors: every provider failure raises ``SandboxError`` or a subclass of it:

- ``EngineUnreachable``: the engine cannot be reached at all (retryable);
- ``ImageMissing``: the image is not in the provider's image store;
- ``SandboxGone``: the sandbox vanished under the harness (removed, engine restart).

Nothing else escapes a provider method: provider-library exceptions are wrapped.
A non-zero exit or a timeout of a command is *not* an error (see ``ExecResult``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ale.data.base import ImageStore
from ale.sandbox.halt import StopOutcome
from ale.sandbox.policy import IsolationPolicy

DEFAULT_OUTPUT_LIMIT = 1024 * 1024

# Labels every sandbox carries (providers map them onto their own metadata).
LABEL_MANAGED = "ale.managed"
LABEL_RUN = "ale.run_id"
LABEL_EXPERIMENT = "ale.experiment"
LABEL_ROLE = "ale.role"


class SandboxError(RuntimeError):
    """The provider itself failed (engine unreachable, container vanished, ...)."""


class RuntimeMissing(SandboxError):
    """The engine has no runtime of the policy's name; the message says how to add it
    (``ale.sandbox.runtimes.missing_runtime_message``)."""


class EngineUnreachable(SandboxError):
    """The provider's engine does not answer: nothing was created. Retryable."""


class ImageMissing(SandboxError):
    """The sandbox image is not in the provider's image store."""


class UnsupportedGuest(SandboxError):
    """The sandbox booted a guest whose seal ale cannot prove (a Windows VM's in-guest
    probes do not exist yet): another attempt meets the same guest, so never retried."""


class SandboxGone(SandboxError):
    """The sandbox no longer exists (removed behind the harness's back)."""


@dataclass
class ExecResult:
    """What one command did. ``exit_code`` is -1 when the provider could not read it."""

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

    def __post_init__(self) -> None:
        # A relative source means something else to each engine (Docker: a named
        # volume, refused for a bind): say which mount at the place it was made.
        for what, path in (("source", self.source), ("target", self.target)):
            if not path.startswith("/"):
                raise ValueError(f"mount {what} must be an absolute path, got {path!r} "
                                 f"({self.source} -> {self.target})")


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a provider needs to create one sandbox.

    ``mounts`` are the only host folders the sandbox sees; ``labels`` identify
    the run (``LABEL_RUN``, ``LABEL_ROLE``, ``LABEL_EXPERIMENT``) so that cleanup
    touches only ale's own sandboxes; ``environment`` is the sandbox's whole
    environment (the policy's allowlist applies).
    """

    name: str
    image: str
    policy: IsolationPolicy
    mounts: tuple[Mount, ...]
    workdir: str
    labels: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mounts", tuple(self.mounts))


class Sandbox(Protocol):
    """One isolated machine. All methods but ``inspect`` are async.

    Life: ``create`` (by the provider, not yet running) → ``start`` → ``exec``... →
    ``halt`` (the end of the candidate's turn) → ``stop`` → ``inspect`` → ``remove``.
    """

    name: str
    id: str
    #: True when the ``Mount`` sources are the sandbox's files (binds): the host
    #: reads the workspace directly. A provider without a shared file system
    #: sets False and implements ``read_path`` / ``write_path`` (not needed today).
    shares_host_filesystem: bool

    def inspect(self) -> dict[str, Any]:
        """The engine's raw description of the sandbox (Docker: ``docker inspect``),
        read fresh on every call, never cached. Raises ``SandboxGone`` when it no
        longer exists, ``SandboxError`` when the engine fails."""
        ...

    async def start(self) -> None:
        """Start the sandbox's init (which only reaps). Raises ``SandboxError``."""
        ...

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
    ) -> ExecResult:
        """Run ``argv`` (no shell) as ``user`` (default: the policy's candidate
        user) in ``workdir`` with ``env`` added to the sandbox's environment.

        - stdout and stderr are each capped at ``output_limit`` bytes; the rest is
          drained and dropped and ``stdout_truncated``/``stderr_truncated`` is set.
        - On ``timeout`` (seconds) the command's whole process tree is killed,
          descendants that left its process group included, ``timed_out`` is set,
          and the call returns within a few seconds of the deadline.
        - A background child holding the output open does not delay the return
          once the command itself has exited.
        - Never raises for a non-zero exit or a timeout; raises ``SandboxGone``
          when the sandbox vanished, ``SandboxError`` when the engine fails.
        """
        ...

    async def kill_user_processes(self) -> int:
        """Kill every process but the sandbox's init; return how many were left
        alive after (0 when all are dead, -1 when the count could not be read).
        Bounded at about a second plus one round trip."""
        ...

    async def kill_user_processes_then(
        self, argv: list[str] | None, *, timeout: float = 60
    ) -> tuple[int, ExecResult | None]:
        """Kill every candidate process, then run ``argv`` as the candidate user in
        the same call (nothing the candidate started can run between the two).
        Returns (processes left alive or -1, argv's result or None when ``argv``
        is None or the kill could not report)."""
        ...

    async def halt(self, *, keep_uids: tuple[int, ...] = (), bound_s: float = ...) -> StopOutcome:
        """End the candidate's turn from outside the sandbox: every task but its init
        and the ``keep_uids``' own is stopped (frozen, or the VM paused), killed from
        the host, and its death awaited; nothing inside takes part, so nothing the
        candidate left can signal, slow or read it. Bounded by ``bound_s``; a task
        with SIGKILL pending in uninterruptible sleep is waited for, then counted
        dead. Returns what it did (``ale.sandbox.halt.StopOutcome``); never raises
        for a sandbox that stopped meanwhile (``sandbox_stopped`` says so)."""
        ...

    async def stop(self) -> None:
        """Stop the sandbox: every process in it dies. Idempotent; a sandbox that
        is already gone is not an error."""
        ...

    async def remove(self) -> None:
        """Delete the sandbox and its private storage. Idempotent; a sandbox that
        is already gone is not an error. Call ``inspect`` first if you need it."""
        ...


class SandboxProvider(Protocol):
    """Creates sandboxes on one engine and describes that engine."""

    #: The provider's name as ``EnvironmentSpec.provider`` spells it ("docker").
    name: str

    def ping(self) -> None:
        """Ask the engine now (never cached); raise ``EngineUnreachable`` unless it answers."""
        ...

    def engine_record(self) -> dict[str, Any]:
        """Engine version, security options, cgroup version, storage driver: the
        run's evidence of where it ran. May be cached briefly. Raises ``SandboxError``."""
        ...

    def image_inspect(self, image: str) -> dict[str, Any]:
        """The image's raw description (id, digests). Raises ``ImageMissing``."""
        ...

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Create (not start) one sandbox exactly as the spec and its policy say.
        Raises ``ImageMissing``, ``EngineUnreachable`` or ``SandboxError`` (the
        engine refused the spec). Nothing is left behind when it raises."""
        ...

    def attach(self, name_or_id: str, policy: IsolationPolicy) -> Sandbox:
        """A handle on an existing sandbox (created by an operator or an earlier
        call), to inspect, probe or exec into it. Raises ``SandboxGone``."""
        ...

    def image_store(self) -> ImageStore | None:
        """Where ``image:`` data sources (baked task images) are read from, or None
        when this provider has no image store of its own."""
        ...

    def remove_managed(self, *, run_id: str | None = None, experiment: str | None = None) -> list[str]:
        """Remove ale's sandboxes (``LABEL_MANAGED``), optionally only those of one
        run or experiment; never anything else. Returns the names removed."""
        ...
