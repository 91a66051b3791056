"""The OCI runtimes a sandbox may run under, and how to tell the engine has them.

`runc` (the default) runs the candidate on the host's kernel behind namespaces,
capabilities and seccomp. `runsc` (gVisor) puts a user-space kernel in between:
the candidate's system calls are served by gVisor's Sentry, which itself runs
under a strict host seccomp filter, so a kernel bug is one more wall away.

The policy names the runtime (`IsolationPolicy.runtime`); the engine must have it
registered under that name (`docker info` → Runtimes). A missing one is refused
before any container is made, with the commands that install and register it.

What differs under gVisor, and how the seal rules read it (docs/isolation.md):
the sandbox's /proc is gVisor's, so `/proc/self/status` has no `NoNewPrivs`
line (the probes ask the kernel with prctl instead), `/proc/self/ns` lists only
net, pid and user (gVisor's own), /proc and /sys are synthetic (nothing of the
host's to mask), there is no cgroup file system inside (the limits are the
host's cgroup on the whole sandbox, read from the host), and /proc/version is
gVisor's, not the host's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# RuntimeMissing lives in ale.sandbox.base (the policy reads this module: no cycle).

DEFAULT_RUNTIME = "runc"
GVISOR = "runsc"

# The arguments ale registers runsc with (scripts/setup.sh):
# --network=none: sandboxes are offline (NetworkMode none), and the gVisor Debian
#   ships (2022-12) mistakes Docker's empty network namespace for the host's on
#   kernels >= 6 ("cannot run with network enabled in root network namespace");
# --oci-seccomp: Docker's seccomp profile filters the candidate's system calls
#   inside gVisor too (probe.seccomp reads it as under runc).
RUNSC_ARGS: tuple[str, ...] = ("--network=none", "--oci-seccomp")

# Under gVisor's ptrace platform every candidate process costs the sandbox about
# ten host threads and processes (the Sentry's tracer threads and a stub), and
# the idle sandbox about forty, all in the container's pids cgroup: a limit of
# 256 ends the sandbox after a few dozen candidate processes. Under runsc the
# default pids limit is this instead (the sandbox dies, the host is safe, when a
# fork bomb reaches it).
RUNSC_PIDS_LIMIT = 4096


@dataclass(frozen=True)
class Runtime:
    name: str
    what: str
    kernel: str  # what the candidate's system calls reach


RUNTIMES: dict[str, Runtime] = {
    "runc": Runtime("runc", "runc: namespaces, capabilities and seccomp on the host's kernel", "host"),
    "runsc": Runtime("runsc",
                     "gVisor: a user-space kernel (the Sentry) between the candidate and the host's", "gvisor"),
}


def is_gvisor(runtime: str) -> bool:
    return runtime == GVISOR


def install_hint(runtime: str) -> str:
    """The commands that install and register `runtime` with a Docker engine."""
    if runtime != GVISOR:
        return f"register the OCI runtime {runtime!r} with dockerd (daemon.json \"runtimes\")"
    args = ", ".join(f'"{a}"' for a in RUNSC_ARGS)
    return (
        "install gVisor and register it with dockerd:\n"
        "  apt-get install runsc            # Debian's gVisor package (bookworm and later)\n"
        "  # add to /etc/docker/daemon.json (merge with what is there):\n"
        f'  {{"runtimes": {{"runsc": {{"path": "/usr/bin/runsc", "runtimeArgs": [{args}]}}}}}}\n'
        "  kill -HUP \"$(cat /var/run/docker.pid)\"   # reloads the runtimes; running containers stay\n"
        "or run `make setup` (scripts/setup.sh does both)."
    )


def missing_runtime_message(runtime: str, available: Iterable[str]) -> str:
    have = ", ".join(sorted(available)) or "none"
    return (f"the policy asks for the runtime {runtime!r}, which this Docker engine does not have "
            f"(it has: {have}). To run under it, {install_hint(runtime)}")


def unknown_runtime_message(runtime: str) -> str:
    return f"unknown runtime {runtime!r}: use one of {', '.join(RUNTIMES)}"


def check_known(runtime: str) -> str:
    """`runtime` when ale knows how to check a sandbox under it; ValueError otherwise."""
    if runtime not in RUNTIMES:
        raise ValueError(unknown_runtime_message(runtime))
    return runtime
