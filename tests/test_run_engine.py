"""One run engine (issue 29): the run, the grading probe and the regrade are kinds of
one driver (``ale.runs.lifecycle.drive``) over the step library in ``ale/runs/steps/``;
what differs between them is data (``ale.phases.kind_steps``) and a small finisher.
These rules keep it so; the behaviour itself is tested by the runs, probes and
regrades of the other files (test_run_e2e, test_task_check_adversarial, test_regrade,
test_shared_packages)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ale.phases import Phase, RunKind, RunShape, kind_steps, phase_table
from ale.runs import lifecycle

RUNS = Path(__file__).resolve().parents[1] / "src" / "ale" / "runs"
# The kinds' own steps (their finishers hand them to the driver); every other step is the library's.
OWN_STEPS = {
    RunKind.GRADING_PROBE: {"write_output"},
    RunKind.REGRADE: {"apply_start_writes", "compare_input", "compare_reference"},
}
# What a kind's finisher may call in the driver: the preflight, the state and folder
# set-up, the driver, the classifier, the cleanup (never a step).
DRIVER_API = {"prepare", "check_card", "task_environment", "new_state", "make_dirs", "drive", "classify_failure",
              "status_after_agent", "cleanup", "PreflightError", "Step"}


def test_a_run_is_its_shapes_phase_table() -> None:
    for shape in RunShape:
        rows = kind_steps(RunKind.RUN, shape)
        assert [(r.phase, r.gate, r.releases_sandbox) for r in rows] == \
            [(s.phase, s.gate, s.releases_sandbox) for s in phase_table(shape)]
        assert all(r.step == r.phase for r in rows)


@pytest.mark.parametrize("kind", [RunKind.GRADING_PROBE, RunKind.REGRADE])
def test_every_step_of_a_kind_is_the_librarys_or_its_own(kind: RunKind) -> None:
    names = [r.step for r in kind_steps(kind)]
    assert set(names) - set(lifecycle.LIBRARY) == OWN_STEPS[kind]
    assert not any(r.releases_sandbox or r.gate for r in kind_steps(kind)), "no candidate sandbox, no seal to gate on"


def test_a_grading_probe_is_graded_by_the_runs_own_grade_step() -> None:
    (grade,) = [r for r in kind_steps(RunKind.GRADING_PROBE) if r.phase is Phase.GRADE]
    assert lifecycle.LIBRARY[grade.step] is lifecycle.STEPS[Phase.GRADE]


def _calls_into_lifecycle(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "lifecycle"}


@pytest.mark.parametrize("module", ["grading_only.py", "regrade.py"])
def test_a_kinds_finisher_sequences_no_step_and_takes_no_private_name(module: str) -> None:
    used = _calls_into_lifecycle(RUNS / module)
    assert used <= DRIVER_API, f"{module} reaches into the driver for {sorted(used - DRIVER_API)}"
    assert not any(n.startswith("_") for n in used)


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno is not None]


def test_the_driver_and_its_steps_stay_small() -> None:
    assert len((RUNS / "lifecycle.py").read_text().splitlines()) <= 400
    big = {p.name: n for p in (RUNS / "steps").glob("*.py") if (n := len(p.read_text().splitlines())) > 200}
    assert not big, f"step modules over 200 lines: {big}"
    long = [f"{p.relative_to(RUNS)}:{name} ({n} lines)" for p in RUNS.rglob("*.py") for name, n in _functions(p) if n > 80]
    assert not long, f"functions over 80 lines in runs/: {long}"
