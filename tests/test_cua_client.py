"""ale's computer-server client against a stand-in that answers as cua's server does
(``/cmd`` data lines, its ``run_command``: a shell string, strict UTF-8 output, only
the shell killed on a timeout; its file handlers), here on the host. The same client
against the real server in a real sealed container: tests/test_cua_docker.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from ale.sandbox.cua.client import CuaClient, CuaCommandFailed, CuaError


class StandIn:
    """The parts of computer-server's ``main.py`` and its generic handlers the client uses."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def run_command(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_shell(command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
        except TimeoutError:
            proc.kill()
            return {"success": False, "stdout": "", "stderr": f"Command timed out after {timeout}s", "return_code": -1}
        return {"success": True, "stdout": out.decode(), "stderr": err.decode(), "return_code": proc.returncode}

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/status":
            return httpx.Response(200, json={"status": "ok", "os_type": "linux", "features": []})
        body = json.loads(request.content)
        self.seen.append(body)
        cmd, p = body["command"], body.get("params", {})
        try:
            if cmd == "run_command":
                result = await self.run_command(p["command"], p.get("timeout"))
            elif cmd == "file_exists":
                result = {"success": True, "exists": Path(p["path"]).is_file()}
            elif cmd == "directory_exists":
                result = {"success": True, "exists": Path(p["path"]).is_dir()}
            elif cmd == "list_dir":
                result = {"success": True, "files": [c.name for c in Path(p["path"]).iterdir() if c.is_file() or c.is_dir()]}
            elif cmd == "read_bytes":
                with open(p["path"], "rb") as f:
                    f.seek(p.get("offset", 0))
                    data = f.read(p["length"]) if p.get("length") is not None else f.read()
                result = {"success": True, "content_b64": base64.b64encode(data).decode()}
            elif cmd == "write_bytes":
                with open(p["path"], "ab" if p.get("append") else "wb") as f:
                    f.write(base64.b64decode(p["content_b64"]))
                result = {"success": True}
            elif cmd == "create_dir":
                Path(p["path"]).mkdir(parents=True, exist_ok=True)
                result = {"success": True}
            elif cmd == "screenshot":
                result = {"success": True, "image_data": base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode(), "format": "png"}
            elif cmd == "left_click":
                result = {"success": True}
            else:
                return httpx.Response(400, json={"detail": f"Unknown command: {cmd}"})
        except Exception as e:  # the server's handlers answer every failure so
            result = {"success": False, "error": str(e)}
        return httpx.Response(200, text=f"data: {json.dumps(result)}\n\n")


@pytest.fixture
def server() -> StandIn:
    return StandIn()


def client(server: StandIn, **kw: Any) -> CuaClient:
    return CuaClient(transport=httpx.MockTransport(server.handle), **kw)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_exit_codes_bytes_and_streams(server: StandIn) -> None:
    async def go() -> None:
        async with client(server) as c:
            assert (await c.status())["status"] == "ok"
            r = await c.run_command("printf 'a\\377b'; printf err >&2; exit 7")
            assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, b"a\xffb", b"err", False)
            r = await c.run_command(["printf", "%s", "it's $HOME"])  # an argv: no shell expansion
            assert r.ok and r.stdout == b"it's $HOME"
    run(go())


def test_cwd_env_stdin_and_a_long_command(server: StandIn, tmp_path: Path) -> None:
    async def go() -> None:
        async with client(server, tmp_dir=str(tmp_path)) as c:
            r = await c.run_command("pwd; echo $X; cat", cwd=str(tmp_path), env={"X": "y z"}, stdin=b"in\x00put")
            assert r.stdout == f"{tmp_path}\ny z\n".encode() + b"in\x00put"
            r = await c.run_command("true", cwd=str(tmp_path / "absent"))
            assert r.exit_code == 2 and b"absent" in r.stderr
            long = "echo " + "x" * 200_000  # past one argument's 128 KiB: run from a file
            r = await c.run_command(long)
            assert r.ok and r.stdout == b"x" * 200_000 + b"\n"
            assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ale-cua-")]  # cleaned up
    run(go())


def test_output_limit_truncates_each_stream(server: StandIn) -> None:
    async def go() -> None:
        async with client(server) as c:
            r = await c.run_command("head -c 5000 /dev/zero; head -c 10 /dev/zero >&2", output_limit=1000)
            assert len(r.stdout) == 1000 and r.stdout_truncated and len(r.stderr) == 10 and not r.stderr_truncated
    run(go())


def test_timeout_kills_the_group_and_the_tagged_escapees(server: StandIn, tmp_path: Path) -> None:
    marker = tmp_path / "escaped"

    async def go() -> None:
        async with client(server) as c:
            t0 = time.monotonic()
            # A child that left the process group (setsid) would outlive a kill of the group.
            r = await c.run_command(f"setsid sh -c 'sleep 3; touch {marker}' & sleep 30", timeout=1)
            assert r.timed_out and r.exit_code in (124, 137)
            assert time.monotonic() - t0 < 10
            await asyncio.sleep(3.5)
            assert not marker.exists(), "a tagged process survived the timeout"
            r = await c.run_command("sleep 0.2 & echo done", timeout=5)  # a background child delays nothing
            assert r.ok and r.stdout == b"done\n" and r.duration_s < 2
    run(go())


def test_files(server: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ale.sandbox.cua.client.CHUNK", 1000)  # several messages each way

    async def go() -> None:
        async with client(server) as c:
            d = str(tmp_path / "a" / "b")
            await c.make_dir(d)
            assert await c.directory_exists(d) and not await c.file_exists(d)
            data = os.urandom(3500)
            await c.write_bytes(d + "/f.bin", data)
            assert await c.read_bytes(d + "/f.bin") == data
            await c.write_bytes(d + "/empty", b"")
            assert await c.read_bytes(d + "/empty") == b""
            assert await c.list_dir(d) == ["empty", "f.bin"]
            with pytest.raises(ValueError):
                await c.read_bytes(d + "/f.bin", limit=3000)
            with pytest.raises(FileNotFoundError):
                await c.read_bytes(d + "/nope")
            with pytest.raises(FileNotFoundError):
                await c.list_dir(d + "/nope")
    run(go())
    assert sum(1 for s in server.seen if s["command"] == "write_bytes") == 5  # 4 pieces + the empty file


def test_gui_calls_and_failures(server: StandIn) -> None:
    async def go() -> None:
        async with client(server) as c:
            assert (await c.screenshot()).startswith(b"\x89PNG")
            await c.left_click(3, 4)
            assert server.seen[-1] == {"command": "left_click", "params": {"x": 3, "y": 4}}
            with pytest.raises(CuaCommandFailed, match="Unknown command"):
                await c.call("no_such_command")
    run(go())


def test_unreachable_server_is_a_cua_error(tmp_path: Path) -> None:
    async def go() -> None:
        async with CuaClient(uds=str(tmp_path / "none.sock")) as c:
            with pytest.raises(CuaError, match="does not answer"):
                await c.status()
            with pytest.raises(CuaError):
                await c.wait_ready(0.3)
    run(go())
