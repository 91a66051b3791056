"""The candidate's session in a VM through cua's computer-server protocol: the guest's
real ``cua-computer-server`` (started by ale's init as the candidate) driven by ale's
``CuaClient`` over the control channel's relay (no network device), and the tool box
routed through it (``ALE_QEMU_SESSION=cua``)."""

from __future__ import annotations

import pytest

from ale.sandbox.qemu.sandbox import QemuCuaSandbox
from ale.sandbox.tools import ToolBox
from tests.qemu_support import booted_guest


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    yield from booted_guest(tmp_path_factory, name="test-cua", session="cua", memory_mib=768)


def test_protocol_runs_as_the_candidate_with_real_exit_codes(guest):
    loop, sb, _base = guest
    assert isinstance(sb, QemuCuaSandbox)

    async def go():
        cua = await sb.protocol()
        status = await cua.status()
        assert status["status"] == "ok"
        r = await cua.run_command(["sh", "-c", "id -u; echo err >&2; exit 5"], timeout=60)
        assert (r.exit_code, r.stdout, r.stderr) == (5, b"1000\n", b"err\n"), r
        # the server is a candidate process: its uid, no capability
        who = await sb.exec(["sh", "-c", "for p in $(pgrep -f 'm computer[_]server'); do "
                                         "grep -E '^(Uid|CapEff)' /proc/$p/status; done"], user="0:0", timeout=30)
        assert b"Uid:\t1000" in who.stdout and b"CapEff:\t0000000000000000" in who.stdout, who

    loop.run_until_complete(go())


def test_tool_box_goes_through_the_protocol(guest):
    loop, sb, base = guest

    async def go():
        tools = ToolBox(sb, workdir="/workspace", default_timeout=60)
        out = await tools.call("shell", {"command": "cat /input/data.txt; echo hi > /workspace/a.txt"})
        assert out.ok and out.stdout == "x\n", out
        assert (base / "ws" / "a.txt").read_text() == "hi\n"
        st = (base / "ws" / "a.txt").stat()
        assert (st.st_uid, st.st_gid) == (1000, 1000), "the workspace share keeps the candidate's ownership"
        out = await tools.call("shell", {"command": "echo no > /input/x"})
        assert not out.ok, "the public input is read-only"
        rec = await sb.record()
        assert rec["calls"] >= 2 and rec["relay_connections"] >= 1, rec

    loop.run_until_complete(go())


def test_after_the_end_of_turn_kill_the_server_starts_again(guest):
    loop, sb, _base = guest

    async def go():
        out = await sb.halt()
        assert out.survivors == [] and out.killed >= 1, out  # the server died with the candidate's processes
        cua = await sb.protocol()  # started again as the candidate
        r = await cua.run_command(["true"], timeout=60)
        assert r.exit_code == 0, r

    loop.run_until_complete(go())
