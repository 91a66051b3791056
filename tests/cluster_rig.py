"""A Ray cluster on one machine for tests and the bench: a head on the host and
worker nodes, each in its own network namespace with its own Docker engine.

Every address is a private one on this machine (10.231.N.1 on the host's side of
a veth pair, 10.231.N.2 in the namespace). Everything made is torn down by
``Rig.close()`` on every path out (namespaces, links, engines and their mounts,
nodes), and ``Rig`` is a context manager.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ALE = [sys.executable, "-m", "ale.cli"]


def _run(*cmd: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=timeout, **kw)


def can_build_rig() -> str | None:
    """Why a rig cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, a second Docker engine)"
    for tool in ("ip", "nsenter", "dockerd", "docker"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "needs ray (pip install 'ale[ray]')"
    return None


@dataclass
class Engine:
    index: int
    netns: str
    root: Path
    host_ip: str
    ns_ip: str
    proc: subprocess.Popen | None = None

    @property
    def sock(self) -> str:
        return f"unix://{self.root}/d.sock"


@dataclass
class Rig:
    workers: int = 2
    slots: int = 1
    image: str = "ale-tools:latest"
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    engines: list[Engine] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    address: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base = Path(f"/tmp/alc{self.tag}")
        self.base.mkdir(mode=0o700)
        token = self.base / "token"
        self.env = {
            **os.environ,
            "ALE_NODE_ROOT": str(self.base / "nodes"),
            "RAY_AUTH_TOKEN_PATH": str(token),
            "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[1] / "src"),
                                                      os.environ.get("PYTHONPATH", "")] if p),
        }

    # -- building ----------------------------------------------------------------
    def __enter__(self) -> Rig:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self) -> None:
        subnet = 100 + int(self.tag, 16) % 100
        for i in range(1, self.workers + 1):
            self._engine(i, subnet)
        self.address = self.start_head()
        for e in self.engines:
            self.start_worker(e)

    def _engine(self, i: int, subnet: int) -> Engine:
        ns = f"alc{self.tag}n{i}"
        host_if, ns_if = f"alc{self.tag}h{i}", f"alc{self.tag}c{i}"
        net = f"10.{subnet}.{i}"
        e = Engine(i, ns, self.base / f"e{i}", f"{net}.1", f"{net}.2")
        self.engines.append(e)  # recorded first: close() undoes a half-built one
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", ns)
        _run("ip", "addr", "add", f"{e.host_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        nsx = ["ip", "netns", "exec", ns]  # ip settings only; dockerd runs under nsenter
        _run(*nsx, "ip", "link", "set", "lo", "up")
        _run(*nsx, "ip", "addr", "add", f"{e.ns_ip}/30", "dev", ns_if)
        _run(*nsx, "ip", "link", "set", ns_if, "up")
        _run(*nsx, "ip", "route", "add", "default", "via", e.host_ip)
        e.root.mkdir(parents=True)
        log = (e.root / "dockerd.log").open("wb")
        e.proc = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{ns}", "dockerd", "--data-root", str(e.root / "data"),
             "--exec-root", str(e.root / "x"), "--pidfile", str(e.root / "d.pid"), "-H", e.sock,
             "--bridge=none", "--iptables=false", "--ip6tables=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while _run("docker", "-H", e.sock, "info", check=False, timeout=30).returncode != 0:
            if time.monotonic() > deadline or e.proc.poll() is not None:
                raise RuntimeError(f"dockerd in {ns} did not start: {(e.root / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.5)
        save = subprocess.Popen(["docker", "save", self.image], stdout=subprocess.PIPE)
        _run("docker", "-H", e.sock, "load", stdin=save.stdout, timeout=300)
        save.wait(timeout=60)
        return e

    def ale(self, *args: str, netns: str | None = None, timeout: float = 240, check: bool = True):
        cmd = [*ALE, *args]
        if netns:
            cmd = ["nsenter", f"--net=/var/run/netns/{netns}", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p

    def start_head(self) -> str:
        name = f"head{self.tag}"
        self.nodes.append(name)
        p = self.ale("node", "start", "--head", "--port", "0", "--node-ip", self.engines[0].host_ip, "--name", name)
        return p.stdout.strip().splitlines()[-1]

    def start_worker(self, e: Engine) -> str:
        name = f"w{e.index}{self.tag}"
        if name not in self.nodes:
            self.nodes.append(name)
        self.ale("node", "start", "--address", self.address, "--docker-host", e.sock, "--slots", str(self.slots),
                 "--name", name, netns=e.netns)
        return name

    def kill_worker(self, e: Engine) -> None:
        """SIGKILL the worker's Ray processes (a lost node); its engine stays up."""
        import json

        rec = json.loads((self.base / "nodes" / f"w{e.index}{self.tag}" / "node.json").read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rec["pgid"], signal.SIGKILL)

    # -- tearing down ------------------------------------------------------------
    def close(self) -> None:
        if self.nodes and (self.base / "nodes").is_dir():
            with contextlib.suppress(Exception):
                self.ale("node", "stop", "--all", timeout=120, check=False)
        for e in self.engines:
            self._close_engine(e)
        self.engines.clear()
        shutil.rmtree(self.base, ignore_errors=True)

    def _close_engine(self, e: Engine) -> None:
        with contextlib.suppress(Exception):
            ids = _run("docker", "-H", e.sock, "ps", "-aq", check=False, timeout=30).stdout.split()
            if ids:
                _run("docker", "-H", e.sock, "rm", "-f", *ids, check=False, timeout=60)
        if e.proc is not None and e.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(e.proc.pid, signal.SIGTERM)
            try:
                e.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(e.proc.pid, signal.SIGKILL)
                e.proc.wait(timeout=10)
        # Whatever the engine left mounted below its folders (overlays, netns files).
        with contextlib.suppress(Exception):
            mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                      if line.split()[1].startswith(str(e.root))]
            for m in sorted(mounts, key=len, reverse=True):
                _run("umount", "-l", m, check=False)
        _run("ip", "link", "del", f"alc{self.tag}h{e.index}", check=False)
        _run("ip", "netns", "del", e.netns, check=False)
        shutil.rmtree(e.root, ignore_errors=True)
