"""`ale exp run|status`, plus `report_command` and `cleanup_command` (wired as
`ale report` and `ale cleanup` by the main CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ale import layout
from ale.cli.output import SafeConsole, err, fail
from ale.status import RunStatus

exp_app = typer.Typer(no_args_is_help=True, help="Run experiments: agents × tasks × repeats, resumable.")



def write_reports(exp_dir: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.html`` into the experiment folder: each run
    with its latest grading (regrades), as ``ale verify EXP_DIR`` re-derives it."""
    from ale.report import write_html
    from ale.report.verify_experiment import experiment_report, write_report_json

    report, regrades = experiment_report(exp_dir)
    json_path = write_report_json(exp_dir, report, regrades)
    html_path = write_html(report, exp_dir / layout.REPORT_HTML, exp_dir)
    return json_path, html_path


@exp_app.command("run")
def run_command(
    file: Annotated[Path, typer.Argument(help="The experiment file (YAML).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the planned runs; run nothing.")] = False,
    plain: Annotated[bool, typer.Option(
        "--plain", help="Plain progress lines (CI logs); the default when stderr is not a terminal.")] = False,
    allow_changed: Annotated[bool, typer.Option(
        "--allow-changed", help="Continue an output folder although the experiment changed.")] = False,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", "-j", min=1, help="Runs at once (default: the file's `concurrency`).")] = None,
    cluster: Annotated[str | None, typer.Option(
        "--cluster", envvar="ALE_CLUSTER",
        help="Where runs execute: `local` (default) or `ray:HOST:PORT` (a Ray cluster; default: "
             "the file's environment.cluster).")] = None,
    retry_errors: Annotated[bool, typer.Option(
        "--retry-errors",
        help="Run once more each unit whose final run ended in an error (infrastructure, "
             "or a grading failure or invalid run not charged to the agent).")] = False,
    resume_turns: Annotated[bool, typer.Option(
        "--resume-turns",
        help="An attempt interrupted after its agent started (a crash, a lost node, "
             "Ctrl-C) continues from its gateway record: a fresh sandbox, its recorded model turns replayed until the "
             "first that differs, then the live model (docs/experiments.md). Off: "
             "it starts again from turn 1.")] = False,
) -> None:
    """Run (or resume) an experiment; prints where the report is, last."""
    from ale.runs.cluster import resolve_cluster
    from ale.runs.exp_record import ExperimentChanged, OutputBusy
    from ale.runs.experiment import ExperimentError, load_experiment, plan_experiment
    from ale.runs.orchestrator import run_experiment
    from ale.runs.progress import PlainProgress, RichProgress
    from ale.runs.screening import SKIPPED_FILE, write_skipped
    from ale.runs.store import read_result, runs_root
    from ale.sandbox.base import SandboxError

    try:
        exp = load_experiment(file)
        units, skipped = plan_experiment(exp, build_envs=not dry_run)
        where = resolve_cluster(cluster, exp.environment.cluster)
    except (ExperimentError, ValueError) as e:
        fail(str(e))
    if where.kind == "local" and not dry_run:  # a cluster's nodes answer for their own engines
        from ale.sandbox.providers import require_runtime

        runtime = exp.isolation_policy().runtime
        try:
            require_runtime(exp.environment.provider, runtime)
        except SandboxError as e:
            fail(f"environment.runtime {runtime!r}: {e}")
    out_dir = exp.output_dir
    if skipped:
        err.print(f"[yellow]{len(skipped)} task(s) or variant(s) not planned[/] (they cannot run here; the rest runs):")
        for sk in skipped:
            err.print(f"  {escape(sk.line())}", highlight=False)
    if not units:
        fail(f"nothing to run in {file}: every task was left out (above)")
    if dry_run:
        root = runs_root(out_dir)
        for u in units:
            done = read_result(root / f"{u.unit_id}-a1") is not None if root.is_dir() else False
            print(f"{u.unit_id}\ttask={u.task}\tvariant={u.variant}\tagent={u.agent}\trepeat={u.repeat}"
                  + ("\t(has a result)" if done else ""))
        err.print(f"{len(units)} run(s) planned for {exp.name!r} → {out_dir}")
        return
    write_skipped(out_dir, skipped)
    use_plain = plain or not sys.stderr.isatty()
    progress = PlainProgress() if use_plain else RichProgress(err)
    from ale.cli.output import software_progress

    try:
        with software_progress():
            summary = asyncio.run(
                run_experiment(exp, progress=progress, concurrency=concurrency, allow_changed=allow_changed,
                               cluster=cluster, retry_errors=retry_errors, units=units, resume_turns=resume_turns)
            )
    except (ExperimentChanged, OutputBusy, ExperimentError) as e:
        fail(str(e))
    except SandboxError as e:
        fail(str(e), 1)
    json_path, html_path = write_reports(out_dir)
    finals = ", ".join(f"{k} {v}" for k, v in sorted(summary.statuses.items())) or "none"
    err.print(
        f"{sum(summary.statuses.values())}/{summary.total} runs final ({finals}); "
        f"{summary.executed} attempt(s) this session, {summary.skipped} already done, {summary.retried} retried"
    )
    if skipped:
        err.print(f"[yellow]{len(skipped)} task(s) or variant(s) not planned[/]: {out_dir / SKIPPED_FILE}")
    if summary.interrupted:
        err.print("[yellow]interrupted[/]: run the same command again to resume")
    err.print(f"report: {html_path} (data: {json_path})")
    print(html_path)
    if summary.interrupted:
        raise typer.Exit(130)


@exp_app.command("status")
def status_command(exp_dir: Annotated[Path, typer.Argument(help="The experiment's output folder.")]) -> None:
    """How far an experiment is: runs by status, and whether it is running now."""
    from ale.runs.store import INDEX_NAME, RunIndex, rebuild_index

    record = exp_dir / layout.EXPERIMENT_RECORD
    if not record.is_file():
        fail(f"{exp_dir} is not an experiment folder (no experiment.json)")
    data = json.loads(record.read_text())
    index = RunIndex(exp_dir) if (exp_dir / INDEX_NAME).is_file() else rebuild_index(exp_dir)
    counts = index.count_by_status()
    total = int(data.get("units", 0))
    table = Table(title=f"{data.get('name')}  ({exp_dir})")
    table.add_column("status")
    table.add_column("runs", justify="right")
    for status, n in sorted(counts.items()):
        table.add_row(status, str(n))
    table.add_row("[bold]final / planned[/]", f"{sum(counts.values())} / {total}")
    console = wide_console()
    console.print(table)
    from ale.report import load_report

    with contextlib.suppress(FileNotFoundError, ValueError, OSError):
        print_not_scored(console, load_report(exp_dir).runs)
    print_skipped_tasks(console, exp_dir)
    holder = _lock_holder(exp_dir)
    err.print(f"running now (pid {holder})" if holder else "not running")


def wide_console() -> Console:
    """A console for tables: the terminal's width, or (piped, redirected) wide
    enough that no table is cut (rich's default there is 80 columns)."""
    return SafeConsole() if sys.stdout.isatty() else SafeConsole(width=100_000)


def print_not_scored(console: Console, rows: list) -> None:
    """Each run that did not score, with why (one line each), grouped by reason."""
    from ale.report.reasons import group_reasons, left_out, reason_lines

    groups = group_reasons(rows)
    if not groups:
        return
    out = left_out(rows)
    console.print(f"[bold]{sum(g.count for g in groups)} run(s) did not score[/] "
                  f"({len(out)} left out of the headline numbers); by reason:")
    for g in groups:
        console.print(f"  {g.count:>4}  {escape(g.status)}: {escape(g.reason)}", highlight=False)
    for line in reason_lines(rows, limit=200):
        console.print(f"  - {escape(line)}", highlight=False)


def print_skipped_tasks(console: Console, exp_dir: Path) -> None:
    """The tasks planning left out (unsupported, not loading), from the experiment folder."""
    from ale.runs.screening import SKIPPED_FILE, read_skipped

    skipped = read_skipped(exp_dir)
    if skipped:
        console.print(f"[yellow]{len(skipped)} task(s) or variant(s) not planned[/] "
                      f"(recorded in {exp_dir / SKIPPED_FILE}):")
        for s in skipped:
            console.print(f"  {escape(s['status'])}  {escape(s['task'])}: {escape(s['reason'])}", highlight=False)


def _lock_holder(exp_dir: Path) -> str | None:
    lock = exp_dir / layout.LOCK
    if not lock.is_file():
        return None
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return lock.read_text().strip() or "?"
    finally:
        os.close(fd)
    return None


def report_command(
    exp_dir: Annotated[Path, typer.Argument(help="The experiment's output folder.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print one CSV row per run (final attempts).")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report to FILE.")] = None,
    threshold: Annotated[float | None, typer.Option(
        "--threshold", min=0.0, max=1.0, help="Pass threshold (default: the experiment's, else 0.5).")] = None,
) -> None:
    """Scores per agent (bootstrap 95% CI over tasks), pass rates, pass@k, tiers."""
    from ale.report import load_report, to_csv, to_json, write_html
    from ale.runs.experiment import ReportSpec

    options = None
    if threshold is not None:
        base = ReportSpec()
        record = exp_dir / layout.EXPERIMENT_RECORD
        if record.is_file():
            rep = json.loads(record.read_text()).get("experiment", {}).get("report")
            if rep:
                base = ReportSpec.model_validate(rep)
        options = base.model_copy(update={"pass_threshold": threshold})
    try:
        report = load_report(exp_dir, options)
    except FileNotFoundError as e:
        fail(str(e))
    if as_json:
        print(to_json(report))
    if as_csv:
        sys.stdout.write(to_csv(report))
    if html is not None:
        write_html(report, html, exp_dir)
        err.print(f"wrote {html}")
    if not (as_json or as_csv or html):
        table = Table(title=f"{report.experiment or exp_dir}: {report.total_runs} runs")
        max_k = max((max(a.pass_at_k) for a in report.agents if a.pass_at_k), default=0)
        for col in ("agent", "mean", "95% CI", "valid-only mean", f"pass ≥ {report.pass_threshold:g}",
                    *(f"pass@{k}" for k in range(1, max_k + 1)), "tasks", "counted/runs", "invalid", "flagged"):
            table.add_column(col)
        for a in report.agents:
            ci = "-" if a.ci_low is None else f"[{a.ci_low:.3f}, {a.ci_high:.3f}]"
            pak = ["-" if a.pass_at_k.get(k) is None else f"{a.pass_at_k[k]:.3f}" for k in range(1, max_k + 1)]
            table.add_row(escape(a.agent), "-" if a.mean is None else f"{a.mean:.3f}", ci,
                          "-" if a.valid_mean is None else f"{a.valid_mean:.3f}",
                          "-" if a.pass_rate is None else f"{a.pass_rate:.3f}", *pak, str(a.items),
                          f"{a.counted}/{a.runs}",
                          str(a.statuses.get(RunStatus.INVALID_EVALUATION_ENVIRONMENT, 0)), str(a.flagged))
        console = wide_console()
        console.print(table)
        console.print("by status: " + ", ".join(f"{k} {v}" for k, v in report.counts_by_status.items() if v))
        console.print("tiers: " + ", ".join(f"{k} {len(v)}" for k, v in report.tiers.items()))
        if report.flagged_runs:
            console.print(f"[red]{len(report.flagged_runs)} run(s) charged to the candidate[/] "
                          "(invalid after the agent "
                          "started, or a grader that failed again and again on its deliverables; counted as 0 in the "
                          "headline; review them): " + ", ".join(r.run_id for r in report.flagged_runs[:10]))
        others = [r for r in report.invalid_runs if r not in report.flagged_runs]
        if others:
            console.print(f"[red]{len(others)} invalid run(s)[/] charged to the harness or the controller (excluded): "
                          + ", ".join(r.run_id for r in others[:10]))
        if report.warned_runs:
            console.print(f"[yellow]{len(report.warned_runs)} run(s) with warnings[/] "
                          "(scored as they are; look at them): "
                          + escape("; ".join(f"{r.run_id}: {r.warnings[0]}" for r in report.warned_runs[:5])),
                          highlight=False)
        console.print("by kind: " + ", ".join(f"{k} {v}" for k, v in report.counts_by_kind.items()), highlight=False)
        resumed = [r for r in report.runs if r.resumed]
        if resumed:  # continued from an interrupted attempt's record: shown, with any divergence
            console.print(f"[yellow]{len(resumed)} resumed run(s)[/] "
                          "(recorded turns replayed from an interrupted attempt): "
                          + escape("; ".join(f"{r.run_id}: {(r.resumed or {}).get('replayed_turns')} replayed"
                                             + (f", diverged at turn {(r.resumed or {}).get('diverged_at')}"
                                                if (r.resumed or {}).get("diverged_at") else "")
                                             for r in resumed[:10])),
                          highlight=False)
        from ale.report.verify_experiment import experiment_report

        _, regrades = experiment_report(exp_dir)
        if regrades["runs"]:
            console.print(f"{regrades['runs']} run(s) counted with a regrade, with task code "
                          + ", ".join(f"{c[:12]}… ({n})" for c, n in regrades["task_code"].items()), highlight=False)
        if max_k == 0:
            console.print("pass@k: no task has two or more counted runs of an agent (repeats: 2 or more)",
                          highlight=False)
        print_not_scored(console, report.runs)
        print_skipped_tasks(console, exp_dir)
        console.print(report.counting_policy, markup=False, highlight=False)


def cleanup_command(
    runs_dir: Annotated[Path, typer.Option("--runs-dir", envvar="ALE_RUNS_DIR",
                                           help="Also remove the grading-probe folders a killed `ale task check` "
                                                "left under this runs folder (older than an hour).")] = Path("runs"),
) -> None:
    """Remove every container and VM ale left behind (label ale.managed=1; nothing else), the
    shared public packages no run is using, and stale grading-probe folders."""
    from ale.sandbox.base import SandboxError
    from ale.sandbox.providers import make_provider

    try:
        removed = make_provider().remove_managed()
    except SandboxError as e:
        fail(str(e), 1)
    removed += make_provider("qemu").remove_managed()  # ale's VMs: their qemu killed, their overlays deleted
    for name in removed:
        print(name)
    from ale.runs.packages import cache_root, clear_unused

    packages, left = clear_unused()
    from ale.runs.grading_only import prune_stale_probes

    probes = prune_stale_probes(runs_dir)
    err.print(f"removed {len(removed)} container(s) and VM(s), {len(packages)} shared package(s) no run uses "
              f"({cache_root()}; {left} in use) and {len(probes)} stale probe folder(s) under {runs_dir}")


exp_app.command("report")(report_command)


if __name__ == "__main__":  # `python -m ale.cli.exp run FILE` works without the main CLI
    exp_app()
