"""Run an experiment's attempts on a Ray cluster; the driver keeps the books.

``environment.cluster`` / ``ale exp run --cluster`` / ``ALE_CLUSTER`` take
``local`` (one engine, this process: the default) or ``ray:HOST:PORT`` (a Ray
cluster's GCS address). On a cluster:

- **Placement** is the driver's: each attempt goes to the live node with the most
  free sandbox slots (the node's ``ale_sandbox`` resource, counted against the
  attempts this driver has there), pinned with a hard node affinity. So the
  driver always knows which node holds an attempt.
- **Attempts stay ours.** Ray's task retries are off (``max_retries=0``). An
  attempt whose node leaves the cluster is declared lost at once: the runner
  raises ``AttemptLost`` (retryable), which the orchestrator records as that
  attempt's ``infrastructure_error`` and retries as a new attempt with a new run
  folder. Should the lost attempt's result still arrive, it is kept under
  ``<output>/superseded/`` and never enters ``runs/``: every unit ends once.
- **Run folders come home** as tar bytes in the task's return value with the
  sha256 of every file, computed on the node; the driver unpacks into
  ``runs/.incoming/``, checks every hash and the file set, checks the signature
  key is the node's registered one, and renames the folder into ``runs/``. Only
  the driver writes the index.
- **Trust**: each node signs with its own key, made on the node by
  ``ale node start``; only public keys cross the cluster. The driver records them
  in ``<output>/nodes.json`` (``ale verify --trusted-keys`` reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ale import layout
from ale.plan import RunPlan
from ale.record.signing import load_public_key, public_key_sha256
from ale.result import RunResult
from ale.runs import node as nodes
from ale.runs.store import read_result, runs_root
from ale.sandbox.base import SandboxError

CLUSTER_ENV = "ALE_CLUSTER"
NODES_RECORD = layout.NODES
SUPERSEDED_DIR = layout.SUPERSEDED_DIR
INCOMING_DIR = layout.INCOMING_DIR


class ClusterError(SandboxError):
    """The cluster is unusable (no Ray, unreachable, no sandbox capacity)."""


class AttemptLost(RuntimeError):
    """An attempt whose node left the cluster: a harness-side infrastructure error."""

    retryable = True


class DeliveryError(RuntimeError):
    """A run folder that did not arrive intact (hashes, files, signer)."""

    retryable = True


@dataclass(frozen=True)
class ClusterSpec:
    kind: str  # "local" | "ray"
    address: str | None = None

    def __str__(self) -> str:
        return "local" if self.kind == "local" else f"ray:{self.address}"


def parse_cluster(value: str | None) -> ClusterSpec:
    """``local`` (or empty) or ``ray:HOST:PORT``; ValueError otherwise."""
    text = (value or "local").strip()
    if text == "local":
        return ClusterSpec("local")
    if text.startswith("ray:"):
        addr = text[4:]
        host, sep, port = addr.rpartition(":")
        if sep and host and port.isdigit() and 0 < int(port) < 65536:
            return ClusterSpec("ray", addr)
    raise ValueError(f"cluster {value!r}: use 'local' or 'ray:HOST:PORT' (a Ray cluster's GCS address)")


def resolve_cluster(option: str | None, from_file: str | None) -> ClusterSpec:
    """The command line's ``--cluster``, else ``ALE_CLUSTER``, else the file's, else local."""
    return parse_cluster(option or os.environ.get(CLUSTER_ENV) or from_file or "local")


# -- bringing a run folder home -----------------------------------------------


def _safe_members(tar: tarfile.TarFile, run_id: str) -> None:
    for m in tar.getmembers():
        parts = Path(m.name).parts
        if not parts or parts[0] != run_id or ".." in parts or Path(m.name).is_absolute():
            raise DeliveryError(f"the run folder's archive holds an unexpected path {m.name!r}")
        if not (m.isfile() or m.isdir()):
            raise DeliveryError(f"the run folder's archive holds a {m.type!r} entry {m.name!r}")


def deliver(payload: dict[str, Any], plan: RunPlan, output: Path, *, expected_key: str | None,
            superseded: bool = False) -> tuple[Path, RunResult | None]:
    """Unpack a node's run folder, prove it intact, and move it into ``runs/``
    (or ``superseded/`` when the attempt was declared lost or its folder exists)."""
    run_id = plan.run_id
    if payload.get("run_id") != run_id:
        raise DeliveryError(f"a node returned run {payload.get('run_id')!r} for {run_id!r}")
    root = runs_root(output)
    incoming = root / INCOMING_DIR / f"{run_id}.{uuid.uuid4().hex[:8]}"
    incoming.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(payload["tar"]), mode="r:") as tar:
            _safe_members(tar, run_id)
            tar.extractall(incoming, filter="data")
        got = incoming / run_id
        digests = nodes.file_digests(got)
        if digests != payload.get("files"):
            sent = payload.get("files") or {}
            diff = sorted(set(digests) ^ set(sent)) or sorted(k for k in digests if digests[k] != sent.get(k))
            raise DeliveryError(f"run folder {run_id} did not arrive intact: {diff[:5]}")
        pem = got / layout.PUBLIC_KEY
        if expected_key is not None:
            signer = public_key_sha256(load_public_key(pem)) if pem.is_file() else None
            if signer != expected_key:
                raise DeliveryError(
                    f"run folder {run_id} is signed by key {signer}, not by its node's registered key {expected_key}"
                )
        final = root / run_id
        if superseded or final.exists():
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            dest = output / SUPERSEDED_DIR / f"{run_id}.{stamp}.{uuid.uuid4().hex[:6]}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(got, dest)
            return dest, None
        os.replace(got, final)
        return final, read_result(final)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


# -- the driver ---------------------------------------------------------------


@dataclass
class NodeView:
    node_id: str
    hostname: str
    capacity: int
    alive: bool = True
    in_flight: int = 0
    suspect_until: float = 0.0  # an attempt there just died with its worker: wait for the GCS's word
    identity: dict[str, Any] = field(default_factory=dict)


class RayCluster:
    """The driver's side of a Ray cluster for one experiment: a Runner and a Janitor."""

    def __init__(self, address: str, output: Path, *, poll_s: float = 1.0, suspect_s: float = 60.0,
                 token_file: Path | None = None):
        token = token_file or nodes.default_token_file()
        if not token.is_file():
            raise ClusterError(
                f"no Ray authentication token at {token}: copy the head's token file there "
                "or set RAY_AUTH_TOKEN_PATH"
            )
        os.environ.update(nodes.ray_auth_env(token))
        ray = _import_ray()
        nodes.refresh_ray_auth()
        self.ray = ray
        self.address = address
        self.output = output
        self.poll_s = poll_s
        self.suspect_s = suspect_s
        try:
            ray.init(address=address, namespace="ale", log_to_driver=False, logging_level="WARNING",
                     include_dashboard=False, configure_logging=False)
        except Exception as e:
            raise ClusterError(f"cannot join the Ray cluster at {address}: {type(e).__name__}: {e}") from e
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._affinity = NodeAffinitySchedulingStrategy
        opts = {"num_cpus": 0, "max_retries": 0, "retry_exceptions": False}
        self._execute = ray.remote(**opts)(nodes.execute_on_node)
        self._janitor = ray.remote(**opts)(nodes.janitor_on_node)
        self._identify = ray.remote(**opts)(nodes.identify_node)
        self.nodes: dict[str, NodeView] = {}
        self.lost_refs: dict[str, Any] = {}
        self.superseded: list[Path] = []
        self._changed: asyncio.Condition | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._late: set[asyncio.Task[None]] = set()
        self._where: dict[str, str] = {}  # run id -> node id
        self.refresh()
        if not any(n.alive for n in self.nodes.values()):
            raise ClusterError(
                f"the Ray cluster at {address} offers no sandbox capacity: start a node with "
                f"`ale node start --address {address} --docker-host URL --slots N`"
            )

    # -- the node table --------------------------------------------------------
    def refresh(self) -> None:
        """Read which nodes are alive with sandbox capacity; register new ones."""
        seen = set()
        for n in self.ray.nodes():
            cap = int((n.get("Resources") or {}).get(nodes.RESOURCE, 0))
            nid = n["NodeID"]
            if cap <= 0 and nid not in self.nodes:
                continue
            seen.add(nid)
            view = self.nodes.get(nid)
            if view is None:
                view = self.nodes[nid] = NodeView(nid, n.get("NodeManagerHostname", "?"), cap, bool(n.get("Alive")))
                if view.alive:
                    self._register(view)
            else:
                view.alive = bool(n.get("Alive")) and view.alive
                if cap:
                    view.capacity = cap
        for nid, view in self.nodes.items():
            if nid not in seen:
                view.alive = False

    def _register(self, view: NodeView) -> None:
        try:
            ident = self.ray.get(self._identify.options(
                scheduling_strategy=self._affinity(view.node_id, soft=False)).remote(), timeout=120)
        except Exception as e:
            view.alive = False
            view.identity = {"error": f"{type(e).__name__}: {e}"}
            return
        view.identity = ident
        self._write_nodes_record()

    def _write_nodes_record(self) -> None:
        path = self.output / NODES_RECORD
        known: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            known = json.loads(path.read_text()).get("nodes", {})
        for v in self.nodes.values():
            if v.identity and "error" not in v.identity:
                known[v.node_id] = {**v.identity, "slots": v.capacity}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cluster": f"ray:{self.address}", "nodes": known}, indent=2, sort_keys=True))
        os.replace(tmp, path)

    # -- running ---------------------------------------------------------------
    async def _watch(self) -> None:
        assert self._changed is not None
        while True:
            await asyncio.sleep(self.poll_s)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.refresh)
            async with self._changed:
                self._changed.notify_all()

    def _pick(self) -> NodeView | None:
        now = time.monotonic()
        free = [n for n in self.nodes.values()
                if n.alive and n.identity and n.in_flight < n.capacity and n.suspect_until <= now]
        return max(free, key=lambda n: (n.capacity - n.in_flight, n.node_id)) if free else None

    async def run(self, plan: RunPlan, cancel: asyncio.Event) -> RunResult:
        """The Runner: one attempt on one node, its folder brought home."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch())
        async with self._changed:
            while (view := self._pick()) is None:
                await self._changed.wait()
            view.in_flight += 1
        self._where[plan.run_id] = view.node_id
        ref = self._execute.options(scheduling_strategy=self._affinity(view.node_id, soft=False)).remote(
            plan.model_dump_json())
        try:
            payload = await self._await_on(ref, view)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref)
            raise
        finally:
            view.in_flight -= 1
            if self._changed is not None:
                async with self._changed:
                    self._changed.notify_all()
        if payload is None:
            self.lost_refs[plan.run_id] = ref
            late = asyncio.create_task(self._late_result(ref, plan, view))
            self._late.add(late)
            late.add_done_callback(self._late.discard)
            raise AttemptLost(
                f"attempt lost with its node {view.hostname} (Ray node {view.node_id[:12]}…, "
                f"{view.identity.get('name', '?')}): it left the cluster"
            )
        _, result = await asyncio.to_thread(
            deliver, payload, plan, self.output, expected_key=view.identity.get("public_key_sha256"))
        if result is None:
            raise DeliveryError(f"run folder {plan.run_id} arrived without a readable result.json")
        return result

    async def _await_on(self, ref: Any, view: NodeView) -> dict[str, Any] | None:
        """The task's payload, or None once its node is gone (the attempt is lost)."""
        fut = asyncio.ensure_future(self._get(ref))
        assert self._changed is not None
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=self.poll_s)
                if done:
                    break
                if not view.alive:
                    return None
            try:
                return fut.result()
            except Exception as e:
                if not view.alive or _node_gone(self.ray, e):
                    # Ray often reports the dead worker before the GCS declares the
                    # node dead: place nothing there until it has had time to.
                    view.suspect_until = time.monotonic() + self.suspect_s
                    return None
                raise _unwrap(self.ray, e) from None
        finally:
            if not fut.done():
                fut.cancel()

    async def _get(self, ref: Any) -> dict[str, Any]:
        payload: dict[str, Any] = await ref
        return payload

    async def _late_result(self, ref: Any, plan: RunPlan, view: NodeView) -> None:
        """A lost attempt's result that still arrives: kept aside, never counted."""
        with contextlib.suppress(Exception):
            payload = await ref
            dest, _ = await asyncio.to_thread(
                deliver, payload, plan, self.output, expected_key=view.identity.get("public_key_sha256"),
                superseded=True)
            self.superseded.append(dest)

    # -- cleaning --------------------------------------------------------------
    def janitor(self, experiment: str) -> list[str]:
        """Remove the experiment's containers on every live sandbox node."""
        with contextlib.suppress(Exception):
            self.refresh()
        live = [v for v in self.nodes.values() if v.alive]
        refs = {v.hostname + "/" + v.node_id[:8]: self._janitor.options(
            scheduling_strategy=self._affinity(v.node_id, soft=False)).remote(experiment) for v in live}
        removed: list[str] = []
        for where, ref in refs.items():
            with contextlib.suppress(Exception):
                removed += [f"{where}:{name}" for name in self.ray.get(ref, timeout=60)]
        return removed

    def close(self) -> None:
        for t in [self._watcher, *self._late]:
            if t is not None:
                t.cancel()
        with contextlib.suppress(Exception):
            self.ray.shutdown()


def _import_ray() -> Any:
    try:
        return nodes.require_ray()
    except nodes.NodeError as e:
        raise ClusterError(str(e)) from e


def _node_gone(ray: Any, e: BaseException) -> bool:
    ex = ray.exceptions
    kinds = tuple(k for k in (getattr(ex, n, None) for n in (
        "NodeDiedError", "WorkerCrashedError", "LocalRayletDiedError", "ObjectLostError",
        "OwnerDiedError", "TaskUnschedulableError", "RaySystemError")) if isinstance(k, type))
    return isinstance(e, kinds)


def _unwrap(ray: Any, e: BaseException) -> BaseException:
    """The node's own exception (a preflight failure keeps its ``retryable``)."""
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return e


def connect(spec: ClusterSpec, output: Path) -> RayCluster:
    if spec.kind != "ray" or spec.address is None:
        raise ClusterError(f"not a Ray cluster: {spec}")
    return RayCluster(spec.address, output)
