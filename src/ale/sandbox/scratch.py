"""A run's scratch folder on the host: the staged input, the workspace, the
private reference store. Optionally the workspace is a size-capped tmpfs, so an
agent cannot fill the host's disk through its one writable mount.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from ale.sandbox.base import SandboxError


def mount_workspace_tmpfs(path: Path, *, max_bytes: int, uid: int, gid: int) -> None:
    """Mount a tmpfs of `max_bytes` on `path` (root only). Writes past the cap fail
    with ENOSPC inside the sandbox; the pages are charged to the writer's memory
    cgroup, so the container's memory limit bounds them too."""
    opts = f"size={max_bytes},mode=0755,uid={uid},gid={gid},nosuid,nodev"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "ale-workspace", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"cannot mount a {max_bytes}-byte tmpfs workspace on {path}: {proc.stderr.strip()}")


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` (from /proc/self/mountinfo), deepest first."""
    real = os.path.realpath(root)
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                target = line.split()[4].encode().decode("unicode_escape")
                if target == real or target.startswith(real.rstrip("/") + "/"):
                    found.append(target)
    except OSError:
        return []
    return sorted(found, key=len, reverse=True)


def release_scratch(root: Path) -> None:
    """Unmount whatever a run mounted below `root` (lazily, so a busy mount never
    blocks), then remove the folder. Safe on a folder a killed run left behind, and
    on whatever the candidate left in the workspace (any depth, any path length);
    never raises."""
    for target in mounts_under(root):
        subprocess.run(["umount", "-l", target], capture_output=True)
    remove_tree(root)


def remove_tree(root: Path) -> None:
    """``rm -rf root``, never following links. coreutils' rm walks with openat, so
    neither depth nor PATH_MAX stops it (shutil.rmtree recurses once per level and
    raises RecursionError on a tree ~1000 levels deep); shutil.rmtree is only the
    fallback where rm is missing. Never raises: what cannot be removed stays."""
    if not os.path.lexists(root):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["rm", "-rf", "--", os.fspath(root)], capture_output=True, check=False)
    if os.path.lexists(root):
        with contextlib.suppress(Exception):  # RecursionError on a deep tree: left to the operator
            shutil.rmtree(root, ignore_errors=True)
