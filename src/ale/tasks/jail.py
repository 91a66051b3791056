"""The task process's jail: bubblewrap around the task's interpreter.

Task code is the task author's, but graders run what the candidate wrote: a host
side grader that imports or executes a file from the output (ALE's
``dit_pipeline_cfg_alignment`` runs the candidate's pipeline with
``sys.executable``) would otherwise run it as the harness's user, beside the
signing key, the runs folder and every task's data. In the jail the task process
sees only what it needs: ``/usr`` and a few files of ``/etc`` (read-only), its
interpreter (the tree's venv and the base installation it points at), the harness's
task runtime and the task tree (read-only), its own home (read-write) and a fresh
``/tmp`` (a folder of that home: on disk, not in memory), ``/proc`` and ``/dev``. Its own PID, IPC and UTS namespaces, no
capabilities (also when the harness runs as root); it dies with its parent. Its own
network namespace too (loopback only), unless the run gives ``evaluate()`` judge
credentials or ``ALE_TASK_NETWORK=on`` (``task_network``): an LLM judge needs the
network, and nothing else in a task process does.

``ALE_TASK_SANDBOX=off`` runs the task process unjailed (also when bubblewrap is
missing, with a warning in the task log).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

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
    argv: list[str], *, python: str, read_only: list[Path], home: Path, cwd: Path, network: bool = False
) -> list[str] | None:
    """``argv`` inside bubblewrap, or None when the jail is off or bubblewrap missing;
    with ``network`` false, in a network namespace of its own (loopback only)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or not jail_enabled():
        return None
    a, _ = bwrap_base(bwrap, network=network)
    # /tmp on disk, inside the process's home: graders copy whole outputs to
    # /tmp/agenthle_eval, and a tmpfs would hold them in the host's memory.
    tmp = home / ".tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    a += ["--bind", str(tmp), "/tmp"]
    seen: set[str] = set()
    for q in [*interpreter_roots(python), *map(str, read_only)]:
        real = os.path.realpath(q)
        if real in seen or not os.path.exists(real):
            continue
        seen.add(real)
        a += ["--ro-bind", real, real]
        if os.path.abspath(q) != real:  # the path as named, too (a venv under a symlinked folder)
            a += ["--ro-bind", real, os.path.abspath(q)]
    a += ["--bind", str(home), str(home), "--chdir", str(cwd), "--", *argv]
    return a
