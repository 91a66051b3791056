"""`ale data validate|seal|unseal|pull` and validate_root."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from ale.cli.data import data_app
from ale.data.sealing import seal_variant
from ale.data.validate import validate_root
from tests.test_data_support import make_variant, tree_of

runner = CliRunner()


def _msgs(problems) -> list[str]:
    return [f"{p.severity}:{Path(p.path).name}:{p.message}" for p in problems]


def test_validate_root_finds_problems(tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_variant(root, "d/t/ok")
    v = make_variant(root, "d/t/noref", reference=False)
    (root / "tasks" / "d" / "t" / "stray.txt").write_text("x")
    (v / "notes.md").write_text("x")
    nin = make_variant(root, "d/t/noinput")
    import shutil

    shutil.rmtree(nin / "input")
    (root / "junk.bin").write_text("x")
    big = make_variant(root, "d/u/big", big=3000)
    os.symlink("/etc/passwd", big / "input" / "link")
    msgs = _msgs(validate_root(root, huge_bytes=100_000))
    joined = "\n".join(msgs)
    assert "error:reference:missing reference (neither reference/ nor reference.7z)" in msgs
    assert "error:input:missing input folder" in msgs
    assert "warning:notes.md" in joined and "warning:junk.bin" in joined
    assert "error:stray.txt:stray file at the variant level" in joined
    assert "warning:b.bin:huge file" in joined
    assert "error:link:symbolic link" in joined
    assert not any("unsealed" in m or "not sealed" in m for m in msgs)
    sealed = _msgs(validate_root(root, require_sealed=True))
    assert sum("reference is not sealed" in m for m in sealed) == 3


def test_validate_checks_manifest_and_sealed_root(tmp_path: Path) -> None:
    root = tmp_path / "data"
    v = make_variant(root)
    seal_variant(v, tmp_path / "s.json", remove_clear=True)
    assert validate_root(root, require_sealed=True) == []
    (v / "input" / "a.txt").write_text("changed")
    assert any("differs from manifest.json" in p.message for p in validate_root(root))


def test_cli_validate_seal_unseal(tmp_path: Path) -> None:
    root = tmp_path / "data"
    v = make_variant(root)
    clear = tree_of(v / "reference")
    store = tmp_path / "store.json"
    r = runner.invoke(data_app, ["validate", str(root), "--require-sealed"])
    assert r.exit_code == 1 and "not sealed" in r.output
    r = runner.invoke(data_app, ["seal", str(v), "--secret-store", str(store), "--remove-clear"])
    assert r.exit_code == 0, r.output
    assert "sha256" in r.output and not (v / "reference").exists()
    r = runner.invoke(data_app, ["validate", str(root), "--require-sealed", "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == []
    r = runner.invoke(data_app, ["unseal", str(v), "--secret-store", str(store)])
    assert r.exit_code == 0, r.output
    assert tree_of(v / "reference") == clear
    assert "already exists" in runner.invoke(data_app, ["unseal", str(v), "--secret-store", str(store)]).output
    import shutil

    shutil.rmtree(v / "reference")
    r = runner.invoke(data_app, ["unseal", str(v), "--secret-store", str(tmp_path / "other.json")])
    assert r.exit_code == 1 and "no password" in r.output


def test_cli_pull_task_dir(tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_variant(root, "dom/mytask/0")
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
    assert "tasks/dom/mytask/0: local" in r.output
    r = runner.invoke(data_app, ["pull", str(task)])
    assert r.exit_code == 1 and "pass --data" in r.output
    r = runner.invoke(data_app, ["pull", str(task), "--data", f"local:{tmp_path / 'nothing'}"])
    assert r.exit_code == 1 and "not found" in r.output
