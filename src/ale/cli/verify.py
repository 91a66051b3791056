"""`ale verify RUN_DIR [--json] [--public-key FILE]`: the report, for people or tools."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ale.cli.output import SafeConsole
from ale.record.verify import VerifyReport, verify_run_dir


def verify_command(run_dir: Path, json_out: bool, public_key: Path | None,
                   trusted: dict[str, bytes] | None = None) -> int:
    """Verify a run folder, print the report, return the exit code:
    0 valid, 1 invalid (reasons listed), 2 unusable input. ``trusted``: keys its
    regrades may be signed by (``--trusted-keys``)."""
    report = verify_run_dir(run_dir, public_key, regrade_keys=trusted)
    if json_out:
        print(json.dumps(report.model_dump(mode="json"), indent=2, default=str))
    else:
        print_report(report, SafeConsole(soft_wrap=True))
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
                f"observed {escape(repr(c.get('observed')))}"
                + (f" ({escape(str(c['detail']))})" if c.get("detail") else "")
            )
    if report.key_source:
        console.print(f"  signature: {escape(report.key_source)}")
        if "pass --public-key" in report.key_source:
            console.print("  [dim]the operator's public key: `ale key show -o operator.pem` on the machine that "
                          "signed, then `ale verify RUN --public-key operator.pem`[/]")
    for note in report.notes:
        if not note.startswith("signature checked with"):
            console.print(f"  [dim]note: {escape(note)}[/]")


# -- an experiment folder (ale.report.verify_experiment) ------------------------------
def verify_experiment_command(exp_dir: Path, json_out: bool, public_key: Path | None, trusted_keys: Path | None) -> int:
    """Verify every run of an experiment and re-derive its stored report; exit 0 when
    every figure matches, 1 naming the first that differs, 2 for unusable input."""
    from ale.record.signing import SignatureInvalid
    from ale.record.trusted_keys import load_trusted_keys
    from ale.report.verify_experiment import verify_experiment

    try:
        trusted = load_trusted_keys(trusted_keys) if trusted_keys is not None else None
        result = verify_experiment(exp_dir, public_key=public_key, trusted=trusted)
    except SignatureInvalid as e:
        print(f"error: {e}")
        return 2
    if json_out:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return result.exit_code
    console = SafeConsole(soft_wrap=True)
    ok = sum(result.runs.values())
    if not result.usable:
        console.print(f"[bold red]UNUSABLE[/] {escape(str(exp_dir))}: {escape(result.problems[0])}")
    elif result.valid:
        console.print(f"[bold green]VALID[/] experiment {escape(str(exp_dir))}: {ok} run(s) verify; "
                      f"{result.figures} figure(s) of {escape(str(exp_dir.name))}/report.json re-derived and equal")
    else:
        console.print(f"[bold red]INVALID[/] experiment {escape(str(exp_dir))}: {ok}/{len(result.runs)} run(s) verify")
        console.print(f"  first difference: {escape(result.problems[0])}", highlight=False)
        for p in result.problems[1:20]:
            console.print(f"  [red]✗[/] {escape(p)}", highlight=False)
    for note in result.notes:
        console.print(f"  [dim]note: {escape(note)}[/]")
    return result.exit_code
