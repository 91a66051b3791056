"""Task environment images (issue 18, items 1, 3 and the image half of 5), with a
real engine: one small spec built once per module, then every offline install an
agent may try, inside real sealed sandboxes made by the docker provider.

The spec: Debian ``jq``; PyPI ``six`` installed into python3; ``tomli`` (a
compiled wheel: it needs an exec-able place to import from) in the store only; a
project whose ``uv.lock``, made at test time on the trusted side with network,
pins ``six==1.16.0`` (not the version python3 gets)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ale.sandbox.base import LABEL_RUN, ExecResult, Mount, SandboxSpec
from ale.sandbox.docker import DockerProvider
from ale.sandbox.env_image import (
    LABEL_RECORD,
    RECORD_PATH,
    EnvImage,
    build_env_image,
    download_set,
    lock_needs,
    probe_platform,
    spec_content,
    uv_binaries,
)
from ale.sandbox.policy import GIB, IsolationPolicy, TmpfsMount
from ale.sandbox.software import LockFile, SoftwareSpec
from tests.conftest import TOOLS_IMAGE

pytestmark = pytest.mark.docker

PYPROJECT = """\
[project]
name = "demo"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["six<1.17"]
"""

#: The default policy with /tmp exec-able: what uv's cache (hence `uv run --with`)
#: and a venv in /tmp need to import a compiled package. Docker mounts a tmpfs
#: noexec unless told `exec`, and the default policy does not tell it.
EXEC_TMP = TmpfsMount(options="rw,exec,nosuid,nodev,size=1g")


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> Iterator[None]:
    """The test session's cache folder (the autouse fixture is function-scoped)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ale-cache"))
        yield


@pytest.fixture(scope="module")
def project(docker_client, cache_env, tmp_path_factory) -> Path:
    """pyproject.toml + uv.lock, locked on the trusted side (uv, with network)."""
    folder = tmp_path_factory.mktemp("input") / "proj"
    folder.mkdir()
    (folder / "pyproject.toml").write_text(PYPROJECT)
    uv = uv_binaries(probe_platform(docker_client, TOOLS_IMAGE), say=lambda _l: None) / "uv"
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path_factory.mktemp("uv-cache"))}
    proc = subprocess.run([str(uv), "lock", "--python", sys.executable], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert 'name = "six"\nversion = "1.16.0"' in (folder / "uv.lock").read_text()
    for p in (folder.parent, folder, *folder.iterdir()):  # readable by the sandbox's uid
        p.chmod(0o755 if p.is_dir() else 0o644)
    return folder


@pytest.fixture(scope="module")
def spec(project) -> SoftwareSpec:
    return SoftwareSpec(
        debian=("jq",), python=("six",), store_only=("tomli",),
        lockfiles=tuple(LockFile(name=n, text=(project / n).read_text(), origin=str(project / n))
                        for n in ("pyproject.toml", "uv.lock")),
    )


@pytest.fixture(scope="module")
def env(docker_client, cache_env, spec) -> tuple[EnvImage, list[str]]:
    lines: list[str] = []
    t0 = time.monotonic()
    image = build_env_image(spec, client=docker_client, base_image=TOOLS_IMAGE, say=lines.append)
    print(f"\nenv image {image.tag}: {'cached' if image.cached else 'built'} in {time.monotonic() - t0:.1f}s, "
          f"{image.size / 1e6:.1f} MB")
    return image, lines


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Sealed:
    """A running sandbox of the env image, made by the docker provider."""

    def __init__(self, provider: DockerProvider, sandbox: Any, spec: SandboxSpec, input_dir: Path, workspace: Path):
        self.provider, self.sandbox, self.spec = provider, sandbox, spec
        self.input_dir, self.workspace = input_dir, workspace

    def sh(self, script: str, timeout: float = 180) -> ExecResult:
        return run(self.sandbox.exec(["sh", "-c", script], timeout=timeout))


def _sealed(docker_client, image: str, policy: IsolationPolicy, project: Path, tmp: Path) -> Iterator[Sealed]:
    input_dir = project.parent
    workspace = tmp / "workspace"
    workspace.mkdir()
    os.chown(workspace, policy.uid, policy.gid)
    run_id = f"test-env-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(
        name=f"ale-{run_id}", image=image, policy=policy,
        mounts=(Mount(str(input_dir), "/input", True), Mount(str(workspace), "/workspace", False)),
        workdir="/workspace", labels={LABEL_RUN: run_id},
    )
    provider = DockerProvider(docker_client)
    sandbox = run(provider.create(spec))
    try:
        run(sandbox.start())
        yield Sealed(provider, sandbox, spec, input_dir, workspace)
    finally:
        run(sandbox.remove())


@pytest.fixture(scope="module")
def sealed(docker_client, env, project, tmp_path_factory) -> Iterator[Sealed]:
    """Sealed as the default policy says, but for an exec-able /tmp (see EXEC_TMP)."""
    policy = IsolationPolicy(memory_bytes=4 * GIB, tmpfs=(EXEC_TMP,))
    yield from _sealed(docker_client, env[0].tag, policy, project, tmp_path_factory.mktemp("sealed"))


@pytest.fixture(scope="module")
def sealed_default(docker_client, env, project, tmp_path_factory) -> Iterator[Sealed]:
    """Sealed exactly as the default policy says."""
    policy = IsolationPolicy(memory_bytes=4 * GIB)
    yield from _sealed(docker_client, env[0].tag, policy, project, tmp_path_factory.mktemp("sealed-default"))


def ok(r: ExecResult) -> str:
    assert r.ok, f"exit {r.exit_code}\nstdout: {r.text()}\nstderr: {r.stderr.decode(errors='replace')}"
    return r.text()


# ---------------------------------------------------------------- needs (host only)


def test_lock_files_become_pins_and_requirements():
    lock = '''version = 1
[[package]]
name = "demo"
version = "0.1.0"
source = { virtual = "." }
[[package]]
name = "six"
version = "1.16.0"
source = { registry = "https://pypi.org/simple" }
[[package]]
name = "local"
version = "1.0"
source = { path = "vendor/local-1.0.whl" }
'''
    assert lock_needs(LockFile(name="uv.lock", text=lock)) == ([], ["six==1.16.0"])
    pyproject = PYPROJECT + '[dependency-groups]\ndev = ["pytest>=8"]\n[build-system]\nrequires = ["hatchling"]\n'
    assert lock_needs(LockFile(name="pyproject.toml", text=pyproject)) == (["hatchling", "pytest>=8", "six<1.17"], [])
    reqs = "# pinned\nnumpy==2.1.0 --hash=sha256:abc \\\n-r other.txt\n-e .\n./vendor/x.whl\npandas>=2 ; python_version >= '3.9'\n"
    assert lock_needs(LockFile(name="requirements.txt", text=reqs)) == (
        ["numpy==2.1.0", "pandas>=2 ; python_version >= '3.9'"], [])


def test_a_lock_pins_only_the_versions_locked_for_the_images_python():
    """A uv.lock for requires-python >=3.10 pins numpy 2.5.5 for Python >=3.12 only: for
    a 3.11 image it is not a need (it was reported missing, and the run warned of an
    undelivered 'declared' need)."""
    lock = """version = 1
requires-python = ">=3.10"
resolution-markers = ["python_full_version >= '3.12'", "python_full_version == '3.11.*'", "python_full_version < '3.11'"]

[[package]]
name = "numpy"
version = "2.2.6"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version < '3.11'"]

[[package]]
name = "numpy"
version = "2.4.6"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version == '3.11.*'"]

[[package]]
name = "numpy"
version = "2.5.5"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version >= '3.12'"]

[[package]]
name = "six"
version = "1.16.0"
source = { registry = "https://pypi.org/simple" }
"""
    lf = LockFile(name="uv.lock", text=lock)
    target = {"python": "3.11", "python_full": "3.11.2", "libc": ["glibc", "2.36"], "machine": "x86_64"}
    assert lock_needs(lf, target) == ([], ["numpy==2.4.6", "six==1.16.0"])
    assert lock_needs(lf) == ([], ["numpy==2.2.6", "numpy==2.4.6", "numpy==2.5.5", "six==1.16.0"])


def test_a_requirement_without_a_wheel_is_reported_missing_not_fatal(tmp_path):
    target = {"python": "3.11", "libc": ["glibc", "2.36"], "machine": "x86_64"}
    missing = download_set(["six==1.17.0", "ale-no-such-package-zz9"], tmp_path, target, say=lambda _l: None)
    assert [m["name"] for m in missing] == ["ale-no-such-package-zz9"]
    assert "no wheel for the image's interpreter and platform" in missing[0]["why"]
    assert [p.name for p in tmp_path.iterdir()] == ["six-1.17.0-py2.py3-none-any.whl"]


# ---------------------------------------------------------------- the image


def test_the_image_records_what_it_holds(env, docker_client, spec):
    image, _ = env
    record = image.record
    assert image.tag == f"ale-env:{image.key[:12]}"
    assert record["key"] == image.key and record["spec"] == spec_content(spec)
    assert "jq" in {d["name"] for d in record["debian"]}
    assert {"name": "six", "version": "1.17.0"} in record["python"]["packages"]
    assert "tomli" not in {p["name"] for p in record["python"]["packages"]}
    names = [f["name"] for f in record["store"]["files"]]
    assert any(n.startswith("six-1.16.0-") for n in names)  # the lock's pin
    assert any(n.startswith("six-1.17.0-") for n in names)  # what python3 got
    assert any(n.startswith("tomli-") for n in names)  # store only
    h = hashlib.sha256()
    for f in record["store"]["files"]:
        h.update(f["name"].encode() + b"\0" + f["sha256"].encode() + b"\n")
    assert record["store"]["digest"] == h.hexdigest() == image.store_digest
    assert record["missing"] == []
    cmds = record["commands"]
    assert cmds["python"] == cmds["python3"] == record["python"]["realpath"]
    assert record["uv"].startswith("uv ")
    attrs = docker_client.images.get(image.tag).attrs
    assert attrs["Id"] == image.image_id
    assert not attrs["Config"].get("Volumes")
    assert attrs["Config"]["Labels"][LABEL_RECORD]


def test_the_record_in_the_image_is_the_labelled_one(env, sealed):
    image, _ = env
    body = ok(sealed.sh(f"cat {RECORD_PATH}")).encode()
    labels = sealed.sandbox.inspect()["Config"]["Labels"]
    assert hashlib.sha256(body).hexdigest() == labels[LABEL_RECORD]
    assert json.loads(body)["store"]["digest"] == image.store_digest


def test_a_second_build_is_a_cached_lookup(env, docker_client, spec):
    image, _ = env
    lines: list[str] = []
    t0 = time.monotonic()
    again = build_env_image(spec, client=docker_client, base_image=TOOLS_IMAGE, say=lines.append)
    elapsed = time.monotonic() - t0
    print(f"\ncached lookup: {elapsed:.2f}s")
    assert again.cached and again.image_id == image.image_id and again.tag == image.tag
    assert any("cached" in line for line in lines)
    assert elapsed < 5
    assert again.record == image.record


def test_an_empty_spec_is_the_base_image(docker_client, cache_env):
    image = build_env_image(SoftwareSpec(), client=docker_client, base_image=TOOLS_IMAGE, say=lambda _l: None)
    assert image.tag == TOOLS_IMAGE and image.image_id == docker_client.images.get(TOOLS_IMAGE).id
    assert image.record["debian"] and image.record["store"]["files"] == []


# ---------------------------------------------------------------- the seal


@pytest.mark.parametrize("which", ["sealed", "sealed_default"])
def test_a_sandbox_of_the_env_image_passes_the_isolation_checks(which, request):
    from ale.isolation.verify_container import verify_container

    box: Sealed = request.getfixturevalue(which)
    report = verify_container(
        box.provider, box.spec.name, input_dir=str(box.input_dir), workspace_dir=str(box.workspace),
        policy=box.spec.policy, input_target="/input", workspace_target="/workspace",
    )
    assert report.phase == "running"
    assert report.ok, report.violations
    assert any(c["id"].startswith("probe.") for c in report.checks)


# ---------------------------------------------------------------- offline installs


def test_the_debian_tool_and_the_installed_package(sealed):
    assert ok(sealed.sh("echo '{\"a\": 7}' | jq .a")).strip() == "7"
    out = ok(sealed.sh("id -u; python -c 'import six; print(six.__version__)'; "
                       "python3 -c 'import six, sys; print(sys.executable)'")).split()
    assert out == ["1000", "1.17.0", "/usr/bin/python3"]


def test_pip_install_of_an_installed_package_succeeds_offline(sealed):
    assert "Requirement already satisfied: six" in ok(sealed.sh("pip install six"))


def test_a_venv_installs_from_the_store(sealed):
    ok(sealed.sh("python3 -m venv /tmp/v && /tmp/v/bin/pip install tomli six"))
    assert ok(sealed.sh("/tmp/v/bin/python -c 'import tomli, six; print(six.__version__)'")).strip() == "1.17.0"


def test_uv_pip_install_into_a_venv(sealed):
    ok(sealed.sh("uv venv /tmp/v2 && uv pip install --python /tmp/v2 tomli"))
    ok(sealed.sh("/tmp/v2/bin/python -c 'import tomli'"))
    # a venv in /tmp holds its files once: hardlinked with uv's cache on the same tmpfs
    # (copies filled the candidate's 1 GiB /tmp twice over with a scientific stack)
    links = ok(sealed.sh("stat -c %h /tmp/v2/lib/python3*/site-packages/tomli/__init__.py")).split()
    assert links and all(int(n) >= 2 for n in links), links


def test_uv_run_with_a_stored_package(sealed):
    assert ok(sealed.sh("uv run --with tomli python -c 'import tomli; print(\"ok\")'")).strip().endswith("ok")


def test_uv_run_with_the_usr_bin_python_that_ale_graders_name(sealed):
    """ALE's moodle_gradebook_closeout_reconciliation grades with `uv run --isolated
    --no-project --with pandas==2.2.3 --python /usr/bin/python`: Debian's python3 has
    no /usr/bin/python, so uv refused the interpreter and every answer scored 0."""
    out = ok(sealed.sh("uv run --isolated --no-project --with tomli --python /usr/bin/python "
                       "python -c 'import tomli, sys; print(sys.version_info[:2])'"))
    assert out.strip().endswith("(3, 11)")


def test_uv_sync_installs_the_locked_versions(sealed):
    ok(sealed.sh("cp -r /input/proj /workspace/proj && cd /workspace/proj && uv sync"))
    assert ok(sealed.sh("cd /workspace/proj && uv run python -c 'import six; print(six.__version__)'")).strip() == "1.16.0"


@pytest.mark.parametrize("sync", ["uv sync", "uv sync --frozen", "uv sync --locked"])
def test_uv_sync_of_the_read_only_project_as_ale_prompts_say(sealed, sync):
    """ALE's prompts: `uv sync [--frozen] --project input/runtime_env`, on the read-only
    input, with a lock naming PyPI: the image's project environment already holds it."""
    out = ok(sealed.sh(f"cd /workspace && {sync} --project /input/proj 2>&1"))
    assert "Checked" in out or "Audited" in out, out
    assert ok(sealed.sh("uv run --frozen --project /input/proj python -c 'import six; print(six.__version__)'")).strip() == "1.16.0"
    r = sealed.sh("test -e /input/proj/.venv")
    assert not r.ok  # nothing was written next to the project (it is read-only)


def test_the_project_environment_is_recorded_and_read_only(env, sealed):
    project = env[0].record["uv_project"]
    assert project["path"] == "/opt/ale/uv-project" and "six==1.16.0" in project["installed"], project
    r = sealed.sh("touch /opt/ale/uv-project/x")
    assert not r.ok


def test_a_package_not_in_the_store_does_not_install(sealed):
    r = sealed.sh("python3 -m venv /tmp/v4 && /tmp/v4/bin/pip install requests")
    assert not r.ok and "No matching distribution found for requests" in r.stderr.decode()
    r = sealed.sh("uv venv /tmp/v5 && uv pip install --python /tmp/v5 requests")
    assert not r.ok and "requests was not found" in r.stderr.decode(), r.stderr.decode()


def test_the_default_policy_installs_pure_python_and_syncs_in_the_workspace(sealed_default):
    """Under the default policy: pip, a venv in /tmp, uv sync in the workspace."""
    box = sealed_default
    assert "Requirement already satisfied: six" in ok(box.sh("pip install six"))
    ok(box.sh("python3 -m venv /tmp/v && /tmp/v/bin/python -m pip install six && /tmp/v/bin/python -c 'import six'"))
    ok(box.sh("cp -r /input/proj /workspace/proj && cd /workspace/proj && uv sync && uv run python -c 'import six'"))
    ok(box.sh("cd /workspace && uv sync --frozen --project /input/proj && uv run --frozen --project /input/proj python -c 'import six'"))


def test_the_default_policy_runs_uv_run_with_a_compiled_package(sealed_default):
    """The default /tmp is exec: a compiled package in uv's cache imports, a venv's pip runs."""
    ok(sealed_default.sh("uv run --with tomli python -c 'import tomli'"))
    ok(sealed_default.sh("python3 -m venv /tmp/v9 && /tmp/v9/bin/pip install tomli && /tmp/v9/bin/python -c 'import tomli'"))
