"""Imports run downward and form no cycle (every import counts, function-local too).

The layers, lowest first; a module may import its own layer and the ones below.
``docs/architecture.md`` says what each layer owns.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: list[tuple[str, ...]] = [
    ("ale", "ale.status", "ale.paths", "ale.documents", "ale.redaction", "ale.layout", "ale.defaults", "ale.lossless"),
    ("ale.data",),
    ("ale.sandbox",),
    ("ale.plan", "ale.result", "ale.phases"),
    ("ale.isolation",),
    ("ale.tasks",),
    ("ale.provision",),
    ("ale.agents",),
    ("ale.grading",),
    ("ale.record",),
    ("ale.runs",),
    ("ale.report",),
    ("ale.cli",),
]
# Packages that run in the task process with the task tree's interpreter: the
# standard library only (and each other), never the harness.
STANDALONE = ("ale.tasks.runtime._ale_task_worker", "ale.tasks.runtime.cua_bench")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (SRC / "ale").rglob("*.py")}


def _layer(module: str) -> int:
    best, best_len = -1, -1
    for i, names in enumerate(LAYERS):
        for n in names:
            inside = module == n or module.startswith(n + ".")
            if inside and len(n) > best_len:
                best, best_len = i, len(n)
    if best < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(n) for n in ast.walk(node))
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != module:
                out.add(n)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(m, p, known) for m, p in mods.items()}


def test_every_import_runs_downward() -> None:
    bad = [
        f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
        for m, deps in sorted(_graph().items())
        for d in sorted(deps)
        if _layer(d) > _layer(m) and not (m == "ale" and d.startswith("ale."))
    ]
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    graph = _graph()
    graph["ale"] = set()  # the package itself only holds the version
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if seen.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d) :] + [d]))
            elif d not in seen:
                visit(d)
        stack.pop()
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_guarded_module_exists() -> None:
    """A layer or a standalone package that names no module guards nothing: a rename
    must fail here, not leave the rules above passing over nothing."""
    mods = set(_modules())
    guarded = [n for names in LAYERS for n in names] + list(STANDALONE)
    missing = [n for n in guarded if n not in mods and not any(m.startswith(n + ".") for m in mods)]
    assert not missing, f"tests/test_layers.py guards modules that do not exist: {missing}"


def _top_level_imports(path: Path) -> set[str]:
    """The first name of every absolute import in ``path`` (function-local too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.partition(".")[0])
    return out


@pytest.mark.parametrize("package", STANDALONE)
def test_task_process_code_imports_the_standard_library_only(package: str) -> None:
    mods = _modules()
    hits = [m for m in mods if m == package or m.startswith(package + ".")]
    assert hits, f"{package} holds no module"
    # In the task process the runtime folder is on sys.path: its packages import
    # each other by their own names (``_ale_task_worker``, ``cua_bench``).
    own = {p.rpartition(".")[2] for p in STANDALONE} | {"__future__"}
    for m in hits:
        deps = _imports(m, mods[m], set(mods))
        assert not [d for d in deps if not d.startswith(package)], f"{m} imports the harness: {deps}"
        foreign = sorted(n for n in _top_level_imports(mods[m]) if n not in own and n not in sys.stdlib_module_names)
        assert not foreign, f"{m} imports beyond the standard library: {foreign}"


def test_docker_is_called_from_the_docker_provider_only() -> None:
    allowed = {"ale.sandbox.docker", "ale.sandbox.docker_images", "ale.sandbox.image", "ale.sandbox.env_image",
               "ale.sandbox.wheel_builds", "ale.sandbox.harness_image", "ale.sandbox.channel", "ale.sandbox.cua.tunnel", "ale.sandbox.cua.image",
               "ale.sandbox.qemu.image",
               "ale.sandbox.qemu.foreign_disk"}  # a VM guest's root (and the foreign test disk's) is a docker export
    users = []
    for m, p in _modules().items():
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            )
            if any(n == "docker" or n.startswith("docker.") for n in names) and m not in allowed:
                users.append(m)
    assert not users, f"modules that import the Docker SDK outside the provider: {sorted(set(users))}"
