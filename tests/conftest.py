"""Shared fixtures: a Docker client, the tools image, and sealed test containers."""

from __future__ import annotations

import importlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

TOOLS_IMAGE = os.environ.get("ALE_IMAGE", "ale-tools:latest")
# The suite does not ask the package indexes (apt-cache, pip) about names the catalogue
# lacks: answers would vary with the machine. tests/test_provision_indexes.py asks them
# on purpose.
os.environ.setdefault("ALE_PACKAGE_INDEXES", "off")
# This session's VMs in a state folder of their own (short: unix socket paths are capped),
# so a test that asserts "no qemu left" sees its own, not another process's running beside it.
os.environ.setdefault("ALE_QEMU_STATE_DIR", f"/var/tmp/ale-qt-{os.getpid()}")
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "tasks"


# -- capabilities: skipped here, required in CI ---------------------------------------
# .ci/run exports ALE_CI=1: there a test that would skip for a missing capability
# (Docker, the desktop image, bubblewrap, the harness CLIs, a dev dependency) fails
# instead, so a green CI run has run them all. Locally it skips, saying why.
def in_ci() -> bool:
    return os.environ.get("ALE_CI") == "1"


def require(ok: object, why: str, *, allow_module_level: bool = False) -> None:
    """Skip (locally) or fail (under ALE_CI=1) unless ``ok``: for a capability this
    machine may lack. What the repository itself holds is never a capability: a
    missing committed fixture is a plain failure (``committed``)."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"CI lacks a capability this test needs: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=allow_module_level)


def require_module(name: str) -> Any:
    """``pytest.importorskip`` that fails under ALE_CI=1."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(False, f"needs the Python package {name!r} ({e})", allow_module_level=True)


def committed(*paths: Path) -> None:
    """Fail when a file the repository commits is missing: never a skip."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        pytest.fail(f"committed test files are missing: {missing}", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(ok, why): a capability; skipped locally without it, a failure under ALE_CI=1")
    config.addinivalue_line("markers", "committed(*paths): files the repository commits; missing, the test fails")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The suite does not depend on how its parent set the signals: started in the
    background (`.ci/run &`, `nohup`), SIGINT and SIGHUP arrive ignored, and every
    child (``ale run`` under test) would inherit that. The tests that want an ignored
    signal set it themselves."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def pytest_report_header(config: pytest.Config) -> list[str]:
    from tests.cannot_run_here import header

    return header()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    from tests.cannot_run_here import why_not_here

    why = why_not_here(item.nodeid)
    if why is not None:  # the one list, printed in the header: skipped even under ALE_CI=1
        pytest.skip(f"cannot run on this kind of machine (tests/cannot_run_here.py): {why}")
    for mark in item.iter_markers("committed"):
        committed(*mark.args)
    for mark in item.iter_markers("requires"):
        require(*mark.args, **mark.kwargs)


def _docker_client():
    try:
        import docker

        c = docker.from_env(timeout=120)
        c.ping()
        c.images.get(TOOLS_IMAGE)
        return c
    except Exception:
        return None


@pytest.fixture(scope="session")
def docker_client():
    c = _docker_client()
    if c is None and os.environ.get("CI"):
        pytest.fail(f"CI needs a Docker engine and the image {TOOLS_IMAGE} (run `make setup`)")
    require(c is not None, f"no Docker engine or no {TOOLS_IMAGE} image (run `make setup`)")
    return c


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path_factory, monkeypatch):
    """Keep signing keys and caches of tests out of the operator's folders."""
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("ALE_CONFIG_DIR", str(base / "ale-config"))
    monkeypatch.setenv("ALE_CACHE_DIR", str(base / "ale-cache"))
    # Tables (status, report) are laid out for the terminal; tests pin a width
    # so that none depends on the one it runs in. Errors are never wrapped.
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def label():
    """A unique label value for containers a test creates."""
    return f"test-{uuid.uuid4().hex[:10]}"


def our_containers(client, **labels) -> list:
    filters = ["ale.managed=1"] + [f"{k}={v}" for k, v in labels.items()]
    return client.containers.list(all=True, filters={"label": filters})


# The conformance checks live outside test modules; rewrite their asserts too.
pytest.register_assert_rewrite("tests.sandbox_conformance")


@pytest.fixture
def conformance_env(docker_client, tmp_path, label):
    """A ``ConformanceEnv`` on the Docker engine (its engine hooks use the client
    directly, never the provider). Teardown removes whatever carries the test's
    label and fails the test when anything was left behind."""
    from contextlib import suppress

    import docker.errors

    from ale.sandbox.policy import MIB, IsolationPolicy
    from tests.sandbox_conformance import INPUT_FILE, INPUT_TEXT, TEST_LABEL, ConformanceEnv

    inp = tmp_path / "input"
    inp.mkdir()
    (inp / INPUT_FILE).write_bytes(INPUT_TEXT)
    os.chmod(inp / INPUT_FILE, 0o666)
    os.chmod(inp, 0o777)  # only the read-only mount may stop a write
    api = docker_client.api
    selector = {"label": f"{TEST_LABEL}={label}"}

    def engine_names() -> set[str]:
        return {c["Names"][0].lstrip("/") for c in api.containers(all=True, filters=selector)}

    def engine_state(name: str) -> str | None:
        try:
            return api.inspect_container(name)["State"]["Status"]
        except docker.errors.NotFound:
            return None

    def vanish(name: str) -> None:
        with suppress(docker.errors.NotFound):
            api.remove_container(name, force=True, v=True)

    def make_foreign(name: str, labels: dict[str, str]) -> None:
        api.create_container(TOOLS_IMAGE, command=["sleep", "infinity"], name=name, labels=labels)

    env = ConformanceEnv(
        image=TOOLS_IMAGE,
        input_dir=inp,
        workspace_root=tmp_path / "workspaces",
        run_id=label,
        policy=IsolationPolicy(memory_bytes=512 * MIB),
        engine_names=engine_names,
        engine_state=engine_state,
        vanish=vanish,
        make_foreign=make_foreign,
    )
    yield env
    left = engine_names()
    for name in left:
        vanish(name)
    assert left == set(), f"the test left sandboxes behind: {sorted(left)}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The session's VM state folder, once empty (every test removes its VMs)."""
    import contextlib

    with contextlib.suppress(OSError):
        os.rmdir(os.environ["ALE_QEMU_STATE_DIR"])
