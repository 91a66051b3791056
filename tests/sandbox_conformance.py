"""The conformance suite every sandbox provider must pass (docker today; any later one too).

Each check is ``async def check_x(provider, env)`` registered in ``CHECKS`` under
its name (``x``). A check creates the sandboxes it needs through
``provider.create(SandboxSpec(...))`` (``env.spec()`` builds one), removes them
again, and raises ``AssertionError`` when the provider breaks the contract in
``ale.sandbox.base``. Run one with ``run_check(name, provider, env)``.

A check never takes the provider's word for what it claims to have done: kill
counts and timeouts are verified by reading ``/proc`` in a separate exec, output
caps against output of known size and content, lifecycle states and leftovers
through the engine's own view (``ConformanceEnv.engine_state`` /
``engine_names``, which must not go through the provider), and every wall-clock
bound with the check's own clock (never ``ExecResult.duration_s``).

The image must have ``sh``, coreutils and ``python3`` (the tools image has).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT,
    LABEL_EXPERIMENT,
    LABEL_RUN,
    ExecResult,
    ImageMissing,
    Mount,
    Sandbox,
    SandboxError,
    SandboxGone,
    SandboxProvider,
    SandboxSpec,
)
from ale.sandbox.policy import IsolationPolicy

#: Every sandbox a check creates carries this label (value: the test's run id), so
#: that a test can list what it left behind whatever run id a sandbox has.
TEST_LABEL = "ale.test"
INPUT_FILE = "data.txt"
INPUT_TEXT = b"conformance input\n"
MISSING_IMAGE = "ale-conformance-no-such-image:nope"
#: A bound on one check, so that a hanging provider fails instead of blocking CI.
CHECK_TIMEOUT_S = 120.0
#: "Returns within a few seconds of the deadline" (base.Sandbox.exec), as a number.
TIMEOUT_SLACK_S = 7.0

Check = Callable[[SandboxProvider, "ConformanceEnv"], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    """Register ``check_<name>`` as ``CHECKS[<name>]``."""
    name = fn.__name__.removeprefix("check_")
    assert name not in CHECKS, f"duplicate conformance check {name}"
    CHECKS[name] = fn
    return fn


def run_check(name: str, provider: SandboxProvider, env: ConformanceEnv) -> None:
    """Run one check to completion (bounded by ``CHECK_TIMEOUT_S``)."""
    asyncio.run(asyncio.wait_for(CHECKS[name](provider, env), CHECK_TIMEOUT_S))


@dataclass
class ConformanceEnv:
    """What a check needs besides the provider; the engine hooks bypass the provider.

    - ``input_dir``: host folder mounted read-only at /input; holds ``INPUT_FILE``
      (``INPUT_TEXT``) and is world-writable on the host, so that only the
      read-only mount stops a write.
    - ``workspace_root``: fresh, empty workspaces (rw at /workspace, owned by the
      policy's uid:gid) are made under it, one per sandbox.
    - ``engine_names()``: names of the sandboxes carrying ``TEST_LABEL=run_id``
      (created or running, managed or not), as the engine lists them.
    - ``engine_state(name)``: the engine's state of one sandbox ("created",
      "running", "exited", ...) or None when the engine has no such sandbox.
    - ``vanish(name)``: remove a sandbox behind the harness's back, with the engine.
    - ``make_foreign(name, labels)``: create a sandbox the provider did not create
      (no ``ale.managed`` label) with these labels.
    """

    image: str
    input_dir: Path
    workspace_root: Path
    run_id: str
    policy: IsolationPolicy
    engine_names: Callable[[], set[str]]
    engine_state: Callable[[str], str | None]
    vanish: Callable[[str], None] | None = None
    make_foreign: Callable[[str, dict[str, str]], None] | None = None
    _made: int = field(default=0, repr=False)

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_RUN: self.run_id, TEST_LABEL: self.run_id}

    def new_name(self) -> str:
        self._made += 1
        return f"ale-{self.run_id}-{self._made}"

    def new_workspace(self) -> Path:
        self._made += 1
        ws = self.workspace_root / f"ws-{self._made}"
        ws.mkdir(parents=True)
        os.chown(ws, self.policy.uid, self.policy.gid)
        return ws

    def spec(
        self,
        *,
        image: str | None = None,
        labels: dict[str, str] | None = None,
        environment: dict[str, str] | None = None,
    ) -> SandboxSpec:
        return SandboxSpec(
            name=self.new_name(),
            image=image or self.image,
            policy=self.policy,
            mounts=(
                Mount(str(self.input_dir), "/input", True),
                Mount(str(self.new_workspace()), "/workspace", False),
            ),
            workdir="/workspace",
            labels={**self.labels, **(labels or {})},
            environment=dict(environment or {}),
        )


def workspace_of(spec: SandboxSpec) -> Path:
    return Path(next(m.source for m in spec.mounts if m.target == "/workspace"))


@asynccontextmanager
async def running(
    provider: SandboxProvider, env: ConformanceEnv, spec: SandboxSpec | None = None, *, start: bool = True
) -> AsyncIterator[Sandbox]:
    """A sandbox for the duration of a check; removed however the check ends."""
    sb = await provider.create(spec or env.spec())
    try:
        if start:
            await sb.start()
        yield sb
    finally:
        with suppress(SandboxError):
            await sb.remove()


async def expect_raises(kinds: type[BaseException] | tuple[type[BaseException], ...], aw: Awaitable[Any], what: str) -> BaseException:
    """Await ``aw``; an AssertionError unless it raises one of ``kinds`` (a
    provider-library error escaping is a failure of the check, not a crash)."""
    try:
        value = await aw
    except kinds as e:
        return e
    except Exception as e:
        raise AssertionError(f"{what}: raised {type(e).__module__}.{type(e).__name__} ({e}), expected {kinds}") from e
    raise AssertionError(f"{what}: returned {value!r}, expected it to raise {kinds}")


def raises_sync(kinds: type[BaseException] | tuple[type[BaseException], ...], fn: Callable[[], Any], what: str) -> BaseException:
    """``expect_raises`` for a plain call."""
    try:
        value = fn()
    except kinds as e:
        return e
    except Exception as e:
        raise AssertionError(f"{what}: raised {type(e).__module__}.{type(e).__name__} ({e}), expected {kinds}") from e
    raise AssertionError(f"{what}: returned {value!r}, expected it to raise {kinds}")


# -- independent views from inside the sandbox ----------------------------------------

#: Lists every live process but PID 1 and the lister's own ancestry (whatever
#: wrapper the provider runs it under), as JSON after a marker line.
LISTER_MARK = "ale-conformance-processes"
_LISTER = r"""
import json, os
skip = {1}
p = os.getpid()
while p > 0 and p not in skip:
    skip.add(p)
    with open(f"/proc/{p}/stat") as f:
        p = int(f.read().rsplit(")", 1)[1].split()[1])
found = []
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) in skip:
        continue
    try:
        with open(f"/proc/{d}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{d}/status") as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        with open(f"/proc/{d}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, StopIteration, ValueError):
        continue  # exited while we looked
    if state not in ("Z", "X"):
        found.append({"pid": int(d), "uid": uid, "state": state, "cmd": cmd})
print("MARK")
print(json.dumps(found))
""".replace("MARK", LISTER_MARK)
LISTER_ARGV = ["python3", "-c", _LISTER]


def parse_listing(r: ExecResult, what: str) -> list[dict[str, Any]]:
    lines = r.stdout.decode(errors="replace").splitlines()
    assert r.exit_code == 0 and len(lines) == 2 and lines[0] == LISTER_MARK, (
        f"{what}: the process lister did not run cleanly: exit {r.exit_code}, "
        f"stdout {r.stdout[:300]!r}, stderr {r.stderr[:300]!r}"
    )
    return json.loads(lines[1])


async def live_processes(sb: Sandbox) -> list[dict[str, Any]]:
    """Every live process in the sandbox but PID 1 and the lister (read from /proc)."""
    return parse_listing(await sb.exec(LISTER_ARGV, timeout=30), "process listing")


async def assert_no_processes(sb: Sandbox, what: str, *, grace_s: float = 0.0) -> None:
    """Nothing but PID 1 is alive (after up to ``grace_s`` for SIGKILLed processes to exit)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = await live_processes(sb)
        if not left or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    assert left == [], f"{what}: processes still alive: {left}"


async def start_background(sb: Sandbox, script: str, *, expect_at_least: int, user: str | None = None) -> list[dict[str, Any]]:
    """Leave processes behind (output to /dev/null: nothing holds the exec stream)
    and make sure they are really alive, so that a later "all dead" is not vacuous."""
    r = await sb.exec(["sh", "-c", script], user=user, timeout=30)
    assert r.exit_code == 0, f"could not start background processes: {r}"
    deadline = time.monotonic() + 5
    while True:
        alive = await live_processes(sb)
        if len(alive) >= expect_at_least or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert len(alive) >= expect_at_least, f"setup: expected {expect_at_least} live processes, saw {alive}"
    return alive


#: Processes that try to outlive a kill: a respawning loop, a new session, a
#: double fork into a new session, one that ignores TERM/HUP/INT, one with an
#: empty environment. All output goes to /dev/null.
_STUBBORN = (
    "nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 & "
    "setsid sleep 100 >/dev/null 2>&1 & "
    "(setsid sh -c 'sleep 101 & wait' >/dev/null 2>&1 &) ; "
    "sh -c \"trap '' TERM HUP INT; sleep 102\" >/dev/null 2>&1 & "
    "env -i setsid sleep 103 >/dev/null 2>&1 & "
    "true"
)
_STUBBORN_COUNT = 6  # the loop, sleep 100, sh + sleep 101, the TERM-ignoring sleep, the env -i sleep


def pattern(n: int) -> bytes:
    """The first ``n`` bytes that ``yes 0123456789abcdef`` prints."""
    line = b"0123456789abcdef\n"
    return (line * (n // len(line) + 1))[:n]


def pattern_cmd(n: int) -> str:
    return f"yes 0123456789abcdef | head -c {n}"


# -- lifecycle --------------------------------------------------------------------------


def _status(sb: Sandbox) -> str | None:
    return (sb.inspect().get("State") or {}).get("Status")


@check
async def check_lifecycle_states(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """created → running → exited → removed, as inspect() and the engine both say;
    stop() and remove() idempotent; a removed sandbox raises SandboxGone."""
    spec = env.spec()
    sb = await provider.create(spec)
    try:
        assert sb.name == spec.name and sb.id, f"handle names {sb.name!r} / {sb.id!r}, spec {spec.name!r}"
        assert isinstance(sb.shares_host_filesystem, bool)
        assert env.engine_state(spec.name) == "created", env.engine_state(spec.name)
        assert _status(sb) == "created", _status(sb)

        await sb.start()
        assert env.engine_state(spec.name) == "running", env.engine_state(spec.name)
        assert _status(sb) == "running", _status(sb)
        await assert_no_processes(sb, "a fresh sandbox")

        await sb.stop()
        assert env.engine_state(spec.name) == "exited", env.engine_state(spec.name)
        assert _status(sb) == "exited", _status(sb)
        await sb.stop()  # idempotent
        assert env.engine_state(spec.name) == "exited"
        await expect_raises(SandboxError, sb.exec(["true"], timeout=10), "exec in a stopped sandbox")
    finally:
        await sb.remove()
    assert env.engine_state(spec.name) is None, "remove() left the sandbox in the engine"
    assert spec.name not in env.engine_names()
    await sb.remove()  # idempotent
    await sb.stop()  # a gone sandbox is not an error
    raises_sync(SandboxGone, sb.inspect, "inspect() after remove()")
    await expect_raises(SandboxGone, sb.exec(["true"], timeout=10), "exec after remove()")
    await expect_raises(SandboxGone, sb.start(), "start() after remove()")


async def _check_gone(sb: Sandbox, env: ConformanceEnv, how: str) -> None:
    assert env.engine_state(sb.name) is None, f"{how}: the engine still has {sb.name}"
    await expect_raises(SandboxGone, sb.exec(["true"], timeout=10), f"exec after {how}")
    raises_sync(SandboxGone, sb.inspect, f"inspect() after {how}")
    # The kill may report -1 (cannot count) or raise, but only a SandboxError.
    try:
        n = await sb.kill_user_processes()
    except SandboxError:
        pass
    except Exception as e:
        raise AssertionError(f"kill_user_processes after {how} raised {type(e).__name__}: {e}") from e
    else:
        assert n == -1, f"kill_user_processes after {how} reported {n} processes left"
    for method in ("stop", "remove"):
        try:
            await getattr(sb, method)()
        except Exception as e:
            raise AssertionError(f"{method}() after {how} raised {type(e).__name__}: {e}") from e


@check
async def check_vanished_via_engine(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """Removed with the engine behind the harness's back: SandboxGone, not a library error."""
    from tests.conftest import require

    require(env.vanish is not None, "this environment cannot remove a sandbox behind the provider's back")
    async with running(provider, env) as sb:
        env.vanish(sb.name)
        await _check_gone(sb, env, "removal with the engine")


@check
async def check_vanished_via_second_handle(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """Removed through a second handle from attach(): the first handle sees SandboxGone."""
    async with running(provider, env) as sb:
        other = provider.attach(sb.name, env.policy)
        await other.remove()
        await _check_gone(sb, env, "removal through a second handle")


@check
async def check_vanished_during_exec(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """A sandbox removed while a command runs: exec raises SandboxGone promptly."""
    async with running(provider, env) as sb:
        other = provider.attach(sb.name, env.policy)

        async def remove_soon() -> None:
            await asyncio.sleep(0.5)
            await other.remove()

        t0 = time.monotonic()
        remover = asyncio.ensure_future(remove_soon())
        try:
            await expect_raises(SandboxGone, sb.exec(["sleep", "60"], timeout=90), "exec while the sandbox is removed")
        finally:
            await remover
        assert time.monotonic() - t0 < 10, f"exec took {time.monotonic() - t0:.1f}s to notice the sandbox was gone"


@check
async def check_attach_existing(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """attach() gives a working handle on the same sandbox."""
    async with running(provider, env) as sb:
        other = provider.attach(sb.name, env.policy)
        assert other.id == sb.id and other.name == sb.name, (other.id, other.name, sb.id, sb.name)
        r = await other.exec(["sh", "-c", "echo attached > /workspace/attached"], timeout=30)
        assert r.exit_code == 0, r
        r = await sb.exec(["cat", "/workspace/attached"], timeout=30)
        assert r.stdout == b"attached\n", r
        assert _status(other) == "running"
        assert provider.attach(sb.id, env.policy).name == sb.name, "attach() by id"


@check
async def check_attach_unknown_raises_gone(provider: SandboxProvider, env: ConformanceEnv) -> None:
    raises_sync(SandboxGone, lambda: provider.attach(f"ale-{env.run_id}-never-created", env.policy), "attach(unknown)")


@check
async def check_create_missing_image(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """ImageMissing (a SandboxError) and nothing left behind; image_inspect agrees."""
    before = env.engine_names()
    spec = env.spec(image=MISSING_IMAGE)
    e = await expect_raises(ImageMissing, provider.create(spec), "create() with a missing image")
    assert isinstance(e, SandboxError)
    assert env.engine_state(spec.name) is None and env.engine_names() == before, (
        f"create() with a missing image left {env.engine_names() - before}"
    )
    raises_sync(ImageMissing, lambda: provider.image_inspect(MISSING_IMAGE), "image_inspect(missing)")
    found = provider.image_inspect(env.image)
    assert isinstance(found, dict) and found.get("Id"), f"image_inspect({env.image!r}) = {found!r}"


@check
async def check_engine_record(provider: SandboxProvider, env: ConformanceEnv) -> None:
    record = provider.engine_record()
    assert isinstance(record, dict) and record.get("version"), f"engine_record() = {record!r}"
    json.dumps(record)  # stored as evidence
    assert isinstance(provider.name, str) and provider.name


@check
async def check_remove_managed_selects_by_label(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """remove_managed(run_id=...) / (experiment=...) remove exactly the matching
    managed sandboxes; another run's and an unmanaged one stay."""
    other_run = f"{env.run_id}-other"
    e1, e2 = f"{env.run_id}-e1", f"{env.run_id}-e2"
    specs = {
        "a1": env.spec(labels={LABEL_EXPERIMENT: e1}),
        "a2": env.spec(labels={LABEL_EXPERIMENT: e2}),
        "b": env.spec(labels={LABEL_RUN: other_run, LABEL_EXPERIMENT: e1}),
    }
    made: list[Sandbox] = []
    foreign = None
    try:
        for spec in specs.values():
            made.append(await provider.create(spec))
        if env.make_foreign is not None:
            foreign = env.new_name()
            env.make_foreign(foreign, {**env.labels, LABEL_EXPERIMENT: e1})
        name = {k: s.name for k, s in specs.items()}
        everything = set(name.values()) | ({foreign} if foreign else set())
        assert env.engine_names() == everything, (env.engine_names(), everything)

        removed = provider.remove_managed(experiment=e2)
        assert set(removed) == {name["a2"]}, f"remove_managed(experiment=e2) removed {removed}"
        assert env.engine_names() == everything - {name["a2"]}, env.engine_names()

        removed = provider.remove_managed(run_id=env.run_id)
        assert set(removed) == {name["a1"]}, f"remove_managed(run_id) removed {removed}"
        assert env.engine_names() == everything - {name["a1"], name["a2"]}, env.engine_names()

        removed = provider.remove_managed(run_id=other_run)
        assert set(removed) == {name["b"]}, f"remove_managed(run_id=other) removed {removed}"
        assert env.engine_names() == ({foreign} if foreign else set()), env.engine_names()
        assert provider.remove_managed(run_id=env.run_id) == []
    finally:
        for sb in made:
            with suppress(SandboxError):
                await sb.remove()
        if foreign and env.vanish is not None:
            env.vanish(foreign)


# -- exec -------------------------------------------------------------------------------


@check
async def check_exit_codes_and_streams(provider: SandboxProvider, env: ConformanceEnv) -> None:
    async with running(provider, env) as sb:
        r = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=30)
        assert isinstance(r, ExecResult), r
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.ok) == (7, b"out\n", b"err\n", False, False), r
        r = await sb.exec(["true"])
        assert r.exit_code == 0 and r.ok and not r.timed_out, r
        r = await sb.exec(["false"], timeout=30)
        assert r.exit_code == 1 and not r.ok, r
        for kw in ({}, {"timeout": 30.0}):
            r = await sb.exec(["/no/such/program"], **kw)
            assert r.exit_code not in (0, -1) and not r.timed_out, f"missing program {kw}: {r}"


@check
async def check_exec_user(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """The default user is the policy's (never root); an explicit user is honoured."""
    async with running(provider, env) as sb:
        r = await sb.exec(["sh", "-c", "id -u; id -g"], timeout=30)
        assert r.stdout == f"{env.policy.uid}\n{env.policy.gid}\n".encode(), r
        assert env.policy.uid != 0
        r = await sb.exec(["sh", "-c", "id -u; id -g"], user="1234:2345", timeout=30)
        assert r.stdout == b"1234\n2345\n", r
        r = await sb.exec(["sh", "-c", "echo $(id -u) > /workspace/who"], timeout=30)
        assert r.exit_code == 0, r
        r = await sb.exec(["stat", "-c", "%u:%g", "/workspace/who"], timeout=30)
        assert r.stdout.strip() == env.policy.user.encode(), r


@check
async def check_exec_env(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """exec's env is added to the sandbox's environment, for that call only."""
    spec = env.spec(environment={"ALE_CONF_SPEC": "from the spec"})
    async with running(provider, env, spec) as sb:
        argv = ["sh", "-c", 'printf "%s|%s|%s" "$ALE_CONF_SPEC" "${ALE_CONF_EXTRA-unset}" "${ALE_CONF_OTHER-unset}"']
        r = await sb.exec(argv, env={"ALE_CONF_EXTRA": "a b=c", "ALE_CONF_OTHER": ""}, timeout=30)
        assert r.stdout == b"from the spec|a b=c|", r
        r = await sb.exec(["printenv", "ALE_CONF_EXTRA"], env={"ALE_CONF_EXTRA": "x"})
        assert r.stdout == b"x\n", r
        r = await sb.exec(argv, timeout=30)
        assert r.stdout == b"from the spec|unset|unset", f"exec env leaked into a later call: {r}"


@check
async def check_exec_workdir(provider: SandboxProvider, env: ConformanceEnv) -> None:
    async with running(provider, env) as sb:
        r = await sb.exec(["pwd"], timeout=30)
        assert r.stdout == b"/workspace\n", f"default workdir: {r}"
        for wd in ("/input", "/tmp", "/"):
            r = await sb.exec(["pwd"], workdir=wd, timeout=30)
            assert r.stdout == f"{wd}\n".encode(), f"workdir={wd}: {r}"
        r = await sb.exec(["sh", "-c", "cat " + INPUT_FILE], workdir="/input")
        assert r.stdout == INPUT_TEXT, r


@check
async def check_stdin(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """stdin is passed whole; without stdin a reader sees end-of-file at once."""
    data = os.urandom(256 * 1024)
    async with running(provider, env) as sb:
        r = await sb.exec(["sha256sum"], stdin=data, timeout=30)
        assert r.exit_code == 0 and r.stdout.split()[:1] == [hashlib.sha256(data).hexdigest().encode()], r
        r = await sb.exec(["sh", "-c", "cat > /workspace/in && wc -c < /workspace/in"], stdin=data, timeout=30)
        assert r.stdout.strip() == str(len(data)).encode(), r
        r = await sb.exec(["cat"], stdin=b"small\n", timeout=30)
        assert r.stdout == b"small\n", r
        for stdin in (None, b""):
            t0 = time.monotonic()
            r = await sb.exec(["cat"], stdin=stdin, timeout=20)
            assert r.exit_code == 0 and r.stdout == b"" and not r.timed_out, f"stdin={stdin!r}: {r}"
            assert time.monotonic() - t0 < 5, f"stdin={stdin!r}: cat waited {time.monotonic() - t0:.1f}s for input"


@check
async def check_stdin_with_echoed_output(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """A command that echoes a large stdin while reading it neither deadlocks nor
    loses data (output is read while stdin is still being written)."""
    data = os.urandom(8 * 1024 * 1024)
    async with running(provider, env) as sb:
        t0 = time.monotonic()
        r = await sb.exec(["cat"], stdin=data, timeout=5, output_limit=16 * 1024 * 1024)
        took = time.monotonic() - t0
        assert not r.timed_out and r.exit_code == 0, (
            f"cat of {len(data)} bytes of stdin: exit {r.exit_code}, timed_out {r.timed_out}, "
            f"{len(r.stdout)} bytes out after {took:.1f}s"
        )
        assert len(r.stdout) == len(data) and r.stdout == data and not r.stdout_truncated, len(r.stdout)
        r = await sb.exec(["cat"], stdin=data, timeout=5, output_limit=1000)
        assert r.exit_code == 0 and not r.timed_out, r
        assert r.stdout == data[:1000] and r.stdout_truncated, len(r.stdout)


@check
async def check_background_child_does_not_block(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """A child that holds stdout/stderr open does not delay the return."""
    # One sandbox per variant: some engines delay the *next* exec while a child
    # still holds an earlier exec's stream.
    for timeout, redirect in ((None, ""), (30.0, ">&2")):
        async with running(provider, env) as sb:
            t0 = time.monotonic()
            r = await sb.exec(["sh", "-c", f"sleep 20 {redirect} & echo started; exit 4"], timeout=timeout)
            took = time.monotonic() - t0
            assert took < 3, f"timeout={timeout}: returned after {took:.1f}s"
            assert r.stdout == b"started\n" and r.exit_code == 4 and not r.timed_out, f"timeout={timeout}: {r}"


def _assert_capped(r: ExecResult, *, out: int | None, err: int | None, limit: int, what: str) -> None:
    """``out``/``err``: bytes the command wrote to that stream (pattern() content)."""
    for stream, wrote, got, truncated in (
        ("stdout", out, r.stdout, r.stdout_truncated),
        ("stderr", err, r.stderr, r.stderr_truncated),
    ):
        if wrote is None:
            continue
        want = pattern(min(wrote, limit))
        assert len(got) == len(want), f"{what}: {stream} has {len(got)} bytes, expected {len(want)} (limit {limit}, wrote {wrote})"
        assert got == want, f"{what}: {stream} is not the first {len(want)} bytes written"
        assert truncated == (wrote > limit), f"{what}: {stream}_truncated={truncated} after writing {wrote} with limit {limit}"


@check
async def check_stdout_cap(provider: SandboxProvider, env: ConformanceEnv) -> None:
    async with running(provider, env) as sb:
        t0 = time.monotonic()
        r = await sb.exec(["sh", "-c", f"{pattern_cmd(5_000_000)}; {pattern_cmd(100)} >&2; exit 3"], output_limit=1000, timeout=60)
        assert time.monotonic() - t0 < 15, "the capped output was not drained"
        assert r.exit_code == 3 and not r.timed_out, f"exit {r.exit_code}, timed_out {r.timed_out}"
        _assert_capped(r, out=5_000_000, err=100, limit=1000, what="stdout over the cap")


@check
async def check_stderr_cap(provider: SandboxProvider, env: ConformanceEnv) -> None:
    async with running(provider, env) as sb:
        t0 = time.monotonic()
        r = await sb.exec(["sh", "-c", f"{pattern_cmd(5_000_000)} >&2; {pattern_cmd(100)}; exit 5"], output_limit=1000, timeout=60)
        assert time.monotonic() - t0 < 15, "the capped output was not drained"
        assert r.exit_code == 5 and not r.timed_out, f"exit {r.exit_code}, timed_out {r.timed_out}"
        _assert_capped(r, out=100, err=5_000_000, limit=1000, what="stderr over the cap")


@check
async def check_output_cap_boundaries(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """Exactly the limit is not truncated; one byte more is; both streams at once;
    the default limit is DEFAULT_OUTPUT_LIMIT."""
    async with running(provider, env) as sb:
        r = await sb.exec(["sh", "-c", f"{pattern_cmd(4096)}; {pattern_cmd(4097)} >&2"], output_limit=4096, timeout=60)
        assert r.exit_code == 0, r.exit_code
        _assert_capped(r, out=4096, err=4097, limit=4096, what="limit / limit+1")
        r = await sb.exec(["sh", "-c", f"{pattern_cmd(300_000)} >&2 & {pattern_cmd(300_000)}; wait; exit 9"], output_limit=777, timeout=60)
        assert r.exit_code == 9, r.exit_code
        _assert_capped(r, out=300_000, err=300_000, limit=777, what="both streams over the cap")
        n = DEFAULT_OUTPUT_LIMIT + 1
        r = await sb.exec(["sh", "-c", pattern_cmd(n)], timeout=60)
        _assert_capped(r, out=n, err=0, limit=DEFAULT_OUTPUT_LIMIT, what="default limit")


# -- timeouts and kills -----------------------------------------------------------------


async def _timed_out_exec(sb: Sandbox, script: str, timeout: float = 1.0) -> ExecResult:
    t0 = time.monotonic()
    r = await sb.exec(["sh", "-c", script], timeout=timeout)
    took = time.monotonic() - t0
    assert r.timed_out and not r.ok, f"a command past its {timeout}s timeout: timed_out={r.timed_out}, exit {r.exit_code}"
    assert took < timeout + TIMEOUT_SLACK_S, f"returned {took:.1f}s after the start (timeout {timeout}s)"
    return r


@check
async def check_timeout_kills_group(provider: SandboxProvider, env: ConformanceEnv) -> None:
    async with running(provider, env) as sb:
        await _timed_out_exec(sb, "sleep 30 & sleep 31 >/dev/null & sh -c 'sleep 32'; echo never")
        await assert_no_processes(sb, "after a timeout", grace_s=1)


@check
async def check_timeout_kills_escaped_descendants(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """Descendants that left the process group (setsid, double fork into a new
    session, ignoring TERM) die with the timed-out command, even holding its stdout."""
    script = (
        "setsid sh -c 'sleep 31' & "
        "(setsid sh -c 'sleep 32 & wait' &) ; "
        "(setsid sh -c 'sleep 33' >/dev/null 2>&1 &) ; "
        "setsid sh -c \"trap '' TERM HUP INT; sleep 34\" >/dev/null 2>&1 & "
        "sleep 30"
    )
    async with running(provider, env) as sb:
        await _timed_out_exec(sb, script)
        await assert_no_processes(sb, "after a timeout with escaped descendants", grace_s=1)


@check
async def check_timeout_kills_env_cleared_descendants(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """Descendants that left the group *and* cleared their environment die too."""
    script = (
        "setsid env -i sh -c 'sleep 35' >/dev/null 2>&1 & "
        "(env -i setsid sleep 36 >/dev/null 2>&1 &) ; "
        "sleep 30"
    )
    async with running(provider, env) as sb:
        await _timed_out_exec(sb, script)
        await assert_no_processes(sb, "after a timeout with env-cleared escaped descendants", grace_s=1)


@check
async def check_timed_out_semantics(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """timed_out only when the deadline killed the command; output before it is kept."""
    async with running(provider, env) as sb:
        r = await _timed_out_exec(sb, "echo before; echo before-err >&2; sleep 30; echo after")
        assert r.stdout == b"before\n" and r.stderr == b"before-err\n", r
        for script, code in (("exit 124", 124), ("kill -9 $$", None), ("sleep 1.5; exit 0", 0)):
            r = await sb.exec(["sh", "-c", script], timeout=20)
            assert not r.timed_out, f"{script!r} within its timeout reported timed_out: {r}"
            if code is None:
                assert r.exit_code != 0, r
            else:
                assert r.exit_code == code, r
        r = await sb.exec(["sleep", "0.2"])
        assert not r.timed_out and r.ok, r


@check
async def check_kill_user_processes(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """Returns 0, and /proc (read separately) agrees: nothing but PID 1 is left."""
    async with running(provider, env) as sb:
        await start_background(sb, _STUBBORN, expect_at_least=_STUBBORN_COUNT)
        t0 = time.monotonic()
        n = await sb.kill_user_processes()
        took = time.monotonic() - t0
        assert n == 0, f"kill_user_processes() reported {n} left"
        await assert_no_processes(sb, "after kill_user_processes() returned 0")
        assert took < 5, f"kill_user_processes() took {took:.1f}s"
        assert await sb.kill_user_processes() == 0, "nothing left to kill"
        r = await sb.exec(["echo", "still usable"], timeout=30)
        assert r.stdout == b"still usable\n", r


def _cgroup_listing(path: str | None) -> str:
    """What the cgroup a halt acted on holds now (its processes, their names and uids)."""
    if not path:
        return "no cgroup"
    try:
        pids = Path(path, "cgroup.procs").read_text().split()
    except OSError as e:
        return f"{path}: {e}"
    rows = []
    for pid in pids:
        try:
            st = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln)
            rows.append(f"{pid}:{st.get('Name', '').strip()}:{st.get('Uid', '').split()[:1]}:{st.get('State', '').strip()[:1]}")
        except OSError:
            rows.append(f"{pid}:gone")
    return f"{path}: {rows}"


@check
async def check_halt_from_outside(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """halt() ends every candidate process from outside the sandbox, within its bound:
    stubborn ones, a SIGSTOPped one, a fork loop, one that stops every other process
    it reaches; init and a kept user's process live on, and the sandbox still runs
    commands after."""
    async with running(provider, env) as sb:
        await start_background(sb, "setsid sleep 300 >/dev/null 2>&1 &", user="1234:1234", expect_at_least=1)
        hostile = (
            _STUBBORN.removesuffix("true")
            + "setsid sh -c 'kill -STOP $$; sleep 1' >/dev/null 2>&1 & "
            + "setsid sh -c 'while :; do (sleep 0.05 &); done' >/dev/null 2>&1 & true"
        )
        await start_background(sb, hostile, expect_at_least=1 + _STUBBORN_COUNT + 2)
        # Last (it stops every process of its uid, the harness's own listing included).
        await sb.exec(["sh", "-c", "setsid sh -c 'while :; do kill -STOP -1; kill -INT 1; done' >/dev/null 2>&1 &"],
                      timeout=30)
        await asyncio.sleep(0.5)
        out = await sb.halt(keep_uids=(1234,), bound_s=10)
        left = await live_processes(sb)
        assert out.survivors == [] and out.within_bound and not out.sandbox_stopped, (out, left)
        # (seen once under CI's load: killed=0 in 1.3 ms; the listing says what the cgroup held then)
        assert out.killed >= _STUBBORN_COUNT + 3 and out.kept == 1, (out, left, _cgroup_listing(out.cgroup))
        assert [p for p in left if p["uid"] == env.policy.uid] == [], f"candidate processes survived: {left}"
        assert [p["uid"] for p in left] == [1234], left
        r = await sb.exec(["echo", "still usable"], timeout=30)
        assert r.stdout == b"still usable\n", r


@check
async def check_kill_count_is_honest(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """With a process the kill may not reach (another uid), the count matches /proc
    and every candidate-user process is dead."""
    async with running(provider, env) as sb:
        await start_background(sb, "setsid sleep 200 >/dev/null 2>&1 &", user="1234:1234", expect_at_least=1)
        await start_background(sb, _STUBBORN, expect_at_least=1 + _STUBBORN_COUNT)
        n = await sb.kill_user_processes()
        left = await live_processes(sb)
        assert [p for p in left if p["uid"] == env.policy.uid] == [], f"candidate processes survived: {left}"
        assert n == len(left), f"kill_user_processes() reported {n} left, /proc shows {len(left)}: {left}"


@check
async def check_kill_then_run(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """kill_user_processes_then(argv) kills first, then runs argv as the candidate
    user: argv sees no old process, its stdout is its own (no count line)."""
    async with running(provider, env) as sb:
        await start_background(sb, _STUBBORN, expect_at_least=_STUBBORN_COUNT)
        n, r = await sb.kill_user_processes_then(LISTER_ARGV)
        assert n == 0, f"reported {n} left"
        assert r is not None, "no result for argv"
        seen = parse_listing(r, "argv after the kill")
        assert seen == [], f"argv saw processes the kill should have ended: {seen}"
        await assert_no_processes(sb, "after kill_user_processes_then")

        await start_background(sb, _STUBBORN, expect_at_least=_STUBBORN_COUNT)
        n, r = await sb.kill_user_processes_then(["sh", "-c", "id -u; echo err >&2; exit 5"])
        assert n == 0 and r is not None, (n, r)
        assert (r.stdout, r.exit_code) == (f"{env.policy.uid}\n".encode(), 5), r
        assert r.stderr.endswith(b"err\n"), r  # exactly b"err\n": check_kill_then_run_output_is_argvs
        await assert_no_processes(sb, "after kill_user_processes_then")

        await start_background(sb, _STUBBORN, expect_at_least=_STUBBORN_COUNT)
        assert await sb.kill_user_processes_then(None) == (0, None)
        await assert_no_processes(sb, "after kill_user_processes_then(None)")


@check
async def check_kill_then_run_output_is_argvs(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """argv's stdout and stderr are argv's alone, even while processes come and go
    during the kill (here: another uid's, which the kill may not reach, forking
    short-lived children all the time), and the count is reported."""
    async with running(provider, env) as sb:
        spawner = "setsid sh -c 'while :; do (sleep 0.02 &); done' >/dev/null 2>&1 &"
        await start_background(sb, spawner, user="1234:1234", expect_at_least=1)
        n, r = await sb.kill_user_processes_then(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert r is not None and n >= 1, f"a process the kill did not reach is alive, reported {n} left"
        assert (r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 3), r


# -- mounts -----------------------------------------------------------------------------


@check
async def check_mounts(provider: SandboxProvider, env: ConformanceEnv) -> None:
    """/input is read-only (by the mount: the host folder is world-writable) and
    holds the input; /workspace starts empty and is writable, and the host sees it."""
    spec = env.spec()
    host_ws = workspace_of(spec)
    before = sorted(p.name for p in env.input_dir.iterdir())
    async with running(provider, env, spec) as sb:
        r = await sb.exec(["cat", f"/input/{INPUT_FILE}"], timeout=30)
        assert r.stdout == INPUT_TEXT, r
        for script in ("echo x > /input/new", f"echo x >> /input/{INPUT_FILE}", f"rm -f /input/{INPUT_FILE}", "mkdir /input/d"):
            for user in (None, "0:0"):
                r = await sb.exec(["sh", "-c", script], user=user, timeout=30)
                assert r.exit_code != 0, f"{script!r} as {user or 'the candidate'} succeeded in /input"
                assert b"read-only" in r.stderr.lower(), f"{script!r}: refused, but not by a read-only mount: {r.stderr!r}"
        assert sorted(p.name for p in env.input_dir.iterdir()) == before
        assert (env.input_dir / INPUT_FILE).read_bytes() == INPUT_TEXT

        r = await sb.exec(["ls", "-A", "/workspace"], timeout=30)
        assert r.exit_code == 0 and r.stdout == b"", f"workspace not listed empty: {r!r}"
        r = await sb.exec(["sh", "-c", "mkdir -p /workspace/sub && echo out > /workspace/sub/f && cat /workspace/sub/f"], timeout=30)
        assert r.stdout == b"out\n", r
        if sb.shares_host_filesystem:
            f = host_ws / "sub" / "f"
            assert f.read_bytes() == b"out\n", "the host does not see the workspace write"
            assert (f.stat().st_uid, f.stat().st_gid) == (env.policy.uid, env.policy.gid)
            (host_ws / "from-host").write_bytes(b"host\n")
            r = await sb.exec(["cat", "/workspace/from-host"], timeout=30)
            assert r.stdout == b"host\n", r
