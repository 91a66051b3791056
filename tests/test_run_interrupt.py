"""Ctrl-C, SIGTERM or SIGHUP during `ale run` removes the run's containers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import EXAMPLES, REPO, our_containers

pytestmark = pytest.mark.docker


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    "sig,sigint_ignored",
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGTERM, True), (signal.SIGHUP, True)],
    ids=["INT", "TERM", "HUP", "TERM-background", "HUP-background"],
)
def test_a_signal_mid_agent_leaves_no_container(docker_client, tmp_path, sig, sigint_ignored):
    """SIGTERM is what `timeout`, systemd, CI cancellation and `docker stop` send; it
    once killed `ale run` on the spot with the run's container still running. Started
    as background work is (`cmd &` in a script leaves SIGINT ignored), SIGTERM and
    SIGHUP once did nothing at all: the run went on."""
    script = tmp_path / "sleepy.json"
    script.write_text(json.dumps([{"tool": "shell", "args": {"command": "sleep 120"}}]))
    before = {c.id for c in our_containers(docker_client)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ale.cli", "run", str(EXAMPLES / "secrets" / "echo_secret"), "--agent", "replay",
         "--script", str(script), "--runs-dir", str(tmp_path / "runs")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    try:
        deadline = time.monotonic() + 60
        mine: set[str] = set()
        while time.monotonic() < deadline and not mine:
            mine = {c.id for c in our_containers(docker_client)} - before
            time.sleep(0.2)
        assert mine, "the run never created its container"
        time.sleep(1.5)  # the agent is now inside `sleep 120`
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err
    assert {c.id for c in our_containers(docker_client)} - before == set()
    assert not any((tmp_path / "runs" / ".scratch").glob("*"))


def test_a_sandbox_whose_removal_fails_is_swept_by_its_label(docker_client, tmp_path, monkeypatch):
    """Cleanup does not trust one handle: a failed removal is retried by the run's label."""
    import asyncio

    from ale.runs.lifecycle import execute_run
    from ale.sandbox.base import SandboxError
    from ale.sandbox.docker import DockerProvider, DockerSandbox
    from tests.test_run_e2e import plan_for

    async def failing_remove(self):
        raise SandboxError("injected: the engine refused the removal")

    monkeypatch.setattr(DockerSandbox, "remove", failing_remove)
    plan = plan_for(EXAMPLES / "files" / "word_count", tmp_path, agent="nop")
    asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert our_containers(docker_client, **{"ale.run_id": plan.run_id}) == []
