"""Probes run inside the candidate container: the kernel's own view of the seal.

The harness runs `PROBE_SCRIPT` through its own exec as the candidate user (never
through the agent's tools), before the agent's first step and again after, and
stores the raw output as evidence. The script only reads /proc and /sys and
creates and removes one file per write test: it never opens a socket, so a
mis-configured container cannot send a packet because of it.

Writable mounts: under `--read-only` the runtime still gives the container a
writable `/dev/shm` (the IPC namespace's tmpfs, `--ipc private`, capped by
ShmSize, nosuid/nodev/noexec). It is accepted, not required: with `--ipc none`
it is absent. The required writable mounts are the workspace and the policy's
tmpfs paths; anything else writable fails `probe.writable_mounts`. Kernel and
runtime pseudo-filesystems (proc, sysfs, cgroup, devpts, mqueue, the root-owned
/dev and /sys/fs/cgroup tmpfs, and /dev/null binds over masked /proc paths) are
not storage the candidate can use and are listed in the evidence but not judged.
The accepted runtime mounts come from the policy's `runtime_writable_mounts`
where the policy states them, else `RUNTIME_WRITABLE_MOUNTS`.

Beyond ISOLATION.md's list the probes also read the namespace links (none may be
the kernel's initial namespace or the harness's own), that Docker's masked paths
are covered and its read-only paths (and /sys) are mounted read-only, that the
cgroup namespace is private, and the container init's (PID 1) uid, capabilities,
no_new_privs and seccomp: an exec's `--user` does not say who init runs as.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ale.defaults import DESKTOP_UID
from ale.isolation.checks import Check
from ale.sandbox.base import ExecResult, SandboxError
from ale.sandbox.policy import IsolationPolicy

MARK = "=== ale-probe:"
# Writable mounts the runtime adds under --read-only that are accepted (see module doc).
RUNTIME_WRITABLE_MOUNTS: tuple[str, ...] = ("/dev/shm",)
_PSEUDO_FSTYPES = frozenset({"proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2"})
_RUNTIME_TMPFS = frozenset({"/dev", "/sys/fs/cgroup"})

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
while IFS= read -r l; do
  case $l in CapEff:*|CapPrm:*|CapBnd:*|CapInh:*|CapAmb:*|NoNewPrivs:*|Seccomp:*) printf '%s\n' "$l";; esac
done < /proc/$$/status
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
    eval "v=\$ns_$n"; printf '%s %s\n' "$n" "$v"
  done
}
sec paths
for p in /proc/asound /proc/acpi /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list \
         /proc/timer_stats /proc/sched_debug /proc/scsi /sys/firmware \
         /sys/devices/virtual/powercap /proc/bus /proc/fs /proc/irq /proc/sys \
         /proc/sysrq-trigger; do
  if [ -e "$p" ]; then echo "exists $p"; else echo "absent $p"; fi
done
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
# The desktop user (images/desktop): its processes are the only ones besides the
# candidate's allowed in a sandbox (and exist only in the desktop image).

_ROOTFS_WRITE_PATHS = ("/", "/var/tmp")
# Docker's default MaskedPaths and ReadonlyPaths: each one that exists must be
# covered by a mount (masked) or mounted read-only, as the runtime does.
MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
# Inode numbers of the kernel's initial namespaces (include/linux/proc_ns.h): a
# container in one of them shares it with the host.
INIT_NS_INODES = {"ipc": 0xEFFFFFFF, "uts": 0xEFFFFFFE, "pid": 0xEFFFFFFC, "cgroup": 0xEFFFFFFB}
_PRIVATE_NS = ("ipc", "uts", "pid", "cgroup", "net", "mnt")


def host_namespaces() -> dict[str, str]:
    """The harness's own namespaces: the candidate must share none of them."""
    out = {}
    for n in _PRIVATE_NS:
        try:
            out[n] = os.readlink(f"/proc/self/ns/{n}")
        except OSError:
            continue
    return out


def runtime_writable_mounts(policy: IsolationPolicy) -> tuple[str, ...]:
    """The accepted runtime mounts: the policy's `runtime_writable_mounts` where it states them."""
    return tuple(getattr(policy, "runtime_writable_mounts", RUNTIME_WRITABLE_MOUNTS))  # /var/tmp is world-writable on Debian: EROFS only


def probe_argv(
    input_dir: str, workspace_dir: str, *, tmpfs_paths: tuple[str, ...] = ("/tmp",)
) -> list[str]:
    """The exec argv: the script, then the input, the workspace, and the tmpfs paths."""
    return ["sh", "-c", PROBE_SCRIPT, "ale-probe", input_dir, workspace_dir, *tmpfs_paths]


def split_sections(raw: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in raw.splitlines():
        if line.startswith(MARK) and line.endswith(" ==="):
            name = line[len(MARK) : -4]
            current = sections.setdefault(name, [])
            continue
        if current is not None:
            current.append(line)
    return sections


def _unescape(s: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mountinfo(lines: list[str]) -> list[dict[str, Any]]:
    mounts = []
    for line in lines:
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        f = left.split()
        r = right.split()
        if not sep or len(f) < 6 or len(r) < 2:
            raise ValueError(f"bad mountinfo line: {line!r}")
        mounts.append({
            "root": _unescape(f[3]),
            "mount_point": _unescape(f[4]),
            "options": f[5].split(","),
            "fstype": r[0],
            "source": _unescape(r[1]),
        })
    return mounts


def _is_runtime_pseudo(m: dict[str, Any]) -> bool:
    if m["fstype"] in _PSEUDO_FSTYPES:
        return True
    if m["fstype"] == "tmpfs" and m["mount_point"] in _RUNTIME_TMPFS:
        return True
    # Masked paths: the runtime binds /dev/null over files in /proc and /sys.
    return m["root"] == "/null" and m["mount_point"].startswith(("/proc/", "/sys/"))


def _hex(v: str) -> int:
    return int(v.strip(), 16)


def _check(cid: str, expected: Any, fn) -> Check:
    try:
        ok, observed, detail = fn()
    except KeyError as e:
        return Check(cid, None, expected, None, f"missing probe section or field {e.args[0]}")
    except (ValueError, IndexError, TypeError) as e:
        return Check(cid, None, expected, None, f"unparsable probe output: {e}")
    return Check(cid, bool(ok), expected, observed, detail)


def _section(sections: dict[str, list[str]], name: str) -> list[str]:
    if name not in sections:
        raise KeyError(name)
    return sections[name]


def parse_probes(
    raw: str,
    policy: IsolationPolicy,
    *,
    input_dir: str,
    workspace_dir: str,
    tmpfs_paths: tuple[str, ...] | None = None,
    phase: str = "before",
) -> list[Check]:
    """Judge the probe output against the policy; a missing section is unknown.

    ``phase`` "after" (the candidate has worked): the write tests of the workspace
    and the tmpfs are not judged, because the candidate may legitimately make them
    fail (chmod its own workspace, fill its /tmp); that those mounts are writable is
    read from the kernel's mount table instead (``probe.writable_mounts``). The
    checks that the root and the public package refuse writes stay: nothing the
    candidate may do can make them pass wrongly or fail.
    """
    s = split_sections(raw)
    tmpfs = tuple(t.path for t in policy.tmpfs) if tmpfs_paths is None else tmpfs_paths
    checks: list[Check] = []
    add = checks.append
    if "end" not in s:
        add(Check("probe.complete", None, "end marker", sorted(s),
                  "probe output lacks its end marker (cut short or failed)"))
    else:
        add(Check("probe.complete", True, "end marker", sorted(s)))
    if "exit" in s:  # recorded by judge_probes (older evidence has no such section)
        line = " ".join(s["exit"]).split()
        fields = dict(item.split("=", 1) for item in line if "=" in item)
        ok = fields.get("exit_code") == "0" and fields.get("timed_out") == "False"
        add(Check("probe.exec", ok, {"exit_code": "0", "timed_out": "False"}, fields,
                  "" if ok else f"the probe script itself failed: {fields}"))

    def status(name: str = "status") -> dict[str, str]:
        out = {}
        for ln in _section(s, name):
            k, _, v = ln.partition(":")
            out[k.strip()] = v.strip()
        return out

    def uid() -> tuple[bool, Any, str]:
        line = next((ln for ln in _section(s, "id") if ln.startswith("numeric uid=")), None)
        if line is None:
            raise KeyError("numeric uid line")
        fields = dict(p.split("=", 1) for p in line.removeprefix("numeric ").split(" ", 2))
        observed = f"{fields['uid']}:{fields['gid']}"
        groups = fields["groups"].split()
        # The container's init runs as Config.User, whatever user the exec asks for.
        init = status("init_status")
        init_user = f"{init['Uid'].split()[0]}:{init['Gid'].split()[0]}"
        ok = observed == policy.user and init_user == policy.user and "0" not in groups
        detail = "" if ok else f"probe runs as {observed} (groups {groups}), init as {init_user}"
        return ok, {"user": observed, "groups": groups, "init_user": init_user}, detail

    add(_check("probe.uid", policy.user, uid))

    def cap(name: str):
        def fn() -> tuple[bool, Any, str]:
            st, init = status(), status("init_status")
            vals = {k: st[k] for k in name.split("+")}
            vals.update({f"init {k}": init[k] for k in name.split("+")})
            ok = all(_hex(v) == 0 for v in vals.values())
            return ok, vals, "" if ok else f"capabilities present: {vals}"
        return fn

    add(_check("probe.cap_eff_zero", 0, cap("CapEff+CapPrm")))
    add(_check("probe.cap_bnd_zero", 0, cap("CapBnd")))

    def flag(key: str, want: str):
        def fn() -> tuple[bool, Any, str]:
            vals = {"probe": status()[key], "init": status("init_status")[key]}
            ok = all(v == want for v in vals.values())
            return ok, vals, "" if ok else f"{key} is not {want}: {vals}"
        return fn

    add(_check("probe.no_new_privs", "1", flag("NoNewPrivs", "1")))
    add(_check("probe.seccomp", "2 (filter mode)", flag("Seccomp", "2")))

    def interfaces() -> tuple[bool, Any, str]:
        names = sorted(ln.split(":", 1)[0].strip() for ln in _section(s, "netdev")[2:]
                       if ":" in ln)
        return names == ["lo"], names, "" if names == ["lo"] else f"interfaces: {names}"

    add(_check("probe.interfaces_lo_only", ["lo"], interfaces))

    def routes() -> tuple[bool, Any, str]:
        v4 = [ln.split() for ln in _section(s, "route")[1:] if ln.strip()]
        v6 = [ln.split() for ln in _section(s, "ipv6_route") if ln.strip()]
        # IPv6 always lists the kernel's reject/local entries on lo; they route nowhere.
        bad = [" ".join(r) for r in v4 if r[0] != "lo"] + [" ".join(r) for r in v6 if r[-1] != "lo"]
        return not bad, {"ipv4": len(v4), "ipv6": len(v6), "off_loopback": bad}, (
            f"routes off loopback: {bad}" if bad else "")

    add(_check("probe.no_routes", "no route except on lo", routes))

    def writable() -> tuple[bool, Any, str]:
        mounts = parse_mountinfo(_section(s, "mountinfo"))
        rw = sorted({m["mount_point"] for m in mounts
                     if "rw" in m["options"] and not _is_runtime_pseudo(m)})
        required = {workspace_dir, *tmpfs}
        allowed = required | set(runtime_writable_mounts(policy))
        extra = sorted(set(rw) - allowed)
        lacking = sorted(required - set(rw))
        problems = []
        if extra:
            problems.append(f"unexpected writable mounts: {extra}")
        if lacking:
            problems.append(f"planned writable mounts missing: {lacking}")
        return not problems, rw, "; ".join(problems)

    add(_check("probe.writable_mounts", sorted({workspace_dir, *tmpfs}), writable))

    def namespaces() -> tuple[bool, Any, str]:
        ns = dict(ln.split(" ", 1) for ln in _section(s, "ns") if " " in ln)
        host = dict(ln.split(" ", 1) for ln in s.get("host_ns", []) if " " in ln)
        bad = []
        for n in _PRIVATE_NS:
            link = ns.get(n, "").strip()
            if not link:
                if n in INIT_NS_INODES:
                    raise KeyError(f"ns {n}")
                continue
            m = re.fullmatch(r"\w+:\[(\d+)\]", link)
            if m is None:
                raise ValueError(f"namespace link {link!r}")
            if INIT_NS_INODES.get(n) == int(m.group(1)):
                bad.append(f"{n} is the host's initial namespace")
            elif host.get(n, "").strip() == link:
                bad.append(f"{n} is shared with the harness")
        return not bad, ns, "; ".join(bad)

    add(_check("probe.namespaces_private", "ipc, uts, pid, cgroup, net, mnt not the host's",
               namespaces))

    def mounted() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        top = {m["mount_point"]: m for m in parse_mountinfo(_section(s, "mountinfo"))}
        exists = {}
        for ln in _section(s, "paths"):
            word, _, path = ln.partition(" ")
            if word in ("exists", "absent"):
                exists[path] = word
        return top, exists

    def masked_paths() -> tuple[bool, Any, str]:
        top, exists = mounted()
        obs = {p: ("masked" if p in top else exists.get(p)) for p in MASKED_PATHS}
        bad = sorted(p for p, v in obs.items() if v == "exists")
        if any(v is None for v in obs.values()):
            raise KeyError("paths")
        return not bad, obs, f"readable, not masked: {bad}" if bad else ""

    add(_check("probe.masked_paths", "masked where present", masked_paths))

    def readonly_paths() -> tuple[bool, Any, str]:
        top, exists = mounted()
        obs: dict[str, str | None] = {}
        bad: list[str] = []
        for p in ("/sys", *READONLY_PATHS):
            if p in top:
                obs[p] = "ro" if "ro" in top[p]["options"] else "rw"
            else:
                obs[p] = exists.get(p, "exists" if p == "/sys" else None)
            if obs[p] is None:
                raise KeyError("paths")
            if obs[p] in ("rw", "exists") or (p in ("/sys", "/proc/sys") and obs[p] != "ro"):
                bad.append(p)
        return not bad, obs, f"writable kernel paths: {bad}" if bad else ""

    add(_check("probe.readonly_kernel_paths", "read-only", readonly_paths))

    def cgroupns() -> tuple[bool, Any, str]:
        paths = sorted({ln.split(":", 2)[2] for ln in _section(s, "cgroup") if ln.count(":") >= 2})
        return paths == ["/"], paths, "" if paths == ["/"] else "cgroup paths show the host's tree"

    add(_check("probe.cgroupns_private", ["/"], cgroupns))

    def limits() -> dict[str, str]:
        out = {}
        for ln in _section(s, "cgroup_limits"):
            k, _, v = ln.partition(" ")
            if k:
                out[k.rsplit("/", 1)[-1]] = v.strip()
        return out

    def cg_pids() -> tuple[bool, Any, str]:
        v = limits()["pids.max"]
        return v == str(policy.pids_limit), v, ""

    add(_check("probe.cgroup_pids", str(policy.pids_limit), cg_pids))

    def cg_mem() -> tuple[bool, Any, str]:
        lim = limits()
        if "memory.limit_in_bytes" in lim:  # cgroup v1
            obs = {k: lim.get(k) for k in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")}
            ok = _page_rounded(obs["memory.limit_in_bytes"], policy.memory_bytes)
            if obs["memory.memsw.limit_in_bytes"] is None:
                return ok, obs, "swap accounting is off in this kernel: the swap limit is unseen"
            ok = ok and _page_rounded(obs["memory.memsw.limit_in_bytes"], policy.memory_swap_bytes)
            return ok, obs, ""
        obs = {k: lim.get(k) for k in ("memory.max", "memory.swap.max")}
        if obs["memory.max"] is None:
            raise KeyError("memory.max")
        ok = _page_rounded(obs["memory.max"], policy.memory_bytes)
        if obs["memory.swap.max"] is None:
            return ok, obs, "swap accounting is off in this kernel: the swap limit is unseen"
        # cgroup v2 limits swap alone, v1 and Docker memory plus swap.
        swap_room = policy.memory_swap_bytes - policy.memory_bytes
        return ok and _page_rounded(obs["memory.swap.max"], swap_room), obs, ""

    add(_check("probe.cgroup_memory", policy.memory_bytes, cg_mem))

    def cg_cpu() -> tuple[bool, Any, str]:
        lim = limits()
        if "cpu.cfs_quota_us" in lim:
            quota, period = int(lim["cpu.cfs_quota_us"]), int(lim["cpu.cfs_period_us"])
        else:
            q, p = lim["cpu.max"].split()
            if q == "max":
                return False, lim["cpu.max"], "no CPU quota"
            quota, period = int(q), int(p)
        if quota <= 0:
            return False, {"quota": quota, "period": period}, "no CPU quota"
        value = quota / period
        ok = abs(value - policy.cpus) < 1e-3
        return ok, {"quota": quota, "period": period, "cpus": value}, ""

    add(_check("probe.cgroup_cpu", policy.cpus, cg_cpu))

    def writes() -> dict[str, str]:
        out = {}
        for ln in _section(s, "writes"):
            word, _, path = ln.partition(" ")
            if word in ("ok", "fail", "absent"):
                out[path] = word
        return out

    def must(paths: tuple[str, ...], want: str, skip_absent: bool = False):
        def fn() -> tuple[bool, Any, str]:
            w = writes()
            obs = {}
            for p in paths:
                if p not in w:
                    raise KeyError(f"write test of {p}")
                obs[p] = w[p]
            bad = {p: v for p, v in obs.items() if v != want and not (skip_absent and v == "absent")}
            return not bad, obs, f"unexpected write results: {bad}" if bad else ""
        return fn

    def root_paths() -> tuple[bool, Any, str]:
        # $HOME is on the root filesystem unless it is a planned mount.
        w = writes()
        extra = tuple(p for p in w if p not in _ROOTFS_WRITE_PATHS and p not in
                      (input_dir, workspace_dir, *tmpfs, *runtime_writable_mounts(policy)))
        return must(_ROOTFS_WRITE_PATHS + extra, "fail", skip_absent=True)()

    add(_check("probe.write_root_fails", "fail", root_paths))
    add(_check("probe.write_input_fails", "fail", must((input_dir,), "fail")))
    if phase != "after":
        add(_check("probe.write_workspace_ok", "ok", must((workspace_dir,), "ok")))
        add(_check("probe.write_tmp_ok", "ok", must(tmpfs, "ok")))
    if "sockets" in s or "processes" in s:  # older evidence has neither section
        checks.extend(socket_and_process_checks(s, policy, phase))
    return checks


def socket_and_process_checks(s: dict[str, list[str]], policy: IsolationPolicy, phase: str) -> list[Check]:
    """Nothing listens on TCP/UDP; no unix socket listens where the candidate could
    connect (abstract, or a path it may write); every process belongs to the
    candidate or the desktop user; after the end-of-turn kill, no candidate
    process is left but init and the probe itself."""
    checks: list[Check] = []

    def inet() -> tuple[bool, Any, str]:
        bad = []
        for ln in _section(s, "sockets"):
            f = ln.split()
            if f and f[0] in ("tcp", "tcp6") and len(f) >= 3 and f[2] == "0A" or f and f[0] in ("udp", "udp6") and len(f) >= 3:
                bad.append(f"{f[0]} {f[1]}")
        return not bad, bad, f"listening: {bad}" if bad else ""

    def unix() -> tuple[bool, Any, str]:
        listeners, bad = [], []
        for ln in _section(s, "sockets"):
            f = ln.split()
            if not f or f[0] != "unix" or len(f) < 5:
                continue
            path, writable = f[3], f[4] == "w"
            listeners.append({"path": path, "candidate_may_connect": writable or path.startswith("@")})
            if path.startswith("@") or writable:
                bad.append(path)
        return not bad, listeners, f"the candidate can reach: {bad}" if bad else ""

    def table() -> tuple[int, dict[int, tuple[int, int, str]]]:
        lines = _section(s, "processes")
        me = int(next(ln for ln in lines if ln.startswith("self ")).split()[1])
        procs = {}
        for ln in lines:
            f = ln.split(None, 3)
            if len(f) >= 3 and f[0].isdigit():
                procs[int(f[0])] = (int(f[1]), int(f[2]), f[3] if len(f) > 3 else "")
        return me, procs

    def owners() -> tuple[bool, Any, str]:
        _me, procs = table()
        allowed = {policy.uid, DESKTOP_UID}
        by_uid: dict[str, int] = {}
        for uid, _pp, _n in procs.values():
            by_uid[str(uid)] = by_uid.get(str(uid), 0) + 1
        bad = sorted({f"{pid}:{u}:{n}" for pid, (u, _pp, n) in procs.items() if u not in allowed})
        return not bad, by_uid, f"processes of other users: {bad}" if bad else ""

    def candidate_left() -> tuple[bool, Any, str]:
        me, procs = table()
        mine = {1, me}
        p = me
        while p in procs and procs[p][1] not in (0, p):  # the probe's own ancestors (the exec's wrapper)
            p = procs[p][1]
            mine.add(p)
        left = sorted(f"{pid}:{n}" for pid, (u, _pp, n) in procs.items() if u == policy.uid and pid not in mine)
        return not left, left, f"candidate processes alive after the kill: {left}" if left else ""

    checks.append(_check("probe.no_inet_listeners", [], inet))
    checks.append(_check("probe.unix_listeners_private", "none the candidate can reach", unix))
    checks.append(_check("probe.process_owners", f"uid {policy.uid} or {DESKTOP_UID}", owners))
    if phase == "after":
        checks.append(_check("probe.no_candidate_process_left", [], candidate_left))
    return checks


def probe_command(policy: IsolationPolicy, *, input_dir: str, workspace_dir: str) -> list[str]:
    """The probe exec for this policy (its tmpfs paths are write-tested too)."""
    return probe_argv(input_dir, workspace_dir, tmpfs_paths=tuple(t.path for t in policy.tmpfs))


def judge_probes(
    res: ExecResult | None, policy: IsolationPolicy, *, input_dir: str, workspace_dir: str, phase: str
) -> tuple[str, list[Check]]:
    """The evidence text and the checks of one probe exec (None: it did not run).

    The text keeps everything a later re-parse needs to reach the same verdict:
    the script's output, its stderr, its exit status and the harness's own
    namespaces (which the sandbox's must differ from).
    """
    if res is None:
        return "", [Check("probe.exec", None, 0, None, "the probes did not run (the end-of-turn kill could not report)")]
    raw = res.stdout.decode("utf-8", errors="replace")
    err = res.stderr.decode("utf-8", errors="replace")
    if err:
        raw += f"{MARK}stderr ===\n{err}"
    raw += f"{MARK}exit ===\nexit_code={res.exit_code} timed_out={res.timed_out}\n"
    raw += f"{MARK}host_ns ===\n" + "".join(f"{k} {v}\n" for k, v in host_namespaces().items())
    return raw, parse_probes(raw, policy, input_dir=input_dir, workspace_dir=workspace_dir, phase=phase)


async def run_probes(
    sandbox: Any, policy: IsolationPolicy, *, input_dir: str, workspace_dir: str, phase: str = "running"
) -> tuple[str, list[Check]]:
    """Run the probe script as the candidate user (the harness's own exec, never the
    agent's tools); return the evidence text and the checks."""
    try:
        res = await sandbox.exec(probe_command(policy, input_dir=input_dir, workspace_dir=workspace_dir),
                                 user=policy.user, timeout=30)
    except SandboxError as e:
        return "", [Check("probe.exec", None, 0, None, f"cannot run the probes: {e}")]
    return judge_probes(res, policy, input_dir=input_dir, workspace_dir=workspace_dir, phase=phase)


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
    if listing is None or "entries" not in listing:
        return [Check("ws.empty_at_start", None, [], None, "missing field entries")]
    names = [e["name"] for e in listing["entries"]]
    checks = [Check("ws.empty_at_start", not names, [], names,
                    f"workspace not empty: {names[:20]}" if names else "")]
    if expected_inode is not None:
        inode = listing.get("inode")
        checks.append(Check("ws.same_inode", inode == expected_inode, expected_inode, inode,
                            "" if inode == expected_inode else "the workspace folder was replaced"))
    return checks


MAX_PAGE = 65536  # the largest page size Linux uses (arm64, ppc64)


def _page_rounded(observed: Any, asked: int) -> bool:
    """The kernel keeps a cgroup memory limit in whole pages, rounding the asked
    bytes down: the observed limit is the asked one, or it rounded down to a page."""
    try:
        got = int(str(observed).strip())
    except (TypeError, ValueError):
        return False
    return got == asked or (got % 4096 == 0 and asked - MAX_PAGE < got < asked)
