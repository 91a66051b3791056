"""An exec's output that reaches the harness after the engine reports the command's
exit is kept (a loaded host: the exit is reported before the output is passed on).
Without it the end-of-turn kill's count and the after-probes were lost, and a sealed
run was recorded as one whose probes did not run."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from ale.sandbox import docker as dk
from ale.sandbox.base import SandboxSpec
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import IsolationPolicy
from tests.conftest import TOOLS_IMAGE

pytestmark = pytest.mark.docker

LAG_S = 0.8  # the stream's first bytes reach the harness this long after they were sent


def test_output_that_arrives_after_the_exit_is_kept(docker_client, monkeypatch) -> None:
    real = dk._read_frames

    def late(sock, collector):
        # The output reaches the harness's socket LAG_S after it was sent: a stream
        # closed before then has lost it (what a shut-down socket reads on a loaded host).
        time.sleep(LAG_S)
        if not collector.closed:
            real(sock, collector)

    monkeypatch.setattr(dk, "_read_frames", late)

    async def main() -> None:
        provider = DockerProvider(docker_client)
        sb = await provider.create(SandboxSpec(
            name=f"ale-test-late-{uuid.uuid4().hex[:8]}", image=TOOLS_IMAGE, policy=IsolationPolicy(), mounts=(),
            labels={"ale.run_id": "test-late-output"}, workdir="/tmp"))
        try:
            await sb.start()
            r = await sb.exec(["sh", "-c", "echo 0; echo probes"], timeout=30)
            assert (r.exit_code, r.stdout) == (0, b"0\nprobes\n"), r
            remaining, probe = await sb.kill_user_processes_then(["echo", "after-probes"])
            assert remaining == 0 and probe is not None and probe.stdout == b"after-probes\n", (remaining, probe)
            t0 = time.monotonic()  # a silent background child still does not hold the return long
            r = await sb.exec(["sh", "-c", "sleep 20 & exit 3"], timeout=30)  # the child holds the stream
            assert r.exit_code == 3 and time.monotonic() - t0 < 3 + LAG_S, r
        finally:
            await sb.remove()

    asyncio.run(main())
