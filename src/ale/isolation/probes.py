"""Probes run inside the candidate container: the kernel's own view of the seal.

The harness runs `PROBE_SCRIPT` through its own exec as the candidate user (never
through the agent's tools), before the agent's first step and again after, and
stores the raw output as evidence. The script reads /proc and /sys and creates and
removes one file per write test. It opens a socket only where the guest has an IPv4
route off ``lo`` (a foreign VM disk on QEMU's restricted user-net; never a sealed
container, nor ale's own guest): a TCP connect to that gateway and to QEMU's
user-net host and DNS addresses (section ``egress``), each of which must fail.

The rules that judge the output are in `probe_rules` (what counts as a writable
mount, which paths must be masked); this module runs the script and keeps the
entry points the callers use (`run_probes`, `judge_probes`, `parse_probes`).

Beyond ISOLATION.md's list the probes also read the namespace links (none may be
the kernel's initial namespace or the harness's own), that Docker's masked paths
are covered and its read-only paths (and /sys) are mounted read-only, that the
cgroup namespace is private, and the container init's (PID 1) uid, capabilities,
no_new_privs and seccomp: an exec's `--user` does not say who init runs as.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ale.isolation.probe_rules import (
    INIT_NS_INODES,
    MARK,
    MASKED_PATHS,
    MAX_PAGE,
    PRIVATE_NS,
    READONLY_PATHS,
    RUNTIME_WRITABLE_MOUNTS,
    ProbeSubject,
    parse_mountinfo,
    runtime_writable_mounts,
    split_sections,
)
from ale.isolation.probe_rules import page_rounded as _page_rounded
from ale.isolation.registry import PROBES, Check, Fit, as_moment, rules_of
from ale.isolation.rules import judge
from ale.isolation.vm_rules import VmExpectation
from ale.sandbox.base import ExecResult, SandboxError
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.runtimes import is_gvisor

__all__ = [
    "INIT_NS_INODES", "MARK", "MASKED_PATHS", "MAX_PAGE", "PROBE_SCRIPT", "READONLY_PATHS",
    "RUNTIME_WRITABLE_MOUNTS", "host_namespaces", "judge_probes", "parse_mountinfo", "parse_probes",
    "probe_argv", "probe_command", "run_probes", "vm_probe_argv", "runtime_writable_mounts",
    "socket_and_process_checks", "split_sections", "workspace_empty_checks", "workspace_listing",
]  # fmt: skip
_ = _page_rounded  # kept importable here (tests read it from this module)

PROBE_SCRIPT = r"""
in_dir=$1; ws_dir=$2; shift 2
# Shell builtins wherever the output stays the same: each fork and exec costs a
# millisecond or more in a container, and the probes run twice per run.
sec() { echo "=== ale-probe:$1 ==="; }
lines() { while IFS= read -r l; do printf '%s\n' "$l"; done < "$1"; }
sec id
id 2>&1
# What `id -u`, `id -g` and `id -G` print, from the kernel's own record of this shell.
euid=; rgid=; egid=; grps=
while read -r k a b rest; do
  case $k in Uid:) euid=$b;; Gid:) rgid=$a; egid=$b;; Groups:) grps="$a $b $rest";; esac
done < /proc/$$/status
all=$rgid; [ "$egid" != "$rgid" ] && all="$all $egid"
for g in $grps; do [ "$g" != "$rgid" ] && [ "$g" != "$egid" ] && all="$all $g"; done
printf 'numeric uid=%s gid=%s groups=%s\n' "$euid" "$egid" "$all"
sec status
nnp=
while IFS= read -r l; do
  case $l in CapEff:*|CapPrm:*|CapBnd:*|CapInh:*|CapAmb:*|NoNewPrivs:*|Seccomp:*) printf '%s\n' "$l";; esac
  case $l in NoNewPrivs:*) nnp=1;; esac
done < /proc/$$/status
if [ -z "$nnp" ]; then
  # gVisor's /proc/<pid>/status has no NoNewPrivs line: ask its kernel (util-linux's
  # setpriv reads prctl PR_GET_NO_NEW_PRIVS).
  sec nnp_prctl
  { setpriv --dump 2>/dev/null || echo unavailable; } | while IFS= read -r l; do
    case $l in no_new_privs:*|unavailable) printf '%s\n' "$l";; esac
  done
fi
sec init_status
while IFS= read -r l; do
  case $l in Uid:*|Gid:*|CapEff:*|CapPrm:*|CapBnd:*|NoNewPrivs:*|Seccomp:*) printf '%s\n' "$l";; esac
done < /proc/1/status
sec netdev
lines /proc/net/dev
sec route
[ -r /proc/net/route ] && lines /proc/net/route
sec ipv6_route
[ -r /proc/net/ipv6_route ] && lines /proc/net/ipv6_route
sec egress
# Only where the guest has an IPv4 route off lo (never in a sealed container, nor in
# ale's own guest without a network): a TCP connect to the default gateway and, on
# QEMU's user-net subnet, to its host and DNS addresses; nothing farther.
hexip() { h=$1; printf '%d.%d.%d.%d' "0x${h#??????}" "0x$(x=${h#????}; echo "${x%??}")" \
  "0x$(x=${h#??}; echo "${x%????}")" "0x${h%??????}"; }
targets=
if [ -r /proc/net/route ]; then
  while read -r ifc dst gw flags rest; do
    [ "$ifc" = Iface ] || [ "$ifc" = lo ] && continue
    [ "$dst" = 00000000 ] && targets="$targets $(hexip "$gw")"
    [ "$dst" = 0002000A ] && targets="$targets 10.0.2.2 10.0.2.3"
  done < /proc/net/route
fi
try_tcp() {
  if command -v bash >/dev/null 2>&1; then
    timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
  elif command -v python3 >/dev/null 2>&1; then
    timeout 3 python3 -c "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)" "$1" "$2" \
      2>/dev/null
  else return 2; fi
}
seen=
for t in $targets; do
  case " $seen " in *" $t "*) continue;; esac; seen="$seen $t"
  for port in 22 53 80 443; do
    try_tcp "$t" "$port"; rc=$?
    case $rc in 0) echo "open $t $port";; 2) echo "untested $t $port";; *) echo "closed $t $port";; esac
  done
done
sec mountinfo
lines /proc/$$/mountinfo
sec cgroup
lines /proc/$$/cgroup
sec ns
ls -l /proc/$$/ns 2>/dev/null | {
  ns_ipc=; ns_uts=; ns_pid=; ns_cgroup=; ns_net=; ns_mnt=; ns_user=
  while read -r _p _l _u _g _s _m _d _t name _arrow target; do
    case $name in ipc|uts|pid|cgroup|net|mnt|user) eval "ns_$name=\$target";; esac
  done
  for n in ipc uts pid cgroup net mnt user; do
    eval "v=\$ns_$n"
    # gVisor's ls cannot list /proc/<pid>/ns: read the links it has one by one.
    [ -z "$v" ] && [ -z "$ns_pid$ns_net" ] && v=$(readlink "/proc/$$/ns/$n" 2>/dev/null)
    printf '%s %s\n' "$n" "$v"
  done
}
sec paths
is_empty_dir() { [ -d "$1" ] || return 1; set -- "$1"/* "$1"/.[!.]*; [ ! -e "$1" ] && [ ! -e "$2" ]; }
for p in /proc/asound /proc/acpi /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list \
         /proc/timer_stats /proc/sched_debug /proc/scsi /sys/firmware \
         /sys/devices/virtual/powercap /proc/bus /proc/fs /proc/irq /proc/sys \
         /proc/sysrq-trigger; do
  if [ -e "$p" ]; then echo "exists $p"; is_empty_dir "$p" && echo "empty $p"; [ -w "$p" ] && echo "writable $p"
  else echo "absent $p"; fi
done
sec kernel
lines /proc/version
sec cgroup_limits
for f in /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes \
         /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us \
         /sys/fs/cgroup/cpu/cpu.cfs_period_us /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max \
         /sys/fs/cgroup/memory.swap.max /sys/fs/cgroup/cpu.max; do
  if [ -r "$f" ]; then v=; read -r v < "$f"; printf '%s %s\n' "$f" "$v"; fi
done
sec writes
tag=$$; [ -r /proc/sys/kernel/random/uuid ] && read -r tag < /proc/sys/kernel/random/uuid
try_write() {
  d=$1
  if [ ! -d "$d" ]; then echo "absent $d"; return; fi
  f="$d/.ale-probe-$tag"
  if { true > "$f"; } 2>/dev/null; then rm -f "$f"; echo "ok $d"; else echo "fail $d"; fi
}
for d in / /var/tmp "$HOME" "$in_dir" "$ws_dir" /dev/shm "$@"; do
  [ -n "$d" ] && try_write "$d"
done
# -- desktop: sockets and process owners (shell builtins only: no child of ours is listed)
sec sockets
for f in tcp tcp6 udp udp6; do
  [ -r /proc/net/$f ] || continue
  while read -r sl loc rem st rest; do
    [ "$sl" = sl ] && continue; echo "$f $loc $st $rem"
  done < /proc/net/$f
done
while read -r num ref proto flags typ st inode path; do
  [ "$num" = Num ] && continue; [ "$flags" = 00010000 ] || continue
  w=-; [ -n "$path" ] && [ "${path#@}" = "$path" ] && [ -w "$path" ] && w=w
  echo "unix $flags $st ${path:-<unnamed>} $w"
done < /proc/net/unix
sec processes
echo "self $$"
for p in /proc/[0-9]*; do
  u=; pp=; n=
  while read -r k v rest; do
    case $k in Name:) n=$v;; PPid:) pp=$v;; Uid:) u=$v;; esac
  done 2>/dev/null < "$p/status"
  [ -n "$u" ] && echo "${p#/proc/} $u $pp $n"
done
sec end
"""


def host_namespaces() -> dict[str, str]:
    """The harness's own namespaces: the candidate must share none of them."""
    out = {}
    for n in PRIVATE_NS:
        try:
            out[n] = os.readlink(f"/proc/self/ns/{n}")
        except OSError:
            continue
    return out


def probe_argv(
    input_dir: str, workspace_dir: str, *, tmpfs_paths: tuple[str, ...] = ("/tmp",)
) -> list[str]:
    """The exec argv: the script, then the input, the workspace, and the tmpfs paths."""
    return ["sh", "-c", PROBE_SCRIPT, "ale-probe", input_dir, workspace_dir, *tmpfs_paths]


def vm_probe_argv(expectation: VmExpectation) -> list[str]:
    """The guest probe's argv (the container's probe script, `probes.PROBE_SCRIPT`, with the
    guest's input and workspace folders and /tmp): run it in the guest as the candidate,
    through the harness's own control channel, and store its output (stdout, then the
    ``stderr`` and ``exit`` sections `probes.judge_probes` appends) as
    `evidence/vm-probes-<moment>.txt`."""
    if not expectation.guest_input_dir or not expectation.guest_workspace_dir:
        raise ValueError("the guest's probes need guest_input_dir and guest_workspace_dir")
    return probe_argv(expectation.guest_input_dir, expectation.guest_workspace_dir)


def parse_probes(
    raw: str,
    policy: IsolationPolicy,
    *,
    input_dir: str,
    workspace_dir: str,
    tmpfs_paths: tuple[str, ...] | None = None,
    phase: str = "before",
    fit: Fit = "exact",
) -> list[Check]:
    """Judge the probe output against the policy at moment `phase`; a missing section
    is unknown (`rules.judge` with ``probes=``).

    After the agent (``phase`` "after") the write tests of the workspace and the tmpfs
    are not judged, because the candidate may legitimately make them fail (chmod its
    own workspace, fill its /tmp); that those mounts are writable is read from the
    kernel's mount table instead (``probe.writable_mounts``). The checks that the root
    and the public package refuse writes stay: nothing the candidate may do can make
    them pass wrongly or fail.
    """
    return judge(phase, policy=policy, probes=raw, input_dir=input_dir, workspace_dir=workspace_dir,
                 tmpfs_paths=tmpfs_paths, fit=fit)


def socket_and_process_checks(s: dict[str, list[str]], policy: IsolationPolicy, phase: str) -> list[Check]:
    """The sockets-and-processes rules alone, on parsed sections: nothing listens on
    TCP/UDP; no unix socket listens where the candidate could connect; every process
    belongs to the candidate or the desktop user; after the end-of-turn kill, no
    candidate process is left but init and the probe itself."""
    subject = ProbeSubject(as_moment(phase), s, policy, "", "", ())
    return [r.check(subject) for r in rules_of(PROBES, area="processes") if subject.moment in r.moments]


def probe_command(policy: IsolationPolicy, *, input_dir: str, workspace_dir: str) -> list[str]:
    """The probe exec for this policy (its tmpfs paths are write-tested too)."""
    return probe_argv(input_dir, workspace_dir, tmpfs_paths=tuple(t.path for t in policy.tmpfs))


def judge_probes(
    res: ExecResult | None, policy: IsolationPolicy, *, input_dir: str, workspace_dir: str, phase: str,
    extra: str | None = None, fit: Fit = "exact",
) -> tuple[str, list[Check]]:
    """The evidence text and the checks of one probe exec (None: it did not run).

    The text keeps everything a later re-parse needs to reach the same verdict:
    the script's output, its stderr, its exit status and the harness's own
    namespaces (which the sandbox's must differ from).
    """
    if res is None:
        return "", [Check("probe.exec", None, 0, None,
                          "the probes did not run (the end-of-turn kill could not report)")]
    raw = res.stdout.decode("utf-8", errors="replace")
    err = res.stderr.decode("utf-8", errors="replace")
    if err:
        raw += f"{MARK}stderr ===\n{err}"
    raw += f"{MARK}exit ===\nexit_code={res.exit_code} timed_out={res.timed_out}\n"
    raw += f"{MARK}host_ns ===\n" + "".join(f"{k} {v}\n" for k, v in host_namespaces().items())
    raw += f"{MARK}host_kernel ===\n{host_kernel()}"
    raw += extra or ""  # what the harness read on the host (gVisor's cgroup limits)
    return raw, parse_probes(raw, policy, input_dir=input_dir, workspace_dir=workspace_dir, phase=phase, fit=fit)


async def run_probes(
    sandbox: Any, policy: IsolationPolicy, *, input_dir: str, workspace_dir: str, phase: str = "running",
    fit: Fit = "exact",
) -> tuple[str, list[Check]]:
    """Run the probe script as the candidate user (the harness's own exec, never the
    agent's tools); return the evidence text and the checks (`fit`: `registry.Fit`)."""
    control = getattr(sandbox, "control_listeners", None)  # a cua sandbox's control server (ale.sandbox.cua.sandbox)
    try:
        extra = f"{MARK}control_server ===\n" + await control() if control is not None else ""
        res = await sandbox.exec(probe_command(policy, input_dir=input_dir, workspace_dir=workspace_dir),
                                 user=policy.user, timeout=30)
    except SandboxError as e:
        return "", [Check("probe.exec", None, 0, None, f"cannot run the probes: {e}")]
    host_cgroup = None
    if is_gvisor(policy.runtime) and isinstance(getattr(sandbox, "id", None), str):
        # gVisor's kernel shows no cgroup: its limits are the host's cgroup on the whole sandbox.
        host_cgroup = f"{MARK}host_cgroup_limits ===\n" \
            + "".join(f"{k} {v}\n" for k, v in host_cgroup_limits(sandbox.id))
    return judge_probes(res, policy, input_dir=input_dir, workspace_dir=workspace_dir, phase=phase,
                        extra=extra + (host_cgroup or "") or None, fit=fit)


def host_kernel() -> str:
    """The harness's kernel (/proc/version): runc's sandbox shares it, gVisor's does not."""
    try:
        return Path("/proc/version").read_text()
    except OSError:
        return ""


# The cgroup files of a container on this host: cgroupfs and systemd drivers, v1 and v2.
_CGROUP_DIRS = ("/sys/fs/cgroup/{c}/docker/{id}", "/sys/fs/cgroup/{c}/system.slice/docker-{id}.scope",
                "/sys/fs/cgroup/docker/{id}", "/sys/fs/cgroup/system.slice/docker-{id}.scope")
_CGROUP_FILES = {"pids": ("pids.max",), "memory": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
                 "cpu": ("cpu.cfs_quota_us", "cpu.cfs_period_us")}
_CGROUP2_FILES = ("pids.max", "memory.max", "memory.swap.max", "cpu.max")


def host_cgroup_limits(container_id: str) -> list[tuple[str, str]]:
    """The limits the host's kernel holds for a container's cgroup, as (path, value)
    (empty when the engine is not on this host: the checks that read them are unknown)."""
    out: list[tuple[str, str]] = []
    for controller, files in _CGROUP_FILES.items():
        for pattern in _CGROUP_DIRS[:2]:
            d = Path(pattern.format(c=controller, id=container_id))
            if d.is_dir():
                out += [(str(d / f), (d / f).read_text().strip()) for f in files if (d / f).is_file()]
                break
    if not out:  # cgroup v2: one directory
        for pattern in _CGROUP_DIRS[2:]:
            d = Path(pattern.format(id=container_id))
            if d.is_dir():
                out += [(str(d / f), (d / f).read_text().strip()) for f in _CGROUP2_FILES if (d / f).is_file()]
                break
    return out


# -- the workspace at start --------------------------------------------------------
def workspace_listing(path: str | Path) -> dict[str, Any]:
    """The workspace as the host sees it: entries (lstat, no links followed) and inode."""
    p = Path(path)
    st = os.lstat(p)
    entries = []
    for name in sorted(os.listdir(p)):
        est = os.lstat(p / name)
        entries.append({"name": name, "mode": oct(est.st_mode), "size": est.st_size})
    return {
        "path": os.path.realpath(p),
        "inode": st.st_ino,
        "device": st.st_dev,
        "mode": oct(st.st_mode),
        "uid": st.st_uid,
        "entries": entries,
        "taken_at": datetime.now(UTC).isoformat(),
    }


def workspace_empty_checks(
    listing: dict[str, Any] | None, *, expected_inode: int | None = None
) -> list[Check]:
    """`ws.empty_at_start` (and `ws.same_inode` when the creation inode is known)."""
    return judge("before", workspace=listing, workspace_inode=expected_inode)
