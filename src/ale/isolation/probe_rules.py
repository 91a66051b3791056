"""The rules read from the probes' output: the kernel's own view of the seal.

`probes.PROBE_SCRIPT` prints one section per topic (``=== ale-probe:<name> ===``);
each rule reads the sections it needs, and a missing section makes its check
*unknown*. The harness appends sections of its own to the evidence (``stderr``,
``exit``: the script's exit status; ``host_ns``: the harness's namespaces).

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
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ale.defaults import DESKTOP_UID, PROBE_UID, PROBE_USER
from ale.isolation.registry import PROBES, Fit, Moment, Stricter, Verdict, limit_fits, rule
from ale.sandbox.policy import IsolationPolicy
from ale.sandbox.runtimes import is_gvisor

MARK = "=== ale-probe:"
# Writable mounts the runtime adds under --read-only that are accepted (see module doc).
RUNTIME_WRITABLE_MOUNTS: tuple[str, ...] = ("/dev/shm",)
_PSEUDO_FSTYPES = frozenset({"proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2"})
_RUNTIME_TMPFS = frozenset({"/dev", "/sys/fs/cgroup"})
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
PRIVATE_NS = ("ipc", "uts", "pid", "cgroup", "net", "mnt")
# The namespaces gVisor's /proc/<pid>/ns does not list (it has net, pid and user).
GVISOR_UNLISTED_NS = frozenset({"ipc", "uts", "cgroup", "mnt"})
# gVisor's kernel reports this version (a constant of its own, whatever the host runs).
GVISOR_VERSION = "#1 SMP Sun Jan 10 15:06:54 PST 2016"
MAX_PAGE = 65536  # the largest page size Linux uses (arm64, ppc64)


# -- reading the output ------------------------------------------------------------
# The key under which ``split_sections`` keeps what made an output malformed (only
# when something did): a name no section can have.
MALFORMED = "\0malformed"


def split_sections(raw: str) -> dict[str, list[str]]:
    """The output's sections by name. Text before the first section, and a section
    that appears twice (the script prints each once; the harness appends its own
    once), are recorded under ``MALFORMED`` (a repeated section's lines are merged)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    problems: list[str] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if line.startswith(MARK) and line.endswith(" ==="):
            name = line[len(MARK) : -4]
            if name in sections:
                problems.append(f"section {name!r} repeated (line {n})")
            current = sections.setdefault(name, [])
            continue
        if current is not None:
            current.append(line)
        elif line.strip() and not problems:
            problems.append(f"text before the first section (line {n})")
    if problems:
        sections[MALFORMED] = problems
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


def page_rounded(observed: Any, asked: int) -> bool:
    """The kernel keeps a cgroup memory limit in whole pages, rounding the asked
    bytes down: the observed limit is the asked one, or it rounded down to a page."""
    try:
        got = int(str(observed).strip())
    except (TypeError, ValueError):
        return False
    return got == asked or (got % 4096 == 0 and asked - MAX_PAGE < got < asked)


def runtime_writable_mounts(policy: IsolationPolicy) -> tuple[str, ...]:
    """The accepted runtime mounts: the policy's `runtime_writable_mounts` where it states them."""
    # /var/tmp is world-writable on Debian: EROFS only
    return tuple(getattr(policy, "runtime_writable_mounts", RUNTIME_WRITABLE_MOUNTS))


def status_fields(lines: list[str]) -> dict[str, str]:
    """A ``/proc/<pid>/status`` section: field name → value."""
    out = {}
    for ln in lines:
        k, _, v = ln.partition(":")
        out[k.strip()] = v.strip()
    return out


def write_results(lines: list[str]) -> dict[str, str]:
    """The ``writes`` section: path → ``ok`` / ``fail`` / ``absent`` (its write test)."""
    out = {}
    for ln in lines:
        word, _, path = ln.partition(" ")
        if word in ("ok", "fail", "absent"):
            out[path] = word
    return out


@dataclass(frozen=True)
class ProbeSubject:
    """One probe output at one moment, with the paths the probes were told."""

    moment: Moment
    sections: dict[str, list[str]]
    policy: IsolationPolicy
    input_dir: str  # where the public package is mounted inside
    workspace_dir: str  # where the workspace is mounted inside
    tmpfs: tuple[str, ...] = ("/tmp",)
    fit: Fit = "exact"  # as planned, or at least as strict (`registry.Fit`)

    def section(self, name: str) -> list[str]:
        """A section's lines; a missing one raises KeyError (unknown)."""
        if name not in self.sections:
            raise KeyError(name)
        return self.sections[name]

    def status(self, name: str = "status") -> dict[str, str]:
        return status_fields(self.section(name))

    @property
    def gvisor(self) -> bool:
        """The policy runs the sandbox under gVisor (runsc): its kernel reports differently."""
        return is_gvisor(getattr(self.policy, "runtime", "runc"))

    def limits(self) -> dict[str, str]:
        """The cgroup limits: the sandbox's own view; under gVisor, which shows none, the
        host's cgroup of the whole sandbox (the ``host_cgroup_limits`` the harness read)."""
        out = {}
        for ln in self.section("host_cgroup_limits" if self.gvisor else "cgroup_limits"):
            k, _, v = ln.partition(" ")
            if k:
                out[k.rsplit("/", 1)[-1]] = v.strip()
        return out

    def writes(self) -> dict[str, str]:
        return write_results(self.section("writes"))

    def mounted(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """The mount table by mount point, and which kernel paths exist."""
        top = {m["mount_point"]: m for m in parse_mountinfo(self.section("mountinfo"))}
        exists = {}
        for ln in self.section("paths"):
            word, _, path = ln.partition(" ")
            if word in ("exists", "absent"):
                exists[path] = word
        return top, exists

    def processes(self) -> tuple[int, dict[int, tuple[int, int, str]]]:
        """The probe's own pid, and every process: pid -> (uid, parent, name)."""
        lines = self.section("processes")
        me_line = next((ln for ln in lines if ln.startswith("self ")), None)
        if me_line is None:
            raise KeyError("processes: self")
        me = int(me_line.split()[1])
        procs = {}
        for ln in lines:
            f = ln.split(None, 3)
            if len(f) >= 3 and f[0].isdigit():
                procs[int(f[0])] = (int(f[1]), int(f[2]), f[3] if len(f) > 3 else "")
        return me, procs


def _probe_rule(check_id: str, *, area: str, expected: Any = None, **kw: Any) -> Callable[..., Any]:
    return rule(check_id, source=PROBES, area=area, expected=expected, **kw)


# -- the run of the script ----------------------------------------------------------
@_probe_rule("probe.complete", area="probe run", expected="end marker")
def complete(s: ProbeSubject) -> Verdict:
    """The output reaches the script's end marker (observed: the sections present).

    Output cut short (a timeout, a killed exec, a failing script) proves nothing;
    its absence is unknown, not a pass.
    """
    if "end" not in s.sections:
        return (None, sorted(k for k in s.sections if k != MALFORMED),
                "probe output lacks its end marker (cut short or failed)")
    return True, sorted(k for k in s.sections if k != MALFORMED), ""


@_probe_rule("probe.exec", area="probe run", expected={"exit_code": "0", "timed_out": "False"},
             when=lambda s: "exit" in s.sections, when_doc="when the evidence records the exit status")
def probe_exec(s: ProbeSubject) -> Verdict:
    """The probe script exited 0 without timing out (the `exit` section the harness
    appends; it is also unknown when the probes could not run at all).

    A failed script may have skipped the tests that would fail. Older evidence has no
    such section.
    """
    line = " ".join(s.sections["exit"]).split()
    fields = dict(item.split("=", 1) for item in line if "=" in item)
    ok = fields.get("exit_code") == "0" and fields.get("timed_out") == "False"
    return ok, fields, "" if ok else f"the probe script itself failed: {fields}"


@_probe_rule("probe.well_formed", area="probe run", expected="each section once, nothing before the first")
def well_formed(s: ProbeSubject) -> Verdict:
    """The output holds each section once and nothing before the first.

    Anything else was written into the probe's output by something other than the
    script (the candidate's text in the evidence), and its sections cannot be trusted.
    """
    if not s.sections:
        raise KeyError("no section")
    problems = s.sections.get(MALFORMED, [])
    return not problems, problems or None, "; ".join(problems[:5])


# -- identity and privileges --------------------------------------------------------
@_probe_rule("probe.uid", area="privileges", expected=lambda s: s.policy.user)
def uid(s: ProbeSubject) -> Verdict:
    """The probe (as the candidate; after the turn, as `PROBE_USER`, a uid the
    candidate never had) and the container's init (PID 1) run as the policy's
    `uid:gid`, and root's group 0 is not among the probe's groups.

    An exec's `--user` does not say who init runs as: the container's init runs as
    `Config.User`, whatever user the exec asks for.
    """
    line = next((ln for ln in s.section("id") if ln.startswith("numeric uid=")), None)
    if line is None:
        raise KeyError("numeric uid line")
    fields = dict(p.split("=", 1) for p in line.removeprefix("numeric ").split(" ", 2))
    observed = f"{fields['uid']}:{fields['gid']}"
    groups = fields["groups"].split()
    init = s.status("init_status")
    init_user = f"{init['Uid'].split()[0]}:{init['Gid'].split()[0]}"
    # After the turn the probes run as a uid the candidate never had (older runs: as the candidate).
    probe_users = (s.policy.user, PROBE_USER) if s.moment == "after" else (s.policy.user,)
    ok = observed in probe_users and init_user == s.policy.user and "0" not in groups
    detail = "" if ok else f"probe runs as {observed} (groups {groups}), init as {init_user}"
    return ok, {"user": observed, "groups": groups, "init_user": init_user}, detail


def _caps_zero(s: ProbeSubject, name: str) -> Verdict:
    st, init = s.status(), s.status("init_status")
    vals = {k: st[k] for k in name.split("+")}
    vals.update({f"init {k}": init[k] for k in name.split("+")})
    ok = all(_hex(v) == 0 for v in vals.values())
    return ok, vals, "" if ok else f"capabilities present: {vals}"


@_probe_rule("probe.cap_eff_zero", area="privileges", expected=0)
def cap_eff_zero(s: ProbeSubject) -> Verdict:
    """`CapEff` and `CapPrm` are 0, for the probe and for init (`/proc/<pid>/status`).

    The kernel's own record of the capabilities a process holds, whatever the inspect says.
    """
    return _caps_zero(s, "CapEff+CapPrm")


@_probe_rule("probe.cap_bnd_zero", area="privileges", expected=0)
def cap_bnd_zero(s: ProbeSubject) -> Verdict:
    """`CapBnd` is 0, for the probe and for init.

    The bounding set caps what any process may ever gain (through a setuid binary, a
    file capability): with it empty, nothing can be gained.
    """
    return _caps_zero(s, "CapBnd")


def _flag_both(s: ProbeSubject, key: str, want: str) -> Verdict:
    vals = {"probe": s.status()[key], "init": s.status("init_status")[key]}
    ok = all(v == want for v in vals.values())
    return ok, vals, "" if ok else f"{key} is not {want}: {vals}"


@_probe_rule("probe.no_new_privs", area="privileges", expected="1")
def no_new_privs(s: ProbeSubject) -> Verdict:
    """`NoNewPrivs` is 1, for the probe and for init. Under gVisor (runsc), whose
    `/proc/<pid>/status` has no such line, the probe asks its kernel
    (`prctl(PR_GET_NO_NEW_PRIVS)` through `setpriv --dump`, the `nnp_prctl` section);
    init's is not reported.

    The kernel's view of `no-new-privileges`: setuid binaries cannot raise privileges.
    """
    if s.gvisor and "NoNewPrivs" not in s.status():
        got = " ".join(s.section("nnp_prctl")).strip().removeprefix("no_new_privs:").strip()
        vals = {"probe": got, "init": "not reported by gVisor"}
        return got == "1", vals, "" if got == "1" else f"prctl(PR_GET_NO_NEW_PRIVS) says {got!r}"
    return _flag_both(s, "NoNewPrivs", "1")


@_probe_rule("probe.seccomp", area="privileges", expected="2 (filter mode)")
def seccomp(s: ProbeSubject) -> Verdict:
    """`Seccomp` is 2 (a filter is installed), for the probe and for init. Under gVisor
    init's is 2 (runsc registered with `--oci-seccomp` applies Docker's profile inside
    gVisor's kernel; without it the mode is 0 and the check fails); the probe's, an
    exec, may be 0: the gVisor Debian ships does not apply the profile to `runsc exec`.

    The seccomp filter blocks the system calls that reach around namespaces; under
    gVisor no system call of the candidate reaches the host's kernel at all (gVisor's
    kernel serves them, itself under its own host filter).
    """
    if s.gvisor:
        vals = {"probe": s.status()["Seccomp"], "init": s.status("init_status")["Seccomp"]}
        ok = vals["init"] == "2" and vals["probe"] in ("0", "2")
        detail = "" if ok else f"Seccomp under gVisor: {vals} (register runsc with --oci-seccomp)"
        if ok and vals["probe"] == "0":
            detail = "the exec runs unfiltered inside gVisor (runsc exec applies no OCI profile); init is filtered"
        return ok, vals, detail
    return _flag_both(s, "Seccomp", "2")


# -- network ----------------------------------------------------------------------
@_probe_rule("probe.interfaces_lo_only", area="network", expected=["lo"])
def interfaces_lo_only(s: ProbeSubject) -> Verdict:
    """`/proc/net/dev` lists only the loopback interface.

    Read from the kernel, never by sending a packet: a mis-configured sandbox would
    really send it.
    """
    names = sorted(ln.split(":", 1)[0].strip() for ln in s.section("netdev")[2:] if ":" in ln)
    return names == ["lo"], names, "" if names == ["lo"] else f"interfaces: {names}"


@_probe_rule("probe.no_routes", area="network", expected="no route except on lo")
def no_routes(s: ProbeSubject) -> Verdict:
    """`/proc/net/route` and `/proc/net/ipv6_route` have no route off loopback (IPv6's
    own reject and local entries on `lo` route nowhere).

    No route, no way out, whatever the interfaces are.
    """
    v4 = [ln.split() for ln in s.section("route")[1:] if ln.strip()]
    v6 = [ln.split() for ln in s.section("ipv6_route") if ln.strip()]
    bad = [" ".join(r) for r in v4 if r[0] != "lo"] + [" ".join(r) for r in v6 if r[-1] != "lo"]
    return not bad, {"ipv4": len(v4), "ipv6": len(v6), "off_loopback": bad}, (
        f"routes off loopback: {bad}" if bad else "")


# -- filesystem -------------------------------------------------------------------
@_probe_rule("probe.writable_mounts", area="filesystem", expected=lambda s: sorted({s.workspace_dir, *s.tmpfs}))
def writable_mounts(s: ProbeSubject) -> Verdict:
    """The writable mounts in `/proc/self/mountinfo` are exactly the workspace and the
    planned tmpfs, plus the runtime's accepted ones (`/dev/shm`); kernel
    pseudo-filesystems are not storage and are not judged.

    The mount table is the kernel's truth about where the candidate can write: an
    image VOLUME, an extra bind or a writable root all show here.
    """
    mounts = parse_mountinfo(s.section("mountinfo"))
    rw = sorted({m["mount_point"] for m in mounts if "rw" in m["options"] and not _is_runtime_pseudo(m)})
    required = {s.workspace_dir, *s.tmpfs}
    allowed = required | set(runtime_writable_mounts(s.policy))
    extra = sorted(set(rw) - allowed)
    lacking = sorted(required - set(rw))
    problems = []
    if extra:
        problems.append(f"unexpected writable mounts: {extra}")
    if lacking:
        problems.append(f"planned writable mounts missing: {lacking}")
    return not problems, rw, "; ".join(problems)


# -- namespaces -------------------------------------------------------------------
@_probe_rule("probe.namespaces_private", area="namespaces", expected="ipc, uts, pid, cgroup, net, mnt not the host's")
def namespaces_private(s: ProbeSubject) -> Verdict:
    """None of the ipc, uts, pid, cgroup, net and mnt namespaces (`/proc/self/ns`) is the
    kernel's initial one or the harness's own (the `host_ns` section). Under gVisor
    `/proc/self/ns` lists only net, pid and user (gVisor's own): those must not be the
    harness's; ipc, uts, cgroup and mnt are gVisor's kernel's, which no one else shares.

    Sharing a namespace with the host shares what it isolates, whatever the inspect
    claims.
    """
    ns = dict(ln.split(" ", 1) for ln in s.section("ns") if " " in ln)
    host = dict(ln.split(" ", 1) for ln in s.sections.get("host_ns", []) if " " in ln)
    bad = []
    for n in PRIVATE_NS:
        link = ns.get(n, "").strip()
        if not link:
            if s.gvisor and n in GVISOR_UNLISTED_NS:
                continue  # gVisor's kernel keeps it for the sandbox alone and lists no link
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


@_probe_rule("probe.masked_paths", area="privileges", expected="masked where present")
def masked_paths(s: ProbeSubject) -> Verdict:
    """Each of Docker's masked paths (`/proc/kcore`, `/proc/keys`, ...) that exists is
    covered by a mount. Under gVisor, which does not mask (its /proc and /sys are
    synthetic, nothing of the host's), each that exists is an empty directory.

    They expose the host's memory, keys and timers.
    """
    top, exists = s.mounted()
    obs = {p: ("masked" if p in top else exists.get(p)) for p in MASKED_PATHS}
    if any(v is None for v in obs.values()):
        raise KeyError("paths")
    if s.gvisor:  # gVisor's /proc and /sys are its own: an existing masked path must be empty
        empty = _path_words(s, "empty")
        obs = {p: ("empty (gVisor's)" if v == "exists" and p in empty else v) for p, v in obs.items()}
    bad = sorted(p for p, v in obs.items() if v == "exists")
    return not bad, obs, f"readable, not masked: {bad}" if bad else ""


def _path_words(s: ProbeSubject, word: str) -> set[str]:
    """The paths the `paths` section marks with `word` (`empty`, `writable`)."""
    return {ln.partition(" ")[2] for ln in s.section("paths") if ln.startswith(word + " ")}


@_probe_rule("probe.readonly_kernel_paths", area="privileges", expected="read-only")
def readonly_kernel_paths(s: ProbeSubject) -> Verdict:
    """`/sys` and Docker's read-only paths (`/proc/sys`, `/proc/sysrq-trigger`, ...) are
    mounted read-only where they exist. Under gVisor `/sys` is mounted read-only too;
    the /proc paths are gVisor's own settings (not the host's) and must not be writable
    by the candidate.

    Writable, they are the host kernel's settings.
    """
    top, exists = s.mounted()
    obs: dict[str, str | None] = {}
    bad: list[str] = []
    writable = _path_words(s, "writable") if s.gvisor else set()
    for p in ("/sys", *READONLY_PATHS):
        if p in top:
            obs[p] = "ro" if "ro" in top[p]["options"] else "rw"
        else:
            obs[p] = exists.get(p, "exists" if p == "/sys" else None)
        if obs[p] is None:
            raise KeyError("paths")
        if s.gvisor and obs[p] == "exists" and p != "/sys":  # gVisor's own knobs, not the host's
            obs[p] = "writable (gVisor's)" if p in writable else "not writable (gVisor's)"
            if p in writable:
                bad.append(p)
            continue
        if obs[p] in ("rw", "exists") or (p in ("/sys", "/proc/sys") and obs[p] != "ro"):
            bad.append(p)
    return not bad, obs, f"writable kernel paths: {bad}" if bad else ""


@_probe_rule("probe.cgroupns_private", area="namespaces", expected=["/"])
def cgroupns_private(s: ProbeSubject) -> Verdict:
    """Every line of `/proc/self/cgroup` has the path `/` (under gVisor, which shows no
    cgroup tree, the file may be empty).

    In a private cgroup namespace the sandbox is its own root; any other path shows
    the host's tree.
    """
    paths = sorted({ln.split(":", 2)[2] for ln in s.section("cgroup") if ln.count(":") >= 2})
    if s.gvisor and not paths:
        return True, paths, "gVisor's kernel shows no cgroup tree"
    return paths == ["/"], paths, "" if paths == ["/"] else "cgroup paths show the host's tree"


def _kernel_known(s: ProbeSubject) -> bool:
    return "kernel" in s.sections or s.gvisor


@_probe_rule("probe.kernel", area="namespaces",
             expected=lambda s: "gVisor's kernel" if s.gvisor else "the host's kernel",
             when=_kernel_known,
             when_doc="under runsc, or when the output has the `kernel` section (older evidence has none)")
def kernel(s: ProbeSubject) -> Verdict:
    """The kernel the candidate's system calls reach is the runtime's: under runc the
    host's (a Linux `/proc/version`, the harness's own when the engine is local), under
    runsc gVisor's (its constant `/proc/version`, not the host's, and no `NoNewPrivs`
    line in `/proc/self/status`).

    A sandbox that should be behind gVisor but runs on the host's kernel is one kernel
    bug away from the host; the inspect's `HostConfig.Runtime` is the engine's word,
    this is the sandbox's.
    """
    version = " ".join(s.section("kernel")).strip()
    host = " ".join(s.sections.get("host_kernel", [])).strip()
    gvisor = GVISOR_VERSION in version and "NoNewPrivs" not in s.status() and version != host
    obs = {"kernel": "gVisor's" if gvisor else "a Linux kernel's", "version": version,
           "same_as_harness": (version == host) if host else None}
    if s.gvisor:
        return gvisor, obs, "" if gvisor else "the sandbox does not run on gVisor's kernel"
    return not gvisor, obs, "" if not gvisor else "the sandbox runs on gVisor's kernel, the policy says runc"


# -- resources --------------------------------------------------------------------
def _limits_readable(s: ProbeSubject) -> bool:
    """Under gVisor the limits are read on the host, by the harness beside the probe
    exec: the end-of-turn kill's exec (after) has no such reading."""
    return not (s.gvisor and s.moment == "after")


_LIMITS_WHEN = ("under runsc, before and running only: the limits are then the host's cgroup on the whole "
                "sandbox, read by the harness beside the probe exec (the end-of-turn exec after has none; "
                "`capture.identical` shows a limit changed since)")


@_probe_rule("probe.cgroup_pids", area="resources", expected=lambda s: str(s.policy.pids_limit),
             when=_limits_readable, when_doc=_LIMITS_WHEN)
def cgroup_pids(s: ProbeSubject) -> Verdict:
    """The cgroup's `pids.max` is the policy's limit (under gVisor, the host's cgroup of
    the sandbox, which also counts gVisor's own threads). At least as strict: a lower
    limit passes and is reported; `max` fails.

    The limit the kernel enforces, not the one the engine recorded.
    """
    v = s.limits()["pids.max"]
    if not v.isdigit():
        return False, v, "pids unlimited" if v == "max" else f"unreadable pids.max {v!r}"
    ok, detail = limit_fits(s.fit, int(v), s.policy.pids_limit, what="pids.max")
    return ok, v, detail


def _memory_fits(s: ProbeSubject, name: str, observed: Any, asked: int) -> tuple[bool, str]:
    """A cgroup memory value is the asked one (page-rounded), or at least as strict: lower."""
    if page_rounded(observed, asked):
        return True, ""
    try:
        got = int(str(observed).strip())
    except (TypeError, ValueError):
        return False, f"{name} is {observed!r}, planned {asked}"
    return limit_fits(s.fit, got, asked, what=name)


@_probe_rule("probe.cgroup_memory", area="resources", expected=lambda s: s.policy.memory_bytes,
             when=_limits_readable, when_doc=_LIMITS_WHEN)
def cgroup_memory(s: ProbeSubject) -> Verdict:
    """The cgroup's memory limit is the policy's (page-rounded), and so is its swap limit
    (v1: memory plus swap; v2: swap alone) when the kernel accounts swap. At least as
    strict: lower limits pass and are reported.

    Swap on top of the memory limit is memory the policy did not grant.
    """
    lim = s.limits()
    policy = s.policy
    if "memory.limit_in_bytes" in lim:  # cgroup v1
        mem_key, swap_key = "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
        swap_asked = policy.memory_swap_bytes
    else:  # cgroup v2 limits swap alone, v1 and Docker memory plus swap
        mem_key, swap_key = "memory.max", "memory.swap.max"
        swap_asked = policy.memory_swap_bytes - policy.memory_bytes
        if lim.get(mem_key) is None:
            raise KeyError(mem_key)
    obs = {k: lim.get(k) for k in (mem_key, swap_key)}
    ok, detail = _memory_fits(s, mem_key, obs[mem_key], policy.memory_bytes)
    if obs[swap_key] is None:
        return ok, obs, detail or "swap accounting is off in this kernel: the swap limit is unseen"
    swap_ok, swap_detail = _memory_fits(s, swap_key, obs[swap_key], swap_asked)
    details = [d for d in (detail, swap_detail) if d]
    joined = "; ".join(details)
    if ok and swap_ok:
        return True, obs, Stricter(joined) if joined else ""
    return False, obs, joined


@_probe_rule("probe.cgroup_cpu", area="resources", expected=lambda s: s.policy.cpus,
             when=_limits_readable, when_doc=_LIMITS_WHEN)
def cgroup_cpu(s: ProbeSubject) -> Verdict:
    """The cgroup's CPU quota over its period (v1 `cpu.cfs_*`, v2 `cpu.max`) is the
    policy's CPUs; no quota is a failure. At least as strict: fewer CPUs pass and are
    reported.

    The limit the kernel enforces, not the one the engine recorded.
    """
    lim = s.limits()
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
    ok, detail = limit_fits(s.fit, value, s.policy.cpus, what="cpus", tolerance=1e-3)
    return ok, {"quota": quota, "period": period, "cpus": value}, detail


# -- write tests -----------------------------------------------------------------
def _writes_are(s: ProbeSubject, paths: tuple[str, ...], want: str, skip_absent: bool = False) -> Verdict:
    w = s.writes()
    obs = {}
    for p in paths:
        if p not in w:
            raise KeyError(f"write test of {p}")
        obs[p] = w[p]
    bad = {p: v for p, v in obs.items() if v != want and not (skip_absent and v == "absent")}
    return not bad, obs, f"unexpected write results: {bad}" if bad else ""


@_probe_rule("probe.write_root_fails", area="filesystem", expected="fail")
def write_root_fails(s: ProbeSubject) -> Verdict:
    """Creating a file fails in `/`, `/var/tmp` and `$HOME` (unless it is a planned
    mount); a path absent from the image is skipped.

    A real write test of the read-only root filesystem, as the candidate user.
    """
    w = s.writes()
    planned = (s.input_dir, s.workspace_dir, *s.tmpfs, *runtime_writable_mounts(s.policy))
    extra = tuple(p for p in w if p not in _ROOTFS_WRITE_PATHS and p not in planned)
    return _writes_are(s, _ROOTFS_WRITE_PATHS + extra, "fail", skip_absent=True)


@_probe_rule("probe.write_input_fails", area="filesystem", expected="fail")
def write_input_fails(s: ProbeSubject) -> Verdict:
    """Creating a file in the public package fails.

    The input is read-only to the candidate, even where its files are the candidate's own uid.
    """
    return _writes_are(s, (s.input_dir,), "fail")


@_probe_rule("probe.write_workspace_ok", area="filesystem", expected="ok", moments=("before", "running"))
def write_workspace_ok(s: ProbeSubject) -> Verdict:
    """Creating a file in the workspace succeeds.

    Not judged after the agent: the candidate may legitimately make it fail (chmod its
    own workspace); that the mount is writable is then read from the mount table.
    """
    return _writes_are(s, (s.workspace_dir,), "ok")


@_probe_rule("probe.write_tmp_ok", area="filesystem", expected="ok", moments=("before", "running"))
def write_tmp_ok(s: ProbeSubject) -> Verdict:
    """Creating a file in each planned tmpfs succeeds.

    Not judged after the agent, who may have filled its /tmp; the mount table still is.
    """
    return _writes_are(s, s.tmpfs, "ok")


# -- sockets and processes (the desktop's neighbours) -------------------------------
def _has_desktop_sections(s: ProbeSubject) -> bool:
    return "sockets" in s.sections or "processes" in s.sections


_DESKTOP_WHEN = "when the output has the sockets and processes sections (older evidence has neither)"


_LOOPBACK = ("0100007F:", "00000000000000000000000001000000:")


def _control_listeners(s: ProbeSubject) -> set[str]:
    """The listeners of a cua control server (the ``control_server`` section the
    harness read just before the probes, ``ale.sandbox.cua.sandbox``) held by a process
    with exactly the candidate's rights: its uid and gid, no capability (effective,
    permitted, ambient), no-new-privileges; a TCP one only on the loopback. Such a
    server is no way up: the candidate could run it itself. Keys as the rules spell
    them: ``tcp ADDRESS`` and unix paths."""
    if "control_server" not in s.sections:
        return set()
    ok = set()
    for ln in s.sections["control_server"]:
        f = ln.split()
        if len(f) != 9 or f[0] not in ("tcp", "tcp6", "udp", "udp6", "unix"):
            continue
        kind, addr, _pid, uid, gid, eff, prm, amb, nnp = f
        try:
            rights = int(uid) == s.policy.uid and int(gid) == s.policy.gid \
                and not any(int(c, 16) for c in (eff, prm, amb))
        except ValueError:
            continue
        if not rights or nnp != "1" or kind.startswith("udp"):
            continue
        if kind == "unix":
            ok.add(addr)
        elif addr.startswith(_LOOPBACK):
            ok.add(f"{kind} {addr}")
    return ok


@_probe_rule("probe.no_inet_listeners", area="processes", expected=[],
             when=_has_desktop_sections, when_doc=_DESKTOP_WHEN)
def no_inet_listeners(s: ProbeSubject) -> Verdict:
    """Nothing listens on TCP (state `0A`) and no UDP socket is bound.

    A listener in the sandbox (a desktop's VNC, a debugger) is a way in for the candidate;
    a cua control server's on the loopback, held with exactly the candidate's rights,
    is not (``_control_listeners``).
    """
    bad = []
    for ln in s.section("sockets"):
        f = ln.split()
        if f and f[0] in ("tcp", "tcp6") and len(f) >= 3 and f[2] == "0A" \
                or f and f[0] in ("udp", "udp6") and len(f) >= 3:
            bad.append(f"{f[0]} {f[1]}")
    bad = [b for b in bad if b not in _control_listeners(s)]
    return not bad, bad, f"listening: {bad}" if bad else ""


@_probe_rule("probe.unix_listeners_private", area="processes", expected="none the candidate can reach",
             when=_has_desktop_sections, when_doc=_DESKTOP_WHEN)
def unix_listeners_private(s: ProbeSubject) -> Verdict:
    """No listening unix socket is abstract or at a path the candidate may write.

    The desktop user's sockets (the X server, the browser's control pipe) must be out
    of the candidate's reach; a cua control server's (its X server), held with exactly
    the candidate's rights, may be in it (``_control_listeners``).
    """
    listeners, bad = [], []
    control = _control_listeners(s)
    for ln in s.section("sockets"):
        f = ln.split()
        if not f or f[0] != "unix" or len(f) < 5:
            continue
        path, writable = f[3], f[4] == "w"
        listeners.append({"path": path, "candidate_may_connect": writable or path.startswith("@"),
                          **({"control_server": True} if path in control else {})})
        if (path.startswith("@") or writable) and path not in control:
            bad.append(path)
    return not bad, listeners, f"the candidate can reach: {bad}" if bad else ""


@_probe_rule("probe.process_owners", area="processes", expected=lambda s: f"uid {s.policy.uid} or {DESKTOP_UID}",
             when=_has_desktop_sections, when_doc=_DESKTOP_WHEN)
def process_owners(s: ProbeSubject) -> Verdict:
    """Every process in the sandbox belongs to the candidate or the desktop user.

    A process of another user (root, the host's, with a shared PID namespace) is
    something the seal did not plan.
    """
    _me, procs = s.processes()
    allowed = {s.policy.uid, DESKTOP_UID} | ({PROBE_UID} if s.moment == "after" else set())
    by_uid: dict[str, int] = {}
    for uid_, _pp, _n in procs.values():
        by_uid[str(uid_)] = by_uid.get(str(uid_), 0) + 1
    bad = sorted({f"{pid}:{u}:{n}" for pid, (u, _pp, n) in procs.items() if u not in allowed})
    return not bad, by_uid, f"processes of other users: {bad}" if bad else ""


@_probe_rule("probe.no_candidate_process_left", area="processes", expected=[], moments=("after",),
             when=_has_desktop_sections, when_doc=_DESKTOP_WHEN)
def no_candidate_process_left(s: ProbeSubject) -> Verdict:
    """After the end-of-turn kill, no candidate process is left but init and the probe
    itself (and its exec's wrappers).

    The reference may be staged only once every candidate process is dead.
    """
    me, procs = s.processes()
    mine = {1, me}
    p = me
    while p in procs and procs[p][1] not in (0, p):  # the probe's own ancestors (the exec's wrapper)
        p = procs[p][1]
        mine.add(p)
    left = sorted(f"{pid}:{n}" for pid, (u, _pp, n) in procs.items() if u == s.policy.uid and pid not in mine)
    return not left, left, f"candidate processes alive after the kill: {left}" if left else ""
