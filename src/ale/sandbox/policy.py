"""The isolation policy: the values of the sealed-container template, as data.

One model states them; the docker provider applies them, the inspect checks and
probes verify them, and the policy used is stored with each run's evidence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

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


class TmpfsMount(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str = "/tmp"
    options: str = "rw,nosuid,nodev,size=1g"


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
    env_allowlist: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "PYTHONDONTWRITEBYTECODE")

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
        """A policy stored with a run, read on any machine (no host-CPU rule)."""
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
        return cls.model_validate(data)
