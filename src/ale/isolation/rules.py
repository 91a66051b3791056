"""Every seal rule, listed, documented, and judged at a moment: the one owner of "sealed?".

`judge(moment, ...)` runs every registered rule that applies to the evidence it is
given; the lifecycle, `ale verify-container` and `ale verify` all judge through it.
`all_rules()` lists the rules; `python -m ale.isolation.rules --markdown` writes
`docs/isolation.md` from their docstrings (`make docs`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ale.isolation import inspect_rules, probe_rules, vm_rules, workspace_rules
from ale.isolation.registry import (
    CAPTURES,
    INSPECT,
    MOMENTS,
    PROBES,
    SOURCES,
    VM_SOURCES,
    WORKSPACE,
    Check,
    Fit,
    Moment,
    Rule,
    as_moment,
    judge_subject,
    rules_of,
)
from ale.sandbox.base import Mount
from ale.sandbox.policy import IsolationPolicy

_NOT_GIVEN: Any = object()


def all_rules() -> list[Rule]:
    """Every registered rule, in the order a judge returns their checks: by source
    (inspect, captures, probes, workspace), then as registered in the source's module
    (whichever module was imported first)."""
    return [r for source in SOURCES for r in rules_of(source)]


def all_check_ids() -> set[str]:
    """Every check id a registered rule can produce."""
    return {cid for r in all_rules() for cid in r.ids()}


def rule_for(check_id: str) -> Rule | None:
    """The rule that produces `check_id` (None: no rule does)."""
    return next((r for r in all_rules() + vm_rules.all_vm_rules() if check_id in r.ids()), None)


def judge(
    moment: Moment | str,
    *,
    policy: IsolationPolicy | None = None,
    mounts: Sequence[Mount] = (),
    inspect: Any = _NOT_GIVEN,
    image_inspect: dict | None = None,
    mount_inodes: dict[str, int] | None = None,
    captures: tuple[Any, Any] | None = None,
    probes: Any = _NOT_GIVEN,
    input_dir: str | None = None,
    workspace_dir: str | None = None,
    tmpfs_paths: tuple[str, ...] | None = None,
    workspace: Any = _NOT_GIVEN,
    workspace_inode: int | None = None,
    fit: Fit = "exact",
) -> list[Check]:
    """Judge the sandbox at one moment on the evidence given: every rule that applies.

    Each keyword names a kind of evidence; what is not given is not judged, and what
    is given as None (a capture that was not recorded) is judged as missing: unknown.

    - ``inspect``: the container's inspect document at `moment` (with the planned
      ``mounts``, the ``image_inspect`` and the bind sources' ``mount_inodes``).
    - ``captures``: the capture at create and the one after exit, which must agree
      (`capture.identical`).
    - ``probes``: the probe output (text, or its sections); ``input_dir`` and
      ``workspace_dir`` are where the probes were told the public package and the
      workspace are (by default the targets of the read-only and the read-write
      mount), ``tmpfs_paths`` the tmpfs paths (by default the policy's).
    - ``workspace``: the host's listing of the workspace (`probes.workspace_listing`),
      and ``workspace_inode`` the inode it had at creation.

    ``fit`` is how planned values are compared (`registry.Fit`): "exact" for a run's
    own sandbox (the harness created it as planned), "at_least" for a container
    someone else created (`ale verify-container`): stricter passes, and says so.

    The checks come in the order the rules are registered: inspect, captures,
    probes, workspace.
    """
    m = as_moment(moment)
    planned = tuple(mounts)
    if policy is None and (inspect is not _NOT_GIVEN or probes is not _NOT_GIVEN):
        raise ValueError("judging inspect or probes needs the policy")
    checks: list[Check] = []
    if inspect is not _NOT_GIVEN:
        assert policy is not None
        checks += judge_subject(INSPECT, inspect_rules.InspectSubject(
            m, inspect, policy, planned, image_inspect=image_inspect, mount_inodes=mount_inodes, fit=fit))
    if captures is not None:
        checks += judge_subject(CAPTURES, inspect_rules.CaptureSubject(m, *captures))
    if probes is not _NOT_GIVEN:
        assert policy is not None
        sections = probes if isinstance(probes, dict) else probe_rules.split_sections(probes or "")
        in_dir = input_dir if input_dir is not None else next((p.target for p in planned if p.read_only), None)
        ws_dir = workspace_dir if workspace_dir is not None \
            else next((p.target for p in planned if not p.read_only), None)
        if in_dir is None or ws_dir is None:
            raise ValueError("judging probes needs input_dir and workspace_dir (or a read-only and a read-write mount)")
        tmpfs = tuple(t.path for t in policy.tmpfs) if tmpfs_paths is None else tmpfs_paths
        checks += judge_subject(PROBES, probe_rules.ProbeSubject(m, sections, policy, in_dir, ws_dir, tmpfs, fit))
    if workspace is not _NOT_GIVEN:
        checks += judge_subject(WORKSPACE, workspace_rules.WorkspaceSubject(m, workspace, workspace_inode))
    return checks


# -- the docs ----------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _moments(r: Rule) -> str:
    return "all" if r.moments == MOMENTS else ", ".join(r.moments)


def markdown() -> str:
    """`docs/isolation.md`: every rule, by the evidence it reads."""
    out = [
        "# Isolation rules",
        "",
        "<!-- Generated by `python -m ale.isolation.rules --markdown` (`make docs`) from the rules'",
        "     docstrings in src/ale/isolation/*_rules.py. Do not edit: tests/test_isolation_rules.py",
        "     fails when this file is stale. -->",
        "",
        "Every check that decides whether a sandbox was sealed comes from one registered rule",
        "(`ale.isolation.rules`). A rule reads one kind of evidence at some of the sandbox's",
        "moments: **before** (created, never started), **running**, **after** (exited). A",
        "check that fails, or whose evidence lacks what the rule reads (*unknown*), makes the",
        "run `invalid_evaluation_environment`. The policy (`ale.sandbox.policy.IsolationPolicy`)",
        "states the planned values; this file lists how each is checked. The lifecycle,",
        "`ale verify-container` and `ale verify` judge through `ale.isolation.rules.judge`.",
        "",
        "A run's own sandbox (the lifecycle, `ale verify`) must be the one planned: the harness",
        "created it, so any difference is the engine doing something else. `ale verify-container`",
        "judges a container someone else created *at least as strict* as planned: where a rule",
        "orders its field (a lower memory, pids or CPU limit, `noexec`/`nosuid`/`nodev` or a",
        "smaller size on a tmpfs, `--ipc none`), a stricter value passes and the check says how",
        "it differs (`stricter` in the JSON, `stricter than planned` in the report); a looser one",
        "fails. Fields with no such order (the runtime, the user, the binds and their",
        "propagation, a writable place the plan grants) stay equality.",
        "",
        f"{len(all_rules())} rules, {len(all_check_ids())} check ids.",
    ]
    out += _source_tables(SOURCES, all_rules())
    vm = vm_rules.all_vm_rules()
    out += [
        "",
        "# The VM seal",
        "",
        "A VM (`--provider qemu`) gets the same promises, each read back from what QEMU itself",
        "reports (`ale.sandbox.qemu.capture.capture_vm`: QMP, HMP through QMP, and the qemu",
        "process's argv and open files from /proc), never from the flags ale passed alone, and",
        "from the probe script run in the guest as the candidate. The run's plan is a",
        "`VmExpectation` (`evidence/vm-expectation.json`); the captures before and after the agent",
        "(`evidence/vm-before.json`, `evidence/vm-after.json`) and the guest's probes",
        "(`evidence/vm-probes-before.txt`, `vm-probes-after.txt`) are judged at run time and again",
        "by `ale verify` through `ale.isolation.vm_rules` (`judge_vm_state`, `judge_vm_captures`,",
        "`judge_vm_probes`). Unknown is invalid here too. `docs/vm-seal.md` sets each rule next",
        "to the container rule it stands for.",
        "",
        f"{len(vm)} rules, {len(vm_rules.vm_check_ids())} check ids.",
    ]
    out += _source_tables(VM_SOURCES, vm)
    return "\n".join(out) + "\n"


def _source_tables(sources: Sequence[Any], rules_in_order: list[Rule]) -> list[str]:
    out: list[str] = []
    for source in sources:
        rules = [r for r in rules_in_order if r.source is source]
        if not rules:
            continue
        out += ["", f"## {source.name}: {source.reads}", "",
                "| check id | area | moments | what it checks | why |", "| --- | --- | --- | --- | --- |"]
        for r in rules:
            ids = ", ".join(f"`{i}`" for i in r.ids())
            what = r.summary + (f" *Only {r.when_doc}.*" if r.when_doc else "")
            out.append(f"| {ids} | {r.area} | {_moments(r)} | {_cell(what)} | {_cell(r.why)} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ale.isolation.rules", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print docs/isolation.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    for r in all_rules() + vm_rules.all_vm_rules():
        print(f"{', '.join(r.ids()):<40} {r.source.name:<10} {_moments(r):<16} {r.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
