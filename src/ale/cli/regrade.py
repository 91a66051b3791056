"""`ale regrade RUN_DIR|EXP_DIR [--tasks PATH] [--reason TEXT]`: grade finished runs
again from their signed deliverables (``ale.runs.regrade``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ale import layout
from ale.cli.output import err, fail


def regrade_command(
    target: Annotated[Path, typer.Argument(
        help="A run folder, or an experiment's output folder (each final run in it).")],
    tasks: Annotated[Path | None, typer.Option(
        "--tasks",
        help="Grade with the same task in this task tree (default: the task folder the run names, "
             "as its code is now).")] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded and signed with the regrade).")] = "",
    signing_key: Annotated[Path | None, typer.Option(
        "--signing-key", help="Sign the regrade with this key (default: the run's, else the operator's).")] = None,
    public_key: Annotated[Path | None, typer.Option(
        "--public-key", help="Verify the runs against this public key first.")] = None,
    trusted_keys: Annotated[Path | None, typer.Option(
        "--trusted-keys", help="Accept runs signed by any of these keys (nodes.json, PEM bundle, folder).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print what was regraded as JSON.")] = False,
) -> None:
    """Re-grade finished runs with the current (or a named) task code; the new grading
    is appended to each run's record, signed; the original stays. Exit 0 when every run
    was regraded (or had nothing to regrade), 1 when one was refused, 2 on bad input."""
    from ale.record.signing import SignatureInvalid
    from ale.record.trusted_keys import load_trusted_keys
    from ale.runs.regrade import RegradeRefused, regrade_experiment, regrade_run

    trusted = None
    if trusted_keys is not None:
        try:
            trusted = load_trusted_keys(trusted_keys)
        except SignatureInvalid as e:
            fail(str(e))
    kw: dict[str, Any] = {"tasks": tasks, "reason": reason, "signing_key": signing_key, "public_key": public_key,
                          "trusted": trusted}
    if (target / layout.EXPERIMENT_RECORD).is_file():
        raise typer.Exit(_regrade_experiment(target, kw, json_out, regrade_experiment))
    if not (target / layout.RESULT).is_file():
        fail(f"{target} is neither a run folder ({layout.RESULT}) "
             f"nor an experiment folder ({layout.EXPERIMENT_RECORD})")
    try:
        outcome = asyncio.run(regrade_run(target, **kw))
    except RegradeRefused as e:
        fail(str(e), 1, label="refused")
    doc = _outcome(outcome)
    print(json.dumps(doc, indent=2) if json_out else _line(doc))


def _outcome(o: Any) -> dict[str, Any]:
    return {"run_dir": str(o.run_dir), "regrade": o.number, "old": o.old, "new": o.new,
            "task_code_old": o.task_code_old, "task_code_new": o.task_code_new, "error": o.error}


def _line(d: dict[str, Any]) -> str:
    old, new = d["old"], d["new"]
    return (f"{d['run_dir']}: regrade {d['regrade']}: {old.get('status')} {old.get('score')} -> "
            f"{new.get('status')} {new.get('score')} (task code {str(d['task_code_new'])[:12]}…)"
            + (f"; grader error: {d['error'][:200]}" if d.get("error") and new.get("score") is None else ""))


def _regrade_experiment(exp_dir: Path, kw: dict[str, Any], json_out: bool, regrade_experiment: Any) -> int:
    from ale.cli.exp import write_reports
    from ale.runs.exp_record import OutputBusy, OutputLock

    lock = OutputLock(exp_dir)
    try:
        lock.acquire()  # never while `ale exp run` writes the same folder
    except OutputBusy as e:
        fail(str(e))
    try:
        done = asyncio.run(regrade_experiment(
            exp_dir, **kw, progress=lambda o: err.print(_line(_outcome(o)), markup=False)))
        if done.regraded:
            json_path, _ = write_reports(exp_dir)
            err.print(f"report rewritten with the latest gradings: {json_path}")
    finally:
        lock.release()
    for run_dir, why in done.refused:
        err.print(f"refused {run_dir.name}: {why}", markup=False)
    err.print(f"{len(done.regraded)} run(s) regraded, {len(done.refused)} refused, {len(done.skipped)} not regradable")
    if json_out:
        print(json.dumps({"regraded": [_outcome(o) for o in done.regraded],
                          "refused": [{"run_dir": str(d), "reason": r} for d, r in done.refused],
                          "skipped": [{"run_dir": str(d), "reason": r} for d, r in done.skipped]}, indent=2))
    return 1 if done.refused else 0
