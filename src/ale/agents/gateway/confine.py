"""A confined harness: bubblewrap (Debian's ``bubblewrap``) around the harness process.

What the harness sees (``bwrap_argv``):

- the file system: ``/usr`` read-only (with Debian's ``/bin``, ``/lib``, ``/lib64``,
  ``/sbin`` links into it), a few files of ``/etc`` that programs need to start
  (``passwd``, ``group``, ``nsswitch.conf``, ``hosts``, ``localtime``, ``ssl/``,
  ``ca-certificates/``), fresh ``/proc``, ``/dev`` and ``/tmp``, its installation
  folders (``install``, read-only), its working folder and its own ``HOME`` (both
  read-write, under the run's ``agent/``), and the run's prompt and MCP config files
  (read-only). Nothing else of the host: not the task data, not the operator's
  home or the harness's own config dir there, not the runs folder.
- the network: a private network namespace (``--unshare-net``) with loopback only.
  Inside it ``netns_relay.py`` listens on the gateway's and the bridge's
  ``127.0.0.1`` ports and relays to their unix sockets, bound into the sandbox; so
  the harness's URLs are unchanged and these two are all it can reach.
- processes: own PID, IPC and UTS namespaces; the sandbox dies with its parent.

``UnixRelay`` is the host side for a TCP server (the MCP bridge) that has no unix
socket of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ale.agents.errors import AgentConfigError

RELAY = Path(__file__).with_name("netns_relay.py")
ETC_FILES = ("passwd", "group", "nsswitch.conf", "hosts", "localtime", "ssl", "ca-certificates", "ld.so.cache")
SANDBOX_RUN = "/run/ale"


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise AgentConfigError("command agent: confine needs bubblewrap (`apt-get install bubblewrap`; scripts/setup.sh installs it)")
    return path


def bwrap_version(bwrap: str) -> str:
    try:
        return subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"


def bwrap_argv(
    argv: list[str],
    *,
    cwd: Path,
    home: Path,
    install: list[str],
    files: list[Path],
    sockets: dict[int, Path],
    python: str = "/usr/bin/python3",
) -> tuple[list[str], dict[str, Any]]:
    """The command line that runs ``argv`` confined, and its record for the evidence."""
    bwrap = bwrap_path()
    a = [bwrap, "--die-with-parent", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
         "--hostname", "ale-harness", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if Path("/" + link).is_symlink():
            a += ["--symlink", str(Path("/" + link).readlink()), "/" + link]
        elif Path("/" + link).is_dir():
            a += ["--ro-bind", "/" + link, "/" + link]
    etc = [f"/etc/{n}" for n in ETC_FILES if Path(f"/etc/{n}").exists()]
    for p in etc:
        a += ["--ro-bind", p, p]
    a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run", "--dir", SANDBOX_RUN]
    ro = []
    for p in install:
        if not Path(p).exists():
            raise AgentConfigError(f"command agent: confine.install names {p!r}, which does not exist")
        ro.append(str(Path(p)))
    for p in ro:
        a += ["--ro-bind", p, p]
    rw = [str(cwd), str(home)]
    for p in rw:
        a += ["--bind", p, p]
    for f in files:
        a += ["--ro-bind", str(f), str(f)]
    a += ["--ro-bind", str(RELAY), f"{SANDBOX_RUN}/relay.py"]
    maps = []
    for port, sock in sockets.items():
        inside = f"{SANDBOX_RUN}/{port}.sock"
        a += ["--bind", str(sock), inside]
        maps += ["--map", f"{port}={inside}"]
    a += ["--setenv", "HOME", str(home), "--chdir", str(cwd), "--", python, f"{SANDBOX_RUN}/relay.py", *maps, "--", *argv]
    record = {
        "kind": "bubblewrap",
        "bwrap": bwrap,
        "version": bwrap_version(bwrap),
        "namespaces": ["net", "pid", "ipc", "uts", "cgroup"],
        "network": {"interfaces": ["lo"], "reachable": {f"127.0.0.1:{p}": "relayed to a unix socket of the trusted side" for p in sockets}},
        "read_only": ["/usr", *etc, *ro, *map(str, files)],
        "read_write": rw,
        "fresh": ["/proc", "/dev", "/tmp", "/run"],
        "argv": a,
    }
    return a, record


class UnixRelay:
    """Host side: a unix socket that relays each connection to ``127.0.0.1:port``."""

    def __init__(self, path: Path, port: int):
        self.path, self.port = path, port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, uw), _pipe(ur, writer))

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[Path]:
        server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        self.path.chmod(0o600)
        try:
            yield self.path
        finally:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()
