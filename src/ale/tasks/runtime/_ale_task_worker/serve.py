"""The task process's main loop: ``python -I serve.py TASK_DIR``, spoken to over stdin/stdout.

The harness sends ``load``, then ``call`` for ``start``, ``solve`` and ``evaluate``
(each with the variant's index and the names of the session methods it serves),
then ``exit``. While a task function runs, every session call it makes is sent to
the harness as a ``session`` message and answered by a ``session_result``; the
harness owns the sandbox, the routes and the records. The task's own prints go
to stderr (the harness keeps them as the task log), never into the channel.

One process serves one run from ``load()`` to the end of ``evaluate()``, so a
task's module-level state between ``start()`` and ``evaluate()`` survives, and no
other task's modules are ever in this interpreter. A warm process
(``TaskProcessPool``) serves many runs, one at a time, each by a fork made after
``load()`` (``fork``): the run's ``start()`` and ``evaluate()`` happen in the fork,
which ends with the run (``exit``), leaving this process as it was.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import logging
import os
import stat
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, BinaryIO

if __package__ in (None, ""):  # run as a script: make the package importable by name
    sys.path.append(str(Path(__file__).resolve().parent.parent))
    from _ale_task_worker import importer, protocol
else:
    from . import importer, protocol

# Exceptions a session call may raise in the task, by the name the harness sends.
_RAISABLE = {
    name: getattr(builtins, name)
    for name in (
        "FileNotFoundError", "FileExistsError", "PermissionError", "IsADirectoryError",
        "NotADirectoryError", "TimeoutError", "ValueError", "TypeError", "KeyError",
        "RuntimeError", "OSError", "NotImplementedError", "AttributeError", "ConnectionError",
    )
}


class SessionCallError(RuntimeError):
    """A session call failed in the harness with an error that has no builtin twin."""


def _hybrid(base: type[BaseException]) -> type[BaseException]:
    # cua-bench's file calls raise RuntimeError; ours raise the precise OSError.
    # The task gets both: `except RuntimeError` and `except FileNotFoundError` catch it.
    return type(base.__name__, (base, RuntimeError), {"__module__": "cua_bench.session"})


for _name in ("FileNotFoundError", "FileExistsError", "PermissionError", "IsADirectoryError", "NotADirectoryError",
              "OSError"):
    _RAISABLE[_name] = _hybrid(_RAISABLE[_name])


class Channel:
    def __init__(self, inp: BinaryIO, out: BinaryIO):
        self.inp = inp
        self.out = out

    def send(self, message: dict[str, Any]) -> None:
        for chunk in protocol.frame(message):
            view = memoryview(chunk)
            while view:  # a pipe may take a big blob in parts
                view = view[self.out.write(view) or 0 :]
        self.out.flush()

    def recv(self) -> dict[str, Any]:
        line = self.inp.readline(protocol.MAX_LINE)
        if not line:
            raise SystemExit(0)  # the harness closed the channel: nothing more to do
        obj, sizes = protocol.head(line)
        blobs = []
        for n in sizes:
            blob = self.inp.read(n)
            if len(blob) != n:
                raise SystemExit(0)  # the harness closed the channel inside a frame
            blobs.append(blob)
        return protocol.decode(obj, blobs)


def _raise_remote(error: dict[str, Any]) -> None:
    kind, message = str(error.get("type", "")), str(error.get("message", ""))
    if kind == "CalledProcessError":
        raise subprocess.CalledProcessError(
            int(error.get("returncode", 1)), error.get("cmd", ""), error.get("stdout"), error.get("stderr")
        )
    exc = _RAISABLE.get(kind)
    if exc is not None:
        raise exc(message)
    raise SessionCallError(f"{kind}: {message}")


class _Remote:
    """Forwards each method it was told about to the harness, as an async call."""

    def __init__(self, channel: Channel, prefix: str, methods: list[str], ids: itertools.count):
        self._channel = channel
        self._prefix = prefix
        self._ids = ids
        for name in methods:
            setattr(self, name, self._method(prefix + name))

    def _method(self, qualified: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = _gui_args(qualified, args, kwargs)
            sid = next(self._ids)
            self._channel.send({"op": "session", "sid": sid, "method": qualified, "args": list(args), "kwargs": kwargs})
            reply = self._channel.recv()
            if reply.get("op") != "session_result" or reply.get("sid") != sid:
                raise SessionCallError(f"protocol error: expected the result of session call {sid}, got "
                                       f"{reply.get('op')!r}")
            if not reply.get("ok"):
                _raise_remote(reply.get("error") or {})
            return _gui_value(qualified, reply.get("value"))

        call.__name__ = qualified.rsplit(".", 1)[-1]
        return call


def _plain_action(value: Any) -> Any:
    """A cua-bench action object travels as ``{"type": <class name>, **fields}``."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **dataclasses.asdict(value)}
    if hasattr(value, "model_dump") and callable(value.model_dump):  # pydantic actions
        return {"type": type(value).__name__, **value.model_dump()}
    return value


FOLDER_LIMIT = 32 * 1024 * 1024


def _gui_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if name == "execute_action":
        return tuple(_plain_action(a) for a in args), {k: _plain_action(v) for k, v in kwargs.items()}
    if name == "launch_window" and kwargs.get("folder") is not None:
        # The folder is the task's (this process's file system): its text files travel.
        root = Path(str(kwargs["folder"])).resolve()
        if not root.is_dir():
            raise ValueError(f"Folder does not exist or is not a directory: {kwargs['folder']}")
        files, total = {}, 0
        for f in sorted(root.rglob("*")):
            if f.is_file():
                data = f.read_bytes()
                total += len(data)
                if total > FOLDER_LIMIT:
                    raise ValueError(f"launch_window(folder=...): more than {FOLDER_LIMIT} bytes")
                files[f.relative_to(root).as_posix()] = data.decode("utf-8", errors="replace")
        kwargs = {**kwargs, "files": files}
    return args, kwargs


def _gui_value(name: str, value: Any) -> Any:
    if name == "get_snapshot" and isinstance(value, dict):
        try:
            from cua_bench import Snapshot, WindowSnapshot  # the stand-in's (or upstream's) types
        except ImportError:
            return value
        try:
            return Snapshot(windows=[WindowSnapshot(**w) for w in value.get("windows", [])])
        except TypeError:
            return value
    return value


class RemoteSession(_Remote):
    """The session a task function receives: cua-bench's method names, served by the harness."""

    def __init__(self, channel: Channel, methods: list[str], interface: list[str]):
        ids = itertools.count(1)
        super().__init__(channel, "", methods, ids)
        if interface:
            self.interface = _Remote(channel, "interface.", interface, ids)


def _describe(main: Path, items: list[Any], functions: dict[str, Any]) -> dict[str, Any]:
    where = f"{main} load()"
    variants = []
    for i, item in enumerate(items):
        description, task_id, metadata, computer = importer.variant_fields(item, i, where)
        variants.append({"description": description, "task_id": task_id, "metadata": metadata, "computer": computer})
    return {"main": str(main), "functions": sorted(functions), "variants": variants}


def _event_loop() -> Any:
    # asyncio costs 20-30 ms to import: after load() has answered, while the harness
    # creates and starts the sandbox, not before (a run waits on load(), not on this).
    import asyncio

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop


_PREWARM: list[Any] = []


def _prewarm() -> None:
    """Import asyncio in the background while the harness starts the sandbox; an
    ``exit`` that comes first (``ale task list`` only loads) does not wait for it."""
    import threading

    t = threading.Thread(target=__import__, args=("asyncio",), daemon=True)
    t.start()
    _PREWARM.append(t)


def _snapshot(roots: list[str]) -> dict[str, tuple[int, int, int]]:
    """Every entry under the writable ``roots``: (mode, size, mtime) of a file or link."""
    seen: dict[str, tuple[int, int, int]] = {}
    for root in dict.fromkeys(os.path.realpath(r) for r in roots):
        for top, dirs, files in os.walk(root):
            for name in dirs + files:
                path = os.path.join(top, name)
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    # a folder is the same while it holds the same entries (each listed itself)
                    seen[path] = (st.st_mode, 0, 0) if stat.S_ISDIR(st.st_mode) \
                        else (st.st_mode, st.st_size, st.st_mtime_ns)
    return seen


def _set_dumpable(on: bool) -> None:
    """``prctl(PR_SET_DUMPABLE)``: a warm process is not dumpable, so a fork it lends
    (the same uid, in the same jail) cannot ptrace it or write its memory through
    ``/proc``; the fork makes itself dumpable again, as any process is."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 1 if on else 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _pids() -> set[int]:
    return {int(n) for n in os.listdir("/proc") if n.isdigit()}


def _fork(channel: Channel, msg: dict[str, Any]) -> bool:
    """A lease: a child that serves one run from here (``start``, ``evaluate``, then
    ``exit``) with this process's state after ``load()``, as a process of its own
    that had just loaded would. True in the child. In this process: wait for the
    child's end, remove what it left (files it made under the writable places,
    processes it started), then say ``ended`` with its exit code and whether this
    process is still as after ``load()`` (``clean``: no file of before changed or
    gone, no process left behind)."""
    for t in _PREWARM:
        t.join()
    roots, token, jailed = list(msg.get("writable") or []), str(msg.get("token", "")), bool(msg.get("jailed"))
    before, pids = _snapshot(roots), (_pids() if jailed else set())
    sys.stdout.flush()
    sys.stderr.flush()
    _set_dumpable(False)
    pid = os.fork()
    if pid == 0:
        _set_dumpable(True)
        os.setpgid(0, 0)  # what it starts is its own process group: ended with it
        channel.send({"op": "result", "value": {"pid": os.getpid()}})
        return True
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    clean = True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, 9)
        clean = False
    if jailed:  # the jail's own PID namespace: any new process is the lease's
        for left in _pids() - pids - {os.getpid()}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(left, 9)
                clean = False
    after = _snapshot(roots)
    for path in sorted(set(after) - set(before), key=len, reverse=True):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
    if any(after.get(path) != meta for path, meta in before.items()):
        clean = False
    sys.stderr.write(f"\n{token}\n")
    sys.stderr.flush()
    channel.send({"op": "ended", "code": code, "clean": clean})
    return False


def serve(task_dir: str, channel: Channel) -> None:
    loop: Any = None
    items: list[Any] = []
    functions: dict[str, Any] = {}
    while True:
        msg = channel.recv()
        op = msg.get("op")
        try:
            if op == "exit":
                # Done: what the task printed is flushed; the interpreter's teardown (10 ms
                # and more with big modules loaded) is skipped, its home is the harness's to drop.
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os._exit(0)
            if op == "load":
                main, _module, functions = importer.load_module(Path(task_dir), persistent=True)
                items = importer.call_load(functions["load"], main)
                channel.send({"op": "result", "value": _describe(main, items, functions)})
                _prewarm()
            elif op == "fork":
                if _fork(channel, msg):
                    continue
            elif op == "call":
                role, index = msg["role"], int(msg["variant"])
                fn = functions.get(role)
                if fn is None:
                    raise importer.TaskError(f"the task defines no {role}()")
                os.environ.update(msg.get("env") or {})
                session = RemoteSession(channel, list(msg.get("methods") or []), list(msg.get("interface") or []))
                loop = loop or _event_loop()
                value = loop.run_until_complete(importer.call_task_fn(fn, items[index], session))
                channel.send({"op": "result", "value": value})
            else:
                raise ValueError(f"unknown message {op!r}")
        except SystemExit:
            raise
        except BaseException as e:  # the task's own failure: reported, the process goes on
            channel.send({
                "op": "error",
                "type": type(e).__name__,
                "task_error": isinstance(e, importer.TaskError),
                "message": str(e)[:20_000],
                "traceback": traceback.format_exc()[-20_000:],
            })


def main() -> None:
    # Should the host run out of memory (candidate code a grader imports can
    # allocate without bound), the kernel kills this process and what it starts
    # first, never the harness or another run's controller.
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    # The channel is the original stdin/stdout; the task's prints go to stderr.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    inp = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for stream in (sys.stdout, sys.stderr):  # a grader that dies still leaves what it printed
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    # Graders log their score breakdown at INFO (as ALE's runner configures): keep it.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(sys.argv[1], Channel(inp, out))


if __name__ == "__main__":
    main()
