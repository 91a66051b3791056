"""ALE's layout (<root>/<domain>/<task>/<variant>) next to the tasks/ layout, on the
local: source; spec options; ALE's archive password; ale.data's import graph."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ale.cli.data import data_app
from ale.data.base import DataError, ReferenceError, VariantKey
from ale.data.hashing import hash_tree
from ale.data.local import LocalSource
from ale.data.roots import split_spec
from ale.data.sealing import SecretStore, seal_variant, unseal_variant
from ale.data.sources import open_source, prefetch
from ale.data.validate import validate_root
from ale.status import RunStatus
from tests.test_data_support import ALE_PASSWORD, KEY, make_ale_archive, make_variant, tree_of

DATA_SRC = Path(__file__).resolve().parents[1] / "src" / "ale" / "data"
OTHER = VariantKey("dom", "other", "base")


# ----------------------------------------------------------------------------- detection


def test_ale_layout_is_detected_staged_and_recorded(tmp_path: Path) -> None:
    v = make_variant(tmp_path / "data", layout="ale", software=True)
    src = open_source("data", base_dir=tmp_path)
    assert isinstance(src, LocalSource) and src.layout == "auto"
    tree = src.stage_input(KEY, tmp_path / "run" / "input")
    assert tree == hash_tree(v / "input")
    assert tree_of(tmp_path / "run" / "software") == tree_of(v / "software")
    assert src.layout_of(KEY) == "ale"
    assert src.location(KEY) == str(tmp_path / "data" / "dom" / "task" / "v0")
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "tree"
    src.stage_reference(KEY, tmp_path / "g" / "reference", c)
    assert tree_of(tmp_path / "g" / "reference") == tree_of(v / "reference")
    assert src.variants() == [KEY]


def test_mixed_root_lists_and_resolves_each_variant(tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_variant(root, layout="ale")
    make_variant(root, "dom/other/base", layout="tasks")
    (root / ".cache" / "x" / "y" / "z").mkdir(parents=True)  # hidden: never a variant
    src = LocalSource(root)
    assert src.variants() == [OTHER, KEY]
    assert (src.layout_of(KEY), src.layout_of(OTHER)) == ("ale", "tasks")
    src.stage_input(OTHER, tmp_path / "o")
    assert LocalSource(root, layout="tasks").variants() == [OTHER]
    # an explicit "ale" reads tasks/ as a domain called "tasks"
    assert LocalSource(root, layout="ale").variants() == [KEY, VariantKey("tasks", "dom", "other")]


def test_a_variant_under_both_layouts_is_refused_until_chosen(tmp_path: Path) -> None:
    root = tmp_path / "data"
    ale = make_variant(root, layout="ale")
    tasks = make_variant(root, layout="tasks")
    (tasks / "input" / "a.txt").write_text("tasks")
    src = open_source(f"local:{root}")
    with pytest.raises(DataError) as e:
        src.stage_input(KEY, tmp_path / "x")
    msg = str(e.value)
    assert f"{ale} (ALE layout)" in msg and f"{tasks} (tasks layout)" in msg
    assert "#layout=ale" in msg and "layout='tasks'" in msg
    assert e.value.status is RunStatus.INFRASTRUCTURE_ERROR
    assert not (tmp_path / "x").exists()
    for spec, kw, want in [
        (f"local:{root}#layout=ale", {}, "hello"),
        (f"local:{root}#layout=tasks", {}, "tasks"),
        (f"local:{root}", {"layout": "tasks"}, "tasks"),
        (f"{root}#layout=ale", {"layout": "ale"}, "hello"),
    ]:
        s = open_source(spec, **kw)
        dest = tmp_path / f"d-{len(os.listdir(tmp_path))}"
        s.stage_input(KEY, dest)
        assert (dest / "a.txt").read_text() == want, spec
        assert s.spec == f"local:{root}#layout={s.layout_of(KEY)}"
    # validate names both paths too
    problems = [p for p in validate_root(root) if p.severity == "error"]
    assert len(problems) == 1 and "under both layouts" in problems[0].message
    assert problems[0].path == str(tasks) and str(ale) in problems[0].message


def test_explicit_layout_names_the_path_tried(tmp_path: Path) -> None:
    make_variant(tmp_path / "data", layout="ale")
    src = open_source(f"local:{tmp_path / 'data'}#layout=tasks")
    with pytest.raises(DataError, match=rf"variant folder {tmp_path}/data/tasks/dom/task/v0 not found \(available: no folder"):
        src.stage_input(KEY, tmp_path / "x")
    auto = LocalSource(tmp_path / "data")
    with pytest.raises(DataError) as e:
        auto.stage_input(VariantKey("dom", "task", "v9"), tmp_path / "y")
    assert str(e.value) == (
        f"variant folder for dom/task/v9 not found: neither {tmp_path}/data/dom/task/v9 (ALE layout) nor "
        f"{tmp_path}/data/tasks/dom/task/v9 (tasks layout) exists (available: v0)"
    )


def test_the_layout_is_pinned_once_resolved(tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_variant(root, layout="ale")
    src = LocalSource(root)
    c = src.commit_reference(KEY)
    make_variant(root, layout="tasks")  # appears later: the run keeps reading the ALE folder
    src.stage_reference(KEY, tmp_path / "g", c)
    assert src.layout_of(KEY) == "ale"


def test_spec_options() -> None:
    assert split_spec("local:/data#layout=ale") == ("local:/data", {"layout": "ale"})
    assert split_spec("s3://b/p") == ("s3://b/p", {})
    assert split_spec("/data/odd#name") == ("/data/odd#name", {})  # not an option: part of the path
    with pytest.raises(DataError, match=r"unknown option 'layot' \(known: layout\)"):
        split_spec("local:/d#layot=ale")
    with pytest.raises(DataError, match="unknown layout 'flat': use auto, ale or tasks"):
        open_source("local:/d#layout=flat")
    with pytest.raises(DataError, match="given twice"):
        split_spec("local:/d#layout=ale&layout=tasks")
    with pytest.raises(DataError, match="says layout=ale but layout=tasks was asked for"):
        open_source("local:/d#layout=ale", layout="tasks")
    with pytest.raises(DataError, match="unknown layout 'x'"):
        open_source("s3://bucket/p", layout="x")
    assert open_source("s3://bucket/p#layout=ale").spec == "s3://bucket/p#layout=ale"
    assert open_source("s3://bucket/p#layout=ale").parsed.root == "bucket/p"
    assert open_source("hf://datasets/o/n@main#layout=auto").spec == "hf://datasets/o/n@main"


def test_variant_key_parse_keeps_an_ale_domain_called_tasks() -> None:
    assert VariantKey.parse("tasks/a/b/c") == VariantKey("a", "b", "c")
    assert VariantKey.parse("tasks/b/c") == VariantKey("tasks", "b", "c")
    assert VariantKey("a", "b", "c").relpath_in("ale") == "a/b/c"
    assert VariantKey("a", "b", "c").relpath_in("tasks") == "tasks/a/b/c"


# ----------------------------------------------------------------------------- validate, prefetch, CLI


def test_validate_an_ale_root(tmp_path: Path) -> None:
    root = tmp_path / "data"
    v = make_variant(root, layout="ale")
    seal_variant(v, tmp_path / "s.json", remove_clear=True)
    (root / "README.md").write_text("x")
    assert validate_root(root, require_sealed=True) == []
    assert validate_root(root, layout="ale", require_sealed=True) == []
    tasks_only = validate_root(root, layout="tasks")
    assert [p.message for p in tasks_only if p.severity == "error"] == [
        "missing tasks/ folder (layout: tasks/<domain>/<task>/<variant>/{input,software,reference})"
    ]
    (root / "notes.txt").write_text("x")
    (root / ".git").mkdir()
    msgs = {(Path(p.path).name, p.severity, p.message) for p in validate_root(root)}
    assert ("notes.txt", "warning", "stray entry at the data root (expected domain folders or tasks/)") in msgs
    assert (".git", "warning", "hidden entry at the data root (never read)") in msgs
    empty = tmp_path / "empty"
    empty.mkdir()
    (p,) = validate_root(empty)
    assert p.message == f"no variants found (looked for {empty}/<domain>/<task>/<variant> and {empty}/tasks/<domain>/<task>/<variant>)"
    with pytest.raises(DataError, match="unknown layout"):
        validate_root(root, layout="flat")


def test_cli_validate_and_pull_with_layouts(tmp_path: Path) -> None:
    runner = CliRunner()
    root = tmp_path / "data"
    make_variant(root, "dom/mytask/0", layout="ale")
    r = runner.invoke(data_app, ["validate", str(root), "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == []
    r = runner.invoke(data_app, ["validate", str(root), "--layout", "tasks"])
    assert r.exit_code == 1 and "missing tasks/ folder" in r.output
    r = runner.invoke(data_app, ["validate", str(root), "--layout", "flat"])
    assert r.exit_code == 1 and "unknown layout 'flat'" in r.output
    task = tmp_path / "tasks" / "dom" / "mytask"
    task.mkdir(parents=True)
    (task / "main.py").write_text(
        "import cua_bench as cb\n"
        "@cb.tasks_config\n"
        "def load():\n"
        "    return [cb.Task(description='do it', metadata={})]\n"
        "@cb.evaluate_task\n"
        "def evaluate(cfg, session):\n"
        "    return [1.0]\n"
    )
    r = runner.invoke(data_app, ["pull", str(task), "--data", f"local:{root}"])
    assert r.exit_code == 0, r.output
    assert f"tasks/dom/mytask/0: local, nothing to fetch: {root}/dom/mytask/0 (ale layout)" in r.output
    r = runner.invoke(data_app, ["pull", str(task), "--data", f"local:{root}", "--layout", "tasks"])
    assert r.exit_code == 1 and f"{root}/tasks/dom/mytask/0 not found" in r.output


def test_prefetch_reports_the_layout(tmp_path: Path) -> None:
    make_variant(tmp_path / "data", layout="ale")
    lines: list[str] = []
    assert prefetch(f"local:{tmp_path / 'data'}", [KEY], say=lines.append) == 0
    assert lines == [f"tasks/dom/task/v0: local, nothing to fetch: {tmp_path}/data/dom/task/v0 (ale layout)"]


# ----------------------------------------------------------------------------- ALE's archive password


@pytest.fixture
def ale_sealed(tmp_path: Path, monkeypatch) -> tuple[LocalSource, Path, dict[str, bytes]]:
    monkeypatch.delenv("ALE_REFERENCE_ARCHIVE_PASSWORD", raising=False)
    v = make_variant(tmp_path / "data", layout="ale")
    clear = tree_of(v / "reference")
    make_ale_archive(v)
    store = tmp_path / "grader" / "secrets.json"  # the grader never sealed this archive
    return LocalSource(tmp_path / "data", secret_store=store), v / "reference.7z", clear


def test_ale_archive_opens_with_the_environment_password(ale_sealed, tmp_path: Path, monkeypatch) -> None:
    src, archive, clear = ale_sealed
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", ALE_PASSWORD)
    c = src.commit_reference(KEY)
    assert c is not None and c.kind == "archive" and c.files == 0
    src.stage_reference(KEY, tmp_path / "g" / "reference", c)
    assert tree_of(tmp_path / "g" / "reference") == clear
    assert os.listdir(tmp_path / "g") == ["reference"]


def test_wrong_environment_password_is_grading_failed(ale_sealed, tmp_path: Path, monkeypatch) -> None:
    src, archive, _ = ale_sealed
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", "not-it")
    with pytest.raises(ReferenceError) as e:
        src.stage_reference(KEY, tmp_path / "g" / "reference", src.commit_reference(KEY))
    assert e.value.status is RunStatus.GRADING_FAILED
    msg = str(e.value)
    assert f"reference archive {archive}" in msg and "wrong password or corrupt archive" in msg
    assert "password from the environment variable ALE_REFERENCE_ARCHIVE_PASSWORD" in msg
    assert "not-it" not in msg
    assert os.listdir(tmp_path / "g") == []


def test_no_password_anywhere_names_both_places(ale_sealed, tmp_path: Path, monkeypatch) -> None:
    src, archive, _ = ale_sealed
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", "")  # empty counts as unset
    with pytest.raises(ReferenceError) as e:
        src.stage_reference(KEY, tmp_path / "g" / "reference", src.commit_reference(KEY))
    msg = str(e.value)
    assert f"no password for reference archive {archive}" in msg
    assert "secret store" in msg and "ALE_REFERENCE_ARCHIVE_PASSWORD is not set" in msg
    assert e.value.status is RunStatus.GRADING_FAILED


def test_the_secret_store_takes_precedence(ale_sealed, tmp_path: Path, monkeypatch) -> None:
    src, archive, clear = ale_sealed
    c = src.commit_reference(KEY)
    assert src.secret_store is not None
    SecretStore(src.secret_store).put(c.sha256, ALE_PASSWORD, variant="ale")
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", "not-it")
    src.stage_reference(KEY, tmp_path / "g" / "reference", c)
    assert tree_of(tmp_path / "g" / "reference") == clear
    # ...and a wrong store entry is not rescued by a right environment password
    SecretStore(src.secret_store).put(c.sha256, "stale", variant="ale")
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", ALE_PASSWORD)
    with pytest.raises(ReferenceError, match=r"password from the grader secret store .*wrong password"):
        src.stage_reference(KEY, tmp_path / "g2" / "reference", c)
    # a store readable by others is an error, never skipped for the environment
    src.secret_store.chmod(0o644)
    with pytest.raises(ReferenceError, match="chmod 600"):
        src.stage_reference(KEY, tmp_path / "g3" / "reference", c)


def test_unseal_uses_the_environment_password_too(ale_sealed, tmp_path: Path, monkeypatch) -> None:
    src, archive, clear = ale_sealed
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", ALE_PASSWORD)
    unseal_variant(archive.parent, src.secret_store)
    assert tree_of(archive.parent / "reference") == clear


# ----------------------------------------------------------------------------- import graph


def _data_imports() -> dict[str, list[tuple[str, bool]]]:
    """module -> [(imported module, at top level)] for every module of ale.data."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted(DATA_SRC.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        top = {id(n) for n in tree.body}
        found: list[tuple[str, bool]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(a.name, id(node) in top) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"{path.name}: relative import"
                base = node.module or ""
                found += [(f"{base}.{a.name}" if base == "ale.data" else base, id(node) in top) for a in node.names]
        out[f"ale.data.{path.stem}"] = found
    return out


def test_data_never_imports_docker_or_the_sandbox() -> None:
    bad = [
        f"{m} imports {name}"
        for m, names in _data_imports().items()
        for name, _ in names
        if name == "docker" or name.startswith(("docker.", "ale.sandbox", "ale.runs", "ale.cli"))
    ]
    assert not bad, bad
    for path in DATA_SRC.glob("*.py"):
        assert "docker.errors" not in path.read_text() and "from_env" not in path.read_text(), path


def test_data_modules_import_each_other_at_top_level_without_cycles() -> None:
    graph = _data_imports()
    local = [f"{m} imports {n} inside a function" for m, ns in graph.items() for n, top in ns if n.startswith("ale.") and not top]
    assert not local, local
    edges = {m: {n for n, _ in ns if n in graph and n != m} for m, ns in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges[m]):
            assert state.get(d) != 1, "import cycle: " + " -> ".join([*stack, m, d])
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    assert edges["ale.data.sources"] >= {"ale.data.local", "ale.data.remote", "ale.data.baked"}
    assert "ale.data.sources" not in set().union(*(edges[m] for m in edges if m != "ale.data.sources"))


def test_opening_every_source_loads_no_docker_sdk(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, ale.data.sources, ale.data.validate, ale.data.baked\n"
        f"ale.data.sources.open_source({str(tmp_path)!r})\n"
        "assert 'docker' not in sys.modules, sorted(m for m in sys.modules if m.startswith('docker'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(DATA_SRC.parents[1])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
