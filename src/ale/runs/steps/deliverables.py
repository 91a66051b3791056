"""DELIVERABLES: the workspace's regular files copied out, the input checked unchanged."""

from __future__ import annotations

import asyncio
import json
import os

from ale import layout
from ale.grading.deliverables import extract_deliverables
from ale.isolation.checks import Check
from ale.layout import Evidence
from ale.phases import CheckGroup
from ale.record import evidence as ev
from ale.runs.state import RunState
from ale.runs.steps.stage_input import public_tree


async def collect_deliverables(state: RunState) -> None:
    """Copy the workspace out, off the event loop (the walk may take up to its time
    limit, and other runs share the loop)."""
    lim = state.plan.limits
    manifest = await asyncio.to_thread(
        extract_deliverables,
        state.folder.workspace_host, state.folder.run_dir / layout.DELIVERABLES_DIR,
        max_files=lim.deliverable_max_files, max_bytes=lim.deliverable_max_bytes,
        owner=(state.plan.policy.uid, state.plan.policy.gid) if os.geteuid() == 0 else None,
        mount_point=state.variant.output_dir,
        # One path budget for every copy: the grader's working copies and the output
        # folder in the grading sandbox are longer bases than the run folder may be.
        also_under=[*state.folder.copy_bases(lim.grading_attempts), state.variant.output_dir],
    )
    ev.write_json_new(state.folder.run_dir / layout.DELIVERABLES, json.loads(manifest.model_dump_json()))
    state.record.events.append("deliverables.collected", files=len(manifest.files), skipped=len(manifest.skipped),
                               digest=manifest.digest)
    limited = [e for e in manifest.skipped if e.limit is not None]
    if limited:
        state.record.warnings.append(
            f"deliverables: {len(limited)} entr{'y' if len(limited) == 1 else 'ies'} of the workspace not "
            f"copied at a limit ({limited[0].reason}: {limited[0].path}); the grader saw the rest "
            f"({layout.DELIVERABLES})")


async def check_input_unchanged(state: RunState) -> None:
    with state.record.cost("evidence"):
        after = await asyncio.to_thread(public_tree, state)
    state.record.store.write_json(Evidence.INPUT_AFTER_RUN, after)
    start = state.record.input_after_start or {}
    same = after["digest"] == start.get("digest")
    state.record.add_checks(CheckGroup.AFTER_RUN, [Check(
        "input.unchanged", same, start.get("digest"), after["digest"],
        "" if same else "the staged input changed during the run")])


async def deliverables_step(state: RunState) -> None:
    await collect_deliverables(state)
    await check_input_unchanged(state)
