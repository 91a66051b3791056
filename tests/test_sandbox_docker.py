"""The docker provider against the conformance suite (one test per check), plus
the Docker-specific behaviour the suite does not state."""

from __future__ import annotations

import asyncio

import pytest

from ale.sandbox.base import LABEL_MANAGED, ImageMissing, SandboxError
from ale.sandbox.docker import DockerProvider
from tests.sandbox_conformance import CHECKS, MISSING_IMAGE, run_check

pytestmark = pytest.mark.docker

#: Checks the docker provider fails today: contract breaches in
#: src/ale/sandbox/docker.py. Strict, so a fix turns them into a failure that
#: asks for the entry's removal.
KNOWN_PROVIDER_BUGS: dict[str, str] = {}


def _params():
    for name in CHECKS:
        marks = ()
        if name in KNOWN_PROVIDER_BUGS:
            marks = (pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_PROVIDER_BUGS[name]),)
        yield pytest.param(name, id=name, marks=marks)


@pytest.fixture
def provider(docker_client):
    return DockerProvider(docker_client)


@pytest.mark.parametrize("check_name", list(_params()))
def test_conformance(check_name, provider, conformance_env):
    run_check(check_name, provider, conformance_env)


def test_known_bugs_name_real_checks():
    assert set(KNOWN_PROVIDER_BUGS) <= set(CHECKS)


def test_missing_image_error_says_how_to_build_it(provider, conformance_env):
    with pytest.raises(ImageMissing, match="ale image build"):
        asyncio.run(provider.create(conformance_env.spec(image=MISSING_IMAGE)))
    with pytest.raises(ImageMissing, match="ale image build"):
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
