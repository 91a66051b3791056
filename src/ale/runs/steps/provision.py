"""PROVISION: the software, the sandbox created, inspected (before) and started."""

from __future__ import annotations

import asyncio
import os

from ale.defaults import CANDIDATE_HOME
from ale.isolation import rules
from ale.isolation.probes import workspace_listing
from ale.layout import Evidence
from ale.phases import CheckGroup
from ale.runs import vm_seal
from ale.runs.state import RunState
from ale.runs.steps.provide_software import provide_software
from ale.sandbox.base import LABEL_EXPERIMENT, LABEL_ROLE, LABEL_RUN, SandboxSpec


async def provision(state: RunState) -> None:
    plan = state.plan
    labels = {LABEL_RUN: plan.run_id, LABEL_ROLE: "candidate"}
    if plan.experiment:
        labels[LABEL_EXPERIMENT] = plan.experiment
    mounts = state.folder.mounts()
    state.record.store.write_json(
        Evidence.MOUNTS,
        [
            {"source": m.source, "inode": os.stat(m.source).st_ino, "target": m.target, "read_only": m.read_only}
            for m in mounts
        ],
    )
    state.record.workspace_at_creation = workspace_listing(state.folder.workspace_host)
    state.live.provisioning = True
    state.live.sandbox = await state.prep.provider.create(
        SandboxSpec(
            name=f"ale-{plan.run_id}"[:120],
            image=state.candidate_image,
            policy=plan.policy,
            mounts=tuple(mounts),
            labels=labels,
            workdir=state.variant.output_dir,
            environment={"HOME": CANDIDATE_HOME},
        )
    )
    state.record.events.append("sandbox.created", name=state.sandbox.name, id=state.sandbox.id)


async def verify_created(state: RunState) -> None:
    with state.record.cost("verify"):
        await _verify_created(state)


async def _verify_created(state: RunState) -> None:
    inspect = await asyncio.to_thread(state.sandbox.inspect)
    state.record.inspect_before = inspect
    if vm_seal.is_vm(state):  # a VM: nothing runs yet to ask; QEMU's own description is judged once it booted
        booted = state.prep.image_record or {}
        if state.live.image and booted.get("Id") != inspect.get("Image"):  # a guest made for the task's software
            booted = await asyncio.to_thread(state.prep.provider.image_inspect, state.live.image)
            state.live.image_record = booted
        state.record.store.write_json(Evidence.IMAGE, booted)
        return
    state.record.store.write_json(Evidence.INSPECT_BEFORE, inspect)
    image = state.prep.image_record
    if image is None or image.get("Id") != inspect.get("Image"):  # the container's image, as the engine says now
        image = await asyncio.to_thread(state.prep.provider.image_inspect, inspect.get("Image", state.plan.image))
    state.record.store.write_json(Evidence.IMAGE, image)
    checks = rules.judge("before", policy=state.plan.policy, mounts=state.folder.mounts(), inspect=inspect,
                         image_inspect=image, mount_inodes=state.folder.mount_inodes())
    state.record.add_checks(CheckGroup.INSPECT_BEFORE, checks)


async def provision_step(state: RunState) -> None:
    await provide_software(state)
    layer = getattr(state.extension, "layer_image", None)  # a native harness's image layer (ale.runs.extensions)
    if layer is not None:
        await layer(state)
    await provision(state)
    await verify_created(state)
    await state.sandbox.start()
    boot = getattr(state.sandbox, "boot", None)  # a VM: booted or restored, and how long it took
    state.record.events.append("sandbox.started", **({"boot": boot} if boot else {}))
    await state.extension.sandbox_started(state)
    if state.extension.computer is None and hasattr(state.sandbox, "protocol"):
        await _cua_computer(state)


async def _cua_computer(state: RunState) -> None:
    """A cua sandbox whose computer-server has a screen: the agent's and start()'s
    ``computer`` tool drives it through the protocol, at the screen's size."""
    from ale.sandbox.computer import Computer
    from ale.sandbox.cua.desktop import CuaDesktop

    screen = await CuaDesktop.of(state.sandbox)
    if screen is not None:
        state.extension.computer = Computer(screen)
        state.record.events.append("cua.screen", width=screen.width, height=screen.height)
