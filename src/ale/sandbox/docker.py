"""The docker provider: one sealed container per run, through the Docker SDK.

This module (with ``image.py``, which builds the tools image) is the only one that
talks to Docker; everything else holds a ``SandboxProvider`` / ``Sandbox``.
Every container ale creates carries the label ``ale.managed=1`` plus the run id
(and experiment id where there is one); cleanup selects by those labels only.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterable
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
from docker.types import LogConfig, Ulimit
from docker.types import Mount as DockerMount

from ale.defaults import DEFAULT_TOOLS_IMAGE, DESKTOP_UID, TOOLS_REPO
from ale.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT,
    LABEL_EXPERIMENT,
    LABEL_MANAGED,
    LABEL_RUN,
    EngineUnreachable,
    ExecResult,
    ImageMissing,
    Mount,
    RuntimeMissing,
    SandboxError,
    SandboxGone,
    SandboxSpec,
)
from ale.sandbox.desktop import DEFAULT_DESKTOP_IMAGE, DESKTOP_REPO
from ale.sandbox.docker_images import DockerImageStore
from ale.sandbox.halt import STOP_BOUND_S, HostUnreachable, StopOutcome, find_cgroup, stop_cgroup
from ale.sandbox.host_kernel import core_pattern_record
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.runtimes import (
    DEFAULT_RUNTIME,
    RUNSC_ARGS,
    install_hint,
    is_gvisor,
    missing_runtime_message,
)

if TYPE_CHECKING:
    from ale.sandbox.cua.sandbox import CuaSandbox


def image_hint(ref: str) -> str:
    """The command that puts ``ref`` in the engine (each is run by tests/test_image_hints.py)."""
    name = ref.rsplit("@", 1)[0]
    repo = name.rpartition(":")[0] if ":" in name.rsplit("/", 1)[-1] else name
    if ref == DEFAULT_DESKTOP_IMAGE or repo == DESKTOP_REPO:
        tag = "" if ref == DEFAULT_DESKTOP_IMAGE else f" --tag {ref}"
        return (f"build it with `ale image build --desktop{tag}` (ale run, ale exp run and ale task check build it "
                "when missing)")
    if ref == DEFAULT_TOOLS_IMAGE or repo == TOOLS_REPO:
        tag = "" if ref == DEFAULT_TOOLS_IMAGE else f" --tag {ref}"
        return f"build it with `ale image build{tag}` (ale run, ale exp run and ale task check build it when missing)"
    return f"pull it (`docker pull {ref}`) or build it, or pass --image with an image the engine has"


EXEC_TAG_VAR = "ALE_EXEC_ID"

# Grace on top of a command's own timeout before the host gives up waiting on
# the exec stream (a daemonised child can hold stdout open after the kill).
_HOST_GRACE_S = 5.0
# Once the engine reports a command exited, how long its stream may stay open (a
# background child holding it) before it is closed: that long after the exit and
# after the last bytes that came; longer while nothing came at all, since on a loaded
# host the engine reports the exit before it has passed the output on.
_AFTER_EXIT_S = 0.2
_AFTER_EXIT_EMPTY_S = 1.5


# PID 1 of every sandbox: it only reaps, and nothing in the sandbox can reach it.
# Orphans are re-parented to PID 1, and a PID 1 that never waits (`sleep infinity`)
# keeps them as zombies that hold pid slots, so a fork bomb would leave the container
# unable to fork even after every process was killed (and the after-run probes could
# not run). Every catchable signal is ignored (SIGCHLD ignored: the kernel reaps its
# children itself; the loop's waitpid is a second net): the kernel drops any signal a
# process of the PID namespace sends its init unless init handles it, and SIGKILL and
# SIGSTOP from inside never reach it. Not dumpable: no process of its uid can trace
# it, read or write its memory. Falls back to `sleep infinity` (no handler either) in
# an image without python3.
_REAPER = (
    "import os, signal, time\n"
    "for s in signal.valid_signals():\n"
    "    try:\n"
    "        signal.signal(s, signal.SIG_IGN)\n"
    "    except (OSError, ValueError, RuntimeError):\n"
    "        pass\n"
    "try:\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)\n"
    "except Exception:\n"
    "    pass\n"
    "while True:\n"
    "    try:\n"
    "        while os.waitpid(-1, os.WNOHANG)[0] > 0:\n"
    "            pass\n"
    "    except ChildProcessError:\n"
    "        pass\n"
    "    time.sleep(1)\n"
)
INIT_COMMAND = [
    "sh",
    "-c",
    'command -v python3 >/dev/null && exec python3 -c "$0" || exec sleep infinity',
    _REAPER,
]


def connect(base_url: str | None = None) -> docker.DockerClient:
    """A client for the engine at ``base_url`` (default: ``DOCKER_HOST`` or the
    local socket), or ``EngineUnreachable`` saying how to start one."""
    try:
        client = docker.DockerClient(base_url=base_url, timeout=120) if base_url else docker.from_env(timeout=120)
        client.ping()
        return client
    except Exception as e:  # docker raises several unrelated types here
        raise EngineUnreachable(
            "cannot reach the Docker engine "
            f"({type(e).__name__}: {e}). Start it (as root: `dockerd &` or "
            "`service docker start`), or set DOCKER_HOST."
        ) from e


def container_create_kwargs(
    *,
    name: str,
    image: str,
    policy: IsolationPolicy,
    mounts: Iterable[Mount],
    labels: dict[str, str],
    workdir: str,
    environment: dict[str, str] | None = None,
    command: list[str] | None = None,
    entrypoint: list[str] | None = None,
) -> dict[str, Any]:
    """The `containers.create` arguments that implement the policy (one place).
    ``entrypoint`` replaces the image's (then the image's command is not used)."""
    security_opt = ["no-new-privileges"] if policy.no_new_privileges else []
    extra: dict[str, Any] = {} if entrypoint is None else {"entrypoint": entrypoint}
    return dict(
        **extra,
        image=image,
        name=name,
        command=command or ([] if entrypoint is not None else INIT_COMMAND),
        user=policy.user,
        working_dir=workdir,
        labels=labels,
        environment=environment or {},
        network_mode=policy.network_mode,
        read_only=policy.read_only_rootfs,
        cap_drop=list(policy.cap_drop),
        cap_add=list(policy.cap_add) or None,
        security_opt=security_opt,
        ipc_mode=policy.ipc_mode,
        cgroupns=policy.cgroupns_mode,
        pids_limit=policy.pids_limit,
        mem_limit=policy.memory_bytes,
        memswap_limit=policy.memory_swap_bytes,
        nano_cpus=policy.nano_cpus,
        tmpfs={t.path: t.options for t in policy.tmpfs},
        sysctls=dict(policy.sysctls) or None,
        ulimits=[Ulimit(name=n, soft=soft, hard=hard) for n, (soft, hard) in policy.ulimits.items()] or None,
        log_config=LogConfig(type="json-file", config={"max-size": policy.log_max_size}),
        mounts=[
            DockerMount(
                target=m.target,
                source=m.source,
                type="bind",
                read_only=m.read_only,
                propagation="rprivate",
            )
            for m in mounts
        ],
        runtime=policy.runtime,
        auto_remove=False,
        detach=True,
        stdin_open=False,
        tty=False,
    )


class DockerSandbox:
    """A running container and the exec channel into it."""

    def __init__(self, client: docker.DockerClient, container: Any, policy: IsolationPolicy):
        self.client = client
        self.container = container
        self.policy = policy
        self.name: str = container.name
        self.id: str = container.id
        self._uptime_offset: float | None = None
        self._removed = False
        self._init_pid: int | None = None

    shares_host_filesystem = True

    # -- lifecycle -----------------------------------------------------------
    @classmethod
    def create(cls, client: docker.DockerClient, spec: SandboxSpec, *,
               entrypoint: list[str] | None = None) -> DockerSandbox:
        kwargs = container_create_kwargs(
            name=spec.name,
            image=spec.image,
            policy=spec.policy,
            mounts=spec.mounts,
            labels={LABEL_MANAGED: "1", **spec.labels},
            workdir=spec.workdir,
            environment=spec.environment,
            entrypoint=entrypoint,
        )
        try:
            container = client.containers.create(**kwargs)
        except docker.errors.ImageNotFound as e:
            raise ImageMissing(f"image {spec.image!r} not found in the local engine; {image_hint(spec.image)}") from e
        except docker.errors.APIError as e:
            raise SandboxError(f"docker refused to create container {spec.name!r}: {e.explanation or e}") from e
        except docker.errors.DockerException as e:
            raise EngineUnreachable(f"docker failed creating {spec.name!r}: {e}") from e
        return cls(client, container, spec.policy)

    def inspect(self) -> dict[str, Any]:
        """The raw `docker inspect` document (never cached)."""
        try:
            return self.client.api.inspect_container(self.id)
        except docker.errors.NotFound as e:
            raise SandboxGone(f"container {self.name} is gone") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker inspect {self.name} failed: {e}") from e

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.container.start)
        except docker.errors.NotFound as e:
            raise SandboxGone(f"container {self.name} is gone") from e
        except docker.errors.DockerException as e:
            why = str(getattr(e, "explanation", None) or e)
            if "root network namespace" in why:  # runsc registered without --network=none
                why += f" (register runsc with {' '.join(RUNSC_ARGS)}: {install_hint('runsc')})"
            raise SandboxError(f"docker could not start {self.name}: {why}") from e
        # The init's host pid, read once now: the host-side stop must never wait on the
        # engine, which a candidate can wedge (a SIGSTOP to an exec's process while it
        # starts holds the engine's lock on this container: inspect, exec, kill wait).
        with suppress(Exception):
            state = (await asyncio.to_thread(self.inspect)).get("State") or {}
            if state.get("Running") and int(state.get("Pid") or 0) > 0:
                self._init_pid = int(state["Pid"])

    def _cached_init(self) -> tuple[int, Any] | None:
        """(init's host pid, its cgroup) from the pid read at start, while that process
        is still this container's init; None when unknown or gone."""
        if self._init_pid is None:
            return None
        try:
            return self._init_pid, find_cgroup(self._init_pid, self.id)
        except HostUnreachable:
            return None

    async def stop(self) -> None:
        """Kill the container (every process in it dies with its PID namespace) and
        wait until it has exited. No status read first: a container that is not
        running refuses the kill (409), and the wait returns at once."""
        def _kill() -> None:
            with suppress(docker.errors.NotFound):
                with suppress(docker.errors.APIError):
                    self.client.api.kill(self.id)
                self.client.api.wait(self.id, timeout=60)

        try:
            await asyncio.to_thread(_kill)
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker could not stop {self.name}: {e}") from e

    async def remove(self) -> None:
        """Remove the container; once it is gone, a second call asks the engine nothing."""
        if self._removed:
            return

        def _rm() -> None:
            with suppress(docker.errors.NotFound):
                self.client.api.remove_container(self.id, force=True, v=True)

        try:
            await asyncio.to_thread(_rm)
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker could not remove {self.name}: {e}") from e
        self._removed = True

    # -- exec ----------------------------------------------------------------
    async def exec(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        env: dict[str, str] | None = None,
        wrap_timeout: bool = True,
        privileged: bool = False,
    ) -> ExecResult:
        """Run argv; on timeout its whole process tree is killed: coreutils `timeout`
        kills the process group, then every process that inherited this command's
        tag (`ALE_EXEC_ID` in its environment: children that left the group with
        setsid or a double fork included). Should the stream still not close, every
        candidate process is killed. `wrap_timeout=False` leaves only the host-side
        deadline (for commands that kill every process but themselves)."""
        # Every command is tagged, so that a timed-out command's kill can tell the
        # processes of other commands (another tag) from its own.
        tag = uuid.uuid4().hex
        env = {**(env or {}), EXEC_TAG_VAR: tag}
        wrapped = timeout is not None and wrap_timeout
        if timeout is not None and wrap_timeout:
            t = max(timeout, 0.1)
            argv = ["timeout", "-s", "KILL", f"{t:.3f}", *argv]
        started = time.monotonic()
        try:
            exec_id = await asyncio.to_thread(
                self.client.api.exec_create,
                self.id,
                argv,
                stdin=stdin is not None,
                user=user or self.policy.user,
                workdir=workdir,
                environment=env,
                privileged=privileged,
            )
        except docker.errors.NotFound as e:
            raise SandboxGone(f"container {self.name} is gone") from e
        except docker.errors.APIError as e:
            raise SandboxError(f"exec in {self.name} failed: {e.explanation or e}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"exec in {self.name} failed: {e}") from e

        collector = _StreamCollector(output_limit)
        pump = asyncio.ensure_future(asyncio.to_thread(self._pump, exec_id["Id"], stdin, collector))
        host_deadline = None if timeout is None else started + timeout + _HOST_GRACE_S
        forced = False
        exited_at: float | None = None
        while True:
            done, _ = await asyncio.wait({pump}, timeout=0.1)
            if done:
                break
            now = time.monotonic()
            if host_deadline is not None and now > host_deadline and not forced:
                forced = True
                # From the host (no exec: a candidate can stop an exec's process as it
                # starts, and the engine then waits on it): every candidate process dies,
                # the stopped exec's included, and the engine is free again.
                await self.halt(keep_uids=(DESKTOP_UID,))
                collector.close()
            elif exited_at is None:
                # A background child can keep the stream open after the command
                # exited; stop waiting for it shortly after the exit.
                try:  # bounded: the engine's answer must not hold up the host's deadline
                    state = await asyncio.wait_for(self._exec_state(exec_id["Id"]), 2.0)
                except TimeoutError:
                    continue
                # Not started yet (a loaded host: the pump's exec_start still queued)
                # reads the same as ended, but without an exit code.
                if not state.get("Running") and state.get("ExitCode") is not None:
                    exited_at = now
            elif now - exited_at > (_AFTER_EXIT_S if collector.last_data is not None else _AFTER_EXIT_EMPTY_S) and (
                    collector.last_data is None or now - collector.last_data > _AFTER_EXIT_S):
                collector.close()
        await pump
        info = await self._exec_state(exec_id["Id"])
        duration = time.monotonic() - started
        exit_code = info.get("ExitCode")
        if exit_code is None:
            exit_code = -1
        timed_out = forced or (
            timeout is not None and exit_code in (124, 137) and duration >= timeout * 0.95
        )
        if collector.error is not None and not forced:
            raise SandboxError(f"exec stream from {self.name} failed: {collector.error}")
        if timed_out and wrapped and not forced:
            await self._kill_tagged(tag, started)
        if not forced and not timed_out and (exit_code == -1 or exit_code >= 128):
            await self._raise_if_gone()
        return ExecResult(
            exit_code=exit_code,
            stdout=bytes(collector.out),
            stderr=bytes(collector.err),
            timed_out=timed_out,
            stdout_truncated=collector.out_truncated,
            stderr_truncated=collector.err_truncated,
            duration_s=duration,
        )

    async def _exec_state(self, exec_id: str) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(self.client.api.exec_inspect, exec_id)
        except docker.errors.NotFound as e:
            raise SandboxGone(f"container {self.name} is gone") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"exec inspect in {self.name} failed: {e}") from e

    async def _raise_if_gone(self) -> None:
        """A command killed by a signal may have died with its sandbox; the engine
        reports the exec's exit before the container's, so look for a moment."""
        deadline = time.monotonic() + 0.3
        while True:
            try:
                state = (await asyncio.to_thread(self.client.api.inspect_container, self.id))["State"]
            except docker.errors.NotFound as e:
                raise SandboxGone(f"container {self.name} is gone") from e
            except docker.errors.DockerException:
                return
            if state.get("Status") != "running":
                raise SandboxGone(f"container {self.name} stopped during the command ({state.get('Status')})")
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.03)

    def _pump(self, exec_id: str, stdin: bytes | None, collector: _StreamCollector) -> None:
        try:
            sock = self.client.api.exec_start(exec_id, socket=True)
            raw = getattr(sock, "_sock", sock)
            collector.sock = raw

            def feed() -> None:
                # Written while the output is read: a command that echoes its
                # input must not block on a full stdout while we block on stdin.
                with suppress(OSError):
                    if stdin:
                        raw.sendall(stdin)
                    raw.shutdown(socket.SHUT_WR)

            if stdin is None:
                feed()
            else:
                threading.Thread(target=feed, name=f"ale-stdin-{exec_id[:12]}", daemon=True).start()
            _read_frames(raw, collector)
        except Exception as e:  # recorded, raised by the caller
            if not collector.closed:
                collector.error = e
        finally:
            with suppress(Exception):
                collector.sock.close()

    async def _container_uptime_offset(self) -> float:
        """A lower bound on (container uptime - host monotonic clock), in seconds:
        the container's /proc/uptime is read somewhere inside one exec's round trip,
        so subtracting the host's clock at the round trip's end never overstates it.
        Measured once per sandbox (the two clocks run at the same rate)."""
        if self._uptime_offset is None:
            r = await self.exec(["cat", "/proc/uptime"], timeout=30, wrap_timeout=False)
            back = time.monotonic()
            try:
                up = float(r.stdout.split()[0])
            except (IndexError, ValueError) as e:
                raise SandboxError(f"cannot read /proc/uptime in {self.name}: {r.stdout[:80]!r}") from e
            self._uptime_offset = up - back
        return self._uptime_offset

    async def _kill_tagged(self, tag: str, started: float) -> None:
        """Kill every process whose environment carries this command's tag, and
        every process with no tag at all (it cleared its environment) that started
        since the command did (``started``, on the host's monotonic clock, mapped to
        the container's uptime by a lower bound: an untagged process that started a
        round trip before the command may die too, one after it never survives)."""
        since_cs = int((started + await self._container_uptime_offset()) * 100) - 2
        script = (
            'var=$1 tag=$2 since_cs=$3; hz=$(getconf CLK_TCK 2>/dev/null || echo 100); '
            # Sweep until a sweep (after the third) finds nothing alive to kill, a
            # second at most: a descendant still being forked is caught too.
            'i=0; while [ $i -lt 20 ]; do i=$((i+1)); k=0; for p in /proc/[0-9]*; do pid=${p#/proc/}; '
            '{ [ "$pid" = 1 ] || [ "$pid" = $$ ]; } && continue; '
            '{ read -r l < "$p/stat"; } 2>/dev/null || continue; set -- ${l##*) }; '
            'case $1 in Z*|X*) continue;; esac; '
            'if grep -qzx "$var=$tag" "$p/environ" 2>/dev/null; then kill -9 "$pid" 2>/dev/null && k=1; continue; fi; '
            'grep -qz "^$var=" "$p/environ" 2>/dev/null && continue; '
            '[ $(( ${20} * 100 / hz )) -ge "$since_cs" ] && kill -9 "$pid" 2>/dev/null && k=1; '
            "done; [ $k = 0 ] && [ $i -ge 3 ] && break; sleep 0.05; done; true"
        )
        await self.exec(
            ["sh", "-c", script, "kill-tagged", EXEC_TAG_VAR, tag, str(since_cs)], timeout=30, wrap_timeout=False
        )

    async def halt(self, *, keep_uids: tuple[int, ...] = (), bound_s: float = STOP_BOUND_S) -> StopOutcome:
        """End the candidate's turn from the host: freeze the container's cgroup,
        SIGKILL every task but init and the ``keep_uids``' from outside, thaw, await
        the deaths (``ale.sandbox.halt``). Bounded by ``bound_s``; nothing in the
        sandbox takes part. Where the host cannot reach the container's tasks (the
        engine on another machine, gVisor's sandbox kernel) the in-sandbox kill runs
        instead, recorded as ``exec``."""
        started = datetime.now(UTC).isoformat()
        t0 = time.monotonic()
        try:
            if is_gvisor(self.policy.runtime):
                return await self._halt_in_sentry(keep_uids, bound_s, started, t0)
            cached = await asyncio.to_thread(self._cached_init)
            if cached is not None:  # no engine call: the engine may be wedged on this container
                init, cg = cached
            else:
                state = (await asyncio.wait_for(asyncio.to_thread(self.inspect), bound_s)).get("State") or {}
                if not state.get("Running"):
                    return StopOutcome("none", started, bound_s=bound_s, sandbox_stopped=True,
                                       detail=f"the sandbox was not running ({state.get('Status')})")
                init = int(state.get("Pid") or 0)
                cg = await asyncio.to_thread(find_cgroup, init, self.id)
        except HostUnreachable as e:
            remaining = await asyncio.wait_for(self.kill_user_processes(), bound_s)
            return StopOutcome("exec", started, duration_s=round(time.monotonic() - t0, 4), bound_s=bound_s,
                               within_bound=time.monotonic() - t0 <= bound_s,
                               survivors=[] if remaining == 0
                                         else [f"{remaining} (count {'unread' if remaining < 0 else 'read'})"],
                               detail=f"in-sandbox kill: {e}")
        left = max(bound_s - (time.monotonic() - t0), 1.0)
        out = await asyncio.to_thread(stop_cgroup, cg, init, keep_uids=keep_uids, bound_s=left)
        out.started_at, out.bound_s = started, bound_s
        out.duration_s = round(time.monotonic() - t0, 4)
        out.within_bound = out.duration_s <= bound_s
        return out

    async def _halt_in_sentry(self, keep_uids: tuple[int, ...], bound_s: float, started: str, t0: float) -> StopOutcome:
        """gVisor's tasks are its sandbox kernel's, not the host's: the host's freezer
        cannot reach them, and its engine can pause (``runsc pause``) but not signal a
        paused task. The kill is the engine's own exec, as uid 0 with CAP_KILL (a
        privileged exec: the candidate has neither), so no candidate process can
        signal, stop, trace or write into it. Past the bound, or when the exec cannot
        start (the candidate holds every pid), the container is killed whole and the
        turn is judged from its stopped state."""
        def outcome(**kw: Any) -> StopOutcome:
            dur = round(time.monotonic() - t0, 4)
            return StopOutcome("engine-exec-root", started, duration_s=dur, bound_s=bound_s,
                               within_bound=dur <= bound_s, **kw)

        budget = max(bound_s - (time.monotonic() - t0) - 2.0, 1.0)
        try:
            r = await asyncio.wait_for(self.exec(
                ["python3", "-c", _ROOT_KILL_SCRIPT, json.dumps(list(keep_uids)), f"{budget:.3f}"],
                user="0", timeout=budget + 1.0, wrap_timeout=False, privileged=True), budget + 1.5)
            doc = _json_object(r.stdout) if r.exit_code == 0 else None
        except (TimeoutError, SandboxError) as e:
            doc, r = None, ExecResult(-1, stderr=str(e).encode())
        if doc is None:
            await self.stop()
            return outcome(sandbox_stopped=True, detail="the in-sentry kill did not report "
                           f"(exit {r.exit_code}: {r.stderr[-300:].decode(errors='replace')}); the container "
                           "was killed whole")
        return outcome(killed=int(doc["killed"]), dying=int(doc["dying"]), kept=int(doc["kept"]),
                       survivors=[str(x) for x in doc["survivors"]], frozen=False,
                       detail="uid 0 with CAP_KILL in gVisor's sentry, through the engine's exec")

    async def kill_user_processes(self) -> int:
        """Kill every candidate process (all but PID 1) and report how many remain
        (-1 when the count could not be read)."""
        remaining, _ = await self.kill_user_processes_then(None)
        return remaining

    async def kill_user_processes_then(
        self, argv: list[str] | None, *, timeout: float = 60
    ) -> tuple[int, ExecResult | None]:
        """Kill every candidate process, then run `argv` in the same exec (one
        round trip fewer: the after-run probes follow the kill directly).

        Runs as the candidate user: no-new-privileges and no capabilities mean
        every process in the container runs as that uid, and kill(-1) reaches
        all of them except init and the caller. Repeated to catch processes
        forked mid-sweep. The count is the first line of stdout.
        """
        script = _KILL_SCRIPT + ('; exec "$@"' if argv else "")
        r = await self.exec(
            ["sh", "-c", script, "kill", str(DESKTOP_UID), *(argv or [])], user=self.policy.user, timeout=timeout,
            wrap_timeout=False,
        )
        first, _, rest = r.stdout.partition(b"\n")
        try:
            remaining = int(first.decode().strip())
        except ValueError:
            return -1, None
        if argv is None:
            return remaining, None
        r.stdout = rest
        return remaining, r


# Kill every candidate process but PID 1 and this shell, until none is left
# alive and PID 1 has reaped the dead (zombies hold pid slots: the probes that
# follow must fork). kill(-1) as the candidate reaches only the candidate's
# processes. Every survivor is counted but the desktop user's ($1: a desktop
# image's display and apps, which live on through grading), so a process of any
# other user (which the candidate cannot have killed) shows in the count.
# Bounded at about a second; prints how many live processes remain.
_KILL_SCRIPT = (
    "dt=$1; shift; i=0; while :; do kill -9 -1 2>/dev/null; [ $i -gt 0 ] && sleep 0.02; n=0; z=0; "
    "for p in /proc/[0-9]*; do p=${p#/proc/}; "
    "[ \"$p\" = 1 ] || [ \"$p\" = $$ ] && continue; u=; st=; "
    "while read -r k v r; do case $k in State:) st=$v;; Uid:) u=$v;; esac; done 2>/dev/null < /proc/$p/status; "
    "[ \"$u\" = \"$dt\" ] && continue; "
    "case \"$st\" in Z*|X*) z=$((z+1)); continue;; esac; n=$((n+1)); done; "
    "i=$((i+1)); { [ $n = 0 ] && [ $z = 0 ]; } || [ $i -ge 50 ] && break; done; echo $n"
)


# The end of the turn inside gVisor's sentry, run as uid 0 with CAP_KILL by the engine's
# exec: SIGKILL every task but init, itself and the kept uids', until none is left or
# the budget ends; a task in D with SIGKILL pending counts dead. Prints one JSON line.
_ROOT_KILL_SCRIPT = r"""
import json, os, sys, time
keep, budget = set(json.loads(sys.argv[1])), float(sys.argv[2])
me, end = os.getpid(), time.monotonic() + budget
killed, seen = 0, set()
def tasks():
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in (1, me):
            continue
        try:
            f = dict(l.split(":", 1) for l in open(f"/proc/{p}/status") if ":" in l)
            yield int(p), int(f["Uid"].split()[0]), f["State"].split()[0], f["Name"].strip(), int(f.get("SigPnd", "0"), 16) | int(f.get("ShdPnd", "0"), 16)
        except (OSError, KeyError, ValueError, IndexError):
            continue
while True:
    alive, dying, kept = [], 0, 0
    for pid, uid, st, name, pend in tasks():
        if st in ("Z", "X"):
            continue
        if uid in keep:
            kept += 1
            continue
        if st == "D" and pend & (1 << 8) and pid in seen:
            dying += 1
            continue
        try:
            os.kill(pid, 9)
            killed += pid not in seen
            seen.add(pid)
        except ProcessLookupError:
            continue
        alive.append(f"{pid}:{uid}:{st}:{name}")
    if not alive or time.monotonic() > end:
        break
    time.sleep(0.01)
print(json.dumps({"killed": killed, "dying": dying, "kept": kept, "survivors": alive}))
"""  # noqa: E501


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """The one JSON object ``raw`` holds (the harness's own script's report), or None."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and {"killed", "dying", "kept", "survivors"} <= set(doc) else None


class _StreamCollector:
    def __init__(self, limit: int):
        self.limit = limit
        self.out = bytearray()
        self.err = bytearray()
        self.out_truncated = False
        self.err_truncated = False
        self.error: Exception | None = None
        self.sock: Any = None
        self.closed = False
        self.last_data: float | None = None  # time.monotonic() of the last bytes received

    def add(self, stream: int, data: bytes) -> None:
        self.last_data = time.monotonic()
        buf = self.err if stream == 2 else self.out
        room = self.limit - len(buf)
        if room >= len(data):
            buf.extend(data)
            return
        if room > 0:
            buf.extend(data[:room])
        if stream == 2:
            self.err_truncated = True
        else:
            self.out_truncated = True

    def close(self) -> None:
        self.closed = True
        if self.sock is not None:
            with suppress(Exception):
                self.sock.shutdown(socket.SHUT_RDWR)


def _read_exact(sock: Any, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            return None
        chunks.extend(chunk)
    return bytes(chunks)


def _read_frames(sock: Any, collector: _StreamCollector) -> None:
    """Docker's multiplexed stream: 8-byte header (stream, 0,0,0, size BE32)."""
    while True:
        header = _read_exact(sock, 8)
        if header is None:
            return
        stream, size = header[0], struct.unpack(">I", header[4:])[0]
        remaining = size
        while remaining:
            chunk = sock.recv(min(remaining, 65536))
            if not chunk:
                return
            remaining -= len(chunk)
            collector.add(stream, chunk)


def remove_containers(
    client: docker.DockerClient, *, run_id: str | None = None, experiment: str | None = None
) -> list[str]:
    """Remove ale's containers (optionally of one run or experiment); never others."""
    filters = [f"{LABEL_MANAGED}=1"]
    if run_id:
        filters.append(f"{LABEL_RUN}={run_id}")
    if experiment:
        filters.append(f"{LABEL_EXPERIMENT}={experiment}")
    removed = []
    # sparse: no per-container inspect, which races with runs removing their own.
    for c in client.containers.list(all=True, sparse=True, filters={"label": filters}):
        with suppress(docker.errors.NotFound):
            client.api.remove_container(c.id, force=True, v=True)
            removed.append((c.attrs.get("Names") or [c.id])[0].lstrip("/"))
    return removed



_ENGINE_TTL_S = 60.0


class DockerProvider:
    """The ``SandboxProvider`` for one Docker engine (``DOCKER_HOST`` or the local
    socket). The client is made on first use, so constructing a provider never
    touches the engine."""

    name = "docker"

    def __init__(self, client: docker.DockerClient | None = None, *, base_url: str | None = None):
        self._client = client
        self._base_url = base_url
        self._engine: tuple[float, dict[str, Any]] | None = None

    @property
    def client(self) -> docker.DockerClient:
        """The SDK client (for the Docker-specific tools: image builds, tests)."""
        if self._client is None:
            self._client = connect(self._base_url)
        return self._client

    def ping(self) -> None:
        """Raise ``EngineUnreachable`` unless the engine answers."""
        try:
            self.client.ping()
        except docker.errors.DockerException as e:
            raise EngineUnreachable(f"the Docker engine does not answer: {e}") from e

    def engine_record(self) -> dict[str, Any]:
        """Engine version and security options; `docker info` is slow, so it is
        read at most once a minute rather than once per run."""
        hit = self._engine
        if hit and time.monotonic() - hit[0] < _ENGINE_TTL_S:
            return hit[1]
        try:
            info = self.client.info()
            record = {
                "version": self.client.version(),
                "security_options": info.get("SecurityOptions"),
                "cgroup_version": info.get("CgroupVersion"),
                "driver": info.get("Driver"),
                "default_runtime": info.get("DefaultRuntime"),
                "runtimes": sorted(info.get("Runtimes") or {}),
                **core_pattern_record(),
            }
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker info failed: {e}") from e
        self._engine = (time.monotonic(), record)
        return record

    def image_inspect(self, image: str) -> dict[str, Any]:
        try:
            return self.client.api.inspect_image(image)
        except docker.errors.ImageNotFound as e:
            raise ImageMissing(f"image {image!r} is not in the local Docker engine: {image_hint(image)}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker image inspect {image!r} failed: {e}") from e

    def runtimes(self) -> list[str]:
        """The OCI runtimes the engine has registered (`docker info` → Runtimes)."""
        return list(self.engine_record().get("runtimes") or [])

    def require_runtime(self, runtime: str) -> None:
        """Refuse, with the commands that install and register it, a runtime the engine lacks."""
        have = self.runtimes()
        if runtime not in have:
            self._engine = None  # registered since the last look? (SIGHUP reload)
            have = self.runtimes()
        if runtime not in have:
            raise RuntimeMissing(missing_runtime_message(runtime, have))

    async def create(self, spec: SandboxSpec) -> DockerSandbox | CuaSandbox:
        """A sealed sandbox of ``spec``; of a cua-compatible image (its entrypoint runs
        cua's computer-server), a ``CuaSandbox``: ale's reaper is PID 1 and the image's
        entrypoint starts, as the candidate, with the sandbox (``ale.sandbox.cua.sandbox``)."""
        from ale.sandbox.cua.sandbox import CuaSandbox, server_argv

        if spec.policy.runtime != DEFAULT_RUNTIME:
            await asyncio.to_thread(self.require_runtime, spec.policy.runtime)
        argv = None
        with suppress(SandboxError):  # a missing image is refused by the create, as always
            argv = server_argv(await asyncio.to_thread(self.image_inspect, spec.image))
        if argv is None:
            return await asyncio.to_thread(DockerSandbox.create, self.client, spec)
        inner = await asyncio.to_thread(DockerSandbox.create, self.client, spec, entrypoint=INIT_COMMAND)
        return CuaSandbox(inner, argv)

    def attach(self, name_or_id: str, policy: IsolationPolicy) -> DockerSandbox:
        try:
            container = self.client.containers.get(name_or_id)
        except docker.errors.NotFound as e:
            raise SandboxGone(f"no container named {name_or_id!r}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker could not find {name_or_id!r}: {e}") from e
        return DockerSandbox(self.client, container, policy)

    def image_store(self) -> DockerImageStore:
        return DockerImageStore(self.client)

    def remove_managed(self, *, run_id: str | None = None, experiment: str | None = None) -> list[str]:
        try:
            return remove_containers(self.client, run_id=run_id, experiment=experiment)
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker could not list or remove ale's containers: {e}") from e
