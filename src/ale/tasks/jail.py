"""The task process's jail: bubblewrap around the task's interpreter.

Task code is the task author's, but graders run what the candidate wrote: a host
side grader that imports or executes a file from the output (ALE's
``dit_pipeline_cfg_alignment`` runs the candidate's pipeline with
``sys.executable``) would otherwise run it as the harness's user, beside the
signing key, the runs folder and every task's data. In the jail the task process
sees only what it needs: ``/usr`` and a few files of ``/etc`` (read-only), its
interpreter (the tree's venv and the base installation it points at), the harness's
task runtime and the task tree (read-only), its own home (read-write) and a fresh
``/tmp`` (a folder of that home: on disk, not in memory), ``/proc`` and ``/dev``. Its
own PID, IPC and UTS namespaces, no capabilities (also when the harness runs as root);
it dies with its parent. Its own network namespace too (loopback only), unless the run
gives ``evaluate()`` judge credentials or ``ALE_TASK_NETWORK=on`` (``task_network``):
an LLM judge needs the network, and nothing else in a task process does.

``ALE_TASK_SANDBOX=off`` runs the task process unjailed (also when bubblewrap is
missing, with a warning in the task log).

Bounds (``TaskBounds``): each task process gets its own cgroup (v2, or v1's memory and
pids hierarchies, whichever the host offers: ``make_cgroup``) capping its processes and
memory (tmpfs pages count), its writable places are size-capped tmpfs (its home and
``/tmp`` one tmpfs, ``/dev/shm`` another; the rest of the jail is read-only), every
process has ``RLIMIT_CPU`` and ``RLIMIT_FSIZE``, and, where no cgroup can be made,
``RLIMIT_DATA`` and ``RLIMIT_NPROC`` stand in. Run by root, the task process runs as an
unprivileged uid (65534 unless ``ALE_TASK_UID``). Hitting a bound kills or fails that
task process's call, nothing else. ``bounds_launcher`` puts the process into its
cgroup and sets its limits before bubblewrap starts; ``TaskProcess.evidence()``
records what applied and how.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

# The files of /etc every bubblewrap sandbox of ale sees (read-only, those that exist):
# what programs need to start, resolve names and check certificates. The task jail
# and a confined harness (ale.agents.gateway.confine) share this one list.
ETC_FILES = ("passwd", "group", "nsswitch.conf", "hosts", "resolv.conf", "localtime", "ssl", "ca-certificates",
             "ld.so.cache", "alternatives", "mime.types", "gai.conf")
NAMESPACES = ("pid", "ipc", "uts", "cgroup")  # always unshared; "net" too unless the sandbox keeps the network


def _switch(name: str) -> bool | None:
    """An on/off environment variable: True, False, or None when unset or neither."""
    value = os.environ.get(name, "").strip().lower()
    return True if value in ("on", "1", "true", "yes") else False if value in ("off", "0", "false", "no") else None


def jail_enabled() -> bool:
    return _switch("ALE_TASK_SANDBOX") is not False


def interpreter_roots(python: str) -> list[str]:
    """The folders an interpreter needs: a venv's root and the installation its
    ``pyvenv.cfg`` names, or the interpreter's own prefix; nothing under /usr."""
    roots: list[str] = []
    exe = Path(os.path.abspath(python))
    candidates = [exe.parent.parent]
    cfg = exe.parent.parent / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                candidates.append(Path(value.strip()).parent)
    candidates.append(Path(os.path.realpath(exe)).parent.parent)
    for c in candidates:
        real = os.path.realpath(c)
        if real == "/" or real == "/usr" or real.startswith("/usr/"):
            continue
        if real not in roots:
            roots.append(real)
    return roots


def system_binds(etc_files: tuple[str, ...] = ETC_FILES) -> tuple[list[str], list[str]]:
    """bwrap arguments for the host's system, read-only: ``/usr``, Debian's ``/bin``,
    ``/lib``, ``/lib32``, ``/lib64``, ``/sbin`` (links into it, or folders), and the
    named files of ``/etc`` that exist; and the ``/etc`` paths bound."""
    a = ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib32", "lib64", "sbin"):
        p = Path("/" + link)
        if p.is_symlink():
            a += ["--symlink", str(p.readlink()), str(p)]
        elif p.is_dir():
            a += ["--ro-bind", str(p), str(p)]
    etc = [f"/etc/{n}" for n in etc_files if Path(f"/etc/{n}").exists()]
    for e in etc:
        a += ["--ro-bind", e, e]
    return a, etc


def bwrap_base(bwrap: str, *, network: bool = False, hostname: str | None = None) -> tuple[list[str], list[str]]:
    """The start of every bubblewrap sandbox ale makes (the task jail, a confined
    harness): no capabilities, also when ale runs as root (bubblewrap would keep
    root's: with CAP_SYS_ADMIN and CAP_MKNOD a process can make the host's disk a
    device node and mount it); its own PID, IPC, UTS and cgroup namespaces, and its
    own network namespace (loopback only) unless ``network``; it dies with its
    parent; the host's system read-only (``system_binds``, ``ETC_FILES``); fresh
    ``/proc`` and ``/dev``. Returns the arguments and the ``/etc`` paths bound."""
    system, etc = system_binds(ETC_FILES)
    a = [bwrap, "--die-with-parent", "--cap-drop", "ALL", *([] if network else ["--unshare-net"]), "--unshare-pid",
         "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", *(["--hostname", hostname] if hostname else []),
         *system, "--proc", "/proc", "--dev", "/dev"]
    return a, etc


def task_network(judge: Mapping[str, str]) -> bool:
    """Whether the task process keeps the host's network: when the run hands
    ``evaluate()`` judge credentials (an LLM judge on the network), or when
    ``ALE_TASK_NETWORK=on``; ``ALE_TASK_NETWORK=off`` never. Without it the jail
    has a network namespace of its own, loopback only: candidate code a grader
    runs reaches no service of the host (a Ray head, a gateway, the cloud's
    metadata address)."""
    chosen = _switch("ALE_TASK_NETWORK")
    return bool(judge) if chosen is None else chosen


def jail_argv(
    argv: list[str], *, python: str, read_only: list[Path], home: Path, cwd: Path, network: bool = False,
    bounds: TaskBounds | None = None, record: dict[str, Any] | None = None,
) -> list[str] | None:
    """``argv`` inside bubblewrap, or None when the jail is off or bubblewrap missing;
    with ``network`` false, in a network namespace of its own (loopback only).

    With ``bounds`` (default: none, the jail as it was), the writable places are
    size-capped tmpfs and, run by root, the process drops to ``bounds.uid``;
    ``record`` (a dict) receives what applied: ``uid``, ``disk``."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or not jail_enabled():
        return None
    a, etc = bwrap_base(bwrap, network=network)
    binds: list[str] = []
    seen: set[str] = set()
    for q in [*interpreter_roots(python), *map(str, read_only)]:
        real = os.path.realpath(q)
        if real in seen or not os.path.exists(real):
            continue
        seen.add(real)
        binds += ["--ro-bind", real, real]
        if os.path.abspath(q) != real:  # the path as named, too (a venv under a symlinked folder)
            binds += ["--ro-bind", real, os.path.abspath(q)]
    rec: dict[str, Any] = {} if record is None else record
    disk = bounds.disk if bounds is not None else None
    if bounds is not None and bwrap_version(bwrap) >= (0, 5):
        # One tmpfs for /tmp and the home (the home sits under /tmp: one cap for both),
        # another for /dev/shm; its pages count against the process's memory cgroup.
        size = ["--size", str(disk)] if disk else []
        a += ["--perms", "1777", *size, "--tmpfs", "/tmp"]
        if not _under(home, Path("/tmp")):
            a += ["--perms", "0777", *size, "--tmpfs", str(home)]
        else:
            a += ["--perms", "0777", "--dir", str(home)]
        shm = min(disk, SHM_CAP) if disk else SHM_CAP
        a += ["--perms", "1777", "--size", str(shm), "--tmpfs", "/dev/shm"]
        rec["disk"] = {"bytes": disk, "by": "tmpfs size" if disk else None, "places": ["/tmp", str(home)],
                       "cap_is": "shared" if _under(home, Path("/tmp")) else "each",
                       "dev_shm_bytes": shm, "backing": "memory (tmpfs)"}
        # bubblewrap makes the folders above a bind 0700: another uid could not reach
        # /etc's files, the task tree or the interpreter
        a += ["--chmod", "0755", "/etc"] if etc else []
        a += _open_parents(binds, skip=["/usr", "/dev", "/proc", "/etc"]) + binds
        uid = bounds.uid if os.geteuid() == 0 else None
        setpriv = shutil.which("setpriv") if uid is not None else None
        unreadable = _unreadable([*binds[2::3], str(cwd)]) if uid is not None else []
        if uid is None:
            rec["uid"] = {"uid": os.geteuid(), "by": None, "why": "the harness is not root: its own uid"
                          if bounds.uid is not None else "ALE_TASK_UID=off"}
        elif setpriv is None:
            rec["uid"] = {"uid": os.geteuid(), "by": None, "why": "no setpriv on the host"}
        elif unreadable:
            rec["uid"] = {"uid": os.geteuid(), "by": None, "why": f"not readable by others: {unreadable[0]}"}
        else:
            # bubblewrap (root) mounts; setpriv, the one program that keeps CAP_SETUID,
            # CAP_SETGID and CAP_SETPCAP, drops them, the bounding set and root for good.
            a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
            argv = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", "--no-new-privs", "--", *argv]
            rec["uid"] = {"uid": uid, "by": "setpriv in the jail"}
        a += ["--remount-ro", "/"]  # the jail's root (a tmpfs of bubblewrap's) is no writable place
        return [*a, "--chdir", str(cwd), "--", *argv]
    # /tmp on disk, inside the process's home (no bounds, or bubblewrap too old for --size).
    tmp = home / ".tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    a += ["--bind", str(tmp), "/tmp", *binds]
    if bounds is not None:
        rec["disk"] = {"bytes": None, "by": None, "why": f"bubblewrap {bwrap_version(bwrap)} has no --size (0.5)",
                       "places": ["/tmp", str(home)], "backing": "disk"}
        rec["uid"] = {"uid": os.geteuid(), "by": None, "why": "bubblewrap too old"}
    a += ["--bind", str(home), str(home), "--chdir", str(cwd), "--", *argv]
    return a


def _open_parents(binds: list[str], skip: list[str]) -> list[str]:
    """bwrap arguments making the folders above each bind's destination 0755 (made
    before the binds; bubblewrap would make them 0700)."""
    out: list[str] = []
    made: set[str] = set()
    bound: list[str] = []
    for dest in binds[2::3]:
        for parent in reversed(Path(dest).parents):
            p = str(parent)
            if p in ("/", "/tmp") or p in made \
                    or any(p == b or p.startswith(b.rstrip("/") + "/") for b in [*skip, *bound]):
                continue
            made.add(p)
            out += ["--perms", "0755", "--dir", p]
        bound.append(dest)
    return out


def _under(p: Path, root: Path) -> bool:
    try:
        Path(os.path.abspath(p)).relative_to(root)
        return True
    except ValueError:
        return False


def readable_by_others(path: str) -> bool:
    """Whether a bound path (folder or file) is readable by any uid: its own mode,
    in the jail its ancestors are bubblewrap's (0755)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    need = 0o005 if os.path.isdir(path) else 0o004
    return mode & need == need


def _unreadable(paths: list[str], budget: int = 5000) -> list[str]:
    """The bound folders (and the files of the task's own folder, the last of
    ``paths``, up to ``budget`` of them) that another uid could not read."""
    bad = [p for p in dict.fromkeys(paths) if not readable_by_others(p)]
    if bad:
        return bad
    for top, dirs, files in os.walk(paths[-1]):
        for name in [*dirs, *files]:
            p = os.path.join(top, name)
            budget -= 1
            if budget < 0:
                return []
            if not os.path.islink(p) and not readable_by_others(p):
                return [p]
    return []


@functools.lru_cache(maxsize=4)
def bwrap_version(bwrap: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return (0,)
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(x) for x in m.groups() if x is not None) if m else (0,)


# -- bounds -------------------------------------------------------------------------
GiB = 1024 ** 3
MiB = 1024 ** 2
SHM_CAP = 256 * MiB  # /dev/shm in the jail (a tmpfs of its own), at most the disk cap
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _host_memory() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 8 * GiB


def default_memory() -> int:
    """Half the host's memory, at most 4 GiB."""
    return min(4 * GiB, _host_memory() // 2)


def parse_size(text: str) -> int:
    """``4G``, ``4GiB``, ``512M``, ``100k``, bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 4G, 512M, 1073741824)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclass(frozen=True)
class TaskBounds:
    """What one task process (and all it starts) may use. ``None``: not bounded.
    From the environment: ``TaskBounds.from_env()``."""

    pids: int | None = 512  # processes and threads at once
    memory: int | None = field(default_factory=default_memory)  # bytes, its tmpfs pages included
    disk: int | None = 2 * GiB  # bytes: its home and /tmp together (a tmpfs); each file at most this
    cpu_s: int | None = 7200  # CPU seconds of each process (RLIMIT_CPU); the grading timeout bounds the wall clock
    uid: int | None = 65534  # the uid the task code runs as when the harness is root (None: the harness's): nobody
    cgroup: bool = True  # False: rlimits only
    # the cgroup under which each task process's own is made (default: see make_cgroup)
    cgroup_parent: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TaskBounds | None:
        """``ALE_TASK_LIMITS=off`` (no bounds at all: None); ``ALE_TASK_PIDS``,
        ``ALE_TASK_MEMORY`` (``4G``), ``ALE_TASK_DISK`` (``2G``), ``ALE_TASK_CPU``
        (seconds), ``ALE_TASK_UID`` (a number), each ``off`` for unbounded;
        ``ALE_TASK_CGROUP``: ``off`` (rlimits only) or the parent cgroup's path."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            v = env.get(name, "").strip()
            return v or None

        if (get("ALE_TASK_LIMITS") or "").lower() in ("off", "0", "false", "no"):
            return None
        b = cls()
        off = ("off", "none", "unlimited", "no", "false")
        changes: dict[str, Any] = {}
        for name, key, parse in (("ALE_TASK_PIDS", "pids", int), ("ALE_TASK_MEMORY", "memory", parse_size),
                                 ("ALE_TASK_DISK", "disk", parse_size), ("ALE_TASK_CPU", "cpu_s", int),
                                 ("ALE_TASK_UID", "uid", int)):
            v = get(name)
            if v is not None:
                try:
                    changes[key] = None if v.lower() in off else parse(v)
                except ValueError as e:
                    raise ValueError(f"{name}={v!r}: {e}") from None
        cg = get("ALE_TASK_CGROUP")
        if cg is not None:
            if cg.lower() in off:
                changes["cgroup"] = False
            else:
                changes["cgroup_parent"] = cg
        return replace(b, **changes)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def _proc_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def cgroup_mounts(mountinfo: list[str] | None = None) -> dict[str, tuple[Path, str]]:
    """The host's cgroup hierarchies as this process sees them: ``"v2"`` -> (mount
    point, its root), and each v1 controller (``memory``, ``pids``, …) -> the same."""
    found: dict[str, tuple[Path, str]] = {}
    for line in _proc_lines("/proc/self/mountinfo") if mountinfo is None else mountinfo:
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, rest = pre.split(), post.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        root, point, fstype = fields[3], fields[4].replace("\\040", " "), rest[0]
        if fstype == "cgroup2":
            found.setdefault("v2", (Path(point), root))
        elif fstype == "cgroup":
            for opt in rest[2].split(","):
                if opt in ("memory", "pids", "cpuacct", "cpu"):
                    found.setdefault(opt, (Path(point), root))
    return found


def own_cgroups(lines: list[str] | None = None) -> dict[str, str]:
    """This process's cgroup per hierarchy: ``"v2"`` -> path, and per v1 controller."""
    own: dict[str, str] = {}
    for line in _proc_lines("/proc/self/cgroup") if lines is None else lines:
        num, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if num == "0" and ctrls == "":
            own["v2"] = path
        for c in ctrls.split(","):
            if c:
                own[c] = path
    return own


def _cg_dir(mount: tuple[Path, str], path: str) -> Path:
    point, root = mount
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")):]
    return point / path.lstrip("/")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass
class TaskCgroup:
    """One task process's cgroup: one folder on v2, one per controller on v1."""

    version: int
    dirs: dict[str, Path]  # controller ("memory", "pids"; on v2 both name the one folder) -> folder
    bounds: dict[str, Any] = field(default_factory=dict)  # bound -> how it is enforced

    def folders(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.folders()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.folders():
            for line in _proc_lines(str(d / "cgroup.procs")):
                with contextlib.suppress(ValueError):
                    found.add(int(line))
        return found

    def events(self) -> dict[str, int]:
        """What hit a bound: ``oom_kills`` (the memory cap) and ``pids_max`` (forks refused)."""
        out: dict[str, int] = {}
        mem, pids = self.dirs.get("memory"), self.dirs.get("pids")
        if mem is not None:
            name = "memory.oom_control" if self.version == 1 else "memory.events"
            for line in _proc_lines(str(mem / name)):
                k, _, v = line.partition(" ")
                if k == "oom_kill" and v.strip().isdigit():
                    out["oom_kills"] = int(v)
        if pids is not None:
            for line in _proc_lines(str(pids / "pids.events")):
                k, _, v = line.partition(" ")
                if k == "max" and v.strip().isdigit():
                    out["pids_max"] = int(v)
        return out

    def kill(self) -> None:
        """Every process left in it, by force."""
        for d in self.folders():
            if (d / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    _write(d / "cgroup.kill", "1")
        for _ in range(100):
            left = self.pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self, wait: float = 3.0) -> bool:
        """Kill what is left and remove the folders; False when one stays."""
        self.kill()
        deadline = time.monotonic() + wait
        left = self.folders()
        while left:
            for d in list(left):
                try:
                    d.rmdir()
                    left.remove(d)
                except FileNotFoundError:
                    left.remove(d)
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        return False
            if left:
                time.sleep(0.02)
        return True


def make_cgroup(name: str, bounds: TaskBounds, *, mounts: dict[str, tuple[Path, str]] | None = None,
                own: dict[str, str] | None = None) -> tuple[TaskCgroup | None, list[str]]:
    """A cgroup of its own for one task process, with ``bounds.memory`` and
    ``bounds.pids`` written, or None; and notes on what could not be done.

    cgroup v2 (when its hierarchy offers the memory and pids controllers): a folder
    ``name`` beside the harness's own cgroup (its parent distributes those
    controllers: v2 allows no child of a cgroup that holds processes), or under
    ``bounds.cgroup_parent`` (``ALE_TASK_CGROUP``, a delegated cgroup) or, when the
    harness sits at the root, under the root. cgroup v1 (memory and pids
    hierarchies): a folder ``name`` under the harness's own cgroup in each (or under
    ``cgroup_parent``). Memory is capped without swap (``memory.swap.max`` 0,
    ``memory.memsw``), a memory overrun kills inside the group (``memory.oom.group``
    on v2), never outside it."""
    notes: list[str] = []
    if not bounds.cgroup or (bounds.memory is None and bounds.pids is None):
        return None, ["cgroup: off" if not bounds.cgroup else "cgroup: no memory or pids bound to set"]
    mounts = cgroup_mounts() if mounts is None else mounts
    name = f"{name}.{os.getpid()}"  # the harness's pid: sweep_stale() removes what a harness that died left
    own = own_cgroups() if own is None else own
    wanted = [c for c, v in (("memory", bounds.memory), ("pids", bounds.pids)) if v is not None]
    v2 = mounts.get("v2")
    if v2 is not None:
        try:
            available = (_cg_dir(v2, "/") / "cgroup.controllers").read_text().split()
        except OSError:
            available = []
        if all(c in available for c in wanted):
            made = _make_v2(name, bounds, wanted, v2, own.get("v2", "/"), notes)
            if made is not None:
                return made, notes
        else:
            notes.append(f"cgroup v2 at {v2[0]}: its controllers are {available or 'none'} (the rest are v1's)")
    dirs: dict[str, Path] = {}
    how: dict[str, Any] = {}
    for c in wanted:
        if c not in mounts:
            notes.append(f"cgroup v1: no {c} hierarchy")
            continue
        parent = bounds.cgroup_parent or own.get(c, "/")
        d = _cg_dir(mounts[c], parent) / name
        sweep_stale(d.parent)
        try:
            d.mkdir()
        except OSError as e:
            notes.append(f"cgroup v1 {c}: cannot make {d}: {e.strerror}")
            continue
        dirs[c] = d
        try:
            if c == "memory":
                assert bounds.memory is not None
                _write(d / "memory.limit_in_bytes", str(bounds.memory))
                with contextlib.suppress(OSError):  # without swap accounting: no memsw files
                    _write(d / "memory.memsw.limit_in_bytes", str(bounds.memory))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swappiness", "0")
                how["memory"] = f"cgroup v1 {d / 'memory.limit_in_bytes'}"
            else:
                _write(d / "pids.max", str(bounds.pids))
                how["pids"] = f"cgroup v1 {d / 'pids.max'}"
        except OSError as e:
            notes.append(f"cgroup v1 {c}: cannot set the limit in {d}: {e.strerror}")
            del dirs[c]
            with contextlib.suppress(OSError):
                d.rmdir()
    if not dirs:
        return None, notes
    return TaskCgroup(1, dirs, how), notes


def sweep_stale(parent: Path) -> None:
    """Remove the empty task cgroups under ``parent`` of harnesses no longer running
    (killed before they could remove them)."""
    with contextlib.suppress(OSError):
        for d in parent.iterdir():
            m = re.fullmatch(r"ale-task-.+\.(\d+)", d.name)
            if m is None or not d.is_dir() or int(m.group(1)) == os.getpid():
                continue
            try:
                os.kill(int(m.group(1)), 0)
                continue  # its harness runs
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            if not _proc_lines(str(d / "cgroup.procs")):
                with contextlib.suppress(OSError):
                    d.rmdir()


def _make_v2(name: str, bounds: TaskBounds, wanted: list[str], mount: tuple[Path, str], own: str,
             notes: list[str]) -> TaskCgroup | None:
    if bounds.cgroup_parent:
        parents = [bounds.cgroup_parent]
    elif own in ("", "/"):
        parents = ["/"]
    else:
        parents = [str(Path(own).parent)]
    for parent in parents:
        pdir = _cg_dir(mount, parent)
        d = pdir / name
        sweep_stale(pdir)
        try:
            d.mkdir()
        except OSError as e:
            notes.append(f"cgroup v2: cannot make {d}: {e.strerror}")
            continue
        try:
            have = (d / "cgroup.controllers").read_text().split()
            missing = [c for c in wanted if c not in have]
            if missing:  # the parent does not hand them down yet: ask it to (fails when it holds processes)
                _write(pdir / "cgroup.subtree_control", " ".join("+" + c for c in missing))
            if bounds.memory is not None:
                _write(d / "memory.max", str(bounds.memory))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
                with contextlib.suppress(OSError):
                    _write(d / "memory.oom.group", "1")
            if bounds.pids is not None:
                _write(d / "pids.max", str(bounds.pids))
        except OSError as e:
            notes.append(f"cgroup v2: cannot set limits in {d}: {e.strerror}")
            with contextlib.suppress(OSError):
                d.rmdir()
            continue
        how = {}
        if bounds.memory is not None:
            how["memory"] = f"cgroup v2 {d / 'memory.max'}"
        if bounds.pids is not None:
            how["pids"] = f"cgroup v2 {d / 'pids.max'}"
        return TaskCgroup(2, {c: d for c in wanted}, how)
    return None


def rlimits_for(bounds: TaskBounds, cgroup: TaskCgroup | None, *, task_uid: int,
                disk_capped: bool = False) -> tuple[dict[str, tuple[int, int]], dict[str, Any]]:
    """The rlimits a task process starts with, and how each bound is enforced:
    ``RLIMIT_CPU`` always; ``RLIMIT_FSIZE`` (each file at most the disk bound) where
    no size-capped tmpfs holds the writable places (``disk_capped``); ``RLIMIT_DATA``
    for memory and ``RLIMIT_NPROC`` for processes (a uid other than root's and the
    harness's: it counts every process of that uid on the host) where no cgroup
    caps them."""
    lim: dict[str, tuple[int, int]] = {}
    how: dict[str, Any] = dict(cgroup.bounds) if cgroup is not None else {}
    if bounds.cpu_s is not None:
        lim["RLIMIT_CPU"] = (bounds.cpu_s, bounds.cpu_s + 5)  # SIGXCPU, then SIGKILL
        how["cpu_s"] = "RLIMIT_CPU (each process)"
    if bounds.disk is not None and not disk_capped:
        lim["RLIMIT_FSIZE"] = (bounds.disk, bounds.disk)
        how["file_size"] = "RLIMIT_FSIZE (each file)"
    if bounds.memory is not None and "memory" not in how:
        lim["RLIMIT_DATA"] = (bounds.memory, bounds.memory)
        how["memory"] = "RLIMIT_DATA (each process)"
    if bounds.pids is not None and "pids" not in how:
        if task_uid not in (0, os.getuid()):
            lim["RLIMIT_NPROC"] = (bounds.pids, bounds.pids)
            how["pids"] = f"RLIMIT_NPROC (every process of uid {task_uid})"
        else:
            how["pids"] = None  # root is exempt, and the harness's own uid runs the harness's processes
    return lim, how


# Runs with the harness's interpreter (-I -S): into the cgroup, the limits, the
# OOM killer's first pick, then bubblewrap (or the task's interpreter).
_LAUNCH = """\
import json, os, resource, sys
spec = json.loads(sys.argv[1])
try:
    for f in spec["procs"]:
        with open(f, "w") as fh:
            fh.write(str(os.getpid()))
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
except OSError as e:
    sys.stderr.write("ale: cannot bound the task process: %s\\n" % e)
    os._exit(126)
try:
    with open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("1000")
except OSError:
    pass
os.execvp(spec["argv"][0], spec["argv"])
"""


def bounds_launcher(argv: list[str], *, procs: list[str], rlimits: Mapping[str, tuple[int, int]]) -> list[str]:
    """``argv`` started in the cgroup whose ``cgroup.procs`` files are ``procs``, with
    ``rlimits``: nothing of the task runs before both apply."""
    spec = {"procs": procs, "rlimits": {k: list(v) for k, v in rlimits.items()}, "argv": argv}
    return [sys.executable, "-I", "-S", "-c", _LAUNCH, json.dumps(spec)]
