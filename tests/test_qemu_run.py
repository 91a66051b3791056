"""Whole runs under ``--provider qemu`` (ale's own Linux guest, TCG here): the example
task's oracle scores 1.0 and nop 0, the VM's captures go to the VM seal rules at each
moment, and nothing (no qemu process, no overlay) outlives a run."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import types
import uuid
from pathlib import Path

import pytest

from ale.isolation.registry import Check
from ale.plan import AgentSpec, Limits, RunPlan
from ale.runs.lifecycle import execute_run
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.sandbox.qemu.sandbox import QemuProvider, state_root
from ale.status import RunStatus
from tests.conftest import EXAMPLES, require
from tests.qemu_support import VM_DIR, qemu_processes, vm_ready

POLICY = IsolationPolicy(memory_bytes=768 * MIB, cpus=1.0)


@pytest.fixture(autouse=True)
def _vm(monkeypatch):
    monkeypatch.setenv("ALE_VM_DIR", VM_DIR)
    monkeypatch.setenv("ALE_QEMU_ACCEL", "tcg")
    ok, why = vm_ready()
    require(ok, why)


def plan_for(task: str, runs_dir: Path, agent: str) -> RunPlan:
    return RunPlan(run_id=f"t-{uuid.uuid4().hex[:12]}", task_dir=str(EXAMPLES / task), variant=0,
                   agent=AgentSpec(name=agent, config={}), image="ale-vm:latest", policy=POLICY,
                   limits=Limits(), runs_dir=str(runs_dir), provider="qemu")


def run(plan: RunPlan):
    result = asyncio.run(execute_run(plan, provider=QemuProvider(accel="tcg")))
    assert qemu_processes() == [], "a qemu process outlived its run"
    left = [p for p in state_root().glob("*/labels.json") if plan.run_id in p.read_text()] if state_root().is_dir() else []
    assert left == [], f"a VM state folder (overlay) outlived its run: {left}"
    return result


@pytest.fixture
def judged(monkeypatch):
    """A stand-in for ``ale.isolation.vm_rules`` (another branch writes the real rules):
    it passes every capture and records what the lifecycle handed it. It tests the
    plumbing only; it judges nothing."""
    calls: list[tuple[dict, dict, str]] = []

    def judge_vm_state(capture, expectation, moment):
        calls.append((capture, expectation, moment))
        return [Check(f"vm.test_stand_in.{moment}", True, "anything", None, "the test's stand-in judge")]

    mod = types.ModuleType("ale.isolation.vm_rules")
    mod.judge_vm_state = judge_vm_state  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ale.isolation.vm_rules", mod)
    return calls


def test_word_count_oracle_one_nop_zero(judged, tmp_path):
    plan = plan_for("files/word_count", tmp_path, "oracle")
    oracle = run(plan)
    assert oracle.status is RunStatus.SCORED, (oracle.error, oracle.violations)
    assert oracle.scores and all(s == 1.0 for s in oracle.scores)
    moments = [m for _c, _e, m in judged]
    assert moments == ["created", "before", "after", "stopped"], moments
    _c, expect, _m = judged[0]
    assert expect["network"] == "none" and expect["base_sha256"] and expect["overlay"].endswith("overlay.qcow2")
    assert sorted(s["read_only"] for s in expect["shares"].values()) == [False, True]
    before = next(c for c, _e, m in judged if m == "before")
    qmp = before["inspect"]["vm"]["qmp"]
    assert qmp["status"]["status"] == "running"
    assert before["probes"]
    assert any(b.get("inserted", {}).get("backing_file") for b in qmp["block"]), qmp["block"]
    stopped = next(c for c, _e, m in judged if m == "stopped")
    assert stopped["inspect"]["State"]["Status"] == "exited"
    run_dir = plan.run_dir
    engine = json.loads((run_dir / "evidence/engine.json").read_text())
    assert engine["provider"] == "qemu" and engine["accel"] == "tcg"
    stop = json.loads((run_dir / "evidence/stop.json").read_text())
    assert stop["halt"]["method"] == "vm-agent-cgroup" and stop["halt"]["survivors"] == []
    judged.clear()
    nop = run(plan_for("files/word_count", tmp_path, "nop"))
    assert nop.status is RunStatus.SCORED, (nop.error, nop.violations)
    assert nop.score == 0.0


@pytest.mark.skipif(importlib.util.find_spec("ale.isolation.vm_rules") is not None,
                    reason="the VM seal rules are in this build")
def test_without_vm_rules_the_seal_is_unknown_and_the_run_invalid(tmp_path):
    r = run(plan_for("files/word_count", tmp_path, "oracle"))
    assert r.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT, r.status
    assert any("vm.rules_available" in v for v in r.violations), r.violations


def test_word_count_oracle_through_the_cua_session(judged, tmp_path, monkeypatch):
    """``ALE_QEMU_SESSION=cua``: the agent's and the task's tool calls go through the
    guest's computer-server; the oracle still scores 1.0."""
    monkeypatch.setenv("ALE_QEMU_SESSION", "cua")
    plan = plan_for("files/word_count", tmp_path, "oracle")
    result = asyncio.run(execute_run(plan, provider=QemuProvider(accel="tcg", session="cua")))
    assert qemu_processes() == []
    assert result.status is RunStatus.SCORED, (result.error, result.violations)
    assert result.scores and all(s == 1.0 for s in result.scores)
    cua = json.loads((plan.run_dir / "evidence/cua.json").read_text())
    assert cua["calls"] >= 1 and cua["transport"] == "virtio-serial relay", cua
