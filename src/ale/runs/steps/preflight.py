"""The preflight every kind shares: the task's card, its process and ``load()``, the variant, the agent,
the engine and the image, checked before anything is created (``PreflightError`` otherwise)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ale.agents.errors import AgentConfigError
from ale.agents.registry import make_agent
from ale.data.base import DataError
from ale.data.vm_disks import fetch_vm_disk
from ale.plan import RunPlan
from ale.runs.state import Prepared
from ale.sandbox.base import ImageMissing, SandboxError, SandboxProvider
from ale.sandbox.desktop import desktop_spec, start_image
from ale.sandbox.providers import make_provider
from ale.tasks.card import TaskCard, load_card
from ale.tasks.environment import EnvironmentBuildError, TaskEnvironment, resolve_environment
from ale.tasks.errors import TaskError
from ale.tasks.jail import task_network
from ale.tasks.loader import select_variant
from ale.tasks.process import TaskCallFailed, TaskProcess, TaskProcessError, judge_env

DEFAULT_WALL_TIME_S = 1800.0


class PreflightError(ValueError):
    """The run cannot begin: a malformed task, a bad variant, no engine, no image.
    Raised before anything is created. Only an unreachable engine is worth a retry."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


def mapped_snapshots(plan: RunPlan, card: TaskCard) -> tuple[str, ...]:
    """The snapshots this plan maps to a disk: the card's, when the plan names one."""
    return (card.snapshot,) if plan.vm_image and card.snapshot else ()


def check_card(plan: RunPlan) -> TaskCard:
    """The task's card, and whether it can run as planned. Raises ``PreflightError``."""
    try:
        card = load_card(plan.task_dir)
        reason = card.unsupported_reason(plan.provider, vm_images=mapped_snapshots(plan, card))
    except TaskError as e:
        raise PreflightError(str(e)) from e
    if reason is not None:
        raise PreflightError(f"{plan.task_dir}: {reason}")
    return card


async def task_environment(plan: RunPlan) -> TaskEnvironment:
    """The environment the task's process runs in (its declared dependencies). Raises ``PreflightError``."""
    try:
        return await asyncio.to_thread(resolve_environment, plan.task_dir)
    except (TaskError, EnvironmentBuildError) as e:
        raise PreflightError(str(e)) from e


async def prepare(
    plan: RunPlan, provider: SandboxProvider | None = None, *, environment: TaskEnvironment | None = None,
    process: TaskProcess | None = None,
) -> Prepared:
    """The one preflight of every kind: start the task process (``load()``; ``process``:
    one lent by a warm pool, whose card its pool checked), pick the variant, check the
    agent, the engine and the image. Raises ``PreflightError``; nothing is left running then."""
    if process is None:
        card = check_card(plan)
        if environment is None:
            environment = await task_environment(plan)
        process = TaskProcess(plan.task_dir, environment=environment, card=card,
                              network=task_network(judge_env(names=plan.judge_env)))
    try:
        return await _preflight(plan, provider, process)
    except BaseException:
        await asyncio.shield(process.close())
        raise


async def _preflight(plan: RunPlan, provider: SandboxProvider | None, process: TaskProcess) -> Prepared:
    try:
        task = await process.start()
        variant = select_variant(task.variants, plan.variant)
        os_type = ((variant.computer or {}).get("setup_config") or {}).get("os_type")
        reason = task.card.unsupported_reason(plan.provider, variant_os=os_type if isinstance(os_type, str) else None,
                                              vm_images=mapped_snapshots(plan, task.card))
        if reason is not None:
            raise TaskError(f"{plan.task_dir}: variant {plan.variant} {reason}")
    except TaskError as e:
        raise PreflightError(str(e)) from e
    except (TaskProcessError, TaskCallFailed) as e:
        raise PreflightError(f"{plan.task_dir}: load() failed in the task process: {e}") from e
    try:
        agent = make_agent(plan.agent)
        # An agent that checks its set-up against the run's private folders (the
        # command agent: a confined harness's installation must not enclose them).
        agent.preflight(private=[Path(plan.runs_dir), Path(plan.task_dir)])
        # An agent that needs more of the sandbox's limits (a native harness) raises
        # them within the policy's bounds, or refuses here (evidence/policy.json: what ran).
        plan = plan.model_copy(update={"policy": agent.fit_policy(plan.policy)})
    except AgentConfigError as e:
        raise PreflightError(str(e)) from e
    data_spec = plan.data_source or task.card.data_source
    wall = plan.limits.wall_time_s or task.card.timeout_s or DEFAULT_WALL_TIME_S
    # a task asking for a desktop runs in the desktop image; in a VM, on its guest's own
    # screen (computer-server's: checked below, once the guest's record is read)
    desktop = desktop_spec(task.card.raw, variant.computer)
    image = start_image(plan.image, plan.provider, desktop=desktop is not None)
    if plan.provider == "qemu" and plan.vm_image:  # the operator's disk for this task's vm.snapshot, verified
        try:
            image = str((await asyncio.to_thread(fetch_vm_disk, plan.vm_image)).path) if "://" in plan.vm_image \
                else plan.vm_image.removeprefix("local:")
        except DataError as e:
            raise PreflightError(f"{plan.task_dir}: the disk mapped to vm.snapshot {task.card.snapshot!r}: {e}",
                                 retryable=True) from e
    try:
        provider = provider or make_provider(plan.provider)
        image_record = await asyncio.to_thread(provider.image_inspect, image)
    except ImageMissing as e:
        raise PreflightError(str(e)) from e
    except SandboxError as e:
        raise PreflightError(str(e), retryable=True) from e
    if desktop is not None and plan.provider == "qemu":
        _vm_screen(plan, variant.computer, image, image_record, desktop)
    return Prepared(plan, task, variant, data_spec, float(wall), provider, agent, process, desktop, image, image_record)


def _vm_screen(plan: RunPlan, computer: Any, image: str, image_record: Any, desktop: Any) -> None:
    """A desktop under qemu needs a guest whose computer-server serves a screen of the
    task's size, and not cua-bench's simulated desktop (HTML windows)."""
    from ale.sandbox.qemu.provider import no_display_reason, windows_refusal

    refused = windows_refusal(computer)
    if refused is not None:
        raise PreflightError(f"{plan.task_dir}: variant {plan.variant} {refused}")
    reason = no_display_reason(image, image_record, desktop.width, desktop.height)
    if reason is not None:
        raise PreflightError(f"{plan.task_dir}: variant {plan.variant} asks for a desktop, and {reason}")
