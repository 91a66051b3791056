"""Ctrl-C during `ale run` removes the run's containers."""

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


def test_sigint_mid_agent_leaves_no_container(docker_client, tmp_path):
    script = tmp_path / "sleepy.json"
    script.write_text(json.dumps([{"tool": "shell", "args": {"command": "sleep 120"}}]))
    before = {c.id for c in our_containers(docker_client)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ale.cli", "run", str(EXAMPLES / "secrets" / "echo_secret"), "--agent", "replay",
         "--script", str(script), "--runs-dir", str(tmp_path / "runs")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 60
        mine: set[str] = set()
        while time.monotonic() < deadline and not mine:
            mine = {c.id for c in our_containers(docker_client)} - before
            time.sleep(0.2)
        assert mine, "the run never created its container"
        time.sleep(1.5)  # the agent is now inside `sleep 120`
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err
    assert {c.id for c in our_containers(docker_client)} - before == set()
    assert not any((tmp_path / "runs" / ".scratch").glob("*"))
