"""A confined harness: bubblewrap (Debian's ``bubblewrap``) around the harness process.

What the harness sees (``bwrap_argv``):

- the file system: ``/usr`` read-only (with Debian's ``/bin``, ``/lib``, ``/lib64``,
  ``/sbin`` links into it), the few files of ``/etc`` that programs need to start
  (``ale.tasks.jail.ETC_FILES``, the task jail's), fresh ``/proc``, ``/dev`` and ``/tmp``, its installation
  folders (``install``, read-only), its working folder and its own ``HOME`` (both
  read-write, under the run's ``agent/``), and the run's prompt and MCP config files
  (read-only). Nothing else of the host: not the task data, not the operator's
  home or the harness's own config dir there, not the runs folder.
- the network: a private network namespace (``--unshare-net``) with loopback only.
  Inside it ``netns_relay.py`` listens on the gateway's and the bridge's
  ``127.0.0.1`` ports and relays to their unix sockets, bound into the sandbox; so
  the harness's URLs are unchanged and these two are all it can reach.
- processes: own PID, IPC and UTS namespaces; the sandbox dies with its parent.

The start of the command line is the task jail's (``ale.tasks.jail.bwrap_base``):
one builder for every bubblewrap sandbox of ale.

``UnixRelay`` is the host side for a TCP server (the MCP bridge) that has no unix
socket of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ale.agents.errors import AgentConfigError
from ale.tasks.jail import NAMESPACES, bwrap_base

RELAY = Path(__file__).with_name("netns_relay.py")
SANDBOX_RUN = "/run/ale"


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise AgentConfigError("command agent: confine needs bubblewrap (`apt-get install bubblewrap`; "
                               "scripts/setup.sh installs it)")
    return path


def infer_install(argv: list[str], *, path_env: str | None = None) -> tuple[list[str], list[str]]:
    """The harness's installation, read from its command line: (folders, files).

    Folders: for the program (found on ``PATH``) and, for a script, its interpreter
    (``#!/usr/bin/env node``, a venv's ``python``), both where it is named and where
    its links lead, the folder that holds it: the prefix above a ``bin``/``.bin``
    folder, above the outermost ``node_modules``, or a venv's root (``pyvenv.cfg``).
    Under ``/usr`` nothing is needed (bound anyway). Files: absolute paths of existing
    files among the arguments (a script the interpreter runs).
    Raises AgentConfigError when the program is not found."""
    if not argv:
        return [], []
    exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path_env)
    if exe is None or not Path(exe).is_file():
        raise AgentConfigError(f"command agent: cannot find the harness program {argv[0]!r} to confine it "
                               "(name its installation in confine.install, or give a path)")
    folders: list[str] = []
    seen: set[str] = set()
    todo = [os.path.abspath(exe)]
    while todo and len(seen) < 8:
        named = todo.pop()
        if named in seen:
            continue
        seen.add(named)
        for where in _link_chain(named):
            root = _install_root(where)
            if root is not None and root not in folders:
                folders.append(root)
        todo += _interpreters(os.path.realpath(named), path_env)
    files = [a for a in argv[1:] if a.startswith("/") and Path(a).is_file()]
    return _outermost(folders), files


def _link_chain(path: str) -> list[str]:
    """``path`` and every path its symbolic links lead through, to the real file."""
    chain = [path]
    for _ in range(16):
        if not os.path.islink(chain[-1]):
            break
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1]))))
    real = os.path.realpath(path)
    return chain if real in chain else [*chain, real]


def _install_root(path: str) -> str | None:
    folder_real = os.path.realpath(os.path.dirname(path))
    if folder_real == "/usr" or folder_real.startswith("/usr/"):
        return None  # /usr, and Debian's /bin, /sbin, /lib links into it: bound anyway
    parts = Path(path).parts
    if "node_modules" in parts:
        return str(Path(*parts[: parts.index("node_modules")]))
    folder = Path(path).parent
    for up in (folder, *folder.parents[:2]):
        if (up / "pyvenv.cfg").is_file():
            return str(up)
    return str(folder.parent if folder.name in ("bin", ".bin", "sbin") else folder)


def _interpreters(path: str, path_env: str | None) -> list[str]:
    """The interpreter a script's ``#!`` line names (``env NAME`` looked up on PATH)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return []
    if not first.startswith(b"#!"):
        return []
    words = first[2:].decode(errors="replace").split()
    if not words:
        return []
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        found = shutil.which(names[0], path=path_env) if names else None
        return [os.path.abspath(found)] if found else []
    return [words[0]] if words[0].startswith("/") else []


def _outermost(folders: list[str]) -> list[str]:
    keep: list[str] = []
    for f in sorted(set(folders), key=len):
        if not any(f == k or f.startswith(k.rstrip("/") + "/") for k in keep):
            keep.append(f)
    return keep


def check_install(folders: list[str], *, private: list[Path]) -> None:
    """Refuse installation folders that would show the sandbox what it must not see:
    ``/``, the operator's home itself, or a folder holding one of ``private`` (the
    run folder)."""
    home = os.path.realpath(Path.home())
    for f in folders:
        real = os.path.realpath(f)
        bad = real == "/" or real == home or home.startswith(real.rstrip("/") + "/")
        bad = bad or any(os.path.realpath(p) == real or os.path.realpath(p).startswith(real.rstrip("/") + "/")
                         for p in private)
        if bad:
            raise AgentConfigError(
                f"command agent: the harness's installation folder {f!r} would show the confined "
                "harness the operator's home or the run folder; name the installation in confine.install (or "
                "set confine: false)")


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
    a, etc = bwrap_base(bwrap, network=False, hostname="ale-harness")
    a += ["--tmpfs", "/tmp", "--tmpfs", "/run", "--dir", SANDBOX_RUN]
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
    a += ["--setenv", "HOME", str(home), "--chdir", str(cwd), "--", python, f"{SANDBOX_RUN}/relay.py",
          *maps, "--", *argv]
    record = {
        "kind": "bubblewrap",
        "bwrap": bwrap,
        "version": bwrap_version(bwrap),
        "namespaces": ["net", *NAMESPACES],
        "capabilities": [],
        "network": {"interfaces": ["lo"],
                    "reachable": {f"127.0.0.1:{p}": "relayed to a unix socket of the trusted side" for p in sockets}},
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
