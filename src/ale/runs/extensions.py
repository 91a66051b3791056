"""The desktop's hooks: a desktop task's run is the ``live_grading`` shape of the
phase table, with the desktop (ale's desktop image's, or a VM guest's computer-server
screen) started with the sandbox, the computer tool given to
start() and the agent, and the live window serving evaluate()'s GUI calls.
A native harness agent's hook: its image layer under the sandbox."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from ale import layout
from ale.layout import Evidence
from ale.runs.state import Prepared, RunExtension, RunState
from ale.sandbox.base import SandboxError
from ale.sandbox.computer import Computer
from ale.sandbox.desktop import Desktop, DesktopSpec
from ale.sandbox.session import ContainerSession
from ale.sandbox.tools import ToolBox


class DesktopExtension(RunExtension):
    """A desktop task (``live_grading`` shape): the desktop starts as its own user
    right after the sandbox, the agent and start() get the computer tool, and
    evaluate()'s GUI calls are served by the candidate's sandbox, still sealed, its
    candidate processes all killed, the desktop's alive (not recorded in the
    trajectory, which is the agent's)."""

    def __init__(self, spec: DesktopSpec):
        self.spec = spec
        self.desktop: Desktop | None = None

    async def sandbox_started(self, state: RunState) -> None:
        """The computer tool's resolution is the agent config's ``display_width``/
        ``display_height`` (default 1024x768), scaled to the screen's."""
        self.desktop = Desktop(state.sandbox, self.spec)
        started = await self.desktop.start()
        cfg = state.plan.agent.config or {}
        self.computer = Computer(self.desktop, width=int(cfg.get("display_width", 1024)),
                                 height=int(cfg.get("display_height", 768)))
        state.record.costs["desktop_start"] = started["start_s"]
        state.record.store.write_json(Evidence.DESKTOP, {
            "spec": self.spec.to_dict(), "image": state.prep.image,
            "tool_resolution": [self.computer.width, self.computer.height], "started": started})
        state.record.events.append("desktop.started", seconds=started["start_s"])

    def grading_gui(self, state: RunState) -> Any:
        if self.computer is None or state.live.sandbox is None:
            return None
        return ContainerSession(ToolBox(state.sandbox, workdir="/", computer=self.computer))


class ServerDesktopExtension(RunExtension):
    """A desktop task in ale's VM guest (``--provider qemu``): the screen is the guest's
    Xvfb, started with computer-server as the candidate, and the computer tool drives it
    through computer-server's protocol (``CuaDesktop``) at the screen's size. No
    second identity holds the screen: the end of the turn kills it with the candidate's
    processes, so evaluate() reads the machine (files, commands) only after that, and
    gets no GUI."""

    def __init__(self, spec: DesktopSpec):
        self.spec = spec

    async def sandbox_started(self, state: RunState) -> None:
        from ale.sandbox.cua.desktop import CuaDesktop

        t0 = time.perf_counter()
        screen = await CuaDesktop.of(_ServerSession(state.sandbox))
        if screen is None:
            raise SandboxError(f"the VM's computer-server reports no screen (image {state.prep.image}): "
                               "see /tmp/.ale-cua-server.log in the guest")
        if (screen.width, screen.height) != (self.spec.width, self.spec.height):
            raise SandboxError(f"the task asks for a {self.spec.width}x{self.spec.height} desktop and the VM's screen "
                               f"is {screen.width}x{screen.height}")
        self.computer = Computer(screen)
        start_s = round(time.perf_counter() - t0, 3)
        started = {"start_s": start_s, "served_by": "computer-server (Xvfb as the candidate)",
                   "screen": [screen.width, screen.height]}
        state.record.costs["desktop_start"] = start_s
        state.record.store.write_json(Evidence.DESKTOP, {
            "spec": self.spec.to_dict(), "image": state.prep.image,
            "tool_resolution": [self.computer.width, self.computer.height], "started": started})
        state.record.events.append("desktop.started", seconds=start_s)


class _ServerSession:
    """A VM sandbox's computer-server as ``CuaDesktop`` reaches it (``protocol()``):
    the cua session's sandbox has it; the exec session's VM opens its ``cua_session``."""

    def __init__(self, sandbox: Any):
        self.sandbox = sandbox

    async def protocol(self) -> Any:
        if hasattr(self.sandbox, "protocol"):
            return await self.sandbox.protocol()
        return await self.sandbox.cua_session()


HARNESS_IMAGE_RECORD = "harness-image.json"  # under agent/: the native harness's image layer


class NativeHarnessExtension(RunExtension):
    """An agent in ``native`` mode (``ale.agents.harness``): its harness's read-only
    image layer goes under the candidate's sandbox. ``layer_image`` runs in PROVISION
    once the task's software is provided: the layer is found or built ``FROM`` that
    image on the trusted side (``ale.sandbox.harness_image``, content-cached) and the
    sandbox is created from it; its record is ``agent/harness-image.json``. Once the
    sandbox runs the run's image is the plain one again, so grading never sees the
    harness."""

    def __init__(self, harness: str):
        self.harness = harness
        self._plain: str | None = None

    async def layer_image(self, state: RunState) -> None:
        from ale.sandbox.harness_image import build_harness_image

        client = getattr(state.prep.provider, "client", None)
        if client is None:
            raise SandboxError("native mode needs the Docker provider "
                               f"(the run's provider is {type(state.prep.provider).__name__})")
        base = state.candidate_image
        self._plain = state.live.image
        t0 = time.perf_counter()
        tag, record = await asyncio.to_thread(build_harness_image, client, base, self.harness, lambda _msg: None)
        record["seconds"] = round(time.perf_counter() - t0, 3)
        state.record.costs["harness_image"] = record["seconds"]
        path = state.folder.run_dir / layout.agent_path(HARNESS_IMAGE_RECORD)
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(record, indent=2))
        state.record.events.append("harness.layered", harness=self.harness, image=tag, base=base,
                                   cached=record["cached"])
        state.live.image = tag

    async def sandbox_started(self, state: RunState) -> None:
        state.live.image = self._plain  # grading sandboxes start from the run's own image


def make_extension(prep: Prepared) -> RunExtension:
    if prep.desktop is not None and prep.plan.provider == "qemu":
        return ServerDesktopExtension(prep.desktop)
    if prep.desktop is not None:
        return DesktopExtension(prep.desktop)
    if prep.agent is not None and prep.agent.native:  # a regrade prepares no agent: its turn is over
        return NativeHarnessExtension(prep.agent.name)
    return RunExtension()
