"""Verify an operator's container made from the reference template.

`ale verify-container` calls `verify_container`: it reads the container's
effective state (inspect, and probes when it runs) against the policy and the two
host folders the operator names, and keeps the raw inspect JSON when asked.

The container need not be the plan to the letter: it must be at least as strict
(`registry.Fit` "at_least"). A stricter field (a `noexec` /tmp where the policy
allows exec, a lower memory or pids limit, fewer CPUs) passes, and the report says
how it differs (`stricter`); a looser one fails.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ale.defaults import DEFAULT_INPUT_DIR, DEFAULT_OUTPUT_DIR
from ale.isolation.checks import Check, Moment, failures, image_record, violation_line
from ale.isolation.probes import run_probes, workspace_listing
from ale.isolation.registry import stricter_notes
from ale.isolation.rules import judge
from ale.sandbox.base import ImageMissing, Mount, SandboxError, SandboxGone, SandboxProvider
from ale.sandbox.policy import IsolationPolicy


class VerifyReport(BaseModel):
    ok: bool
    container: str
    phase: Moment | None = None  # the moment the container was judged at (named "phase" in the JSON since v0.1)
    checks: list[dict[str, Any]] = Field(default_factory=list)
    violations: list[str] = Field(default_factory=list)
    # How the container is stricter than the policy, one line per check (it passes).
    stricter: list[str] = Field(default_factory=list)
    image: dict[str, Any] | None = None
    probe_output: str | None = None
    inspect_path: str | None = None


def _report(name: str, groups: list[tuple[str, list[Check]]], **extra: Any) -> VerifyReport:
    """The report of every check, each group's failures as violation lines."""
    checks = [c for _, cs in groups for c in cs]
    return VerifyReport(
        ok=bool(checks) and not failures(checks),
        container=name,
        checks=[c.to_dict() for c in checks],
        violations=[violation_line(group, c) for group, cs in groups for c in failures(cs)],
        stricter=[f"[{group}] {line}" for group, cs in groups for line in stricter_notes(cs)],
        **extra,
    )


_MOMENTS: dict[str, Moment] = {"created": "before", "running": "running", "exited": "after"}


def _moment_of(status: Any) -> Moment | None:
    return _MOMENTS.get(status) if isinstance(status, str) else None


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
    one as "running" with probes, an exited one as "after". Every planned value is
    compared as at least as strict (`registry.Fit`): stricter passes and is listed
    in the report's `stricter`.
    """
    for label, path in (("input", input_dir), ("workspace", workspace_dir)):
        if not os.path.isdir(path):
            check = Check(f"host.{label}_dir", False, "an existing folder", path,
                          f"{label} folder {path} does not exist on this host")
            return _report(name_or_id, [("host", [check])])
    try:
        sandbox = provider.attach(name_or_id, policy)
        inspect = sandbox.inspect()
    except SandboxError as e:
        why = f"no container named {name_or_id!r}" if isinstance(e, SandboxGone) \
            else f"inspect {name_or_id} failed: {e}"
        return _report(name_or_id, [("host", [Check("inspect.available", None, "a container", None, why)])])
    inspect_path = None
    if save_inspect is not None:
        save_inspect.parent.mkdir(parents=True, exist_ok=True)
        save_inspect.write_text(json.dumps(inspect, indent=1, sort_keys=True))
        inspect_path = str(save_inspect)

    status = (inspect.get("State") or {}).get("Status")
    moment = _moment_of(status)
    host: list[Check] = []
    if moment is None:
        host.append(Check("state.known", None, "created, running or exited", status,
                          f"container is {status!r}: cannot verify it"))

    image_inspect, image, image_checks = _image(provider, inspect)
    host += image_checks

    mounts = [
        Mount(os.path.abspath(input_dir), input_target, True),
        Mount(os.path.abspath(workspace_dir), workspace_target, False),
    ]
    inodes = {os.path.realpath(m.source): os.stat(m.source).st_ino for m in mounts}
    judged = moment or "before"  # an unknown state is judged as before (and fails state.before)
    groups = [("host", host), (f"inspect-{judged}", judge(
        judged, policy=policy, mounts=mounts, inspect=inspect, image_inspect=image_inspect, mount_inodes=inodes,
        fit="at_least"))]
    if moment == "before":
        groups.append(("workspace-before", judge(moment, workspace=workspace_listing(workspace_dir))))
    probe_output = None
    if moment == "running":
        probe_output, probe_checks = asyncio.run(
            run_probes(sandbox, policy, input_dir=input_target, workspace_dir=workspace_target, phase=moment,
                       fit="at_least")
        )
        groups.append((f"probes-{moment}", probe_checks))
    return _report(inspect.get("Name", name_or_id).lstrip("/"), groups, phase=moment,
                   image=image, probe_output=probe_output, inspect_path=inspect_path)


def _image(provider: SandboxProvider, inspect: dict) -> tuple[dict | None, dict[str, Any] | None, list[Check]]:
    """The container's image: its inspect, the record the report keeps, or why neither."""
    try:
        image_inspect = provider.image_inspect(inspect.get("Image", ""))
    except (ImageMissing, SandboxError) as e:
        return None, None, [Check("image.available", None, "the container's image", inspect.get("Image"),
                                  f"cannot inspect the image: {e}")]
    return image_inspect, image_record(image_inspect, inspect), []


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
        elif c.get("stricter"):
            line += f": stricter than planned: {c['stricter']}"
        lines.append(line)
    if report.image:
        lines.append(f"image {report.image.get('id')} store={report.image.get('store')} "
                     f"digests={report.image.get('repo_digests')}")
    if report.inspect_path:
        lines.append(f"raw inspect saved to {report.inspect_path}")
    n_bad = len(report.violations)
    if report.ok:
        n_strict = len(report.stricter)
        lines.append("SEALED: every check passed" + (
            f"; {n_strict} at least as strict as planned but not as planned (listed above)" if n_strict else ""))
    else:
        lines.append(f"NOT SEALED: {n_bad} check(s) failed or unknown")
    return "\n".join(lines)
