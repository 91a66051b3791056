"""Verify an operator's container made from the reference template.

`ale verify-container` calls `verify_container`: it reads the container's
effective state (inspect, and probes when it runs) against the policy and the two
host folders the operator names, and keeps the raw inspect JSON when asked.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ale.defaults import DEFAULT_INPUT_DIR, DEFAULT_OUTPUT_DIR
from ale.isolation.checks import (
    Check,
    Phase,
    check_inspect,
    failures,
    image_record,
    violation_lines,
)
from ale.isolation.probes import run_probes, workspace_empty_checks, workspace_listing
from ale.sandbox.base import ImageMissing, Mount, SandboxError, SandboxGone, SandboxProvider
from ale.sandbox.policy import IsolationPolicy


class VerifyReport(BaseModel):
    ok: bool
    container: str
    phase: Phase | None = None
    checks: list[dict[str, Any]] = Field(default_factory=list)
    violations: list[str] = Field(default_factory=list)
    image: dict[str, Any] | None = None
    probe_output: str | None = None
    inspect_path: str | None = None


def _report(name: str, checks: list[Check], **extra: Any) -> VerifyReport:
    return VerifyReport(
        ok=bool(checks) and not failures(checks),
        container=name,
        checks=[c.to_dict() for c in checks],
        violations=violation_lines(checks),
        **extra,
    )


_PHASES: dict[str, Phase] = {"created": "before", "running": "running", "exited": "after"}


def _phase_of(status: Any) -> Phase | None:
    return _PHASES.get(status) if isinstance(status, str) else None


def verify_container(
    provider: SandboxProvider,
    name_or_id: str,
    *,
    input_dir: str,
    workspace_dir: str,
    policy: IsolationPolicy,
    input_target: str = DEFAULT_INPUT_DIR,
    workspace_target: str = DEFAULT_OUTPUT_DIR,
    save_inspect: Path | None = None,
) -> VerifyReport:
    """Check a container against the policy; probes too when it is running.

    The container must carry exactly two binds: `input_dir` read-only at
    `input_target` and `workspace_dir` read-write at `workspace_target`. A created
    container is checked as "before" (plus the workspace must be empty), a running
    one as "running" with probes, an exited one as "after".
    """
    for label, path in (("input", input_dir), ("workspace", workspace_dir)):
        if not os.path.isdir(path):
            check = Check(f"host.{label}_dir", False, "an existing folder", path,
                          f"{label} folder {path} does not exist on this host")
            return _report(name_or_id, [check])
    try:
        sandbox = provider.attach(name_or_id, policy)
        inspect = sandbox.inspect()
    except SandboxGone:
        return _report(name_or_id, [Check("inspect.available", None, "a container", None,
                                          f"no container named {name_or_id!r}")])
    except SandboxError as e:
        return _report(name_or_id, [Check("inspect.available", None, "a container", None,
                                          f"inspect {name_or_id} failed: {e}")])
    inspect_path = None
    if save_inspect is not None:
        save_inspect.parent.mkdir(parents=True, exist_ok=True)
        save_inspect.write_text(json.dumps(inspect, indent=1, sort_keys=True))
        inspect_path = str(save_inspect)

    status = (inspect.get("State") or {}).get("Status")
    phase = _phase_of(status)
    checks: list[Check] = []
    if phase is None:
        checks.append(Check("state.known", None, "created, running or exited", status,
                            f"container is {status!r}: cannot verify it"))
        phase_for_checks: Phase = "before"
    else:
        phase_for_checks = phase

    image_inspect = None
    image: dict[str, Any] | None = None
    try:
        image_inspect = provider.image_inspect(inspect.get("Image", ""))
        image = image_record(image_inspect, inspect)
    except (ImageMissing, SandboxError) as e:
        checks.append(Check("image.available", None, "the container's image", inspect.get("Image"),
                            f"cannot inspect the image: {e}"))

    mounts = [
        Mount(os.path.abspath(input_dir), input_target, True),
        Mount(os.path.abspath(workspace_dir), workspace_target, False),
    ]
    inodes = {os.path.realpath(m.source): os.stat(m.source).st_ino for m in mounts}
    checks += check_inspect(inspect, policy, mounts, phase=phase_for_checks,
                            image_inspect=image_inspect, mount_inodes=inodes)
    if phase == "before":
        checks += workspace_empty_checks(workspace_listing(workspace_dir))

    probe_output = None
    if phase == "running":

        probe_output, probe_checks = asyncio.run(
            run_probes(sandbox, policy, input_dir=input_target, workspace_dir=workspace_target)
        )
        checks += probe_checks
    return _report(inspect.get("Name", name_or_id).lstrip("/"), checks, phase=phase,
                   image=image, probe_output=probe_output, inspect_path=inspect_path)


def render_report(report: VerifyReport) -> str:
    """A human summary: one line per check, failures first, then the verdict."""
    lines = [f"container {report.container} (phase: {report.phase or 'unknown'})"]
    rows = sorted(report.checks, key=lambda c: (c["ok"] is True, c["id"]))
    for c in rows:
        word = {True: "PASS", False: "FAIL", None: "UNKNOWN"}[c["ok"]]
        line = f"  {word:<7} {c['id']}"
        if c["ok"] is not True:
            why = c["detail"] or f"expected {c['expected']!r}, observed {c['observed']!r}"
            line += f": {why}"
        lines.append(line)
    if report.image:
        lines.append(f"image {report.image.get('id')} store={report.image.get('store')} "
                     f"digests={report.image.get('repo_digests')}")
    if report.inspect_path:
        lines.append(f"raw inspect saved to {report.inspect_path}")
    n_bad = len(report.violations)
    lines.append("SEALED: every check passed" if report.ok
                 else f"NOT SEALED: {n_bad} check(s) failed or unknown")
    return "\n".join(lines)
