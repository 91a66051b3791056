"""Benchmarks write their figures to their own output (bench/results/<name>.{json,md}),
never into docs/benchmarks.md, whose hand-written context a rewrite would delete."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
DOC = REPO / "docs" / "benchmarks.md"


def _publish_module():
    spec = importlib.util.spec_from_file_location("bench_publish", BENCH / "publish.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_publish_writes_the_figures_and_the_tables_and_nothing_else(tmp_path: Path) -> None:
    js, md = _publish_module().publish("demo", {"ratio": 1.5}, "| a | b |\n| --- | --- |\n| 1 | 2 |\n", results=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.json", "demo.md"]
    record = json.loads(js.read_text())
    assert record["benchmark"] == "demo" and record["figures"] == {"ratio": 1.5}
    assert record["measured_at"] and record["host"]["cpus"]
    text = md.read_text()
    assert "written by bench/demo.py" in text and "| 1 | 2 |" in text


def _string_constants_outside_docstrings(tree: ast.AST) -> list[str]:
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_no_benchmark_writes_the_hand_written_document() -> None:
    """A path to docs/benchmarks.md in a script's code (not its docstring or help)
    is how each of them used to rewrite its section."""
    offenders = []
    for script in sorted(BENCH.glob("*.py")):
        tree = ast.parse(script.read_text())
        consts = _string_constants_outside_docstrings(tree)
        builds_path = any(c == "benchmarks.md" for c in consts)
        if builds_path or re.search(r"""["']docs/benchmarks\.md["']""", script.read_text()):
            offenders.append(script.name)
    assert offenders == []


def test_the_writers_publish_under_their_own_name() -> None:
    for name in ("overhead", "throughput", "staging", "gateway", "cluster", "desktop", "software", "gvisor",
                 "shared_packages"):
        text = (BENCH / f"{name}.py").read_text()
        assert f'publish("{name}"' in text, name


def test_every_committed_result_is_cited_by_the_document() -> None:
    doc = DOC.read_text()
    for md in sorted((BENCH / "results").glob("*.md")):
        assert (md.with_suffix(".json")).is_file(), md
        assert f"bench/results/{md.stem}" in doc, f"docs/benchmarks.md cites no bench/results/{md.stem}"


def test_every_section_names_the_script_that_measures_it() -> None:
    """A figure with no script that measures it has no place in the document: every
    section with a table names a bench script (or the test) that produces it, and
    each named script exists."""
    doc = DOC.read_text()
    sections = re.split(r"\n(?=## )", doc)[1:]
    for sec in sections:
        if "|" not in sec:
            continue
        named = re.findall(r"`(bench/[\w./]+\.py)|`(tests/test_\w+\.py)::", sec)
        assert named, f"section {sec.splitlines()[0]!r} names no script that measures it"
        for bench, test in named:
            assert (REPO / (bench or test)).is_file(), bench or test
