"""Report numbers against values computed by hand; invalid runs never scored."""

from __future__ import annotations

import csv
import io
import itertools
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

import ale
from ale.report import aggregate, bootstrap_ci, load_report, pass_at_k, to_csv, to_html, to_json
from ale.result import RunResult
from ale.runs.experiment import ReportSpec, TierSpec
from ale.runs.store import UnitInfo, write_units
from ale.status import RunStatus

S, INV, AF, GF, INF = (RunStatus.SCORED, RunStatus.INVALID_EVALUATION_ENVIRONMENT, RunStatus.AGENT_FAILED,
                       RunStatus.GRADING_FAILED, RunStatus.INFRASTRUCTURE_ERROR)

# (task, agent, repeat) -> list of (status, score) attempts; the last attempt is final.
# Invalid runs carry a score on purpose: the admission rule must drop them anyway.
TABLE = {
    ("t1", "A", 0): [(S, 1.0)], ("t1", "A", 1): [(S, 0.5)],
    ("t2", "A", 0): [(S, 0.0)], ("t2", "A", 1): [(S, 0.0)],
    ("t3", "A", 0): [(S, 1.0)], ("t3", "A", 1): [(INV, 0.0)],
    ("t4", "A", 0): [(S, 0.1)], ("t4", "A", 1): [(S, 0.1)],
    ("t5", "A", 0): [(INV, 1.0)], ("t5", "A", 1): [(INV, 1.0)],
    ("t1", "B", 0): [(S, 0.25)], ("t1", "B", 1): [(S, 0.25)],
    ("t2", "B", 0): [(S, 0.5)], ("t2", "B", 1): [(AF, 0.5)],
    ("t3", "B", 0): [(INV, 1.0)], ("t3", "B", 1): [(INV, 1.0)],
    ("t4", "B", 0): [(S, 0.0)], ("t4", "B", 1): [(GF, None)],
    ("t5", "B", 0): [(INF, None), (INF, None)], ("t5", "B", 1): [(INF, None)],
}


def build() -> tuple[list[RunResult], dict[str, UnitInfo]]:
    results, units = [], {}
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for (task, agent, rep), attempts in TABLE.items():
        unit = f"{task}-v0-{agent}-r{rep}"
        units[unit] = UnitInfo(unit, task, 0, agent, rep)
        for i, (status, score) in enumerate(attempts, start=1):
            results.append(RunResult(
                run_id=f"{unit}-a{i}", task_id=task, task_dir=f"/tasks/{task}", variant=0, agent=agent,
                status=status, score=score, scores=None if score is None else [score],
                started_at=now, ended_at=now, harness_version=ale.__version__, attempt=i,
            ))
    return results, units


@pytest.fixture
def report():
    results, units = build()
    return aggregate(results, units=units, run_paths={r.run_id: f"runs/{r.run_id}" for r in results},
                     experiment="hand")


def test_counts_include_every_final_run(report) -> None:
    assert report.total_runs == 20 and report.attempts == 21
    assert report.counts_by_status == {
        "scored": 11, "invalid_evaluation_environment": 5, "agent_failed": 1,
        "timeout": 0, "grading_failed": 1, "infrastructure_error": 2,
    }
    assert sorted(r.run_id for r in report.invalid_runs) == sorted(
        ["t3-v0-A-r1-a1", "t5-v0-A-r0-a1", "t5-v0-A-r1-a1", "t3-v0-B-r0-a1", "t3-v0-B-r1-a1"])
    assert all(not r.counted for r in report.invalid_runs)


def test_means_pass_rates_and_pass_at_k_by_hand(report) -> None:
    a, b = report.agents
    assert (a.agent, b.agent) == ("A", "B")
    # A: items t1 (1.0+0.5)/2, t2 0, t3 1.0 (the invalid 0.0 is not counted), t4 0.1; t5 has none.
    assert a.mean == pytest.approx((0.75 + 0.0 + 1.0 + 0.1) / 4)
    assert a.items == 4 and a.counted == 7 and a.runs == 10
    assert a.pass_rate == pytest.approx((1 + 0 + 1 + 0) / 4)
    assert a.pass_at_k == pytest.approx({1: 0.5, 2: 1 / 3})
    # B: t1 0.25, t2 (0.5 scored + 0.5 agent_failed) 0.5, t4 0.0 (grading_failed dropped).
    assert b.mean == pytest.approx((0.25 + 0.5 + 0.0) / 3)
    assert b.items == 3 and b.counted == 5 and b.runs == 10
    assert b.pass_rate == pytest.approx(1 / 3)
    assert b.pass_at_k == pytest.approx({1: 1 / 3, 2: 0.5})


def test_interval_uses_only_valid_item_scores(report) -> None:
    """A's items are 0.75, 0.0, 1.0 and 0.1 (t3's invalid 0.0 not counted). Their bootstrap
    distribution of the mean, by hand: of the 4**4 = 256 equally likely resamples, 5 have a
    mean below 0.05 (all 0.0: 1; three 0.0 and one 0.1: 4) and 6 more exactly 0.05 (two 0.0,
    two 0.1), so 1.95% lie below 0.05 and 4.3% at or below it: the 2.5% point is 0.05 by any
    quantile definition. At the top, 5 lie above 0.875 (all 1.0: 1; three 1.0 and a 0.75: 4)
    and 6 at it (two 1.0, two 0.75): the 97.5% point is 0.875. 2000 resamples land there.
    With t3's invalid run counted (0.5 for t3) the top would be 0.625."""
    a = report.agents[0]
    means = sorted(sum(pick) / 4 for pick in itertools.product([0.75, 0.0, 1.0, 0.1], repeat=4))
    assert sum(m < 0.05 - 1e-12 for m in means) == 5 and sum(m <= 0.05 + 1e-12 for m in means) == 11
    assert sum(m > 0.875 + 1e-12 for m in means) == 5 and sum(m >= 0.875 - 1e-12 for m in means) == 11
    assert (a.ci_low, a.ci_high) == pytest.approx((0.05, 0.875))
    lo, hi = bootstrap_ci([0.75, 0.0, 1.0, 0.1], samples=2000, seed=0)
    assert 0.0 <= lo <= a.mean <= hi <= 1.0
    # Reproducible, and degenerate when every item agrees.
    assert bootstrap_ci([0.75, 0.0, 1.0, 0.1], samples=2000, seed=0) == (lo, hi)
    assert bootstrap_ci([0.3, 0.3, 0.3], samples=500, seed=1) == pytest.approx((0.3, 0.3))
    assert bootstrap_ci([0.9], samples=500, seed=1) == (0.9, 0.9)


def test_tiers_from_valid_runs_only(report) -> None:
    assert report.tiers == {
        "near-term": ["t3@v0"],  # A's 1.0; B's invalid 1.0s do not count
        "full-spectrum": ["t1@v0", "t2@v0"],
        "last-exam": ["t4@v0"],
        "unclassified": ["t5@v0"],  # only invalid/infra runs: never a tier
    }
    t3 = next(i for i in report.items if i.item == "t3@v0")
    assert t3.agents["B"].mean is None and t3.agents["B"].runs == 2
    assert t3.agents["A"].scores == [1.0]


def test_options_threshold_and_tiers() -> None:
    results, units = build()
    rep = aggregate(results, units=units, options=ReportSpec(pass_threshold=1.0, tiers=TierSpec(near_term_min=0.5, last_exam_below=0.05)))
    a = rep.agents[0]
    assert a.pass_rate == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    assert rep.tiers["near-term"] == ["t1@v0", "t2@v0", "t3@v0"]
    assert rep.tiers["full-spectrum"] == ["t4@v0"] and rep.tiers["last-exam"] == []


def test_pass_at_k_estimator() -> None:
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 2, 3) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_no_repeats_no_pass_at_k() -> None:
    results, units = build()
    firsts = [r for r in results if "-r0-" in r.run_id]
    rep = aggregate(firsts, units={k: v for k, v in units.items() if v.repeat == 0})
    assert all(a.pass_at_k == {} for a in rep.agents)


def test_renderings(report) -> None:
    data = json.loads(to_json(report))
    assert data["agents"][0]["agent"] == "A" and data["counts_by_status"]["scored"] == 11
    rows = list(csv.DictReader(io.StringIO(to_csv(report))))
    assert len(rows) == 20
    inv = next(r for r in rows if r["run_id"] == "t5-v0-A-r0-a1")
    assert inv["counted"] == "False" and inv["status"] == "invalid_evaluation_environment"
    html = to_html(report, link_base="../exp/")
    assert '<svg id="heatmap"' in html and '<svg id="histogram"' in html
    assert 'href="../exp/runs/t1-v0-A-r0-a1/trajectory.json"' in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing fetched
    assert "<script" not in html
    # Each agent's invalid runs are shown beside its mean, never inside it.
    agents_table = html.split("<table id='agents'>")[1].split("</table>")[0]
    for a in report.agents:
        n = a.statuses.get("invalid_evaluation_environment", 0)
        row = agents_table.split(f"<tr><td>{a.agent}</td>")[1].split("</tr>")[0]
        assert row.endswith(f">{n}</td><td class='num'>{a.flagged}</td>"), row
    assert sum(a.statuses.get("invalid_evaluation_environment", 0) for a in report.agents) == 5


def test_load_report_from_folders(tmp_path: Path) -> None:
    results, units = build()
    runs = tmp_path / "runs"
    for r in results:
        d = runs / r.run_id
        d.mkdir(parents=True)
        (d / "result.json").write_text(r.model_dump_json())
    (runs / "t9-v0-A-r0-a1").mkdir()  # half-done: no result.json, not in the report
    write_units(tmp_path, units)
    (tmp_path / "experiment.json").write_text(json.dumps({"name": "hand", "experiment": {"report": {"pass_threshold": 0.05}}}))
    rep = load_report(tmp_path)
    assert rep.experiment == "hand" and rep.total_runs == 20 and rep.pass_threshold == 0.05
    assert rep.runs[0].trajectory == f"runs/{rep.runs[0].run_id}/trajectory.json"
    with pytest.raises(FileNotFoundError):
        load_report(tmp_path / "nope")


def test_runs_with_warnings_are_listed_beside_the_numbers() -> None:
    """A run scored with part of its deliverables left out at a limit counts as it is,
    and the report says which runs carry warnings (JSON, HTML)."""
    results, units = build()
    warned = next(r for r in results if r.run_id == "t1-v0-A-r0-a1")
    warned.extra["warnings"] = ["deliverables: 16 entries of the workspace not copied at a limit (<cap>: a/b)"]
    rep = aggregate(results, units=units, run_paths={r.run_id: f"runs/{r.run_id}" for r in results})
    assert [r.run_id for r in rep.warned_runs] == ["t1-v0-A-r0-a1"]
    assert next(a for a in rep.agents if a.agent == "A").mean == next(
        a for a in aggregate(build()[0], units=units).agents if a.agent == "A").mean  # counted as it is
    assert json.loads(to_json(rep))["warned_runs"][0]["warnings"][0].startswith("deliverables: 16 entries")
    html = to_html(rep)
    assert "Runs with warnings (1)" in html and "&lt;cap&gt;" in html


def test_cost_sums_per_agent_and_task_and_provider_failures_are_counted_apart():
    from ale.status import ModelFailure

    now = datetime(2026, 1, 1, tzinfo=UTC)

    def run(rid, task, agent, status, score, attempt=1, failure=None, usage=None):
        extra = {"billing": {"total": usage, "by_model": {}, "price_table": {"version": "v1", "sha256": "0" * 64}}} if usage else {}
        return RunResult(run_id=rid, task_id=task, task_dir=f"/tasks/{task}", variant=0, agent=agent, status=status, score=score,
                         scores=None if score is None else [score], started_at=now, ended_at=now, harness_version=ale.__version__,
                         attempt=attempt, model_failure=failure, extra=extra)

    u = lambda n, c: {"requests": n, "input_tokens": 100 * n, "output_tokens": 10 * n, "cached_input_tokens": n, "cost_usd": c}  # noqa: E731
    results = [
        run("a1", "t1", "A", S, 1.0, usage=u(2, 0.25)),
        run("a2", "t2", "A", INF, None, failure=ModelFailure.RATE_LIMITED, usage=u(1, 0.125)),  # retried below
        run("a2b", "t2", "A", S, 0.0, attempt=2, usage=u(3, 0.5)),
        run("b1", "t1", "B", INF, None, failure=ModelFailure.AUTHENTICATION),
        run("b2", "t2", "B", AF, None, failure=ModelFailure.CONTEXT_LENGTH, usage=u(4, 1.0)),
    ]
    units = {r.run_id: UnitInfo(r.run_id, r.task_id, 0, r.agent, 0) for r in results}
    units["a2b"] = units["a2"] = UnitInfo("a2", "t2", 0, "A", 0)
    rep = aggregate(results, units=units)
    a, b = rep.agents
    assert a.usage == {"requests": 5, "input_tokens": 500, "output_tokens": 50, "cached_input_tokens": 5, "cost_usd": 0.75}
    assert rep.usage_all_attempts["cost_usd"] == 1.875 and rep.usage_all_attempts["requests"] == 10  # the retried attempt spent too
    assert rep.usage_by_task["t2"]["A"]["requests"] == 3 and rep.usage_by_task["t2"]["B"]["cost_usd"] == 1.0 and "B" not in rep.usage_by_task["t1"]
    # The provider's failure is excluded from B's headline and counted apart; the context overflow is named as the agent's.
    assert b.model_failures == {"authentication": 1, "context_length": 1} and rep.counts_by_kind["infrastructure_error/authentication"] == 1
    assert b.counted == 0 and b.mean is None
    html = to_html(rep)
    assert "Cost and model failures" in html and "authentication 1" in html
