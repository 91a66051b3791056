"""Whole runs under ``--provider qemu`` (ale's own Linux guest, TCG here): the example
task's oracle scores 1.0 and nop 0, the VM's captures go to the VM seal rules at each
moment, and nothing (no qemu process, no overlay) outlives a run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, Limits, RunPlan
from ale.runs.lifecycle import execute_run
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.sandbox.qemu.provider import QemuProvider
from ale.sandbox.qemu.sandbox import state_root
from ale.status import RunStatus
from tests.conftest import EXAMPLES
from tests.qemu_support import qemu_processes, use_built_guest

POLICY = IsolationPolicy(memory_bytes=768 * MIB, cpus=1.0)


@pytest.fixture(autouse=True)
def _vm(monkeypatch):
    use_built_guest(monkeypatch)


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


def verified(plan: RunPlan) -> None:
    from ale.record.verify import verify_run_dir

    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons


def test_word_count_oracle_one_nop_zero_sealed_and_verified(tmp_path):
    """The real VM seal rules judge QEMU's own description and the guest's probes before
    the agent and after its turn; the run scores as under Docker and ale verify re-judges
    the same evidence."""
    plan = plan_for("files/word_count", tmp_path, "oracle")
    oracle = run(plan)
    assert oracle.status is RunStatus.SCORED, (oracle.error, oracle.violations)
    assert oracle.scores and all(s == 1.0 for s in oracle.scores)
    ev = plan.run_dir / "evidence"
    expect = json.loads((ev / "vm-expectation.json").read_text())
    assert expect["network"] == "none" and expect["base_sha256"] and expect["overlay_path"].endswith("overlay.qcow2")
    assert sorted(ro for _p, ro in ((s["host_path"], s["read_only"]) for s in expect["shares"].values())) == [False, True]
    before = json.loads((ev / "vm-before.json").read_text())
    after = json.loads((ev / "vm-after.json").read_text())
    assert before and after and (ev / "vm-probes-before.txt").read_text() and (ev / "vm-probes-after.txt").read_text()
    checks = json.loads((ev / "checks.json").read_text())
    groups = {c["phase"] for c in checks}
    assert {"vm-before", "vm-probes-before", "vm-probes-after", "vm-after"} <= groups, groups
    assert not {"inspect-before", "inspect-after", "probes-before", "probes-after"} & groups, groups
    assert all(c["ok"] for c in checks if c["phase"].startswith("vm-")), [c for c in checks if not c["ok"]]
    assert not (ev / "inspect-before.json").exists()  # the container's evidence is not faked for a VM
    harness = json.loads((ev / "harness.json").read_text())
    assert harness["run_shape"] == "vm"
    engine = json.loads((ev / "engine.json").read_text())
    assert engine["provider"] == "qemu" and engine["accel"] == "tcg"
    stop = json.loads((ev / "stop.json").read_text())
    assert stop["halt"]["method"] == "vm-agent-cgroup" and stop["halt"]["survivors"] == []
    verified(plan)
    nop_plan = plan_for("files/word_count", tmp_path, "nop")
    nop = run(nop_plan)
    assert nop.status is RunStatus.SCORED, (nop.error, nop.violations)
    assert nop.score == 0.0
    verified(nop_plan)


def test_an_edited_vm_capture_fails_verification(tmp_path):
    """The VM's evidence is signed and re-judged: a capture edited to hide a network
    device fails ale verify."""
    from ale.record.verify import verify_run_dir

    plan = plan_for("files/word_count", tmp_path, "nop")
    assert run(plan).status is RunStatus.SCORED
    path = plan.run_dir / "evidence" / "vm-after.json"
    doc = json.loads(path.read_text())
    doc.setdefault("hmp", {})["info network"] = "net0: index=0,type=user,net=10.0.2.0"
    path.write_text(json.dumps(doc))
    report = verify_run_dir(plan.run_dir)
    assert not report.valid


def test_word_count_oracle_through_the_cua_session(tmp_path, monkeypatch):
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
    verified(plan)


def test_an_experiment_of_the_example_tasks_under_qemu(tmp_path):
    """``environment: {provider: qemu}``: the example tasks score as under Docker (oracle
    1.0, nop 0), the desktop one (``gui/type_in_box``) on the guest's own screen through
    computer-server; a task asking for cua-bench's simulated desktop (HTML windows) is left
    out at planning saying why, and the experiment verifies run by run; no VM outlives it."""
    from ale.report.verify_experiment import verify_experiment

    exp = tmp_path / "vm.yaml"
    tasks = "".join(f"  - path: {EXAMPLES / t}\n" for t in ("files/word_count", "secrets/echo_secret", "gui/type_in_box",
                                                                          "gui/click_button"))
    exp.write_text(f"name: vm-{uuid.uuid4().hex[:6]}\ntasks:\n{tasks}agents: [{{name: oracle}}, {{name: nop}}]\n"
                   "environment: {provider: qemu, policy: {memory_bytes: 805306368, cpus: 1.0}}\n"
                   "concurrency: 1\noutput: out\n")
    p = subprocess.run([sys.executable, "-m", "ale.cli.exp", "run", str(exp), "--plain"], capture_output=True, text=True,
                       timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = tmp_path / "out"
    rows = [json.loads(r.read_text()) for r in sorted((out / "runs").glob("*/result.json"))]
    by = {(r["task_id"].split("/")[0] + "/" + r["task_id"].split("/")[1], r["agent"]): r for r in rows}
    assert {k: (r["status"], r["score"]) for k, r in by.items()} == {
        ("files/word_count", "oracle"): ("scored", 1.0), ("files/word_count", "nop"): ("scored", 0.0),
        ("secrets/echo_secret", "oracle"): ("scored", 1.0), ("secrets/echo_secret", "nop"): ("scored", 0.0),
        ("gui/type_in_box", "oracle"): ("scored", 1.0), ("gui/type_in_box", "nop"): ("scored", 0.0)}, by
    screen = json.loads(next((out / "runs").glob("*type_in_box*oracle*/evidence/desktop.json")).read_text())
    assert screen["started"]["screen"] == [1024, 768], screen
    assert "click_button" in (p.stdout + p.stderr) and "simulated desktop" in (p.stdout + p.stderr)
    report = verify_experiment(out)
    assert report.valid, report.problems
    assert qemu_processes() == []


HOSTILE = [
    # hunt for the reference, anywhere it could be
    "find / -xdev \\( -name 'reference*' -o -name '*.7z' -o -name 'answer*' \\) 2>/dev/null | grep -v ^/proc | head; "
    "ls /reference 2>&1 | head -2; true",
    # any route out: the host, its DNS, a public address
    "python3 - <<'EOF'\nimport socket\nfor host, port in ((\"10.0.2.2\", 80), (\"10.0.2.3\", 53), (\"8.8.8.8\", 53), (\"127.0.0.1\", 22)):\n"
    "    s = socket.socket(); s.settimeout(2)\n    try:\n        s.connect((host, port)); print('OPEN', host, port)\n"
    "    except OSError as e:\n        print('closed', host, port, e.errno)\nEOF\nls /sys/class/net",
    # fill the candidate's /tmp and its memory
    "dd if=/dev/zero of=/tmp/fill bs=1M count=4096 2>&1 | tail -1; "
    "python3 -c 'x = [bytearray(64 << 20) for _ in range(64)]' 2>&1 | tail -1; true",
    # a fork bomb, left running at the end of the turn, and an attempt on init
    "kill -9 1; kill -TERM -1 2>/dev/null; (bash -c ':(){ :|:& };:' &) ; sleep 5; echo '{\"words\": 0}' > /workspace/answer.json",
]


def test_a_hostile_agent_in_the_vm_is_contained_graded_and_verified(tmp_path):
    """A candidate that hunts the reference, probes every route out, fills its /tmp and
    its memory, kills init and leaves a fork bomb running: the turn ends from outside its
    reach, the run is graded 0, verifies, and no VM is left."""
    plan = plan_for("files/word_count", tmp_path, "replay")
    plan = plan.model_copy(update={"agent": plan.agent.model_copy(update={"config": {
        "steps": [{"tool": "shell", "args": {"command": c, "timeout": 120}} for c in HOSTILE]}})})
    result = run(plan)
    assert result.status in (RunStatus.SCORED, RunStatus.AGENT_FAILED, RunStatus.TIMEOUT), (result.status, result.error,
                                                                                            result.violations)
    assert result.score == 0.0
    steps = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]
    out = "\n".join(str(s.get("stdout", "")) for s in steps)
    import re

    assert "OPEN" not in out and "cannot access '/reference'" in out, out[:2000]
    assert not re.search(r"^/(?!opt/|usr/|proc/|sys/)\S*(reference|answer)", out, re.M), out[:2000]  # only library files
    assert "closed 10.0.2.2" in out and "lo" in out and "eth0" not in out, out[:2000]
    stop = json.loads((plan.run_dir / "evidence" / "stop.json").read_text())
    assert stop["halt"]["survivors"] == [] and stop["within_bound"], stop
    verified(plan)


MAPPED_TASK = '''
    import cua_bench as cb
    from tasks.linux_runtime import LinuxTaskConfig

    VERIFY = """
    import mmap, os, sqlite3, sys
    out, scratch = sys.argv[1], sys.argv[2]
    con = sqlite3.connect(os.path.join(out, "facts.db"))
    assert con.execute("select count(*) from t").fetchone()[0] == 50
    con.close()
    for d in ("/tmp/mapped", scratch, os.path.join(out, "regen")):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "m.bin"), "w+b") as f:
            f.write(bytes(4096)); f.flush()
            m = mmap.mmap(f.fileno(), 4096); m[:2] = b"ok"; m.close()
        db = sqlite3.connect(os.path.join(d, "wal.db"))
        assert db.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
        db.execute("create table t(x)"); db.execute("insert into t values (1)"); db.commit(); db.close()
    print("ok")
    """


    class Config(LinuxTaskConfig):
        pass


    @cb.tasks_config
    def load():
        cfg = Config(DOMAIN_NAME="lab", TASK_NAME="beta")
        return [cb.Task(description="write output/m.bin through a shared mapping and output/facts.db in WAL mode",
                        metadata=cfg.to_metadata())]


    @cb.solve_task
    async def solve(task_cfg, session):
        out = task_cfg.metadata["remote_output_dir"]
        # no msync: the mapping is written back when it closes, at the process's exit
        await session.run_command(
            f"cd {out} && python3 -c \\"import mmap; f = open('m.bin', 'w+b'); f.write(bytes(16)); f.flush(); "
            f"m = mmap.mmap(f.fileno(), 16); m[:6] = b'mapped'\\"")
        await session.run_command(
            f"cd {out} && python3 -c \\"import sqlite3; c = sqlite3.connect('facts.db'); c.execute('pragma journal_mode=wal'); "
            f"c.execute('create table t(x)'); c.executemany('insert into t values (?)', [(i,) for i in range(50)]); "
            f"c.commit(); c.close()\\"")


    @cb.evaluate_task
    async def evaluate(task_cfg, session):
        m = task_cfg.metadata
        if not await session.file_exists(f"{m['remote_output_dir']}/m.bin"):
            return [0.0]
        mapped = (await session.read_bytes(f"{m['remote_output_dir']}/m.bin")).startswith(b"mapped")
        await session.interface.create_dir("/tmp/agenthle_eval/mapped")
        await session.write_file("/tmp/agenthle_eval/mapped/verify.py", VERIFY)
        r = await session.run_command(
            f"python /tmp/agenthle_eval/mapped/verify.py {m['remote_output_dir']} {m['task_dir']}/eval_data")
        return [1.0 if mapped and r["return_code"] == 0 and r["stdout"].strip() == "ok" else 0.0]
'''


def test_shared_mappings_and_sqlite_wal_work_on_the_vms_shares(tmp_path):
    """A candidate's numpy.memmap / SQLite WAL in output/ and a grader's in /tmp, in
    <task_dir>/eval_data and in its working copy of output/ (9p shares in a VM, bind
    mounts in a container): v9fs with cache=none refused every writable shared mapping
    (EINVAL, and SQLite's -shm "disk I/O error"), so such a task scored 0 under qemu and
    1 under Docker. The mapped bytes reach the deliverables without an msync."""
    from ale.sandbox.qemu.image import build_vm_image
    from tests.ale_tree import make_data, make_tree, write

    guest = build_vm_image(say=lambda _m: None)  # the guest of this checkout's agent (a lookup when built)
    tasks = make_tree(tmp_path / "ale", data_root=make_data(tmp_path / "data"))
    d = write(tasks / "lab" / "mapped" / "main.py", MAPPED_TASK).parent
    write(d / "task_card.json", '{"vm": {"snapshot": "cpu-free-ubuntu"}, "data_source": "local:%s"}' % (tmp_path / "data"))
    plan = RunPlan(run_id=f"t-{uuid.uuid4().hex[:12]}", task_dir=str(d), variant=0, agent=AgentSpec(name="oracle", config={}),
                   image=f"ale-vm:{guest.folder.name}", policy=POLICY, limits=Limits(), runs_dir=str(tmp_path / "runs"),
                   provider="qemu")
    result = run(plan)
    assert result.status is RunStatus.SCORED and result.scores == [1.0], (result.scores, result.error, result.violations)
    assert (plan.run_dir / "deliverables" / "m.bin").read_bytes().startswith(b"mapped")
    verified(plan)
