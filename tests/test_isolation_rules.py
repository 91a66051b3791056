"""The seal rules' registry: each rule listed, documented, and run alone; one judge.

Fixtures as in test_isolation_checks.py: captures of a real container (Docker
20.10, cgroup v1) and the probe output of the running container.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from ale.isolation import rules as rules_mod
from ale.isolation.checks import Check, check_inspect, diff_captures, failures, violation_line
from ale.isolation.inspect_rules import CaptureSubject, InspectSubject
from ale.isolation.probe_rules import ProbeSubject, split_sections
from ale.isolation.probes import parse_probes, workspace_empty_checks
from ale.isolation.registry import (
    CAPTURES,
    INSPECT,
    MOMENTS,
    PROBES,
    WORKSPACE,
    Moment,
    Rule,
    as_moment,
)
from ale.isolation.rules import all_check_ids, all_rules, judge, markdown, rule_for
from ale.isolation.verify_container import verify_container
from ale.isolation.vm_rules import all_vm_rules
from ale.isolation.workspace_rules import WorkspaceSubject
from ale.sandbox.base import Mount
from ale.sandbox.policy import GIB, IsolationPolicy, TmpfsMount

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
POLICY = IsolationPolicy(memory_bytes=1 * GIB, cpus=1, tmpfs=(TmpfsMount(options="rw,nosuid,nodev,size=1g"),))  # as the fixtures were captured
MOUNTS = (Mount("/tmp/ale-fixture/input", "/input", True), Mount("/tmp/ale-fixture/workspace", "/workspace", False))
# What the desktop probes print in a sealed sandbox: a private X socket, the
# candidate's init, the probe and its exec's wrapper.
DESKTOP_SECTIONS = (
    "=== ale-probe:sockets ===\nunix 00010000 01 /tmp/.X11-unix/X0 -\n"
    "=== ale-probe:processes ===\nself 50\n1 1000 0 sleep\n49 1000 1 wrap\n50 1000 49 sh\n"
)


def load(name: str) -> Any:
    return json.loads((FIX / name).read_text())


def inspect_at(moment: Moment) -> dict:
    if moment == "before":
        return load("inspect_good.json")
    doc = load("inspect_good_after.json")
    if moment == "running":
        doc["State"].update(Status="running", Running=True, FinishedAt="0001-01-01T00:00:00Z")
    return doc


def probe_text() -> str:
    raw = (FIX / "probe_good.txt").read_text()
    raw = raw.replace("=== ale-probe:end ===", DESKTOP_SECTIONS + "=== ale-probe:end ===")
    return raw + "=== ale-probe:exit ===\nexit_code=0 timed_out=False\n"


def good_subject(r: Rule, moment: Moment) -> Any:
    """Evidence of a sealed sandbox at `moment`, for the source `r` reads."""
    if r.source is INSPECT:
        doc: Any = [] if r.id == "inspect.document" else inspect_at(moment)
        return InspectSubject(moment, doc, POLICY, MOUNTS, image_inspect=load("image_good.json"))
    if r.source is CAPTURES:
        return CaptureSubject(moment, inspect_at("before"), inspect_at("after"))
    if r.source is PROBES:
        return ProbeSubject(moment, split_sections(probe_text()), POLICY, "/input", "/workspace", ("/tmp",))
    if r.source is WORKSPACE:
        return WorkspaceSubject(moment, {"entries": [], "inode": 7}, expected_inode=7)
    raise AssertionError(f"no fixture for source {r.source.name}")


RULES = all_rules()
RULE_MOMENTS = [(r, m) for r in RULES for m in r.moments]


# -- the registry --------------------------------------------------------------------
def test_rules_are_documented_and_unique() -> None:
    ids = [i for r in RULES for i in r.ids()]
    assert len(ids) == len(set(ids)), "a check id belongs to one rule"
    for r in RULES:
        assert r.summary and r.why, f"{r.id}: the docstring says what (first paragraph) and why (the rest)"
        assert r.moments and set(r.moments) <= set(MOMENTS)
        assert rule_for(r.ids()[0]) is r
    assert rule_for("no.such.check") is None


@pytest.mark.parametrize("r,moment", RULE_MOMENTS, ids=[f"{r.id.format(moment=m)}@{m}" for r, m in RULE_MOMENTS])
def test_each_rule_runs_alone_and_passes_a_sealed_sandbox(r: Rule, moment: Moment) -> None:
    subject = good_subject(r, moment)
    assert r.applies(subject) or r.id == "inspect.document"
    c = r.check(subject)
    assert isinstance(c, Check) and c.id in r.ids() and c.id == r.check_id(moment)
    if r.id == "inspect.document":  # a capture that is not a document is never sealed
        assert c.ok is None and c.observed == "list"
    else:
        assert c.ok is True, c


EMPTY: dict[str, Any] = {
    "inspect": lambda m: InspectSubject(m, {}, POLICY, MOUNTS, image_inspect={}),
    "captures": lambda m: CaptureSubject(m, {}, None),
    "probes": lambda m: ProbeSubject(m, {}, POLICY, "/input", "/workspace", ("/tmp",)),
    "workspace": lambda m: WorkspaceSubject(m, None, expected_inode=7),
}
# Every rule of an empty document is unknown (Sysctls and Ulimits, which Docker omits
# when empty, are read from a HostConfig that must be there).
PASSES_ON_NOTHING: set[str] = set()


@pytest.mark.parametrize("r", RULES, ids=[r.id for r in RULES])
def test_each_rule_on_missing_evidence_is_not_a_pass(r: Rule) -> None:
    c = r.check(EMPTY[r.source.name](r.moments[-1]))
    assert c.id in r.ids()
    if r.id not in PASSES_ON_NOTHING:
        assert c.ok is not True, c
        assert c.ok is None, c  # evidence that lacks what the rule reads is unknown


def test_a_rule_bug_is_not_hidden_as_unknown() -> None:
    r = rule_for("priv.not_privileged")
    assert r is not None
    broken = Rule(**{**r.__dict__, "verdict": lambda s: 1 / 0})
    with pytest.raises(ZeroDivisionError):
        broken.check(good_subject(r, "before"))


def test_moments() -> None:
    assert MOMENTS == ("before", "running", "after")
    assert as_moment("after") == "after"
    with pytest.raises(ValueError):
        as_moment("agent-start")
    with pytest.raises(ValueError):
        judge("start", policy=POLICY, inspect={})


# -- the one judge --------------------------------------------------------------------
def full_judge(moment: Moment, **over: Any) -> list[Check]:
    kw: dict[str, Any] = dict(
        policy=POLICY, mounts=MOUNTS, inspect=inspect_at(moment), image_inspect=load("image_good.json"),
        probes=probe_text(), workspace={"entries": [], "inode": 7}, workspace_inode=7,
    )
    if moment == "after":
        kw["captures"] = (inspect_at("before"), inspect_at("after"))
    kw.update(over)
    return judge(moment, **kw)


@pytest.mark.parametrize("moment", MOMENTS)
def test_full_judge_passes_a_sealed_sandbox(moment: Moment) -> None:
    checks = full_judge(moment)
    assert failures(checks) == []
    ids = [c.id for c in checks]
    assert len(ids) == len(set(ids))


def test_listing_is_complete() -> None:
    """Every id the judge produces, on sealed and broken evidence at every moment,
    belongs to a registered rule, and every registered id is produced by one."""
    produced: set[str] = set()
    for moment in MOMENTS:
        for over in ({}, {"inspect": []}, {"inspect": {}}, {"probes": ""}, {"probes": None},
                     {"workspace": None}, {"image_inspect": None}):
            produced |= {c.id for c in full_judge(moment, **over)}
    assert produced <= all_check_ids(), f"ids no rule declares: {produced - all_check_ids()}"
    assert all_check_ids() <= produced, f"rules the judge never runs: {all_check_ids() - produced}"


def test_judge_is_what_the_entry_points_run() -> None:
    before, after, image = inspect_at("before"), inspect_at("after"), load("image_good.json")
    raw = probe_text()
    as_dicts = lambda cs: [c.to_dict() for c in cs]  # noqa: E731
    assert as_dicts(check_inspect(before, POLICY, list(MOUNTS), phase="before", image_inspect=image)) == as_dicts(
        judge("before", policy=POLICY, mounts=MOUNTS, inspect=before, image_inspect=image))
    assert as_dicts(diff_captures(before, after)) == as_dicts(judge("after", captures=(before, after)))
    assert as_dicts(parse_probes(raw, POLICY, input_dir="/input", workspace_dir="/workspace", phase="after")) == \
        as_dicts(judge("after", policy=POLICY, mounts=MOUNTS, probes=raw))
    assert as_dicts(workspace_empty_checks(None)) == as_dicts(judge("before", workspace=None))
    # Only what is given is judged; judging inspect or probes needs the policy.
    assert judge("running") == []
    with pytest.raises(ValueError):
        judge("before", inspect=before)


def test_after_the_agent_the_write_tests_of_writable_mounts_are_not_judged() -> None:
    before = {c.id for c in full_judge("before")}
    after = {c.id for c in full_judge("after")}
    assert {"probe.write_workspace_ok", "probe.write_tmp_ok"} <= before - after
    assert {"probe.no_candidate_process_left", "capture.identical", "state.after"} <= after - before


# -- one violation format ----------------------------------------------------------------
def test_violation_line() -> None:
    c = Check("mounts.sources", False, {"/in": "/a"}, {"/in": "/b"}, "/in from /b")
    assert violation_line("inspect-before", c) == (
        "[inspect-before] mounts.sources: expected {'/in': '/a'}, observed {'/in': '/b'} (/in from /b)")
    assert violation_line("probes-after", Check("probe.uid", None, "1000:1000", None)) == (
        "[probes-after] probe.uid: expected '1000:1000', observed None")


class _Sandbox:
    def __init__(self, doc: dict):
        self.doc = doc

    def inspect(self) -> dict:
        return self.doc


class _Provider:
    def __init__(self, doc: dict):
        self.doc = doc

    def attach(self, name: str, policy: IsolationPolicy) -> _Sandbox:
        return _Sandbox(self.doc)

    def image_inspect(self, image: str) -> dict:
        return load("image_good.json")


def test_verify_container_uses_the_one_violation_format(tmp_path: Path) -> None:
    inp, ws = tmp_path / "in", tmp_path / "ws"
    inp.mkdir()
    ws.mkdir()
    doc = inspect_at("before")
    src = {"/input": str(inp), "/workspace": str(ws)}
    for m in doc["Mounts"]:
        m["Source"] = src[m["Destination"]]
    for m in doc["HostConfig"]["Mounts"]:
        m["Source"] = src[m["Target"]]
    provider: Any = _Provider(doc)
    rep = verify_container(provider, "c", input_dir=str(inp), workspace_dir=str(ws), policy=POLICY,
                           input_target="/input", workspace_target="/workspace")
    assert rep.ok and rep.phase == "before" and rep.violations == [], rep.violations
    (ws / "x").write_text("1")
    doc2 = copy.deepcopy(doc)
    doc2["HostConfig"]["Privileged"] = True
    provider = _Provider(doc2)
    rep = verify_container(provider, "c", input_dir=str(inp), workspace_dir=str(ws),
                           policy=POLICY, input_target="/input", workspace_target="/workspace")
    assert rep.violations == [
        "[inspect-before] priv.not_privileged: expected False, observed True",
        "[workspace-before] ws.empty_at_start: expected [], observed ['x'] (workspace not empty: ['x'])",
    ]


# -- the generated docs ------------------------------------------------------------------
def test_docs_isolation_md_is_generated_from_the_registry() -> None:
    doc = (ROOT / "docs" / "isolation.md").read_text()
    assert doc == markdown(), (
        "docs/isolation.md is stale: run `make docs` "
        "(.venv/bin/python -m ale.isolation.rules --markdown > docs/isolation.md)")
    for r in RULES:
        for cid in r.ids():
            assert f"`{cid}`" in doc


def test_the_command_prints_the_docs_and_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert rules_mod.main(["--markdown"]) == 0
    assert capsys.readouterr().out == markdown()
    assert rules_mod.main([]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(RULES) + len(all_vm_rules()) and listed[0].startswith("inspect.document")


def test_rule_modules_name_their_rules_in_registration_order() -> None:
    # The order of checks in a run's checks.json is the registry's: inspect, captures, probes, workspace.
    order = [r.source.name for r in RULES]
    assert order == sorted(order, key=["inspect", "captures", "probes", "workspace"].index)
