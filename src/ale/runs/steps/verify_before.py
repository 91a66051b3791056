"""VERIFY_BEFORE: the probes, the input hashed, the workspace proven empty, the reference committed."""

from __future__ import annotations

import asyncio
import os
from typing import Literal

from ale.isolation.checks import Check
from ale.isolation.probes import (
    judge_probes,
    probe_command,
    run_probes,
    workspace_empty_checks,
    workspace_listing,
)
from ale.layout import Evidence
from ale.phases import CheckGroup
from ale.record import evidence as ev
from ale.runs import start_writes, vm_seal
from ale.runs.state import RunState, now
from ale.runs.steps.stage_input import public_tree
from ale.sandbox.base import ExecResult


def _public_package_checks(state: RunState) -> list[Check]:
    """The public package holds no reference: nothing where the task expects its
    reference and, for an ALE task folder, no ``reference``/``reference.7z`` in it."""
    found = []
    if state.variant.task_dir:
        found = [n for n in ("reference", "reference.7z") if os.path.lexists(state.folder.public_host / n)]
    rel = state.variant.public_relpath(state.variant.reference_dir)
    if rel not in (None, ".") and os.path.lexists(state.folder.public_host / rel):
        found.append(rel)
    found = sorted(set(found))
    return [Check("public.no_reference", not found, "no reference in the public package", found or None,
                  f"the public package holds {found}" if found else "")]


async def verify_running(state: RunState, phase: Literal["before", "after"], probe: ExecResult | None = None, *,
                         ran: bool = False) -> None:
    """Probes inside the running sandbox (the harness's own exec; the same code
    ``verify-container`` and the real-container tests use). ``ran``: they already
    ran, in the end-of-turn kill's exec, and ``probe`` is their result."""
    with state.record.cost("verify"):
        v, policy = state.variant, state.plan.policy
        if vm_seal.is_vm(state):
            vm_seal.tell_probes(state, probe_command(policy, input_dir=v.public_root, workspace_dir=v.output_dir))
        if ran:
            raw, checks = judge_probes(probe, policy, input_dir=v.public_root, workspace_dir=v.output_dir, phase=phase)
        else:
            raw, checks = await run_probes(state.sandbox, policy, input_dir=v.public_root,
                                           workspace_dir=v.output_dir, phase=phase)
        if vm_seal.is_vm(state):  # the container's rules do not judge a VM: QEMU's view and the guest's probes do
            await vm_seal.judge_running(state, phase, raw)
            return
        state.record.store.write_text(Evidence.probes(phase), raw)
        state.record.add_checks(CheckGroup.PROBES_BEFORE if phase == "before" else CheckGroup.PROBES_AFTER, checks)


async def seal_input_and_workspace(state: RunState) -> None:
    """After start(): hash the input (off the event loop: a large per-run copy takes
    seconds, and other runs share the loop), prove the workspace is still empty."""
    with state.record.cost("evidence"):
        tree = await asyncio.to_thread(public_tree, state)
        _seal_input_and_workspace(state, tree)
        before = state.record.public_before_start
        if before is not None:  # start() ran: keep what it added or changed, for a regrade
            kept = await asyncio.to_thread(start_writes.keep_public, state.folder.run_dir, state.folder.public_host,
                                           before, tree)
            state.record.store.write_json(Evidence.START_WRITES, kept)


def _seal_input_and_workspace(state: RunState, tree: dict) -> None:
    state.record.input_after_start = tree
    state.record.store.write_json(Evidence.INPUT_AFTER_START, state.record.input_after_start)
    created = state.record.workspace_at_creation or {}
    listing = workspace_listing(state.folder.workspace_host)
    state.record.store.write_json(Evidence.WORKSPACE_EMPTY, {"at_creation": created, "at_agent_start": listing})
    state.record.add_checks(CheckGroup.AGENT_START,
                            workspace_empty_checks(listing, expected_inode=created.get("inode"))
                            + _public_package_checks(state))


async def commit_reference(state: RunState) -> None:
    src_commit = None
    if state.live.source is not None:
        src_commit = await asyncio.to_thread(state.live.source.commit_reference, state.variant.data_key)
    state.record.commitment = src_commit
    setup_tree = await asyncio.to_thread(ev.hash_tree, state.folder.setup_reference_host)
    state.record.reference_commit = {
        "source": None if src_commit is None
                  else {"kind": src_commit.kind, "sha256": src_commit.sha256, "files": src_commit.files},
        "setup_written": setup_tree,
        "committed_at": now().isoformat(),
    }
    state.record.store.write_json(Evidence.REFERENCE_COMMIT, state.record.reference_commit)
    state.record.events.append("reference.committed", sha256=None if src_commit is None else src_commit.sha256,
                               setup_digest=setup_tree["digest"])


async def hash_input(state: RunState) -> None:
    """A grading probe's input after start(), hashed as it lies (no workspace to prove empty)."""
    state.record.input_after_start = ev.hash_tree(state.folder.public_host)
    state.record.store.write_json(Evidence.INPUT_AFTER_START, state.record.input_after_start)


async def verify_before_step(state: RunState) -> None:
    await verify_running(state, "before")
    await seal_input_and_workspace(state)
    await commit_reference(state)
