"""The docker provider against the conformance suite (one test per check), plus
the Docker-specific behaviour the suite does not state."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import subprocess
import time

import pytest

from ale.sandbox.base import LABEL_MANAGED, ExecResult, ImageMissing, SandboxError
from ale.sandbox.docker import DockerProvider
from ale.sandbox.runtimes import GVISOR, install_hint
from tests.conftest import require
from tests.sandbox_conformance import CHECKS, MISSING_IMAGE, run_check

pytestmark = pytest.mark.docker

#: Checks the docker provider fails today: contract breaches in
#: src/ale/sandbox/docker.py. Strict, so a fix turns them into a failure that
#: asks for the entry's removal.
KNOWN_PROVIDER_BUGS: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class RuntimeDifference:
    """A check that cannot pass under a runtime: why, and the failure it must fail with
    (a regex on the AssertionError's message). Any other failure is a real one."""

    reason: str
    failure: str


class KnownRuntimeDifference(Exception):
    """The check failed exactly as its `RuntimeDifference` says it must."""


#: Checks that cannot pass under a runtime, with why (strict: a pass asks for removal,
#: and only the named failure is expected: any other fails the test).
_STATX = ("the gVisor Debian ships (runsc 0.0~20221219) refuses statx(2) with AT_NO_AUTOMOUNT (EINVAL), "
          "which coreutils 9 `stat` and `ls PATH` pass: the check's own `{}` fails, not the provider "
          "(later gVisor releases accept the flag)")
RUNTIME_DIFFERENCES: dict[tuple[str, str], RuntimeDifference] = {
    ("runsc", "exec_user"): RuntimeDifference(_STATX.format("stat -c %u:%g /workspace/who"),
                                              r"stat: cannot statx '/workspace/who': Invalid argument"),
    ("runsc", "mounts"): RuntimeDifference(_STATX.format("ls -A /workspace"),
                                           r"ls: cannot access '/workspace': Invalid argument"),
}


def run_expecting(difference: RuntimeDifference, check) -> None:
    """Run `check`; its AssertionError becomes `KnownRuntimeDifference` only when the
    message names the expected failure (anything else propagates as it is)."""
    try:
        check()
    except AssertionError as e:
        if re.search(difference.failure, str(e)):
            raise KnownRuntimeDifference(f"{difference.reason}: {e}") from e
        raise

#: The runtimes the suite runs under: runc always, runsc (gVisor) where it can be had.
RUNTIMES = ("runc", GVISOR)


def _params():
    for name in CHECKS:
        marks = ()
        if name in KNOWN_PROVIDER_BUGS:
            marks = (pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_PROVIDER_BUGS[name]),)
        yield pytest.param(name, id=name, marks=marks)


def runsc_installable() -> bool:
    """runsc is on this machine, or its Debian package is available to install."""
    if shutil.which("runsc"):
        return True
    if not shutil.which("apt-cache"):
        return False
    out = subprocess.run(["apt-cache", "policy", "runsc"], capture_output=True, text=True).stdout
    return "Candidate:" in out and "Candidate: (none)" not in out


def require_runtime(docker_client, runtime: str) -> None:
    """Skip (a failure under ALE_CI=1) when the engine lacks `runtime` but it could be
    had; skip in any case where it cannot be installed here."""
    have = sorted(docker_client.info().get("Runtimes") or {})
    if runtime in have:
        return
    if runtime == GVISOR and not runsc_installable():
        require(False, "gVisor (runsc) cannot be installed here: no runsc binary and no Debian package "
                       "(scripts/setup.sh installs it on Debian 12 and fails without it)")
    require(False, f"the Docker engine lacks the runtime {runtime!r} (has {have}): {install_hint(runtime)}")


@pytest.fixture(params=RUNTIMES)
def runtime(request, docker_client) -> str:
    if request.param != "runc":
        require_runtime(docker_client, request.param)
    return request.param


@pytest.fixture
def provider(docker_client):
    return DockerProvider(docker_client)


@pytest.fixture
def runtime_env(conformance_env, runtime):
    """The conformance environment with the policy under `runtime`."""
    return dataclasses.replace(conformance_env, policy=conformance_env.policy.with_runtime(runtime))


@pytest.mark.parametrize("check_name", list(_params()))
def test_conformance(check_name, provider, runtime_env, request):
    difference = RUNTIME_DIFFERENCES.get((runtime_env.policy.runtime, check_name))
    if difference is None:
        run_check(check_name, provider, runtime_env)
        return
    request.applymarker(pytest.mark.xfail(strict=True, raises=KnownRuntimeDifference, reason=difference.reason))
    run_expecting(difference, lambda: run_check(check_name, provider, runtime_env))


def test_a_runtime_difference_expects_only_its_own_failure():
    """The xfail of a runtime difference holds for its named failure only: another
    assertion (a real regression under runsc) fails the test, and a pass too (strict)."""
    d = RUNTIME_DIFFERENCES[("runsc", "mounts")]

    def named() -> None:
        r = ExecResult(2, b"", b"ls: cannot access '/workspace': Invalid argument\n")
        raise AssertionError(f"workspace not listed empty: {r!r}")

    def other() -> None:
        raise AssertionError("'echo x > /input/new' as the candidate succeeded in /input")

    with pytest.raises(KnownRuntimeDifference, match="statx"):
        run_expecting(d, named)
    with pytest.raises(AssertionError, match="succeeded in /input"):
        run_expecting(d, other)
    run_expecting(d, lambda: None)  # a pass is the caller's XPASS(strict)
    for (_, name), diff in RUNTIME_DIFFERENCES.items():
        assert diff.failure and diff.reason, name


def test_runtime_differences_name_real_checks():
    assert {c for _, c in RUNTIME_DIFFERENCES} <= set(CHECKS)
    assert {r for r, _ in RUNTIME_DIFFERENCES} <= set(RUNTIMES)


def test_known_bugs_name_real_checks():
    assert set(KNOWN_PROVIDER_BUGS) <= set(CHECKS)


def test_missing_image_error_says_how_to_build_it(provider, conformance_env):
    """An image that is not ale's: the hint names `docker pull` of that image (ale's own
    images name `ale image build`: tests/test_image_hints.py runs each hint)."""
    with pytest.raises(ImageMissing, match=f"docker pull {MISSING_IMAGE}"):
        asyncio.run(provider.create(conformance_env.spec(image=MISSING_IMAGE)))
    with pytest.raises(ImageMissing, match=f"docker pull {MISSING_IMAGE}"):
        provider.image_inspect(MISSING_IMAGE)


def test_containers_carry_the_managed_label_and_the_spec(provider, conformance_env, docker_client):
    """Cleanup selects by `ale.managed=1`: the provider adds it to every container."""
    spec = conformance_env.spec(environment={"ALE_X": "1"})

    async def go():
        sb = await provider.create(spec)
        try:
            attrs = docker_client.api.inspect_container(spec.name)
            assert attrs["Config"]["Labels"][LABEL_MANAGED] == "1"
            assert all(attrs["Config"]["Labels"][k] == v for k, v in spec.labels.items())
            assert "ALE_X=1" in attrs["Config"]["Env"]
            assert attrs["Config"]["User"] == spec.policy.user
            assert attrs["HostConfig"]["NetworkMode"] == "none"
            assert attrs["HostConfig"]["ReadonlyRootfs"] is True
        finally:
            await sb.remove()

    asyncio.run(go())


def test_unreachable_engine_is_a_sandbox_error(tmp_path):
    provider = DockerProvider(base_url=f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(SandboxError, match="cannot reach the Docker engine"):
        provider.engine_record()


def test_timeout_kill_spares_no_env_cleared_descendant_on_a_slow_engine(provider, conformance_env, monkeypatch):
    """The kill after a timeout finds env-cleared descendants by their start time.
    A slow engine (a loaded host) delays the kill's exec: the command's start must
    still map onto the container's clock from below, or a descendant forked just
    after the start is spared (seen in CI: `sleep 36` outlived its timed-out command)."""
    from tests.sandbox_conformance import assert_no_processes, running

    async def go():
        async with running(provider, conformance_env) as sb:
            create = sb.client.api.exec_create

            def slow_create(container, cmd, *a, **kw):
                if "kill-tagged" in cmd:
                    time.sleep(1.5)
                return create(container, cmd, *a, **kw)

            monkeypatch.setattr(sb.client.api, "exec_create", slow_create)
            r = await sb.exec(["sh", "-c", "(env -i setsid sleep 36 >/dev/null 2>&1 &) ; sleep 30"], timeout=1.0)
            assert r.timed_out, r
            await assert_no_processes(sb, "after a timeout on a slow engine", grace_s=1)

    asyncio.run(go())
