"""The end of the candidate's turn, done from the host: the sandbox's tasks are
frozen, then every one but init (and the users kept alive, a desktop's) gets
SIGKILL from outside, then they are thawed and their deaths awaited.

Nothing in the sandbox runs any part of it: a candidate process cannot signal,
slow, stall or write into it. Every step is bounded (``bound_s`` in all), and
nothing in it recurses: a forced kill is not another exec of the same kind.

``StopOutcome`` is the provider-neutral record of one stop (Docker's cgroup
freezer here; a VM provider's ``stop`` is QMP ``stop`` then its own kill, with
the same outcome), written as ``evidence/stop.json``.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# How long the whole host-side stop may take (freeze, kill, thaw, the deaths).
STOP_BOUND_S = 15.0
# How long the freezer may take to report FROZEN before the kill goes ahead anyway
# (a task in uninterruptible sleep cannot freeze; SIGKILL still reaches it).
FREEZE_WAIT_S = 2.0
# How long a task with SIGKILL pending in uninterruptible sleep is waited for
# before it is counted dead (it never runs user code again).
DYING_WAIT_S = 3.0

_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


@dataclass
class StopOutcome:
    """What one host-side stop did.

    - ``method``: how (``cgroup-v1-freezer``, ``cgroup-v2``, ``qmp``,
      ``engine-exec-root`` under gVisor: the engine's exec as uid 0 with CAP_KILL in
      its sentry, or ``exec`` where the host cannot reach the sandbox's tasks: the
      old in-sandbox kill);
    - ``killed``: tasks sent SIGKILL; ``dying``: of those, tasks still in
      uninterruptible sleep with SIGKILL pending when the wait ended (counted dead);
    - ``survivors``: candidate tasks still alive after it (``pid:uid:state:name``);
    - ``kept``: live tasks of a kept user (a desktop's display, graded live);
    - ``sandbox_stopped``: the sandbox's init was gone (the sandbox had stopped);
    - ``within_bound``: it ended before ``bound_s``.
    """

    method: str
    started_at: str
    duration_s: float = 0.0
    bound_s: float = STOP_BOUND_S
    within_bound: bool = True
    frozen: bool = False
    freeze_s: float | None = None
    killed: int = 0
    dying: int = 0
    survivors: list[str] = field(default_factory=list)
    kept: int = 0
    sandbox_stopped: bool = False
    cgroup: str | None = None
    detail: str = ""

    @property
    def clean(self) -> bool:
        """No candidate task is left that could still run."""
        return not self.survivors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HostUnreachable(Exception):
    """The host cannot reach the sandbox's tasks (the engine on another machine, a
    runtime whose tasks are not the container's processes): the caller falls back."""


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class Cgroup:
    """One container's cgroup, as the host mounts it."""

    version: int  # 1 (the v1 freezer hierarchy) or 2 (unified)
    path: Path  # the v1 freezer's directory, or the unified directory

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def freeze(self, frozen: bool) -> None:
        if self.version == 1:
            (self.path / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
        else:
            (self.path / "cgroup.freeze").write_text("1" if frozen else "0")

    def is_frozen(self) -> bool:
        if self.version == 1:
            return (self.path / "freezer.state").read_text().strip() == "FROZEN"
        events = (self.path / "cgroup.events").read_text().split()
        return "frozen" in events and events[events.index("frozen") + 1] == "1"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except FileNotFoundError:  # the cgroup went with its container
            return []


def _mount_points() -> tuple[Path | None, Path | None]:
    """The host's v1 freezer mount and its cgroup2 mount, from /proc/self/mountinfo."""
    freezer = unified = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None, None
    for ln in lines:
        left, _, right = ln.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 3:
            continue
        if r[0] == "cgroup" and "freezer" in r[2].split(","):
            freezer = Path(f[4])
        elif r[0] == "cgroup2":
            unified = Path(f[4])
    return freezer, unified


def find_cgroup(host_pid: int, container_id: str) -> Cgroup:
    """The cgroup of the container whose init is ``host_pid`` on this host; raises
    ``HostUnreachable`` unless that pid's cgroup names the container (the engine runs
    elsewhere, or this process sees another PID namespace than the engine's)."""
    if host_pid <= 0:
        raise HostUnreachable("the sandbox has no init on the host")
    try:
        lines = Path(f"/proc/{host_pid}/cgroup").read_text().splitlines()
    except OSError as e:
        raise HostUnreachable(f"cannot read /proc/{host_pid}/cgroup: {e}") from e
    freezer_mnt, unified_mnt = _mount_points()
    for ln in lines:
        _hid, controllers, rel = ln.split(":", 2)
        if container_id not in rel:
            continue
        if "freezer" in controllers.split(",") and freezer_mnt is not None:
            path = freezer_mnt / rel.lstrip("/")
            if (path / "freezer.state").is_file():
                return Cgroup(1, path)
    for ln in lines:
        _hid, controllers, rel = ln.split(":", 2)
        if controllers == "" and container_id in rel and unified_mnt is not None:
            path = unified_mnt / rel.lstrip("/")
            if (path / "cgroup.freeze").is_file():
                return Cgroup(2, path)
    raise HostUnreachable(f"pid {host_pid} is not in a freezable cgroup of container {container_id[:12]} on this host")


@dataclass
class _Task:
    pid: int
    uid: int
    state: str
    name: str
    kill_pending: bool


def _task(pid: int, uid_base: int) -> _Task | None:
    """The task's real uid (mapped into the sandbox's user namespace), state, name and
    whether SIGKILL is pending; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for ln in text.splitlines():
        k, _, v = ln.partition(":")
        fields[k] = v.strip()
    try:
        uid = int(fields["Uid"].split()[0]) - uid_base
        pending = int(fields.get("SigPnd", "0"), 16) | int(fields.get("ShdPnd", "0"), 16)
    except (KeyError, ValueError, IndexError):
        return None
    return _Task(pid, uid, fields.get("State", "?")[:1], fields.get("Name", ""), bool(pending & _SIGKILL_BIT))


def _uid_base(host_pid: int) -> int:
    """The host uid the sandbox's uid 0 maps to (0 without a user namespace)."""
    try:
        first = Path(f"/proc/{host_pid}/uid_map").read_text().split()
        return int(first[1]) - int(first[0])
    except (OSError, IndexError, ValueError):
        return 0


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def stop_cgroup(cg: Cgroup, init_pid: int, *, keep_uids: tuple[int, ...] = (), bound_s: float = STOP_BOUND_S,
                method: str | None = None) -> StopOutcome:
    """Freeze ``cg``, SIGKILL every task in it but ``init_pid`` and the ``keep_uids``'
    own, thaw, and wait (bounded) until each is gone or dying. Synchronous: run it
    in a thread. Never raises for a task that vanished under it."""
    started, t0 = _now_iso(), time.monotonic()
    deadline = t0 + bound_s
    out = StopOutcome(method or f"cgroup-v{cg.version}" + ("-freezer" if cg.version == 1 else ""), started,
                      bound_s=bound_s, cgroup=str(cg.path))
    base = _uid_base(init_pid)
    targets: dict[int, _Task] = {}
    try:
        cg.freeze(True)
        freeze_until = min(deadline, t0 + FREEZE_WAIT_S)
        while not cg.is_frozen() and time.monotonic() < freeze_until:
            time.sleep(0.005)
        out.frozen = cg.is_frozen()
        out.freeze_s = round(time.monotonic() - t0, 4)
        # Frozen, no task forks: one pass reaches all. Not frozen (a task in D state),
        # sweep until the set stops growing: a task with SIGKILL pending cannot fork.
        for _sweep in range(1 if out.frozen else 20):
            grew = False
            for pid in cg.pids():
                if pid == init_pid or pid in targets:
                    continue
                t = _task(pid, base)
                if t is None or t.uid in keep_uids:
                    continue
                targets[pid] = t
                grew = True
                if _kill(pid):
                    out.killed += 1
            if not grew or time.monotonic() > deadline:
                break
    except OSError as e:
        out.detail = f"the freezer failed: {e}"
    finally:
        try:
            cg.freeze(False)
        except OSError as e:
            out.detail += f"; thaw failed: {e}"
    # The deaths: a task still running after SIGKILL is killed again (it was not
    # frozen); a task in D with SIGKILL pending is waited for, then counted dead.
    dying_since: float | None = None
    while True:
        now = time.monotonic()
        alive, dying = [], []
        present = set(cg.pids())
        for pid in present:
            if pid == init_pid:
                continue
            t = _task(pid, base)
            if t is None or t.state in ("Z", "X"):
                continue
            if t.uid in keep_uids and pid not in targets:
                continue
            if pid not in targets:  # forked before its parent's kill took effect
                targets[pid] = t
                out.killed += _kill(pid)
                alive.append(t)
            elif t.state == "D" and t.kill_pending:
                dying.append(t)
            else:
                _kill(pid)
                alive.append(t)
        if not alive and not dying:
            break
        if not alive and dying:
            dying_since = dying_since or now
            if now - dying_since > DYING_WAIT_S or now > deadline:
                out.dying = len(dying)
                break
        elif now > deadline:
            out.survivors = [f"{t.pid}:{t.uid}:{t.state}:{t.name}" for t in alive]
            out.dying = len(dying)
            break
        time.sleep(0.01)
    out.kept = sum(1 for pid in cg.pids() if pid != init_pid and (t := _task(pid, base)) is not None
                   and t.uid in keep_uids and t.state not in ("Z", "X"))
    out.sandbox_stopped = not Path(f"/proc/{init_pid}").exists() or init_pid not in set(cg.pids())
    out.duration_s = round(time.monotonic() - t0, 4)
    out.within_bound = out.duration_s <= bound_s
    return out
