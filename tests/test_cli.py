"""The `ale` command as a user types it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from ale.sandbox.base import Mount
from ale.sandbox.docker import container_create_kwargs
from ale.sandbox.policy import IsolationPolicy
from tests.conftest import EXAMPLES, REPO, TOOLS_IMAGE


def ale(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ale.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, **(env or {})}, timeout=timeout)


def help_commands(text: str) -> list[str]:
    """The command names of a ``--help`` page's Commands panel (whole names, in order)."""
    names: list[str] = []
    inside = False
    for line in text.splitlines():
        if "Commands" in line and line.lstrip().startswith(("╭", "+")):
            inside = True
        elif inside and line.lstrip().startswith(("╰", "+")):
            break
        elif inside and (m := re.match(r"^\s*[│|] (\S+)\s", line)):
            names.append(m.group(1))
    return names


def test_help_lists_the_verbs():
    p = ale("--help")
    assert p.returncode == 0
    names = help_commands(p.stdout)
    for verb in ("run", "verify", "verify-container", "exp", "report", "cleanup", "image", "task", "data"):
        assert verb in names, f"{verb!r} is not a command of `ale --help`: {names}"
    assert len(names) == len(set(names)), names


def test_help_commands_are_whole_names():
    page = "╭─ Commands ─╮\n│ verify-container  Check. │\n│                   more. │\n╰────────────╯\n"
    assert help_commands(page) == ["verify-container"]  # no "verify" inside it


@pytest.mark.docker
def test_run_prints_the_run_folder_last_and_it_verifies(docker_client, tmp_path):
    p = ale("run", str(EXAMPLES / "files" / "word_count"), "--agent", "oracle", "--runs-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    run_dir = p.stdout.strip().splitlines()[-1]
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    assert result["status"] == "scored" and result["score"] == 1.0
    v = ale("verify", run_dir, "--json")
    assert v.returncode == 0, v.stdout
    assert json.loads(v.stdout)["valid"] is True


@pytest.mark.docker
def test_task_check_passes_an_example(docker_client, tmp_path):
    p = ale("task", "check", str(EXAMPLES / "secrets" / "echo_secret"), "--runs-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "pass (oracle 1.0, nop 0)" in p.stderr


@pytest.mark.docker
def test_task_check_fails_a_task_whose_oracle_is_wrong(docker_client, tmp_path):
    task = tmp_path / "bad"
    task.mkdir()
    (task / "main.py").write_text(
        "import cua_bench as cb\n"
        "@cb.tasks_config\ndef load():\n    return [cb.Task(description='write 1 to /workspace/a')]\n"
        "@cb.evaluate_task\nasync def evaluate(cfg, s):\n"
        "    return [1.0 if await s.file_exists('/workspace/a') else 0.0]\n"
        "@cb.solve_task\nasync def solve(cfg, s):\n    await s.write_file('/workspace/b', '1')\n"
    )
    p = ale("task", "check", str(task), "--runs-dir", str(tmp_path / "runs"))
    assert p.returncode == 1 and "variant 0 oracle" in p.stderr


@pytest.mark.docker
def test_verify_container_cli_on_a_good_and_a_bad_container(docker_client, tmp_path):
    inp, ws = tmp_path / "in", tmp_path / "ws"
    inp.mkdir()
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    name = f"ale-cli-{uuid.uuid4().hex[:8]}"
    policy = IsolationPolicy(memory_bytes=512 * 1024**2)
    (tmp_path / "policy.json").write_text(policy.model_dump_json())
    kwargs = container_create_kwargs(
        name=name, image=TOOLS_IMAGE, policy=policy,
        mounts=[Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)],
        labels={"ale.managed": "1", "ale.run_id": name}, workdir="/workspace",
    )
    c = docker_client.containers.create(**kwargs)
    try:
        c.start()
        args = ["verify-container", name, "--input", str(inp), "--workspace", str(ws),
                "--policy", str(tmp_path / "policy.json"), "--save-inspect", str(tmp_path / "inspect.json")]
        p = ale(*args)
        assert p.returncode == 0, p.stdout
        assert json.loads((tmp_path / "inspect.json").read_text())["Name"] == f"/{name}"
        other = tmp_path / "other"
        other.mkdir()
        p = ale("verify-container", name, "--input", str(inp), "--workspace", str(other),
                "--policy", str(tmp_path / "policy.json"))
        assert p.returncode == 1 and "mounts.sources" in p.stdout
    finally:
        c.remove(force=True, v=True)


def test_published_schemas_are_current(tmp_path):
    p = ale("schema", str(tmp_path))
    assert p.returncode == 0, p.stderr
    for name in ("result.schema.json", "trajectory.schema.json"):
        published = json.loads((REPO / "schemas" / name).read_text())
        assert published == json.loads((tmp_path / name).read_text()), f"schemas/{name} is stale: run `ale schema`"


def test_sigterm_and_sighup_become_an_interrupt_but_an_ignored_signal_stays_ignored():
    """`ale run` cleans up on SIGTERM/SIGHUP as on Ctrl-C; under `nohup` SIGHUP is
    ignored on purpose and must stay so."""
    import signal

    from ale.cli.main import terminate_as_interrupt

    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):  # the handler runs between bytecodes
                    pass
        assert signal.getsignal(signal.SIGTERM) is old_term
    finally:
        signal.signal(signal.SIGHUP, old_hup)
