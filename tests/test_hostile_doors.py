"""The smaller doors, closed for every copy and every container the harness makes
(issue 33, items 2, 3 and 5): a tree at the path-length edge, a sparse file, a SysV
shared-memory fill, a process that dumps core, names the run folder would fold
together, a name holding a terminal escape. Real runs of a hostile replay agent on
an example task: each ends graded (never a grading failure no grader judged), scores
0, verifies, and leaves no container, no scratch folder and nothing on the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from ale.grading import deliverables as deliverables_mod
from ale.grading import grader as grader_mod
from ale.grading.deliverables import DeliverablesManifest, Folding, path_budget
from ale.plan import AgentSpec, Limits, RunPlan
from ale.runs.state import RunFolder
from ale.sandbox.policy import IsolationPolicy
from tests.conftest import EXAMPLES, TOOLS_IMAGE
from tests.test_hostile_stop import graded_zero

pytestmark = pytest.mark.docker

MIB = 1024**2
WRONG = 'echo \'{"words": 0, "lines": 0}\' > /workspace/answer.json'


def _plan(tmp_path: Path, steps: list[dict]) -> RunPlan:
    script = tmp_path / f"script-{uuid.uuid4().hex[:8]}.json"
    script.write_text(json.dumps(steps))  # ensure_ascii: any name survives the plan's JSON
    return RunPlan(
        run_id=f"hostile-door-{uuid.uuid4().hex[:10]}",
        task_dir=str(EXAMPLES / "files" / "word_count"),
        agent=AgentSpec(name="replay", config={"script": str(script)}),
        image=TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * MIB),
        limits=Limits(wall_time_s=240),
        runs_dir=str(tmp_path / "runs"),
    )


def _run(docker_client, plan: RunPlan):
    result = graded_zero(docker_client, plan)
    manifest = DeliverablesManifest.model_validate_json((plan.run_dir / "deliverables.json").read_bytes())
    return result, manifest


def _shell(cmd: str, timeout: float = 120) -> dict:
    return {"tool": "shell", "args": {"command": cmd, "timeout": timeout}}


def _py(source: str) -> dict:
    return _shell(f"python3 - <<'ALE_EOF'\n{source}\nALE_EOF")


def _stdout(run_dir: Path) -> str:
    """What the agent's commands printed, every step's stdout in order."""
    steps = json.loads((run_dir / "trajectory.json").read_text())["steps"]
    return "".join(s.get("stdout") or "" for s in steps)


def _allocated(root: Path) -> int:
    total = 0
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
    return total


# -- a tree at the path-length edge --------------------------------------------------
BUILD_PATH = r'''
import os
def build(top, total, data):
    """A file whose path relative to the workspace is exactly `total` bytes."""
    os.chdir("/workspace")
    os.mkdir(top); os.chdir(top)
    left = total - len(top) - 1
    n = 0
    while left > 255:
        name = ("d%d" % n).ljust(200, "d")
        os.mkdir(name); os.chdir(name)
        left -= len(name) + 1
        n += 1
    with open("f".ljust(left, "f"), "wb") as f:
        f.write(data)
build("e", EDGE, b"at the edge")
build(OVER_TOP, OVER, b"fits the run folder, not the grader's copy")
'''


def test_a_tree_at_the_path_length_edge_is_graded_and_its_name_printed_escaped(docker_client, tmp_path, capsys):
    """Item 2: one budget for every copy. A file whose path fits under the run
    folder's deliverables but not under the grader's longer working copy was a
    grading failure charged to the candidate on every attempt; now the budget is the
    longest base's, the file is skipped at the path limit (its folder's name a
    terminal escape, printed escaped), the rest is graded."""
    plan = _plan(tmp_path, [])
    run_dir = plan.run_dir
    folder = RunFolder(run_dir, Path(plan.runs_dir).resolve() / ".scratch" / plan.run_id, None)  # type: ignore[arg-type]
    edge = path_budget(run_dir / "deliverables", *folder.copy_bases(plan.limits.grading_attempts), "/workspace")
    old = path_budget(run_dir / "deliverables")  # the budget the run folder alone gave
    assert old > edge, "the grader's working copy is the longer base"
    top = "o\x1b]52;c;aGVsbG8=\x07"  # OSC 52: a raw print writes the operator's clipboard
    source = BUILD_PATH.replace("EDGE", str(edge)).replace("OVER_TOP", repr(top)).replace("OVER", str(old))
    Path(plan.agent.config["script"]).write_text(json.dumps([_py(source), _shell(WRONG)]))
    result, m = _run(docker_client, plan)
    assert result.status.value == "scored", (result.status, result.error)
    kept = [f for f in m.files if f.path.startswith("e/")]
    assert len(kept) == 1 and len(kept[0].path.encode()) == edge, [f.path[:40] for f in m.files]
    assert (run_dir / "deliverables" / kept[0].path).read_bytes() == b"at the edge"
    over = [s for s in m.skipped if s.limit == "path"]
    assert over and over[0].path.startswith(top), m.skipped
    assert m.limits is not None and m.limits.max_path_bytes == edge
    warnings = result.extra.get("warnings", [])
    assert any(top in w for w in warnings), warnings  # the record keeps the exact name ...
    from ale.cli.main import _print_result

    _print_result(result, run_dir)
    printed = capsys.readouterr().err
    assert "\x1b" not in printed and "\x07" not in printed, printed  # ... the terminal never sees it raw
    assert "o\\x1b]52;c;aGVsbG8=\\x07" in printed


# -- a sparse file -----------------------------------------------------------------
BUILD_SPARSE = r'''
import os
with open("/workspace/sparse.bin", "wb") as f:
    f.write(b"head")
    f.seek(1024**3)
    f.write(b"tail")
    f.truncate(1024**3 + 64 * 1024**2)  # and a trailing hole
st = os.stat("/workspace/sparse.bin")
print("apparent", st.st_size, "allocated", st.st_blocks * 512)
'''


def test_a_sparse_file_stays_sparse_in_both_copies(docker_client, tmp_path, monkeypatch):
    """Item 3: a 1.06 GiB file that occupies a few KiB in the workspace occupies a few
    KiB in the deliverables and in the grader's working copy; its hash is the hash of
    its content, holes read as zeros (``ale verify`` re-reads it)."""
    copies: list[int] = []
    real = grader_mod.working_copy

    def measured(src, dest, **kw):
        out = real(src, dest, **kw)
        copies.append(_allocated(out))
        return out

    monkeypatch.setattr(grader_mod, "working_copy", measured)
    plan = _plan(tmp_path, [_py(BUILD_SPARSE), _shell(WRONG)])
    result, m = _run(docker_client, plan)
    assert result.status.value == "scored", (result.status, result.error)
    f = next(f for f in m.files if f.path == "sparse.bin")
    size = 1024**3 + 64 * MIB
    assert f.size == size
    h = hashlib.sha256(b"head" + bytes(1024**3 - 4) + b"tail" + bytes(64 * MIB - 4)).hexdigest()
    assert f.sha256 == h
    copy = plan.run_dir / "deliverables" / "sparse.bin"
    assert copy.stat().st_size == size and copy.stat().st_blocks * 512 < MIB, copy.stat()
    assert _allocated(plan.run_dir) < 32 * MIB
    assert copies and all(c < MIB for c in copies), copies  # the grader's working copy, each attempt


# -- SysV shared memory ---------------------------------------------------------------
SHM_FILL = r'''
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
ids, err = [], None
for _ in range(64):  # 512 MiB asked for, in 8 MiB segments, each touched
    i = libc.shmget(0, 8 << 20, 0o1000 | 0o600)
    if i < 0:
        err = ctypes.get_errno()
        break
    addr = libc.shmat(i, None, 0)
    ctypes.memset(addr, 1, 8 << 20)
    ids.append(i)
print("SHM", json.dumps({"segments": len(ids), "errno": err}))
'''


def _host_shm() -> set[str]:
    with open("/proc/sysvipc/shm") as f:
        return {line.split()[1] for line in f.readlines()[1:]}


def test_a_sysv_shared_memory_fill_is_bounded_and_dies_with_its_owner(docker_client, tmp_path):
    """Item 5: SysV segments stop at the policy's kernel.shmall (inside the memory
    budget), and die with the process that made them (kernel.shm_rmid_forced=1); the
    sandbox's inspect shows the sysctls and the seal rule re-checks them."""
    before = _host_shm()
    plan = _plan(tmp_path, [_py(SHM_FILL), _shell("echo SEGMENTS-LEFT $(( $(wc -l < /proc/sysvipc/shm) - 1 ))"),
                            _shell(WRONG)])
    result, _ = _run(docker_client, plan)
    out = _stdout(plan.run_dir)
    fill = json.loads(out.split("SHM ", 1)[1].split("\n", 1)[0])
    limit = plan.policy.sysv_shm_bytes
    assert limit == 32 * MIB and fill["segments"] * 8 * MIB <= limit and fill["errno"] == 28, fill  # ENOSPC
    assert "SEGMENTS-LEFT 0" in out, out
    inspect = json.loads((plan.run_dir / "evidence" / "inspect-before.json").read_text())
    assert inspect["HostConfig"]["Sysctls"] == plan.policy.sysctls
    checks = json.loads((plan.run_dir / "evidence" / "checks.json").read_text())
    assert [c["ok"] for c in checks if c["id"] == "dev.sysctls"] == [True, True]
    assert _host_shm() == before, "a segment outlived the sandbox on the host"


# -- a process that dumps core -----------------------------------------------------------
def test_a_core_dumping_process_leaves_no_core_and_the_pattern_is_recorded(docker_client, tmp_path):
    """Item 5: RLIMIT_CORE is 0, soft and hard (the candidate cannot raise it): a
    crashing process leaves no core file in the workspace; the host's core_pattern
    is in the engine evidence."""
    crash = ("cd /workspace; ulimit -c unlimited; echo RAISED=$?; echo HARD=$(ulimit -Hc); "
             "python3 -c 'import os; os.abort()'; echo RC=$?; "
             "sh -c 'kill -SEGV $$'; ls /workspace")
    plan = _plan(tmp_path, [_shell(crash), _shell(WRONG)])
    result, m = _run(docker_client, plan)
    out = _stdout(plan.run_dir)
    assert "RAISED=0" not in out and "HARD=0" in out and "RC=134" in out, out
    assert not [f.path for f in m.files if f.path.startswith("core")], m.files
    inspect = json.loads((plan.run_dir / "evidence" / "inspect-before.json").read_text())
    assert inspect["HostConfig"]["Ulimits"] == [{"Name": "core", "Hard": 0, "Soft": 0}]
    checks = json.loads((plan.run_dir / "evidence" / "checks.json").read_text())
    assert [c["ok"] for c in checks if c["id"] == "limits.ulimits"] == [True, True]
    engine = json.loads((plan.run_dir / "evidence" / "engine.json").read_text())
    with open("/proc/sys/kernel/core_pattern") as f:
        assert engine["core_pattern"] == f.read().rstrip("\n")
    assert engine["core_pattern_pipe"] is engine["core_pattern"].startswith("|")


# -- names the run folder folds together ---------------------------------------------------
BUILD_NAMES = r'''
import os, unicodedata
os.chdir("/workspace")
def put(name, data):
    with open(name, "wb") as f:
        f.write(data)
put("ANSWER.JSON", b"upper")
put("Answer.json", b"title")
put(unicodedata.normalize("NFC", "caf\u00e9"), b"nfc")
put(unicodedata.normalize("NFD", "caf\u00e9"), b"nfd")
put("\u01c4", b"DZ caron"); put("\u01c5", b"Dz caron"); put("\u01c6", b"dz caron")
os.mkdir("Dir"); put("Dir/x", b"upper dir")
os.mkdir("dir"); put("dir/x", b"lower dir")
put("_ALE-NAME-0000000000000000", b"looks like a safe name")
'''


def test_names_a_folding_run_folder_would_merge_are_stored_under_safe_names(docker_client, tmp_path, monkeypatch):
    """Item 5: on a run folder that folds case and Unicode (as probed), names that
    fold together keep the first under its name and store the others under safe
    names; every exact name is in the record, every copy is what the candidate
    wrote. This host has no folding file system (its kernel lacks CONFIG_UNICODE),
    so the probe's answer is set to what macOS or ext4 casefold would say; the same
    names on this folder are kept as they are (the second run)."""
    monkeypatch.setattr(deliverables_mod, "probe_folding", lambda fd: Folding(case=True, unicode=True))
    plan = _plan(tmp_path, [_py(BUILD_NAMES), _shell(WRONG)])
    result, m = _run(docker_client, plan)
    assert result.status.value == "scored", (result.status, result.error)
    assert m.folding == {"case": True, "unicode": True}
    stored = {f.stored_path for f in m.files} | {d.stored_as or d.path for d in m.directories}
    folded = [Folding(True, True).key(s.encode()) for s in stored if "/" not in s]
    assert len(folded) == len(set(folded)), sorted(stored)  # no two stored names fold together
    by_path = {f.path: f for f in m.files}
    for name, data in [("ANSWER.JSON", b"upper"), ("Answer.json", b"title"), ("caf\u00e9", b"nfc"),
                       ("cafe\u0301", b"nfd"), ("\u01c4", b"DZ caron"), ("\u01c5", b"Dz caron"),
                       ("\u01c6", b"dz caron"), ("Dir/x", b"upper dir"), ("dir/x", b"lower dir"),
                       ("answer.json", b'{"words": 0, "lines": 0}\n')]:
        assert (plan.run_dir / "deliverables" / by_path[name].stored_path).read_bytes() == data, name
    renamed = [f for f in m.files if f.stored_as]
    assert renamed and all(f.stored_as.split("/")[0].startswith("_ale-name-") or "/" in f.stored_as for f in renamed)

    monkeypatch.undo()  # the same names on this run folder, which folds nothing: kept as they are
    plan = _plan(tmp_path, [_py(BUILD_NAMES), _shell(WRONG)])
    result, m = _run(docker_client, plan)
    assert m.folding == {"case": False, "unicode": False} and not [f for f in m.files if f.stored_as]


# -- the harness's own copy fails --------------------------------------------------------
def test_an_entry_the_graders_copy_cannot_hold_is_warned_about_never_a_grading_failure(docker_client, tmp_path, monkeypatch):
    """Item 2: a failure of the harness's own working copy (here every copy of one
    file fails, as a full scratch disk or a folding scratch folder would make it) is
    never the grading's: the grader grades what was copied, the run warns, and the
    signed deliverables are whole."""
    real = grader_mod.copy_keeping_holes

    def failing(src, dst, **kw):
        if os.fstat(src).st_size == len(b"the harness cannot copy me"):
            raise OSError(28, "No space left on device")
        return real(src, dst, **kw)

    monkeypatch.setattr(grader_mod, "copy_keeping_holes", failing)
    plan = _plan(tmp_path, [_shell("printf 'the harness cannot copy me' > /workspace/extra.txt"), _shell(WRONG)])
    result, m = _run(docker_client, plan)
    assert result.status.value == "scored" and result.attempt == 1, (result.status, result.error)
    assert {f.path for f in m.files} == {"answer.json", "extra.txt"}
    warnings = result.extra.get("warnings", [])
    assert any("working copy left out 1 entry" in w and "extra.txt" in w for w in warnings), warnings
    events = [json.loads(line) for line in (plan.run_dir / "events.jsonl").read_text().splitlines()]
    assert [e for e in events if e.get("type") == "grading.copy_incomplete"], [e.get("type") for e in events]


# -- an exec the candidate stops as it starts -------------------------------------------
STOPPER = r'''
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN)
me = os.getpid()
while not os.path.exists("/tmp/go"):
    time.sleep(0.002)
while True:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in (1, me):
            continue
        try:
            if b"/tmp/go" in open(f"/proc/{p}/cmdline", "rb").read():
                continue
        except OSError:
            pass
        try:
            os.kill(int(p), signal.SIGSTOP)
        except OSError:
            pass
    time.sleep(0.001)
'''


def test_an_exec_the_candidate_stops_as_it_starts_never_wedges_the_run(docker_client, tmp_path):
    """A process that SIGSTOPs every other process, from the agent's last command on:
    the command's child stops, its timeout comes, and the harness's own cleanup exec
    (as the candidate's uid) is stopped as it starts, which holds the engine's lock on
    the container (inspect, exec, rm -f all wait). The host-side kill at the command's
    host deadline frees it: the run ends, graded and verified, within about a minute
    (it never ended before)."""
    daemon = _shell(f"cat > /tmp/s.py <<'ALE_EOF'\n{STOPPER}\nALE_EOF\n"
                    "setsid nohup python3 /tmp/s.py >/dev/null 2>&1 < /dev/null & sleep 0.3; echo started")
    last = {"tool": "shell", "args": {"command": WRONG + "; touch /tmp/go; sleep 3; echo done", "timeout": 5}}
    plan = _plan(tmp_path, [daemon, last])
    import time

    started = time.monotonic()
    result, _ = _run(docker_client, plan)
    took = time.monotonic() - started
    assert took < 120, took
    stop = json.loads((plan.run_dir / "evidence" / "stop.json").read_text())
    assert stop["within_bound"] and stop["halt"]["survivors"] == [], stop
