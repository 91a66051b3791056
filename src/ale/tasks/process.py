"""Task code in its own process: one interpreter per run, from ``load()`` to ``evaluate()``.

``TaskProcess`` starts ``runtime/_ale_task_worker/serve.py`` with the task tree's
interpreter (``TaskEnvironment``), a clean environment and the task folder's
tree root importable, and serves the session calls the task makes. So:

- two tasks never share modules (27 ALE tasks call their grader ``score_outputs``);
- a synchronous or CPU-heavy ``evaluate`` never stalls the harness's event loop,
  and a timeout kills the process (``TaskProcessError``);
- a grader that crashes its interpreter (segfault, ``os._exit``) ends its own
  call with ``TaskProcessError``, nothing else;
- task code sees none of the harness's environment: only the variables below,
  the ALE defaults (``REMOTE_ROOT_DIR``, ``REMOTE_OUTPUT_DIR``, ``OS_TYPE``), and,
  for ``evaluate()`` alone, the judge credentials passed to that call;
- and none of the harness's files: it runs in a bubblewrap jail (``ale.tasks.jail``),
  bounded (``TaskBounds``: processes, memory, disk, CPU time; a cgroup of its own
  where the host allows, rlimits where not; an unprivileged uid when run by root).

``TaskProcessPool`` lends forks of warm processes instead (``LentTaskProcess``: the
state after ``load()`` without a new interpreter, jail and import per run; what a
run leaves is removed or retires the warm process); ``ale task check``'s grading
probes use it.

Limits: one message at most 2 GiB (``protocol.MAX_MESSAGE``: a file's bytes or text
of that size read whole, which travel raw after the message's line);
the task log (its stdout and stderr) is kept up to 8 MiB, the rest dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale.tasks.card import TaskCard, load_card
from ale.tasks.environment import TaskEnvironment, resolve_environment
from ale.tasks.errors import TaskError
from ale.tasks.jail import (
    TaskBounds,
    TaskCgroup,
    bounds_launcher,
    jail_argv,
    make_cgroup,
    rlimits_for,
)
from ale.tasks.loader import TaskVariant, describe_variant, task_code_hash
from ale.tasks.runtime._ale_task_worker import protocol
from ale.tasks.runtime._ale_task_worker.importer import find_tree_root

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
SERVE = RUNTIME_DIR / "_ale_task_worker" / "serve.py"

# ALE task modules read these at import; the task process always gets the
# documented defaults, never the operator's values.
ALE_TASK_ENV = {
    "REMOTE_ROOT_DIR": "/media/user/data/agenthle",
    "REMOTE_OUTPUT_DIR": "output",
    "OS_TYPE": "linux",
}
JUDGE_ENV_PREFIX = "ALE_JUDGE_"
LOG_LIMIT = 8 * 1024 * 1024
MAX_NOTED_CALLS = 2000  # session calls noted in the task log (commands, and calls that raised)

# The session methods a task function may call (cua-bench's names); the
# harness's session object serves each one it has.
SESSION_METHODS = (
    "run_command", "read_file", "read_bytes", "write_file", "write_bytes", "file_exists",
    "directory_exists", "list_dir", "screenshot", "remove_file", "delete_file", "makedirs",
    "get_file_size", "read_text", "write_text",
    # cua-bench's GUI session (a desktop task's; without a desktop they raise NotImplementedError)
    "launch_window", "execute_javascript", "get_element_rect", "click_element", "right_click_element",
    "execute_action", "get_snapshot", "close_all_windows",
)
INTERFACE_METHODS = (
    "create_dir", "delete_dir", "delete_file", "file_exists", "directory_exists", "list_dir",
    "read_text", "write_text", "read_bytes", "write_bytes", "run_command", "get_file_size",
    "screenshot",
)


class TaskProcessError(RuntimeError):
    """The task process died, hung past its timeout or broke the protocol.
    ``log`` is the tail of what it printed."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class TaskCallFailed(RuntimeError):
    """The task's own function raised; ``kind`` and ``traceback`` say what and where."""

    def __init__(self, message: str, kind: str, tb: str):
        super().__init__(message)
        self.kind = kind
        self.traceback = tb


@dataclass
class TaskInfo:
    """What ``load()`` said about a task, on the harness side."""

    path: Path
    main_file: Path
    card: TaskCard
    code_hash: str
    functions: frozenset[str]
    variants: list[TaskVariant]

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

    def has(self, role: str) -> bool:
        return role in self.functions


def judge_env(environ: Mapping[str, str] | None = None, names: Iterable[str] | None = None) -> dict[str, str]:
    """``ALE_JUDGE_<NAME>=v`` in the harness's environment becomes ``<NAME>=v``
    for ``evaluate()`` (e.g. ``ALE_JUDGE_OPENAI_API_KEY`` -> ``OPENAI_API_KEY``);
    ``names`` (an experiment's ``environment.judge_env``) keeps only those."""
    env = os.environ if environ is None else environ
    found = {k[len(JUDGE_ENV_PREFIX):]: v
             for k, v in env.items() if k.startswith(JUDGE_ENV_PREFIX) and len(k) > len(JUDGE_ENV_PREFIX)}
    if names is None:
        return found
    wanted = set(names)
    return {k: v for k, v in found.items() if k in wanted}


def task_process_env(python: str, home: Path) -> dict[str, str]:
    """The task process's whole environment."""
    bindir = str(Path(python).parent)
    return {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        **ALE_TASK_ENV,
    }


class TaskProcess:
    """One task folder's code, running in its own interpreter.

    ``await start()`` spawns it and calls ``load()``; ``await call(role, i, session)``
    runs ``start``/``solve``/``evaluate`` of variant ``i`` with ``session`` serving
    its session calls; ``await close()`` ends it (always call it: a context manager
    does). Raises ``TaskError`` for a malformed task, ``TaskCallFailed`` when the
    task's function raised, ``TaskProcessError`` when the process itself failed.
    """

    def __init__(
        self, task_dir: str | Path, *, environment: TaskEnvironment | None = None, log_path: Path | None = None,
        card: TaskCard | None = None, network: bool = False, bounds: TaskBounds | None | str = "env",
    ):
        self.path = Path(task_dir).expanduser().resolve()
        # ale.tasks.jail.TaskBounds; "env": TaskBounds.from_env() at start (ALE_TASK_*); None: unbounded
        self.bounds = bounds
        self._cgroup: TaskCgroup | None = None
        self._bounds_record: dict[str, Any] | None = None
        self.network = network  # the host's network in the jail (an LLM judge): ale.tasks.jail.task_network
        self._jailed = False
        self._noted = 0  # session calls noted in the task log
        self.environment = environment or TaskEnvironment()
        self.log_path = log_path
        self._card = card  # the task card, when the caller has read it already
        self._proc: asyncio.subprocess.Process | None = None
        self._home: Path | None = None
        self._log_task: asyncio.Task[None] | None = None
        self._log = bytearray()
        self.info: TaskInfo | None = None
        self.returncode: int | None = None
        # A warm process lending itself (TaskProcessPool): the lease its stderr goes to,
        # the line that ends the lease's part of it, and what was held back in case the
        # line straddles two reads.
        self._sink: TaskProcess | None = None
        self._mark: bytes | None = None
        self._held = b""
        self._marked = asyncio.Event()
        self._ended: dict[str, Any] | None = None  # a lease: the warm process's word that it ended

    async def __aenter__(self) -> TaskProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- life -------------------------------------------------------------------
    async def start(self) -> TaskInfo:
        if not self.path.is_dir():
            raise TaskError(f"{self.path}: not a task folder (no such directory)")
        main = self.path / "main.py"
        if not main.is_file():
            raise TaskError(f"{main}: missing (a task folder needs a main.py)")
        card = self._card if self._card is not None else load_card(self.path)
        code_hash = await asyncio.to_thread(task_code_hash, self.path)
        self._home = Path(tempfile.mkdtemp(prefix="ale-task-"))
        try:
            return await self._spawn_and_load(main, card, code_hash)
        except BaseException:
            # `async with` never reaches __aexit__ when entering fails: end the process
            # and drop its home here, so a task that fails to load leaves nothing behind.
            await asyncio.shield(self.close())
            raise

    async def _spawn_and_load(self, main: Path, card: TaskCard, code_hash: str) -> TaskInfo:
        assert self._home is not None
        python = self.environment.python
        argv = [python, "-I", "-B", str(SERVE), str(self.path)]
        root = find_tree_root(self.path)
        tree = [root / "tasks"] if root is not None else []  # the namespace package, never the folder around it
        bounds = TaskBounds.from_env() if self.bounds == "env" else self.bounds
        assert bounds is None or isinstance(bounds, TaskBounds)
        record: dict[str, Any] = {}
        jailed = jail_argv(argv, python=python, read_only=[RUNTIME_DIR, *tree, self.path], home=self._home,
                           cwd=self.path, network=self.network, bounds=bounds, record=record)
        self._jailed = jailed is not None
        command = jailed or argv
        if bounds is not None:
            command = await self._bound(command, bounds, record)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=str(self.path), env=task_process_env(python, self._home), start_new_session=True,
                limit=protocol.MAX_LINE,
            )
        except OSError as e:
            raise TaskProcessError(f"cannot start the task process for {self.path} with {python}: {e}") from e
        _widen_pipes(self._proc)
        self._log_task = asyncio.ensure_future(self._collect_log())
        reply = await self._request({"op": "load"}, session=None)
        where = f"{main} load()"
        variants = [
            describe_variant(self.path, main,
                             (v["description"], v["task_id"], v["metadata"] or {}, v.get("computer")), i)
            for i, v in enumerate(reply["variants"])
        ]
        if not variants:
            raise TaskError(f"{where}: returned no variants")
        self.info = TaskInfo(self.path, main, card, code_hash, frozenset(reply["functions"]), variants)
        return self.info

    async def _bound(self, command: list[str], bounds: TaskBounds, record: dict[str, Any]) -> list[str]:
        """``command`` started in a cgroup of its own (``make_cgroup``) with its
        rlimits (``rlimits_for``); ``self._bounds_record`` says what applied."""
        assert self._home is not None
        uid = record.get("uid") or {"uid": os.geteuid(), "by": None, "why": "unjailed"}
        self._cgroup, notes = await asyncio.to_thread(make_cgroup, self._home.name, bounds)
        disk = record.get("disk") or {"bytes": None, "by": None, "why": "unjailed: its home and /tmp are the host's"}
        rlimits, how = rlimits_for(bounds, self._cgroup, task_uid=uid["uid"], disk_capped=disk.get("bytes") is not None)
        how["disk"] = disk.get("by")
        limits = {"pids": bounds.pids, "memory_bytes": bounds.memory, "disk_bytes": disk.get("bytes"),
                  "file_size_bytes": bounds.disk if "file_size" in how else None, "cpu_s_per_process": bounds.cpu_s}
        cg = self._cgroup
        self._bounds_record = {
            "limits": limits,
            "enforced_by": {"pids": how.get("pids"), "memory_bytes": how.get("memory"), "disk_bytes": how.get("disk"),
                            "file_size_bytes": how.get("file_size"), "cpu_s_per_process": how.get("cpu_s")},
            "cgroup": None if cg is None else {"version": cg.version, "folders": [str(d) for d in cg.folders()]},
            "uid": uid,
            "disk": disk,
            "rlimits": {k: list(v) for k, v in rlimits.items()},
            "notes": notes,
        }
        return bounds_launcher(command, procs=[] if cg is None else cg.procs_files(), rlimits=rlimits)

    def bounds_hit(self) -> dict[str, int]:
        """What in the task process's cgroup hit a bound so far: ``oom_kills``,
        ``pids_max`` (forks refused); empty without a cgroup."""
        if self._cgroup is None:
            return {}
        with contextlib.suppress(OSError):
            return {k: v for k, v in self._cgroup.events().items() if v}
        return {}

    @property
    def alive(self) -> bool:
        """Started and not ended (a call that timed out or crashed it ends it)."""
        return self._proc is not None and self._proc.returncode is None

    async def close(self) -> None:
        """End the process (politely, then by force) and drop its home folder."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.returncode is None and proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.write(protocol.dumps({"op": "exit"}))
                    await asyncio.wait_for(proc.stdin.drain(), 1)
                    proc.stdin.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 2)
            self._kill(proc)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 10)
            self.returncode = proc.returncode
        if self._log_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._log_task, 5)
            self._log_task = None
        if self.log_path is not None and self._log:
            with contextlib.suppress(OSError):
                self.log_path.write_bytes(bytes(self._log))
        cg, self._cgroup = self._cgroup, None
        if cg is not None:
            hit = {k: v for k, v in cg.events().items() if v}
            if self._bounds_record is not None:
                self._bounds_record["hit"] = hit
            if hit:
                self._log_line(f"[ale] the task process hit its bounds: {_describe_hit(hit)}")
                if self.log_path is not None:
                    with contextlib.suppress(OSError):
                        self.log_path.write_bytes(bytes(self._log))
            if not await asyncio.to_thread(cg.remove):
                self._log_line(f"[ale] could not remove the task process's cgroup {cg.folders()}")
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def fresh(self) -> TaskProcess:
        """A new, unstarted task process with this one's task, environment, log, card
        and network (a grading retry starts from a clean process)."""
        return TaskProcess(self.path, environment=self.environment, log_path=self.log_path, card=self._card,
                           network=self.network, bounds=self.bounds)

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the task's own children too
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    async def _collect_log(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while True:
            chunk = await self._proc.stderr.read(65536)
            if not chunk:
                self._keep_log(self._held)
                self._held = b""
                return
            self._route_log(chunk)

    def _route_log(self, chunk: bytes) -> None:
        """What the process printed: to the lease it is lent to up to the lease's end
        line (``_fork`` in serve.py), then to its own log."""
        mark = self._mark
        if mark is None:
            self._keep_log(chunk)
            return
        data, self._held = self._held + chunk, b""
        at = data.find(mark)
        if at < 0:
            keep = len(mark) - 1
            self._keep_log(data[: len(data) - keep])
            self._held = data[len(data) - keep :]
            return
        self._keep_log(data[:at])
        self._mark, self._sink = None, None
        self._marked.set()
        self._keep_log(data[at + len(mark) :])

    def _keep_log(self, data: bytes) -> None:
        """Into the task log (the lease's, while lent), up to ``LOG_LIMIT`` bytes; the rest is dropped."""
        if self._sink is not None:
            self._sink._keep_log(data)
            return
        room = LOG_LIMIT - len(self._log)
        if room > 0:
            self._log.extend(data[:room])

    def _note_call(self, request: dict[str, Any], answer: dict[str, Any], took: float) -> None:
        """Into the task log: every command the task ran and every session call that
        raised, with its outcome (a grader that swallows a failing command's stderr
        would otherwise leave a silent 0 no one can explain)."""
        method = str(request.get("method", ""))
        if method != "run_command" and answer.get("ok"):
            return
        self._noted += 1
        if self._noted > MAX_NOTED_CALLS:
            if self._noted == MAX_NOTED_CALLS + 1:
                self._log_line(f"[ale] further session calls are not noted (over {MAX_NOTED_CALLS})")
            return
        args = request.get("args") or []
        what = repr(_clip(str(args[0]), 300)) if args else ""
        if not answer.get("ok"):
            err = answer.get("error") or {}
            self._log_line(f"[ale] session {method}({what}) raised {err.get('type')}: "
                           f"{_clip(str(err.get('message')), 300)} ({took:.2f} s)")
            return
        raw = answer.get("value")
        value: dict[str, Any] = raw if isinstance(raw, dict) else {}
        code = value.get("return_code", value.get("returncode"))
        stderr = _clip(str(value.get("stderr") or "").strip(), 500)
        self._log_line(f"[ale] session run_command({what}) -> exit {code} in {took:.2f} s"
                       + (f"; stderr: {stderr}" if stderr and code not in (0, None) else ""))

    def _log_line(self, text: str) -> None:
        self._keep_log((text + "\n").encode("utf-8", errors="replace"))

    def log_tail(self, n: int = 4000) -> str:
        return bytes(self._log[-n:]).decode("utf-8", errors="replace")

    def evidence(self) -> dict[str, Any]:
        """How the task code ran: interpreter, environment names, tree root."""
        return {
            "isolation": "one process per run, from load() to the end of evaluate()",
            "python": self.environment.python,
            "environment": self.environment.description,
            "env_names": sorted(task_process_env(self.environment.python, Path("/")).keys()),
            "ale_defaults": ALE_TASK_ENV,
            "tree_root": None if (root := find_tree_root(self.path)) is None else str(root),
            "pid": None if self._proc is None else self._proc.pid,
            # ale.tasks.jail: None when the process ran unjailed (ALE_TASK_SANDBOX=off, no bwrap)
            "jail": None if not self._jailed else {
                "kind": "bubblewrap", "capabilities": [], "network": "host" if self.network else "loopback only"},
            # ale.tasks.jail.TaskBounds: the limits, what enforces each (a cgroup, an rlimit, a tmpfs's size;
            # None: not bounded), the cgroup version, the uid; None when unbounded (ALE_TASK_LIMITS=off)
            "bounds": self._bounds_record,
        }

    # -- calls ------------------------------------------------------------------
    async def call(
        self, role: str, variant: int, session: Any, *, timeout: float | None = None, env: dict[str, str] | None = None
    ) -> Any:
        """Run the task's ``role`` function for variant ``variant``; ``env`` is
        added to the process's environment first (judge credentials, for evaluate)."""
        methods = [m for m in SESSION_METHODS if callable(getattr(session, m, None))]
        iface = getattr(session, "interface", None)
        interface = [m for m in INTERFACE_METHODS if callable(getattr(iface, m, None))] if iface is not None else []
        message = {"op": "call", "role": role, "variant": variant, "env": env or {}, "methods": methods,
                   "interface": interface}
        try:
            return await asyncio.wait_for(self._request(message, session=session), timeout)
        except TimeoutError:
            if self._proc is not None:
                self._kill(self._proc)
            raise TaskProcessError(f"{role}() did not finish within {timeout:.0f}s: the task process was killed",
                                   self.log_tail()) from None

    async def _request(self, message: dict[str, Any], *, session: Any) -> Any:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise TaskProcessError("the task process is not running")
        try:
            await _send(proc, protocol.frame(message))
        except (ConnectionError, BrokenPipeError) as e:
            raise await self._died(f"the task process stopped reading ({e})") from e
        while True:
            try:
                line = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError) as e:
                self._kill(proc)
                raise TaskProcessError(f"the task process sent a message over {protocol.MAX_LINE} bytes",
                                       self.log_tail()) from e
            if not line:
                raise await self._died("the task process exited")
            try:
                obj, sizes = protocol.head(line)
                blobs = [await proc.stdout.readexactly(n) for n in sizes]
                reply = protocol.decode(obj, blobs)
            except asyncio.IncompleteReadError:
                raise await self._died("the task process exited inside a message") from None
            except ValueError as e:
                self._kill(proc)
                raise TaskProcessError(f"the task process broke the protocol: {e}", self.log_tail()) from e
            op = reply.get("op")
            if op == "result":
                return reply.get("value")
            if op == "error":
                if reply.get("task_error"):
                    raise TaskError(str(reply.get("message")))
                raise TaskCallFailed(
                    f"{reply.get('type')}: {reply.get('message')}", str(reply.get("type")),
                    str(reply.get("traceback") or "")
                )
            if op == "session":
                t0 = time.monotonic()
                answer = await serve_session_call(session, reply)
                self._note_call(reply, answer, time.monotonic() - t0)
                data = protocol.frame(answer)
                if (size := sum(len(c) for c in data)) > protocol.MAX_MESSAGE:
                    # Too large for the channel (a candidate's huge file read whole): the
                    # task gets an OSError it can score as a 0; its process stays alive.
                    data = protocol.frame(_error(answer.get("sid"), OSError(
                        errno.EFBIG, f"the answer to session call {reply.get('method')!r} is {size} bytes "
                        f"encoded, above the task channel's limit of {protocol.MAX_MESSAGE}")))
                del answer
                await _send(proc, data)
                continue
            if op == "ended" and isinstance(self, LentTaskProcess):  # the fork serving this run is gone
                self._ended = reply
                raise await self._fork_died(reply)
            self._kill(proc)
            raise TaskProcessError(f"the task process sent an unknown message {op!r}", self.log_tail())

    async def _died(self, what: str) -> TaskProcessError:
        proc = self._proc
        code = None
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(proc.wait(), 5)
        if self._log_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._log_task), 2)
        how = "" if code is None else (f" (killed by signal {-code})" if code < 0 else f" (exit code {code})")
        if hit := self.bounds_hit():
            how += f" after hitting its bounds: {_describe_hit(hit)}"
        tail = self.log_tail()
        return TaskProcessError(f"{what}{how}" + (f"; its last output:\n{tail}" if tail else ""), tail)


PIPE_BYTES = 1024 * 1024  # the channel's pipes: a big blob crosses in 1 MiB writes, not 64 KiB ones


def _widen_pipes(proc: asyncio.subprocess.Process) -> None:
    for stream in (proc.stdin, proc.stdout):
        transport = getattr(stream, "transport", None) or getattr(stream, "_transport", None)
        pipe = transport.get_extra_info("pipe") if transport is not None else None
        if pipe is not None and hasattr(fcntl, "F_SETPIPE_SZ"):
            with contextlib.suppress(OSError):  # above the host's pipe-max-size: the default stays
                fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


class LentTaskProcess(TaskProcess):
    """One run's task process, lent by a ``TaskProcessPool``: a fork of a warm process
    that has run ``load()``, so the run starts from the state a process of its own has
    after ``load()``, without a new interpreter, jail and import. Used like a
    ``TaskProcess`` (``start``, ``call``, ``close``); ``fresh()`` is a process of its
    own (a grading retry starts from a new one, ``load()`` included).

    What it shares with the warm process, and how each stays the run's own: the
    state after ``load()`` (copied by the fork; nothing the run does reaches the warm
    process); the writable places (files the run made there are removed at its end;
    a file of before that it changed or removed retires the warm process); the
    processes it starts (its own process group, killed at its end; one left in the
    jail retires the warm process); the jail's bounds (its cgroup: memory and
    processes counted with the warm process's own, a bound hit during the run noted in
    its log; a fresh ``RLIMIT_CPU`` count); its log (what it printed, up to the end
    line the warm process writes when the fork is gone). A call that times out kills
    the warm process with the fork, as a run's own process would be killed."""

    def __init__(self, pool: TaskProcessPool, *, log_path: Path | None = None):
        super().__init__(pool.path, environment=pool.environment, log_path=log_path, card=pool.card,
                         network=pool.network, bounds=pool.bounds)
        self._pool = pool
        self._warm: TaskProcess | None = None
        self._hit_at_start: dict[str, int] = {}
        self._busy = False
        self.pid: int | None = None

    async def start(self) -> TaskInfo:
        warm = await self._pool.take()
        self._warm, self._proc, self._jailed = warm, warm._proc, warm._jailed
        self._bounds_record = None if warm._bounds_record is None \
            else {**warm._bounds_record, "shared_with": "a warm process"}
        self._hit_at_start = warm.bounds_hit()
        token = f"[ale] lease {secrets.token_hex(16)} ended"
        warm._sink, warm._mark, warm._held = self, ("\n" + token + "\n").encode(), b""
        warm._marked = asyncio.Event()
        assert warm._home is not None
        writable = ["/tmp", "/dev/shm", str(warm._home)] if warm._jailed else [str(warm._home)]
        try:
            reply = await self._request({"op": "fork", "token": token, "writable": writable, "jailed": warm._jailed},
                                        session=None)
        except BaseException:
            await asyncio.shield(self.close())
            raise
        self.pid = int(reply["pid"])
        self.info = warm.info
        assert self.info is not None
        return self.info

    async def _request(self, message: dict[str, Any], *, session: Any) -> Any:
        self._busy = True
        try:
            return await super()._request(message, session=session)
        finally:
            self._busy = False

    async def _settle(self, warm: TaskProcess) -> bool:
        """Wait for the end line of this run's part of the log; False when it never came."""
        try:
            await asyncio.wait_for(warm._marked.wait(), 5)
            return True
        except TimeoutError:
            return False

    async def _fork_died(self, reply: dict[str, Any]) -> TaskProcessError:
        if self._warm is not None:
            await self._settle(self._warm)
        code = reply.get("code")
        how = "" if not isinstance(code, int) \
            else (f" (killed by signal {-code})" if code < 0 else f" (exit code {code})")
        if hit := self.bounds_hit():
            how += f" after hitting its bounds: {_describe_hit(hit)}"
        tail = self.log_tail()
        return TaskProcessError(f"the task process exited{how}" + (f"; its last output:\n{tail}" if tail else ""), tail)

    def bounds_hit(self) -> dict[str, int]:
        """What hit a bound while this run had the warm process's jail."""
        return {} if self._warm is None else self._hit_since_start(self._warm)

    def _hit_since_start(self, warm: TaskProcess) -> dict[str, int]:
        now = warm.bounds_hit()
        return {k: v - self._hit_at_start.get(k, 0) for k, v in now.items() if v > self._hit_at_start.get(k, 0)}

    @property
    def alive(self) -> bool:
        return self._warm is not None and self._warm.alive and self._ended is None

    async def close(self) -> None:
        """End the fork (``exit``) and give the warm process back: reused when the run
        left it as after ``load()``, else ended."""
        warm, self._warm = self._warm, None
        if warm is None:
            return
        reusable = False
        proc = warm._proc
        try:
            if self._ended is None and warm.alive and proc is not None and not self._busy:
                with contextlib.suppress(Exception):
                    await _send(proc, protocol.frame({"op": "exit"}))
                    self._ended = await asyncio.wait_for(_read_ended(proc), 10)
            if self._ended is not None:
                settled = await self._settle(warm)
                code = self._ended.get("code")
                self.returncode = code if isinstance(code, int) else None
                reusable = settled and self._ended.get("clean") is True and warm.alive
            hit = self._hit_since_start(warm)
            if hit:
                self._log_line(f"[ale] the task process hit its bounds: {_describe_hit(hit)}")
                reusable = False
        finally:
            warm._sink, warm._mark, warm._held = None, None, b""
            self._proc = None
            if self.log_path is not None and self._log:
                with contextlib.suppress(OSError):
                    self.log_path.write_bytes(bytes(self._log))
            await self._pool.give_back(warm, reusable)

    def evidence(self) -> dict[str, Any]:
        doc = super().evidence()
        doc["isolation"] = "a fork of a warm task process after load(), one per run, to the end of evaluate()"
        doc["pid"] = self.pid
        return doc


async def _read_ended(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """The warm process's ``ended`` message, once the fork it lent is gone."""
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    obj, sizes = protocol.head(line)
    blobs = [await proc.stdout.readexactly(n) for n in sizes]
    reply = protocol.decode(obj, blobs)
    if reply.get("op") != "ended":
        raise ValueError(f"expected the end of a lease, got {reply.get('op')!r}")
    return reply


class TaskProcessPool:
    """Warm task processes of one task folder (each started and ``load()``ed once),
    lending a fork per run: ``lend()`` gives an unstarted ``LentTaskProcess``. A warm
    process is made when none is free (at most as many as runs at once), reused while
    the runs it lent leave it as after ``load()``, ended otherwise. ``close()`` ends
    them all. ``spawned`` and ``lent`` count what it did."""

    def __init__(self, task_dir: str | Path, *, environment: TaskEnvironment | None = None,
                 card: TaskCard | None = None, network: bool = False, bounds: TaskBounds | None | str = "env"):
        self.path = Path(task_dir).expanduser().resolve()
        self.environment = environment or TaskEnvironment()
        self.card = card
        self.network = network
        self.bounds = bounds
        self._idle: list[TaskProcess] = []
        self._live: set[TaskProcess] = set()
        self._closed = False
        self.spawned = 0
        self.lent = 0

    def lend(self, *, log_path: Path | None = None) -> LentTaskProcess:
        return LentTaskProcess(self, log_path=log_path)

    async def take(self) -> TaskProcess:
        if self._closed:
            raise TaskProcessError("the pool of task processes is closed")
        while self._idle:
            warm = self._idle.pop()
            if warm.alive:
                self.lent += 1
                return warm
            self._live.discard(warm)
            await warm.close()
        warm = TaskProcess(self.path, environment=self.environment, card=self.card, network=self.network,
                           bounds=self.bounds)
        await warm.start()  # raises as a run's own process would (TaskError, TaskProcessError)
        self._live.add(warm)
        self.spawned += 1
        self.lent += 1
        return warm

    async def warm_up(self, n: int) -> None:
        """Start warm processes until ``n`` are idle (before the runs that need them)."""
        async def one() -> None:
            warm = TaskProcess(self.path, environment=self.environment, card=self.card, network=self.network,
                               bounds=self.bounds)
            await warm.start()
            self._live.add(warm)
            self.spawned += 1
            await self.give_back(warm, True)

        await asyncio.gather(*(one() for _ in range(max(0, n - len(self._idle)))))

    async def give_back(self, warm: TaskProcess, reusable: bool) -> None:
        if reusable and warm.alive and not self._closed:
            self._idle.append(warm)
            return
        self._live.discard(warm)
        await warm.close()

    async def close(self) -> None:
        self._closed = True
        live, self._live, self._idle = list(self._live), set(), []
        await asyncio.gather(*(w.close() for w in live), return_exceptions=True)


async def _send(proc: asyncio.subprocess.Process, chunks: list[bytes]) -> None:
    """One frame to the task process, a pipe's worth at a time: a big blob is never
    copied whole into the transport's buffer, other runs' work goes on between the
    writes, and each chunk is dropped as soon as the pipe has taken it."""
    assert proc.stdin is not None
    while chunks:
        view = memoryview(chunks.pop(0))
        for at in range(0, len(view), PIPE_BYTES):
            proc.stdin.write(view[at : at + PIPE_BYTES])
            await proc.stdin.drain()
        view.release()


async def serve_session_call(session: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Answer one session call of the task with the harness's session object."""
    sid = request.get("sid")
    name = str(request.get("method", ""))
    target: Any = session
    parts = name.split(".")
    if not all(p.isidentifier() and not p.startswith("_") for p in parts) or len(parts) > 2:
        return _error(sid, AttributeError(f"no session method {name!r}"))
    if len(parts) == 2:
        if parts[0] != "interface":
            return _error(sid, AttributeError(f"no session method {name!r}"))
        target = getattr(session, "interface", None)
    fn: Callable[..., Awaitable[Any]] | None = getattr(target, parts[-1], None) if target is not None else None
    if fn is None or not callable(fn):
        return _error(sid, AttributeError(f"the session has no method {name!r}"))
    try:
        value = fn(*(request.get("args") or []), **(request.get("kwargs") or {}))
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
    except Exception as e:
        return _error(sid, e)
    return {"op": "session_result", "sid": sid, "ok": True, "value": value}


def _describe_hit(hit: Mapping[str, int]) -> str:
    names = {"oom_kills": "memory (processes killed: {})", "pids_max": "processes (forks refused: {})"}
    return ", ".join(names.get(k, k + " {}").format(v) for k, v in hit.items())


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n // 2] + " … " + text[-n // 2:]


def _error(sid: Any, e: BaseException) -> dict[str, Any]:
    err: dict[str, Any] = {"type": type(e).__name__, "message": str(e)}
    for attr in ("returncode", "cmd", "stdout", "stderr"):
        if hasattr(e, attr):
            err[attr] = getattr(e, attr)
    # Subclasses the task cannot know travel as their nearest builtin.
    err["type"] = next(b.__name__ for b in type(e).__mro__ if b.__module__ == "builtins")
    if type(e).__name__ == "CalledProcessError":
        err["type"] = "CalledProcessError"
    return {"op": "session_result", "sid": sid, "ok": False, "error": err}


async def inspect_task(task_dir: str | Path, *, environment: TaskEnvironment | None = None) -> TaskInfo:
    """Load a task in a short-lived task process and describe it (``TaskError`` if
    malformed). The tree's environment is built first when it is not yet."""
    if environment is None:
        environment = await asyncio.to_thread(resolve_environment, task_dir)
    async with TaskProcess(task_dir, environment=environment) as proc:
        assert proc.info is not None
        return proc.info


def inspect_task_sync(task_dir: str | Path, *, environment: TaskEnvironment | None = None) -> TaskInfo:
    """``inspect_task`` for synchronous callers, inside a running event loop too
    (then on a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(inspect_task(task_dir, environment=environment))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, inspect_task(task_dir, environment=environment)).result()
