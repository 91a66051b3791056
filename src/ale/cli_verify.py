"""`ale verify RUN_DIR [--json] [--public-key FILE]`: the report, for people or tools."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ale.record.verify import VerifyReport, verify_run_dir


def verify_command(run_dir: Path, json_out: bool, public_key: Path | None) -> int:
    """Verify a run folder, print the report, return the exit code:
    0 valid, 1 invalid (reasons listed), 2 unusable input."""
    report = verify_run_dir(run_dir, public_key)
    if json_out:
        print(json.dumps(report.model_dump(mode="json"), indent=2, default=str))
    else:
        print_report(report, Console(soft_wrap=True))
    return report.exit_code


def print_report(report: VerifyReport, console: Console) -> None:
    run = escape(report.run_id or "?")
    status = escape(report.status or "?")
    if not report.usable:
        console.print(f"[bold red]UNUSABLE[/] {escape(report.run_dir)}: cannot verify this input")
    elif report.valid:
        console.print(f"[bold green]VALID[/] run {run}  status={status}")
    else:
        console.print(f"[bold red]INVALID[/] run {run}  status={status}  ({len(report.reasons)} problem(s))")
    for reason in report.reasons:
        console.print(f"  [red]✗[/] {escape(reason)}")
    passed = sum(1 for c in report.checks if c.get("ok") is True)
    failed = [c for c in report.checks if c.get("ok") is not True]
    if report.checks:
        console.print(f"  {passed} check(s) passed, {len(failed)} did not")
    for c in failed:
        # Failing isolation checks of a run labelled invalid are the evidence for that label.
        if c.get("area") == "isolation":
            where = f"[{c.get('phase')}] " if c.get("phase") else ""
            console.print(
                f"  [yellow]•[/] {escape(where + str(c.get('id')))}: expected {escape(repr(c.get('expected')))}, "
                f"observed {escape(repr(c.get('observed')))}" + (f" ({escape(str(c['detail']))})" if c.get("detail") else "")
            )
    if report.key_source:
        console.print(f"  signature: {escape(report.key_source)}")
    for note in report.notes:
        if not note.startswith("signature checked with"):
            console.print(f"  [dim]note: {escape(note)}[/]")
