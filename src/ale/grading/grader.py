"""Grading on the trusted side: evaluate(cfg, session) over host copies.

The session serves the task's input and reference paths from host folders,
read-only, and the output folder from a writable working copy of the
deliverables; any command the grader runs goes to a fresh grading container (no
network, input and reference read-only, the output's working copy, writable
scratch on disk), never the candidate's, which is gone by now.

Python in the grading container behaves as on ALE's VM (``python script.py``
finds the modules beside the script), uses no user site (``PYTHONNOUSERSITE``)
and writes no bytecode. Commands start in ``/tmp``, never in the output folder.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.grading.copying import copy_keeping_holes
from ale.lossless import display_name
from ale.result import SCORE_EPSILON
from ale.sandbox.base import (
    LABEL_EXPERIMENT,
    LABEL_ROLE,
    LABEL_RUN,
    Mount,
    Sandbox,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
)
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.session import ContainerSession, Route, RoutedSession
from ale.sandbox.tools import TASK_OUTPUT_LIMIT, TASK_READ_LIMIT, ToolBox
from ale.tasks.errors import TaskError
from ale.tasks.process import TaskCallFailed, TaskProcessError

# What the grading container's environment adds to the image's.
# Not PYTHONSAFEPATH: on ALE's VM `python script.py` finds the modules beside the
# script, and graders rely on it (a verifier importing its helper, the candidate's own
# multi-file program re-run by the grader); `ale task check`'s import-hooks finds a
# grader that runs a verifier beside the candidate's files (docs/task-check.md).
GRADING_ENVIRONMENT: dict[str, str] = {
    "PYTHONNOUSERSITE": "1",  # no ~/.local site-packages
    "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ next to what a verifier imports
}
GRADING_WORKDIR = "/tmp"  # where grader commands start: never the output, input or reference folder

# How the error of a run whose evaluate() returned no valid score list begins
# (NaN, a value outside [0, 1], ...): `ale task check` reports these as grader bugs.
INVALID_SCORES = "evaluate() returned an invalid score list"


class GradingError(RuntimeError):
    """The grader broke or returned something that is not a score list.

    ``charged``: it did so again and again on the same signed deliverables, so the
    failure is the candidate's (counted as 0, flagged); otherwise it is a single
    attempt's failure, retried."""

    def __init__(self, message: str, tb: str | None = None, *, charged: bool = False):
        super().__init__(message)
        self.traceback = tb
        self.charged = charged


class GradingEnvironmentError(GradingError):
    """Grading failed for a reason the harness can show is its own: the grading
    sandbox could not be created or started, the engine went away, the reference
    could not be staged. Never charged to the candidate; the run is retried."""


@dataclass
class GradingInputs:
    input_host: Path
    deliverables_host: Path
    reference_host: Path
    input_dir: str
    output_dir: str
    reference_dir: str
    software_host: Path | None = None
    software_dir: str | None = None
    task_dir: str | None = None  # ALE: <root>/<domain>/<task>/<variant>; the root becomes writable scratch
    scratch_host: Path | None = None  # a host folder for the grading sandbox's writable places (disk, not memory)


# Where ALE graders write: /tmp (verifier copies, large intermediates), the data
# root above the task folder (eval_data/, .tmp_eval/), and the VM user's home.
GRADER_HOME = "/home/user"


def working_copy(src: Path, dest: Path, *, owner: tuple[int, int] | None, problems: list[str] | None = None) -> Path:
    """A copy of ``src`` (regular files and folders only, as the deliverables are)
    that the grading sandbox's user may change. Files keep their exact mode and times
    (graders check the permissions the candidate set). As root the copy belongs to
    ``owner``, the sandbox's user, as the candidate's files did; otherwise its folders
    are writable by everyone, so files can be removed and made anew. Never a hard
    link: a write must not reach ``src``.

    The copy is made descriptor-relative (``openat``: no path length matters, however
    long the base), holes kept as holes (``ale.grading.copying``). An entry that
    cannot be copied is the harness's failure, never the candidate's: it is left out,
    said in ``problems``, and the rest is copied (the grader grades what was copied).
    Only a ``dest`` that cannot be made at all raises (``OSError``)."""
    problems = problems if problems is not None else []
    dest.mkdir(mode=0o755, parents=True)
    src_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        os.close(src_fd)
        raise
    _copy_tree_fd(src_fd, dest_fd, owner, problems)
    try:
        if owner is not None:
            os.chown(dest, *owner)
            os.chmod(dest, 0o755)
        else:
            os.chmod(dest, 0o777)
    except OSError as e:
        problems.append(f".: cannot set the owner or mode of the working copy: {e.strerror}")
    return dest.resolve()


def _copy_tree_fd(src_fd: int, dest_fd: int, owner: tuple[int, int] | None, problems: list[str]) -> None:
    """Copy the folder open as ``src_fd`` into the one open as ``dest_fd``; closes both."""
    stack: list[tuple[int, int, bytes, list[bytes]]] = []

    def push(s: int, d: int, rel: bytes) -> None:
        try:
            names = sorted(os.fsencode(n) for n in os.listdir(s))
        except OSError as e:
            problems.append(f"{_shown(rel)}: cannot list: {e.strerror}")
            names = []
        stack.append((s, d, rel, names[::-1]))

    push(src_fd, dest_fd, b"")
    try:
        while stack:
            s, d, rel, names = stack[-1]
            if not names:
                stack.pop()
                os.close(s)
                os.close(d)
                continue
            name = names.pop()
            path = rel + b"/" + name if rel else name
            try:
                sub = _copy_entry(s, d, name, owner)
            except OSError as e:
                problems.append(f"{_shown(path)}: not copied: {e.strerror or e}")
                continue
            if sub is not None:
                push(sub[0], sub[1], path)
    finally:
        for s, d, _, _ in stack:
            os.close(s)
            os.close(d)


def _copy_entry(s: int, d: int, name: bytes, owner: tuple[int, int] | None) -> tuple[int, int] | None:
    """Copy one entry; a folder's (source, copy) descriptors are returned to descend into."""
    st = os.stat(name, dir_fd=s, follow_symlinks=False)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(name, 0o755, dir_fd=d)
        sfd = os.open(name, flags | os.O_DIRECTORY, dir_fd=s)
        try:
            dfd = os.open(name, flags | os.O_DIRECTORY, dir_fd=d)
        except OSError:
            os.close(sfd)
            raise
        try:
            if owner is not None:
                os.fchown(dfd, *owner)
                os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            else:
                os.fchmod(dfd, stat.S_IMODE(st.st_mode) | 0o777)
        except OSError:
            os.close(sfd)
            os.close(dfd)
            raise
        return sfd, dfd
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file or folder")
    sfd = os.open(name, flags | os.O_NONBLOCK, dir_fd=s)
    try:
        dfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=d)
        try:
            copy_keeping_holes(sfd, dfd)
            if owner is not None:
                os.fchown(dfd, *owner)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
        except BaseException:
            # Never a part of the candidate's file in its place: the grader sees it missing.
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=d)
            raise
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    return None


def _shown(rel: bytes) -> str:
    return display_name(rel or b".")


class InvalidScores(GradingError):
    """evaluate() returned, but not a non-empty list of numbers in [0, 1]."""


def validate_scores(value: Any) -> list[float]:
    """A non-empty list of floats in [0, 1], or InvalidScores saying what came back
    (NaN, infinities, values outside [0, 1], booleans, non-numbers, an empty list).
    Within ``SCORE_EPSILON`` of 0 or 1 outside them, a score is that bound."""
    if not isinstance(value, list | tuple) or len(value) == 0:
        raise InvalidScores(f"{INVALID_SCORES}: expected a non-empty list of floats in [0, 1], got {value!r:.200}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise InvalidScores(f"{INVALID_SCORES}: a non-number at index {i}: {v!r:.100}")
        f = float(v)
        # Float noise at the ends (partial credits summing to 1.0000000000000002)
        # is the bound it missed, not an invalid score.
        if -SCORE_EPSILON <= f < 0.0:
            f = 0.0
        elif 1.0 < f <= 1.0 + SCORE_EPSILON:
            f = 1.0
        if math.isnan(f) or not 0.0 <= f <= 1.0:
            raise InvalidScores(f"{INVALID_SCORES}: {f} at index {i}; scores must lie in [0, 1]")
        out.append(f)
    return out


def is_invalid_scores(error: str | None) -> bool:
    """Whether a run's error says its grader returned an invalid score list."""
    return bool(error) and INVALID_SCORES in str(error)


class Grader:
    """Owns the grading container (created lazily) and its removal."""

    def __init__(
        self,
        provider: SandboxProvider,
        *,
        image: str,
        policy: IsolationPolicy,
        run_id: str,
        experiment: str | None,
        inputs: GradingInputs,
        command_timeout: float,
        gui: Any = None,
    ):
        self.provider = provider
        self.image = image
        self.policy = policy
        self.run_id = run_id
        self.experiment = experiment
        self.inputs = inputs
        self.command_timeout = command_timeout
        self.gui = gui  # GUI calls' session: the candidate's live desktop (desktop tasks), else None
        self.container: Sandbox | None = None
        self._output: Path | None = None
        self.environment_error: SandboxError | None = None  # the grading sandbox failed to start
        # Entries of the deliverables the working copy could not hold (the harness's copy,
        # not the candidate's work): graded without them, and warned about.
        self.copy_problems: list[str] = []

    def output_host(self) -> Path:
        """The output folder evaluate() sees: with a scratch folder, a writable working
        copy of the deliverables (ALE graders delete, regenerate and re-run files in
        output/, as on ALE's VM), read by host calls and mounted in the grading sandbox
        alike; the signed deliverables stay as collected. Without one, the deliverables."""
        if self.inputs.scratch_host is None:
            return self.inputs.deliverables_host
        if self._output is None:
            owner = (self.policy.uid, self.policy.gid) if os.geteuid() == 0 else None
            try:
                self._output = working_copy(self.inputs.deliverables_host, self.inputs.scratch_host / "output",
                                            owner=owner, problems=self.copy_problems)
            except OSError as e:  # the harness's own scratch folder: never the candidate's failure
                self.environment_error = SandboxError(f"the grader's working copy could not be made: {e}")
                raise
        return self._output

    def workdir(self) -> str:
        """Where grader commands start: ``/tmp``, or ``/`` should a task put one of
        its folders there (commands never start inside the candidate's output)."""
        i = self.inputs
        inside = [d for d in (i.output_dir, i.input_dir, i.reference_dir) if d.rstrip("/") == GRADING_WORKDIR]
        return "/" if inside else GRADING_WORKDIR

    async def _container_session(self) -> ContainerSession:
        try:
            return await self._start_container()
        except SandboxError as e:
            self.environment_error = e
            raise

    async def _start_container(self) -> ContainerSession:
        i = self.inputs
        labels = {LABEL_RUN: self.run_id, LABEL_ROLE: "grader"}
        if self.experiment:
            labels[LABEL_EXPERIMENT] = self.experiment
        mounts = [
            Mount(str(i.input_host), i.input_dir, True),
            Mount(str(self.output_host()), i.output_dir, i.scratch_host is None),
            Mount(str(i.reference_host), i.reference_dir, True),
        ]
        if i.software_host is not None and i.software_dir is not None:
            mounts.append(Mount(str(i.software_host), i.software_dir, True))
        mounts = self._scratch_mounts() + mounts  # parents first: the read-only folders nest inside
        self.container = await self.provider.create(
            SandboxSpec(
                name=f"ale-grade-{self.run_id}"[:120],
                image=self.image,
                # Writable places are host folders (on disk: a grader may unpack
                # gigabytes), not the candidate's small in-memory /tmp.
                policy=self.policy.model_copy(update={"tmpfs": ()}) if self.inputs.scratch_host else self.policy,
                mounts=tuple(mounts),
                labels=labels,
                workdir=self.workdir(),
                environment={**GRADING_ENVIRONMENT, "HOME": GRADER_HOME},
            )
        )
        await self.container.start()
        tools = ToolBox(self.container, workdir=self.workdir(), default_timeout=self.command_timeout,
                        output_limit=TASK_OUTPUT_LIMIT, read_limit=TASK_READ_LIMIT)
        return ContainerSession(tools, default_timeout=self.command_timeout)

    def _scratch_mounts(self) -> list[Mount]:
        i = self.inputs
        if i.scratch_host is None:
            return []
        targets = ["/tmp", GRADER_HOME]
        if i.task_dir:
            parts = i.task_dir.rstrip("/").split("/")
            targets.append("/".join(parts[:-3]) if len(parts) > 4 else i.task_dir)  # ALE's data root
        out = []
        for n, target in enumerate(targets):
            host = i.scratch_host / f"w{n}"
            host.mkdir(parents=True, exist_ok=True)
            os.chmod(host, 0o1777)
            if i.task_dir and i.task_dir.startswith(target.rstrip("/") + "/"):
                # The folders down to the task folder: writable by the grader's user, so a
                # grader can make scratch beside the read-only input/output/reference
                # (ALE's <task_dir>/eval_data/_eval_tmp); the engine would make them root's.
                at = host
                for part in i.task_dir[len(target.rstrip("/")) + 1:].split("/"):
                    if part in ("", ".", ".."):
                        break  # never a folder outside this scratch folder
                    at = at / part
                    at.mkdir(exist_ok=True)
                    os.chmod(at, 0o1777)
            out.append(Mount(str(host.resolve()), target, False))
        return out

    def session(self) -> RoutedSession:
        i = self.inputs
        routes = [
            Route(i.input_dir, i.input_host, writable=False),
            # The working copy is made when first used (a grader reading only the input copies nothing).
            Route(i.output_dir, i.scratch_host / "output", writable=True, ready=self.output_host)
            if i.scratch_host is not None else Route(i.output_dir, i.deliverables_host, writable=False),
            Route(i.reference_dir, i.reference_host, writable=False),
        ]
        if i.software_host is not None and i.software_dir is not None:
            routes.append(Route(i.software_dir, i.software_host, writable=False))
        return RoutedSession(
            routes,
            self._container_session,
            gui=self.gui,
        )

    async def grade(self, evaluate: Callable[[RoutedSession], Awaitable[Any]]) -> list[float]:
        """Run ``evaluate(session)`` (the task's grader, in its task process, which
        enforces the timeout) and check what it returned."""
        try:
            value = await evaluate(self.session())
        except TaskProcessError as e:
            self._raise_if_environment_failed()
            raise GradingError(f"evaluate() failed: {e}") from e
        except TaskCallFailed as e:
            self._raise_if_environment_failed()
            raise GradingError(f"evaluate() raised {e}", e.traceback) from e
        except TaskError as e:
            self._raise_if_environment_failed()
            raise GradingError(f"evaluate() could not run: {e}") from e
        # A grader that caught the sandbox's failure may still return scores: they
        # would score the harness's failure, never the candidate's work.
        self._raise_if_environment_failed()
        return validate_scores(value)

    def _raise_if_environment_failed(self) -> None:
        if self.environment_error is not None:
            raise GradingEnvironmentError(f"the grading sandbox could not be started: {self.environment_error}") \
                from self.environment_error

    async def close(self) -> None:
        if self.container is not None:
            await self.container.remove()
            self.container = None
