"""The rules read from `docker inspect`: ISOLATION.md's inspect table, one rule per row.

The rules read the inspect document the engine returned, never the flags ale
passed: a recipe is not evidence. A key a rule needs that is missing makes its
check *unknown* (fail closed). They take plain dicts and never call the engine,
so the same rules run at run time and later in `ale verify` over the stored JSON.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ale.isolation.registry import (
    CAPTURES,
    INSPECT,
    Fit,
    Missing,
    Moment,
    Stricter,
    Verdict,
    limit_fits,
    rule,
)
from ale.redaction import is_secret_name
from ale.sandbox.base import Mount
from ale.sandbox.policy import IsolationPolicy

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


@dataclass(frozen=True)
class InspectSubject:
    """One inspect capture at one moment, with what the run planned."""

    moment: Moment
    inspect: Any  # the document as the engine returned it (not always a dict)
    policy: IsolationPolicy
    mounts: tuple[Mount, ...] = ()  # the planned binds: public package ro, workspace rw
    image_inspect: dict | None = None  # the image's inspect, when it was read
    mount_inodes: dict[str, int] | None = None  # the bind sources' inodes, on the run's host
    fit: Fit = "exact"  # as planned, or at least as strict (`registry.Fit`)


@dataclass(frozen=True)
class CaptureSubject:
    """The two inspect captures: at create and after exit."""

    moment: Moment
    before: Any
    after: Any


# -- document access -----------------------------------------------------------
_ABSENT = object()


def _get(doc: Any, path: str, default: Any = _ABSENT) -> Any:
    """The value at a dotted path; a missing key raises Missing (unknown) unless defaulted."""
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            if default is not _ABSENT:
                return default
            raise Missing(path)
        cur = cur[part]
    return cur


def _hc(s: InspectSubject, key: str, default: Any = _ABSENT) -> Any:
    return _get(s.inspect, f"HostConfig.{key}", default)


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


def looks_like_credential(name: str) -> bool:
    """A variable name that carries a secret (the one rule, ``redaction.is_secret_name``)
    or a route out of the sandbox (a proxy)."""
    return is_secret_name(name) or name.upper().endswith("_PROXY")


def _is_document(s: InspectSubject) -> bool:
    return isinstance(s.inspect, dict)


def _inspect_rule(check_id: str, *, area: str, expected: Any = None, **kw: Any) -> Callable[..., Any]:
    """An inspect rule; it reads a document, so it applies only to one (see `inspect.document`)."""
    return rule(check_id, source=INSPECT, area=area, expected=expected, when=kw.pop("when", _is_document), **kw)


def _flag(s: InspectSubject, key: str, want: Any) -> Verdict:
    """`HostConfig.<key>` is exactly `want` (``is`` for booleans)."""
    value = _hc(s, key)
    return (value is want if isinstance(want, bool) else value == want), value, ""


# -- the document ----------------------------------------------------------------
@_inspect_rule("inspect.document", area="document", expected="a JSON object",
               when=lambda s: not _is_document(s), when_doc="when the capture is not a JSON object")
def inspect_document(s: InspectSubject) -> Verdict:
    """The capture is a JSON object; when it is not, no other inspect rule can read it.

    A failed inspect or a corrupt evidence file is unknown, and unknown is invalid.
    """
    return None, type(s.inspect).__name__, "inspect document is not a JSON object"


# -- privileges ------------------------------------------------------------------
@_inspect_rule("priv.not_privileged", area="privileges", expected=False)
def not_privileged(s: InspectSubject) -> Verdict:
    """`HostConfig.Privileged` is false.

    A privileged container has every capability, every device and no confinement.
    """
    return _flag(s, "Privileged", False)


@_inspect_rule("caps.drop_all", area="privileges", expected="ALL")
def cap_drop_all(s: InspectSubject) -> Verdict:
    """`HostConfig.CapDrop` contains ALL (case and `CAP_` prefix normalised), or every
    default capability by name; Podman's style needs an empty `BoundingCaps` too.

    Capabilities are root's powers split up; the candidate needs none of them.
    """
    drop = _caps(_hc(s, "CapDrop"))
    if "ALL" in drop:
        return True, drop, ""
    if "BoundingCaps" in s.inspect:  # Podman lists the dropped caps and the bounding set
        bounding = _caps(s.inspect["BoundingCaps"])
        ok = not bounding and bool(drop)
        return ok, drop, f"Podman-style caps; BoundingCaps={bounding}"
    missing = sorted(DOCKER_DEFAULT_CAPS - set(drop))
    if not missing:
        return True, drop, "every default capability is dropped by name"
    return False, drop, f"CapDrop lacks ALL; default capabilities kept: {missing}"


@_inspect_rule("caps.add_empty", area="privileges", expected=[])
def cap_add_empty(s: InspectSubject) -> Verdict:
    """`HostConfig.CapAdd` is empty, and the policy adds no capability.

    An added capability (NET_RAW, SYS_ADMIN, ...) reopens what CapDrop closed.
    """
    added = _caps(_hc(s, "CapAdd"))
    planned = _caps(list(s.policy.cap_add))
    if planned:
        return False, added, f"the policy adds capabilities {planned}; none may be added"
    return not added, added, f"capabilities added: {added}" if added else ""


@_inspect_rule("sec.no_new_privileges", area="privileges", expected="no-new-privileges")
def no_new_privileges(s: InspectSubject) -> Verdict:
    """`HostConfig.SecurityOpt` has `no-new-privileges` (bare, `:true` or `=true`), and
    nothing turns it off.

    Without it a setuid binary in the image gives the candidate back what was dropped.
    """
    opts = _hc(s, "SecurityOpt") or []
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


@_inspect_rule("sec.no_unconfined", area="privileges", expected="no unconfined/disable options")
def no_unconfined(s: InspectSubject) -> Verdict:
    """No `seccomp`, `apparmor` or `systempaths` `unconfined`, no `label=disable`, and the
    AppArmor profile is not `unconfined`.

    Each turns off a layer of confinement the engine applies by default (the engine
    itself adds `label=disable` to a privileged container or one sharing a host namespace).
    """
    opts = _hc(s, "SecurityOpt") or []
    bad = []
    for o in opts:
        norm = str(o).strip().lower().replace("=", ":")
        key, _, val = norm.partition(":")
        off = (val == "unconfined" and key in ("seccomp", "apparmor", "systempaths")) or (
            key == "label" and val in ("disable", "type:unconfined_t"))
        if off:
            bad.append(o)
    if str(s.inspect.get("AppArmorProfile", "")).lower() == "unconfined":
        bad.append("AppArmorProfile=unconfined")
    return not bad, opts, f"confinement turned off: {bad}" if bad else ""


@_inspect_rule("sec.masked_paths", area="privileges", expected="non-empty MaskedPaths and ReadonlyPaths")
def masked_paths(s: InspectSubject) -> Verdict:
    """`HostConfig.MaskedPaths` and `HostConfig.ReadonlyPaths` are non-empty.

    They hide and freeze the kernel's knobs under /proc and /sys; the engine empties
    them for a privileged container or with `systempaths=unconfined`.
    """
    mp = _hc(s, "MaskedPaths")
    rp = _hc(s, "ReadonlyPaths")
    obs = {"MaskedPaths": mp, "ReadonlyPaths": rp}
    empty = [k for k, v in obs.items() if _empty(v)]
    return not empty, obs, f"empty: {empty}" if empty else ""


# -- filesystem ------------------------------------------------------------------
@_inspect_rule("fs.readonly_rootfs", area="filesystem", expected=True)
def readonly_rootfs(s: InspectSubject) -> Verdict:
    """`HostConfig.ReadonlyRootfs` is true.

    The candidate's writes land only in the workspace and the planned tmpfs, where
    they are seen and extracted; nothing hides in the image's layers.
    """
    return _flag(s, "ReadonlyRootfs", True)


def _top(s: InspectSubject) -> list[dict]:
    mounts = _get(s.inspect, "Mounts")
    if mounts is None:
        return []
    if not isinstance(mounts, list):
        raise TypeError(f"Mounts is {type(mounts).__name__}")
    return mounts


def _by_target(s: InspectSubject, target: str) -> dict | None:
    hits = [m for m in _top(s) if m.get("Destination") == target]
    return hits[0] if len(hits) == 1 else None


def _planned_mounts(s: InspectSubject) -> list[dict]:
    return [{"target": m.target, "source": m.source, "read_only": m.read_only} for m in s.mounts]


@_inspect_rule("mounts.exactly_two", area="filesystem", expected=_planned_mounts)
def mounts_exactly_planned(s: InspectSubject) -> Verdict:
    """The top-level `Mounts` are exactly the planned ones (the public package and the
    workspace), at the planned destinations.

    Any other mount (an extra bind, an image VOLUME, the engine's socket) is a way in
    or out that the run did not plan.
    """
    ms = _top(s)
    dests = sorted(str(m.get("Destination")) for m in ms)
    planned = sorted(m.target for m in s.mounts)
    ok = len(ms) == len(s.mounts) and dests == planned
    summary = [{k: m.get(k) for k in ("Type", "Source", "Destination", "RW", "Propagation")} for m in ms]
    return ok, summary, "" if ok else (
        f"{len(ms)} mounts at {dests}; planned {len(s.mounts)} at {planned}")


@_inspect_rule("mounts.only_binds", area="filesystem", expected="bind")
def mounts_only_binds(s: InspectSubject) -> Verdict:
    """Every mount, in `Mounts` and in `HostConfig.Mounts`, is a bind.

    A volume (an image's VOLUME becomes one silently) is writable storage outside the
    workspace, and it outlives the container.
    """
    kinds = [m.get("Type") for m in _top(s)]
    for m in _hc(s, "Mounts", None) or []:
        kinds.append(m.get("Type"))
    bad = sorted({str(k) for k in kinds if k != "bind"})
    return not bad, kinds, f"non-bind mount types: {bad}" if bad else ""


def _access(s: InspectSubject, read_only: bool) -> Verdict:
    obs: dict[str, Any] = {}
    bad: list[str] = []
    for m in s.mounts:
        if m.read_only != read_only:
            continue
        got = _by_target(s, m.target)
        if got is None:
            obs[m.target] = None
            bad.append(f"{m.target} not mounted (or mounted twice)")
            continue
        rw = got.get("RW")
        if rw is None:
            raise Missing(f"Mounts[{m.target}].RW")
        obs[m.target] = {"Type": got.get("Type"), "RW": rw}
        if got.get("Type") != "bind" or rw is not (not read_only):
            bad.append(f"{m.target} is {got.get('Type')} RW={rw}")
    return not bad, obs, "; ".join(bad)


@_inspect_rule("mounts.input_ro", area="filesystem", expected="RW false")
def mounts_input_ro(s: InspectSubject) -> Verdict:
    """The public package (every planned read-only mount) is a bind with `RW` false.

    The candidate must not change its own input: the input is hashed before and after.
    """
    return _access(s, True)


@_inspect_rule("mounts.workspace_rw", area="filesystem", expected="RW true")
def mounts_workspace_rw(s: InspectSubject) -> Verdict:
    """The workspace (every planned read-write mount) is a bind with `RW` true.

    It is where the deliverables are written, and the one writable folder that is kept.
    """
    return _access(s, False)


def _planned_sources(s: InspectSubject) -> dict[str, str]:
    return {m.target: _realpath(m.source) for m in s.mounts}


@_inspect_rule("mounts.sources", area="filesystem", expected=_planned_sources)
def mounts_sources(s: InspectSubject) -> Verdict:
    """Each planned mount's `Source` is the realpath of the folder this run created, and
    (on the run's host, when recorded) the same inode.

    A bind of another folder at the right place (the reference, another run's
    workspace, a folder replaced after creation) would otherwise pass.
    """
    obs, bad = {}, []
    for m in s.mounts:
        got = _by_target(s, m.target)
        if got is None:
            bad.append(f"{m.target} not mounted")
            continue
        src = got.get("Source")
        if not isinstance(src, str):
            raise Missing(f"Mounts[{m.target}].Source")
        entry: dict[str, Any] = {"source": src, "realpath": _realpath(src)}
        if _realpath(src) != _realpath(m.source):
            bad.append(f"{m.target} from {src}, planned {_realpath(m.source)}")
        if s.mount_inodes is not None:
            planned = s.mount_inodes.get(m.source, s.mount_inodes.get(_realpath(m.source)))
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


@_inspect_rule("mounts.propagation", area="filesystem", expected="rprivate")
def mounts_propagation(s: InspectSubject) -> Verdict:
    """Every bind's `Propagation` is `rprivate`.

    With shared propagation, a mount made on the host later (a reference unpacked
    under a bound folder) would appear inside the sandbox.
    """
    binds = [m for m in _top(s) if m.get("Type") == "bind"]
    obs = {str(m.get("Destination")): _get(m, "Propagation") for m in binds}
    bad = {k: v for k, v in obs.items() if v != "rprivate"}
    return not bad, obs, f"not rprivate: {bad}" if bad else ""


@_inspect_rule("mounts.no_docker_socket", area="filesystem", expected="no /run, /var/run or *.sock")
def mounts_no_socket(s: InspectSubject) -> Verdict:
    """No mount (effective or requested, source or destination) is under `/run` or
    `/var/run` or ends in `.sock`.

    The engine's socket is root on the host; other sockets there reach host services.
    """
    paths: list[str] = []
    for m in _top(s):
        paths += [str(m.get("Source") or ""), str(m.get("Destination") or "")]
    for b in _hc(s, "Binds") or []:
        src, dst, _ = _parse_bind(str(b))
        paths += [src, dst]
    for m in _hc(s, "Mounts", None) or []:
        paths += [str(m.get("Source") or ""), str(m.get("Target") or "")]
    bad = sorted({p for p in paths if p.startswith("/") and _is_socket_path(p)})
    return not bad, bad, f"socket or /run paths mounted: {bad}" if bad else ""


@_inspect_rule("mounts.binds_agree", area="filesystem", expected="requested binds == effective binds")
def mounts_binds_agree(s: InspectSubject) -> Verdict:
    """The binds requested (`HostConfig.Binds` and `HostConfig.Mounts`) are the effective
    ones (`Mounts`): same sources, destinations and read-only flags.

    A disagreement means the engine did something other than what was asked, and the
    effective state is the one the sandbox lives in.
    """
    requested = set()
    for b in _hc(s, "Binds") or []:
        src, dst, ro = _parse_bind(str(b))
        if src.startswith("/"):
            requested.add((_realpath(src), dst, ro))
    for m in _hc(s, "Mounts", None) or []:
        if m.get("Type") == "bind":
            requested.add((_realpath(_get(m, "Source")), _get(m, "Target"), bool(m.get("ReadOnly", False))))
    effective = {
        (_realpath(_get(m, "Source")), _get(m, "Destination"), not _get(m, "RW"))
        for m in _top(s) if m.get("Type") == "bind"
    }
    ok = requested == effective
    obs = {"requested": sorted(map(list, requested)), "effective": sorted(map(list, effective))}
    return ok, obs, "" if ok else "Binds/HostConfig.Mounts differ from the effective Mounts"


@_inspect_rule("mounts.no_volumes_from", area="filesystem")
def mounts_no_volumes_from(s: InspectSubject) -> Verdict:
    """`HostConfig.VolumesFrom` is empty.

    It mounts every volume of another container, unplanned and unchecked.
    """
    return _empty(_hc(s, "VolumesFrom")), _hc(s, "VolumesFrom"), ""


def _planned_tmpfs(s: InspectSubject) -> dict[str, str]:
    return {t.path: t.options for t in s.policy.tmpfs}


# What the engine mounts every `--tmpfs` with unless its options say otherwise
# (measured, Docker 20.10 and Podman: `rw,size=1g` mounts rw,nosuid,nodev,noexec).
TMPFS_ENGINE_DEFAULTS = {"rw": "rw", "exec": "noexec", "suid": "nosuid", "dev": "nodev"}
# Each flag: (the looser word, the stricter word).
_TMPFS_FLAGS = {"rw": ("rw", "ro"), "exec": ("exec", "noexec"), "suid": ("suid", "nosuid"), "dev": ("dev", "nodev")}
_TMPFS_SIZES = ("size", "nr_inodes")  # caps: lower is stricter, none is the kernel's (half the RAM)


def tmpfs_effective(options: str) -> dict[str, str]:
    """The options a tmpfs is mounted with: the engine's defaults, then the given
    options in order (a later one wins, as with mount(8)), by what each sets."""
    eff = dict(TMPFS_ENGINE_DEFAULTS)
    for opt in (o.strip() for o in str(options).split(",")):
        if not opt:
            continue
        key, eq, value = opt.partition("=")
        flag = next((f for f, words in _TMPFS_FLAGS.items() if opt in words), None)
        if flag is not None:
            eff[flag] = opt
        else:
            eff[key] = value if eq else opt
    return eff


def _tmpfs_cap(value: str) -> int | None:
    """A size= or nr_inodes= value (k, m, g suffixes); None: relative (%) or unreadable."""
    m = re.fullmatch(r"(\d+)([kmg]?)", value.strip().lower())
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)] if m else None


def _tmpfs_entry(fit: Fit, path: str, got: dict[str, str], want: dict[str, str]) -> tuple[list[str], list[str]]:
    """How one tmpfs differs from the planned one: (looser or unordered, stricter)."""
    bad: list[str] = []
    tighter: list[str] = []
    for key in sorted(set(got) | set(want)):
        g, w = got.get(key), want.get(key)
        if g == w:
            continue
        if key == "rw":
            # Read-only where rw is planned is no seal gained: the planned writable /tmp
            # is what the probes' write test and the candidate's tools need.
            bad.append(f"{path} is {g}, planned {w}")
        elif key in _TMPFS_FLAGS:
            if g == _TMPFS_FLAGS[key][1]:
                tighter.append(f"{path} {g} where {w} is planned")
            else:
                bad.append(f"{path} {g} where {w} is planned")
        elif key in _TMPFS_SIZES:
            gc = _tmpfs_cap(g) if g is not None else None
            wc = _tmpfs_cap(w) if w is not None else None
            if g is None:
                bad.append(f"{path} has no {key}= (the kernel's default, half the RAM), planned {key}={w}")
            elif gc is None or (w is not None and wc is None):
                bad.append(f"{path} {key}={g}, planned {key}={w}: not comparable")
            elif wc is None or gc < wc:  # any cap is tighter than none (the pages count against memory too)
                tighter.append(f"{path} {key}={g} where {key}={w} is planned")
            else:
                bad.append(f"{path} {key}={g} above the planned {w}")
        else:  # mode, uid, gid, atime ...: no order, as planned
            bad.append(f"{path} {key}={g}, planned {w}")
    if fit == "exact" and tighter:
        bad += [f"{t} (a run's own sandbox is the one planned)" for t in tighter]
        tighter = []
    return bad, tighter


@_inspect_rule("fs.tmpfs", area="filesystem", expected=_planned_tmpfs)
def tmpfs_planned(s: InspectSubject) -> Verdict:
    """`HostConfig.Tmpfs` has exactly the policy's tmpfs paths, each mounted with the
    planned options (read with the engine's defaults: `noexec`, `nosuid`, `nodev`
    unless an option says otherwise). At least as strict (`ale verify-container`):
    `noexec`, `nosuid`, `nodev` where the plan allows more, and a smaller `size=` or
    `nr_inodes=`, pass and are reported; read-only, no size cap, another `mode`, or a
    path more or less, fail.

    A tmpfs is writable memory: an unplanned one (or one without its size cap or
    `nosuid`) is storage the policy did not grant; a planned one missing or read-only
    takes the candidate's /tmp away, which is no seal gained.
    """
    obs = _hc(s, "Tmpfs") or {}
    if not isinstance(obs, dict):
        raise TypeError(f"Tmpfs is {type(obs).__name__}, not a map")
    want = _planned_tmpfs(s)
    bad: list[str] = []
    tighter: list[str] = []
    for path in sorted(set(obs) - set(want)):
        bad.append(f"{path}: an unplanned tmpfs")
    for path in sorted(set(want) - set(obs)):
        bad.append(f"{path}: the planned tmpfs is missing")
    for path in sorted(set(want) & set(obs)):
        b, t = _tmpfs_entry(s.fit, path, tmpfs_effective(obs[path]), tmpfs_effective(want[path]))
        bad += b
        tighter += t
    if bad:
        return False, obs, f"Tmpfs differs from the planned {want}: " + "; ".join(bad)
    return True, obs, Stricter("; ".join(tighter)) if tighter else ""


# -- image -----------------------------------------------------------------------
@_inspect_rule("image.no_volumes", area="image")
def image_no_volumes(s: InspectSubject) -> Verdict:
    """`Config.Volumes` is empty in the container, and in the image when its inspect is at hand.

    An image `VOLUME` silently becomes an extra writable mount.
    """
    obs: dict[str, Any] = {"container": _get(s.inspect, "Config.Volumes")}
    if s.image_inspect is not None:
        obs["image"] = _get(s.image_inspect, "Config.Volumes", None)
    bad = [k for k, v in obs.items() if not _empty(v)]
    return not bad, obs, f"declared volumes in {bad}" if bad else ""


@_inspect_rule("image.id_matches", area="image", expected="container .Image == image Id",
               when=lambda s: _is_document(s) and s.image_inspect is not None,
               when_doc="when the image's inspect is at hand")
def image_id_matches(s: InspectSubject) -> Verdict:
    """The container's `.Image` is the `Id` of the image inspected for the evidence.

    The image record (id, digests, store) must describe the image that really ran.
    """
    container, image = _get(s.inspect, "Image"), _get(s.image_inspect, "Id")
    return container == image, {"container": container, "image": image}, ""


# -- network ---------------------------------------------------------------------
@_inspect_rule("net.mode_none", area="network", expected="none")
def net_mode_none(s: InspectSubject) -> Verdict:
    """`HostConfig.NetworkMode` is `none`.

    The run is offline: no interface but loopback, no route anywhere.
    """
    return _flag(s, "NetworkMode", "none")


@_inspect_rule("net.networks_none", area="network", expected=["none"])
def net_networks_none(s: InspectSubject) -> Verdict:
    """`NetworkSettings.Networks` has exactly one key, `none`.

    A network connected after create shows here, not in NetworkMode.
    """
    keys = sorted(_get(s.inspect, "NetworkSettings.Networks") or {})
    return keys == ["none"], keys, ""


@_inspect_rule("net.no_ports", area="network", expected="no port bindings, PublishAllPorts false")
def net_no_ports(s: InspectSubject) -> Verdict:
    """No `PortBindings`, `PublishAllPorts` false, no `NetworkSettings.Ports`.

    A published port is a way in from the host's network.
    """
    obs = {
        "PortBindings": _hc(s, "PortBindings"),
        "PublishAllPorts": _hc(s, "PublishAllPorts"),
        "Ports": _get(s.inspect, "NetworkSettings.Ports", None),
    }
    ok = _empty(obs["PortBindings"]) and obs["PublishAllPorts"] is False and _empty(obs["Ports"])
    return ok, obs, ""


@_inspect_rule("net.no_extra_hosts_links_dns", area="network", expected="empty")
def net_no_hosts_links_dns(s: InspectSubject) -> Verdict:
    """No `ExtraHosts`, `Links`, `Dns`, `DnsSearch` or `DnsOptions`.

    Each names a way to reach something; an offline sandbox names none.
    """
    obs = {k: _hc(s, k) for k in ("ExtraHosts", "Links", "Dns")}
    for k in ("DnsSearch", "DnsOptions"):
        obs[k] = _hc(s, k, None)
    bad = [k for k, v in obs.items() if not _empty(v)]
    return not bad, obs, f"set: {bad}" if bad else ""


# -- namespaces ------------------------------------------------------------------
def _namespace_rule(check_id: str, key: str, what: str) -> None:
    def verdict(s: InspectSubject) -> Verdict:
        value = _hc(s, key)
        return value == "", value, ""

    verdict.__name__ = f"ns_{key.lower()}_private"
    verdict.__doc__ = (f"`HostConfig.{key}` is empty: the container has its own {what} namespace.\n\n"
                       f"Joining the host's (or another container's) {what} namespace shares it with them.")
    _inspect_rule(check_id, area="namespaces", expected="")(verdict)


_namespace_rule("ns.pid", "PidMode", "PID")
_namespace_rule("ns.uts", "UTSMode", "UTS")
_namespace_rule("ns.userns", "UsernsMode", "user")


@_inspect_rule("ns.ipc", area="namespaces", expected=lambda s: s.policy.ipc_mode)
def ns_ipc(s: InspectSubject) -> Verdict:
    """`HostConfig.IpcMode` is the policy's (`private`, or `none`). At least as strict:
    `none` (no /dev/shm at all) where `private` is planned passes and is reported.

    `shareable` lets another container join it; `host` shares the host's shared memory.
    """
    mode = _hc(s, "IpcMode")
    planned = s.policy.ipc_mode
    if mode == planned:
        return True, mode, ""
    if mode == "none" and planned == "private":
        if s.fit == "at_least":
            return True, mode, Stricter("IpcMode none (no /dev/shm) where private is planned")
        return False, mode, "IpcMode none, planned private (a run's own sandbox is the one planned)"
    return False, mode, f"IpcMode {mode!r}, planned {planned!r}"


@_inspect_rule("ns.cgroupns", area="namespaces", expected=lambda s: s.policy.cgroupns_mode)
def ns_cgroupns(s: InspectSubject) -> Verdict:
    """`HostConfig.CgroupnsMode` is the policy's (`private`).

    Docker 20.10 on cgroup v1 defaults to `host`, which shows the host's cgroup tree.
    """
    return _flag(s, "CgroupnsMode", s.policy.cgroupns_mode)


@_inspect_rule("ns.cgroup_parent", area="namespaces", expected="")
def ns_cgroup_parent(s: InspectSubject) -> Verdict:
    """`HostConfig.CgroupParent` is empty.

    Another parent may carry other (or no) limits than the engine's default.
    """
    return _flag(s, "CgroupParent", "")


# -- resources -------------------------------------------------------------------
@_inspect_rule("mem.limit", area="resources", expected=lambda s: s.policy.memory_bytes)
def mem_limit(s: InspectSubject) -> Verdict:
    """`HostConfig.Memory` is the policy's memory limit (0 is unlimited: a failure). At
    least as strict: a lower limit passes and is reported.

    Runs are compared under the same resources, and the host must survive a candidate.
    """
    value = _hc(s, "Memory")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return False, value, "no memory limit"
    ok, detail = limit_fits(s.fit, value, s.policy.memory_bytes, what="memory", show=_bytes)
    return ok, value, detail


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{int(n // size)} {unit}"
    return f"{int(n)} bytes"


@_inspect_rule("mem.swap_eq_mem", area="resources", expected=lambda s: s.policy.memory_swap_bytes)
def mem_swap(s: InspectSubject) -> Verdict:
    """`HostConfig.MemorySwap` equals `Memory` and the policy's value (no swap on top).
    At least as strict: equal to a lower `Memory` passes and is reported; swap on top
    of `Memory` always fails.

    Docker defaults MemorySwap to twice Memory; -1 is unlimited swap.
    """
    mem, sw = _hc(s, "Memory"), _hc(s, "MemorySwap")
    obs = {"Memory": mem, "MemorySwap": sw}
    if not (isinstance(sw, int) and sw > 0 and sw == mem):
        return False, obs, "MemorySwap must equal Memory"
    ok, detail = limit_fits(s.fit, sw, s.policy.memory_swap_bytes, what="MemorySwap", show=_bytes)
    return ok, obs, detail


@_inspect_rule("mem.oom_kill_enabled", area="resources", expected=False)
def mem_oom_kill(s: InspectSubject) -> Verdict:
    """`HostConfig.OomKillDisable` is false or null (the default).

    With the OOM killer disabled, a candidate at its limit hangs instead of dying.
    """
    # OomKillDisable is a nullable bool: null is the default, the OOM killer enabled.
    value = _hc(s, "OomKillDisable")
    return value in (False, None), value, ""


@_inspect_rule("cpu.limit", area="resources", expected=lambda s: s.policy.cpus)
def cpu_limit(s: InspectSubject) -> Verdict:
    """The CPU limit (`NanoCpus/1e9`, or `CpuQuota/CpuPeriod`) is the policy's; none is a
    failure. At least as strict: fewer CPUs pass and are reported.

    Runs are compared under the same resources.
    """
    nano = _hc(s, "NanoCpus") or 0
    quota = _hc(s, "CpuQuota") or 0
    period = _hc(s, "CpuPeriod") or 0
    obs = {"NanoCpus": nano, "CpuQuota": quota, "CpuPeriod": period}
    if nano > 0:
        value = nano / 1e9
    elif quota > 0:
        # A zero period is the kernel's default of 100ms.
        value = quota / (period or 100_000)
    else:
        return False, obs, "no CPU limit (NanoCpus and CpuQuota unset)"
    ok, detail = limit_fits(s.fit, value, s.policy.cpus, what="cpus", tolerance=1e-6)
    return ok, obs, detail or f"cpus={value:g}"


@_inspect_rule("pids.limit", area="resources", expected=lambda s: s.policy.pids_limit)
def pids_limit(s: InspectSubject) -> Verdict:
    """`HostConfig.PidsLimit` is the policy's (0, -1 and null are unlimited: a failure).
    At least as strict: a lower limit passes and is reported.

    A fork bomb must stop at the sandbox's edge.
    """
    v = _hc(s, "PidsLimit")
    if v is None or v <= 0:
        return False, v, "pids unlimited"
    ok, detail = limit_fits(s.fit, v, s.policy.pids_limit, what="pids")
    return ok, v, detail


@_inspect_rule("dev.none", area="resources", expected="empty")
def dev_none(s: InspectSubject) -> Verdict:
    """No `Devices`, `DeviceRequests` or `DeviceCgroupRules`.

    A device (fuse, a GPU, a disk) is a door to the host's kernel or hardware.
    """
    obs = {k: _hc(s, k) for k in ("Devices", "DeviceRequests", "DeviceCgroupRules")}
    bad = [k for k, v in obs.items() if not _empty(v)]
    return not bad, obs, f"set: {bad}" if bad else ""


@_inspect_rule("dev.sysctls", area="resources", expected=lambda s: s.policy.sysctls)
def dev_sysctls(s: InspectSubject) -> Verdict:
    """`HostConfig.Sysctls` is exactly the policy's (Docker omits an empty map, so
    absence is none): `kernel.shm_rmid_forced` 1, and `kernel.shmmax` and
    `kernel.shmall` within the memory budget. At least as strict: lower SysV limits
    pass and are reported.

    SysV shared memory is counted by no tmpfs size and outlives its owner unless the
    kernel removes it; any other namespaced setting changes what the sandbox's network
    or IPC allow.
    """
    hc = _get(s.inspect, "HostConfig")
    value = hc.get("Sysctls") if isinstance(hc, dict) else None
    got = {} if _empty(value) else value
    if not isinstance(got, dict):
        raise TypeError(f"HostConfig.Sysctls is {type(got).__name__}, not a map")
    want = s.policy.sysctls
    got = {str(k): str(v) for k, v in got.items()}
    if got == want:
        return True, value, ""
    lower = [k for k in ("kernel.shmmax", "kernel.shmall") if k in want and k in got and got[k] != want[k]]
    if s.fit == "at_least" and set(got) == set(want) and all(got[k] == want[k] for k in want if k not in lower) \
            and all(got[k].isdigit() and int(got[k]) < int(want[k]) for k in lower):
        return True, value, Stricter(f"lower SysV limits: {', '.join(f'{k}={got[k]}' for k in lower)}")
    extra = sorted(set(got) - set(want))
    missing = sorted(set(want) - set(got))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    parts = [f"{label}: {keys}"
             for label, keys in (("not planned", extra), ("missing", missing), ("differing", differ)) if keys]
    return False, value, "; ".join(parts)


@_inspect_rule("limits.ulimits", area="resources", expected=lambda s: {k: list(v) for k, v in s.policy.ulimits.items()})
def limits_ulimits(s: InspectSubject) -> Verdict:
    """`HostConfig.Ulimits` holds the policy's limits (`core` 0, soft and hard), each
    at most as planned.

    A core dump writes a candidate process's memory to a file; a hard limit of 0 is
    one the candidate cannot raise (no `CAP_SYS_RESOURCE`).
    """
    hc = _get(s.inspect, "HostConfig")
    value = hc.get("Ulimits") if isinstance(hc, dict) else None
    items = [] if _empty(value) else value
    if not isinstance(items, list):
        raise TypeError(f"HostConfig.Ulimits is {type(items).__name__}, not a list")
    got: dict[str, tuple[Any, Any]] = {}
    for u in items:
        if not isinstance(u, dict):
            raise TypeError(f"a ulimit is {type(u).__name__}, not a map")
        got[str(u.get("Name"))] = (u.get("Soft"), u.get("Hard"))
    problems = []
    for name, (soft, hard) in s.policy.ulimits.items():
        have = got.get(name)
        if have is None:
            problems.append(f"{name}: not set (the engine's default)")
        elif not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= w
                     for v, w in zip(have, (soft, hard), strict=True)):
            problems.append(f"{name}: soft {have[0]}, hard {have[1]}, planned at most {soft}/{hard}")
    return not problems, value, "; ".join(problems)


# -- identity --------------------------------------------------------------------
@_inspect_rule("id.user", area="identity", expected=lambda s: s.policy.user)
def id_user(s: InspectSubject) -> Verdict:
    """`Config.User` is exactly the policy's numeric `uid:gid`.

    A name resolves through the image's /etc/passwd, which the image controls; root is root.
    """
    user = _get(s.inspect, "Config.User")
    return user == s.policy.user, user, ""


@_inspect_rule("env.allowlisted", area="identity", expected=lambda s: list(s.policy.env_allowlist))
def env_allowlisted(s: InspectSubject) -> Verdict:
    """Every `Config.Env` name is on the policy's allowlist, and none looks like a
    credential or a route out (`*KEY*`, `*TOKEN*`, cloud prefixes, `*_PROXY`, `DOCKER_HOST`).

    Only names are observed: values may be secrets and must not spread into the evidence.
    """
    env = _get(s.inspect, "Config.Env")
    if env is None:
        env = []
    if not isinstance(env, list):
        raise TypeError(f"Config.Env is {type(env).__name__}, not a list")
    names = [str(e).split("=", 1)[0] for e in env]
    allowed = set(s.policy.env_allowlist)
    unlisted = sorted({n for n in names if n not in allowed})
    credential = sorted({n for n in names if looks_like_credential(n)})
    problems = []
    if unlisted:
        problems.append(f"not allowlisted: {unlisted}")
    if credential:
        problems.append(f"credential-like: {credential}")
    return not problems, names, "; ".join(problems)


@_inspect_rule("runtime", area="identity", expected=lambda s: s.policy.runtime)
def runtime(s: InspectSubject) -> Verdict:
    """`HostConfig.Runtime` is the policy's (`runc`, or `runsc` for gVisor).

    The runtime decides what the kernel inside reports and enforces; the evidence names it.
    """
    return _flag(s, "Runtime", s.policy.runtime)


@_inspect_rule("restart.no", area="identity", expected="no")
def restart_no(s: InspectSubject) -> Verdict:
    """`HostConfig.RestartPolicy` is `no` (or empty), with no retry count.

    A restarted container runs candidate code again after the harness saw it stop.
    """
    rp = _hc(s, "RestartPolicy")
    name = _hc(s, "RestartPolicy.Name")
    ok = name in ("", "no") and not rp.get("MaximumRetryCount")
    return ok, rp, ""


@_inspect_rule("autoremove.false", area="identity", expected=False)
def autoremove_false(s: InspectSubject) -> Verdict:
    """`HostConfig.AutoRemove` is false (never `--rm`).

    The container must still be there to inspect after it exits.
    """
    return _flag(s, "AutoRemove", False)


@_inspect_rule("log.capped", area="identity", expected=lambda s: s.policy.log_max_size)
def log_capped(s: InspectSubject) -> Verdict:
    """The log driver is `none`, or its `max-size` is at most the policy's (a smaller one
    is reported).

    An uncapped log lets a candidate fill the host's disk.
    """
    lc = _hc(s, "LogConfig")
    kind = _hc(s, "LogConfig.Type")
    if kind == "none":
        return True, lc, "logging disabled"
    size = (lc.get("Config") or {}).get("max-size")
    if size is None:
        return False, lc, f"log driver {kind!r} has no max-size"
    got, planned = parse_size(size), parse_size(s.policy.log_max_size)
    if got > planned:
        return False, lc, f"max-size {size} above the planned {s.policy.log_max_size}"
    # A smaller log has always passed, in a run's own sandbox too: the cap is a ceiling.
    return True, lc, Stricter(f"max-size {size}, below the planned {s.policy.log_max_size}") if got < planned else ""


# -- state -----------------------------------------------------------------------
STATE_EXPECTED: dict[Moment, dict[str, Any]] = {
    "before": {"Status": "created", "StartedAt": ZERO_TIME},
    "running": {"Status": "running", "RestartCount": 0},
    "after": {"Status": "exited", "RestartCount": 0},
}


@_inspect_rule("state.{moment}", area="state", expected=lambda s: STATE_EXPECTED[s.moment])
def state_at_moment(s: InspectSubject) -> Verdict:
    """The container's state fits the moment: before, `created` with a zero `StartedAt`;
    running, `running`; after, `exited`; never restarted. Exit code, OOM kill and times
    are recorded.

    A container started before the checks ran, or restarted, ran code nobody judged.
    """
    status = _get(s.inspect, "State.Status")
    obs = {"Status": status, "StartedAt": _get(s.inspect, "State.StartedAt")}
    if s.moment == "before":
        ok = status == "created" and obs["StartedAt"] == ZERO_TIME
        return ok, obs, "" if ok else "the container must be created and never started"
    restarts = _get(s.inspect, "RestartCount")
    obs.update(RestartCount=restarts, ExitCode=_get(s.inspect, "State.ExitCode"),
               OOMKilled=_get(s.inspect, "State.OOMKilled"),
               FinishedAt=_get(s.inspect, "State.FinishedAt"))
    want = "running" if s.moment == "running" else "exited"
    ok = status == want and restarts == 0
    return ok, obs, "" if ok else f"expected status {want} with no restart"


# -- the two captures --------------------------------------------------------------
CAPTURED_SECTIONS = ("Config", "HostConfig", "Mounts")


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


@rule("capture.identical", source=CAPTURES, area="captures", expected=list(CAPTURED_SECTIONS),
      moments=("after",))
def captures_identical(s: CaptureSubject) -> Verdict:
    """`Config`, `HostConfig` and `Mounts` are identical in the capture at create and the
    one after exit (the order of `Mounts` aside).

    The configuration judged before the agent ran must be the one it ran under: a
    container updated in between (`docker update`, a network connected) shows here.
    """
    missing = [f"{name}.{sec}" for name, doc in (("before", s.before), ("after", s.after))
               for sec in CAPTURED_SECTIONS if not isinstance(doc, dict) or sec not in doc]
    if missing:
        raise Missing(", ".join(missing))
    differing: list[str] = []
    for sec in CAPTURED_SECTIONS:
        a, b = s.before[sec], s.after[sec]
        if sec == "Mounts":
            # The engine lists Mounts from a map: the order is not part of the state.
            a, b = _sorted_mounts(a), _sorted_mounts(b)
        differing += _diff_keys(a, b, sec)
    return not differing, differing, f"differing keys: {differing}" if differing else ""
