"""Checks of a container's effective state, read from `docker inspect`.

Every rule of the table in ISOLATION.md is one `Check` with a stable dotted id.
The checks read the inspect document the engine returned, never the flags ale
passed: a recipe is not evidence. A key the rule needs that is missing makes the
check *unknown* (``ok=None``), and unknown counts as a failure (fail closed).

The same functions run at run time (before and after the agent) and later in
`ale verify` over the stored raw JSON, so they take plain dicts and never call
the engine.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from ale.sandbox.base import Mount
from ale.sandbox.policy import IsolationPolicy

Phase = Literal["before", "running", "after"]

# Docker's zero time: a container that never started carries it in StartedAt.
ZERO_TIME = "0001-01-01T00:00:00Z"

# Docker's default capability set: dropping all of them explicitly is the same
# as `--cap-drop ALL` (what Podman records instead of ALL).
DOCKER_DEFAULT_CAPS = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip

# Environment names that carry credentials or redirect traffic, whatever the allowlist says.
_CREDENTIAL_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|AUTH", re.IGNORECASE)
_CREDENTIAL_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "GCP_", "GCLOUD_", "HF_", "HUGGING")
_FORBIDDEN_NAMES = frozenset({"DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "HF_TOKEN"})


@dataclass
class Check:
    """One verified aspect of the container. ``ok=None`` means unknown: a failure."""

    id: str
    ok: bool | None
    expected: Any
    observed: Any
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        # Shallow on purpose: the values are JSON data read from inspect or probes,
        # and dataclasses.asdict's deep copy is the costliest step of a run's checks.
        return {"id": self.id, "ok": self.ok, "expected": self.expected, "observed": self.observed, "detail": self.detail}

    @property
    def passed(self) -> bool:
        return self.ok is True


def failures(checks: Iterable[Check]) -> list[Check]:
    """Checks that did not pass (failed or unknown)."""
    return [c for c in checks if c.ok is not True]


def violation_lines(checks: Iterable[Check]) -> list[str]:
    """One human line per failed or unknown check."""
    out = []
    for c in failures(checks):
        word = "unknown" if c.ok is None else "failed"
        msg = c.detail or f"expected {c.expected!r}, observed {c.observed!r}"
        out.append(f"{c.id} {word}: {msg}")
    return out


# -- document access -----------------------------------------------------------
class _Missing(Exception):
    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


_ABSENT = object()


def _ns_empty(inspect: Any, path: str) -> tuple[bool, Any, str]:
    value = _get(inspect, path)
    return value == "", value, ""


def _get(doc: Any, path: str, default: Any = _ABSENT) -> Any:
    """The value at a dotted path; a missing key raises _Missing (unknown) unless defaulted."""
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            if default is not _ABSENT:
                return default
            raise _Missing(path)
        cur = cur[part]
    return cur


def _run(check_id: str, expected: Any, fn: Callable[[], tuple[bool, Any, str]]) -> Check:
    """Evaluate one rule; a missing field or a value of the wrong shape is unknown."""
    try:
        ok, observed, detail = fn()
    except _Missing as e:
        return Check(check_id, None, expected, None, f"missing field {e.path}")
    except (TypeError, ValueError, AttributeError) as e:
        return Check(check_id, None, expected, None, f"unparsable value: {type(e).__name__}: {e}")
    return Check(check_id, bool(ok), expected, observed, detail)


def _empty(v: Any) -> bool:
    """Docker writes an unset list/map as null or as an empty container."""
    return v is None or (isinstance(v, list | dict | tuple | str) and len(v) == 0)


def normalize_cap(cap: str) -> str:
    c = str(cap).strip().upper()
    return c[4:] if c.startswith("CAP_") else c


def _caps(v: Any) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise TypeError(f"capability list is {type(v).__name__}, not a list")
    return sorted({normalize_cap(c) for c in v})


def _realpath(p: str) -> str:
    return os.path.realpath(p)


def _opts(s: str) -> frozenset[str]:
    return frozenset(o.strip() for o in s.split(",") if o.strip())


_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(s: str) -> int:
    """Docker's log `max-size` syntax (10m, 512k, 1g, bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgb]?)b?\s*", str(s).lower())
    if not m:
        raise ValueError(f"not a size: {s!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def _is_socket_path(p: str) -> bool:
    for q in {p, _realpath(p)}:
        q = q.rstrip("/") or "/"
        if q.endswith(".sock"):
            return True
        for root in ("/run", "/var/run"):
            if q == root or q.startswith(root + "/"):
                return True
    return False


def _parse_bind(spec: str) -> tuple[str, str, bool]:
    """`src:dst[:opts]` from HostConfig.Binds → (source, target, read_only)."""
    parts = spec.split(":")
    if len(parts) < 2:
        raise ValueError(f"bind {spec!r} has no destination")
    src, dst = parts[0], parts[1]
    opts = set(parts[2].split(",")) if len(parts) > 2 else set()
    return src, dst, "ro" in opts


# -- the checks ----------------------------------------------------------------
def check_inspect(
    inspect: dict,
    policy: IsolationPolicy,
    expected_mounts: list[Mount],
    *,
    phase: Phase,
    image_inspect: dict | None = None,
    mount_inodes: dict[str, int] | None = None,
) -> list[Check]:
    """Every rule of ISOLATION.md's inspect table, as one Check each."""
    if not isinstance(inspect, dict):
        return [Check("inspect.document", None, "a JSON object", type(inspect).__name__,
                      "inspect document is not a JSON object")]
    hc = "HostConfig"
    checks: list[Check] = []
    add = checks.append

    # privileges ---------------------------------------------------------------
    add(_run("priv.not_privileged", False, lambda: (
        _get(inspect, f"{hc}.Privileged") is False, _get(inspect, f"{hc}.Privileged"), "")))

    def cap_drop() -> tuple[bool, Any, str]:
        drop = _caps(_get(inspect, f"{hc}.CapDrop"))
        if "ALL" in drop:
            return True, drop, ""
        if "BoundingCaps" in inspect:  # Podman lists the dropped caps and the bounding set
            bounding = _caps(inspect["BoundingCaps"])
            ok = not bounding and bool(drop)
            return ok, drop, f"Podman-style caps; BoundingCaps={bounding}"
        missing = sorted(DOCKER_DEFAULT_CAPS - set(drop))
        if not missing:
            return True, drop, "every default capability is dropped by name"
        return False, drop, f"CapDrop lacks ALL; default capabilities kept: {missing}"

    add(_run("caps.drop_all", "ALL", cap_drop))

    def cap_add() -> tuple[bool, Any, str]:
        added = _caps(_get(inspect, f"{hc}.CapAdd"))
        planned = _caps(list(policy.cap_add))
        if planned:
            return False, added, f"the policy adds capabilities {planned}; none may be added"
        return not added, added, f"capabilities added: {added}" if added else ""

    add(_run("caps.add_empty", [], cap_add))

    def nnp() -> tuple[bool, Any, str]:
        opts = _get(inspect, f"{hc}.SecurityOpt") or []
        on = off = False
        for o in opts:
            norm = str(o).strip().lower().replace("=", ":")
            if norm in ("no-new-privileges", "no-new-privileges:true"):
                on = True
            elif norm.startswith("no-new-privileges:"):
                off = True
        if off:
            return False, opts, "SecurityOpt turns no-new-privileges off"
        return on, opts, "" if on else "SecurityOpt lacks no-new-privileges"

    add(_run("sec.no_new_privileges", "no-new-privileges", nnp))

    def unconfined() -> tuple[bool, Any, str]:
        opts = _get(inspect, f"{hc}.SecurityOpt") or []
        bad = []
        for o in opts:
            norm = str(o).strip().lower().replace("=", ":")
            key, _, val = norm.partition(":")
            off = (val == "unconfined" and key in ("seccomp", "apparmor", "systempaths")) or (
                key == "label" and val in ("disable", "type:unconfined_t"))
            if off:
                bad.append(o)
        if str(inspect.get("AppArmorProfile", "")).lower() == "unconfined":
            bad.append("AppArmorProfile=unconfined")
        return not bad, opts, f"confinement turned off: {bad}" if bad else ""

    add(_run("sec.no_unconfined", "no unconfined/disable options", unconfined))

    def masked() -> tuple[bool, Any, str]:
        mp = _get(inspect, f"{hc}.MaskedPaths")
        rp = _get(inspect, f"{hc}.ReadonlyPaths")
        obs = {"MaskedPaths": mp, "ReadonlyPaths": rp}
        empty = [k for k, v in obs.items() if _empty(v)]
        return not empty, obs, f"empty: {empty}" if empty else ""

    add(_run("sec.masked_paths", "non-empty MaskedPaths and ReadonlyPaths", masked))

    # filesystem ---------------------------------------------------------------
    add(_run("fs.readonly_rootfs", True, lambda: (
        _get(inspect, f"{hc}.ReadonlyRootfs") is True, _get(inspect, f"{hc}.ReadonlyRootfs"), "")))
    checks.extend(_mount_checks(inspect, expected_mounts, mount_inodes))

    def tmpfs() -> tuple[bool, Any, str]:
        obs = _get(inspect, f"{hc}.Tmpfs") or {}
        want = {t.path: t.options for t in policy.tmpfs}
        ok = set(obs) == set(want) and all(_opts(obs[k]) == _opts(want[k]) for k in want)
        return ok, obs, "" if ok else f"Tmpfs differs from the planned {want}"

    add(_run("fs.tmpfs", {t.path: t.options for t in policy.tmpfs}, tmpfs))

    def volumes() -> tuple[bool, Any, str]:
        obs: dict[str, Any] = {"container": _get(inspect, "Config.Volumes")}
        if image_inspect is not None:
            obs["image"] = _get(image_inspect, "Config.Volumes", None)
        bad = [k for k, v in obs.items() if not _empty(v)]
        return not bad, obs, f"declared volumes in {bad}" if bad else ""

    add(_run("image.no_volumes", None, volumes))
    if image_inspect is not None:
        add(_run("image.id_matches", "container .Image == image Id", lambda: (
            _get(inspect, "Image") == _get(image_inspect, "Id"),
            {"container": _get(inspect, "Image"), "image": _get(image_inspect, "Id")}, "")))

    # network ------------------------------------------------------------------
    add(_run("net.mode_none", "none", lambda: (
        _get(inspect, f"{hc}.NetworkMode") == "none", _get(inspect, f"{hc}.NetworkMode"), "")))

    def networks() -> tuple[bool, Any, str]:
        nets = _get(inspect, "NetworkSettings.Networks") or {}
        keys = sorted(nets)
        return keys == ["none"], keys, ""

    add(_run("net.networks_none", ["none"], networks))

    def ports() -> tuple[bool, Any, str]:
        obs = {
            "PortBindings": _get(inspect, f"{hc}.PortBindings"),
            "PublishAllPorts": _get(inspect, f"{hc}.PublishAllPorts"),
            "Ports": _get(inspect, "NetworkSettings.Ports", None),
        }
        ok = _empty(obs["PortBindings"]) and obs["PublishAllPorts"] is False and _empty(obs["Ports"])
        return ok, obs, ""

    add(_run("net.no_ports", "no port bindings, PublishAllPorts false", ports))

    def hosts() -> tuple[bool, Any, str]:
        obs = {k: _get(inspect, f"{hc}.{k}") for k in ("ExtraHosts", "Links", "Dns")}
        for k in ("DnsSearch", "DnsOptions"):
            obs[k] = _get(inspect, f"{hc}.{k}", None)
        bad = [k for k, v in obs.items() if not _empty(v)]
        return not bad, obs, f"set: {bad}" if bad else ""

    add(_run("net.no_extra_hosts_links_dns", "empty", hosts))

    # namespaces ---------------------------------------------------------------
    for cid, key in (("ns.pid", "PidMode"), ("ns.uts", "UTSMode"), ("ns.userns", "UsernsMode")):
        add(_run(cid, "", partial(_ns_empty, inspect, f"{hc}.{key}")))
    add(_run("ns.ipc", "private or none", lambda: (
        _get(inspect, f"{hc}.IpcMode") in ("private", "none"), _get(inspect, f"{hc}.IpcMode"), "")))
    add(_run("ns.cgroupns", policy.cgroupns_mode, lambda: (
        _get(inspect, f"{hc}.CgroupnsMode") == policy.cgroupns_mode,
        _get(inspect, f"{hc}.CgroupnsMode"), "")))
    add(_run("ns.cgroup_parent", "", lambda: (
        _get(inspect, f"{hc}.CgroupParent") == "", _get(inspect, f"{hc}.CgroupParent"), "")))

    # resources ----------------------------------------------------------------
    add(_run("mem.limit", policy.memory_bytes, lambda: (
        _get(inspect, f"{hc}.Memory") == policy.memory_bytes, _get(inspect, f"{hc}.Memory"), "")))

    def swap() -> tuple[bool, Any, str]:
        mem, sw = _get(inspect, f"{hc}.Memory"), _get(inspect, f"{hc}.MemorySwap")
        ok = sw == mem == policy.memory_swap_bytes and isinstance(sw, int) and sw > 0
        return ok, {"Memory": mem, "MemorySwap": sw}, "" if ok else "MemorySwap must equal Memory"

    add(_run("mem.swap_eq_mem", policy.memory_swap_bytes, swap))
    # OomKillDisable is a nullable bool: null is the default, the OOM killer enabled.
    add(_run("mem.oom_kill_enabled", False, lambda: (
        _get(inspect, f"{hc}.OomKillDisable") in (False, None),
        _get(inspect, f"{hc}.OomKillDisable"), "")))

    def cpus() -> tuple[bool, Any, str]:
        nano = _get(inspect, f"{hc}.NanoCpus") or 0
        quota = _get(inspect, f"{hc}.CpuQuota") or 0
        period = _get(inspect, f"{hc}.CpuPeriod") or 0
        obs = {"NanoCpus": nano, "CpuQuota": quota, "CpuPeriod": period}
        if nano > 0:
            value = nano / 1e9
        elif quota > 0:
            # A zero period is the kernel's default of 100ms.
            value = quota / (period or 100_000)
        else:
            return False, obs, "no CPU limit (NanoCpus and CpuQuota unset)"
        ok = abs(value - policy.cpus) < 1e-6
        return ok, obs, f"cpus={value:g}" + ("" if ok else f", planned {policy.cpus:g}")

    add(_run("cpu.limit", policy.cpus, cpus))

    def pids() -> tuple[bool, Any, str]:
        v = _get(inspect, f"{hc}.PidsLimit")
        if v is None or v <= 0:
            return False, v, "pids unlimited"
        return v == policy.pids_limit, v, ""

    add(_run("pids.limit", policy.pids_limit, pids))

    def devices() -> tuple[bool, Any, str]:
        obs = {k: _get(inspect, f"{hc}.{k}") for k in ("Devices", "DeviceRequests", "DeviceCgroupRules")}
        bad = [k for k, v in obs.items() if not _empty(v)]
        return not bad, obs, f"set: {bad}" if bad else ""

    add(_run("dev.none", "empty", devices))
    # Docker omits an empty Sysctls map (omitempty), so absence is "none".
    add(_run("dev.no_sysctls", "empty", lambda: (
        _empty(_get(inspect, f"{hc}.Sysctls", None)), _get(inspect, f"{hc}.Sysctls", None), "")))

    # identity -----------------------------------------------------------------
    add(_run("id.user", policy.user, lambda: (
        _get(inspect, "Config.User") == policy.user, _get(inspect, "Config.User"), "")))
    add(_run("env.allowlisted", list(policy.env_allowlist),
             lambda: _env_check(_get(inspect, "Config.Env"), policy)))
    add(_run("runtime", policy.runtime, lambda: (
        _get(inspect, f"{hc}.Runtime") == policy.runtime, _get(inspect, f"{hc}.Runtime"), "")))

    def restart() -> tuple[bool, Any, str]:
        rp = _get(inspect, f"{hc}.RestartPolicy")
        name = _get(inspect, f"{hc}.RestartPolicy.Name")
        ok = name in ("", "no") and not rp.get("MaximumRetryCount")
        return ok, rp, ""

    add(_run("restart.no", "no", restart))
    add(_run("autoremove.false", False, lambda: (
        _get(inspect, f"{hc}.AutoRemove") is False, _get(inspect, f"{hc}.AutoRemove"), "")))

    def log() -> tuple[bool, Any, str]:
        lc = _get(inspect, f"{hc}.LogConfig")
        kind = _get(inspect, f"{hc}.LogConfig.Type")
        if kind == "none":
            return True, lc, "logging disabled"
        size = (lc.get("Config") or {}).get("max-size")
        if size is None:
            return False, lc, f"log driver {kind!r} has no max-size"
        ok = parse_size(size) <= parse_size(policy.log_max_size)
        return ok, lc, "" if ok else f"max-size {size} above the planned {policy.log_max_size}"

    add(_run("log.capped", policy.log_max_size, log))

    # state --------------------------------------------------------------------
    checks.append(_state_check(inspect, phase))
    return checks


def _env_check(env: Any, policy: IsolationPolicy) -> tuple[bool, Any, str]:
    """Names only are observed: values may be secrets and must not spread further."""
    if env is None:
        env = []
    if not isinstance(env, list):
        raise TypeError(f"Config.Env is {type(env).__name__}, not a list")
    names = [str(e).split("=", 1)[0] for e in env]
    allowed = set(policy.env_allowlist)
    unlisted = sorted({n for n in names if n not in allowed})
    credential = sorted({n for n in names if looks_like_credential(n)})
    problems = []
    if unlisted:
        problems.append(f"not allowlisted: {unlisted}")
    if credential:
        problems.append(f"credential-like: {credential}")
    return not problems, names, "; ".join(problems)


def looks_like_credential(name: str) -> bool:
    """A variable name that carries a secret or a route out (proxies, Docker)."""
    up = name.upper()
    return bool(
        _CREDENTIAL_NAME.search(up)
        or up.startswith(_CREDENTIAL_PREFIXES)
        or up.endswith("_PROXY")
        or up in _FORBIDDEN_NAMES
    )


def _state_check(inspect: dict, phase: Phase) -> Check:
    cid = f"state.{phase}"

    def fn() -> tuple[bool, Any, str]:
        status = _get(inspect, "State.Status")
        obs = {"Status": status, "StartedAt": _get(inspect, "State.StartedAt")}
        if phase == "before":
            ok = status == "created" and obs["StartedAt"] == ZERO_TIME
            return ok, obs, "" if ok else "the container must be created and never started"
        restarts = _get(inspect, "RestartCount")
        obs.update(RestartCount=restarts, ExitCode=_get(inspect, "State.ExitCode"),
                   OOMKilled=_get(inspect, "State.OOMKilled"),
                   FinishedAt=_get(inspect, "State.FinishedAt"))
        want = "running" if phase == "running" else "exited"
        ok = status == want and restarts == 0
        return ok, obs, "" if ok else f"expected status {want} with no restart"

    expected = {
        "before": {"Status": "created", "StartedAt": ZERO_TIME},
        "running": {"Status": "running", "RestartCount": 0},
        "after": {"Status": "exited", "RestartCount": 0},
    }[phase]
    return _run(cid, expected, fn)


def _mount_checks(
    inspect: dict, expected: list[Mount], mount_inodes: dict[str, int] | None
) -> list[Check]:
    checks: list[Check] = []
    add = checks.append
    want = [{"target": m.target, "source": m.source, "read_only": m.read_only} for m in expected]

    def top() -> list[dict]:
        mounts = _get(inspect, "Mounts")
        if mounts is None:
            return []
        if not isinstance(mounts, list):
            raise TypeError(f"Mounts is {type(mounts).__name__}")
        return mounts

    def summary(ms: list[dict]) -> list[dict]:
        return [{k: m.get(k) for k in ("Type", "Source", "Destination", "RW", "Propagation")}
                for m in ms]

    def exactly() -> tuple[bool, Any, str]:
        ms = top()
        dests = sorted(str(m.get("Destination")) for m in ms)
        ok = len(ms) == len(expected) and dests == sorted(m.target for m in expected)
        return ok, summary(ms), "" if ok else (
            f"{len(ms)} mounts at {dests}; planned {len(expected)} at "
            f"{sorted(m.target for m in expected)}")

    add(_run("mounts.exactly_two", want, exactly))

    def only_binds() -> tuple[bool, Any, str]:
        kinds = [m.get("Type") for m in top()]
        for m in _get(inspect, "HostConfig.Mounts", None) or []:
            kinds.append(m.get("Type"))
        bad = sorted({str(k) for k in kinds if k != "bind"})
        return not bad, kinds, f"non-bind mount types: {bad}" if bad else ""

    add(_run("mounts.only_binds", "bind", only_binds))

    def by_target(target: str) -> dict | None:
        hits = [m for m in top() if m.get("Destination") == target]
        return hits[0] if len(hits) == 1 else None

    def access(read_only: bool) -> Callable[[], tuple[bool, Any, str]]:
        def fn() -> tuple[bool, Any, str]:
            obs: dict[str, Any] = {}
            bad: list[str] = []
            for m in expected:
                if m.read_only != read_only:
                    continue
                got = by_target(m.target)
                if got is None:
                    obs[m.target] = None
                    bad.append(f"{m.target} not mounted (or mounted twice)")
                    continue
                rw = got.get("RW")
                if rw is None:
                    raise _Missing(f"Mounts[{m.target}].RW")
                obs[m.target] = {"Type": got.get("Type"), "RW": rw}
                if got.get("Type") != "bind" or rw is not (not read_only):
                    bad.append(f"{m.target} is {got.get('Type')} RW={rw}")
            return not bad, obs, "; ".join(bad)

        return fn

    add(_run("mounts.input_ro", "RW false", access(True)))
    add(_run("mounts.workspace_rw", "RW true", access(False)))

    def sources() -> tuple[bool, Any, str]:
        obs, bad = {}, []
        for m in expected:
            got = by_target(m.target)
            if got is None:
                bad.append(f"{m.target} not mounted")
                continue
            src = got.get("Source")
            if not isinstance(src, str):
                raise _Missing(f"Mounts[{m.target}].Source")
            entry: dict[str, Any] = {"source": src, "realpath": _realpath(src)}
            if _realpath(src) != _realpath(m.source):
                bad.append(f"{m.target} from {src}, planned {_realpath(m.source)}")
            if mount_inodes is not None:
                planned = mount_inodes.get(m.source, mount_inodes.get(_realpath(m.source)))
                if planned is None:
                    bad.append(f"no recorded inode for {m.source}")
                elif os.path.exists(src):
                    entry["inode"] = os.stat(src).st_ino
                    entry["planned_inode"] = planned
                    if entry["inode"] != planned:
                        bad.append(f"{src} inode {entry['inode']} != recorded {planned}")
                else:
                    entry["inode"] = "not on this host"
            obs[m.target] = entry
        return not bad, obs, "; ".join(bad)

    add(_run("mounts.sources", {m.target: _realpath(m.source) for m in expected}, sources))

    def propagation() -> tuple[bool, Any, str]:
        binds = [m for m in top() if m.get("Type") == "bind"]
        obs = {str(m.get("Destination")): _get(m, "Propagation") for m in binds}
        bad = {k: v for k, v in obs.items() if v != "rprivate"}
        return not bad, obs, f"not rprivate: {bad}" if bad else ""

    add(_run("mounts.propagation", "rprivate", propagation))

    def socket() -> tuple[bool, Any, str]:
        paths: list[str] = []
        for m in top():
            paths += [str(m.get("Source") or ""), str(m.get("Destination") or "")]
        for b in _get(inspect, "HostConfig.Binds") or []:
            src, dst, _ = _parse_bind(str(b))
            paths += [src, dst]
        for m in _get(inspect, "HostConfig.Mounts", None) or []:
            paths += [str(m.get("Source") or ""), str(m.get("Target") or "")]
        bad = sorted({p for p in paths if p.startswith("/") and _is_socket_path(p)})
        return not bad, bad, f"socket or /run paths mounted: {bad}" if bad else ""

    add(_run("mounts.no_docker_socket", "no /run, /var/run or *.sock", socket))

    def agree() -> tuple[bool, Any, str]:
        requested = set()
        for b in _get(inspect, "HostConfig.Binds") or []:
            src, dst, ro = _parse_bind(str(b))
            if src.startswith("/"):
                requested.add((_realpath(src), dst, ro))
        for m in _get(inspect, "HostConfig.Mounts", None) or []:
            if m.get("Type") == "bind":
                requested.add((_realpath(_get(m, "Source")), _get(m, "Target"),
                               bool(m.get("ReadOnly", False))))
        effective = {
            (_realpath(_get(m, "Source")), _get(m, "Destination"), not _get(m, "RW"))
            for m in top() if m.get("Type") == "bind"
        }
        ok = requested == effective
        obs = {"requested": sorted(map(list, requested)), "effective": sorted(map(list, effective))}
        return ok, obs, "" if ok else "Binds/HostConfig.Mounts differ from the effective Mounts"

    add(_run("mounts.binds_agree", "requested binds == effective binds", agree))
    add(_run("mounts.no_volumes_from", None, lambda: (
        _empty(_get(inspect, "HostConfig.VolumesFrom")), _get(inspect, "HostConfig.VolumesFrom"), "")))
    return checks


# -- the two captures ------------------------------------------------------------
def _diff_keys(a: Any, b: Any, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{prefix}.{k}")
            elif a[k] != b[k]:
                out += _diff_keys(a[k], b[k], f"{prefix}.{k}")
        return out
    return [] if a == b else [prefix]


def _sorted_mounts(mounts: Any) -> Any:
    if not isinstance(mounts, list):
        return mounts
    return sorted(mounts, key=lambda m: json.dumps(m, sort_keys=True, default=str))


def diff_captures(before: dict, after: dict) -> list[Check]:
    """`Config`, `HostConfig` and `Mounts` must be identical in both captures."""
    sections = ("Config", "HostConfig", "Mounts")
    missing = [f"{name}.{s}" for name, doc in (("before", before), ("after", after))
               for s in sections if not isinstance(doc, dict) or s not in doc]
    if missing:
        return [Check("capture.identical", None, list(sections), None,
                      f"missing field {', '.join(missing)}")]
    differing: list[str] = []
    for s in sections:
        a, b = before[s], after[s]
        if s == "Mounts":
            # The engine lists Mounts from a map: the order is not part of the state.
            a, b = _sorted_mounts(a), _sorted_mounts(b)
        differing += _diff_keys(a, b, s)
    return [Check("capture.identical", not differing, list(sections), differing,
                  f"differing keys: {differing}" if differing else "")]


# -- image ---------------------------------------------------------------------
_CONTAINERD_SNAPSHOTTERS = frozenset({"overlayfs", "native", "stargz", "devmapper"})


def image_store(image_inspect: dict, container_inspect: dict | None = None) -> str:
    """`containerd` (snapshotter image store), `graphdriver:<name>`, or `unknown`."""
    if "Descriptor" in image_inspect:
        return "containerd"
    name = None
    for doc in (container_inspect, image_inspect):
        if isinstance(doc, dict):
            name = (doc.get("GraphDriver") or {}).get("Name") or doc.get("Driver") or name
            if name:
                break
    if not name:
        return "unknown"
    return "containerd" if name in _CONTAINERD_SNAPSHOTTERS else f"graphdriver:{name}"


def image_record(image_inspect: dict, container_inspect: dict | None = None) -> dict:
    """What the evidence keeps about the image a container ran."""
    cfg = image_inspect.get("Config") or {}
    return {
        "id": image_inspect.get("Id"),
        "repo_tags": image_inspect.get("RepoTags") or [],
        "repo_digests": image_inspect.get("RepoDigests") or [],
        "created": image_inspect.get("Created"),
        "architecture": image_inspect.get("Architecture"),
        "os": image_inspect.get("Os"),
        "size": image_inspect.get("Size"),
        "layers": (image_inspect.get("RootFS") or {}).get("Layers") or [],
        "labels": cfg.get("Labels") or {},
        "volumes": cfg.get("Volumes") or {},
        "user": cfg.get("User"),
        "store": image_store(image_inspect, container_inspect),
        "container_image": (container_inspect or {}).get("Image"),
    }
