"""The inspect checks and probe parser on stored JSON (no engine needed).

The fixtures are captures of a real container made by
`ale.sandbox.docker.container_create_kwargs` (policy: 1 GiB, 1 CPU, defaults
otherwise; binds /tmp/ale-fixture/input -> /input ro, /tmp/ale-fixture/workspace ->
/workspace rw) on Docker 20.10, cgroup v1: inspect after create
(`inspect_good.json`), after kill (`inspect_good_after.json`), the tools image
(`image_good.json`) and the probe output of the running container
(`probe_good.txt`). Engine variants (Podman, Docker 25+, containerd image
store) are synthetic edits of those captures, as ISOLATION.md allows.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from ale.isolation.checks import (
    Check,
    check_inspect,
    diff_captures,
    failures,
    image_record,
    looks_like_credential,
    normalize_cap,
)
from ale.isolation.probes import (
    parse_mountinfo,
    parse_probes,
    probe_argv,
    split_sections,
    workspace_empty_checks,
    workspace_listing,
)
from ale.isolation.verify_container import VerifyReport, render_report
from ale.sandbox.base import Mount
from ale.sandbox.policy import GIB, IsolationPolicy, TmpfsMount

FIX = Path(__file__).parent / "fixtures"
POLICY = IsolationPolicy(memory_bytes=1 * GIB, cpus=1, tmpfs=(TmpfsMount(options="rw,nosuid,nodev,size=1g"),))  # as the fixtures were captured
MOUNTS = [
    Mount("/tmp/ale-fixture/input", "/input", True),
    Mount("/tmp/ale-fixture/workspace", "/workspace", False),
]


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


@pytest.fixture
def good() -> dict:
    return load("inspect_good.json")


@pytest.fixture
def after() -> dict:
    return load("inspect_good_after.json")


@pytest.fixture
def image() -> dict:
    return load("image_good.json")


def failing(checks: list[Check]) -> set[str]:
    return {c.id for c in failures(checks)}


def run(doc: dict, phase: str = "before", **kw) -> list[Check]:
    return check_inspect(doc, POLICY, MOUNTS, phase=phase, **kw)  # type: ignore[arg-type]


# -- the good documents --------------------------------------------------------
def test_good_before_passes(good: dict, image: dict) -> None:
    checks = run(good, image_inspect=image)
    assert failing(checks) == set()
    ids = [c.id for c in checks]
    assert len(ids) == len(set(ids)), "check ids are unique"
    assert {"priv.not_privileged", "mounts.exactly_two", "net.mode_none", "state.before",
            "image.no_volumes", "image.id_matches", "env.allowlisted"} <= set(ids)


def test_good_after_passes_and_captures_agree(good: dict, after: dict) -> None:
    checks = run(after, phase="after")
    assert failing(checks) == set()
    state = next(c for c in checks if c.id == "state.after")
    assert state.observed["ExitCode"] == 137 and state.observed["OOMKilled"] is False
    assert failing(diff_captures(good, after)) == set()
    flipped = copy.deepcopy(after)
    flipped["Mounts"].reverse()  # the engine's order of Mounts is not state
    assert failing(diff_captures(good, flipped)) == set()


def test_before_check_rejects_a_started_container(after: dict) -> None:
    assert failing(run(after, phase="before")) == {"state.before"}
    assert failing(run(load("inspect_good.json"), phase="after")) == {"state.after"}


def test_check_round_trips_to_dict(good: dict) -> None:
    d = run(good)[0].to_dict()
    assert set(d) == {"id", "ok", "expected", "observed", "detail"}
    json.dumps([c.to_dict() for c in run(good)])


# -- one mutation, one failing id ----------------------------------------------
def hc(key: str, value) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        d["HostConfig"][key] = value
    return f


def top_mount(target: str, key: str, value) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        (m,) = [m for m in d["Mounts"] if m["Destination"] == target]
        m[key] = value
    return f


def add_volume_mount(d: dict) -> None:
    d["Mounts"].append({"Type": "volume", "Name": "abc", "Source": "/var/lib/docker/volumes/abc/_data",
                        "Destination": "/data", "Driver": "local", "Mode": "", "RW": True,
                        "Propagation": ""})
    d["Config"]["Volumes"] = {"/data": {}}


def add_socket_bind(d: dict) -> None:
    d["HostConfig"]["Mounts"].append({"Type": "bind", "Source": "/var/run/docker.sock",
                                      "Target": "/var/run/docker.sock", "ReadOnly": True})
    d["Mounts"].append({"Type": "bind", "Source": "/var/run/docker.sock",
                        "Destination": "/var/run/docker.sock", "Mode": "", "RW": False,
                        "Propagation": "rprivate"})


def add_extra_bind(d: dict) -> None:
    d["HostConfig"]["Binds"] = ["/srv/data:/data:ro"]
    d["Mounts"].append({"Type": "bind", "Source": "/srv/data", "Destination": "/data",
                        "Mode": "ro", "RW": False, "Propagation": "rprivate"})


def bind_only_in_binds(d: dict) -> None:
    d["HostConfig"]["Binds"] = ["/srv/data:/data:ro"]


def set_path(path: str, value) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        keys = path.split(".")
        cur = d
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    return f


def env_add(entry: str) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        d["Config"]["Env"].append(entry)
    return f


MUTATIONS: list[tuple[str, Callable[[dict], None], set[str]]] = [
    ("privileged", hc("Privileged", True), {"priv.not_privileged"}),
    ("no cap drop", hc("CapDrop", None), {"caps.drop_all"}),
    ("cap drop some", hc("CapDrop", ["NET_RAW"]), {"caps.drop_all"}),
    ("cap add", hc("CapAdd", ["NET_RAW"]), {"caps.add_empty"}),
    ("no nnp", hc("SecurityOpt", None), {"sec.no_new_privileges"}),
    ("nnp false", hc("SecurityOpt", ["no-new-privileges", "no-new-privileges:false"]),
     {"sec.no_new_privileges"}),
    ("seccomp unconfined", hc("SecurityOpt", ["no-new-privileges", "seccomp=unconfined"]),
     {"sec.no_unconfined"}),
    ("apparmor unconfined", hc("SecurityOpt", ["no-new-privileges", "apparmor:unconfined"]),
     {"sec.no_unconfined"}),
    ("systempaths", hc("SecurityOpt", ["no-new-privileges", "systempaths=unconfined"]),
     {"sec.no_unconfined"}),
    ("label disable", hc("SecurityOpt", ["no-new-privileges", "label=disable"]),
     {"sec.no_unconfined"}),
    ("masked empty", hc("MaskedPaths", []), {"sec.masked_paths"}),
    ("readonly paths null", hc("ReadonlyPaths", None), {"sec.masked_paths"}),
    ("rw rootfs", hc("ReadonlyRootfs", False), {"fs.readonly_rootfs"}),
    ("extra bind", add_extra_bind, {"mounts.exactly_two"}),
    ("input rw", top_mount("/input", "RW", True), {"mounts.input_ro", "mounts.binds_agree"}),
    ("workspace ro", top_mount("/workspace", "RW", False), {"mounts.workspace_rw", "mounts.binds_agree"}),
    ("wrong source", top_mount("/input", "Source", "/tmp/elsewhere"),
     {"mounts.sources", "mounts.binds_agree"}),
    ("wrong target", top_mount("/workspace", "Destination", "/out"),
     {"mounts.exactly_two", "mounts.workspace_rw", "mounts.sources", "mounts.binds_agree"}),
    ("shared propagation", top_mount("/input", "Propagation", "rshared"), {"mounts.propagation"}),
    ("docker socket", add_socket_bind, {"mounts.exactly_two", "mounts.no_docker_socket"}),
    ("binds disagree", bind_only_in_binds, {"mounts.binds_agree"}),
    ("volumes from", hc("VolumesFrom", ["other"]), {"mounts.no_volumes_from"}),
    ("image volume", add_volume_mount,
     {"mounts.exactly_two", "mounts.only_binds", "image.no_volumes"}),
    ("tmpfs extra", hc("Tmpfs", {"/tmp": "rw,nosuid,nodev,size=1g", "/run": "rw"}), {"fs.tmpfs"}),
    # Docker mounts "rw,size=1g" nosuid,nodev,noexec, as planned: loosening takes a word (suid).
    ("tmpfs options", hc("Tmpfs", {"/tmp": "rw,suid,size=1g"}), {"fs.tmpfs"}),
    ("tmpfs uncapped", hc("Tmpfs", {"/tmp": "rw,nosuid,nodev"}), {"fs.tmpfs"}),
    ("network bridge", hc("NetworkMode", "bridge"), {"net.mode_none"}),
    ("networks bridge", set_path("NetworkSettings.Networks", {"bridge": {}}), {"net.networks_none"}),
    ("ports", hc("PortBindings", {"80/tcp": [{"HostIp": "", "HostPort": "8080"}]}), {"net.no_ports"}),
    ("publish all", hc("PublishAllPorts", True), {"net.no_ports"}),
    ("extra hosts", hc("ExtraHosts", ["x:127.0.0.1"]), {"net.no_extra_hosts_links_dns"}),
    ("links", hc("Links", ["/a:/b/a"]), {"net.no_extra_hosts_links_dns"}),
    ("dns", hc("Dns", ["127.0.0.1"]), {"net.no_extra_hosts_links_dns"}),
    ("pid host", hc("PidMode", "host"), {"ns.pid"}),
    ("uts host", hc("UTSMode", "host"), {"ns.uts"}),
    ("userns host", hc("UsernsMode", "host"), {"ns.userns"}),
    ("ipc host", hc("IpcMode", "host"), {"ns.ipc"}),
    ("ipc shareable", hc("IpcMode", "shareable"), {"ns.ipc"}),
    ("cgroupns host", hc("CgroupnsMode", "host"), {"ns.cgroupns"}),
    ("cgroup parent", hc("CgroupParent", "/x"), {"ns.cgroup_parent"}),
    ("memory", hc("Memory", 2 * GIB), {"mem.limit", "mem.swap_eq_mem"}),
    ("swap unlimited", hc("MemorySwap", -1), {"mem.swap_eq_mem"}),
    ("swap double", hc("MemorySwap", 2 * GIB), {"mem.swap_eq_mem"}),
    ("oom kill disabled", hc("OomKillDisable", True), {"mem.oom_kill_enabled"}),
    ("no cpu", hc("NanoCpus", 0), {"cpu.limit"}),
    ("two cpus", hc("NanoCpus", 2_000_000_000), {"cpu.limit"}),
    ("pids zero", hc("PidsLimit", 0), {"pids.limit"}),
    ("pids -1", hc("PidsLimit", -1), {"pids.limit"}),
    ("pids null", hc("PidsLimit", None), {"pids.limit"}),
    ("pids other", hc("PidsLimit", 512), {"pids.limit"}),
    ("devices", hc("Devices", [{"PathOnHost": "/dev/fuse", "PathInContainer": "/dev/fuse",
                                "CgroupPermissions": "rwm"}]), {"dev.none"}),
    ("device requests", hc("DeviceRequests", [{"Driver": "nvidia", "Count": -1}]), {"dev.none"}),
    ("device rules", hc("DeviceCgroupRules", ["c 1:3 rwm"]), {"dev.none"}),
    ("sysctls", hc("Sysctls", {"net.ipv4.ip_forward": "1"}), {"dev.sysctls"}),
    ("no sysctls", hc("Sysctls", None), {"dev.sysctls"}),
    ("shm not removed", hc("Sysctls", {**IsolationPolicy().sysctls, "kernel.shm_rmid_forced": "0"}), {"dev.sysctls"}),
    ("shm above budget", hc("Sysctls", {**IsolationPolicy().sysctls, "kernel.shmall": "18446744073692774399"}), {"dev.sysctls"}),
    ("no ulimits", hc("Ulimits", None), {"limits.ulimits"}),
    ("core unlimited", hc("Ulimits", [{"Name": "core", "Soft": -1, "Hard": -1}]), {"limits.ulimits"}),
    ("core hard raised", hc("Ulimits", [{"Name": "core", "Soft": 0, "Hard": 1024}]), {"limits.ulimits"}),
    ("root user", set_path("Config.User", "0:0"), {"id.user"}),
    ("named user", set_path("Config.User", "agent"), {"id.user"}),
    ("secret env", env_add("OPENAI_API_KEY=sk-abc"), {"env.allowlisted"}),
    ("proxy env", env_add("HTTPS_PROXY=http://127.0.0.1:3128"), {"env.allowlisted"}),
    ("docker host env", env_add("DOCKER_HOST=unix:///x.sock"), {"env.allowlisted"}),
    ("unlisted env", env_add("FOO=1"), {"env.allowlisted"}),
    ("runtime", hc("Runtime", "runsc"), {"runtime"}),
    ("restart", hc("RestartPolicy", {"Name": "always", "MaximumRetryCount": 0}), {"restart.no"}),
    ("autoremove", hc("AutoRemove", True), {"autoremove.false"}),
    ("log uncapped", hc("LogConfig", {"Type": "json-file", "Config": {}}), {"log.capped"}),
    ("log too big", hc("LogConfig", {"Type": "json-file", "Config": {"max-size": "1g"}}),
     {"log.capped"}),
    ("started", set_path("State.StartedAt", "2026-01-01T00:00:00Z"), {"state.before"}),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in MUTATIONS],
                         ids=[n for n, _, _ in MUTATIONS])
def test_each_mutation_fails_under_its_id(good: dict, mutate, expected: set[str]) -> None:
    doc = copy.deepcopy(good)
    mutate(doc)
    assert failing(run(doc)) == expected


@pytest.mark.parametrize(
    "path",
    ["HostConfig.Privileged", "HostConfig.CapDrop", "HostConfig.SecurityOpt", "HostConfig.Memory",
     "HostConfig.PidsLimit", "HostConfig.NetworkMode", "Mounts", "Config.User", "Config.Env",
     "HostConfig.CgroupnsMode", "HostConfig.Runtime", "NetworkSettings", "State", "Config.Volumes"],
)
def test_missing_field_is_unknown(good: dict, path: str) -> None:
    doc = copy.deepcopy(good)
    keys = path.split(".")
    cur = doc
    for k in keys[:-1]:
        cur = cur[k]
    del cur[keys[-1]]
    bad = failures(run(doc))
    assert bad, f"deleting {path} must fail something"
    assert all(c.ok is None for c in bad)
    assert all(f"missing field {path}" in c.detail or "missing field" in c.detail for c in bad)


def test_missing_hostconfig_makes_everything_unknown(good: dict) -> None:
    doc = copy.deepcopy(good)
    del doc["HostConfig"]
    unknown = {c.id for c in run(doc) if c.ok is None}
    assert {"priv.not_privileged", "caps.drop_all", "net.mode_none", "pids.limit"} <= unknown


def test_not_a_document() -> None:
    (c,) = check_inspect([], POLICY, MOUNTS, phase="before")  # type: ignore[arg-type]
    assert c.ok is None


def test_image_volume_in_image_inspect(good: dict, image: dict) -> None:
    img = copy.deepcopy(image)
    img["Config"]["Volumes"] = {"/data": {}}
    assert failing(run(good, image_inspect=img)) == {"image.no_volumes"}
    other = copy.deepcopy(image)
    other["Id"] = "sha256:" + "0" * 64
    assert failing(run(good, image_inspect=other)) == {"image.id_matches"}


def test_mount_inodes(good: dict, tmp_path: Path) -> None:
    # Point both binds at real folders here so their inodes can be read.
    inp, ws = tmp_path / "in", tmp_path / "ws"
    inp.mkdir()
    ws.mkdir()
    doc = copy.deepcopy(good)
    src = {"/input": str(inp), "/workspace": str(ws)}
    for m in doc["Mounts"]:
        m["Source"] = src[m["Destination"]]
    for m in doc["HostConfig"]["Mounts"]:
        m["Source"] = src[m["Target"]]
    mounts = [Mount(str(inp), "/input", True), Mount(str(ws), "/workspace", False)]
    inodes = {str(inp): inp.stat().st_ino, str(ws): ws.stat().st_ino}
    ok = check_inspect(doc, POLICY, mounts, phase="before", mount_inodes=inodes)
    assert failing(ok) == set()
    # The folder was replaced by another one at the same path: the inode tells.
    # (The new folder exists before the old goes, so the inode is not reused.)
    (tmp_path / "ws2").mkdir()
    os.rmdir(ws)
    os.rename(tmp_path / "ws2", ws)
    bad = check_inspect(doc, POLICY, mounts, phase="before", mount_inodes=inodes)
    assert failing(bad) == {"mounts.sources"}
    # A symlinked path compares by realpath.
    link = tmp_path / "link"
    link.symlink_to(inp)
    mounts2 = [Mount(str(link), "/input", True), Mount(str(ws), "/workspace", False)]
    assert failing(check_inspect(doc, POLICY, mounts2, phase="before")) == set()


# -- engine variants -------------------------------------------------------------
def test_podman_style_caps(good: dict) -> None:
    doc = copy.deepcopy(good)
    doc["HostConfig"]["CapDrop"] = ["CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE",
                                    "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_MKNOD",
                                    "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP",
                                    "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"]
    doc["HostConfig"]["CapAdd"] = []
    doc["BoundingCaps"] = []
    doc["EffectiveCaps"] = []
    doc["HostConfig"]["SecurityOpt"] = ["no-new-privileges=true"]
    assert failing(run(doc)) == set()
    doc["BoundingCaps"] = ["CAP_NET_RAW"]
    assert failing(run(doc)) == {"caps.drop_all"}
    doc["BoundingCaps"] = []
    doc["HostConfig"]["CapAdd"] = ["cap_net_raw"]
    assert failing(run(doc)) == {"caps.add_empty"}


def test_cap_names_normalise(good: dict) -> None:
    assert normalize_cap("cap_net_raw") == normalize_cap("NET_RAW") == "NET_RAW"
    doc = copy.deepcopy(good)
    doc["HostConfig"]["CapDrop"] = ["all"]
    doc["HostConfig"]["SecurityOpt"] = ["no-new-privileges:true"]
    assert failing(run(doc)) == set()


def docker25(doc: dict) -> dict:
    """Docker 25+ shape: new fields, deprecated network fields gone, nullable OomKillDisable."""
    d = copy.deepcopy(doc)
    d["HostConfig"]["Annotations"] = None
    d["HostConfig"]["OomKillDisable"] = None
    d["HostConfig"].pop("KernelMemory", None)
    d["HostConfig"].pop("KernelMemoryTCP", None)
    d["Config"].pop("MacAddress", None)
    for k in ("Bridge", "HairpinMode", "LinkLocalIPv6Address", "LinkLocalIPv6PrefixLen",
              "SecondaryIPAddresses", "SecondaryIPv6Addresses", "EndpointID", "Gateway",
              "GlobalIPv6Address", "GlobalIPv6PrefixLen", "IPAddress", "IPPrefixLen",
              "IPv6Gateway", "MacAddress"):
        d["NetworkSettings"].pop(k, None)
    d["NetworkSettings"]["Networks"]["none"]["DNSNames"] = None
    d["NetworkSettings"]["Networks"]["none"]["GwPriority"] = 0
    for m in d["Mounts"]:
        m.pop("Mode", None)
    return d


def test_docker25_variant(good: dict, after: dict) -> None:
    assert failing(run(docker25(good))) == set()
    assert failing(diff_captures(docker25(good), docker25(after))) == set()


def containerd_store(doc: dict, image: dict) -> tuple[dict, dict]:
    """containerd image store: ids are manifest-index digests, snapshotter 'overlayfs'."""
    d, i = copy.deepcopy(doc), copy.deepcopy(image)
    digest = "sha256:" + "ab" * 32
    d["Image"] = digest
    d["Driver"] = "overlayfs"
    d["GraphDriver"] = {"Data": None, "Name": "overlayfs"}
    i["Id"] = digest
    i["RepoDigests"] = [f"ale-tools@{digest}"]
    i["Descriptor"] = {"mediaType": "application/vnd.oci.image.index.v1+json",
                       "digest": digest, "size": 856}
    i.pop("GraphDriver", None)
    i.pop("ContainerConfig", None)
    return d, i


def test_containerd_store_variant(good: dict, image: dict) -> None:
    d, i = containerd_store(docker25(good), image)
    assert failing(run(d, image_inspect=i)) == set()
    rec = image_record(i, d)
    assert rec["store"] == "containerd"
    assert rec["repo_digests"] == i["RepoDigests"]


def test_image_record(good: dict, image: dict) -> None:
    rec = image_record(image, good)
    assert rec["id"] == image["Id"] == good["Image"]
    assert rec["repo_digests"] == []
    assert rec["store"] == "graphdriver:overlay2"
    assert "ale-tools:latest" in rec["repo_tags"]


# -- captures --------------------------------------------------------------------
def test_diff_captures_names_the_keys(good: dict, after: dict) -> None:
    changed = copy.deepcopy(after)
    changed["HostConfig"]["Memory"] = 1
    changed["Mounts"].append({"Type": "bind"})
    changed["Config"]["Env"] = []
    (c,) = diff_captures(good, changed)
    assert c.ok is False
    assert c.observed == ["Config.Env", "HostConfig.Memory", "Mounts"]
    del changed["HostConfig"]
    (c,) = diff_captures(good, changed)
    assert c.ok is None and "after.HostConfig" in c.detail


def test_credential_names() -> None:
    for name in ("OPENAI_API_KEY", "HF_TOKEN", "AWS_REGION", "GOOGLE_APPLICATION_CREDENTIALS",
                 "http_proxy", "NO_PROXY", "DOCKER_HOST", "DB_PASSWORD", "MY_SECRET"):
        assert looks_like_credential(name), name
    for name in ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "PYTHONDONTWRITEBYTECODE", "UV_PROJECT_ENVIRONMENT"):
        assert not looks_like_credential(name), name


def test_secret_value_never_in_the_check(good: dict) -> None:
    doc = copy.deepcopy(good)
    doc["Config"]["Env"].append("OPENAI_API_KEY=sk-verysecret")
    c = next(c for c in run(doc) if c.id == "env.allowlisted")
    assert "sk-verysecret" not in json.dumps(c.to_dict())
    assert "OPENAI_API_KEY" in c.detail


def test_policy_adding_caps_is_refused(good: dict) -> None:
    pol = POLICY.model_copy(update={"cap_add": ("NET_RAW",)})
    doc = copy.deepcopy(good)
    doc["HostConfig"]["CapAdd"] = ["NET_RAW"]
    bad = failing(check_inspect(doc, pol, MOUNTS, phase="before"))
    assert bad == {"caps.add_empty"}


# -- probes ----------------------------------------------------------------------
@pytest.fixture
def probe_raw() -> str:
    return (FIX / "probe_good.txt").read_text()


def parse(raw: str) -> list[Check]:
    return parse_probes(raw, POLICY, input_dir="/input", workspace_dir="/workspace")


def test_probe_good(probe_raw: str) -> None:
    checks = parse(probe_raw)
    assert failing(checks) == set()
    assert {c.id for c in checks} == {
        "probe.complete", "probe.well_formed", "probe.uid", "probe.cap_eff_zero", "probe.cap_bnd_zero",
        "probe.no_new_privs", "probe.seccomp", "probe.interfaces_lo_only", "probe.no_routes",
        "probe.writable_mounts", "probe.cgroupns_private", "probe.cgroup_pids",
        "probe.cgroup_memory", "probe.cgroup_cpu", "probe.write_root_fails",
        "probe.write_input_fails", "probe.write_workspace_ok", "probe.write_tmp_ok",
        "probe.namespaces_private", "probe.masked_paths", "probe.readonly_kernel_paths", "probe.kernel",
    }


def replace_line(raw: str, old: str, new: str) -> str:
    assert old in raw, old
    return raw.replace(old, new)


PROBE_MUTATIONS = [
    ("root", lambda r: replace_line(r, "numeric uid=1000 gid=1000 groups=1000",
                                    "numeric uid=0 gid=0 groups=0"), {"probe.uid"}),
    ("capeff", lambda r: replace_line(r, "CapEff:\t0000000000000000", "CapEff:\t0000000000002000"),
     {"probe.cap_eff_zero"}),
    ("capbnd", lambda r: replace_line(r, "CapBnd:\t0000000000000000", "CapBnd:\t00000000a80425fb"),
     {"probe.cap_bnd_zero"}),
    ("nnp", lambda r: replace_line(r, "NoNewPrivs:\t1", "NoNewPrivs:\t0"), {"probe.no_new_privs"}),
    ("seccomp", lambda r: replace_line(r, "Seccomp:\t2", "Seccomp:\t0"), {"probe.seccomp"}),
    ("eth0", lambda r: replace_line(
        r, "=== ale-probe:route ===",
        "  eth0:       0       0    0    0    0     0          0         0        0       0    0"
        "    0    0     0       0          0\n=== ale-probe:route ==="),
     {"probe.interfaces_lo_only"}),
    ("route", lambda r: replace_line(
        r, "=== ale-probe:ipv6_route ===",
        "eth0\t00000000\t010011AC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n=== ale-probe:ipv6_route ==="),
     {"probe.no_routes"}),
    ("rw root", lambda r: replace_line(r, " / / ro,relatime", " / / rw,relatime"),
     {"probe.writable_mounts"}),
    ("rw input", lambda r: replace_line(r, " /input ro,relatime", " /input rw,relatime"),
     {"probe.writable_mounts"}),
    ("cgroupns host", lambda r: replace_line(r, "8:pids:/\n", "8:pids:/docker/abc\n"),
     {"probe.cgroupns_private"}),
    ("ipc ns host", lambda r: re.sub(r"^ipc ipc:\[\d+\]$", "ipc ipc:[4026531839]", r,
                                     count=1, flags=re.M), {"probe.namespaces_private"}),
    ("pid ns init", lambda r: re.sub(r"^pid pid:\[\d+\]$", "pid pid:[4026531836]", r,
                                     count=1, flags=re.M), {"probe.namespaces_private"}),
    ("net ns shared", lambda r: re.sub(r"^net net:\[\d+\]$", "net net:[4026531833]", r,
                                       count=1, flags=re.M), {"probe.namespaces_private"}),
    ("unmasked keys", lambda r: re.sub(r"^.* /proc/keys .*\n", "", r, flags=re.M),
     {"probe.masked_paths"}),
    ("rw proc sys", lambda r: replace_line(r, " /sys /proc/sys ro,", " /sys /proc/sys rw,"),
     {"probe.readonly_kernel_paths"}),
    ("rw sys", lambda r: replace_line(r, " / /sys ro,", " / /sys rw,"),
     {"probe.readonly_kernel_paths"}),
    ("pids", lambda r: replace_line(r, "pids.max 256", "pids.max max"), {"probe.cgroup_pids"}),
    ("swap", lambda r: replace_line(r, "memory.memsw.limit_in_bytes 1073741824",
                                    "memory.memsw.limit_in_bytes 9223372036854771712"),
     {"probe.cgroup_memory"}),
    ("cpu", lambda r: replace_line(r, "cpu.cfs_quota_us 100000", "cpu.cfs_quota_us -1"),
     {"probe.cgroup_cpu"}),
    ("write root", lambda r: replace_line(r, "fail /var/tmp", "ok /var/tmp"),
     {"probe.write_root_fails"}),
    ("write home", lambda r: replace_line(r, "fail /home/agent", "ok /home/agent"),
     {"probe.write_root_fails"}),
    ("write input", lambda r: replace_line(r, "fail /input", "ok /input"),
     {"probe.write_input_fails"}),
    ("write ws", lambda r: replace_line(r, "ok /workspace", "fail /workspace"),
     {"probe.write_workspace_ok"}),
    ("write tmp", lambda r: replace_line(r, "ok /tmp", "fail /tmp"), {"probe.write_tmp_ok"}),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in PROBE_MUTATIONS],
                         ids=[n for n, _, _ in PROBE_MUTATIONS])
def test_probe_mutations(probe_raw: str, mutate, expected: set[str]) -> None:
    assert failing(parse(mutate(probe_raw))) == expected


def test_probe_missing_sections_are_unknown(probe_raw: str) -> None:
    cut = probe_raw.split("=== ale-probe:mountinfo ===")[0]
    checks = parse(cut)
    bad = {c.id: c.ok for c in failures(checks)}
    assert bad["probe.complete"] is None
    assert bad["probe.writable_mounts"] is None
    assert bad["probe.write_tmp_ok"] is None
    assert "probe.uid" not in bad  # sections before the cut still count
    assert all(c.ok is None for c in failures(parse("")))


def test_probe_cgroup_v2(probe_raw: str) -> None:
    head, rest = probe_raw.split("=== ale-probe:cgroup_limits ===\n")
    _, tail = rest.split("=== ale-probe:writes ===")
    v2 = ("/sys/fs/cgroup/pids.max 256\n/sys/fs/cgroup/memory.max 1073741824\n"
          "/sys/fs/cgroup/memory.swap.max 0\n/sys/fs/cgroup/cpu.max 100000 100000\n")
    raw = head + "=== ale-probe:cgroup_limits ===\n" + v2 + "=== ale-probe:writes ===" + tail
    assert failing(parse(raw)) == set()
    assert failing(parse(raw.replace("memory.swap.max 0", "memory.swap.max max"))) == {
        "probe.cgroup_memory"}
    assert failing(parse(raw.replace("cpu.max 100000 100000", "cpu.max max 100000"))) == {
        "probe.cgroup_cpu"}


def test_mountinfo_unescapes() -> None:
    (m,) = parse_mountinfo([r"90 73 254:0 /a\040b /in\040put ro,relatime - ext4 /dev/vda rw"])
    assert m["mount_point"] == "/in put" and m["root"] == "/a b"


def test_probe_argv_and_sections() -> None:
    argv = probe_argv("/input", "/workspace")
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["ale-probe", "/input", "/workspace", "/tmp"]
    # The script reads the kernel's view; it opens a socket only in its egress section, and
    # only to the addresses of a route off lo (a sealed container has none).
    script = argv[2]
    egress = script[script.index("sec egress"):script.index("sec mountinfo")]
    rest = script.replace(egress, "")
    for word in ("ping", "curl", "wget", "nc ", "/dev/tcp", "/dev/udp", "python"):
        assert word not in rest
    assert '[ "$ifc" = lo ] && continue' in egress and "1.1.1.1" not in egress and "8.8.8.8" not in egress
    assert split_sections("=== ale-probe:a ===\nx\n=== ale-probe:b ===\n") == {"a": ["x"], "b": []}


# -- workspace listing -------------------------------------------------------------
def test_workspace_listing(tmp_path: Path) -> None:
    listing = workspace_listing(tmp_path)
    assert listing["entries"] == [] and listing["inode"] == tmp_path.stat().st_ino
    (ok,) = workspace_empty_checks(listing)
    assert ok.id == "ws.empty_at_start" and ok.ok is True
    (tmp_path / "x").write_text("1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    checks = workspace_empty_checks(workspace_listing(tmp_path), expected_inode=listing["inode"])
    assert {c.id: c.ok for c in checks} == {"ws.empty_at_start": False, "ws.same_inode": True}
    assert checks[0].observed == ["dangling", "x"]
    (c,) = workspace_empty_checks(None)
    assert c.ok is None


def test_render_report() -> None:
    checks = [Check("a.ok", True, 1, 1), Check("b.bad", False, 1, 2, "b differs"),
              Check("c.unknown", None, 1, None, "missing field X")]
    rep = VerifyReport(ok=False, container="x", phase="before",
                       checks=[c.to_dict() for c in checks], violations=["b.bad failed"])
    text = render_report(rep)
    lines = text.splitlines()
    assert lines[1].startswith("  FAIL") and "b differs" in lines[1]
    assert "UNKNOWN" in lines[2] and "PASS" in lines[3]
    assert lines[-1].startswith("NOT SEALED")


def test_probe_output_with_foreign_text_is_rejected(probe_raw: str) -> None:
    """Text before the first section, or a section twice (something else wrote into
    the probe's output), fails probe.well_formed; the good output passes it."""
    assert {c.id: c.ok for c in parse(probe_raw)}["probe.well_formed"] is True
    before = {c.id: c for c in parse("hello from the candidate\n" + probe_raw)}["probe.well_formed"]
    assert before.ok is False and "text before the first section" in before.detail
    twice = probe_raw + "=== ale-probe:id ===\nnumeric uid=0 gid=0 groups=0\n"
    c = {c.id: c for c in parse(twice)}["probe.well_formed"]
    assert c.ok is False and "'id' repeated" in c.detail
