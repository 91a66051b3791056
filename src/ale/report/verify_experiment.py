"""`ale verify EXP_DIR`: re-derive an experiment's stored report from its verified runs.

Every run folder under ``runs/`` is verified as ``ale verify RUN_DIR`` would (its
regrades included; ``--trusted-keys`` for runs signed by cluster nodes), then the
report is computed again from the runs that verify, and only those, with the
experiment's own report options (``experiment.json``) and each run's latest
grading (``ale.runs.regrade.apply_latest_grading``); every figure is compared with
the stored ``report.json``: the runs and their rows, the regrades, each agent's
mean, interval, pass rate, pass@k, statuses, flagged and counted runs, each item's
scores and tier, the tiers, the counts. The first figure that differs is named,
with why (a run that no longer verifies, a run removed, a run added, a report
edited by hand or written under another counting policy).

``experiment_report`` and ``report_json`` are also what ``ale exp run`` and ``ale
regrade EXP_DIR`` store, so the stored report and its re-derivation are one code path.
It needs no Docker engine and no network: a copied folder verifies.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale import layout
from ale.record.trusted_keys import signer_key
from ale.record.verify import VerifyReport, verify_run_dir
from ale.report.aggregate import Report, aggregate
from ale.report.render import to_json
from ale.result import SCORE_EPSILON, RunResult
from ale.runs.experiment import ReportSpec
from ale.runs.regrade import apply_latest_grading, regrade_summary
from ale.runs.store import read_result, read_units, runs_root

REGRADES_KEY = "regrades"  # report.json: how many runs were regraded, with which task code
_IGNORED = ("generated_at",)  # when the report was written: not a figure


# -- the stored report --------------------------------------------------------------
def _record(exp_dir: Path) -> dict[str, Any]:
    path = exp_dir / layout.EXPERIMENT_RECORD
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _options(exp_dir: Path) -> ReportSpec | None:
    rep = (_record(exp_dir).get("experiment") or {}).get("report")
    return ReportSpec.model_validate(rep) if isinstance(rep, dict) else None


def run_folders(exp_dir: Path) -> list[Path]:
    """Every run folder of the experiment (``runs/<id>/``), sorted."""
    root = runs_root(exp_dir)
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def experiment_report(exp_dir: Path, run_dirs: list[Path] | None = None) -> tuple[Report, dict[str, Any]]:
    """The report over ``run_dirs`` (default: every run folder with a result), each run
    counted with its latest grading; and the regrades' summary beside it."""
    exp_dir = Path(exp_dir)
    results: list[RunResult] = []
    paths: dict[str, str] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for run_dir in run_folders(exp_dir) if run_dirs is None else run_dirs:
        result = read_result(run_dir)
        if result is None:
            continue
        results.append(apply_latest_grading(run_dir, result))
        paths[result.run_id] = run_dir.relative_to(exp_dir).as_posix()
        summary = regrade_summary(run_dir)
        if summary is not None:
            summaries[result.run_id] = summary
    report = aggregate(results, units=read_units(exp_dir), options=_options(exp_dir), run_paths=paths,
                       experiment=_record(exp_dir).get("name"))
    finals = {r.run_id for r in report.runs}
    regraded = {k: v for k, v in sorted(summaries.items()) if k in finals}
    codes: dict[str, int] = {}
    for s in regraded.values():
        code = str(s.get("task_code_sha256"))
        codes[code] = codes.get(code, 0) + 1
    return report, {"runs": len(regraded), "task_code": codes, "regraded": regraded}


def report_json(report: Report, regrades: dict[str, Any]) -> str:
    """``report.json``: the ``Report`` model's JSON plus the regrades' summary."""
    doc = json.loads(to_json(report))
    doc[REGRADES_KEY] = regrades
    return json.dumps(doc, indent=2) + "\n"


def write_report_json(exp_dir: Path, report: Report, regrades: dict[str, Any]) -> Path:
    path = Path(exp_dir) / layout.REPORT_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(report_json(report, regrades))
    tmp.replace(path)
    return path


# -- verifying ------------------------------------------------------------------------
@dataclass
class ExperimentVerification:
    exp_dir: str
    usable: bool = True
    problems: list[str] = field(default_factory=list)  # the first names the first figure that differs
    runs: dict[str, bool] = field(default_factory=dict)  # run folder -> verifies
    run_reasons: dict[str, list[str]] = field(default_factory=dict)
    figures: int = 0  # figures compared
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.usable and not self.problems

    @property
    def exit_code(self) -> int:
        if not self.usable:
            return 2
        return 0 if self.valid else 1

    def to_dict(self) -> dict[str, Any]:
        return {"exp_dir": self.exp_dir, "valid": self.valid, "usable": self.usable, "problems": self.problems,
                "runs": self.runs, "run_reasons": self.run_reasons, "figures": self.figures, "notes": self.notes}


def _verify_one(run_dir: Path, public_key: Path | None, keys: dict[str, bytes]) -> VerifyReport:
    if not keys:
        return verify_run_dir(run_dir, public_key)
    with tempfile.TemporaryDirectory() as tmp:
        key_file = Path(tmp) / "signer.pem"
        key_file.write_bytes(signer_key(run_dir, keys))
        return verify_run_dir(run_dir, key_file, regrade_keys=keys)


def verify_experiment(exp_dir: Path, *, public_key: Path | None = None,
                      trusted: dict[str, bytes] | None = None) -> ExperimentVerification:
    """Verify every run, re-derive the report from the verified ones, compare it with
    the stored one. ``trusted`` (key id -> PEM, e.g. from nodes.json) accepts runs and
    regrades signed by any of its keys; with ``public_key`` too, that key joins the set."""
    exp_dir = Path(exp_dir)
    out = ExperimentVerification(str(exp_dir))
    if not (exp_dir / layout.EXPERIMENT_RECORD).is_file():
        out.usable = False
        out.problems.append(f"{exp_dir} is not an experiment folder (no {layout.EXPERIMENT_RECORD})")
        return out
    stored_path = exp_dir / layout.REPORT_JSON
    try:
        stored = json.loads(stored_path.read_text())
    except FileNotFoundError:
        out.problems.append(f"{layout.REPORT_JSON} is missing: the experiment stored no report to re-derive")
        return out
    except (OSError, ValueError) as e:
        out.problems.append(f"{layout.REPORT_JSON} is not readable JSON ({e}): edited by hand")
        return out
    keys = dict(trusted or {})
    if keys and public_key is not None:
        from ale.record.signing import load_public_key, public_key_pem, public_key_sha256

        k = load_public_key(public_key)
        keys[public_key_sha256(k)] = public_key_pem(k)
    verified: list[Path] = []
    for run_dir in run_folders(exp_dir):
        rel = run_dir.relative_to(exp_dir).as_posix()
        report = _verify_one(run_dir, public_key, keys)
        out.runs[rel] = report.valid
        if report.valid:
            verified.append(run_dir)
        else:
            out.run_reasons[rel] = report.reasons[:5] or ["unusable"]
    recomputed, regrades = experiment_report(exp_dir, verified)
    fresh = json.loads(report_json(recomputed, regrades))
    if REGRADES_KEY not in stored and not regrades["runs"]:
        del fresh[REGRADES_KEY]  # a report written before regrades existed, of runs never regraded
    diffs = _diff(_keyed(stored), _keyed(fresh))
    out.figures = _count(_keyed(fresh))
    for path, was, now in diffs:
        if now is _ABSENT and isinstance(was, dict):
            what = "is in the stored report, not among the verified runs' figures"
        elif was is _ABSENT and isinstance(now, dict):
            what = "is not in the stored report, yet the verified runs make it"
        else:
            what = f"the stored report says {_show(was)}, recomputed from the verified runs {_show(now)}"
        out.problems.append(f"{path}: {what}: {_why(exp_dir, path, stored, out)}")
    for rel, reasons in out.run_reasons.items():
        out.problems.append(f"run {rel} does not verify: {reasons[0]}")
    if regrades["runs"]:
        out.notes.append(f"{regrades['runs']} run(s) counted with a regrade, with task code "
                         + ", ".join(f"{c[:12]}… ({n})" for c, n in regrades["task_code"].items()))
    return out


# -- comparing --------------------------------------------------------------------------
def _keyed(doc: Any) -> Any:
    """The report with its lists keyed by what names their entries (agents by agent,
    items by item, runs by run id), so that a difference is named, not numbered."""
    if not isinstance(doc, dict):
        return doc
    d = {k: v for k, v in doc.items() if k not in _IGNORED}
    by = {"agents": "agent", "items": "item", "runs": "run_id", "invalid_runs": "run_id", "flagged_runs": "run_id",
          "warned_runs": "run_id"}
    for key, name in by.items():
        if isinstance(d.get(key), list) and all(isinstance(x, dict) and name in x for x in d[key]):
            d[key] = {str(x[name]): x for x in d[key]}
    # the runs first: a removed or tampered run explains the figures after it
    order = ["runs", REGRADES_KEY, "total_runs", "attempts", "agents", "items", "tiers"]
    return {k: d[k] for k in [*[o for o in order if o in d], *[k for k in d if k not in order]]}


def _count(doc: Any) -> int:
    if isinstance(doc, dict):
        return sum(_count(v) for v in doc.values())
    if isinstance(doc, list):
        return sum(_count(v) for v in doc) or 1
    return 1


_ABSENT = object()


def _diff(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in [*a, *[k for k in b if k not in a]]:
            sub = f"{path}[{k}]" if path in ("runs", "agents", "items", "invalid_runs", "flagged_runs", "warned_runs",
                                                 f"{REGRADES_KEY}.regraded") else (f"{path}.{k}" if path else str(k))
            out += _diff(a.get(k, _ABSENT), b.get(k, _ABSENT), sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    if _same(a, b):
        return []
    return [(path, a, b)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=SCORE_EPSILON, abs_tol=SCORE_EPSILON)
    return bool(a == b) and type(a) is type(b)


def _show(v: Any) -> str:
    if v is _ABSENT:
        return "nothing"
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _why(exp_dir: Path, path: str, stored: dict[str, Any], out: ExperimentVerification) -> str:
    """Why a figure differs: the run it concerns (removed, not verifying, added), else
    a report that is not what its runs make (edited by hand, or another policy)."""
    stored_runs = {r.get("run_id"): r for r in stored.get("runs", []) if isinstance(r, dict)}
    failing = {Path(rel).name: reasons for rel, reasons in out.run_reasons.items()}
    run_id = path[len("runs["):].split("]", 1)[0] if path.startswith("runs[") else None
    if run_id is not None:
        if run_id in failing:
            return f"run {run_id} no longer verifies ({failing[run_id][0]})"
        row = stored_runs.get(run_id)
        if row is not None and not (exp_dir / str(row.get("path") or Path(layout.RUNS_DIR, run_id))).exists():
            return f"run {run_id} was removed from the experiment folder"
        if row is None:
            return f"run {run_id} is not in the stored report: added after the report was written"
        stale = _stale_regrade(exp_dir, run_id, row, stored)
        if stale:
            return stale
    if failing:
        return f"{len(failing)} run(s) do not verify and are left out ({', '.join(sorted(failing)[:3])})"
    missing = [str(rid) for rid, r in stored_runs.items()
               if not (exp_dir / str(r.get("path") or Path(layout.RUNS_DIR, str(rid)))).exists()]
    if missing:
        return f"run(s) removed from the experiment folder: {', '.join(missing[:3])}"
    top = path.split(".", 1)[0].split("[", 1)[0]
    if top not in stored:
        return (f"the stored report has no {top!r}: it was written by another ale version "
                "(`ale exp run` of the same file rewrites it, running nothing)")
    if path.startswith(f"{REGRADES_KEY}."):
        for rid, row in stored_runs.items():
            stale = _stale_regrade(exp_dir, str(rid), row, stored)
            if stale:
                return stale
    if path.startswith("counting_policy"):
        return "the report was written under another counting policy (another ale version)"
    return "the stored report is not what its verified runs make: it was edited by hand, or written before a regrade"


def _stale_regrade(exp_dir: Path, run_id: str, row: dict[str, Any], stored: dict[str, Any]) -> str:
    """A run regraded after the report was written: say so ("" when not)."""
    run_dir = exp_dir / str(row.get("path") or Path(layout.RUNS_DIR, run_id))
    summary = regrade_summary(run_dir) if run_dir.is_dir() else None
    if summary is None:
        return ""
    known = ((stored.get(REGRADES_KEY) or {}).get("regraded") or {}).get(run_id) or {}
    if known.get("regrades") == summary.get("regrades"):
        return ""
    return (f"run {run_id} was regraded (regrade {summary.get('regrades')}) after the report was written: "
            "the report is stale (`ale exp run` of the same file rewrites it, running nothing)")
