"""The task jail is bounded (issue 19, item 4): a host-side grader that runs the
candidate's program (a fork bomb, a disk fill, a memory hog) hits its task process's
bounds (a cgroup of its own, size-capped tmpfs, rlimits), and that grading fails or
returns; the harness and another task process running at the same time are not
touched. Each test keeps a second guard of its own (``ulimit -u``, a byte budget,
``RLIMIT_AS``) so that the machine is safe even if a bound failed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ale.tasks import jail
from ale.tasks.jail import MiB, TaskBounds, TaskCgroup, cgroup_mounts, make_cgroup, own_cgroups
from ale.tasks.process import TaskCallFailed, TaskProcess, TaskProcessError
from tests.conftest import require
from tests.test_ale_tree import evaluate_only_task  # the one evaluate-only task writer


def candidate(tmp_path: Path, name: str, program: str, *, then: str = "") -> Path:
    """A task whose evaluate() runs the candidate's ``program`` (Python, as ALE's
    dit_pipeline grader runs the candidate's pipeline) and returns what it did."""
    return evaluate_only_task(tmp_path, name, f"""
        r = subprocess.run([sys.executable, "-c", {textwrap.dedent(program)!r}], capture_output=True, text=True,
                           timeout=60)
        out = {{"rc": r.returncode, "stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}}
        {then}
        return out
    """)


class Session:
    """evaluate() here needs no session call."""


def small(**kw: Any) -> TaskBounds:
    base: dict[str, Any] = {"pids": 64, "memory": 256 * MiB, "disk": 32 * MiB, "cpu_s": 60}
    return TaskBounds(**{**base, **kw})


JAIL = shutil.which("bwrap") is not None and jail.jail_enabled()
CGROUP = make_cgroup(f"ale-probe-{os.getpid()}", small())[0]
if CGROUP is not None:
    CGROUP.remove()
# Capabilities (tests/conftest.py): skipped locally without them, failures under ALE_CI=1,
# where CI runs as root with bubblewrap installed and can make a cgroup.
needs_jail = pytest.mark.requires(JAIL, "no bubblewrap, or ALE_TASK_SANDBOX=off")
needs_cgroup = pytest.mark.requires(CGROUP is not None and JAIL, "no cgroup can be made here (rlimits only)")


def run(coro: Any, limit: float = 90) -> Any:
    return asyncio.run(asyncio.wait_for(coro, limit))


async def grade(d: Path, bounds: TaskBounds | None, *, timeout: float = 60) -> tuple[Any, dict[str, Any], dict[str, int]]:
    """evaluate() in its jailed, bounded process: (its value or the exception, the
    process's evidence, what hit a bound)."""
    async with TaskProcess(d, bounds=bounds) as proc:
        try:
            value: Any = await proc.call("evaluate", 0, Session(), timeout=timeout)
        except (TaskCallFailed, TaskProcessError) as e:
            value = e
        hit = proc.bounds_hit()
        evidence = proc.evidence()
    return value, evidence, hit


# -- a fork bomb ----------------------------------------------------------------------
BOMB = """
    # the candidate's program: a fork bomb, with its own `ulimit -u` as a second guard
    p = subprocess.Popen(["bash", "-c", "ulimit -u 300; b() { b | b & }; b"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4)
    try:
        forked = subprocess.run(["true"], timeout=10).returncode
    except OSError as e:
        forked = type(e).__name__
    return {"grader_forked": forked}
"""

GOOD = """
    # a well-behaved grader: 20 programs, one after the other
    done = sum(subprocess.run(["sh", "-c", "exit 0"]).returncode == 0 for _ in range(20))
    return [1.0 if done == 20 else 0.0]
"""


@needs_cgroup
def test_a_fork_bomb_is_contained_and_a_concurrent_task_process_is_unaffected(tmp_path: Path) -> None:
    bomb_dir = evaluate_only_task(tmp_path, "bomb", BOMB)
    good_dir = evaluate_only_task(tmp_path, "good", GOOD)

    async def go() -> dict[str, Any]:
        async with TaskProcess(bomb_dir, bounds=small(pids=64)) as bomb:
            call = asyncio.ensure_future(bomb.call("evaluate", 0, Session(), timeout=40))
            await asyncio.sleep(1.5)  # the bomb is at its cap by now
            async with TaskProcess(good_dir, bounds=small(pids=64)) as good:  # starts and grades meanwhile
                good_value = await good.call("evaluate", 0, Session(), timeout=40)
            harness = await (await asyncio.create_subprocess_exec("true")).wait()
            try:
                bomb_value: Any = await call
            except (TaskCallFailed, TaskProcessError) as e:
                bomb_value = e
            hit = bomb.bounds_hit()
            record = bomb.evidence()["bounds"]
        return {"good": good_value, "harness": harness, "bomb": bomb_value, "hit": hit, "record": record}

    out = run(go())
    assert out["good"] == [1.0], out
    assert out["harness"] == 0
    assert out["hit"].get("pids_max", 0) > 0, out  # the cgroup refused the bomb's forks
    assert out["record"]["enforced_by"]["pids"].startswith("cgroup v"), out["record"]
    assert not any(Path(f).exists() for f in out["record"]["cgroup"]["folders"])  # removed with the process


def test_rlimits_stand_in_where_no_cgroup_can_be_made(tmp_path: Path) -> None:
    """Without a cgroup (``ALE_TASK_CGROUP=off``, or none the host lets us make):
    RLIMIT_NPROC (for the unprivileged uid) and RLIMIT_DATA, recorded as such."""
    require(JAIL, "no bubblewrap, or ALE_TASK_SANDBOX=off")
    d = candidate(tmp_path, "fallback", """
        import json, os, sys
        out = {}
        blocks = []
        try:
            for _ in range(64):  # at most 1 GiB, the second guard
                blocks.append(bytearray(16 << 20))
            out["memory"] = "allocated 1 GiB"
        except MemoryError:
            out["memory"] = "MemoryError after %d MiB" % (16 * len(blocks))
        del blocks
        kids, err = [], None
        try:
            for _ in range(200):  # the second guard: 200 at most
                pid = os.fork()
                if pid == 0:
                    import time
                    time.sleep(5)
                    os._exit(0)
                kids.append(pid)
        except OSError as e:
            err = e.strerror
        for k in kids:
            os.kill(k, 9)
        out["forks"] = [len(kids), err]
        print(json.dumps(out))
    """)
    value, evidence, hit = run(grade(d, small(cgroup=False, pids=32, memory=512 * MiB)))
    assert not isinstance(value, Exception), value
    seen = json.loads(value["stdout"])
    b = evidence["bounds"]
    assert b["cgroup"] is None and hit == {}
    assert seen["memory"].startswith("MemoryError"), seen
    assert b["enforced_by"]["memory_bytes"] == "RLIMIT_DATA (each process)"
    if b["uid"]["uid"] != 0 and b["uid"]["uid"] != os.getuid():
        assert b["enforced_by"]["pids"].startswith("RLIMIT_NPROC"), b
        assert seen["forks"][0] < 32 and seen["forks"][1], seen
    else:
        assert b["enforced_by"]["pids"] is None  # recorded as not bounded


# -- a disk fill -----------------------------------------------------------------------
FILL = """
    import errno, json, os
    out = {}
    chunk = b"x" * (1 << 20)
    for place in ("/tmp/fill", os.path.expanduser("~/fill"), "/dev/shm/fill"):
        n = 0
        try:
            with open(place, "wb") as f:
                while n < (256 << 20):  # the second guard: never more than 256 MiB
                    f.write(chunk)
                    f.flush()
                    n += len(chunk)
            out[place] = ["no error", n]
        except OSError as e:
            out[place] = [errno.errorcode.get(e.errno), n]
        with open("/proc/self/mounts") as m:
            out[place].append([l.split()[2] for l in m if l.split()[1] in ("/tmp", "/dev/shm")])
        os.remove(place)
    print(json.dumps(out))
"""


@needs_jail
def test_a_disk_fill_stops_at_the_cap_without_filling_the_host(tmp_path: Path) -> None:
    d = candidate(tmp_path, "fill", FILL)

    async def go() -> tuple[Any, dict[str, Any], int]:
        async with TaskProcess(d, bounds=small(disk=32 * MiB, memory=512 * MiB)) as proc:
            value = await proc.call("evaluate", 0, Session(), timeout=60)
            assert proc._home is not None
            on_host = sum(p.stat().st_size for p in proc._home.rglob("*") if p.is_file())
            return value, proc.evidence(), on_host

    value, evidence, on_host = run(go())
    seen = json.loads(value["stdout"])
    home = evidence["bounds"]["disk"]["places"][1]
    for place in ("/tmp/fill", f"{home}/fill", "/dev/shm/fill"):
        code, written, _ = seen[place]
        assert code == "ENOSPC" and written <= 32 * MiB, seen
    assert on_host == 0  # nothing of it on the host's disk
    assert evidence["bounds"]["limits"]["disk_bytes"] == 32 * MiB
    assert evidence["bounds"]["enforced_by"]["disk_bytes"] == "tmpfs size"


# -- a memory hog ----------------------------------------------------------------------
HOG = """
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # the second guard: 3 GiB of address space
    blocks = []
    for _ in range(64):  # 1 GiB at most, every page touched
        blocks.append(bytearray(b"x" * (16 << 20)))
    print("allocated", 16 * len(blocks), "MiB")
"""


@needs_cgroup
def test_a_memory_hog_is_killed_inside_its_cgroup_and_nothing_else(tmp_path: Path) -> None:
    d = candidate(tmp_path, "hog", HOG)
    sentinel = subprocess.Popen(["sleep", "60"])  # a process of the host: the OOM killer must not touch it
    try:
        value, evidence, hit = run(grade(d, small(memory=128 * MiB)))
        assert sentinel.poll() is None
    finally:
        sentinel.kill()
        sentinel.wait()
    # the candidate's program was killed (or got MemoryError); the grader's own call may fail too
    if not isinstance(value, Exception):
        assert value["rc"] == -9 or "MemoryError" in value["stderr"], value
    assert hit.get("oom_kills", 0) >= 1 or (not isinstance(value, Exception) and "MemoryError" in value["stderr"]), hit
    assert evidence["bounds"]["enforced_by"]["memory_bytes"].startswith("cgroup v")


@needs_cgroup
def test_the_jails_tmpfs_counts_against_its_memory(tmp_path: Path) -> None:
    """/tmp is memory: filling it past the memory bound (under the disk cap) ends in
    the task process's cgroup, not in the host's memory."""
    d = evaluate_only_task(tmp_path, "tmpmem", """
        r = subprocess.run(["sh", "-c", "head -c 200000000 /dev/zero > /tmp/fill"], capture_output=True, text=True)
        return {"rc": r.returncode, "stderr": r.stderr}
    """)
    value, _, hit = run(grade(d, small(memory=96 * MiB, disk=256 * MiB)))
    # the writer or the whole task process is killed by its cgroup's OOM killer
    assert isinstance(value, TaskProcessError) or value["rc"] != 0, value
    assert hit.get("oom_kills", 0) >= 1, hit


# -- a CPU burner ------------------------------------------------------------------------
@needs_jail
def test_a_cpu_burner_is_stopped_at_its_cpu_time(tmp_path: Path) -> None:
    """RLIMIT_CPU: SIGXCPU at the bound, SIGKILL five seconds of CPU later."""
    d = candidate(tmp_path, "burn", """
        import time
        t = time.monotonic()
        while time.monotonic() - t < 20:  # the second guard: 20 s at most
            pass
    """)
    value, evidence, _ = run(grade(d, small(cpu_s=1)))
    assert value["rc"] in (-24, -9), value  # SIGXCPU, or SIGKILL
    assert evidence["bounds"]["enforced_by"]["cpu_s_per_process"] == "RLIMIT_CPU (each process)"


# -- who it runs as, what is writable, what is recorded --------------------------------
@needs_jail
def test_the_task_process_runs_unprivileged_with_only_its_capped_places_writable(tmp_path: Path) -> None:
    d = evaluate_only_task(tmp_path, "who", """
        import resource
        out = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
        for p in ("/x", "/tmp/x", os.path.expanduser("~/x"), "/dev/x", "/dev/shm/x", os.getcwd() + "/x"):
            try:
                open(p, "w").close()
                out[p] = "written"
            except OSError as e:
                out[p] = type(e).__name__
        out["cpu"] = list(resource.getrlimit(resource.RLIMIT_CPU))
        out["fsize"] = list(resource.getrlimit(resource.RLIMIT_FSIZE))
        out["oom"] = open("/proc/self/oom_score_adj").read().strip()
        return out
    """)
    value, evidence, _ = run(grade(d, small()))
    b = evidence["bounds"]
    assert b["limits"] == {"pids": 64, "memory_bytes": 256 * MiB, "disk_bytes": 32 * MiB,
                           "file_size_bytes": None, "cpu_s_per_process": 60}  # no RLIMIT_FSIZE: the tmpfs caps files
    assert value["cpu"] == [60, 65] and value["oom"] == "1000", value
    home = b["disk"]["places"][1]
    assert value["/tmp/x"] == value[f"{home}/x"] == value["/dev/shm/x"] == "written", value
    assert value["/x"] != "written" and value["/dev/x"] != "written" and value[str(d) + "/x"] != "written", value
    if os.geteuid() == 0:
        assert b["uid"] == {"uid": 65534, "by": "setpriv in the jail"}, b["uid"]
        assert value["uid"] == value["gid"] == 65534 and value["groups"] in ([], [65534]), value
    else:
        assert b["uid"]["uid"] == os.geteuid()
    if CGROUP is not None:
        assert b["cgroup"]["version"] in (1, 2) and b["enforced_by"]["memory_bytes"].startswith("cgroup v")


@needs_jail
def test_no_bounds_when_switched_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = evaluate_only_task(tmp_path, "off", "return os.getuid()")
    monkeypatch.setenv("ALE_TASK_LIMITS", "off")
    value, evidence, _ = run(grade(d, "env"))  # type: ignore[arg-type]
    assert evidence["bounds"] is None and value == os.geteuid()


def test_bounds_from_the_environment() -> None:
    b = TaskBounds.from_env({"ALE_TASK_PIDS": "100", "ALE_TASK_MEMORY": "1.5G", "ALE_TASK_DISK": "512M",
                             "ALE_TASK_CPU": "off", "ALE_TASK_UID": "4242", "ALE_TASK_CGROUP": "/ale.slice"})
    assert b is not None
    assert (b.pids, b.memory, b.disk, b.cpu_s, b.uid, b.cgroup, b.cgroup_parent) == (
        100, 1536 * MiB, 512 * MiB, None, 4242, True, "/ale.slice")
    d = TaskBounds.from_env({})
    assert d is not None and d.pids == 512 and d.disk == 2048 * MiB and d.uid == 65534
    assert d.memory is not None and 0 < d.memory <= 4096 * MiB
    off = TaskBounds.from_env({"ALE_TASK_CGROUP": "off", "ALE_TASK_UID": "off"})
    assert off is not None and off.cgroup is False and off.uid is None
    assert TaskBounds.from_env({"ALE_TASK_LIMITS": "off"}) is None
    with pytest.raises(ValueError, match="ALE_TASK_MEMORY"):
        TaskBounds.from_env({"ALE_TASK_MEMORY": "lots"})


# -- cgroup detection: v1 (this host), v2 (most machines), hybrid -------------------------
V1_MOUNTINFO = [
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids",
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
]
V2_MOUNTINFO = ["30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate"]


def test_cgroup_hierarchies_are_read_from_mountinfo_and_proc_self_cgroup() -> None:
    m = cgroup_mounts(V1_MOUNTINFO)
    assert m["memory"] == (Path("/sys/fs/cgroup/memory"), "/") and m["pids"][0] == Path("/sys/fs/cgroup/pids")
    assert m["v2"][0] == Path("/sys/fs/cgroup/unified")
    assert cgroup_mounts(V2_MOUNTINFO) == {"v2": (Path("/sys/fs/cgroup"), "/")}
    own = own_cgroups(["8:pids:/", "4:memory:/process_api/abc", "0::/"])
    assert own == {"pids": "/", "memory": "/process_api/abc", "v2": "/"}
    assert own_cgroups(["0::/user.slice/user-1000.slice/session-2.scope"]) == {"v2": "/user.slice/user-1000.slice/session-2.scope"}


def test_on_cgroup_v2_the_task_cgroup_is_made_beside_the_harness_with_its_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """v2 forbids children of a cgroup that holds processes: the task process's cgroup
    is made beside the harness's (its parent hands the controllers down), with
    memory.max, no swap, memory.oom.group and pids.max. Checked on a folder shaped
    like a v2 hierarchy (this host is v1)."""
    root = tmp_path / "cg"
    (root / "user.slice" / "session-2.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "user.slice" / "cgroup.subtree_control").write_text("memory pids\n")
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *a: Any, **k: Any) -> None:  # the kernel fills a new cgroup's files
        real_mkdir(self, *a, **k)
        if str(self).startswith(str(root)):
            (self / "cgroup.controllers").write_text("memory pids\n")
            (self / "cgroup.procs").write_text("")

    monkeypatch.setattr(Path, "mkdir", mkdir)
    cg, notes = make_cgroup("ale-task-x", small(memory=100 * MiB, pids=50), mounts={"v2": (root, "/")},
                            own={"v2": "/user.slice/session-2.scope"})
    assert isinstance(cg, TaskCgroup) and cg.version == 2, notes
    d = root / "user.slice" / f"ale-task-x.{os.getpid()}"
    assert cg.folders() == [d] and cg.procs_files() == [str(d / "cgroup.procs")]
    assert (d / "memory.max").read_text() == str(100 * MiB) and (d / "pids.max").read_text() == "50"
    assert (d / "memory.swap.max").read_text() == "0" and (d / "memory.oom.group").read_text() == "1"
    # an operator's delegated cgroup (ALE_TASK_CGROUP) instead
    (root / "ale.slice").mkdir()
    cg2, _ = make_cgroup("ale-task-y", small(cgroup_parent="/ale.slice"), mounts={"v2": (root, "/")},
                         own={"v2": "/user.slice/session-2.scope"})
    assert cg2 is not None and cg2.folders() == [root / "ale.slice" / f"ale-task-y.{os.getpid()}"]
    # a v2 hierarchy without the controllers (they are v1's): v1 is used, or nothing
    (root / "cgroup.controllers").write_text("hugetlb\n")
    none, notes = make_cgroup("ale-task-z", small(), mounts={"v2": (root, "/")}, own={"v2": "/"})
    assert none is None and any("controllers" in n for n in notes)


@needs_cgroup
def test_a_dead_harnesss_task_cgroups_are_swept() -> None:
    """A harness killed before it closed its task processes leaves empty cgroups; the
    next one made beside them removes them (never those of a harness still running)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    cg, _ = make_cgroup("ale-task-live", small())
    assert cg is not None
    try:
        parents = [d.parent for d in cg.folders()]
        stale = [p / f"ale-task-stale.{dead.pid}" for p in parents]
        mine = [p / f"ale-task-mine.{os.getpid()}" for p in parents]
        for d in [*stale, *mine]:
            d.mkdir()
        again, _ = make_cgroup("ale-task-next", small())
        assert again is not None
        again.remove()
        assert not any(d.exists() for d in stale) and all(d.exists() for d in mine)
    finally:
        cg.remove()
        for d in mine:
            d.rmdir()


@needs_jail
def test_a_task_folder_another_uid_cannot_read_keeps_the_harness_uid(tmp_path: Path) -> None:
    """Dropping to the unprivileged uid must not break a task whose files only root
    reads: the process keeps the harness's uid, and the record says why."""
    require(os.geteuid() == 0, "the uid is dropped only when ale runs as root (CI runs as root)")
    d = evaluate_only_task(tmp_path, "private", "return os.getuid()")
    (d / "main.py").chmod(0o600)
    value, evidence, _ = run(grade(d, small()))
    assert value == 0
    assert evidence["bounds"]["uid"]["by"] is None and "main.py" in evidence["bounds"]["uid"]["why"]
