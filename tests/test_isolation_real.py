"""Real containers, each built wrong in exactly one way, and the good one.

Every variant starts from `container_create_kwargs` with a good policy and
changes one thing. The inspect checks must fail under exactly the expected ids
and pass everything else; where the change alters the running state, the probes
run in the started container and must fail under exactly the expected probe ids.
The bridge-network container is only created, never started: no packet leaves.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ale.isolation.checks import Check, check_inspect, diff_captures, failures
from ale.isolation.probes import run_probes, workspace_empty_checks, workspace_listing
from ale.isolation.verify_container import render_report, verify_container
from ale.sandbox.base import Mount
from ale.sandbox.docker import DockerProvider, DockerSandbox, container_create_kwargs
from ale.sandbox.policy import GIB, IsolationPolicy
from tests.conftest import require, require_module

docker = require_module("docker")
from docker.types import Mount as DockerMount  # noqa: E402

pytestmark = pytest.mark.docker

TOOLS = os.environ.get("ALE_IMAGE", "ale-tools:latest")
VOLUME_IMAGE = "ale-test-volume:latest"
TEST_LABEL = "ale.test"
TEST_VALUE = f"isolation-real-{os.getpid()}"
POLICY = IsolationPolicy(memory_bytes=1 * GIB, cpus=1, pids_limit=128)


def failing(checks: list[Check]) -> set[str]:
    return {c.id for c in failures(checks)}


def violated(violations: list[str]) -> set[str]:
    """The check ids of `violation_line`s ("[group] id: expected ..., observed ...")."""
    return {v.split("] ", 1)[1].split(":", 1)[0] for v in violations}


@dataclass
class Built:
    name: str
    before: dict
    image: dict
    after: dict | None = None
    running: dict | None = None
    probe_raw: str | None = None
    probe_checks: list[Check] = field(default_factory=list)
    workspace: str = ""


class Env:
    def __init__(self, client: Any, base: Path):
        self.client = client
        self.base = base
        self.input = base / "input"
        self.workspace = base / "workspace"
        self.extra = base / "extra"
        self.full_ws = base / "workspace-full"
        for d in (self.input, self.workspace, self.extra, self.full_ws):
            d.mkdir()
            # Owned by the candidate uid: only the mount mode keeps the input read-only.
            os.chown(d, POLICY.uid, POLICY.gid)
        (self.input / "data.txt").write_text("public input\n")
        (self.full_ws / "leftover.txt").write_text("from an earlier run\n")
        self.built: dict[str, Built] = {}
        self.containers: list[Any] = []

    def planned(self, workspace: Path | None = None) -> list[Mount]:
        return [
            Mount(str(self.input), "/input", True),
            Mount(str(workspace or self.workspace), "/workspace", False),
        ]

    def build(
        self,
        name: str,
        change: Callable[[dict], None] | None = None,
        *,
        start: bool,
        workspace: Path | None = None,
    ) -> Built:
        if name in self.built:
            return self.built[name]
        kwargs = container_create_kwargs(
            name=f"ale-isoreal-{name}-{os.getpid()}",
            image=TOOLS,
            policy=POLICY,
            mounts=self.planned(workspace),
            labels={"ale.managed": "1", TEST_LABEL: TEST_VALUE},
            workdir="/workspace",
        )
        if change is not None:
            change(kwargs)
        c = self.client.containers.create(**kwargs)
        self.containers.append(c)
        api = self.client.api
        before = api.inspect_container(c.id)
        b = Built(name, before, api.inspect_image(before["Image"]),
                  workspace=str(workspace or self.workspace))
        if start:
            c.start()
            b.running = api.inspect_container(c.id)
            sandbox = DockerSandbox(self.client, c, POLICY)
            b.probe_raw, b.probe_checks = asyncio.run(
                run_probes(sandbox, POLICY, input_dir="/input", workspace_dir="/workspace"))
            c.kill()
            c.wait(timeout=60)
            b.after = api.inspect_container(c.id)
        self.built[name] = b
        return b

    def inspect_checks(self, b: Built, phase: str = "before") -> list[Check]:
        doc = {"before": b.before, "running": b.running, "after": b.after}[phase]
        assert doc is not None
        planned = self.planned(Path(b.workspace))
        inodes = {m.source: os.stat(m.source).st_ino for m in planned}
        return check_inspect(doc, POLICY, planned, phase=phase,  # type: ignore[arg-type]
                             image_inspect=b.image, mount_inodes=inodes)


@pytest.fixture(scope="module")
def env(docker_client: Any) -> Iterator[Env]:
    client = docker_client
    base = Path(tempfile.mkdtemp(prefix="ale-isoreal-"))
    e = Env(client, base)
    try:
        yield e
    finally:
        for c in e.containers:
            with suppress(docker.errors.NotFound):
                c.remove(force=True, v=True)
        for c in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={TEST_VALUE}"}):
            with suppress(docker.errors.NotFound):
                c.remove(force=True, v=True)
        with suppress(docker.errors.ImageNotFound):
            client.images.remove(VOLUME_IMAGE, force=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def good(env: Env) -> Built:
    return env.build("good", start=True)


# -- the good container ------------------------------------------------------------
def test_good_container_passes_everything(env: Env, good: Built) -> None:
    assert failing(env.inspect_checks(good, "before")) == set()
    assert failing(env.inspect_checks(good, "running")) == set()
    assert failing(env.inspect_checks(good, "after")) == set()
    assert failing(diff_captures(good.before, good.after or {})) == set()
    assert failing(good.probe_checks) == set(), good.probe_raw
    assert {c.id for c in good.probe_checks} >= {
        "probe.exec", "probe.uid", "probe.cap_eff_zero", "probe.interfaces_lo_only",
        "probe.no_routes", "probe.writable_mounts", "probe.write_input_fails"}
    assert failing(workspace_empty_checks(workspace_listing(env.workspace))) == set()


def test_verify_container_on_created_and_running(env: Env, tmp_path: Path) -> None:
    kwargs = container_create_kwargs(
        name=f"ale-isoreal-verify-{os.getpid()}", image=TOOLS, policy=POLICY,
        mounts=env.planned(), labels={"ale.managed": "1", TEST_LABEL: TEST_VALUE},
        workdir="/workspace")
    c = env.client.containers.create(**kwargs)
    env.containers.append(c)
    saved = tmp_path / "inspect.json"
    rep = verify_container(DockerProvider(env.client), c.name, input_dir=str(env.input),
                           workspace_dir=str(env.workspace), policy=POLICY, save_inspect=saved)
    assert rep.ok, render_report(rep)
    assert rep.phase == "before" and saved.exists() and rep.image and rep.probe_output is None
    c.start()
    rep = verify_container(DockerProvider(env.client), c.id, input_dir=str(env.input),
                           workspace_dir=str(env.workspace), policy=POLICY, save_inspect=None)
    assert rep.ok, render_report(rep)
    assert rep.phase == "running" and "=== ale-probe:end ===" in (rep.probe_output or "")
    # The same container judged against another workspace folder is rejected.
    rep = verify_container(DockerProvider(env.client), c.id, input_dir=str(env.input),
                           workspace_dir=str(env.extra), policy=POLICY, save_inspect=None)
    assert not rep.ok
    assert violated(rep.violations) == {"mounts.sources"}
    assert "NOT SEALED" in render_report(rep)
    c.kill()
    c.wait(timeout=60)
    rep = verify_container(DockerProvider(env.client), c.id, input_dir=str(env.input),
                           workspace_dir=str(env.workspace), policy=POLICY, save_inspect=None)
    assert rep.ok and rep.phase == "after", render_report(rep)
    missing = verify_container(DockerProvider(env.client), "ale-isoreal-no-such-container", input_dir=str(env.input),
                               workspace_dir=str(env.workspace), policy=POLICY, save_inspect=None)
    assert not missing.ok and missing.checks[0]["ok"] is None


# -- one wrong thing each ------------------------------------------------------------
def set_kw(**changes: Any) -> Callable[[dict], None]:
    def f(kw: dict) -> None:
        kw.update(changes)
    return f


def add_mount(source: str, target: str, read_only: bool) -> Callable[[dict], None]:
    def f(kw: dict) -> None:
        kw["mounts"] = [*kw["mounts"], DockerMount(target=target, source=source, type="bind",
                                                   read_only=read_only, propagation="rprivate")]
    return f


def input_rw(kw: dict) -> None:
    kw["mounts"] = [DockerMount(target=m["Target"], source=m["Source"], type="bind",
                                read_only=False, propagation="rprivate") for m in kw["mounts"]]


def volume_image(env: Env) -> str:
    try:
        env.client.images.get(VOLUME_IMAGE)
    except docker.errors.ImageNotFound:
        dockerfile = f"FROM {TOOLS}\nVOLUME /data\n".encode()
        env.client.images.build(fileobj=io.BytesIO(dockerfile), tag=VOLUME_IMAGE, rm=True,
                                pull=False, labels={TEST_LABEL: TEST_VALUE})
    return VOLUME_IMAGE


# name, change, started?, failing inspect ids, failing probe ids (started only)
CASES: list[tuple[str, Any, bool, set[str], set[str]]] = [
    ("extra-bind", lambda e: add_mount(str(e.extra), "/extra", False), True,
     {"mounts.exactly_two"}, {"probe.writable_mounts"}),
    ("network-bridge", lambda e: set_kw(network_mode="bridge"), False,
     {"net.mode_none", "net.networks_none"}, set()),
    ("no-cap-drop", lambda e: set_kw(cap_drop=None), True,
     {"caps.drop_all"}, {"probe.cap_bnd_zero"}),
    ("cap-add-net-raw", lambda e: set_kw(cap_add=["NET_RAW"]), True,
     {"caps.add_empty"}, {"probe.cap_bnd_zero"}),
    ("no-read-only", lambda e: set_kw(read_only=False), True,
     {"fs.readonly_rootfs"}, {"probe.writable_mounts", "probe.write_root_fails"}),
    ("no-nnp", lambda e: set_kw(security_opt=[]), True,
     {"sec.no_new_privileges"}, {"probe.no_new_privs"}),
    # The engine itself adds `label=disable` and drops the masked paths when a
    # container is privileged or shares a host namespace: both are recorded state.
    ("privileged", lambda e: set_kw(privileged=True), True,
     {"priv.not_privileged", "sec.masked_paths", "sec.no_unconfined"},
     {"probe.cap_bnd_zero", "probe.seccomp", "probe.masked_paths",
      "probe.readonly_kernel_paths"}),
    # With the host's PID namespace, /proc/1 is the host's init: what it shows
    # (root, its capabilities) depends on the machine, so only these are exact.
    ("pid-host", lambda e: set_kw(pid_mode="host"), True, {"ns.pid", "sec.no_unconfined"},
     {"probe.namespaces_private", "probe.uid", "probe.process_owners"}),  # the host's processes show
    # The host's IPC namespace takes no namespaced SysV sysctls (runc refuses them there):
    # such a container also lacks the policy's kernel.shm_* settings.
    ("ipc-host", lambda e: set_kw(ipc_mode="host", sysctls=None), True, {"ns.ipc", "sec.no_unconfined", "dev.sysctls"},
     {"probe.namespaces_private"}),
    ("cgroupns-host", lambda e: set_kw(cgroupns="host"), True,
     {"ns.cgroupns"}, {"probe.cgroupns_private", "probe.namespaces_private"}),
    ("swap-unlimited", lambda e: set_kw(memswap_limit=-1), True,
     {"mem.swap_eq_mem"}, {"probe.cgroup_memory"}),
    ("no-pids-limit", lambda e: set_kw(pids_limit=None), True,
     {"pids.limit"}, {"probe.cgroup_pids"}),
    ("image-volume", lambda e: set_kw(image=volume_image(e)), True,
     {"mounts.exactly_two", "mounts.only_binds", "image.no_volumes"}, {"probe.writable_mounts"}),
    ("docker-socket", lambda e: add_mount("/var/run/docker.sock", "/var/run/docker.sock", True),
     False, {"mounts.exactly_two", "mounts.no_docker_socket"}, set()),
    ("root-user", lambda e: set_kw(user="0:0"), True, {"id.user"}, {"probe.uid", "probe.process_owners"}),
    ("input-rw", lambda e: input_rw, True,
     {"mounts.input_ro"}, {"probe.writable_mounts", "probe.write_input_fails"}),
    ("secret-env", lambda e: set_kw(environment={"OPENAI_API_KEY": "sk-test-not-a-real-key"}),
     False, {"env.allowlisted"}, set()),
]


@pytest.mark.parametrize("name,change,start,want_inspect,want_probe", CASES,
                         ids=[c[0] for c in CASES])
def test_one_wrong_thing(env: Env, good: Built, name: str, change: Any, start: bool,
                         want_inspect: set[str], want_probe: set[str]) -> None:
    if name == "docker-socket":
        require(os.path.exists("/var/run/docker.sock"), "the engine here has no /var/run/docker.sock")
    b = env.build(name, change(env), start=start)
    assert failing(env.inspect_checks(b, "before")) == want_inspect
    if start and name == "pid-host":
        host_init_dependent = {"probe.cap_eff_zero", "probe.cap_bnd_zero", "probe.no_new_privs",
                               "probe.seccomp"}
        assert want_probe <= failing(b.probe_checks) <= want_probe | host_init_dependent
    elif start:
        assert failing(b.probe_checks) == want_probe, b.probe_raw
    if start:
        # The after-capture shows the same wrong state, and nothing drifted.
        assert failing(env.inspect_checks(b, "after")) == want_inspect
        assert failing(diff_captures(b.before, b.after or {})) == set()


def test_workspace_not_empty_at_start(env: Env) -> None:
    b = env.build("full-workspace", None, start=False, workspace=env.full_ws)
    assert failing(env.inspect_checks(b, "before")) == set()
    checks = workspace_empty_checks(workspace_listing(env.full_ws))
    assert failing(checks) == {"ws.empty_at_start"}
    rep = verify_container(DockerProvider(env.client), b.before["Id"], input_dir=str(env.input),
                           workspace_dir=str(env.full_ws), policy=POLICY, save_inspect=None)
    assert violated(rep.violations) == {"ws.empty_at_start"}


def test_secret_value_stays_out_of_checks(env: Env) -> None:
    b = env.build("secret-env", set_kw(environment={"OPENAI_API_KEY": "sk-test-not-a-real-key"}),
                  start=False)
    text = repr([c.to_dict() for c in env.inspect_checks(b)])
    assert "OPENAI_API_KEY" in text and "sk-test-not-a-real-key" not in text
