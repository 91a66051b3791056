"""TASK_START: the task's start(), in the candidate's sandbox or, with none, in a grading sandbox."""

from __future__ import annotations

import asyncio

from ale.grading.grader import Grader, GradingInputs
from ale.phases import RunKind
from ale.runs import start_writes
from ale.runs.state import RunState
from ale.runs.steps.screen import SCREEN_AFTER_START, record_screen
from ale.sandbox.session import ContainerSession, Route, RoutedSession
from ale.sandbox.tools import TASK_OUTPUT_LIMIT, TASK_READ_LIMIT, ToolBox


async def run_task_setup(state: RunState) -> None:
    """The task's start(cfg, session): input and reference writes land on the host."""
    if not state.prep.task.has("start"):
        return
    v = state.variant
    tools = ToolBox(state.sandbox, workdir=v.output_dir, default_timeout=state.plan.limits.command_timeout_s,
                    output_limit=TASK_OUTPUT_LIMIT, read_limit=TASK_READ_LIMIT,
                    computer=state.extension.computer)  # start() launches a desktop task's windows
    container = ContainerSession(tools, default_timeout=state.plan.limits.command_timeout_s)

    async def factory() -> ContainerSession:
        return container

    session = RoutedSession(
        [Route(v.input_dir, state.folder.input_host, writable=True),
         Route(v.reference_dir, state.folder.setup_reference_host, writable=True)],
        factory, gui=container if state.extension.computer is not None else None,
    )
    # What start() changes in the public package is kept in the run folder (start_writes).
    state.record.public_before_start = await asyncio.to_thread(start_writes.listing, state.folder.public_host)
    await state.prep.process.call("start", v.index, session, timeout=state.plan.limits.grading_timeout_s)


def start_sandbox_id(state: RunState) -> str:
    """The name of the grading sandbox start() runs in when there is no candidate's."""
    return f"{state.plan.run_id}-{'regrade-start' if state.kind is RunKind.REGRADE else 'start'}"


async def start_in_grading_sandbox(state: RunState) -> None:
    """The task's start() with no candidate sandbox (a regrade, a grading-only probe):
    its input and reference writes land on the host as in a run; its commands run in
    a grading sandbox (no network, the public package read-only), never a candidate's,
    bounded as a regrade's grading or as a probe's run's commands."""
    v, folder, plan = state.variant, state.folder, state.plan
    sandbox_id = state.live.start_sandbox = start_sandbox_id(state)
    limits = plan.limits
    command_timeout = limits.grading_timeout_s if state.kind is RunKind.REGRADE else limits.command_timeout_s
    empty = folder.scratch / "start-output"
    empty.mkdir(mode=0o755)
    sandbox = Grader(
        state.prep.provider, image=state.grading_image, policy=plan.policy, run_id=sandbox_id,
        experiment=plan.experiment, command_timeout=command_timeout,
        inputs=GradingInputs(
            input_host=folder.input_host.resolve(), deliverables_host=empty.resolve(),
            reference_host=folder.setup_reference_host.resolve(), input_dir=v.input_dir, output_dir=v.output_dir,
            reference_dir=v.reference_dir, task_dir=v.task_dir, scratch_host=folder.scratch / "start-sandbox"),
    )
    session = RoutedSession(
        [Route(v.input_dir, folder.input_host, writable=True),
         Route(v.reference_dir, folder.setup_reference_host, writable=True)],
        sandbox._container_session,
    )
    try:
        await state.prep.process.call("start", v.index, session, timeout=plan.limits.grading_timeout_s)
    finally:
        await sandbox.close()


async def task_start_step(state: RunState) -> None:
    await run_task_setup(state)
    await record_screen(state, SCREEN_AFTER_START)
