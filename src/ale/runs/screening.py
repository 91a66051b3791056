"""What can run, said before anything runs: each task loaded once at planning.

``screen_task`` loads a task in a task process (its tree's environment when
built) and says, per variant, whether this harness can run it: a task that does
not load, a card or variant that needs a Windows VM, a variant index the task
does not have, a variant that needs task data when no data source was given.
Experiments plan only what can run and record the rest (``skipped.json`` in the
output folder); ``ale run`` refuses such a run before any sandbox starts.

The same facts say which sandbox image each variant needs (a desktop or not):
``ale.runs.images`` builds them before the runs.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ale.sandbox.desktop import desktop_spec
from ale.tasks.card import load_card
from ale.tasks.environment import EnvironmentBuildError, TaskEnvironment, resolve_environment
from ale.tasks.errors import TaskError
from ale.tasks.process import TaskCallFailed, TaskProcessError, inspect_task_sync

SKIPPED_FILE = "skipped.json"  # in an experiment's output folder

OK, UNSUPPORTED, ERROR, NO_DATA, NO_VARIANT = "ok", "unsupported", "error", "no_data", "no_such_variant"


@dataclass(frozen=True)
class VariantFacts:
    index: int
    task_id: str
    desktop: bool  # runs in the desktop image
    needs_data: bool  # stages task data (ALE's REQUIRES_TASK_DATA, the default for its tasks)
    data_key: str  # <domain>/<task>/<variant>: where its data sits below a data root
    unsupported: str | None = None  # why this provider cannot run it (a Windows VM)


@dataclass(frozen=True)
class TaskScreen:
    task_dir: Path
    status: str  # ok | unsupported | error
    reason: str | None
    variants: tuple[VariantFacts, ...] = ()
    data_source: str | None = None  # the card's


def needs_data(metadata: dict[str, Any], task_dir: str | None) -> bool:
    """Whether a variant stages task data: its metadata says ``requires_task_data``
    (ALE's tasks state it; true unless the task sets it false), or, unsaid, it is
    laid out as ALE's tasks are (a ``task_dir`` holding its input)."""
    flag = metadata.get("requires_task_data")
    if flag is not None:
        return bool(flag)
    return task_dir is not None


def data_layout_hint(key: str) -> str:
    """The folders a data root must hold for variant ``key`` (domain/task/variant)."""
    return (f"a data root holding {key}/input/ (ALE's layout; or tasks/{key}/input/), "
            "e.g. --data local:/path/to/data or --data gs://ale-data-public (docs/data.md)")


def no_data_reason(facts: VariantFacts, flag: str = "--data") -> str:
    return (f"variant {facts.index} ({facts.task_id}) needs task data and no data source was given: "
            f"pass {flag} with {data_layout_hint(facts.data_key)}")


def _screen(task_dir: Path, provider: str, build_env: bool, vm_images: tuple[str, ...] = ()) -> TaskScreen:
    try:
        card = load_card(task_dir)
    except TaskError as e:
        return TaskScreen(task_dir, ERROR, str(e))
    reason = card.unsupported_reason(provider, vm_images=vm_images)
    if reason is not None:
        return TaskScreen(task_dir, UNSUPPORTED, reason, data_source=card.data_source)
    hint = ""
    try:
        # what the run would do first: its tree's environment (built once, cached)
        env = resolve_environment(task_dir, build=build_env, say=lambda m: print(m, file=sys.stderr))
    except TaskError as e:
        env, hint = TaskEnvironment(), f" ({e})"
    except EnvironmentBuildError as e:
        return TaskScreen(task_dir, ERROR, f"its tree's environment does not build: {e}", data_source=card.data_source)
    try:
        info = inspect_task_sync(task_dir, environment=env)
    except (TaskError, TaskProcessError, TaskCallFailed, EnvironmentBuildError) as e:
        return TaskScreen(task_dir, ERROR, f"does not load: {e}{hint}", data_source=card.data_source)
    facts = []
    for v in info.variants:
        os_type = ((v.computer or {}).get("setup_config") or {}).get("os_type")
        desktop = desktop_spec(card.raw, v.computer) is not None
        unsupported = card.unsupported_reason(provider, variant_os=os_type if isinstance(os_type, str) else None,
                                              vm_images=vm_images)
        if unsupported is None and desktop and provider == "qemu":  # as the run's preflight refuses it
            unsupported = _vm_desktop_refusal(card, v.computer, vm_images)
        facts.append(VariantFacts(
            index=v.index,
            task_id=v.task_id,
            desktop=desktop,
            needs_data=needs_data(v.metadata, v.task_dir),
            data_key=v.data_key.name,
            unsupported=unsupported,
        ))
    return TaskScreen(task_dir, OK, None, tuple(facts), card.data_source)


def _vm_desktop_refusal(card: Any, computer: dict[str, Any] | None, vm_images: tuple[str, ...]) -> str | None:
    """A desktop under qemu: ale's own guest serves one (its computer-server's Xvfb screen,
    which a run's preflight checks on the guest it boots), not cua-bench's simulated
    desktop (HTML windows); a disk mapped to the task's vm.snapshot is foreign, and its
    screen is not driven yet."""
    from ale.sandbox.qemu.provider import windows_refusal

    refused = windows_refusal(computer)
    if refused is not None:
        return refused
    if card.snapshot is not None and card.snapshot in vm_images:
        return ("asks for a desktop and runs on the disk mapped to its vm.snapshot: a foreign disk's screen is not "
                "driven by the qemu provider yet (only ale's own guest's is)")
    return None


_cache: dict[tuple[str, str, bool, tuple[Any, ...]], TaskScreen] = {}
_lock = threading.Lock()


def _signature(task_dir: Path) -> tuple[Any, ...]:
    out: list[Any] = []
    for name in ("main.py", "task_card.json"):
        try:
            st = os.stat(task_dir / name)
            out.append((name, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((name, None))
    return tuple(out)


def screen_task(task_dir: str | Path, provider: str = "docker", *, build_env: bool = False,
                vm_images: tuple[str, ...] = ()) -> TaskScreen:
    """The task's screen (cached in this process while its main.py and card are
    unchanged). ``build_env``: build its tree's declared environment when it is not
    yet (as the run would); else a task that needs it and does not load without it
    is an error naming ``ale task env``. ``vm_images``: the snapshots the operator
    mapped to disks (the qemu provider runs those)."""
    path = Path(task_dir).resolve()
    vm_images = tuple(sorted(vm_images))
    key = (str(path), provider + "|" + ",".join(vm_images), build_env, _signature(path))
    with _lock:  # a screen made with the environment built serves either way
        hit = _cache.get((key[0], key[1], True, key[3])) or _cache.get(key)
    if hit is not None:
        return hit
    screen = _screen(path, provider, build_env, vm_images)
    with _lock:
        _cache[key] = screen
    return screen


@dataclass(frozen=True)
class Skipped:
    """A task (or one variant of it) planning left out, and why."""

    task: str
    task_dir: str
    variant: int | None
    status: str  # unsupported | error | no_data | no_such_variant
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        at = f"{self.task}" + ("" if self.variant is None else f" v{self.variant}")
        return f"{self.status:<12} {at}: {self.reason}"


def write_skipped(output: Path, skipped: list[Skipped]) -> Path:
    """``skipped.json`` in the experiment folder: what was not planned, and why."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / SKIPPED_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([s.to_dict() for s in skipped], indent=1) + "\n")
    os.replace(tmp, path)
    return path


def read_skipped(output: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((Path(output) / SKIPPED_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
