"""Grading on the trusted side: evaluate(cfg, session) over host copies.

The session serves the task's input, output (the deliverables copy) and
reference paths from host folders, read-only; any command the grader runs goes
to a fresh grading container (no network, the same three folders read-only),
never the candidate's, which is gone by now.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.sandbox.base import (
    LABEL_EXPERIMENT,
    LABEL_ROLE,
    LABEL_RUN,
    Mount,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
)
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.session import ContainerSession, Route, RoutedSession
from ale.sandbox.tools import ToolBox
from ale.tasks.errors import TaskError
from ale.tasks.process import TaskCallFailed, TaskProcessError


class GradingError(RuntimeError):
    """The grader broke or returned something that is not a score list."""

    def __init__(self, message: str, tb: str | None = None):
        super().__init__(message)
        self.traceback = tb


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
    task_dir: str | None = None  # ALE: a writable scratch folder holding the mounts (graders write eval_data/ there)


def validate_scores(value: Any) -> list[float]:
    """A non-empty list of floats in [0, 1], or GradingError saying what came back."""
    if not isinstance(value, list | tuple) or len(value) == 0:
        raise GradingError(f"evaluate() must return a non-empty list of floats in [0, 1], got {value!r:.200}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise GradingError(f"evaluate() returned a non-number at index {i}: {v!r:.100}")
        f = float(v)
        if math.isnan(f) or not 0.0 <= f <= 1.0:
            raise GradingError(f"evaluate() returned {f} at index {i}; scores must lie in [0, 1]")
        out.append(f)
    return out


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

    async def _container_session(self) -> ContainerSession:
        i = self.inputs
        labels = {LABEL_RUN: self.run_id, LABEL_ROLE: "grader"}
        if self.experiment:
            labels[LABEL_EXPERIMENT] = self.experiment
        mounts = [
            Mount(str(i.input_host), i.input_dir, True),
            Mount(str(i.deliverables_host), i.output_dir, True),
            Mount(str(i.reference_host), i.reference_dir, True),
        ]
        if i.software_host is not None and i.software_dir is not None:
            mounts.append(Mount(str(i.software_host), i.software_dir, True))
        self.container = await self.provider.create(
            SandboxSpec(
                name=f"ale-grade-{self.run_id}"[:120],
                image=self.image,
                policy=self.policy,
                mounts=tuple(mounts),
                labels=labels,
                workdir="/tmp",
                scratch_dirs=(i.task_dir,) if i.task_dir else (),
            )
        )
        await self.container.start()
        tools = ToolBox(self.container, workdir="/tmp", default_timeout=self.command_timeout)
        return ContainerSession(tools, default_timeout=self.command_timeout)

    def session(self) -> RoutedSession:
        i = self.inputs
        routes = [
            Route(i.input_dir, i.input_host, writable=False),
            Route(i.output_dir, i.deliverables_host, writable=False),
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
            raise GradingError(f"evaluate() failed: {e}") from e
        except TaskCallFailed as e:
            raise GradingError(f"evaluate() raised {e}", e.traceback) from e
        except TaskError as e:
            raise GradingError(f"evaluate() could not run: {e}") from e
        return validate_scores(value)

    async def close(self) -> None:
        if self.container is not None:
            await self.container.remove()
            self.container = None
