"""The desktop's hooks: a desktop task's run is the ``live_grading`` shape of the
phase table, with the desktop started with the sandbox, the computer tool given to
start() and the agent, and the live window serving evaluate()'s GUI calls."""

from __future__ import annotations

from typing import Any

from ale.layout import Evidence
from ale.runs.state import Prepared, RunExtension, RunState
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


def make_extension(prep: Prepared) -> RunExtension:
    return DesktopExtension(prep.desktop) if prep.desktop is not None else RunExtension()
