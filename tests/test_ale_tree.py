"""ALE's corpus shapes, on trees we write (tests/ale_tree.py): namespace trees,
per-run task processes, the tree's environment, the public package, session
parity, ALE's data layout, refusing what the provider cannot run."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import PreflightError, execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.session import Interface
from ale.status import RunStatus
from ale.tasks.environment import resolve_environment
from ale.tasks.errors import TaskError
from ale.tasks.listing import list_tasks
from ale.tasks.process import TaskCallFailed, TaskProcess, TaskProcessError, inspect_task_sync
from tests.ale_tree import make_data, make_tree, write
from tests.conftest import TOOLS_IMAGE, our_containers


class FakeSession:
    """An in-memory session: files by path, commands refused."""

    def __init__(self, files: dict[str, str] | None = None):
        self.files = dict(files or {})
        self.interface = Interface(self)
        self.made: list[str] = []

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        if path not in self.files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return self.files[path]

    async def read_bytes(self, path: str) -> bytes:
        return (await self.read_file(path)).encode()

    async def write_file(self, path: str, content: str) -> None:
        self.files[path] = content

    async def write_bytes(self, path: str, content: bytes) -> None:
        self.files[path] = content.decode()

    async def file_exists(self, path: str) -> bool:
        return path in self.files

    async def make_dir(self, path: str) -> None:
        self.made.append(path)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "ale", data_root=make_data(tmp_path / "data"))


def _alpha_files(info, answer: str) -> dict[str, str]:
    m = info.variants[0].metadata
    return {f"{m['remote_output_dir']}/answer.txt": answer, f"{m['reference_dir']}/expected.txt": "forty two\n"}


# -- task processes (no Docker) ---------------------------------------------------
def test_a_namespace_tree_loads_with_its_root_importable(tree: Path) -> None:
    assert not (tree / "__init__.py").exists()
    info = inspect_task_sync(tree / "lab" / "alpha")
    (v,) = info.variants
    assert v.task_dir == "/media/user/data/agenthle/lab/alpha/base"
    assert v.input_dir == f"{v.task_dir}/input" and v.output_dir == f"{v.task_dir}/output"
    assert v.public_root == v.task_dir and v.data_key.relpath == "tasks/lab/alpha/base"
    assert info.functions == {"load", "start", "solve", "evaluate"}


@pytest.mark.parametrize("order", [("alpha", "beta"), ("beta", "alpha")])
def test_twin_score_outputs_modules_never_mix_in_any_order(tree: Path, order: tuple[str, str]) -> None:
    async def go() -> dict[str, list[float]]:
        out = {}
        for name in order:
            async with TaskProcess(tree / "lab" / name) as proc:
                if name == "alpha":
                    session = FakeSession(_alpha_files(proc.info, "Forty  TWO"))
                else:
                    session = FakeSession()
                    session.run_command = _verdict("PASS")  # type: ignore[method-assign]
                out[name] = await proc.call("evaluate", 0, session)
        return out

    assert asyncio.run(go()) == {"alpha": [1.0], "beta": [1.0]}


def _verdict(text: str):
    async def run_command(command: str, **kw):
        assert command.startswith("python /tmp/agenthle_eval/beta/verify.py"), command
        return {"stdout": text + "\n", "stderr": "", "return_code": 0 if text == "PASS" else 1}

    return run_command


def test_twin_modules_never_mix_under_concurrency(tree: Path) -> None:
    async def one(name: str, answer: str) -> list[float]:
        async with TaskProcess(tree / "lab" / name) as proc:
            if name == "alpha":
                return await proc.call("evaluate", 0, FakeSession(_alpha_files(proc.info, answer)))
            session = FakeSession()
            session.run_command = _verdict(answer)  # type: ignore[method-assign]
            return await proc.call("evaluate", 0, session)

    async def go():
        return await asyncio.gather(*(one(n, a) for n, a in [("alpha", "forty two"), ("beta", "PASS"), ("alpha", "no"), ("beta", "FAIL")] * 2))

    assert asyncio.run(go()) == [[1.0], [1.0], [0.0], [0.0]] * 2


def test_a_lazy_tasks_import_inside_evaluate_sees_the_tree(tree: Path) -> None:
    async def go():
        async with TaskProcess(tree / "lab" / "beta") as proc:
            session = FakeSession()
            session.run_command = _verdict("PASS")  # type: ignore[method-assign]
            scores = await proc.call("evaluate", 0, session)
            return scores, session

    scores, session = asyncio.run(go())
    assert scores == [1.0]
    assert session.made == ["/tmp/agenthle_eval/beta"]  # interface.create_dir reached the harness
    assert "import sys" in session.files["/tmp/agenthle_eval/beta/verify.py"]


def test_module_state_survives_from_start_to_evaluate(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", '''
        import cua_bench as cb
        WINDOW = {}
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.setup_task
        async def start(cfg, session):
            WINDOW["pid"] = 4242
        @cb.evaluate_task
        async def evaluate(cfg, session):
            return [1.0 if WINDOW.get("pid") == 4242 else 0.0]
    ''').parent

    async def go():
        async with TaskProcess(d) as proc:
            await proc.call("start", 0, FakeSession())
            return await proc.call("evaluate", 0, FakeSession())

    assert asyncio.run(go()) == [1.0]


def test_a_cpu_bound_sync_grader_does_not_stall_another_run(tmp_path: Path) -> None:
    slow = write(tmp_path / "slow" / "main.py", '''
        import time
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.evaluate_task
        def evaluate(cfg, session):
            end = time.time() + 4
            while time.time() < end:
                pass
            return [1.0]
    ''').parent
    fast = write(tmp_path / "fast" / "main.py", '''
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.evaluate_task
        async def evaluate(cfg, session):
            return [0.5]
    ''').parent

    async def go():
        done: dict[str, float] = {}
        t0 = time.monotonic()

        async def run(d: Path, name: str) -> None:
            async with TaskProcess(d) as proc:
                await proc.call("evaluate", 0, FakeSession())
            done[name] = time.monotonic() - t0

        await asyncio.gather(run(slow, "slow"), run(fast, "fast"))
        return done

    done = asyncio.run(go())
    assert done["fast"] < 2.0 < done["slow"], done


def test_a_grader_timeout_kills_its_process(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", '''
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.evaluate_task
        def evaluate(cfg, session):
            while True:
                pass
    ''').parent

    async def go():
        proc = TaskProcess(d)
        await proc.start()
        try:
            t0 = time.monotonic()
            with pytest.raises(TaskProcessError, match="did not finish within 1s"):
                await proc.call("evaluate", 0, FakeSession(), timeout=1)
            assert time.monotonic() - t0 < 5
        finally:
            await proc.close()
        return proc.returncode

    assert asyncio.run(go()) == -9


def test_a_grader_that_exits_the_interpreter_ends_only_its_call(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", '''
        import os
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.evaluate_task
        def evaluate(cfg, session):
            print("about to exit")
            os._exit(3)
    ''').parent

    async def go():
        async with TaskProcess(d) as proc:
            with pytest.raises(TaskProcessError, match=r"(?s)exited \(exit code 3\).*about to exit"):
                await proc.call("evaluate", 0, FakeSession())

    asyncio.run(go())


def test_task_code_sees_the_ale_defaults_and_none_of_the_harness_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("REMOTE_ROOT_DIR", "/operator/root")
    monkeypatch.setenv("REMOTE_OUTPUT_DIR", "elsewhere")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "harness-secret")
    monkeypatch.setenv("ALE_SIGNING_KEY", "/root/key.pem")
    monkeypatch.setenv("ALE_JUDGE_OPENAI_API_KEY", "judge-key")
    d = write(tmp_path / "t" / "main.py", '''
        import json, os
        import cua_bench as cb
        AT_IMPORT = {k: os.environ.get(k) for k in ("REMOTE_ROOT_DIR", "REMOTE_OUTPUT_DIR", "OS_TYPE")}
        SEEN = {}
        @cb.tasks_config
        def load():
            return [cb.Task(description="x", metadata={"at_import": AT_IMPORT})]
        @cb.setup_task
        async def start(cfg, session):
            SEEN["start"] = sorted(os.environ)
        @cb.evaluate_task
        async def evaluate(cfg, session):
            ok = os.environ.get("OPENAI_API_KEY") == "judge-key"
            clean = not any("SECRET" in k or "SIGNING" in k or k.startswith("ALE_") for k in os.environ)
            started_clean = "OPENAI_API_KEY" not in SEEN["start"]
            return [float(ok), float(clean), float(started_clean)]
    ''').parent
    from ale.tasks.process import judge_env

    async def go():
        async with TaskProcess(d) as proc:
            await proc.call("start", 0, FakeSession())
            return proc.info, await proc.call("evaluate", 0, FakeSession(), env=judge_env())

    info, scores = asyncio.run(go())
    assert info.variants[0].metadata["at_import"] == {
        "REMOTE_ROOT_DIR": "/media/user/data/agenthle", "REMOTE_OUTPUT_DIR": "output", "OS_TYPE": "linux"}
    assert scores == [1.0, 1.0, 1.0]


def test_session_errors_are_what_upstream_raises(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", '''
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.evaluate_task
        async def evaluate(cfg, session):
            out = []
            for kind in (RuntimeError, FileNotFoundError):
                try:
                    await session.read_file("/nope/missing.txt")
                except kind as e:
                    out.append(1.0 if "No such file or directory" in str(e) else 0.5)
            return out
    ''').parent

    async def go():
        async with TaskProcess(d) as proc:
            return await proc.call("evaluate", 0, FakeSession())

    assert asyncio.run(go()) == [1.0, 1.0]


def test_a_task_whose_function_raises_reports_its_traceback(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", '''
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x")]
        @cb.evaluate_task
        async def evaluate(cfg, session):
            raise ValueError("the reference is malformed")
    ''').parent

    async def go():
        async with TaskProcess(d) as proc:
            with pytest.raises(TaskCallFailed, match="ValueError: the reference is malformed") as e:
                await proc.call("evaluate", 0, FakeSession())
            assert "main.py" in e.value.traceback

    asyncio.run(go())


def test_a_missing_module_names_it_and_how_to_install_it(tmp_path: Path) -> None:
    d = write(tmp_path / "t" / "main.py", "import not_a_real_module_xyz\n").parent
    with pytest.raises(TaskError, match=r"No module named 'not_a_real_module_xyz'.*add 'not_a_real_module_xyz' to the dependencies in the tree's pyproject.toml"):
        inspect_task_sync(d)



def test_a_task_that_fails_to_load_leaves_no_process_and_no_home(tmp_path: Path, monkeypatch) -> None:
    """`async with` never calls __aexit__ when entering fails: start() cleans up itself."""
    import tempfile

    homes = tmp_path / "homes"
    homes.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(homes))
    d = write(tmp_path / "t" / "main.py", """
        import cua_bench as cb
        @cb.tasks_config
        def load():
            raise RuntimeError("no variants today")
        @cb.evaluate_task
        async def evaluate(cfg, session):
            return [1.0]
    """).parent

    async def go():
        proc = TaskProcess(d)
        with pytest.raises(Exception, match="no variants today"):
            async with proc:
                pass
        return proc

    proc = asyncio.run(go())
    assert proc.returncode is not None
    assert list(homes.iterdir()) == []

# -- the tree's environment -------------------------------------------------------
def _wheel(dest: Path, name: str, version: str, module: str) -> Path:
    """A minimal pure-Python wheel, written by hand (no build backend, no network)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = dest / f"{dist}-py3-none-any.whl"
    files = {
        f"{module}.py": f"VALUE = {version!r}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: ale-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(text.encode())}")
        record.append(f"{dist}.dist-info/RECORD,,")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_the_trees_declared_dependencies_get_their_own_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ALE_CACHE_DIR", str(tmp_path / "cache"))
    wheel = _wheel(tmp_path, "ale-tree-dep", "1.2.3", "ale_tree_dep")
    tasks = tmp_path / "tree" / "tasks"
    write(tasks / "pyproject.toml", f'''
        [project]
        name = "tree-deps"
        version = "0"
        requires-python = ">=3.99"
        dependencies = ["ale-tree-dep @ {wheel.as_uri()}"]
    ''')
    d = write(tasks / "d" / "t" / "main.py", '''
        import ale_tree_dep
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="x", metadata={"dep": ale_tree_dep.VALUE})]
        @cb.evaluate_task
        async def evaluate(cfg, session):
            return [1.0]
    ''').parent
    with pytest.raises(TaskError, match="not built yet: run `ale task env"):
        resolve_environment(d, build=False)
    said: list[str] = []
    env = resolve_environment(d, say=said.append)
    assert env.python != sys.executable and Path(env.python).is_file()
    assert env.description["requires_python_satisfied"] is False  # reported, not fatal
    assert any("requires-python" in s for s in said)
    assert inspect_task_sync(d).variants[0].metadata == {"dep": "1.2.3"}
    again = resolve_environment(d)  # cached by content: a lookup
    assert again.python == env.python
    harness = subprocess.run([sys.executable, "-c", "import ale_tree_dep"], capture_output=True)
    assert harness.returncode != 0  # never installed into the harness's own environment


# -- listing and refusing -----------------------------------------------------------
def test_task_list_reports_ok_unsupported_and_error(tree: Path) -> None:
    write(tree / "lab" / "windows_task" / "main.py", "raise SystemExit('never imported')\n")
    write(tree / "lab" / "windows_task" / "task_card.json", '{"vm": {"snapshot": "cpu-free"}}')
    write(tree / "lab" / "broken" / "main.py", "def load(:\n")
    rows = {Path(r.path).name: r for r in list_tasks(tree)}
    assert rows["alpha"].status == "ok" and rows["alpha"].variants == 1
    assert rows["windows_task"].status == "unsupported"
    assert rows["windows_task"].reason == (
        "needs a Windows VM (vm.snapshot=cpu-free): not supported by the docker provider; run it with --provider qemu "
        "and map it to a disk: environment.vm_images: {cpu-free: PATH-or-URL} in the experiment, "
        "or ale run --vm-image cpu-free=PATH-or-URL")
    assert rows["broken"].status == "error" and "syntax error at line 1" in (rows["broken"].reason or "")
    assert "scripts" not in rows and "_shared" not in rows


def test_task_list_json_from_the_cli(tree: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "ale.cli", "task", "list", str(tree), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert {r["status"] for r in rows} == {"ok"} and all({"path", "status", "reason", "variants"} <= set(r) for r in rows)


def test_a_windows_task_is_refused_at_preflight(tmp_path: Path) -> None:
    d = write(tmp_path / "d" / "win" / "main.py", "import cua_bench as cb\n").parent
    write(d / "task_card.json", '{"vm": {"snapshot": "gpu-license", "machineType": "g2-standard-8"}}')
    plan = RunPlan(run_id="win", task_dir=str(d), agent=AgentSpec(name="nop"), runs_dir=str(tmp_path / "runs"))
    with pytest.raises(PreflightError, match=r"needs a Windows VM \(vm.snapshot=gpu-license\): not supported by the docker provider; run it with --provider qemu"):
        asyncio.run(execute_run(plan))
    assert not (tmp_path / "runs" / "win").exists()


WINDOWS_MAIN = textwrap.dedent("""\
    import cua_bench as cb

    @cb.tasks_config(split="train")
    def load():
        return [cb.Task(description="d", metadata={}, computer={"setup_config": {"os_type": "windows"}})]

    @cb.evaluate_task(split="train")
    async def evaluate(task_cfg, session):
        return [0.0]
    """)


def _windows_task(tmp_path: Path) -> Path:
    """An ALE-style Windows task (vm.snapshot cpu-free, its variant's os_type windows)."""
    d = write(tmp_path / "tasks" / "win" / "main.py", WINDOWS_MAIN).parent
    write(d / "task_card.json", '{"vm": {"snapshot": "cpu-free"}}')
    return d


def test_a_windows_task_plans_under_qemu_once_its_snapshot_is_mapped(tmp_path: Path) -> None:
    """Planning names the fix until the operator maps the snapshot; mapped, the plan
    carries the disk for the qemu provider. (Nothing Windows boots here: the run
    itself is the provider's, tested with the Linux guest.)"""
    from ale.runs.experiment import load_experiment, plan_experiment
    from ale.tasks.card import load_card

    d = _windows_task(tmp_path)
    card = load_card(d)
    assert card.unsupported_reason("qemu") == ("needs a Windows VM (vm.snapshot=cpu-free): no disk is mapped to 'cpu-free'; "
                                               "map it to a disk: environment.vm_images: {cpu-free: PATH-or-URL} in the "
                                               "experiment, or ale run --vm-image cpu-free=PATH-or-URL")
    assert card.unsupported_reason("qemu", vm_images=("cpu-free",)) is None
    assert card.unsupported_reason("docker", vm_images=("cpu-free",)) is not None  # a container never runs it
    assert card.unsupported_reason("qemu", vm_images=("gpu-free",)) is not None
    exp_file = write(tmp_path / "exp.yaml", "name: w\ntasks: [{path: tasks/win}]\nagents: [{name: nop}]\n"
                     "environment: {provider: qemu, vm_images: {cpu-free: /disks/win10.qcow2}}\n")
    units, skipped = plan_experiment(load_experiment(exp_file))
    assert skipped == [] and [u.plan.vm_image for u in units] == ["/disks/win10.qcow2"]
    assert all(u.plan.provider == "qemu" for u in units)
    exp_file.write_text(exp_file.read_text().replace("cpu-free: /disks", "gpu-free: /disks"))
    units, skipped = plan_experiment(load_experiment(exp_file))
    assert units == [] and "no disk is mapped to 'cpu-free'" in skipped[0].reason


def test_machine_type_becomes_the_default_limits_capped_to_the_host(tree: Path) -> None:
    import os

    from ale.sandbox.policy import IsolationPolicy
    from ale.tasks.card import load_card, policy_for_card

    card = load_card(tree / "lab" / "alpha")
    assert card.resources["cpus"] == 4.0 and card.resources["memory"] == int(15 * 1024**3)
    policy, notes = policy_for_card(IsolationPolicy(), card)
    assert policy.cpus == min(4.0, float(os.cpu_count() or 1))
    assert (policy.cpus < 4.0) == any("capped to the host's" in n for n in notes)
    explicit, _ = policy_for_card(IsolationPolicy(cpus=1.0), card)
    assert explicit.cpus == 1.0  # the operator's own value wins


def test_a_capped_memory_limit_is_whole_mib_and_noted_only_when_applied() -> None:
    """75% of a host's memory is rarely a whole page: the kernel would round it down and
    the seal check see another limit than asked (found: an invalid run on a 23.6 GB host)."""
    from ale.sandbox.policy import IsolationPolicy
    from ale.tasks.card import TaskCard, _fit, policy_for_card

    card = TaskCard(timeout_s=None, resources={"cpus": 1.0, "memory": 64 * 1024**3 + 123}, data_source=None, raw={})
    fitted, notes = _fit(card, 2, 25_276_510_208)  # 23.54 GiB, 75% = 18957382656 bytes: not page-aligned
    assert fitted["memory_bytes"] % (1024 * 1024) == 0 and fitted["memory_bytes"] <= 18957382656
    assert "memory_bytes" in notes
    _, notes = policy_for_card(IsolationPolicy(memory_bytes=8 * 1024**3), card)
    assert not any("memory" in n for n in notes)  # the policy's own limit: no cap applied, no note


@pytest.mark.parametrize(("observed", "asked", "ok"), [
    ("18957381632", 18957382656, True),   # rounded down to a 4 KiB page
    ("268435456", 268435456, True),
    ("268435455", 268435456, False),      # not a page
    ("268300000", 268435456, False),      # more than a page below
    ("max", 268435456, False),
    (None, 268435456, False),
])
def test_the_memory_check_accepts_the_kernels_page_rounding_only(observed, asked, ok) -> None:
    from ale.isolation.probes import _page_rounded

    assert _page_rounded(observed, asked) is ok


# -- whole runs (Docker) --------------------------------------------------------------
def _run(tree: Path, name: str, agent: AgentSpec, tmp_path: Path, docker_client, data: str | None = None):
    plan = RunPlan(run_id=f"{name}-{agent.name}", task_dir=str(tree / "lab" / name), agent=agent, image=TOOLS_IMAGE,
                   runs_dir=str(tmp_path / "runs"), data_source=data)
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert our_containers(docker_client, **{"ale.run_id": plan.run_id}) == []
    return plan, result


@pytest.mark.docker
@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_real_shaped_ale_tasks_score_one_with_the_oracle_and_zero_with_nop(tree, name, tmp_path, docker_client) -> None:
    plan, oracle = _run(tree, name, AgentSpec(name="oracle"), tmp_path, docker_client)
    assert oracle.status is RunStatus.SCORED and oracle.scores == [1.0], (oracle.error, oracle.violations)
    assert verify_run_dir(plan.run_dir).valid
    _, nop = _run(tree, name, AgentSpec(name="nop"), tmp_path, docker_client)
    assert nop.status is RunStatus.SCORED and nop.scores == [0.0], (nop.error, nop.violations)
    mounts = json.loads((plan.run_dir / "evidence" / "mounts.json").read_text())
    task_dir = f"/media/user/data/agenthle/lab/{name}/base"
    assert [(m["target"], m["read_only"]) for m in mounts] == [(task_dir, True), (f"{task_dir}/output", False)]
    staged = json.loads((plan.run_dir / "evidence" / "input-staged.json").read_text())
    assert staged["layout"] == "ale"
    files = json.loads((plan.run_dir / "evidence" / "input-after-start.json").read_text())["files"]
    assert all(not f.startswith("reference") for f in files)
    if name == "alpha":
        assert "software/bin/answer.sh" in files  # the software is part of the hashed public package


@pytest.mark.docker
def test_an_agent_uses_the_software_the_prompt_points_at(tree, tmp_path, docker_client) -> None:
    script = tmp_path / "calls.json"
    task_dir = "/media/user/data/agenthle/lab/alpha/base"
    script.write_text(json.dumps([{"tool": "shell", "args": {"command": f"ls {task_dir}; {task_dir}/software/bin/answer.sh > {task_dir}/output/answer.txt"}}]))
    plan, result = _run(tree, "alpha", AgentSpec(name="replay", config={"script": str(script)}), tmp_path, docker_client)
    assert result.status is RunStatus.SCORED and result.scores == [1.0], (result.error, result.violations)
    steps = json.loads((plan.run_dir / "trajectory.json").read_text())["steps"]
    listing = steps[0]["stdout"]
    assert "software" in listing and "reference" not in listing


@pytest.mark.docker
def test_a_grader_that_kills_its_interpreter_is_grading_failed(tmp_path, docker_client) -> None:
    d = write(tmp_path / "tasks" / "d" / "crash" / "main.py", '''
        import os
        import cua_bench as cb
        @cb.tasks_config
        def load():
            return [cb.Task(description="do nothing")]
        @cb.evaluate_task
        def evaluate(cfg, session):
            os._exit(3)
    ''').parent
    plan = RunPlan(run_id="crash", task_dir=str(d), agent=AgentSpec(name="nop"), image=TOOLS_IMAGE, runs_dir=str(tmp_path / "runs"))
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.GRADING_FAILED and "exit code 3" in (result.error or "")
    assert verify_run_dir(plan.run_dir).valid


@pytest.mark.docker
def test_an_ale_sealed_reference_archive_opens_with_the_ale_password(tree, tmp_path, docker_client, monkeypatch) -> None:
    import py7zr

    data = tmp_path / "data"
    ref = data / "lab" / "beta" / "base" / "reference"
    with py7zr.SevenZipFile(ref.parent / "reference.7z", "w", password="ale-evaluator-secret", header_encryption=True) as z:
        z.write(ref / "expected.txt", "expected.txt")
    for f in ref.iterdir():
        f.unlink()
    ref.rmdir()
    monkeypatch.setenv("ALE_REFERENCE_ARCHIVE_PASSWORD", "ale-evaluator-secret")
    monkeypatch.setenv("ALE_GRADER_SECRETS", str(tmp_path / "no-store.json"))
    plan, result = _run(tree, "beta", AgentSpec(name="oracle"), tmp_path, docker_client)
    assert result.status is RunStatus.SCORED and result.scores == [1.0], (result.error, result.violations)
    commit = json.loads((plan.run_dir / "evidence" / "reference-commit.json").read_text())
    assert commit["source"]["kind"] == "archive"


@pytest.mark.docker
@pytest.mark.parametrize("data", [None, "cards"], ids=["no-source", "a-source-without-the-task"])
def test_a_task_that_requires_no_data_runs_with_or_without_a_source(tmp_path, docker_client, data) -> None:
    """ALE's REQUIRES_TASK_DATA = False (demo/tool_smoke): no data is looked up, the
    input folder is empty, the workspace is mounted at the task folder's output/."""
    tasks = make_tree(tmp_path / "ale", data_root=make_data(tmp_path / "data") if data else None)
    d = write(tasks / "lab" / "nodata" / "main.py", '''
        from dataclasses import dataclass

        import cua_bench as cb
        from tasks.linux_runtime import LinuxTaskConfig

        @dataclass
        class Config(LinuxTaskConfig):
            REQUIRES_TASK_DATA: bool = False

        @cb.tasks_config
        def load():
            cfg = Config(DOMAIN_NAME="lab", TASK_NAME="nodata")
            return [cb.Task(description="write ok to output/ok.txt", metadata=cfg.to_metadata())]

        @cb.solve_task(split="train")
        async def solve(task_cfg, session):
            await session.write_file(task_cfg.metadata["remote_output_dir"] + "/ok.txt", "ok")

        @cb.evaluate_task
        async def evaluate(task_cfg, session):
            listing = await session.run_command("ls -A " + task_cfg.metadata["input_dir"])
            answer = task_cfg.metadata["remote_output_dir"] + "/ok.txt"
            ok = await session.file_exists(answer) and (await session.read_file(answer)).strip() == "ok"
            return [1.0 if ok and listing["stdout"] == "" else 0.0]
    ''').parent
    card = '{"vm": {"snapshot": "cpu-free-ubuntu"}' + (f', "data_source": "local:{tmp_path / "data"}"' if data else "") + "}"
    write(d / "task_card.json", card)
    for agent, expected in (("oracle", [1.0]), ("nop", [0.0])):
        plan = RunPlan(run_id=f"nodata-{agent}", task_dir=str(d), agent=AgentSpec(name=agent), image=TOOLS_IMAGE,
                       runs_dir=str(tmp_path / "runs"))
        result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
        assert result.status is RunStatus.SCORED and result.scores == expected, (result.error, result.violations)
        staged = json.loads((plan.run_dir / "evidence" / "input-staged.json").read_text())
        assert staged["source"] is None and "note" in staged
        assert not verify_run_dir(plan.run_dir).reasons


@pytest.mark.docker
def test_the_grading_sandbox_fits_ale_graders(tmp_path, docker_client) -> None:
    """Large reads and outputs, scratch above the task folder and in the VM user's
    home, /tmp on disk, and Python that imports a script's sibling modules as on the VM."""
    tasks = make_tree(tmp_path / "ale", data_root=make_data(tmp_path / "data"))
    d = write(tasks / "lab" / "gamma" / "main.py", '''
        import json
        import cua_bench as cb
        from tasks.linux_runtime import LinuxTaskConfig

        class Config(LinuxTaskConfig):
            pass

        @cb.tasks_config
        def load():
            cfg = Config(DOMAIN_NAME="lab", TASK_NAME="beta")
            return [cb.Task(description="do nothing", metadata=cfg.to_metadata())]

        @cb.evaluate_task
        async def evaluate(task_cfg, session):
            checks = []
            r = await session.run_command("mkdir -p /media/user/data/agenthle/.tmp_eval /home/user/Desktop && echo ok")
            checks.append(r["stdout"].strip() == "ok")
            # Scratch inside the task folder itself, beside its read-only mounts (ALE's eval_data/_eval_tmp).
            r = await session.run_command("mkdir -p /media/user/data/agenthle/lab/beta/base/eval_data/_eval_tmp && echo ok")
            checks.append(r["stdout"].strip() == "ok")
            r = await session.run_command("python -c \\"import json; print(json.dumps(['x' * 3000000]))\\"")
            checks.append(len(json.loads(r["stdout"])[0]) == 3000000 and not r["truncated"])
            await session.run_command("head -c 12000000 /dev/zero > /tmp/big.bin")
            checks.append(len(await session.read_bytes("/tmp/big.bin")) == 12000000)
            r = await session.run_command("awk '$5 == \\"/tmp\\" {print $9}' /proc/self/mountinfo")
            checks.append(r["stdout"].strip() != "tmpfs")
            # As on ALE's VM, a script imports the modules beside it (a candidate's multi-file program).
            r = await session.run_command(
                "mkdir -p /tmp/v && cd /tmp && echo 'X = 7' > v/helper.py && echo 'import helper; print(helper.X)' > v/cli.py "
                "&& python v/cli.py")
            checks.append(r["stdout"].strip() == "7")
            return [1.0 if all(checks) else 0.0, float(sum(checks)) / len(checks)]
    ''').parent
    write(d / "task_card.json", '{"vm": {"snapshot": "cpu-free-ubuntu"}, "data_source": "local:%s"}' % (tmp_path / "data"))
    plan = RunPlan(run_id="gamma", task_dir=str(d), agent=AgentSpec(name="nop"), image=TOOLS_IMAGE, runs_dir=str(tmp_path / "runs"))
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.SCORED and result.scores == [1.0, 1.0], (result.scores, result.error)


def test_judge_credentials_are_selected_by_name() -> None:
    from ale.tasks.process import judge_env

    env = {"ALE_JUDGE_OPENAI_API_KEY": "k1", "ALE_JUDGE_ANTHROPIC_API_KEY": "k2", "OPENAI_API_KEY": "operator", "ALE_JUDGE_": "x"}
    assert judge_env(env) == {"OPENAI_API_KEY": "k1", "ANTHROPIC_API_KEY": "k2"}
    assert judge_env(env, names=("OPENAI_API_KEY",)) == {"OPENAI_API_KEY": "k1"}


EVALUATE_ONLY = """\
import json, os, socket, subprocess, sys, time
import cua_bench as cb
@cb.tasks_config
def load():
    return [cb.Task(description="x")]
@cb.evaluate_task
async def evaluate(cfg, session):
{body}
"""


def evaluate_only_task(tmp_path: Path, name: str, body: str) -> Path:
    """A one-variant task folder whose evaluate() runs ``body`` (any indentation)."""
    indented = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")
    return write(tmp_path / "tasks" / "dom" / name / "main.py", EVALUATE_ONLY.format(body=indented)).parent


def evaluate_in_process(d: Path, session: Any = None, **process_kw: Any) -> Any:
    """evaluate() of variant 0, in the task's own (jailed) process."""

    async def go() -> Any:
        async with TaskProcess(d, **process_kw) as proc:
            return await proc.call("evaluate", 0, session or FakeSession())

    return asyncio.run(go())


def test_task_code_runs_jailed_away_from_the_harness_files(tmp_path: Path) -> None:
    """A host-side grader may run what the candidate wrote (ALE's dit_pipeline imports
    the candidate's module): the task process sees its interpreter, the runtime, its
    tree and home, never the runs folder, another task's data or /etc/shadow."""
    secret = tmp_path / "runs" / "other-run" / "reference.json"
    secret.parent.mkdir(parents=True)
    secret.write_text("the other run's reference")
    d = evaluate_only_task(tmp_path, "jailed", f"""
        seen = {{}}
        for p in ({str(secret)!r}, "/etc/shadow", {str(tmp_path / "runs")!r}, os.path.expanduser("~/../..")):
            try:
                seen[p] = open(p).read()[:10] if os.path.isfile(p) else sorted(os.listdir(p))[:3]
            except OSError as e:
                seen[p] = type(e).__name__
        return seen
    """)
    seen = evaluate_in_process(d)
    assert seen[str(secret)] == "FileNotFoundError" and seen[str(tmp_path / "runs")] == "FileNotFoundError", seen
    assert seen["/etc/shadow"] == "FileNotFoundError", seen


def test_jailed_task_code_has_no_capabilities_even_under_root(tmp_path: Path) -> None:
    """Run by root, bubblewrap keeps root's capabilities unless told: with
    CAP_SYS_ADMIN and CAP_MKNOD, candidate code a grader imports could make the
    host's disk a device node and mount it. The jail drops them all."""
    d = evaluate_only_task(tmp_path, "caps", """
        def caps(text):
            status = dict(l.split(":", 1) for l in text.splitlines() if ":" in l)
            return status["CapEff"].strip() + "/" + status["CapPrm"].strip()
        out = {"self": caps(open("/proc/self/status").read()),
               # an exec'd program, as uid 0, would regain root's capabilities unless dropped for good
               "child": caps(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout)}
        try:
            os.mknod("/tmp/disk", 0o600 | 0o060000, os.makedev(8, 0))
            out["mknod"] = "made"
        except OSError as e:
            out["mknod"] = type(e).__name__
        r = subprocess.run(["mount", "-t", "tmpfs", "none", "/tmp"], capture_output=True)
        out["mount"] = r.returncode
        return out
    """)
    out = evaluate_in_process(d)
    assert out["self"] == out["child"] == "0000000000000000/0000000000000000", out
    assert out["mknod"] == "PermissionError" and out["mount"] != 0, out


def test_jailed_task_code_reaches_no_host_service_unless_a_judge_needs_the_network(tmp_path: Path, monkeypatch) -> None:
    """Candidate code a grader runs could otherwise reach the host's loopback: a
    Ray head, the model gateway, the cloud's metadata address. The jail gets a
    network namespace of its own unless the run hands evaluate() judge credentials
    (or ALE_TASK_NETWORK=on)."""
    import socket

    from ale.tasks.jail import task_network

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    d = evaluate_only_task(tmp_path, "net", f"""
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
            return "reached"
        except OSError as e:
            return type(e).__name__
    """)
    try:
        assert evaluate_in_process(d, network=False) == "ConnectionRefusedError"
        assert evaluate_in_process(d, network=True) == "reached"
    finally:
        listener.close()
    monkeypatch.delenv("ALE_TASK_NETWORK", raising=False)
    assert task_network({}) is False and task_network({"OPENAI_API_KEY": "k"}) is True
    monkeypatch.setenv("ALE_TASK_NETWORK", "on")
    assert task_network({}) is True
    monkeypatch.setenv("ALE_TASK_NETWORK", "off")
    assert task_network({"OPENAI_API_KEY": "k"}) is False


def test_the_task_process_is_the_first_the_kernel_kills_when_memory_runs_out(tmp_path: Path) -> None:
    """Candidate code a host-side grader imports can allocate without bound: the
    task process (and all it starts) carries oom_score_adj 1000, the harness not."""
    d = evaluate_only_task(tmp_path, "oom", """
        child = subprocess.run(["cat", "/proc/self/oom_score_adj"], capture_output=True, text=True).stdout
        return [open("/proc/self/oom_score_adj").read().strip(), child.strip()]
    """)
    assert evaluate_in_process(d) == ["1000", "1000"]
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"


def test_every_command_and_failed_session_call_is_noted_in_the_task_log(tmp_path: Path) -> None:
    """A grader that swallows a failing command's stderr (mpc_control_building's
    `uv run` exits 127) leaves a silent 0 unless the harness notes the call."""

    class CommandSession(FakeSession):
        async def run_command(self, command: str, **kw):
            return {"stdout": "", "stderr": "sh: 1: uv: not found", "return_code": 127}

    d = evaluate_only_task(tmp_path, "noted", """
        r = await session.run_command("uv run verify.py")
        try:
            await session.read_file("/output/missing.json")
        except FileNotFoundError:
            pass
        await session.file_exists("/output/x")  # a call that answered: not noted
        return [0.0 if r["return_code"] else 1.0]
    """)
    log = tmp_path / "task.log"
    assert evaluate_in_process(d, CommandSession(), log_path=log) == [0.0]
    lines = [x for x in log.read_text().splitlines() if x.startswith("[ale] session")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("[ale] session run_command('uv run verify.py') -> exit 127") and "uv: not found" in lines[0]
    assert lines[1].startswith("[ale] session read_file('/output/missing.json') raised FileNotFoundError")


def test_the_jails_tmp_is_a_size_capped_place_shared_with_its_home(tmp_path: Path) -> None:
    """Graders copy whole outputs to /tmp/agenthle_eval: in the jail /tmp and the home
    share one size-capped tmpfs (the jail's disk bound, ALE_TASK_DISK), dropped with
    the process, so candidate code a grader runs cannot fill the host's disk."""
    d = evaluate_only_task(tmp_path, "tmp", """
        os.makedirs("/tmp/agenthle_eval", exist_ok=True)
        open("/tmp/agenthle_eval/x", "w").write("x")
        fs = [(l.split()[2], l.split()[3]) for l in open("/proc/self/mounts") if l.split()[1] == "/tmp"]
        return [fs, os.path.exists(os.path.expanduser("~/.tmp/agenthle_eval/x")) or os.path.exists("/tmp/agenthle_eval/x")]
    """)

    async def go():
        async with TaskProcess(d) as proc:
            home = proc._home
            return await proc.call("evaluate", 0, FakeSession()), home

    (fs, seen), home = asyncio.run(go())
    assert seen and fs and all(kind == "tmpfs" and "size=" in opts for kind, opts in fs), (fs, seen)
    assert home is not None and not home.exists()  # dropped with the process


def test_a_broken_foreign_disk_mapped_to_a_snapshot_is_refused_at_preflight_saying_why(tmp_path: Path) -> None:
    """A foreign disk (not a guest built by ale: ALE's own images, booted by
    ale.sandbox.qemu.foreign) that qemu-img cannot read, or that is not a qcow2, is
    refused before anything boots, naming why; nothing is left."""
    d = _windows_task(tmp_path)
    disk = tmp_path / "disks" / "win10.qcow2"
    disk.parent.mkdir()
    disk.write_bytes(b"QFI\xfb" + b"\0" * 1000)
    raw = tmp_path / "disks" / "win10.img"
    raw.write_bytes(b"\0" * 4096)
    cases = [(disk, "is a raw image: the qemu provider boots a qcow2"), (raw, "the qemu provider boots a qcow2")]
    if shutil.which("qemu-img"):  # an overlay is not a whole disk
        base, top = tmp_path / "disks" / "base.qcow2", tmp_path / "disks" / "top.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "1M"], check=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(top)], check=True)
        cases.append((top, "has a backing file"))
    for path, why in cases:
        plan = RunPlan(run_id="foreign", task_dir=str(d), agent=AgentSpec(name="nop"), runs_dir=str(tmp_path / "runs"),
                       provider="qemu", vm_image=str(path))
        with pytest.raises(PreflightError, match=why):
            asyncio.run(execute_run(plan))
        assert not (tmp_path / "runs" / "foreign").exists()
