"""The run plan: everything a run needs, resolved once, immutable, hashed."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ale.defaults import DEFAULT_TOOLS_IMAGE
from ale.sandbox.policy import IsolationPolicy


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str  # oracle | nop | replay | command | llm
    label: str | None = None  # how reports name this agent configuration
    config: dict[str, Any] = Field(default_factory=dict)
    allowlist: tuple[str, ...] = ("shell", "read_file", "write_file", "list_dir", "computer")

    @property
    def display(self) -> str:
        return self.label or self.name


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    wall_time_s: float | None = None  # None: the task card's timeout, else 1800
    max_steps: int | None = None
    command_timeout_s: float = 600.0
    # The workspace's byte limit. As root it is a tmpfs of this size (a hard cap);
    # otherwise, and when None (the default limit: 20 GiB or half the free disk),
    # a watchdog ends the agent's turn at the limit (ale.runs.watchdog).
    workspace_max_bytes: int | None = Field(None, gt=0)
    deliverable_max_files: int = 100_000  # as many as the copy looks at (its entry limit)
    deliverable_max_bytes: int = 2 * 1024**3
    grading_timeout_s: float = 3600.0  # evaluate() as a whole, and any one command it runs
    # evaluate() that raises, times out or kills its process is tried again (a fresh
    # task process and grading sandbox, the same deliverables and reference) up to this
    # many attempts in all, waiting grading_backoff_s, then twice that, ... in between.
    grading_attempts: int = Field(3, ge=1, le=10)
    grading_backoff_s: float = Field(2.0, ge=0)


class RunPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    task_dir: str
    variant: int = 0
    agent: AgentSpec
    data_source: str | None = None  # None: the task card's, else none
    image: str = DEFAULT_TOOLS_IMAGE
    provider: str = "docker"  # the SandboxProvider (ale.sandbox.providers)
    # The qemu provider's base disk for this task's vm.snapshot (an operator's
    # environment.vm_images entry: a .qcow2 path, or a published folder or URL,
    # ale.data.vm_disks); None: ale's own Linux guest (ale image build --vm).
    vm_image: str | None = Field(None, exclude_if=lambda v: v is None)  # left out of plan.json when unset
    # The judge credentials evaluate() gets: names <NAME> of ALE_JUDGE_<NAME> in the
    # controller's environment (values never enter the plan). None: every one.
    judge_env: tuple[str, ...] | None = None
    # The task's software (ale.runs.software): its needs built into an environment
    # image the sandboxes start from; False: the image as given. The overlay is an
    # operator's file of needs the task files do not state.
    provision_software: bool = True
    software_overlay: str | None = None
    policy: IsolationPolicy = Field(default_factory=IsolationPolicy)
    limits: Limits = Field(default_factory=Limits)
    runs_dir: str = "runs"
    experiment: str | None = None
    attempt: int = 1
    signing_key: str | None = None
    # Resume from an interrupted run's record (ale.agents.gateway.resume): its folder. Left
    # out of the plan's JSON when unset, so every other plan (and its digest) is as before.
    resume_from: str | None = Field(None, exclude_if=lambda v: v is None)

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.run_id


def new_run_id(task_name: str, variant: int, agent: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in f"{task_name}-v{variant}-{agent}")
    return f"{stamp}-{safe[:60]}-{uuid.uuid4().hex[:8]}"
