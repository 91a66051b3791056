"""A tiny finished experiment for the regrade and experiment-verify tests: one task
(``demo/tiny``, data in a local source), the oracle and the nop agents, one run each,
run once per session with real Docker; tests work on copies of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TASK = textwrap.dedent("""\
    import cua_bench as cb



    def score():
        return {score}


    @cb.tasks_config
    def load():
        meta = {{"input_dir": "/input", "remote_output_dir": "/workspace", "reference_dir": "/reference", "variant": "base"}}
        return [cb.Task(description="Write the answer to /input/question.txt into /workspace/answer.txt.",
                        task_id="demo/tiny/base", metadata=meta)]


    @cb.setup_task
    async def start(cfg, session):
        if not await session.file_exists("/input/question.txt"):
            raise FileNotFoundError("no question")


    @cb.solve_task
    async def solve(cfg, session):
        await session.write_file("/workspace/answer.txt", "42")


    @cb.evaluate_task
    async def evaluate(cfg, session):
        want = (await session.read_file("/reference/answer.txt")).strip()
        if not await session.file_exists("/workspace/answer.txt"):
            return [0.0]
        got = (await session.read_file("/workspace/answer.txt")).strip()
        return [score() if got == want else 0.0]
""")


def write_task_tree(root: Path, score: float | str) -> Path:
    """A task tree ``root/demo/tiny`` whose grader gives ``score`` to a right answer
    (an expression: ``"1 / 0"`` makes it raise)."""
    task = root / "demo" / "tiny"
    task.mkdir(parents=True, exist_ok=True)
    (task / "main.py").write_text(TASK.format(score=score))
    return root


@dataclass(frozen=True)
class Finished:
    base: Path  # holds tasks/, data/, exp.yaml, out/
    name: str

    @property
    def out(self) -> Path:
        return self.base / "out"

    @property
    def tasks(self) -> Path:
        return self.base / "tasks"

    @property
    def data(self) -> Path:
        return self.base / "data"

    def copy(self, dest: Path) -> Path:
        """A copy of the experiment's output folder (what a test may change)."""
        target = dest / "exp-copy"
        shutil.copytree(self.out, target, symlinks=True)
        return target

    def run_dir(self, exp_dir: Path, agent: str) -> Path:
        return next(p for p in (exp_dir / "runs").iterdir() if f"-{agent}-" in p.name)


def run_experiment(base: Path, basetemp: Path, *, agents: str = "[{name: oracle}, {name: nop}]", extra: str = "") -> str:
    """Data for ``demo/tiny`` and an experiment over ``base/tasks``, run to its end in
    ``base/out`` (a subprocess, as an operator runs it); returns its name."""
    variant = base / "data" / "tasks" / "demo" / "tiny" / "base"
    (variant / "input").mkdir(parents=True)
    (variant / "reference").mkdir(parents=True)
    (variant / "input" / "question.txt").write_text("What is six times seven?\n")
    (variant / "reference" / "answer.txt").write_text("42\n")
    name = f"rg-{uuid.uuid4().hex[:8]}"
    (base / "exp.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        tasks_root: tasks
        agents: {agents}
        tasks: [{{path: demo/tiny}}]
        repeats: 1
        concurrency: 2
        environment:
          data_source: local:{base / "data"}
          policy: {{cpus: 1, memory_bytes: 268435456}}
        output: out
    """) + extra)
    # the same config folder as the autouse fixture gives each test (the signing key)
    env = {**os.environ, "ALE_CONFIG_DIR": str(basetemp / "ale-config"), "ALE_CACHE_DIR": str(basetemp / "ale-cache")}
    res = subprocess.run([sys.executable, "-m", "ale.cli.exp", "run", str(base / "exp.yaml"), "--plain"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return name


@pytest.fixture(scope="session")
def finished_experiment(tmp_path_factory, docker_client) -> Iterator[Finished]:
    base = tmp_path_factory.mktemp("regrade-exp")
    write_task_tree(base / "tasks", 0.5)
    name = run_experiment(base, tmp_path_factory.getbasetemp())
    try:
        yield Finished(base, name)
    finally:
        from ale.sandbox.docker import remove_containers

        remove_containers(docker_client, experiment=name)
