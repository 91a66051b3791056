"""A cluster node: one Ray node, one Docker engine, one signing identity.

`ale node start` (``start_node``) makes a node folder (mode 0700) holding the
node's record (``node.json``) and its own Ed25519 signing key, removes what a
lost run left on the node's engine (ale's containers only), then starts Ray
with the node's sandbox capacity as the custom resource ``ale_sandbox`` and with
token authentication on. Ray's processes run in a process group of their own,
which is what ``stop_node`` ends: never any other Ray process on the machine.

The functions a Ray worker runs on the node (``execute_on_node``,
``janitor_on_node``, ``identify_node``) read the node folder from
``ALE_NODE_DIR``, which ``ray start`` passes on to its workers. A run executes the
whole sealed lifecycle here, against this node's engine, signs with this node's
key (the key never leaves the node), and comes back as a tar of its run folder
with the sha256 of every file, so the driver can prove it arrived byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import importlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import platformdirs

import ale
from ale.plan import RunPlan
from ale.record.signing import load_or_create_signing_key, public_key_pem, public_key_sha256
from ale.sandbox.base import LABEL_MANAGED, SandboxError, SandboxSpec
from ale.sandbox.docker import DockerProvider
from ale.sandbox.scratch import release_scratch

RESOURCE = "ale_sandbox"  # the Ray custom resource: a node's concurrent sandboxes
NODE_ENV = "ALE_NODE_DIR"
NODE_RECORD = "node.json"
NODE_KEY = "signing_key.pem"
LABEL_NODE = "ale.node"  # on every sandbox a node creates
RAY_MISSING = "Ray is not installed: install the optional extra with `pip install 'ale[ray]'`"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class NodeError(RuntimeError):
    """A node cannot be started, stopped or used; the message says why."""


class NodePreflight(RuntimeError):
    """A plan that could not begin on the node (the lifecycle's PreflightError),
    carried back with its ``retryable`` flag (an exception's pickle loses it)."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message, retryable)
        self.retryable = retryable

    def __str__(self) -> str:
        return str(self.args[0])


def require_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise NodeError(RAY_MISSING) from e
    return ray


def nodes_root() -> Path:
    """Where the node folders of this machine live (``ALE_NODE_ROOT`` overrides)."""
    return Path(os.environ.get("ALE_NODE_ROOT") or Path(platformdirs.user_state_dir("ale")) / "nodes")


def default_token_file() -> Path:
    """Ray's token file: ``RAY_AUTH_TOKEN_PATH``, else Ray's default ``~/.ray/auth_token``."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def ray_auth_env(token_file: Path) -> dict[str, str]:
    """The environment that turns Ray's token authentication on with ``token_file``."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}


def refresh_ray_auth() -> None:
    """Make an already imported Ray see the token settings now in the environment
    (Ray reads them into its config once, at import)."""
    with contextlib.suppress(Exception):
        raylet = importlib.import_module("ray._raylet")
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def ensure_token(path: Path, *, create: bool) -> Path:
    """The cluster's token file, owner-only. The head creates it when missing;
    another node must be given the head's (copied like an SSH key, never over Ray)."""
    if not path.exists():
        if not create:
            raise NodeError(
                f"no Ray authentication token at {path}: copy the head's token file here "
                "(or pass --token-file), mode 0600"
            )
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode())
        finally:
            os.close(fd)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise NodeError(f"the token file {path} is readable by others (mode {oct(mode)}): chmod 600 {path}")
    return path


# -- the node's identity and engine -------------------------------------------


class NodeProvider(DockerProvider):
    """The node's Docker provider: its engine record also names the node (host
    name, Ray node id, engine id, name and version, node key), so the evidence of
    every run says where it ran."""

    def __init__(self, base_url: str | None, node: dict[str, Any]):
        super().__init__(base_url=base_url)
        self.node = node

    def engine_record(self) -> dict[str, Any]:
        return {**super().engine_record(), "node": self.node}

    async def create(self, spec: SandboxSpec) -> Any:
        # Labelled with the node too: the node's janitor then removes what this
        # node left and nothing else, even on an engine another ale also uses.
        labels = {**spec.labels, LABEL_NODE: str(self.node.get("name", ""))}
        return await super().create(dataclasses.replace(spec, labels=labels))


def remove_node_containers(provider: DockerProvider, name: str) -> list[str]:
    """Remove the containers a node left on its engine (labels ale.managed=1 and
    ale.node=NAME); never any other container."""
    try:
        found = provider.client.containers.list(
            all=True, sparse=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_NODE}={name}"]})
        removed = []
        for c in found:
            with contextlib.suppress(Exception):
                provider.client.api.remove_container(c.id, force=True, v=True)
                removed.append((c.attrs.get("Names") or [c.id])[0].lstrip("/"))
        return removed
    except Exception as e:  # the SDK's errors, without importing the SDK here
        raise SandboxError(f"cannot remove node {name}'s containers: {e}") from e


def engine_identity(provider: DockerProvider) -> dict[str, Any]:
    """The engine's id, name and version (``docker info`` / ``docker version``)."""
    try:
        info = provider.client.info()
        version = provider.client.version()
    except Exception as e:  # the SDK's errors, without importing the SDK here
        raise SandboxError(f"the node's Docker engine does not answer: {e}") from e
    return {"engine_id": info.get("ID"), "engine_name": info.get("Name"), "engine_version": version.get("Version")}


def node_dir_from_env() -> Path:
    value = os.environ.get(NODE_ENV)
    if not value:
        raise NodeError(
            f"this Ray node was not started by `ale node start` ({NODE_ENV} is not set): "
            "it offers no ale sandbox"
        )
    return Path(value)


def read_record(node_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((node_dir / NODE_RECORD).read_text())
    except (OSError, ValueError) as e:
        raise NodeError(f"cannot read the node record {node_dir / NODE_RECORD}: {e}") from e
    return data


_PROVIDER: NodeProvider | None = None  # one per Ray worker process, like provider_runner's


def _node_provider() -> NodeProvider:
    global _PROVIDER
    if _PROVIDER is None:
        ray = require_ray()
        node_dir = node_dir_from_env()
        rec = read_record(node_dir)
        key = load_or_create_signing_key(node_dir / NODE_KEY)
        provider = NodeProvider(rec.get("docker_host"), {})
        provider.node = {
            "name": rec["name"],
            "hostname": socket.gethostname(),
            "ray_node_id": ray.get_runtime_context().get_node_id(),
            "public_key_sha256": public_key_sha256(key),
            **engine_identity(provider),
        }
        _PROVIDER = provider
    return _PROVIDER


def identify_node() -> dict[str, Any]:
    """What the driver registers for this node: identity and public key (only the
    public half ever leaves the node)."""
    provider = _node_provider()
    key = load_or_create_signing_key(node_dir_from_env() / NODE_KEY)
    return {**provider.node, "ale_version": ale.__version__, "public_key_pem": public_key_pem(key).decode()}


def janitor_on_node(experiment: str | None) -> list[str]:
    """Remove ale's containers on this node's engine (one experiment's, or all)."""
    return _node_provider().remove_managed(experiment=experiment)


# -- one run on the node -------------------------------------------------------


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every regular file below ``root``, by relative POSIX path."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h = hashlib.sha256()
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[p.relative_to(root).as_posix()] = h.hexdigest()
    return out


def pack_run_dir(run_dir: Path) -> bytes:
    """The run folder as an uncompressed tar (bytes and mtimes as written)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(run_dir, arcname=run_dir.name)
    return buf.getvalue()


def execute_on_node(plan_json: str) -> dict[str, Any]:
    """Run one attempt here; return its folder as tar bytes with every file's sha256.

    The plan is the driver's, except where the node writes (a private staging
    folder) and which key signs (the node's own).
    """
    from ale.runs.lifecycle import PreflightError, execute_run

    provider = _node_provider()
    node_dir = node_dir_from_env()
    plan = RunPlan.model_validate_json(plan_json)
    stage = node_dir / "stage" / f"{plan.run_id}.{uuid.uuid4().hex[:8]}"
    local = plan.model_copy(update={"runs_dir": str(stage / "runs"), "signing_key": str(node_dir / NODE_KEY)})
    try:
        try:
            asyncio.run(execute_run(local, provider=provider))
        except PreflightError as e:
            raise NodePreflight(str(e), e.retryable) from None
        run_dir = local.run_dir
        return {
            "run_id": plan.run_id,
            "node": provider.node,
            "files": file_digests(run_dir),
            "tar": pack_run_dir(run_dir),
        }
    finally:
        release_scratch(stage)


# -- starting and stopping nodes ---------------------------------------------


def _pgid_members(pgid: int) -> list[int]:
    """The live processes of a process group (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def node_alive(rec: dict[str, Any]) -> bool:
    pgid = rec.get("pgid")
    return isinstance(pgid, int) and bool(_pgid_members(pgid))


def list_nodes() -> list[dict[str, Any]]:
    root = nodes_root()
    out = []
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if (d / NODE_RECORD).is_file():
                with contextlib.suppress(NodeError):
                    rec = read_record(d)
                    rec["alive"] = node_alive(rec)
                    out.append(rec)
    return out


def start_node(
    *,
    head: bool,
    address: str | None = None,
    port: int = 6379,
    node_ip: str | None = None,
    docker_host: str | None = None,
    slots: int | None = None,
    name: str | None = None,
    token_file: Path | None = None,
    ray_temp_dir: Path | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Start one Ray node with its engine, capacity and signing identity; return its record.

    A head defaults to 0 slots (it schedules; workers run sandboxes) unless asked,
    a worker to 1. Its node IP defaults to 127.0.0.1 for a head (a cluster on this
    machine only; give a private address for more machines) and to Ray's choice
    for a worker.
    """
    require_ray()
    say = log or (lambda _m: None)
    if head == (address is not None):
        raise NodeError("give either --head or --address HOST:PORT")
    slots = (0 if head else 1) if slots is None else slots
    if slots < 0:
        raise NodeError(f"--slots must be >= 0, got {slots}")
    name = name or f"{socket.gethostname()}-{secrets.token_hex(3)}"
    if not _NAME_RE.match(name):
        raise NodeError(f"node name {name!r}: letters, digits, '_', '.', '-' (at most 63)")
    node_dir = nodes_root() / name
    if (node_dir / NODE_RECORD).is_file() and node_alive(read_record(node_dir)):
        raise NodeError(f"node {name!r} is already running (stop it with `ale node stop {name}`)")
    node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(node_dir, 0o700)
    key = load_or_create_signing_key(node_dir / NODE_KEY)
    token = ensure_token(token_file or default_token_file(), create=head)

    engine: dict[str, Any] = {}
    if slots > 0:
        provider = DockerProvider(base_url=docker_host)
        engine = engine_identity(provider)
        # The node's janitor: the containers this node left (a lost run's) belong
        # to no live run now; only those labelled with this node are touched.
        removed = remove_node_containers(provider, name)
        if removed:
            say(f"removed {len(removed)} container(s) a lost run left on the engine: {', '.join(removed)}")
    stale = node_dir / "stage"
    if stale.is_dir():
        release_scratch(stale)

    temp = ray_temp_dir or Path("/tmp") / f"ale-ray-{name}"
    cluster_address, pgid = _ray_start(head=head, address=address, port=port, node_ip=node_ip, slots=slots, temp=temp,
                                       env={**os.environ, **ray_auth_env(token), NODE_ENV: str(node_dir)},
                                       log_path=node_dir / "ray-start.log")
    rec = {
        "name": name,
        "head": head,
        "address": cluster_address,
        "pgid": pgid,
        "docker_host": docker_host,
        "slots": slots,
        "token_file": str(token),
        "ray_temp_dir": str(temp),
        "public_key_sha256": public_key_sha256(key),
        "engine": engine,
        "ale_version": ale.__version__,
        "started_at": time.time(),
    }
    tmp = node_dir / (NODE_RECORD + ".tmp")
    tmp.write_text(json.dumps(rec, indent=2))
    os.replace(tmp, node_dir / NODE_RECORD)
    return rec


def _ray_start(*, head: bool, address: str | None, port: int, node_ip: str | None, slots: int, temp: Path,
               env: dict[str, str], log_path: Path) -> tuple[str | None, int]:
    """``ray start`` for one node; returns the cluster's address and the process group
    Ray's daemons stay in. Raises ``NodeError`` (its log's tail) when it fails."""
    ray_bin = str(Path(sys.executable).with_name("ray"))
    cmd = [ray_bin if Path(ray_bin).exists() else "ray", "start", "--disable-usage-stats", "--temp-dir", str(temp),
           "--num-cpus", "0", "--resources", json.dumps({RESOURCE: slots} if slots else {})]
    if head:
        cmd += ["--head", "--port", str(port), "--node-ip-address", node_ip or "127.0.0.1",
                "--include-dashboard", "false", "--dashboard-host", "127.0.0.1"]
    else:
        assert address is not None
        cmd += ["--address", address]
        if node_ip:
            cmd += ["--node-ip-address", node_ip]
    with log_path.open("wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        rc = proc.wait(timeout=180)
    text = log_path.read_text(errors="replace")
    pgid = proc.pid  # the session (and group) Ray's daemons stay in
    if rc != 0:
        _kill_group(pgid)
        tail = "\n".join(text.splitlines()[-15:])
        raise NodeError(f"`ray start` failed (exit {rc}); its log is {log_path}:\n{tail}")
    if head:
        found = re.findall(r"--address='([^']+)'", text)
        cluster_address = found[-1] if found else f"{node_ip or '127.0.0.1'}:{port}"
    else:
        cluster_address = address
    return cluster_address, pgid


def _kill_group(pgid: int, grace_s: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _pgid_members(pgid):
        time.sleep(0.2)
    if _pgid_members(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _pgid_members(pgid):
            time.sleep(0.1)


def stop_nodes(names: list[str], *, grace_s: float = 10.0) -> list[dict[str, Any]]:
    """Stop nodes started here: their process groups only (all signalled at once),
    then ale's containers on each one's engine (a run cut short leaves them) and
    its staging folder."""
    recs = []
    for name in names:
        node_dir = nodes_root() / name
        if not (node_dir / NODE_RECORD).is_file():
            raise NodeError(f"no node named {name!r} was started on this machine (see `ale node status`)")
        recs.append(read_record(node_dir))
    groups = [r["pgid"] for r in recs if isinstance(r.get("pgid"), int) and r["pgid"] > 1]
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_pgid_members(g) for g in groups):
        time.sleep(0.2)
    for pgid in groups:
        _kill_group(pgid, 0)
    return [_after_stop(nodes_root() / r["name"], r) for r in recs]


def _after_stop(node_dir: Path, rec: dict[str, Any]) -> dict[str, Any]:
    removed: list[str] = []
    if rec.get("slots"):
        with contextlib.suppress(SandboxError):
            removed = remove_node_containers(DockerProvider(base_url=rec.get("docker_host")), rec["name"])
    if (node_dir / "stage").is_dir():
        release_scratch(node_dir / "stage")
    temp = rec.get("ray_temp_dir")
    if temp and Path(temp).name.startswith("ale-ray-"):
        shutil.rmtree(temp, ignore_errors=True)
    rec["alive"] = False
    rec["containers_removed"] = removed
    return rec
