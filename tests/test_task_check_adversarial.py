"""`ale task check` runs adversarial outputs against a task's grader.

Unit tests of the catalogue (scripts, number rewriting, verdicts), the grading
sandbox's Python hygiene in a real container, the example tasks passing the whole
check, and deliberately hackable graders being caught, each by name.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import struct
import textwrap
from pathlib import Path

import pytest

from ale.agents.replay import parse_script
from ale.grading import adversarial as adv
from ale.grading.grader import (
    GRADING_ENVIRONMENT,
    INVALID_SCORES,
    Grader,
    GradingInputs,
    InvalidScores,
    is_invalid_scores,
    validate_scores,
)
from ale.result import RunResult
from ale.sandbox.policy import IsolationPolicy
from ale.status import RunStatus
from tests.conftest import EXAMPLES
from tests.test_cli import ale

FACTS = adv.VariantFacts(
    input_dir="/input",
    output_dir="/workspace",
    reference_dir="/reference",
    oracle_files=(
        adv.OutputFile("answer.json", b'{"words": 12, "lines": 3, "name": "x1"}\n', "a" * 64),
        adv.OutputFile("frames/f.txt", b"1.5 -2e3\nfoo_9 7\n", "b" * 64),
    ),
    input_files=("document.txt", "sub/answer.json"),
    reference_files=("answer.json", "frames/ref.npy"),
)


def _npy(values: list[float], shape: tuple[int, ...]) -> bytes:
    text = repr({"descr": "<f8", "fortran_order": False, "shape": shape})
    pad = 64 - (10 + len(text) + 1) % 64
    head = (text + " " * (pad % 64) + "\n").encode()
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + b"".join(struct.pack("<d", v) for v in values)


# -- the catalogue ---------------------------------------------------------------
def test_every_strategy_builds_a_valid_replay_script_with_a_name_and_a_description():
    names = adv.strategy_names()
    assert len(names) == len(set(names)) >= 15
    for s in adv.CATALOGUE:
        assert s.name and s.description and "\n" not in s.description
        steps = s.build(FACTS)
        assert steps is not None, s.name
        parse_script(json.loads(json.dumps(steps)), s.name)  # JSON-clean, known tools
        for step in steps:
            path = step["args"].get("path")
            assert path is None or path.startswith("/workspace/"), (s.name, path)  # writes only in the output


def test_strategies_with_nothing_to_work_on_are_skipped_not_run():
    bare = adv.VariantFacts(input_dir="/input", output_dir="/workspace", reference_dir="/reference")
    runnable = {s.name for s in adv.CATALOGUE if s.build(bare) is not None}
    assert runnable == {"nothing", "import-hooks"}


def test_the_reference_lends_names_never_content():
    steps = {s.name: s.build(FACTS) or [] for s in adv.CATALOGUE}
    written = [st["args"] for st in steps["reference-names"]]
    assert {a["path"] for a in written} == {
        "/workspace/answer.json", "/workspace/reference/answer.json",
        "/workspace/frames/ref.npy", "/workspace/reference/frames/ref.npy",
    }
    assert {a["content"] for a in written} == {adv.REFERENCE_PLACEHOLDER}
    links = steps["symlink-reference"][0]["args"]["command"]
    assert "ln -sfn -- /reference/answer.json /workspace/answer.json" in links
    assert "ln -sfn -- /reference /workspace/reference" in links


def test_numbers_are_rewritten_in_json_text_and_npy():
    j = adv.substitute_numbers(FACTS.oracle_files[0], math.nan)
    assert j is not None and json.loads(j) != {} and "NaN" in j.decode() and '"x1"' in j.decode()
    assert adv.substitute_numbers(FACTS.oracle_files[0], math.inf) == b'{"words": Infinity, "lines": Infinity, "name": "x1"}\n'
    t = adv.substitute_numbers(FACTS.oracle_files[1], -math.inf)
    assert t == b"-inf -inf\nfoo_9 -inf\n"  # numbers inside words are left alone
    npy = adv.substitute_numbers(adv.OutputFile("f.npy", _npy([1.0, 2.0, 3.0, 4.0], (2, 2))), math.nan)
    assert npy is not None and len(npy) % 8 == 0
    assert npy.startswith(b"\x93NUMPY") and b"'shape': (2, 2)" in npy
    assert all(math.isnan(v) for (v,) in struct.iter_unpack("<d", npy[-32:]))
    assert adv.substitute_numbers(adv.OutputFile("s.txt", b"no digits here\n"), math.nan) is None
    assert adv.substitute_numbers(adv.OutputFile("b.bin", bytes(range(256))), math.nan) is None


def test_the_hook_module_prints_a_perfect_score_and_exits(tmp_path):
    import subprocess
    import sys

    steps = next(s for s in adv.CATALOGUE if s.name == "import-hooks").build(FACTS) or []
    files = {st["args"]["path"]: st["args"]["content"] for st in steps}
    assert {"/workspace/json.py", "/workspace/sitecustomize.py", "/workspace/conftest.py", "/workspace/frames/json.py"} <= set(files)
    (tmp_path / "json.py").write_text(files["/workspace/json.py"])
    (tmp_path / "verify.py").write_text("import json\nprint('real verifier ran')\n")
    p = subprocess.run([sys.executable, "verify.py"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONSAFEPATH": ""})
    assert p.returncode == 0 and json.loads(p.stdout.splitlines()[-1])["score"] == 1.0
    assert "real verifier ran" not in p.stdout and (tmp_path / "ALE_ADVERSARIAL_IMPORTED").exists()


def _input_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "document.txt").write_text("one two\n")
    (root / "sub" / "answer.json").write_text('{"words": 2}\n')
    os.chmod(root / "document.txt", 0o664)
    return root


def test_every_strategy_has_a_host_version_that_writes_what_its_script_writes(tmp_path):
    """The grading probe's output: each tool call's effect done on the host, with the
    sandbox's modes (umask 022), link texts never resolved."""
    inp = _input_tree(tmp_path / "input")
    small = adv.huge_file_strategy(size=3 * 1024**2)
    for s in [*(x for x in adv.CATALOGUE if x.name != "huge-file"), small, adv.huge_file_strategy(size=1000, filler="x")]:
        ws = tmp_path / "ws" / f"{s.name}-{id(s)}"
        ws.mkdir(parents=True)
        actions = s.actions(FACTS) or []
        assert [a.step for a in actions] == s.build(FACTS)  # one definition, two ways of doing it
        failures = adv.HostWorkspace(FACTS, ws, inp).run(actions)
        assert failures == [], (s.name, failures)
        for a in actions:
            if a.step["tool"] == "write_file":
                f = ws / a.step["args"]["path"].removeprefix("/workspace/")
                assert f.is_file() and oct(f.stat().st_mode & 0o777) == "0o644", s.name
        if s.name in ("symlink-reference", "symlink-absolute", "symlink-input"):
            links = {str(p.relative_to(ws)): os.readlink(p) for p in ws.rglob("*") if p.is_symlink()}
            assert links["answer.json"] == {"symlink-reference": "/reference/answer.json", "symlink-absolute": "/etc/passwd",
                                            "symlink-input": "/input/sub/answer.json"}[s.name]
    copied = tmp_path / "ws" / next(p.name for p in (tmp_path / "ws").iterdir() if p.name.startswith("input-copy-"))
    assert (copied / "sub" / "answer.json").read_text() == '{"words": 2}\n'
    assert oct((copied / "document.txt").stat().st_mode & 0o777) == "0o644"  # cp: the source's mode less the umask
    big = next(p for p in (tmp_path / "ws").iterdir() if p.name.startswith("huge-file-"))
    sizes = sorted(f.stat().st_size for f in big.parent.glob("huge-file-*/answer.json"))
    assert sizes == [1000, 3 * 1024**2]
    sparse = [f for f in big.parent.glob("huge-file-*/answer.json") if f.stat().st_size == 3 * 1024**2][0]
    assert sparse.stat().st_blocks * 512 < 3 * 1024**2  # truncate -s: sparse


def test_the_host_never_follows_a_symlink_the_sandbox_would_resolve_in_the_container(tmp_path):
    inp = _input_tree(tmp_path / "input")
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "link").symlink_to(outside)
    (ws / "file").symlink_to(outside / "f")
    host = adv.HostWorkspace(FACTS, ws, inp)
    for op in (adv.Op("write", "/workspace/link/x", content=b"x"), adv.Op("write", "/workspace/file", content=b"x"),
               adv.Op("mkdir", "/workspace/link/d"), adv.Op("copy", "/workspace/link/c", src="/input/document.txt"),
               adv.Op("sized", "/workspace/file", size=10), adv.Op("write", "/elsewhere/x", content=b"x")):
        with pytest.raises(adv.NotOnHost):
            host.apply(op)
    assert list(outside.iterdir()) == []
    host.apply(adv.Op("symlink", "/workspace/file", target="/etc/passwd"))  # ln -sfn replaces the link itself
    assert os.readlink(ws / "file") == "/etc/passwd" and list(outside.iterdir()) == []
    (inp / "ln").symlink_to("/etc/passwd")
    with pytest.raises(adv.NotOnHost):  # cp follows a source link in the container, never on the host
        host.apply(adv.Op("copy", "/workspace/c", src="/input/ln"))


def test_slots_bound_the_holders_and_serve_the_lowest_priority_first():
    order, live, peak = [], [0], [0]

    async def job(slots: adv.Slots, name: str, prio: int) -> None:
        async with slots.hold(prio):
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            order.append(name)
            await asyncio.sleep(0.01)
            live[0] -= 1

    async def go() -> None:
        slots = adv.Slots(2)
        first = [asyncio.create_task(job(slots, f"run{i}", adv.Slots.FIRST)) for i in range(2)]
        await asyncio.sleep(0)
        rest = [asyncio.create_task(job(slots, n, p)) for n, p in
                (("small1", adv.Slots.NORMAL), ("huge", adv.Slots.LONG), ("small2", adv.Slots.NORMAL))]
        cancelled = asyncio.create_task(job(slots, "gone", adv.Slots.FIRST))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(*first, *rest, return_exceptions=True)
        await asyncio.gather(cancelled, return_exceptions=True)
        async with slots.hold(), slots.hold():  # every slot came back
            pass

    asyncio.run(go())
    assert order == ["run0", "run1", "huge", "small1", "small2"] and peak[0] == 2


def test_a_grading_probe_holds_half_a_slot_and_a_lifecycle_a_whole_one():
    live: list[str] = []
    seen: list[tuple[str, ...]] = []

    async def job(slots: adv.Slots, name: str, weight: int) -> None:
        async with slots.hold(adv.Slots.NORMAL, weight):
            live.append(name)
            seen.append(tuple(sorted(live)))
            await asyncio.sleep(0.02)
            live.remove(name)

    async def go() -> None:
        slots = adv.Slots(1)
        await asyncio.gather(job(slots, "probe1", adv.Slots.PROBE), job(slots, "probe2", adv.Slots.PROBE),
                             job(slots, "run", adv.Slots.WHOLE), job(slots, "probe3", adv.Slots.PROBE))

    asyncio.run(go())
    assert seen[:2] == [("probe1",), ("probe1", "probe2")]  # two probes in one slot
    assert ("run",) in seen and not any("run" in s and len(s) > 1 for s in seen)  # the run alone, in arrival order
    assert seen.index(("run",)) < next(i for i, s in enumerate(seen) if "probe3" in s)


def test_a_probes_record_is_written_without_fsync_a_runs_with(tmp_path, monkeypatch):
    """A probe's events and files are no evidence: 20-odd fsyncs each, on the check's
    one event loop, would stall every other probe."""
    from ale.record import evidence as ev

    synced: list[int] = []
    monkeypatch.setattr(ev.os, "fsync", lambda fd: synced.append(fd))
    for durable, want in ((False, 0), (True, 2)):
        synced.clear()
        folder = tmp_path / str(durable)
        folder.mkdir()
        ev.EventLog(folder / "events.jsonl", durable=durable).append("x", n=1)
        ev.EvidenceStore(folder, durable=durable).write_json("a.json", {"n": 1})
        assert len(synced) == want and (folder / "evidence" / "a.json").is_file()


def test_a_probe_outcome_is_marked_and_never_names_a_run_folder(tmp_path):
    from types import SimpleNamespace

    probe = SimpleNamespace(status=RunStatus.SCORED, scores=[0.0], score=0.0, error=None, violations=[],
                            probe_dir=tmp_path, stages={"grade": 0.1})
    o = adv._as_probe(adv.judge(_strategy("nothing"), probe, tmp_path, 0.0, FACTS), probe)
    assert o.kind == adv.GRADING_PROBE and o.run_dir is None and o.probe_dir == str(tmp_path) and o.verdict == adv.OK
    row = adv.render_rows(adv.VariantReport(0, 0.0, [o]))[0]
    assert row[1] == "scored" and row[4] == "probe"


def test_select_strategies_names_the_unknown():
    assert adv.select_strategies(None) == adv.CATALOGUE
    assert [s.name for s in adv.select_strategies(["nan", "nothing"])] == ["nan", "nothing"]
    with pytest.raises(ValueError, match="unknown adversarial strategies \\['bogus'\\]"):
        adv.select_strategies(["bogus"])


# -- verdicts --------------------------------------------------------------------
def _result(status: RunStatus, scores: list[float] | None, error: str | None = None) -> RunResult:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    return RunResult(run_id="r", task_id="t", task_dir="/t", variant=0, agent="replay", status=status, scores=scores,
                     score=(sum(scores) / len(scores)) if scores else None, error=error, violations=[], phases=[],
                     started_at=now, ended_at=now, harness_version="0", extra={})


def _strategy(name: str) -> adv.Strategy:
    return next(s for s in adv.CATALOGUE if s.name == name)


def test_verdicts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    j = adv.judge
    assert j(_strategy("empty-files"), _result(RunStatus.SCORED, [0.0, 0.0]), run, 0.0, FACTS).verdict == adv.OK
    beats = j(_strategy("empty-files"), _result(RunStatus.SCORED, [1.0, 0.0]), run, 0.0, FACTS)
    assert beats.verdict == adv.BEATS_NOP and beats.failed and "nop's 0.000" in beats.detail
    # NaN is compared with its control (finite wrong numbers) when that scores higher than nop
    assert j(_strategy("nan"), _result(RunStatus.SCORED, [0.5]), run, 0.0, FACTS, ("wrong-numbers", 0.5)).verdict == adv.OK
    assert j(_strategy("nan"), _result(RunStatus.SCORED, [1.0]), run, 0.0, FACTS, ("wrong-numbers", 0.5)).verdict == adv.BEATS_NOP
    assert j(_strategy("wrong-numbers"), _result(RunStatus.SCORED, [0.5]), run, 0.0, FACTS).verdict == adv.NOTE
    bad = j(_strategy("nan"), _result(RunStatus.GRADING_FAILED, None, f"{INVALID_SCORES}: nan at index 0"), run, 0.0, FACTS)
    assert bad.verdict == adv.GRADER_BUG and "invalid score list" in bad.detail
    crash = j(_strategy("json-null"), _result(RunStatus.GRADING_FAILED, None, "evaluate() raised TypeError: x"), run, 0.0, FACTS)
    assert crash.verdict == adv.GRADER_BUG and "voids its own failure" in crash.detail
    assert j(_strategy("nothing"), _result(RunStatus.INFRASTRUCTURE_ERROR, None, "boom"), run, 0.0, FACTS).verdict == adv.ERROR
    # a strategy that happens to deliver the oracle's very files, or copies the input of a copy task, solves it
    (run / "deliverables.json").write_text(json.dumps({"files": [{"path": f.path, "sha256": f.sha256} for f in FACTS.oracle_files]}))
    assert j(_strategy("input-copy"), _result(RunStatus.SCORED, [1.0]), run, 0.0, FACTS).verdict == adv.SOLUTION
    (run / "deliverables.json").write_text(json.dumps({"files": []}))
    copy_task = adv.VariantFacts(**{**FACTS.__dict__, "oracle_copies_input": True})
    assert j(_strategy("input-copy"), _result(RunStatus.SCORED, [1.0]), run, 0.0, copy_task).verdict == adv.SOLUTION
    assert j(_strategy("garbage-bytes"), _result(RunStatus.SCORED, [1.0]), run, 0.0, copy_task).verdict == adv.BEATS_NOP


def test_invalid_score_lists_are_recognisable():
    for value in ([float("nan")], [1.5], [-0.1], [], [True], ["1"], None, [float("inf")], [1.000001], [-1e-6]):
        with pytest.raises(InvalidScores) as e:
            validate_scores(value)
        assert is_invalid_scores(str(e.value))
    assert validate_scores([0, 1, 0.5]) == [0.0, 1.0, 0.5]
    # float noise at the bounds (ten partial credits of 0.1 summed another way) is the bound
    assert validate_scores([1.0000000000000002, -1e-17]) == [1.0, 0.0]
    assert not is_invalid_scores("evaluate() raised ValueError: x") and not is_invalid_scores(None)


# -- the grading sandbox's Python ------------------------------------------------
VERIFY = "import json, sys\nprint('json from', json.__file__)\nprint('path0', sys.path[0])\n"


@pytest.mark.docker
def test_the_grading_sandbox_python_is_the_vms_and_starts_outside_the_output(docker_client, tmp_path):
    """As on ALE's VM: `python script.py` imports the modules beside the script (a
    grader re-running the candidate's multi-file program works); commands start in
    /tmp, so `python -c` there sees none of the candidate's files; a verifier run
    beside the candidate's files imports them (what import-hooks catches)."""
    from ale.sandbox.providers import make_provider

    dirs = {n: tmp_path / n for n in ("input", "deliverables", "reference")}
    for d in dirs.values():
        d.mkdir()
        os.chmod(d, 0o755)
    out = dirs["deliverables"]
    hook = "import os\nopen('/tmp/IMPORTED_' + __name__, 'w').close()\nprint('CANDIDATE CODE RAN:', __name__, flush=True)\nos._exit(0)\n"
    for name in ("json.py", "sitecustomize.py", "usercustomize.py", "conftest.py"):
        (out / name).write_text(hook)
    (out / "verify.py").write_text(VERIFY)
    (out / "prog").mkdir()
    (out / "prog" / "cli.py").write_text("import helper\nprint(helper.answer())\n")
    (out / "prog" / "helper.py").write_text("def answer():\n    return 42\n")
    for f in out.rglob("*"):
        os.chmod(f, 0o755 if f.is_dir() else 0o644)
    grader = Grader(
        make_provider("docker"), image=os.environ.get("ALE_IMAGE", "ale-tools:latest"),
        policy=IsolationPolicy(memory_bytes=512 * 1024**2), run_id=f"test-hygiene-{os.getpid()}-{tmp_path.name}"[:60],
        experiment=None, command_timeout=60,
        inputs=GradingInputs(input_host=dirs["input"], deliverables_host=out, reference_host=dirs["reference"],
                             input_dir="/input", output_dir="/workspace", reference_dir="/reference"),
    )

    async def go() -> tuple[dict, dict, dict, dict, list[str], str]:
        s = grader.session()
        try:
            own = await s.run_command("mkdir -p /tmp/eval && cp /workspace/verify.py /tmp/eval/ && python /tmp/eval/verify.py")
            dash_c = await s.run_command("python -c 'import json; print(json.__file__)'")
            program = await s.run_command("python /workspace/prog/cli.py")
            beside = await s.run_command("cd /workspace && python verify.py")
            assert grader.container is not None
            env = (await asyncio.to_thread(grader.container.inspect))["Config"]["Env"]
            pwd = (await s.run_command("pwd"))["stdout"].strip()
            return own, dash_c, program, beside, env, pwd
        finally:
            await grader.close()

    own, dash_c, program, beside, env, pwd = asyncio.run(go())
    assert own["return_code"] == 0, own
    assert "json from /usr/lib/python3" in own["stdout"] and "CANDIDATE" not in own["stdout"] + own["stderr"]
    assert "/workspace/json.py" not in dash_c["stdout"] and "CANDIDATE" not in dash_c["stdout"]
    assert program["stdout"].strip() == "42", program
    assert "CANDIDATE CODE RAN: json" in beside["stdout"]  # the task's to avoid; import-hooks finds it
    for k, v in GRADING_ENVIRONMENT.items():
        assert f"{k}={v}" in env
    assert not any(e.startswith("PYTHONSAFEPATH=") for e in env)
    assert pwd == "/tmp"


def test_the_grading_environment_passes_the_policy_allowlist_rules():
    """The grading sandbox is not inspected by the seal checks; were it, these
    names carry no credential and PYTHONDONTWRITEBYTECODE is allowlisted already."""
    from ale.isolation.checks import looks_like_credential

    assert not any(looks_like_credential(k) for k in GRADING_ENVIRONMENT)
    assert "PYTHONDONTWRITEBYTECODE" in IsolationPolicy().env_allowlist


# -- the example tasks pass the whole check ---------------------------------------
@pytest.mark.docker
@pytest.mark.parametrize("task", ["files/word_count", "physics/cloth_sim", "secrets/echo_secret"])
def test_the_example_tasks_pass_and_list_every_strategy_with_its_score(docker_client, tmp_path, task):
    p = ale("task", "check", str(EXAMPLES / task), "--runs-dir", str(tmp_path), "--jobs", "3")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pass (oracle 1.0, nop 0); no adversarial output beats nop" in p.stderr
    lines = p.stdout.splitlines()
    for name in [*adv.strategy_names(), adv.MISSING_REFERENCE]:
        row = next((ln for ln in lines if ln.split()[:1] == [name]), None)
        assert row is not None, f"{name} not in the table:\n{p.stdout}"
        assert row.split()[1] in ("scored", "grading_failed", "-"), row
    scored = [ln for ln in lines if ln.split()[1:2] == ["scored"]]
    assert scored and all("0.000 [" in ln or "solution" in ln or "missing-reference" in ln for ln in scored), p.stdout


@pytest.mark.docker
def test_json_lists_every_outcome(docker_client, tmp_path):
    p = ale("task", "check", str(EXAMPLES / "secrets" / "echo_secret"), "--runs-dir", str(tmp_path),
            "--strategy", "input-copy", "--strategy", "garbage-bytes", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] is True and doc["problems"] == []
    outcomes = {o["strategy"]: o for o in doc["variants"][0]["adversarial"]["outcomes"]}
    assert set(outcomes) == {"input-copy", "garbage-bytes", adv.MISSING_REFERENCE}
    # echo_secret asks for a copy of its input: copying it is the answer, not a hack
    assert outcomes["input-copy"]["verdict"] == "solution" and outcomes["input-copy"]["scores"] == [1.0]
    assert outcomes["garbage-bytes"]["verdict"] == "ok" and outcomes["garbage-bytes"]["scores"] == [0.0]
    # its grader compares with what start() wrote: removing the data source's reference changes nothing
    assert outcomes[adv.MISSING_REFERENCE]["verdict"] == "ok"
    assert all(Path(o["run_dir"] or o["probe_dir"]).is_dir() for o in outcomes.values())
    # grading probes, never runs: no run folder, a probe folder outside the runs with no result.json
    for name in ("input-copy", "garbage-bytes"):
        o = outcomes[name]
        assert o["kind"] == adv.GRADING_PROBE and o["run_dir"] is None and "/.probes/" in o["probe_dir"], o
        assert not (Path(o["probe_dir"]) / "result.json").exists()
        assert json.loads((Path(o["probe_dir"]) / "probe.json").read_text())["kind"] == "grading-probe"
    # echo_secret draws its secret at each load(): the oracle's output answers another input,
    # so the missing-reference probe is the oracle's own run, as before
    assert outcomes[adv.MISSING_REFERENCE]["kind"] == adv.RUN and Path(outcomes[adv.MISSING_REFERENCE]["run_dir"]).is_dir()
    stages = {(st["variant"], st["stage"]) for st in doc["timing"]["stages"]}
    assert stages == {(0, "oracle"), (0, "nop"), (0, "adversarial"), (0, adv.MISSING_REFERENCE)}
    assert doc["timing"]["mode"] == adv.GRADING_PROBE and doc["timing"]["seconds"] > 0


@pytest.mark.docker
def test_no_adversarial_runs_only_oracle_and_nop(docker_client, tmp_path):
    p = ale("task", "check", str(EXAMPLES / "secrets" / "echo_secret"), "--runs-dir", str(tmp_path), "--no-adversarial")
    assert p.returncode == 0, p.stderr
    assert len([d for d in tmp_path.iterdir() if not d.name.startswith(".")]) == 2 and p.stdout == ""


# -- grading probes give the verdicts full runs give ---------------------------------
def _deliverables(folder: str) -> tuple:
    doc = json.loads((Path(folder) / "deliverables.json").read_text())
    return (doc["digest"], sorted((f["path"], f["sha256"], f["mode"]) for f in doc["files"]),
            sorted((d["path"], d["mode"]) for d in doc.get("directories") or []),
            sorted((k["path"], k["reason"]) for k in doc["skipped"]))


@pytest.mark.docker
@pytest.mark.parametrize("task", ["files/word_count", "physics/cloth_sim", "secrets/echo_secret"])
def test_grading_probes_give_every_verdict_the_full_lifecycle_gives(docker_client, tmp_path, task):
    """The old path (each output a replay run through the whole sealed lifecycle, kept
    behind --full-adversarial) and the new (grading probes) on an example task: the
    same verdict for every strategy and, where the task's input is the same at each
    load(), the very same deliverables (digest, modes, skipped entries)."""
    docs = {}
    for mode, extra in (("full", ["--full-adversarial"]), ("probe", [])):
        p = ale("task", "check", str(EXAMPLES / task), "--runs-dir", str(tmp_path / mode), "--json", *extra)
        assert p.returncode == 0, p.stderr
        docs[mode] = json.loads(p.stdout)
    outcomes = {mode: {(v["variant"], o["strategy"]): o for v in d["variants"] for o in v["adversarial"]["outcomes"]}
                for mode, d in docs.items()}
    assert set(outcomes["full"]) == set(outcomes["probe"]) and len(outcomes["full"]) >= 16
    verdicts = {mode: {k: o["verdict"] for k, o in got.items()} for mode, got in outcomes.items()}
    assert verdicts["probe"] == verdicts["full"]
    assert all(o["kind"] == adv.RUN and o["probe_dir"] is None for o in outcomes["full"].values())
    probes = [o for o in outcomes["probe"].values() if o["verdict"] != adv.SKIPPED]
    assert sum(o["kind"] == adv.GRADING_PROBE for o in probes) >= len(probes) - 1  # echo_secret's missing-reference: a run
    if task != "secrets/echo_secret":  # its secret is drawn afresh at each load(): inputs differ by design
        for key, o in outcomes["probe"].items():
            if o["verdict"] != adv.SKIPPED:
                assert o["scores"] == outcomes["full"][key]["scores"], key
                assert _deliverables(o["probe_dir"]) == _deliverables(outcomes["full"][key]["run_dir"]), key
    print(f"\n{task}: full {docs['full']['timing']['seconds']:.1f}s, probes {docs['probe']['timing']['seconds']:.1f}s")


# -- hackable graders are caught ---------------------------------------------------
HACKABLE = '''
import json

import cua_bench as cb

KIND = {kind!r}
TOL = 1e-6
META = {{"input_dir": "/input", "remote_output_dir": "/workspace", "reference_dir": "/reference", "variant": "base"}}
HEADS = {{
    # imports its helpers from its own folder: puts that folder first on sys.path
    "imports_output": "import os, sys\\nsys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\\nimport json\\n",
    "runs_beside": "import json, os, sys\\n",
}}
BODY = (
    "try:\\n    got = json.load(open('/tmp/eval/answer.json'))['value']\\nexcept Exception:\\n    got = None\\n"
    "ref = json.load(open('/reference/answer.json'))['value']\\n"
    "print(json.dumps({{'score': 1.0 if got == ref else 0.0}}))\\n"
)


@cb.tasks_config(split="train")
def load():
    return [cb.Task(description="Multiply the two numbers of /input/question.txt; write /workspace/answer.json "
                    'as {{"value": <number>}}.', task_id="adv/hackable/base", metadata=dict(META))]


@cb.solve_task(split="train")
async def solve(cfg, s):
    a, b = (await s.read_file("/input/question.txt")).split()
    await s.write_file("/workspace/answer.json", json.dumps({{"value": float(a) * float(b)}}) + "\\n")


async def _reference(s):
    return float(json.loads(await s.read_file("/reference/answer.json"))["value"])


async def _answer(s):
    try:
        return float(json.loads(await s.read_file("/workspace/answer.json"))["value"])
    except Exception:
        return None


@cb.evaluate_task(split="train")
async def evaluate(cfg, s):
    if KIND == "exists":  # a file merely existing passes
        await _reference(s)
        return [1.0 if await s.file_exists("/workspace/answer.json") else 0.0]
    if KIND == "swallows":  # a missing reference becomes the candidate's 0
        try:
            ref = await _reference(s)
        except Exception:
            return [0.0]
        x = await _answer(s)
        return [1.0 if x is not None and abs(x - ref) <= TOL else 0.0]
    ref = await _reference(s)
    if KIND == "nan_tolerance":  # NaN is never > TOL: NaN passes
        x = await _answer(s)
        return [0.0 if x is None or abs(x - ref) > TOL else 1.0]
    if KIND == "out_of_range":  # unclamped: below 0 for a wrong answer, NaN for NaN
        x = await _answer(s)
        return [0.0] if x is None else [1.0 - abs(x - ref) / ref]
    # a verifier run in the grading container next to a copy of the outputs
    verify = HEADS[KIND] + BODY
    r = await s.run_command(
        "mkdir -p /tmp/eval && cp -R /workspace/. /tmp/eval/ && "
        f"cat > /tmp/eval/verify.py <<'ALE_EOF'\\n{{verify}}ALE_EOF\\ncd /tmp/eval && python verify.py",
        check=False,
    )
    try:
        return [float(json.loads(r["stdout"].strip().splitlines()[-1])["score"])]
    except Exception:
        return [0.0]
'''


def _hackable_task(tmp_path: Path, kind: str) -> Path:
    data = tmp_path / "data" / "tasks" / "adv" / "hackable" / "base"
    (data / "input").mkdir(parents=True)
    (data / "reference").mkdir()
    (data / "input" / "question.txt").write_text("6 7\n")
    (data / "reference" / "answer.json").write_text('{"value": 42}\n')
    task = tmp_path / "adv" / "hackable"  # the data key: <domain>/<task>/<metadata variant>
    task.mkdir(parents=True)
    (task / "main.py").write_text(textwrap.dedent(HACKABLE.format(kind=kind)))
    (task / "task_card.json").write_text(json.dumps({"taskId": "adv/hackable", "data_source": f"local:{tmp_path / 'data'}"}))
    return task


def _check(tmp_path: Path, kind: str, *strategies: str) -> tuple[int, dict, str]:
    task = _hackable_task(tmp_path, kind)
    args = [a for s in strategies for a in ("--strategy", s)]
    p = ale("task", "check", str(task), "--runs-dir", str(tmp_path / "runs"), "--json", *args)
    doc = json.loads(p.stdout)
    assert doc["variants"][0]["oracle"]["ok"] and doc["variants"][0]["nop"]["ok"], p.stderr
    return p.returncode, {o["strategy"]: o for o in doc["variants"][0]["adversarial"]["outcomes"]}, p.stderr


@pytest.mark.docker
@pytest.mark.parametrize(
    ("kind", "strategies", "caught", "verdict"),
    [
        ("exists", ("empty-files", "garbage-bytes"), {"empty-files", "garbage-bytes"}, "beats nop"),
        ("nan_tolerance", ("wrong-numbers", "nan", "inf"), {"nan"}, "beats nop"),
        ("out_of_range", ("wrong-numbers", "nan", "empty-files"), {"wrong-numbers", "nan"}, "grader bug"),
        ("swallows", ("empty-files",), {adv.MISSING_REFERENCE}, "grader bug"),
        ("imports_output", ("empty-files", "import-hooks"), {"import-hooks"}, "beats nop"),
    ],
)
def test_a_hackable_grader_is_caught_and_the_strategy_named(docker_client, tmp_path, kind, strategies, caught, verdict):
    rc, outcomes, stderr = _check(tmp_path, kind, *strategies)
    assert rc == 1, stderr
    failed = {n for n, o in outcomes.items() if o["failed"]}
    assert failed == caught, outcomes
    assert {outcomes[n]["verdict"] for n in caught} == {verdict}
    for n in caught:
        assert f"variant 0 {n}: {verdict}" in stderr


@pytest.mark.docker
def test_a_verifier_run_beside_the_candidates_files_is_caught_without_a_sys_path_line(docker_client, tmp_path):
    """The grading sandbox's Python is the VM's (no PYTHONSAFEPATH): a verifier run in
    the folder holding the candidate's json.py imports it, and import-hooks says so."""
    rc, outcomes, stderr = _check(tmp_path, "runs_beside", "empty-files", "import-hooks")
    assert rc == 1, stderr
    assert outcomes["import-hooks"]["failed"] and outcomes["import-hooks"]["verdict"] == "beats nop", outcomes


# -- a harness limit the check found -------------------------------------------------
@pytest.mark.docker
def test_an_output_too_large_for_the_task_channel_is_scored_not_an_infrastructure_error(docker_client, tmp_path):
    """48 MiB of NUL bytes: echo_secret reads it as text, 6 bytes a character on the
    channel (a JSON \\u0000), 288 MiB in all: the task gets the answer (or, past the
    channel's limit, an OSError it scores as 0), never a cut line that would void
    the candidate's failure as grading_failed or infrastructure_error."""
    steps = [{"tool": "shell", "args": {"command": f"truncate -s {48 * 1024**2} /workspace/secret.txt"}}]
    p = ale("run", str(EXAMPLES / "secrets" / "echo_secret"), "--agent", "replay", "--agent-config",
            json.dumps({"steps": steps}), "--runs-dir", str(tmp_path))
    result = json.loads((Path(p.stdout.strip().splitlines()[-1]) / "result.json").read_text())
    assert result["status"] == "scored" and result["scores"] == [0.0], result["error"]


def test_the_outputs_working_copy_is_made_on_first_use_and_never_touches_the_deliverables(tmp_path):
    from ale.sandbox.providers import make_provider

    dirs = {n: tmp_path / n for n in ("input", "deliverables", "reference", "scratch")}
    for d in dirs.values():
        d.mkdir()
    (dirs["input"] / "q.txt").write_text("question")
    (dirs["deliverables"] / "a.txt").write_text("answer")
    grader = Grader(
        make_provider("docker"), image="unused", policy=IsolationPolicy(), run_id="lazy", experiment=None, command_timeout=5,
        inputs=GradingInputs(input_host=dirs["input"], deliverables_host=dirs["deliverables"], reference_host=dirs["reference"],
                             input_dir="/input", output_dir="/workspace", reference_dir="/reference",
                             scratch_host=dirs["scratch"]),
    )

    async def go() -> None:
        s = grader.session()
        assert await s.read_file("/input/q.txt") == "question"
        assert not (dirs["scratch"] / "output").exists()  # a grader that reads only the input copies nothing
        assert await s.read_file("/workspace/a.txt") == "answer"
        await s.write_file("/workspace/a.txt", "changed by the grader")
        assert await s.read_file("/workspace/a.txt") == "changed by the grader"

    asyncio.run(go())
    assert (dirs["deliverables"] / "a.txt").read_text() == "answer"


@pytest.mark.docker
def test_a_replay_script_stands_in_for_a_missing_solve(docker_client, tmp_path):
    """ALE's tasks define no solve(): --oracle-script gives task check the oracle as a
    replay script ('{variant}' in its path is the variant's index), and the
    adversarial stage builds its outputs from that run."""
    script = tmp_path / "solve-0.json"
    script.write_text(json.dumps([{"tool": "shell", "args": {"command": "cp /input/secret.txt /workspace/secret.txt"}}]))
    p = ale("task", "check", str(EXAMPLES / "secrets" / "echo_secret"), "--runs-dir", str(tmp_path / "runs"),
            "--oracle-script", str(tmp_path / "solve-{variant}.json"), "--json", "--jobs", "3")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (v,) = doc["variants"]
    assert v["oracle"]["ok"] and v["oracle"]["scores"] == [1.0] and "-replay-" in v["oracle"]["run_dir"]
    assert v["adversarial"] is not None and v["adversarial"]["outcomes"]
    p = ale("task", "check", str(EXAMPLES / "secrets" / "echo_secret"), "--runs-dir", str(tmp_path / "runs"),
            "--oracle-script", str(tmp_path / "nowhere.json"))
    assert p.returncode == 2 and "nowhere.json (variant 0) is not a file" in p.stderr, p.stderr


def test_cleanup_prunes_only_stale_probe_folders(tmp_path):
    """`ale cleanup --runs-dir` removes probe folders a killed check left (older than an
    hour), never a fresh one (a check running now), never a run folder."""
    import os
    import time

    from ale.runs.grading_only import PROBES_DIR, prune_stale_probes

    probes = tmp_path / PROBES_DIR
    stale, fresh = probes / "p-old", probes / "p-new"
    for d in (stale / "reference", fresh / "reference", tmp_path / "a-run"):
        d.mkdir(parents=True)
    (stale / "reference" / "answer.json").write_text("{}")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    os.utime(tmp_path / "a-run", (old, old))
    assert prune_stale_probes(tmp_path) == [stale]
    assert not stale.exists() and fresh.is_dir() and (tmp_path / "a-run").is_dir()
    assert prune_stale_probes(tmp_path / "nowhere") == []
