"""The sandbox images a run needs, built when first needed (content-cached).

``ale run``, ``ale task check``, ``ale exp run`` (and the orchestrator) call
``ensure_images`` before any run: each image a planned run starts from that is
one of ale's own (the tools image ``ale-tools:*``, the desktop image
``ale-desktop:*``, ``ALE_DESKTOP_IMAGE``) and is missing from the engine is built
(``ale.sandbox.image``: a lookup when its content is cached, else a build, with
progress through ``say``) and tagged as asked. An image that is not ale's is
left alone: the run's preflight names it. A task's software environment image
(``ale-env:*``) is the lifecycle's (``ale.runs.software``).
"""

from __future__ import annotations

import fcntl
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ale.defaults import DEFAULT_TOOLS_IMAGE, TOOLS_REPO
from ale.paths import cache_dir
from ale.plan import RunPlan
from ale.runs.screening import screen_task
from ale.sandbox import desktop as desktop_mod
from ale.sandbox.base import ImageMissing, SandboxProvider
from ale.sandbox.providers import make_provider
from ale.tasks.card import load_card

Say = Callable[[str], None]


def _repo(ref: str) -> str:
    name = ref.rsplit("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


def kind_of(ref: str) -> str | None:
    """``tools`` or ``desktop`` when ``ref`` is one of ale's own images, else None."""
    if ref == desktop_mod.DEFAULT_DESKTOP_IMAGE or _repo(ref) == desktop_mod.DESKTOP_REPO:
        return "desktop"
    if ref == DEFAULT_TOOLS_IMAGE or _repo(ref) == TOOLS_REPO:
        return "tools"
    return None


def image_for(plan: RunPlan) -> str:
    """The image a plan's sandbox starts from (before its software environment):
    the desktop image for a variant asking for a desktop run in the default tools
    image (``start_image``: the preflight's own choice)."""
    if desktop_mod.start_image(plan.image, plan.provider, desktop=True) == plan.image:
        return plan.image  # a desktop would not change it: nothing to screen
    screen = screen_task(plan.task_dir, plan.provider,
                         vm_images=(load_card(plan.task_dir).snapshot or "",) if plan.vm_image else ())
    facts = next((v for v in screen.variants if v.index == plan.variant), None)
    return desktop_mod.start_image(plan.image, plan.provider, desktop=facts is not None and facts.desktop)


def images_for(plans: Iterable[RunPlan]) -> list[str]:
    """The distinct images the plans start from, in first-use order."""
    seen: dict[str, None] = {}
    for plan in plans:
        seen.setdefault(image_for(plan), None)
    return list(seen)


def ensure_images(refs: Iterable[str], say: Say = print, *, provider: SandboxProvider | None = None) -> dict[str, str]:
    """Build each of ale's own images in ``refs`` that the engine lacks; returns
    {ref: "present" or the content tag built}. SandboxError when the engine is
    unreachable or a build fails."""
    from ale.sandbox.image import build_desktop_image, build_tools_image

    wanted = [r for r in dict.fromkeys(refs) if kind_of(r) is not None]
    if not wanted:
        return {}
    engine = provider if provider is not None else make_provider()
    done: dict[str, str] = {}
    for ref in wanted:
        if _present(engine, ref):
            done[ref] = "present"
            continue
        kind = kind_of(ref)
        with _build_lock():
            if _present(engine, ref):  # another process built it meanwhile
                done[ref] = "present"
                continue
            say(f"the {kind} image {ref} is not in the engine: building it (cached by content; once)")
            build = build_desktop_image if kind == "desktop" else build_tools_image
            with _heartbeat(f"still building the {kind} image {ref}", say):
                content = build(tag=ref, say=say)
            say(f"{kind} image {ref} ready ({content})")
            done[ref] = content
    return done


def _present(provider: SandboxProvider, ref: str) -> bool:
    try:
        provider.image_inspect(ref)
        return True
    except ImageMissing:
        return False


class _heartbeat:
    """Say ``what`` with the time spent every ``every_s`` seconds until the block ends
    (a desktop image build is minutes of apt with nothing else to show)."""

    def __init__(self, what: str, say: Say, every_s: float = 30.0) -> None:
        self.what, self.say, self.every_s = what, say, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.every_s):
            self.say(f"{self.what} ({time.monotonic() - t0:.0f} s)")

    def __enter__(self) -> None:
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class _build_lock:
    """One image build at a time on this machine (two ale processes would build the same)."""

    def __enter__(self) -> None:
        path = Path(cache_dir()) / "image-build.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = open(path, "a")  # noqa: SIM115
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._fd.close()
