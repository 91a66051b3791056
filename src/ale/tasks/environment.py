"""The Python environment a task tree's code runs in, built from what the tree declares.

ALE declares its graders' dependencies once, in ``tasks/pyproject.toml``
(``[project] dependencies`` and ``requires-python``). For a task inside such a
tree, ``resolve_environment`` returns a virtual environment with exactly those
packages, built once with pip (from the configured index, so it works offline
with a local mirror) and cached by content under ``<cache>/task-envs/<key>``: the
key covers the dependency list and the interpreter. The harness's own
environment is never touched. A task folder whose tree declares nothing runs
with the harness's interpreter.

The interpreter is the first one on this machine that satisfies the tree's
``requires-python`` (``python3.X`` on PATH, pyenv's versions); when none does,
the harness's own is used and the unmet pin is reported in the environment's
description (and the run's evidence), not raised: the packages may install
anyway.
"""

from __future__ import annotations

import fcntl
import functools
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from ale.paths import cache_dir
from ale.tasks.errors import TaskError
from ale.tasks.runtime._ale_task_worker.importer import find_tree_root

Say = Callable[[str], None]
MARKER = "ale-env.json"


@dataclass(frozen=True)
class TaskEnvironment:
    """How task processes run: the interpreter (a tree's environment, or the
    harness's own) and what it was built from, for the evidence."""

    python: str = sys.executable
    description: dict[str, Any] = field(default_factory=lambda: {"kind": "harness", "python": sys.executable})



class EnvironmentBuildError(RuntimeError):
    """pip could not build a tree's environment; the message names the command."""


@dataclass(frozen=True)
class TreeDeclaration:
    """What a task tree declares for its task processes."""

    pyproject: Path
    dependencies: tuple[str, ...]
    requires_python: str | None

    def key(self, python: str, version: str) -> str:
        doc = {"deps": sorted(self.dependencies), "python": version, "executable": os.path.realpath(python)}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def find_declaration(task_dir: Path) -> TreeDeclaration | None:
    """The ``pyproject.toml`` of the tree holding ``task_dir`` (in its ``tasks/``
    folder, or at the tree's root), or None. ``TaskError`` if it is malformed."""
    root = find_tree_root(task_dir.resolve())
    if root is None:
        return None
    for candidate in (root / "tasks" / "pyproject.toml", root / "pyproject.toml"):
        if not candidate.is_file():
            continue
        try:
            doc = tomllib.loads(candidate.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise TaskError(f"{candidate}: cannot be read as TOML: {e}") from e
        project = doc.get("project") or {}
        deps = project.get("dependencies") or []
        if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            raise TaskError(f"{candidate}: [project] dependencies must be a list of strings, got {deps!r}")
        rp = project.get("requires-python")
        if candidate.parent == root and not deps:
            continue  # the tree's root project (a harness of its own), not the tasks' declaration
        return TreeDeclaration(candidate, tuple(deps), rp if isinstance(rp, str) else None)
    return None


def _version_of(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def candidate_interpreters() -> list[str]:
    """Interpreters on this machine: the harness's first, then python3.X on PATH,
    then pyenv's installed versions."""
    seen: dict[str, str] = {}
    names = [sys.executable]
    for minor in range(8, 20):
        found = shutil.which(f"python3.{minor}")
        if found:
            names.append(found)
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    names += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.*", "bin", "python3")))
    for n in names:
        real = os.path.realpath(n)
        if real not in seen and os.access(real, os.X_OK):
            seen[real] = n
    return list(seen.values())


@functools.lru_cache(maxsize=32)
def choose_interpreter(requires_python: str | None) -> tuple[str, str, bool]:
    """(python, its version, whether it satisfies requires_python)."""
    own = sys.executable
    own_version = ".".join(map(str, sys.version_info[:3]))
    if not requires_python:
        return own, own_version, True
    try:
        spec = SpecifierSet(requires_python)
    except InvalidSpecifier:
        return own, own_version, False
    if Version(own_version) in spec:
        return own, own_version, True
    for python in candidate_interpreters()[1:]:
        version = _version_of(python)
        if version and Version(version) in spec:
            return python, version, True
    return own, own_version, False


def env_root() -> Path:
    return cache_dir() / "task-envs"


def resolve_environment(task_dir: str | Path, *, build: bool = True, say: Say | None = None) -> TaskEnvironment:
    """The environment for ``task_dir``'s task processes (see the module's docs).

    Raises ``EnvironmentBuildError`` when ``build`` and pip fails, ``TaskError``
    when the tree's declaration is malformed or the environment is missing and
    ``build`` is False.
    """
    decl = find_declaration(Path(task_dir))
    if decl is None or not decl.dependencies:
        return TaskEnvironment()
    python, version, satisfied = choose_interpreter(decl.requires_python)
    target = env_root() / decl.key(python, version)
    marker = target / MARKER
    if not marker.is_file():
        if not build:
            raise TaskError(
                f"{decl.pyproject} declares {len(decl.dependencies)} dependencies and their environment is not "
                f"built yet: run `ale task env {task_dir}`"
            )
        _build(target, python, decl, satisfied, version, say or (lambda m: print(m, file=sys.stderr)))
    desc = json.loads(marker.read_text())
    return TaskEnvironment(python=str(target / "bin" / "python"), description=desc)


def _build(target: Path, python: str, decl: TreeDeclaration, satisfied: bool, version: str, say: Say) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(str(target) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key; the others wait and reuse it
        if (target / MARKER).is_file():
            return
        if target.exists():
            shutil.rmtree(target)  # a build that died half-way
        note = "" if satisfied else f" (requires-python {decl.requires_python!r} not met: using Python {version})"
        say(f"building the task environment for {decl.pyproject} ({len(decl.dependencies)} packages) "
            f"with Python {version}{note} in {target}")
        started = time.monotonic()
        _run([python, "-m", "venv", str(target)], say, "create the virtual environment")
        pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off", *decl.dependencies]
        _run(pip, say, "install the tree's dependencies")
        freeze = subprocess.run([str(target / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True, text=True)
        desc: dict[str, Any] = {
            "kind": "tree",
            "pyproject": str(decl.pyproject),
            "dependencies": list(decl.dependencies),
            "requires_python": decl.requires_python,
            "requires_python_satisfied": satisfied,
            "python": str(target / "bin" / "python"),
            "python_version": version,
            "base_interpreter": python,
            "installed": freeze.stdout.split(),
            "built_in_s": round(time.monotonic() - started, 1),
        }
        tmp = target / (MARKER + ".tmp")
        tmp.write_text(json.dumps(desc, indent=1))
        tmp.replace(target / MARKER)
        say(f"task environment ready in {desc['built_in_s']}s: {target}")
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)


def _run(argv: list[str], say: Say, what: str) -> None:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-30:]
        if line.startswith(("Collecting", "Installing", "Successfully", "ERROR")):
            say(f"  {line}")
    if proc.wait() != 0:
        raise EnvironmentBuildError(
            f"could not {what} (exit {proc.returncode}): {' '.join(argv)}\n" + "\n".join(tail)
        )
