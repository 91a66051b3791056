"""A second interpreter (issue 30): a task pinning Python 3.10 (3.12, 3.13, 3.14) gets an
environment built on a tools image bootstrapped from Ubuntu 22.04 (Ubuntu 24.04, Debian
trixie, sid), whose python3 it is, with its packages' wheels for that version; a version no
release provides is reported with what was looked for."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale.provision.needs import resolve_needs
from ale.sandbox.base import LABEL_RUN, Mount, SandboxSpec
from ale.sandbox.docker import DockerProvider
from ale.sandbox.env_image import EnvImage, build_env_image
from ale.sandbox.policy import GIB, IsolationPolicy
from tests.conftest import TOOLS_IMAGE


def tree(root: Path, software: list[str]) -> Path:
    d = root / "lab" / "py"
    d.mkdir(parents=True)
    (d / "main.py").write_text("")
    (d / "task_card.json").write_text(json.dumps({"vm": {"snapshot": "cpu-free-ubuntu"}, "software": software}))
    return d


@pytest.mark.parametrize("asked, got", [("Python 3.13", "3.13"), ("Python 3.14.3", "3.14"), ("Python 3.12+", "3.12"),
                                        ("Python 3.10", "3.10"), ("Python 3.12", "3.12"), ("python 3.10.12", "3.10")])
def test_another_interpreter_is_a_releases_python3(tmp_path: Path, asked: str, got: str) -> None:
    p = resolve_needs(tree(tmp_path, [asked, "tabulate"]), indexes=False)
    assert p.complete and p.spec.python_version == got
    (need,) = [n for n in p.needs if n.name == asked]
    assert need.check is not None and f'"{got}."' in need.check


@pytest.mark.parametrize("asked", ["Python 3.9", "Python 3.15"])
def test_an_interpreter_no_package_provides_says_what_was_looked_for(tmp_path: Path, asked: str) -> None:
    (m,) = resolve_needs(tree(tmp_path, [asked]), indexes=False).missing
    assert m.kind == "version"
    assert "3.10 Ubuntu 22.04, 3.12 Ubuntu 24.04, 3.13 Debian trixie, 3.14 Debian sid" in m.why
    assert "portable-python" in m.why


def test_each_interpreter_the_catalogue_offers_has_a_release_to_build_it() -> None:
    from ale.provision.catalogue import load_catalogue
    from ale.sandbox.env_image import INTERPRETER_RELEASES

    assert set(load_catalogue().python_versions) == set(INTERPRETER_RELEASES)


@pytest.fixture(scope="module", params=["3.10", "3.12", "3.13", "3.14"])
def py313(request, docker_client, tmp_path_factory) -> Iterator[EnvImage]:
    """3.10 from Ubuntu 22.04, 3.12 from Ubuntu 24.04, 3.13 from trixie, 3.14 from sid
    (the card asks for 3.14.3, as one of ALE's does)."""
    asked = {"3.10": "Python 3.10", "3.12": "Python 3.12", "3.13": "Python 3.13", "3.14": "Python 3.14.3"}[request.param]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ale-cache"))
        p = resolve_needs(tree(tmp_path_factory.mktemp("tree"), [asked, "tabulate"]), indexes=False)
        yield build_env_image(p.spec, client=docker_client, base_image=TOOLS_IMAGE, say=lambda _l: None)


@pytest.mark.docker
def test_a_newer_python_and_its_packages_in_a_sealed_sandbox(docker_client, py313: EnvImage, tmp_path: Path) -> None:
    version = py313.record["spec"]["python_version"]
    assert py313.record["python"]["version"].startswith(version + ".")
    assert py313.base.startswith("ale-tools:") and py313.base != TOOLS_IMAGE
    assert any(f["name"].startswith("tabulate-") for f in py313.record["store"]["files"])
    release = {"3.10": ("ubuntu", "22.04"), "3.12": ("ubuntu", "24.04"), "3.13": ("debian", "13"),
               "3.14": ("debian", "")}[version]
    os_ = py313.record["os"]
    assert os_["id"] == release[0] and os_["version_id"] == release[1], os_  # sid has no VERSION_ID
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    policy = IsolationPolicy(memory_bytes=2 * GIB)
    os.chown(workspace, policy.uid, policy.gid)
    run_id = f"test-py313-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(name=f"ale-{run_id}", image=py313.tag, policy=policy,
                       mounts=(Mount(str(tmp_path), "/input", True), Mount(str(workspace), "/workspace", False)),
                       workdir="/workspace", labels={LABEL_RUN: run_id})
    sandbox = asyncio.run(DockerProvider(docker_client).create(spec))
    try:
        asyncio.run(sandbox.start())
        from ale.isolation.verify_container import verify_container

        report = verify_container(DockerProvider(docker_client), spec.name, input_dir=str(tmp_path),
                                  workspace_dir=str(workspace), policy=policy, input_target="/input",
                                  workspace_target="/workspace")
        assert report.ok, report.violations
        r = asyncio.run(sandbox.exec(["sh", "-c", "python --version; python3 -c 'import tabulate, numpy; print(tabulate.__name__)'; "
                                     "pip install tabulate 2>&1 | grep -o 'already satisfied: tabulate'"], timeout=120))
        assert r.ok, r.stderr.decode(errors="replace")
        out = r.text().splitlines()
        assert out[0].startswith(f"Python {version}.") and out[1] == "tabulate" and "already satisfied" in out[2]
    finally:
        asyncio.run(sandbox.remove())


def test_a_named_ubuntu_keyring_that_is_missing_is_refused_naming_it(tmp_path: Path, monkeypatch) -> None:
    from ale.sandbox.base import SandboxError
    from ale.sandbox.releases import ubuntu, ubuntu_keyring

    monkeypatch.setenv("ALE_UBUNTU_KEYRING", str(tmp_path / "nope.gpg"))
    with pytest.raises(SandboxError, match=r"ALE_UBUNTU_KEYRING=.*nope.gpg: no such file"):
        ubuntu_keyring(lambda _l: None)
    assert ubuntu("noble").label == "Ubuntu 24.04 (noble)" and ubuntu("noble").updates == "noble-updates,noble-security"


def test_a_package_the_distribution_installed_is_named_for_install_beside_it(tmp_path: Path) -> None:
    """images/env/distro-replaced.py names, of what a pip plan installs, the packages whose
    installed copy has no RECORD (the distribution's, which pip cannot uninstall), at the
    plan's version; a pip-installed copy (with RECORD) or a new package is left to pip."""
    import subprocess
    import sys

    from ale.sandbox.env_image import env_folder

    site = tmp_path / "site"
    for name, record in [("numpy", False), ("tabulate", True)]:
        info = site / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        if record:
            (info / "RECORD").write_text("")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"install": [{"metadata": {"name": n, "version": "2.5.5"}}
                                            for n in ("numpy", "tabulate", "pandas")]}))
    r = subprocess.run([sys.executable, str(env_folder() / "distro-replaced.py"), str(plan)],
                       capture_output=True, text=True, env={"PYTHONPATH": str(site)}, check=True)
    assert r.stdout.splitlines() == ["numpy==2.5.5"]


@pytest.mark.docker
@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_a_requirement_needing_a_newer_numpy_than_the_releases_is_installed_beside_it(
        docker_client, tmp_path_factory, version: str) -> None:
    """Ubuntu 24.04's and trixie's pips lack Debian's hands-off patch: a requirement that
    needs a newer numpy than the tools image's python3-numpy (1.26.4, 2.2.4) failed the
    build ("Cannot uninstall numpy 1.26.4, RECORD file not found"). It is installed in
    /usr/local, first on sys.path, and the distribution's copy is left as apt installed it."""
    from ale.sandbox.software import SoftwareSpec

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ale-cache"))
        p = resolve_needs(tree(tmp_path_factory.mktemp("tree"), [f"Python {version}", "tabulate"]), indexes=False)
        spec = SoftwareSpec.model_validate({**p.spec.model_dump(), "python": [*p.spec.python, "numpy>=2.3"]})
        img = build_env_image(spec, client=docker_client, base_image=TOOLS_IMAGE, say=lambda _l: None)
    assert not img.record["missing"]
    out = docker_client.containers.run(
        img.tag, ["sh", "-c", "python3 -c 'import numpy; print(numpy.__version__); print(numpy.__file__)'; "
                              "dpkg -V python3-numpy && echo intact"],
        network_disabled=True, remove=True, user="root").decode().splitlines()
    major, minor = (int(x) for x in out[0].split(".")[:2])
    assert (major, minor) >= (2, 3), out
    assert out[1].startswith(f"/usr/local/lib/python{version}/dist-packages/numpy/"), out
    assert out[2] == "intact", out


@pytest.mark.docker
def test_a_release_that_cannot_be_fetched_leaves_its_interpreter_missing_saying_why(
        docker_client, tmp_path: Path, monkeypatch) -> None:
    """A build that fails is reported, and the task's environment is built without it:
    Ubuntu's archive unreachable, a Python 3.10 task gets the tools image's 3.11 with
    "Python 3.10" missing, the bootstrap's failure its why."""
    monkeypatch.setenv("ALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ALE_UBUNTU_MIRROR", "http://127.0.0.1:9/ubuntu")  # nothing listens there
    monkeypatch.setenv("ALE_UBUNTU_KEYRING", "/usr/share/keyrings/debian-archive-keyring.gpg")
    p = resolve_needs(tree(tmp_path, ["Python 3.10", "tabulate"]), indexes=False)
    said: list[str] = []
    env = build_env_image(p.spec, client=docker_client, base_image=TOOLS_IMAGE, say=said.append)
    assert env.base == TOOLS_IMAGE and env.record["python"]["version"].startswith("3.11.")
    (m,) = [m for m in env.record["missing"] if m["name"] == "Python 3.10"]
    assert "building Ubuntu 22.04 (jammy)'s tools image failed" in m["why"] and "127.0.0.1" in m["why"], m
    assert any("built without Python 3.10" in line for line in said), said
