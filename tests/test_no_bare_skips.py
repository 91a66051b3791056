"""Nothing skips under ALE_CI=1 but what tests/cannot_run_here.py names (issue 27,
item 2): a test lacking a capability calls conftest's ``require`` (or carries the
``requires`` marker), which fails in CI; no test module skips on its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cannot_run_here
from tests.conftest import REPO

TESTS = REPO / "tests"
# Where a skip may be written: conftest's require (the capability rule, a failure in
# CI) and its skip of exactly what the one list names.
ALLOWED = {TESTS / "conftest.py"}
BARE = re.compile(r"pytest\s*\.\s*(skip\s*\(|importorskip\b|mark\s*\.\s*skip(if)?\b)|\bskipif\b|unittest\s*\.\s*skip|SkipTest\b")


def bare_skips(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path in ALLOWED or path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if BARE.search(line):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_no_test_skips_outside_conftest_and_the_one_list() -> None:
    assert bare_skips(TESTS) == [], "use tests/conftest.py's require / the requires marker, or tests/cannot_run_here.py"


def test_the_grep_finds_each_way_of_skipping(tmp_path: Path) -> None:
    ways = ['pytest.skip("x")', "pytest.importorskip('docker')", "@pytest.mark.skipif(True, reason='x')",
            "@pytest.mark.skip(reason='x')", "@unittest.skip('x')", "raise unittest.SkipTest('x')"]
    for i, way in enumerate(ways):
        (tmp_path / f"t{i}.py").write_text(f"import pytest, unittest\n{way}\n")
    assert len(bare_skips(tmp_path)) == len(ways)


def test_the_list_matches_node_ids_and_their_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cannot_run_here, "CANNOT_RUN_HERE", {"tests/test_a.py::test_b": "no such thing here"})
    assert cannot_run_here.why_not_here("tests/test_a.py::test_b") == "no such thing here"
    assert cannot_run_here.why_not_here("tests/test_a.py::test_b[runsc]") == "no such thing here"
    assert cannot_run_here.why_not_here("tests/test_a.py::test_bc") is None
    assert any("test_b: no such thing here" in line for line in cannot_run_here.header())


def test_a_listed_test_skips_even_under_ale_ci_and_the_header_names_it(tmp_path: Path) -> None:
    """In a throwaway pytest session with this conftest: the listed test skips under
    ALE_CI=1, the header prints it, and an unlisted ``require`` fails."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    for name in ("conftest.py", "cannot_run_here.py"):
        (tmp_path / "tests" / name).write_text((TESTS / name).read_text())
    listed = tmp_path / "tests" / "cannot_run_here.py"
    listed.write_text(listed.read_text().replace(
        "CANNOT_RUN_HERE: dict[str, str] = {}",
        'CANNOT_RUN_HERE: dict[str, str] = {"tests/test_x.py::test_listed": "needs a GPU"}'))
    (tmp_path / "tests" / "test_x.py").write_text(
        "from tests.conftest import require\n\n\ndef test_listed():\n    raise AssertionError('ran')\n\n\n"
        "def test_unlisted():\n    require(False, 'a capability')\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "tests/test_x.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "ALE_CI": "1", "PYTHONPATH": str(tmp_path)})
    assert "tests/test_x.py::test_listed: needs a GPU" in out.stdout, out.stdout
    assert "1 failed, 1 skipped" in out.stdout, out.stdout
    assert "CI lacks a capability this test needs: a capability" in out.stdout
