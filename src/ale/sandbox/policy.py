"""The isolation policy: the values of the sealed-container template, as data.

One model states them; the docker provider applies them, the inspect checks and
probes verify them, and the policy used is stored with each run's evidence.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ale.defaults import CANDIDATE_USER
from ale.documents import load_document

GIB = 1024**3
MIB = 1024**2


def host_cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def default_cpus() -> float:
    return float(min(4, host_cpu_count()))


def host_memory_bytes() -> int:
    """The host's memory (MemTotal), 8 GiB when it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GIB


# The most of the host's memory a sandbox is given when a limit is raised for it,
# or a task card asks for more (ale.tasks.card).
HOST_MEMORY_SHARE = 0.75


# Docker's /dev/shm (64 MiB unless told otherwise): a tmpfs too, charged to the
# container's memory like every tmpfs page.
SHM_BYTES = 64 * MIB
# SysV shared memory (shmget): pages no tmpfs size counts, charged to the container's
# memory like /dev/shm's, and kept after their owner exits unless the kernel removes
# them (kernel.shm_rmid_forced=1). Capped in all (kernel.shmall, kernel.shmmax) at
# this many bytes, or a sixteenth of the memory limit if less, inside the memory
# budget below beside /dev/shm and every tmpfs.
SYSV_SHM_BYTES = 64 * MIB
SYSV_SHM_SHARE = 16
SHM_PAGE = 4096  # kernel.shmall counts pages (of PAGE_SIZE: 4 KiB on x86-64 and arm64's default)
# A tmpfs's pages cannot be reclaimed: filled, they take the memory the container's
# init needs, and the kernel kills it. Every tmpfs together, /dev/shm included, must
# leave this share of the memory limit free.
TMPFS_MEMORY_SHARE = 0.5
MIN_TMPFS_BYTES = 16 * MIB
_UNITS = {"": 1, "k": 1024, "m": MIB, "g": GIB}


class TmpfsMount(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str = "/tmp"
    # exec: a venv the candidate makes in /tmp (python -m venv, uv) must run its
    # interpreter and load compiled packages; Docker adds noexec unless told.
    options: str = "rw,exec,nosuid,nodev,size=1g"

    @property
    def size_bytes(self) -> int | None:
        """The ``size=`` option in bytes (None: none given, the kernel's default of half the RAM)."""
        for opt in self.options.split(","):
            m = re.fullmatch(r"size=(\d+)([kmgKMG]?)", opt.strip())
            if m:
                return int(m.group(1)) * _UNITS[m.group(2).lower()]
        return None

    def with_size(self, size: int) -> TmpfsMount:
        opts = [o for o in self.options.split(",") if not o.strip().startswith("size=")]
        return self.model_copy(update={"options": ",".join([*opts, f"size={size // MIB}m"])})


class IsolationPolicy(BaseModel):
    """Everything `docker create` is told, and everything verification expects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    network_mode: Literal["none"] = "none"
    read_only_rootfs: bool = True
    cap_drop: tuple[str, ...] = ("ALL",)
    cap_add: tuple[str, ...] = ()
    no_new_privileges: bool = True
    ipc_mode: Literal["private", "none"] = "private"
    cgroupns_mode: Literal["private"] = "private"
    pids_limit: int = Field(256, gt=0)
    memory_bytes: int = Field(8 * GIB, gt=16 * MIB)
    cpus: float = Field(default_factory=default_cpus, gt=0)
    user: str = CANDIDATE_USER
    tmpfs: tuple[TmpfsMount, ...] = (TmpfsMount(),)
    log_max_size: str = "10m"
    runtime: str = "runc"
    # Writable mounts the engine adds on its own and probes accept (not require):
    # /dev/shm stays writable under --read-only.
    runtime_writable_mounts: tuple[str, ...] = ("/dev/shm",)
    # UV_PROJECT_ENVIRONMENT: a task environment image's synced uv project (ale.sandbox.env_image.uv_project).
    env_allowlist: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "PYTHONDONTWRITEBYTECODE",
                                      "UV_PROJECT_ENVIRONMENT")
    # SysV shared memory bounded and never orphaned: the IPC namespace's sysctls
    # (``sysctls``: kernel.shm_rmid_forced=1, kernel.shmmax and kernel.shmall at
    # SYSV_SHM_BYTES, counted in the memory budget). False only in records of runs made
    # before it existed (``from_record``).
    sysv_shm_limits: bool = True
    # RLIMIT_CORE 0, soft and hard (``--ulimit core=0``): no process of the sandbox
    # dumps core into a file. (A host whose kernel.core_pattern is a pipe runs its
    # handler whatever the limit: the engine evidence records the pattern.)
    no_core_dumps: bool = True

    @property
    def sysctls(self) -> dict[str, str]:
        """The namespaced kernel settings the sandbox is created with (``HostConfig.Sysctls``)."""
        if not self.sysv_shm_limits:
            return {}
        return {"kernel.shm_rmid_forced": "1", "kernel.shmmax": str(self.sysv_shm_bytes),
                "kernel.shmall": str(self.sysv_shm_bytes // SHM_PAGE)}

    @property
    def sysv_shm_bytes(self) -> int:
        """The most SysV shared memory the sandbox may hold (0: not limited by the policy)."""
        if not self.sysv_shm_limits:
            return 0
        return min(SYSV_SHM_BYTES, self.memory_bytes // SYSV_SHM_SHARE // MIB * MIB)

    @property
    def ulimits(self) -> dict[str, tuple[int, int]]:
        """The resource limits the sandbox is created with: name -> (soft, hard) (``HostConfig.Ulimits``)."""
        return {"core": (0, 0)} if self.no_core_dumps else {}

    @property
    def shared_memory_reserve(self) -> int:
        """The memory /dev/shm and SysV shared memory may take, beside the tmpfs."""
        return SHM_BYTES + self.sysv_shm_bytes

    @field_validator("cpus")
    @classmethod
    def _fits_host(cls, v: float, info: ValidationInfo) -> float:
        # A stored policy is re-read on other machines (`ale verify`): the host rule
        # is about the machine that runs containers, so readers may switch it off.
        if info.context and info.context.get("check_host") is False:
            return v
        n = host_cpu_count()
        if v > n:
            raise ValueError(
                f"cpus={v} exceeds this host's {n} CPU(s); Docker refuses it. Use cpus <= {n}."
            )
        return v

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, v: str, info: ValidationInfo) -> str:
        # A stored policy is read as it ran: its rules judge whatever runtime it names.
        if info.context and info.context.get("check_host") is False:
            return v
        from ale.sandbox.runtimes import check_known

        return check_known(v)

    @model_validator(mode="after")
    def _runsc_pids(self, info: ValidationInfo) -> IsolationPolicy:
        """Under runsc a pids limit left at its default is `runtimes.RUNSC_PIDS_LIMIT`:
        the host's pids cgroup counts gVisor's own threads too (see `with_runtime`)."""
        if not (info.context and info.context.get("check_host") is False) and "pids_limit" not in self.model_fields_set:
            from ale.sandbox.runtimes import RUNSC_PIDS_LIMIT, is_gvisor

            if is_gvisor(self.runtime):
                object.__setattr__(self, "pids_limit", RUNSC_PIDS_LIMIT)
        return self

    def with_runtime(self, runtime: str | None) -> IsolationPolicy:
        """This policy under the OCI runtime `runtime` (None: unchanged). Under runsc
        a pids limit at the default becomes `RUNSC_PIDS_LIMIT`: every candidate process
        costs gVisor's ptrace platform about ten host threads in the sandbox's cgroup."""
        from ale.sandbox.runtimes import RUNSC_PIDS_LIMIT, check_known, is_gvisor

        if runtime is None or runtime == self.runtime:
            return self
        check_known(runtime)
        default = type(self).model_fields["pids_limit"].default
        update: dict[str, object] = {"runtime": runtime}
        if is_gvisor(runtime) and self.pids_limit == default:
            update["pids_limit"] = RUNSC_PIDS_LIMIT
        elif not is_gvisor(runtime) and is_gvisor(self.runtime) and self.pids_limit == RUNSC_PIDS_LIMIT:
            update["pids_limit"] = default
        return self.model_copy(update=update)

    @model_validator(mode="after")
    def _default_tmpfs_fits_memory(self, info: ValidationInfo) -> IsolationPolicy:
        """The default /tmp is sized to fit the memory limit (``fit_tmpfs``); tmpfs the
        operator states are theirs (``load`` refuses them when they do not fit). A
        stored policy is read as it ran."""
        if info.context and info.context.get("check_host") is False:
            return self
        if "tmpfs" not in self.model_fields_set:
            object.__setattr__(self, "tmpfs", self.fit_tmpfs().tmpfs)
        return self

    def tmpfs_problem(self) -> str | None:
        """Why these tmpfs could take the memory the sandbox's init needs, or None."""
        sizes = [t.size_bytes for t in self.tmpfs]
        budget = int(self.memory_bytes * TMPFS_MEMORY_SHARE)
        reserve = self.shared_memory_reserve
        if all(s is not None for s in sizes) and sum(s or 0 for s in sizes) + reserve <= budget:
            return None
        return (f"tmpfs {[t.path + ':' + t.options for t in self.tmpfs]} with /dev/shm and SysV shared memory "
                f"({reserve // MIB} MiB) "
                f"may take more than {TMPFS_MEMORY_SHARE:.0%} of memory_bytes ({self.memory_bytes // MIB} MiB): a "
                "candidate that fills them takes the memory the sandbox's init needs and the kernel kills it. "
                f"Give each tmpfs a size= that fits in {max(0, budget - reserve) // MIB} MiB in all, or "
                "raise memory_bytes.")

    def fit_tmpfs(self) -> IsolationPolicy:
        """This policy with its tmpfs sizes scaled down (never up) so that, with
        /dev/shm, they fit in ``TMPFS_MEMORY_SHARE`` of the memory limit: a card that
        lowers the memory must not leave a /tmp the candidate can fill to death."""
        budget = max(int(self.memory_bytes * TMPFS_MEMORY_SHARE) - self.shared_memory_reserve,
                     MIN_TMPFS_BYTES * max(1, len(self.tmpfs)))
        sizes = [t.size_bytes or self.memory_bytes for t in self.tmpfs]
        if sum(sizes) <= budget:
            return self
        scale = budget / sum(sizes)
        fitted = tuple(t.with_size(max(MIN_TMPFS_BYTES, int(s * scale) // MIB * MIB))
                       for t, s in zip(self.tmpfs, sizes, strict=True))
        return self.model_copy(update={"tmpfs": fitted})

    @field_validator("user")
    @classmethod
    def _numeric_non_root(cls, v: str) -> str:
        parts = v.split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"user must be numeric 'uid:gid', got {v!r}")
        if parts[0] == "0":
            raise ValueError("user must not be root (uid 0)")
        return v

    @property
    def uid(self) -> int:
        return int(self.user.split(":")[0])

    @property
    def gid(self) -> int:
        return int(self.user.split(":")[1])

    @property
    def nano_cpus(self) -> int:
        return int(round(self.cpus * 1e9))

    @property
    def memory_swap_bytes(self) -> int:
        return self.memory_bytes

    def digest(self) -> str:
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    @classmethod
    def from_record(cls, data: dict) -> IsolationPolicy:
        """A policy stored with a run, read on any machine (no host-CPU rule). A record
        made before a setting existed is read as the run ran: without it."""
        if isinstance(data, dict):
            data = {"sysv_shm_limits": False, "no_core_dumps": False, **data}
        return cls.model_validate(data, context={"check_host": False})

    @classmethod
    def load(cls, path: str | Path | None) -> IsolationPolicy:
        """Load from a JSON or YAML file; None gives the defaults for this host."""
        if path is None:
            return cls()

        p = Path(path)
        data = load_document(p, "isolation policy")
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError(f"isolation policy {p} must be a mapping, got {type(data).__name__}")
        policy = cls.model_validate(data)
        problem = policy.tmpfs_problem()
        if problem is not None:
            raise ValueError(f"isolation policy {p}: {problem}")
        return policy


@dataclass(frozen=True)
class LimitNeeds:
    """The least a workload (a native harness, ``ale.agents.harness``) needs of the
    sandbox's limits; None: nothing stated."""

    pids: int | None = None
    memory_bytes: int | None = None
    tmp_bytes: int | None = None  # the size of the /tmp tmpfs

    def to_dict(self) -> dict[str, int | None]:
        return {"pids_limit": self.pids, "memory_bytes": self.memory_bytes, "tmp_bytes": self.tmp_bytes}


_STATED = "the run's policy (an operator's policy file, a task card's resources) states it and"


class LimitRefused(ValueError):
    """A limit the policy states (or the host's capacity) is below what the workload needs."""


def _tmp_size(policy: IsolationPolicy) -> int | None:
    sizes = [t.size_bytes for t in policy.tmpfs if t.path == "/tmp"]
    return sizes[0] if sizes else 0


def raise_to_needs(policy: IsolationPolicy, needs: LimitNeeds, *, who: str,
                   host_memory: int | None = None) -> tuple[IsolationPolicy, dict[str, dict[str, int]]]:
    """``policy`` with each limit below ``needs`` raised to it, and the changes made
    (``{field: {"from": old, "to": new}}``, empty when the policy fits already).

    Within the policy's bounds only: a limit the policy states itself
    (``model_fields_set``: an operator's policy file, a task card's resources, a
    runtime's pids) is never raised, and memory never beyond ``HOST_MEMORY_SHARE`` of
    the host's. A /tmp the policy sizes by default is re-fitted to the raised memory
    (tmpfs take at most ``TMPFS_MEMORY_SHARE`` of it), so /tmp's need raises memory
    too. Raises ``LimitRefused`` naming the limit, the need and the fix."""
    stated = policy.model_fields_set
    update: dict[str, object] = {}
    changes: dict[str, dict[str, int]] = {}

    def refuse(field: str, have: int, need: int, why: str, fix: str = "") -> LimitRefused:
        fix = fix or f"Set {field} to at least {_show(field, need)} in the isolation policy (--policy)"
        return LimitRefused(f"{who} needs {field} >= {_show(field, need)}; {why} gives {_show(field, have)}. "
                            f"{fix}, or run it in bridge mode (outside the sandbox)")

    if needs.pids is not None and policy.pids_limit < needs.pids:
        if "pids_limit" in stated:
            raise refuse("pids_limit", policy.pids_limit, needs.pids, _STATED)
        update["pids_limit"] = needs.pids
    tmp_need = needs.tmp_bytes
    tmp = _tmp_size(policy)
    tmp_short = tmp_need is not None and tmp is not None and tmp < tmp_need
    mem_need = needs.memory_bytes or 0
    if tmp_short and tmp_need is not None:
        # The most /dev/shm and SysV may take, whatever memory is given (its SysV share grows with it).
        reserve = SHM_BYTES + (SYSV_SHM_BYTES if policy.sysv_shm_limits else 0)
        mem_need = max(mem_need, -(-int((tmp_need + reserve) / TMPFS_MEMORY_SHARE) // MIB) * MIB)
    if policy.memory_bytes < mem_need:
        if "memory_bytes" in stated:
            raise refuse("memory_bytes", policy.memory_bytes, mem_need, _STATED)
        cap = int((host_memory if host_memory is not None else host_memory_bytes()) * HOST_MEMORY_SHARE) // MIB * MIB
        if cap < mem_need:
            raise refuse("memory_bytes", cap, mem_need, f"this host ({HOST_MEMORY_SHARE:.0%} of its memory)",
                         "Run it on a host with more memory")
        update["memory_bytes"] = mem_need
    if tmp_short and "tmpfs" in stated:  # after memory: a stated memory too small is the first thing to fix
        raise refuse("tmpfs /tmp size", tmp or 0, tmp_need or 0, _STATED)
    if not update and not tmp_short:
        return policy, {}
    raised = policy.model_copy(update=update)
    if "tmpfs" not in stated:  # the default /tmp, fitted to the memory the sandbox has now
        raised = raised.model_copy(update={"tmpfs": (TmpfsMount(),)}).fit_tmpfs()
        if tmp_need is not None and (_tmp_size(raised) or 0) < tmp_need:
            raised = raised.model_copy(update={"tmpfs": tuple(t.with_size(tmp_need) if t.path == "/tmp" else t
                                                              for t in raised.tmpfs)})
    for field in ("pids_limit", "memory_bytes"):
        if getattr(raised, field) != getattr(policy, field):
            changes[field] = {"from": getattr(policy, field), "to": getattr(raised, field)}
    if _tmp_size(raised) != tmp:
        changes["tmp_bytes"] = {"from": tmp or 0, "to": _tmp_size(raised) or 0}
    problem = raised.tmpfs_problem()
    if problem is not None:  # never: the rule above keeps tmpfs within memory
        raise LimitRefused(f"{who}: raising the limits would break the policy's own rule: {problem}")
    return raised, changes


def _show(field: str, value: int) -> str:
    return str(value) if field == "pids_limit" else f"{value // MIB} MiB"
