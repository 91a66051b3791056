"""The gVisor tier: the policy names the runtime, the engine's runtimes are checked,
and the seal rules read each runtime's own state instead of one as the other.

The probe outputs in tests/fixtures/gvisor/ are real: the probe script run by
`run_probes` in a sandbox of the tools image under runc and under runsc (Debian's
gVisor 0.0~20221219, ptrace platform, registered with `--network=none
--oci-seccomp`), on this repository's CI machine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ale.isolation.registry import failures
from ale.isolation.rules import judge, rule_for
from ale.sandbox.base import Mount, RuntimeMissing, SandboxSpec
from ale.sandbox.policy import MIB, IsolationPolicy
from ale.sandbox.runtimes import (
    RUNSC_PIDS_LIMIT,
    install_hint,
    missing_runtime_message,
)
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "gvisor"
_INSPECT = json.loads((FIXTURES / "inspect-runsc.json").read_text())
MOUNTS = tuple(Mount(m["Source"], m["Destination"], not m["RW"]) for m in sorted(_INSPECT["Mounts"], key=lambda m: m["RW"]))
# The policy the fixtures ran under (memory 512 MiB, on a 2-CPU machine).
BASE = IsolationPolicy.from_record({**IsolationPolicy(memory_bytes=512 * MIB).model_dump(), "cpus": 2.0})


def _policy(runtime: str) -> IsolationPolicy:
    return IsolationPolicy.from_record({**BASE.model_dump(), "runtime": runtime,
                                        "pids_limit": RUNSC_PIDS_LIMIT if runtime == "runsc" else 256})


def _probes(name: str) -> str:
    return (FIXTURES / f"probes-{name}.txt").read_text()


def _bad(checks) -> dict[str, str]:
    return {c.id: c.detail for c in failures(checks)}


# -- the policy and the engine --------------------------------------------------------
def test_policy_names_the_runtime_and_runsc_raises_the_default_pids_limit():
    p = IsolationPolicy()
    assert p.runtime == "runc" and p.pids_limit == 256
    g = p.with_runtime("runsc")
    assert (g.runtime, g.pids_limit) == ("runsc", RUNSC_PIDS_LIMIT)
    assert g.with_runtime("runc").pids_limit == 256
    assert IsolationPolicy(runtime="runsc").pids_limit == RUNSC_PIDS_LIMIT
    assert IsolationPolicy(runtime="runsc", pids_limit=100).pids_limit == 100  # stated: kept
    assert IsolationPolicy(pids_limit=100).with_runtime("runsc").pids_limit == 100
    assert p.with_runtime(None) is p


def test_unknown_runtime_refused_but_a_stored_one_is_read_as_it_ran():
    with pytest.raises(ValueError, match="unknown runtime 'kata'"):
        IsolationPolicy(runtime="kata")
    with pytest.raises(ValueError, match="unknown runtime"):
        IsolationPolicy().with_runtime("kata")
    assert IsolationPolicy.from_record({"runtime": "kata"}).runtime == "kata"


def test_experiment_environment_runtime_feeds_the_policy(tmp_path):
    from ale.runs.experiment import EnvironmentSpec, ExperimentError, load_experiment

    assert EnvironmentSpec(runtime="runsc").runtime == "runsc"
    with pytest.raises(ValueError, match="unknown runtime"):
        EnvironmentSpec(runtime="kata")
    task = REPO / "examples" / "tasks" / "files" / "word_count"
    f = tmp_path / "exp.yaml"
    f.write_text(f"name: g\ntasks: [{task}]\nagents: [{{name: nop}}]\n"
                 "environment: {runtime: runsc, policy: {memory_bytes: 1073741824}}\n")
    try:
        exp = load_experiment(f)
    except ExperimentError as e:  # pragma: no cover - the experiment format moved on
        pytest.fail(f"cannot load a minimal experiment: {e}")
    pol = exp.isolation_policy()
    assert (pol.runtime, pol.pids_limit, pol.memory_bytes) == ("runsc", RUNSC_PIDS_LIMIT, 1024**3)


class _Engine:
    """A stand-in Docker client: `docker info` with these runtimes."""

    def __init__(self, runtimes: list[str]):
        self.runtimes = runtimes

    def info(self) -> dict:
        return {"Runtimes": {r: {"path": r} for r in self.runtimes}, "DefaultRuntime": "runc"}

    def version(self) -> dict:
        return {"Version": "20.10"}


def test_a_missing_runtime_is_refused_with_the_commands_that_add_it():
    from ale.sandbox.docker import DockerProvider

    provider = DockerProvider(_Engine(["runc"]))
    assert provider.runtimes() == ["runc"]
    assert provider.engine_record()["runtimes"] == ["runc"]
    with pytest.raises(RuntimeMissing) as e:
        provider.require_runtime("runsc")
    msg = str(e.value)
    assert "apt-get install runsc" in msg and '"runtimes"' in msg and "--oci-seccomp" in msg and "kill -HUP" in msg
    spec = SandboxSpec(name="x", image="ale-tools:latest", policy=IsolationPolicy().with_runtime("runsc"),
                       mounts=MOUNTS, workdir="/workspace", labels={}, environment={})
    with pytest.raises(RuntimeMissing):
        asyncio.run(provider.create(spec))  # refused before any container is made
    DockerProvider(_Engine(["runc", "runsc"])).require_runtime("runsc")
    assert "runc" in missing_runtime_message("runsc", ["runc"]) and "setup" in install_hint("runsc")


def test_cli_refuses_an_unknown_runtime():
    from typer.testing import CliRunner

    from ale.cli.main import app

    task = REPO / "examples" / "tasks" / "files" / "word_count"
    r = CliRunner().invoke(app, ["run", str(task), "--agent", "nop", "--runtime", "kata"])
    assert r.exit_code == 2 and "unknown runtime 'kata'" in r.output, r.output


# -- the rules read each runtime's own state ------------------------------------------
def test_gvisor_probes_pass_under_the_runsc_policy():
    checks = judge("before", policy=_policy("runsc"), mounts=MOUNTS, probes=_probes("runsc"))
    assert _bad(checks) == {}
    by_id = {c.id: c for c in checks}
    assert by_id["probe.no_new_privs"].observed == {"probe": "1", "init": "not reported by gVisor"}
    assert by_id["probe.kernel"].observed["kernel"] == "gVisor's"
    assert by_id["probe.seccomp"].observed == {"probe": "0", "init": "2"}
    assert "pids.max" in by_id["probe.cgroup_pids"].observed or by_id["probe.cgroup_pids"].observed == str(RUNSC_PIDS_LIMIT)


def test_gvisor_probes_are_not_read_as_runc():
    """A sandbox under gVisor judged by the runc policy: what gVisor reports is not what
    runc's kernel would, and each difference fails (none passes by accident)."""
    bad = _bad(judge("before", policy=_policy("runc"), mounts=MOUNTS, probes=_probes("runsc")))
    for cid in ("probe.kernel", "probe.no_new_privs", "probe.seccomp", "probe.namespaces_private",
                "probe.masked_paths", "probe.readonly_kernel_paths", "probe.cgroupns_private",
                "probe.cgroup_pids", "probe.cgroup_memory", "probe.cgroup_cpu"):
        assert cid in bad, (cid, bad)


def test_runc_probes_are_not_read_as_gvisor():
    """A sandbox on the host's kernel judged by the runsc policy fails: it is not behind gVisor."""
    checks = judge("before", policy=_policy("runsc"), mounts=MOUNTS, probes=_probes("runc"))
    bad = _bad(checks)
    assert "probe.kernel" in bad and "does not run on gVisor" in bad["probe.kernel"]
    assert set(bad) <= {"probe.kernel", "probe.cgroup_pids", "probe.cgroup_memory", "probe.cgroup_cpu"}, bad
    assert _bad(judge("before", policy=_policy("runc"), mounts=MOUNTS, probes=_probes("runc"))) == {}


def test_gvisor_without_oci_seccomp_fails():
    text = _probes("runsc").replace("Seccomp:\t2", "Seccomp:\t0")
    bad = _bad(judge("before", policy=_policy("runsc"), mounts=MOUNTS, probes=text))
    assert set(bad) == {"probe.seccomp"} and "--oci-seccomp" in bad["probe.seccomp"]


def test_gvisor_probe_cut_or_missing_host_limits_is_unknown():
    text = _probes("runsc")
    cut = text[: text.index("=== ale-probe:host_cgroup_limits ===")]
    checks = {c.id: c for c in judge("running", policy=_policy("runsc"), mounts=MOUNTS, probes=cut)}
    for cid in ("probe.cgroup_pids", "probe.cgroup_memory", "probe.cgroup_cpu"):
        assert checks[cid].ok is None, checks[cid]
    # After the agent the host's limits are not read (the end-of-turn exec): not judged.
    after = {c.id for c in judge("after", policy=_policy("runsc"), mounts=MOUNTS, probes=cut)}
    assert not after & {"probe.cgroup_pids", "probe.cgroup_memory", "probe.cgroup_cpu"}
    nonempty = text.replace("absent /sys/firmware", "").replace("empty /sys/firmware", "")
    assert "probe.masked_paths" in _bad(judge("before", policy=_policy("runsc"), mounts=MOUNTS, probes=nonempty))


def test_old_evidence_without_the_kernel_section_is_judged_as_before():
    text = _probes("runc")
    start = text.index("=== ale-probe:kernel ===")
    old = text[:start] + text[text.index("=== ale-probe:cgroup_limits ==="):]
    ids = {c.id for c in judge("before", policy=_policy("runc"), mounts=MOUNTS, probes=old)}
    assert "probe.kernel" not in ids
    assert rule_for("probe.kernel") is not None


def test_inspect_records_and_checks_the_runtime():
    inspect = _INSPECT
    assert inspect["HostConfig"]["Runtime"] == "runsc"
    ok = {c.id: c for c in judge("before", policy=_policy("runsc"), mounts=MOUNTS, inspect=inspect)}
    assert ok["runtime"].ok is True and ok["runtime"].observed == "runsc"
    wrong = {c.id: c for c in judge("before", policy=_policy("runc"), mounts=MOUNTS, inspect=inspect)}
    assert wrong["runtime"].ok is False and wrong["runtime"].expected == "runc"


# -- a real engine with runsc ---------------------------------------------------------
@pytest.mark.docker
def test_a_container_built_wrong_under_runsc_is_rejected(docker_client, tmp_path, label):
    """A real runsc container with a capability added and no no-new-privileges: the
    inspect rules reject it; a runc container judged as runsc fails on its runtime and
    its kernel."""
    from ale.isolation.probes import run_probes
    from ale.sandbox.docker import DockerProvider, DockerSandbox, container_create_kwargs
    from tests.test_sandbox_docker import require_runtime

    require_runtime(docker_client, "runsc")
    inp, ws = tmp_path / "in", tmp_path / "ws"
    inp.mkdir()
    ws.mkdir()
    policy = IsolationPolicy(memory_bytes=512 * MIB).with_runtime("runsc")
    import os

    os.chown(ws, policy.uid, policy.gid)
    mounts = (Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False))
    labels = {"ale.managed": "1", "ale.test": label}

    def make(name: str, runtime: str, **wrong):
        kw = container_create_kwargs(name=name, image="ale-tools:latest", policy=policy.model_copy(update={"runtime": runtime}),
                                     mounts=mounts, labels=labels, workdir="/workspace")
        kw.update(wrong)
        return DockerSandbox(docker_client, docker_client.containers.create(**kw), policy)

    made = []
    try:
        sb = make(f"ale-{label}-wrong", "runsc", cap_add=["NET_RAW"], security_opt=[])
        made.append(sb)
        bad = _bad(judge("before", policy=policy, mounts=mounts, inspect=sb.inspect()))
        assert {"caps.add_empty", "sec.no_new_privileges"} <= set(bad), bad
        assert "runtime" not in bad

        rc = make(f"ale-{label}-runc", "runc")
        made.append(rc)
        bad = _bad(judge("before", policy=policy, mounts=mounts, inspect=rc.inspect()))
        assert set(bad) == {"runtime"}, bad
        asyncio.run(rc.start())
        _raw, checks = asyncio.run(run_probes(rc, policy, input_dir="/input", workspace_dir="/workspace"))
        assert "probe.kernel" in _bad(checks)

        ok = asyncio.run(DockerProvider(docker_client).create(SandboxSpec(
            name=f"ale-{label}-ok", image="ale-tools:latest", policy=policy, mounts=mounts, workdir="/workspace",
            labels={"ale.test": label}, environment={})))
        made.append(ok)
        asyncio.run(ok.start())
        _raw, checks = asyncio.run(run_probes(ok, policy, input_dir="/input", workspace_dir="/workspace"))
        assert _bad(checks) == {}, _bad(checks)
    finally:
        for s in made:
            asyncio.run(s.remove())


def test_fixture_paths_exist():
    for name in ("probes-runc.txt", "probes-runsc.txt", "inspect-runsc.json"):
        assert (FIXTURES / name).is_file(), name
    assert Path(__file__).name == "test_gvisor.py"


def test_exp_run_refuses_a_missing_runtime_before_any_run(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import ale.sandbox.providers as providers
    from ale.cli.main import app
    from ale.sandbox.docker import DockerProvider

    monkeypatch.setattr(providers, "make_provider", lambda *a, **k: DockerProvider(_Engine(["runc"])))
    task = REPO / "examples" / "tasks" / "files" / "word_count"
    f = tmp_path / "exp.yaml"
    f.write_text(f"name: g\ntasks: [{task}]\nagents: [{{name: nop}}]\noutput: {tmp_path / 'out'}\n"
                 "environment: {runtime: runsc, provision_software: false}\n")
    r = CliRunner().invoke(app, ["exp", "run", str(f), "--plain"])
    assert r.exit_code == 2, r.output
    assert "environment.runtime 'runsc'" in r.output and "apt-get install runsc" in r.output, r.output
    assert not (tmp_path / "out" / "runs").exists()  # refused before any run began
