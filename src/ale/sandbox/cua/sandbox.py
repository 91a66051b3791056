"""A sealed Docker sandbox of a cua-compatible image, driven through computer-server.

An image is cua-compatible when its entrypoint (with its command) runs cua's
computer-server (``computer_server`` / ``computer-server`` in it: cua's images, and
``ale image build --cua``). The Docker provider creates such a sandbox exactly as
any other (no network, read-only root, every capability dropped, no-new-privileges,
the candidate's uid, the limits, the two mounts), with ale's reaper as PID 1 instead
of the image's entrypoint, then ``CuaSandbox.start`` starts the image's entrypoint
and command as the candidate user (a detached ``docker exec``: the candidate's uid,
no capability) and opens the tunnel to it (``tunnel.ExecTunnel``).

What goes through the protocol: the tool box's calls (``shell``, ``read_file``,
``write_file``, ``list_dir``) and so every session call task code makes
(``run_command``, ``read_bytes``, ``write_bytes``, ``file_exists``, ...), and the
``computer`` tool's screenshots, mouse and keyboard (``CuaDesktop``). What does not:
ale's own trusted work, ``exec`` (the probes, the end-of-turn kill, a native
harness), which stays on the engine's exec. The end-of-turn kill ends the server (it
is a candidate process); the next protocol call starts a fresh one.

The control server is no way up for the candidate: it runs with the candidate's
rights. ``rights_probe`` reads, through the engine, the server's uid, gid,
capabilities and no-new-privileges beside the probe's own (a candidate process):
``record()`` keeps them, and ``mode`` is ``same-rights`` only when they match.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from ale.sandbox.base import DEFAULT_OUTPUT_LIMIT, ExecResult, SandboxError
from ale.sandbox.cua.client import CuaClient, CuaError
from ale.sandbox.cua.tunnel import ExecTunnel
from ale.sandbox.halt import STOP_BOUND_S, StopOutcome

DEFAULT_PORT = 8000
SERVER_LOG = "/tmp/.ale-cua-server.log"
READY_TIMEOUT_S = 90.0
_MARKERS = ("computer_server", "computer-server")


def server_argv(image_inspect: dict[str, Any]) -> list[str] | None:
    """The image's entrypoint and command when they run computer-server, else None."""
    config = image_inspect.get("Config") or {}
    argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    return argv if any(m in a for a in argv for m in _MARKERS) else None


def server_port(argv: list[str]) -> int:
    """The ``--port`` the server is started with (computer-server's default: 8000)."""
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--port="):
            return int(a.split("=", 1)[1])
    return DEFAULT_PORT


# Run through the engine as the candidate: the server's rights and the probe's own.
_RIGHTS_SCRIPT = r"""
import json, os
def status(pid):
    out = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k, _, v = line.partition(":")
            if k in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
                out[k] = v.split()
    except OSError:
        return None
    return out
servers = []
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    try:
        argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if any(b"computer_server" in a or a.endswith(b"Xvfb") for a in argv[:3]) and b"-c" not in argv[:2]:
        servers.append({"pid": int(p), "argv": [a.decode(errors="replace") for a in argv if a][:8], "status": status(p)})
print(json.dumps({"self": status("self"), "servers": servers}))
"""  # noqa: E501


# Run through the engine as the candidate, just before the isolation probes: every
# listening socket with the process holding it and that process's rights, one line
# each: ``KIND ADDRESS PID EUID EGID CAPEFF CAPPRM CAPAMB NONEWPRIVS`` (the probe rules
# tolerate a listener only when its holder has exactly the candidate's rights).
_LISTENERS_SCRIPT = r"""
import os
owners = {}
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    try:
        for fd in os.listdir(f"/proc/{p}/fd"):
            link = os.readlink(f"/proc/{p}/fd/{fd}")
            if link.startswith("socket:["):
                owners.setdefault(link[8:-1], p)
    except OSError:
        continue
def rights(pid):
    st = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k, _, v = line.partition(":")
            st[k] = v.split()
    except OSError:
        return "- - - - - - -"
    g = lambda k, i=0: (st.get(k) or ["-"] * 2)[i]
    return " ".join([pid, g("Uid", 1), g("Gid", 1), g("CapEff"), g("CapPrm"), g("CapAmb"), g("NoNewPrivs")])
for kind in ("tcp", "tcp6", "udp", "udp6"):
    try:
        rows = open(f"/proc/net/{kind}").read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        f = row.split()
        if len(f) > 9 and (kind.startswith("udp") or f[3] == "0A"):
            print(kind, f[1], rights(owners.get(f[9], "-")))
try:
    for row in open("/proc/net/unix").read().splitlines()[1:]:
        f = row.split()
        if len(f) > 7 and f[3] == "00010000":
            print("unix", f[7], rights(owners.get(f[6], "-")))
except OSError:
    pass
"""


# Kill every computer-server (``-m computer_server`` in its command line; spelled in two
# pieces here so that this script's own command line does not match) before a restart.
_KILL_SERVERS = (
    'for p in /proc/[0-9]*; do [ "${p#/proc/}" = $$ ] && continue; '
    'c=$(tr "\\0" " " < "$p/cmdline" 2>/dev/null) || continue; '
    'case $c in *"-m computer"_server*) kill -9 "${p#/proc/}" 2>/dev/null;; esac; done; true'
)


def judge_rights(probe: dict[str, Any]) -> dict[str, Any]:
    """``same-rights`` when every server process has the probe's uid and gid, no
    capability at all (effective, permitted, ambient) and no-new-privileges set."""
    me = probe.get("self") or {}
    servers = probe.get("servers") or []
    problems = []
    if not servers:
        problems.append("no computer-server process found")
    for s in servers:
        st = s.get("status") or {}
        if st.get("Uid") != me.get("Uid") or st.get("Gid") != me.get("Gid"):
            problems.append(f"pid {s.get('pid')}: uid/gid {st.get('Uid')}/{st.get('Gid')} differ from the candidate's")
        for cap in ("CapEff", "CapPrm", "CapAmb"):
            if any(int(x, 16) for x in st.get(cap, ["1"])):
                problems.append(f"pid {s.get('pid')}: {cap} {st.get(cap)} is not empty")
        if st.get("NoNewPrivs") != ["1"]:
            problems.append(f"pid {s.get('pid')}: no-new-privileges is not set")
    return {"mode": "same-rights" if not problems else "unproven", "problems": problems}


class CuaSandbox:
    """A ``DockerSandbox`` plus the computer-server in it (see the module's docstring)."""

    shares_host_filesystem = True

    def __init__(self, inner: Any, argv: list[str]):
        self.inner = inner
        self.server_argv = list(argv)
        self.port = server_port(argv)
        self.name: str = inner.name
        self.id: str = inner.id
        self.policy = inner.policy
        self.client = inner.client  # the Docker SDK client (the channel and the tunnel use it)
        self._tunnel: ExecTunnel | None = None
        self._cua: CuaClient | None = None
        self._lock = asyncio.Lock()
        self.starts: list[dict[str, Any]] = []
        self.rights: dict[str, Any] | None = None
        self._retired_calls = 0

    # -- the protocol --------------------------------------------------------------
    async def protocol(self) -> CuaClient:
        """The live client; starts the server (again, after the end-of-turn kill) when needed."""
        async with self._lock:
            if self._cua is not None and self._tunnel is not None and self._tunnel.alive:
                return self._cua
            await self._drop()
            return await self._start_server()

    async def _start_server(self) -> CuaClient:
        t0 = time.perf_counter()
        api = self.client.api
        script = f'exec "$@" >>{SERVER_LOG} 2>&1'
        try:
            ex = await asyncio.to_thread(api.exec_create, self.id,
                                         ["sh", "-c", script, "computer-server", *self.server_argv],
                                         user=self.policy.user, workdir="/")
            await asyncio.to_thread(api.exec_start, ex["Id"], detach=True)
        except Exception as e:  # docker raises several unrelated types here
            raise SandboxError(f"cannot start computer-server in {self.name}: {e}") from e
        tunnel = await ExecTunnel(self.inner, self.port).open()
        cua = CuaClient(uds=tunnel.socket_path)
        try:
            status = await cua.wait_ready(READY_TIMEOUT_S)
        except CuaError as e:
            log = await self._server_log()
            await cua.aclose()
            await tunnel.close()
            raise SandboxError(f"computer-server did not answer in {self.name} within "
                               f"{READY_TIMEOUT_S:.0f}s: {e}\n{log}") from e
        self._tunnel, self._cua = tunnel, cua
        self.starts.append({"ready_s": round(time.perf_counter() - t0, 3), "tunnel_s": tunnel.started_s,
                            "status": status})
        if self.rights is None:
            self.rights = await self.rights_probe()
        return cua

    async def protocol_lost(self) -> None:
        """The server or its tunnel failed under a call: the next ``protocol()`` starts
        a fresh server (any server still running is killed first: the port is one)."""
        async with self._lock:
            await self._drop()
            await self.inner.exec(["sh", "-c", _KILL_SERVERS], timeout=30)

    async def _server_log(self) -> str:
        with contextlib.suppress(SandboxError):
            r = await self.inner.exec(["tail", "-c", "3000", SERVER_LOG], timeout=20)
            return r.stdout.decode(errors="replace")
        return ""

    async def rights_probe(self) -> dict[str, Any]:
        """The server's rights beside a candidate process's, read through the engine."""
        r = await self.inner.exec(["python3", "-c", _RIGHTS_SCRIPT], timeout=30)
        try:
            probe = json.loads(r.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"mode": "unproven", "problems": [f"the probe failed: exit {r.exit_code}: {r.stderr[-500:]!r}"]}
        return {**judge_rights(probe), "probe": probe}

    async def control_listeners(self) -> str:
        """The body of the ``control_server`` section the isolation probes' evidence
        gets (``ale.isolation.probes.run_probes``; ``probe.no_inet_listeners`` and
        ``probe.unix_listeners_private`` tolerate exactly the listeners it names whose
        holder has the candidate's rights; ``ale verify`` re-reads it)."""
        r = await self.inner.exec(["python3", "-c", _LISTENERS_SCRIPT], timeout=30)
        body = r.stdout.decode(errors="replace") if r.exit_code == 0 else ""
        return f"kind cua-computer-server port {self.port}\n{body}"

    async def _drop(self) -> None:
        if self._cua is not None:
            self._retired_calls += self._cua.calls
            await self._cua.aclose()
        if self._tunnel is not None:
            await self._tunnel.close()
        self._cua, self._tunnel = None, None

    async def record(self) -> dict[str, Any]:
        return {
            "server_argv": self.server_argv,
            "port_inside": self.port,
            "server_user": self.policy.user,
            "starts": self.starts,
            "calls": self._retired_calls + (self._cua.calls if self._cua is not None else 0),
            "control_server": self.rights,
            "tunnel": await self._tunnel.record() if self._tunnel is not None else None,
        }

    # -- the Sandbox contract: the engine's ----------------------------------------
    def inspect(self) -> dict[str, Any]:
        return dict(self.inner.inspect())

    async def start(self) -> None:
        await self.inner.start()
        await self.protocol()

    async def exec(self, argv: list[str], *, user: str | None = None, workdir: str | None = None,
                   timeout: float | None = None, stdin: bytes | None = None,
                   output_limit: int = DEFAULT_OUTPUT_LIMIT, env: dict[str, str] | None = None) -> ExecResult:
        """The harness's own exec (the engine's), never the protocol."""
        return await self.inner.exec(argv, user=user, workdir=workdir, timeout=timeout, stdin=stdin,
                                     output_limit=output_limit, env=env)

    async def kill_user_processes(self) -> int:
        n = await self.inner.kill_user_processes()
        await self._drop()
        return int(n)

    async def kill_user_processes_then(self, argv: list[str] | None, *,
                                       timeout: float = 60) -> tuple[int, ExecResult | None]:
        out = await self.inner.kill_user_processes_then(argv, timeout=timeout)
        await self._drop()
        return out

    async def halt(self, *, keep_uids: tuple[int, ...] = (), bound_s: float = STOP_BOUND_S) -> StopOutcome:
        """The host-side stop of the Docker sandbox underneath; the server and its
        tunnel are candidate processes and die with the rest."""
        out = await self.inner.halt(keep_uids=keep_uids, bound_s=bound_s)
        await self._drop()
        return out

    async def stop(self) -> None:
        await self._drop()
        await self.inner.stop()

    async def remove(self) -> None:
        await self._drop()
        await self.inner.remove()
