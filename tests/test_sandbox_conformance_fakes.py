"""The conformance suite catches lying providers.

Each test runs one check against an honest provider (it passes) and against a
provider that breaks exactly that part of the contract while reporting success
(the check fails with an AssertionError). The first group needs no Docker: an
in-memory engine, whose state the env reads directly. The second wraps the real
DockerProvider / DockerSandbox.
"""

from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from ale.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT,
    LABEL_EXPERIMENT,
    LABEL_MANAGED,
    LABEL_RUN,
    ExecResult,
    ImageMissing,
    SandboxError,
    SandboxGone,
    SandboxSpec,
)
from ale.sandbox.docker import DockerProvider, DockerSandbox
from ale.sandbox.policy import IsolationPolicy
from tests.sandbox_conformance import CHECKS, TEST_LABEL, ConformanceEnv, run_check

# -- the registry -------------------------------------------------------------------------

#: What the lifecycle relies on, by check name: the suite must keep covering it.
REQUIRED = {
    "lifecycle_states", "vanished_via_engine", "vanished_via_second_handle", "vanished_during_exec",
    "attach_existing", "attach_unknown_raises_gone", "create_missing_image", "engine_record",
    "remove_managed_selects_by_label", "exit_codes_and_streams", "exec_user", "exec_env",
    "exec_workdir", "stdin", "background_child_does_not_block", "stdout_cap", "stderr_cap",
    "output_cap_boundaries", "timeout_kills_group", "timeout_kills_escaped_descendants",
    "timed_out_semantics", "kill_user_processes", "kill_count_is_honest", "kill_then_run", "mounts",
}


def test_registry_covers_the_contract():
    assert not REQUIRED - set(CHECKS), REQUIRED - set(CHECKS)
    for name, fn in CHECKS.items():
        assert inspect.iscoroutinefunction(fn), name
        assert list(inspect.signature(fn).parameters) == ["provider", "env"], name


# -- an in-memory engine (no Docker) ------------------------------------------------------


@dataclass
class FakeEngine:
    images: set[str] = field(default_factory=lambda: {"fake-image:1"})
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {"labels", "state"}


class FakeSandbox:
    shares_host_filesystem = False

    def __init__(self, engine: FakeEngine, name: str):
        self.engine, self.name, self.id = engine, name, f"id-{name}"

    def inspect(self) -> dict[str, Any]:
        if self.name not in self.engine.containers:
            raise SandboxGone(self.name)
        return {"Id": self.id, "State": {"Status": self.engine.containers[self.name]["state"]}}

    async def remove(self) -> None:
        self.engine.containers.pop(self.name, None)


class FakeProvider:
    """Honest for what the Docker-free checks ask of it (create, attach, images,
    engine record, remove_managed); it cannot run commands."""

    name = "fake"

    def __init__(self, engine: FakeEngine):
        self.engine = engine

    def engine_record(self) -> dict[str, Any]:
        return {"version": {"Version": "0-fake"}}

    def image_inspect(self, image: str) -> dict[str, Any]:
        if image not in self.engine.images:
            raise ImageMissing(image)
        return {"Id": f"sha256:{image}"}

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        if spec.image not in self.engine.images:
            raise ImageMissing(spec.image)
        self.engine.containers[spec.name] = {"labels": {LABEL_MANAGED: "1", **spec.labels}, "state": "created"}
        return FakeSandbox(self.engine, spec.name)

    def attach(self, name_or_id: str, policy: IsolationPolicy) -> FakeSandbox:
        if name_or_id not in self.engine.containers:
            raise SandboxGone(name_or_id)
        return FakeSandbox(self.engine, name_or_id)

    def remove_managed(self, *, run_id: str | None = None, experiment: str | None = None) -> list[str]:
        want = {LABEL_MANAGED: "1"}
        if run_id:
            want[LABEL_RUN] = run_id
        if experiment:
            want[LABEL_EXPERIMENT] = experiment
        names = [n for n, c in self.engine.containers.items() if want.items() <= c["labels"].items()]
        for n in names:
            del self.engine.containers[n]
        return names


class AttachRaisesLibraryError(FakeProvider):
    def attach(self, name_or_id, policy):
        if name_or_id not in self.engine.containers:
            raise KeyError(name_or_id)  # the library's error escapes
        return super().attach(name_or_id, policy)


class MissingImageIsAGenericError(FakeProvider):
    async def create(self, spec):
        if spec.image not in self.engine.images:
            raise SandboxError(f"no such image {spec.image}")
        return await super().create(spec)


class MissingImageLeavesARecord(FakeProvider):
    async def create(self, spec):
        if spec.image not in self.engine.images:
            self.engine.containers[spec.name] = {"labels": {LABEL_MANAGED: "1", **spec.labels}, "state": "created"}
        return await super().create(spec)


class EngineRecordWithoutVersion(FakeProvider):
    def engine_record(self):
        return {"driver": "fake"}


class RemoveManagedIgnoresTheRun(FakeProvider):
    def remove_managed(self, *, run_id=None, experiment=None):
        return super().remove_managed(experiment=experiment)  # every run's sandboxes


class RemoveManagedRemovesForeign(FakeProvider):
    def remove_managed(self, *, run_id=None, experiment=None):
        names = [n for n, c in self.engine.containers.items()
                 if (not run_id or c["labels"].get(LABEL_RUN) == run_id)
                 and (not experiment or c["labels"].get(LABEL_EXPERIMENT) == experiment)]
        for n in names:
            del self.engine.containers[n]
        return names


@pytest.fixture
def fake_engine():
    return FakeEngine()


@pytest.fixture
def fake_env(fake_engine, tmp_path):
    run_id = f"fake-{uuid.uuid4().hex[:8]}"
    inp = tmp_path / "input"
    inp.mkdir()

    def names() -> set[str]:
        return {n for n, c in fake_engine.containers.items() if c["labels"].get(TEST_LABEL) == run_id}

    def make_foreign(name: str, labels: dict[str, str]) -> None:
        fake_engine.containers[name] = {"labels": dict(labels), "state": "created"}

    env = ConformanceEnv(
        image="fake-image:1",
        input_dir=inp,
        workspace_root=tmp_path / "ws",
        run_id=run_id,
        policy=IsolationPolicy(cpus=1.0),
        engine_names=names,
        engine_state=lambda n: (fake_engine.containers.get(n) or {}).get("state"),
        vanish=lambda n: fake_engine.containers.pop(n, None),
        make_foreign=make_foreign,
    )
    yield env
    assert names() == set(), f"left behind: {names()}"


@pytest.mark.parametrize(
    ("liar", "check_name"),
    [
        (AttachRaisesLibraryError, "attach_unknown_raises_gone"),
        (MissingImageIsAGenericError, "create_missing_image"),
        (MissingImageLeavesARecord, "create_missing_image"),
        (EngineRecordWithoutVersion, "engine_record"),
        (RemoveManagedIgnoresTheRun, "remove_managed_selects_by_label"),
        (RemoveManagedRemovesForeign, "remove_managed_selects_by_label"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_fake_liar_fails_the_check(liar, check_name, fake_engine, fake_env):
    run_check(check_name, FakeProvider(fake_engine), fake_env)
    with pytest.raises(AssertionError):
        run_check(check_name, liar(fake_engine), fake_env)
    for name in list(fake_env.engine_names()):  # what the liar left
        fake_engine.containers.pop(name)


# -- lying wrappers around the real docker provider ---------------------------------------


class _Wrapping(DockerProvider):
    sandbox_class: type[DockerSandbox] = DockerSandbox

    async def create(self, spec):
        sb = await super().create(spec)
        return self.sandbox_class(sb.client, sb.container, sb.policy)

    def attach(self, name_or_id, policy):
        sb = super().attach(name_or_id, policy)
        return self.sandbox_class(sb.client, sb.container, sb.policy)


class KillReportsZeroWithoutKilling(DockerSandbox):
    async def kill_user_processes_then(self, argv, *, timeout=60):
        if argv is None:
            return 0, None
        return 0, await self.exec(argv, user=self.policy.user, timeout=timeout, wrap_timeout=False)


class RunsArgvBeforeTheKill(DockerSandbox):
    async def kill_user_processes_then(self, argv, *, timeout=60):
        r = await self.exec(argv, user=self.policy.user, timeout=timeout, wrap_timeout=False) if argv else None
        n, _ = await DockerSandbox.kill_user_processes_then(self, None)
        return n, r


class LeaksTheCountLine(DockerSandbox):
    async def kill_user_processes_then(self, argv, *, timeout=60):
        n, r = await super().kill_user_processes_then(argv, timeout=timeout)
        if r is not None:
            r.stdout = f"{n}\n".encode() + r.stdout
        return n, r


class TimeoutSparesDescendants(DockerSandbox):
    async def _kill_tagged(self, *_args, **_kw):
        return None  # only coreutils `timeout`'s process-group kill remains


class NoOutputCap(DockerSandbox):
    async def exec(self, argv, *, output_limit=DEFAULT_OUTPUT_LIMIT, **kw) -> ExecResult:
        return await super().exec(argv, output_limit=1 << 40, **kw)


class CapWithoutTruncationFlags(DockerSandbox):
    async def exec(self, argv, **kw) -> ExecResult:
        r = await super().exec(argv, **kw)
        r.stdout_truncated = r.stderr_truncated = False
        return r


class IgnoresExecUser(DockerSandbox):
    async def exec(self, argv, *, user=None, **kw) -> ExecResult:
        return await super().exec(argv, **kw)


class LetsLibraryErrorsEscape(DockerSandbox):
    async def exec(self, argv, **kw) -> ExecResult:
        self.container.reload()  # docker.errors.NotFound once the container is gone
        return await super().exec(argv, **kw)


DOCKER_LIARS = [
    (KillReportsZeroWithoutKilling, ["kill_user_processes", "kill_count_is_honest", "kill_then_run"]),
    (RunsArgvBeforeTheKill, ["kill_then_run"]),
    (LeaksTheCountLine, ["kill_then_run"]),
    (TimeoutSparesDescendants, ["timeout_kills_escaped_descendants"]),
    (NoOutputCap, ["stdout_cap", "stderr_cap"]),
    (CapWithoutTruncationFlags, ["output_cap_boundaries"]),
    (IgnoresExecUser, ["exec_user"]),
    (LetsLibraryErrorsEscape, ["vanished_via_engine"]),
]


@pytest.mark.docker
@pytest.mark.parametrize(("liar", "check_names"), DOCKER_LIARS, ids=[c.__name__ for c, _ in DOCKER_LIARS])
def test_docker_liar_fails_the_check(liar, check_names, docker_client, conformance_env):
    honest = DockerProvider(docker_client)
    lying = type(f"{liar.__name__}Provider", (_Wrapping,), {"sandbox_class": liar})(docker_client)
    for name in check_names:
        run_check(name, honest, conformance_env)
        with pytest.raises(AssertionError):
            run_check(name, lying, conformance_env)


@pytest.mark.docker
def test_a_spared_descendant_is_what_fails(docker_client, conformance_env):
    """The group kill alone still passes the group check: the failure above is
    about the escaped descendants, not a broken timeout."""
    lying = type("P", (_Wrapping,), {"sandbox_class": TimeoutSparesDescendants})(docker_client)
    run_check("timeout_kills_group", lying, conformance_env)

