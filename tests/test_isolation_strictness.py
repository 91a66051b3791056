"""At least as strict as planned: each ordered rule, in both directions (no engine needed).

`ale verify-container` judges a container someone else created with fit "at_least":
a field stricter than the policy passes and the check says how (`Check.stricter`);
a looser one fails. A run's own sandbox is judged "exact" (the harness created it
as planned): there the same stricter field fails, so the stricter-passes rule does
not weaken a run's verification. The rules whose field has no order (runtime, user,
the binds, propagation) stay equality in both fits.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ale.isolation.checks import Check, check_inspect, failures
from ale.isolation.inspect_rules import tmpfs_effective
from ale.isolation.probes import parse_probes
from ale.isolation.registry import Fit, stricter_notes
from ale.isolation.rules import judge
from ale.isolation.verify_container import _report, render_report
from ale.sandbox.base import Mount
from ale.sandbox.policy import GIB, MIB, IsolationPolicy, TmpfsMount

FIX = Path(__file__).parent / "fixtures"
# As the fixtures were captured (tests/test_isolation_checks.py): /tmp noexec, 1 GiB, 1 CPU, 256 pids.
POLICY = IsolationPolicy(memory_bytes=1 * GIB, cpus=1, tmpfs=(TmpfsMount(options="rw,nosuid,nodev,size=1g"),))
MOUNTS = [Mount("/tmp/ale-fixture/input", "/input", True), Mount("/tmp/ale-fixture/workspace", "/workspace", False)]


def good() -> dict:
    return json.loads((FIX / "inspect_good.json").read_text())


def judged(doc: dict, policy: IsolationPolicy, fit: Fit) -> list[Check]:
    return judge("before", policy=policy, mounts=MOUNTS, inspect=doc, fit=fit)


def failing(checks: list[Check]) -> set[str]:
    return {c.id for c in failures(checks)}


def hc(**values: Any) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        d["HostConfig"].update(values)
    return f


def tmpfs(options: dict[str, str]) -> Callable[[dict], None]:
    return hc(Tmpfs=options)


def plan(**update: Any) -> IsolationPolicy:
    return POLICY.model_copy(update=update)


EXEC_TMP = plan(tmpfs=(TmpfsMount(),))  # the repo's default: rw,exec,nosuid,nodev,size=1g

# name, change, policy, the check that is stricter, a word its note says
STRICTER: list[tuple[str, Callable[[dict], None], IsolationPolicy, str, str]] = [
    ("tmpfs noexec where exec is planned (the seed's template)", tmpfs({"/tmp": "rw,nosuid,nodev,size=1g"}),
     EXEC_TMP, "fs.tmpfs", "noexec where exec"),
    ("tmpfs explicit noexec", tmpfs({"/tmp": "rw,noexec,nosuid,nodev,size=1g"}), EXEC_TMP, "fs.tmpfs", "noexec"),
    ("tmpfs smaller", tmpfs({"/tmp": "rw,nosuid,nodev,size=256m"}), POLICY, "fs.tmpfs", "size=256m"),
    ("tmpfs inode cap", tmpfs({"/tmp": "rw,nosuid,nodev,size=1g,nr_inodes=10k"}), POLICY, "fs.tmpfs", "nr_inodes=10k"),
    ("less memory", hc(Memory=512 * MIB, MemorySwap=512 * MIB), POLICY, "mem.limit", "512 MiB, below"),
    ("less memory, swap too", hc(Memory=512 * MIB, MemorySwap=512 * MIB), POLICY, "mem.swap_eq_mem", "512 MiB"),
    ("fewer cpus", hc(NanoCpus=500_000_000), POLICY, "cpu.limit", "cpus 0.5, below the planned 1"),
    ("fewer cpus by quota", hc(NanoCpus=0, CpuQuota=50_000, CpuPeriod=100_000), POLICY, "cpu.limit", "0.5"),
    ("fewer pids", hc(PidsLimit=64), POLICY, "pids.limit", "pids 64, below the planned 256"),
    ("no ipc at all", hc(IpcMode="none"), POLICY, "ns.ipc", "none"),
]

# name, change, policy, the checks that fail in both fits
LOOSER: list[tuple[str, Callable[[dict], None], IsolationPolicy, set[str]]] = [
    ("tmpfs exec where noexec is planned", tmpfs({"/tmp": "rw,exec,nosuid,nodev,size=1g"}), POLICY, {"fs.tmpfs"}),
    ("tmpfs suid", tmpfs({"/tmp": "rw,suid,nodev,size=1g"}), EXEC_TMP, {"fs.tmpfs"}),
    ("tmpfs dev", tmpfs({"/tmp": "rw,exec,nosuid,dev,size=1g"}), EXEC_TMP, {"fs.tmpfs"}),
    ("tmpfs bigger", tmpfs({"/tmp": "rw,nosuid,nodev,size=2g"}), POLICY, {"fs.tmpfs"}),
    ("tmpfs uncapped", tmpfs({"/tmp": "rw,nosuid,nodev"}), POLICY, {"fs.tmpfs"}),
    ("tmpfs relative size", tmpfs({"/tmp": "rw,nosuid,nodev,size=10%"}), POLICY, {"fs.tmpfs"}),
    ("tmpfs another mode", tmpfs({"/tmp": "rw,nosuid,nodev,size=1g,mode=0777"}), POLICY, {"fs.tmpfs"}),
    ("tmpfs extra path", tmpfs({"/tmp": "rw,nosuid,nodev,size=1g", "/run": "rw,size=1m"}), POLICY, {"fs.tmpfs"}),
    # Fewer writable places is not a seal gained: the candidate's planned /tmp is gone.
    ("tmpfs read-only", tmpfs({"/tmp": "ro,nosuid,nodev,size=1g"}), POLICY, {"fs.tmpfs"}),
    ("tmpfs missing", hc(Tmpfs=None), POLICY, {"fs.tmpfs"}),
    ("more memory", hc(Memory=2 * GIB, MemorySwap=2 * GIB), POLICY, {"mem.limit", "mem.swap_eq_mem"}),
    ("no memory limit", hc(Memory=0, MemorySwap=0), POLICY, {"mem.limit", "mem.swap_eq_mem"}),
    ("swap on top of memory", hc(MemorySwap=1536 * MIB), POLICY, {"mem.swap_eq_mem"}),
    ("more cpus", hc(NanoCpus=2_000_000_000), POLICY, {"cpu.limit"}),
    ("no cpu limit", hc(NanoCpus=0), POLICY, {"cpu.limit"}),
    ("more pids", hc(PidsLimit=512), POLICY, {"pids.limit"}),
    ("pids unlimited", hc(PidsLimit=-1), POLICY, {"pids.limit"}),
    ("ipc private where none is planned", hc(IpcMode="private"), plan(ipc_mode="none"), {"ns.ipc"}),
    ("ipc shareable", hc(IpcMode="shareable"), POLICY, {"ns.ipc"}),
    ("bigger log", hc(LogConfig={"Type": "json-file", "Config": {"max-size": "20m"}}), POLICY, {"log.capped"}),
]


def _workspace_ro(d: dict) -> None:
    for m in d["Mounts"]:
        if m["Destination"] == "/workspace":
            m["RW"] = False
    for m in d["HostConfig"]["Mounts"]:
        if m["Target"] == "/workspace":
            m["ReadOnly"] = True


def _propagation_private(d: dict) -> None:
    for m in d["Mounts"]:
        m["Propagation"] = "private"


# Rules that stay equality: what would look "stricter" still fails at least as strict.
EQUALITY: list[tuple[str, Callable[[dict], None], set[str]]] = [
    # The runtime decides which kernel the probes read; verify a runsc container with a runsc policy.
    ("runsc under a runc policy", hc(Runtime="runsc"), {"runtime"}),
    # Another non-root uid is not stricter: the workspace and input are owned for the planned one.
    ("another uid", lambda d: d["Config"].update(User="1001:1001"), {"id.user"}),
    # A read-only workspace leaves nothing to grade.
    ("workspace read-only", _workspace_ro, {"mounts.workspace_rw"}),
    # private (not rprivate) leaves submounts' propagation as it was.
    ("propagation private", _propagation_private, {"mounts.propagation"}),
]


@pytest.mark.parametrize("name,change,policy,check_id,note", STRICTER, ids=[c[0] for c in STRICTER])
def test_stricter_passes_at_least_and_says_how(name: str, change: Callable[[dict], None], policy: IsolationPolicy,
                                                check_id: str, note: str) -> None:
    doc = good()
    change(doc)
    checks = judged(doc, policy, "at_least")
    assert failing(checks) == set(), [c.detail for c in failures(checks)]
    (c,) = [c for c in checks if c.id == check_id]
    assert note in c.stricter, c
    assert c.to_dict()["stricter"] == c.stricter
    assert any(line.startswith(f"{check_id}: ") for line in stricter_notes(checks))
    # A run's own sandbox is the one planned: the same container fails there.
    assert check_id in failing(judged(doc, policy, "exact"))


@pytest.mark.parametrize("name,change,policy,ids", LOOSER, ids=[c[0] for c in LOOSER])
def test_looser_fails_in_both_fits(name: str, change: Callable[[dict], None], policy: IsolationPolicy,
                                   ids: set[str]) -> None:
    doc = good()
    change(doc)
    for fit in ("at_least", "exact"):
        assert failing(judged(doc, policy, fit)) == ids, fit  # type: ignore[arg-type]


@pytest.mark.parametrize("name,change,ids", EQUALITY, ids=[c[0] for c in EQUALITY])
def test_unordered_fields_stay_equality(name: str, change: Callable[[dict], None], ids: set[str]) -> None:
    doc = good()
    change(doc)
    assert failing(judged(doc, POLICY, "at_least")) == ids


def test_as_planned_has_no_note_and_keeps_the_evidence_shape() -> None:
    for fit in ("at_least", "exact"):
        checks = judged(good(), POLICY, fit)  # type: ignore[arg-type]
        assert failing(checks) == set() and stricter_notes(checks) == []
        assert all("stricter" not in c.to_dict() for c in checks)
    # The default fit is a run's own: exact.
    doc = good()
    hc(PidsLimit=64)(doc)
    assert failing(check_inspect(doc, POLICY, MOUNTS, phase="before")) == {"pids.limit"}


def test_a_smaller_log_passes_in_both_fits_and_says_so() -> None:
    """The log cap is a ceiling: smaller always passed, a run's own sandbox too."""
    doc = good()
    hc(LogConfig={"Type": "json-file", "Config": {"max-size": "1m"}})(doc)
    for fit in ("at_least", "exact"):
        (c,) = [c for c in judged(doc, POLICY, fit) if c.id == "log.capped"]  # type: ignore[arg-type]
        assert c.ok and "1m, below the planned 10m" in c.stricter


def test_tmpfs_options_read_with_the_engines_defaults() -> None:
    """Docker mounts `rw,size=1g` nosuid,nodev,noexec (measured): the same as spelled out."""
    assert tmpfs_effective("rw,size=1g") == tmpfs_effective("rw,noexec,nosuid,nodev,size=1g")
    assert tmpfs_effective("rw,exec,suid,dev")["exec"] == "exec"
    assert tmpfs_effective("exec,noexec")["exec"] == "noexec"  # the later option wins, as with mount(8)
    doc = good()
    tmpfs({"/tmp": "rw,size=1g"})(doc)
    assert failing(judged(doc, POLICY, "exact")) == set()


# -- probes: the limits the kernel enforces ----------------------------------------
def probe_raw(**limits: str) -> str:
    raw = (FIX / "probe_good.txt").read_text()
    for key, value in limits.items():
        lines = raw.splitlines()
        hits = [i for i, ln in enumerate(lines) if ln.rsplit("/", 1)[-1].startswith(key + " ")]
        assert len(hits) == 1, key
        path = lines[hits[0]].split(" ", 1)[0]
        lines[hits[0]] = f"{path} {value}"
        raw = "\n".join(lines) + "\n"
    return raw


def probe_checks(raw: str, fit: Fit) -> list[Check]:
    return parse_probes(raw, POLICY, input_dir="/input", workspace_dir="/workspace", phase="running", fit=fit)


HALF = str(512 * MIB)
PROBE_STRICTER = [
    ({"pids.max": "128"}, "probe.cgroup_pids"),
    ({"memory.limit_in_bytes": HALF, "memory.memsw.limit_in_bytes": HALF}, "probe.cgroup_memory"),
    ({"cpu.cfs_quota_us": "50000"}, "probe.cgroup_cpu"),
]
PROBE_LOOSER = [
    ({"pids.max": "512"}, "probe.cgroup_pids"),
    ({"pids.max": "max"}, "probe.cgroup_pids"),
    ({"memory.limit_in_bytes": str(2 * GIB), "memory.memsw.limit_in_bytes": str(2 * GIB)}, "probe.cgroup_memory"),
    ({"memory.memsw.limit_in_bytes": str(2 * GIB)}, "probe.cgroup_memory"),  # swap on top
    ({"cpu.cfs_quota_us": "200000"}, "probe.cgroup_cpu"),
    ({"cpu.cfs_quota_us": "-1"}, "probe.cgroup_cpu"),
]


@pytest.mark.parametrize("limits,check_id", PROBE_STRICTER, ids=[c[1] for c in PROBE_STRICTER])
def test_probe_lower_limits_pass_at_least(limits: dict[str, str], check_id: str) -> None:
    raw = probe_raw(**limits)
    checks = probe_checks(raw, "at_least")
    assert failing(checks) == set(), [c.detail for c in failures(checks)]
    (c,) = [c for c in checks if c.id == check_id]
    assert "below the planned" in c.stricter
    assert failing(probe_checks(raw, "exact")) == {check_id}


@pytest.mark.parametrize("limits,check_id", PROBE_LOOSER, ids=[f"{c[1]}-{i}" for i, c in enumerate(PROBE_LOOSER)])
def test_probe_higher_limits_fail_in_both_fits(limits: dict[str, str], check_id: str) -> None:
    raw = probe_raw(**limits)
    for fit in ("at_least", "exact"):
        assert failing(probe_checks(raw, fit)) == {check_id}, fit  # type: ignore[arg-type]


def test_the_report_lists_what_is_stricter() -> None:
    doc = good()
    tmpfs({"/tmp": "rw,nosuid,nodev,size=1g"})(doc)
    hc(PidsLimit=64)(doc)
    rep = _report("c", [("inspect-before", judged(copy.deepcopy(doc), EXEC_TMP, "at_least"))], phase="before")
    assert rep.ok
    assert [line.split(":", 1)[0] for line in rep.stricter] == ["[inspect-before] fs.tmpfs", "[inspect-before] pids.limit"]
    text = render_report(rep)
    assert "PASS    fs.tmpfs: stricter than planned: /tmp noexec where exec is planned" in text
    assert "SEALED: every check passed; 2 at least as strict as planned" in text
