"""Checks every sandbox provider must pass (docker today; any later provider too).

Call `await run_conformance(sandbox)` on a started sandbox whose workspace is
/workspace and whose input is /input (read-only)."""

from __future__ import annotations

import time

from ale.sandbox.base import ExecResult


async def check_exit_codes(sb) -> None:
    r = await sb.exec(["sh", "-c", "exit 7"])
    assert isinstance(r, ExecResult) and r.exit_code == 7 and not r.timed_out


async def check_streams_separate(sb) -> None:
    r = await sb.exec(["sh", "-c", "echo out; echo err >&2"])
    assert r.stdout == b"out\n" and r.stderr == b"err\n"


async def check_timeout_kills_group(sb) -> None:
    t0 = time.monotonic()
    r = await sb.exec(["sh", "-c", "sleep 30 & sleep 30; echo never"], timeout=1)
    assert r.timed_out and time.monotonic() - t0 < 8
    ps = await sb.exec(["sh", "-c", "ps -eo args | grep -c '^sleep 30' || true"])
    assert ps.stdout.strip() == b"0", ps.stdout


async def check_timeout_kills_escaped_descendants(sb) -> None:
    """Children that left the process group (setsid, double fork) die with it too."""
    r = await sb.exec(["sh", "-c", "setsid sh -c 'sleep 31' & (sh -c 'sleep 32 &') ; sleep 30"], timeout=1)
    assert r.timed_out
    ps = await sb.exec(["sh", "-c", "ps -eo args | grep -c '^sleep 3[12]' || true"])
    assert ps.stdout.strip() == b"0", ps.stdout


async def check_output_cap(sb) -> None:
    r = await sb.exec(["sh", "-c", "head -c 5000000 /dev/zero"], output_limit=1000)
    assert len(r.stdout) == 1000 and r.stdout_truncated and r.exit_code == 0


async def check_stdin(sb) -> None:
    data = bytes(range(256)) * 1000
    r = await sb.exec(["sh", "-c", "cat > /workspace/.stdin-test && sha256sum /workspace/.stdin-test && rm /workspace/.stdin-test"], stdin=data)
    import hashlib

    assert r.exit_code == 0 and r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


async def check_background_does_not_block(sb) -> None:
    t0 = time.monotonic()
    r = await sb.exec(["sh", "-c", "sleep 20 & echo started"], timeout=30)
    assert r.stdout == b"started\n" and time.monotonic() - t0 < 3


async def check_kill_user_processes(sb) -> None:
    await sb.exec(["sh", "-c", "nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 & setsid sleep 100 >/dev/null 2>&1 &"])
    assert await sb.kill_user_processes() == 0


async def check_user_is_not_root(sb) -> None:
    r = await sb.exec(["id", "-u"])
    assert r.stdout.strip() != b"0"


async def run_conformance(sb) -> None:
    for check in (
        check_exit_codes,
        check_streams_separate,
        check_timeout_kills_group,
        check_timeout_kills_escaped_descendants,
        check_output_cap,
        check_stdin,
        check_background_does_not_block,
        check_kill_user_processes,
        check_user_is_not_root,
    ):
        await check(sb)
