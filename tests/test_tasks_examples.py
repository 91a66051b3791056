"""The example tasks' start/evaluate/solve logic, over an in-memory-ish fake session.

The fake session maps container paths to host folders (as the harness's routed
session does) and runs commands on the host with those paths rewritten. No Docker.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from ale.tasks.loader import TaskDefinition, TaskVariant, call_task_fn, load_task, load_variants

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "examples" / "tasks"
DATA = REPO / "examples" / "data"


class FakeSession:
    """cua-bench session over host folders: ``routes`` maps container dirs to host dirs."""

    def __init__(self, routes: dict[str, Path], bin_dir: Path | None = None):
        self.routes = dict(sorted(routes.items(), key=lambda kv: len(kv[0]), reverse=True))
        self.bin_dir = bin_dir
        self.writes: list[str] = []
        self.commands: list[str] = []

    def host(self, path: str) -> Path:
        for target, host in self.routes.items():
            if path == target or path.startswith(target + "/"):
                return host / path[len(target) :].lstrip("/")
        raise PermissionError(f"{path} is outside every folder this session reaches")

    def _rewrite(self, command: str) -> str:
        for target, host in self.routes.items():
            command = re.sub(rf"(?<![\w/.]){re.escape(target)}(?=[/\s'\"]|$)", str(host), command)
        return command

    async def run_command(
        self, command: str, timeout: float | None = None, check: bool = False
    ) -> dict:
        self.commands.append(command)
        env = dict(os.environ)
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        proc = await asyncio.create_subprocess_exec(
            "sh",
            "-c",
            self._rewrite(command),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout or 120)
        rc = proc.returncode
        res = {
            "return_code": rc,
            "exit_code": rc,
            "stdout": out.decode(),
            "stderr": err.decode(),
            "success": rc == 0,
        }
        if check and rc != 0:
            raise RuntimeError(f"command failed ({rc}): {err.decode()}")
        return res

    async def read_bytes(self, path: str) -> bytes:
        p = self.host(path)
        if not p.is_file():
            raise FileNotFoundError(path)
        return p.read_bytes()

    async def read_file(self, path: str) -> str:
        return (await self.read_bytes(path)).decode()

    async def write_bytes(self, path: str, content: bytes) -> None:
        self.writes.append(path)
        p = self.host(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)

    async def write_file(self, path: str, content: str) -> None:
        await self.write_bytes(path, content.encode())

    async def file_exists(self, path: str) -> bool:
        try:
            return self.host(path).is_file()
        except PermissionError:
            return False

    async def directory_exists(self, path: str) -> bool:
        try:
            return self.host(path).is_dir()
        except PermissionError:
            return False

    async def list_dir(self, path: str) -> list[str]:
        return sorted(os.listdir(self.host(path)))


class Run:
    """One variant's folders: input (staged copy), workspace (empty), reference (hidden)."""

    def __init__(self, tmp: Path, defn: TaskDefinition, v: TaskVariant):
        self.defn, self.v = defn, v
        src = DATA / v.data_key.relpath
        self.input = tmp / "input"
        self.workspace = tmp / "workspace"
        self.reference = tmp / "reference"
        shutil.copytree(src / "input", self.input)
        self.workspace.mkdir()
        if (src / "reference").is_dir():
            shutil.copytree(src / "reference", self.reference)
        else:
            self.reference.mkdir()
        self.bin = tmp / "bin"
        self.bin.mkdir()
        # The sandbox has python3 with numpy: so does this interpreter.
        (self.bin / "python3").symlink_to(sys.executable)

    def setup_session(self) -> FakeSession:
        return FakeSession(
            {self.v.input_dir: self.input, self.v.reference_dir: self.reference}, self.bin
        )

    def agent_session(self) -> FakeSession:
        # What solve() gets: the candidate's view, no reference at all.
        return FakeSession(
            {self.v.input_dir: self.input, self.v.output_dir: self.workspace}, self.bin
        )

    def grading_session(self) -> FakeSession:
        return FakeSession(
            {
                self.v.input_dir: self.input,
                self.v.output_dir: self.workspace,
                self.v.reference_dir: self.reference,
            },
            self.bin,
        )

    def start(self) -> None:
        if self.defn.start_fn is not None:
            asyncio.run(call_task_fn(self.defn.start_fn, self.v.cfg, self.setup_session()))

    def solve(self) -> None:
        asyncio.run(call_task_fn(self.defn.solve_fn, self.v.cfg, self.agent_session()))

    def evaluate(self) -> list[float]:
        s = self.grading_session()
        scores = asyncio.run(call_task_fn(self.defn.evaluate_fn, self.v.cfg, s))
        assert s.writes == [], "the grader must never write"
        assert all(isinstance(x, float) for x in scores)
        return scores


def variants_of(name: str) -> list[tuple[TaskDefinition, TaskVariant]]:
    defn = load_task(TASKS / name)
    return [(defn, v) for v in load_variants(defn)]


ALL = [
    pytest.param(d, v, id=v.task_id)
    for name in ("files/word_count", "physics/cloth_sim", "secrets/echo_secret")
    for d, v in variants_of(name)
]


# -- every example -----------------------------------------------------------------
@pytest.mark.parametrize(("defn", "v"), ALL)
def test_example_layout_card_and_description(defn, v):
    assert defn.solve_fn is not None
    assert defn.card.timeout_s and defn.card.timeout_s > 0
    assert defn.card.data_source == f"local:{DATA.resolve()}"
    assert (DATA / v.data_key.relpath / "input").is_dir()
    assert v.data_key.domain == defn.path.parent.name and v.data_key.task == defn.path.name
    assert (v.input_dir, v.output_dir, v.reference_dir) == ("/input", "/workspace", "/reference")
    # The prompt names where to read and where to write, and never the reference.
    assert v.input_dir + "/" in v.description and v.output_dir + "/" in v.description
    assert v.reference_dir not in v.description


@pytest.mark.parametrize(("defn", "v"), ALL)
def test_nop_scores_zero(tmp_path, defn, v):
    run = Run(tmp_path, defn, v)
    run.start()
    scores = run.evaluate()
    assert scores and all(s == 0.0 for s in scores)


@pytest.mark.parametrize(("defn", "v"), ALL)
def test_oracle_scores_one(tmp_path, defn, v):
    run = Run(tmp_path, defn, v)
    run.start()
    run.solve()
    scores = run.evaluate()
    assert scores and all(s == 1.0 for s in scores)


# -- word_count ----------------------------------------------------------------------
def word_count_run(tmp_path: Path, index: int = 0) -> Run:
    defn, v = variants_of("files/word_count")[index]
    run = Run(tmp_path, defn, v)
    run.start()
    return run


def test_word_count_reference_matches_its_input():
    for _, v in variants_of("files/word_count"):
        text = (DATA / v.data_key.relpath / "input" / "document.txt").read_text()
        ref = json.loads((DATA / v.data_key.relpath / "reference" / "answer.json").read_text())
        assert ref == {"words": len(text.split()), "lines": text.count("\n")}


def test_word_count_scores_each_field(tmp_path):
    run = word_count_run(tmp_path)
    ref = json.loads((run.reference / "answer.json").read_text())
    answer = run.workspace / "answer.json"
    answer.write_text(json.dumps({"words": ref["words"], "lines": ref["lines"] + 1}))
    assert run.evaluate() == [1.0, 0.0]
    answer.write_text(json.dumps({"words": float(ref["words"]), "lines": str(ref["lines"])}))
    assert run.evaluate() == [1.0, 0.0]
    answer.write_text("{not json")
    assert run.evaluate() == [0.0, 0.0]
    answer.write_text(json.dumps([ref["words"], ref["lines"]]))
    assert run.evaluate() == [0.0, 0.0]
    answer.write_text(json.dumps({"words": True, "lines": ref["lines"]}))
    assert run.evaluate() == [0.0, 1.0]


def test_word_count_start_fails_without_the_document(tmp_path):
    defn, v = variants_of("files/word_count")[1]
    run = Run(tmp_path, defn, v)
    (run.input / "document.txt").unlink()
    with pytest.raises(FileNotFoundError, match="document.txt"):
        run.start()


def test_word_count_broken_reference_raises_instead_of_scoring(tmp_path):
    run = word_count_run(tmp_path)
    (run.reference / "answer.json").unlink()
    with pytest.raises(FileNotFoundError):
        run.evaluate()


# -- cloth_sim -----------------------------------------------------------------------------
def cloth_run(tmp_path: Path) -> Run:
    ((defn, v),) = variants_of("physics/cloth_sim")
    run = Run(tmp_path, defn, v)
    run.start()
    return run


def test_cloth_reference_is_what_simulate_py_produces():
    spec = importlib.util.spec_from_file_location(
        "cloth_simulate_test", TASKS / "physics/cloth_sim/simulate.py"
    )
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    base = DATA / "tasks/physics/cloth_sim/base"
    x0 = np.load(base / "input/init.npy")
    params = json.loads((base / "input/params.json").read_text())
    assert x0.shape == (8, 8, 3) and x0.dtype == np.float64
    frames = sim.simulate(x0, params)
    ref = sorted((base / "reference/frames").glob("frame_*.npy"))
    assert len(frames) == len(ref) == params["n_frames"] == 10
    for got, path in zip(frames, ref, strict=True):
        np.testing.assert_allclose(got, np.load(path), rtol=0, atol=1e-12)
    # The task is not trivial: no frame equals the initial state within the tolerance.
    assert all(not np.allclose(f, x0, atol=1e-4, rtol=0) for f in frames)
    for i, j in params["pinned"]:
        np.testing.assert_array_equal(frames[-1][i, j], x0[i, j])


def test_cloth_partial_credit_per_frame(tmp_path):
    run = cloth_run(tmp_path)
    run.solve()
    frames = run.workspace / "frames"
    assert sorted(p.name for p in frames.iterdir()) == [f"frame_{n:03d}.npy" for n in range(10)]
    # Off by more than the tolerance in one coordinate of frame 3.
    f3 = np.load(frames / "frame_003.npy")
    f3[4, 4, 2] += 2e-4
    np.save(frames / "frame_003.npy", f3)
    # Within tolerance in frame 4.
    f4 = np.load(frames / "frame_004.npy")
    f4 += 5e-5
    np.save(frames / "frame_004.npy", f4)
    # Wrong shape, NaN, a pickled object array, not an npy file, missing.
    np.save(frames / "frame_005.npy", np.load(frames / "frame_005.npy")[:7])
    f6 = np.load(frames / "frame_006.npy")
    f6[0, 0, 0] = np.nan
    np.save(frames / "frame_006.npy", f6)
    np.save(frames / "frame_007.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    (frames / "frame_008.npy").write_text("0.0\n")
    (frames / "frame_009.npy").unlink()
    assert run.evaluate() == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_cloth_copying_the_initial_state_scores_zero(tmp_path):
    run = cloth_run(tmp_path)
    x0 = np.load(run.input / "init.npy")
    (run.workspace / "frames").mkdir()
    for n in range(10):
        np.save(run.workspace / "frames" / f"frame_{n:03d}.npy", x0)
    assert run.evaluate() == [0.0] * 10


def test_cloth_float32_frames_within_tolerance_pass(tmp_path):
    run = cloth_run(tmp_path)
    run.solve()
    frames = run.workspace / "frames"
    for p in frames.iterdir():
        buf = io.BytesIO()
        np.save(buf, np.load(p).astype(np.float32))
        p.write_bytes(buf.getvalue())
    assert run.evaluate() == [1.0] * 10


def test_cloth_solve_runs_the_simulation_through_the_session(tmp_path):
    run = cloth_run(tmp_path)
    s = run.agent_session()
    asyncio.run(call_task_fn(run.defn.solve_fn, run.v.cfg, s))
    (cmd,) = s.commands
    assert cmd.startswith("python3 - /input /workspace/frames <<'ALE_CLOTH_SIMULATE'")
    assert s.writes == []


def test_cloth_missing_reference_frame_raises(tmp_path):
    run = cloth_run(tmp_path)
    run.solve()
    (run.reference / "frames" / "frame_002.npy").unlink()
    with pytest.raises(FileNotFoundError):
        run.evaluate()


# -- echo_secret -----------------------------------------------------------------------------
def test_echo_secret_is_drawn_in_load_and_written_in_start(tmp_path):
    ((defn, v),) = variants_of("secrets/echo_secret")
    ((_, v2),) = variants_of("secrets/echo_secret")
    token = v.metadata["secret"]
    assert token != v2.metadata["secret"]  # a fresh secret per load
    assert token not in v.description
    run = Run(tmp_path, defn, v)
    s = run.setup_session()
    asyncio.run(call_task_fn(defn.start_fn, v.cfg, s))
    assert sorted(s.writes) == ["/input/secret.txt", "/reference/expected.txt"]
    assert (run.input / "secret.txt").read_text().strip() == token
    assert (run.reference / "expected.txt").read_text().strip() == token


def test_echo_secret_scores_exact_copies_only(tmp_path):
    ((defn, v),) = variants_of("secrets/echo_secret")
    run = Run(tmp_path, defn, v)
    run.start()
    token = v.metadata["secret"]
    out = run.workspace / "secret.txt"
    out.write_text(token)
    assert run.evaluate() == [1.0]
    out.write_text(f"  {token}\n\n")
    assert run.evaluate() == [1.0]
    out.write_text(token[:-1])
    assert run.evaluate() == [0.0]
    out.write_text(f"the secret is {token}")
    assert run.evaluate() == [0.0]
    (run.reference / "expected.txt").unlink()
    with pytest.raises(FileNotFoundError):
        run.evaluate()
