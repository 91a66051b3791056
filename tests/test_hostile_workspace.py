"""Whatever the candidate leaves in its workspace, and whatever bytes its agent
sends or receives, the run ends with a final status and a complete signed record
that ``ale verify`` accepts.

Three parts: real runs (replay agent) that leave hostile workspaces; a
property-based test of ``extract_deliverables`` over workspaces generated on the
host; and the event log and the trajectory given hostile strings and bytes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import socket
import stat
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ale import lossless
from ale.agents.trajectory import TrajectoryWriter, load_trajectory
from ale.grading.deliverables import SAFE_NAME_PREFIX, DeliverablesManifest, extract_deliverables
from ale.record.evidence import EventLog, read_chain, to_json_text
from ale.record.verify import _name_problems, verify_run_dir

IS_ROOT = os.geteuid() == 0
# ALE_HYPOTHESIS_EXAMPLES=N runs every property test with N examples (a longer hunt).
_EXAMPLES = int(os.environ.get("ALE_HYPOTHESIS_EXAMPLES", "0"))


def examples(n: int) -> int:
    return _EXAMPLES or n


# -- helpers ------------------------------------------------------------------------
def entries_by_name(m: DeliverablesManifest) -> dict[str, dict[bytes, object]]:
    """The manifest's entries by the exact bytes of their workspace path."""
    return {
        kind: {lossless.name_bytes(e.path, e.path_b64): e for e in items}
        for kind, items in (("files", m.files), ("dirs", m.directories), ("skipped", m.skipped))
    }


# -- (a) real runs --------------------------------------------------------------------
BUILD_NAMES = r'''
import os, hashlib
os.chdir("/workspace")
def put(name, data=b"x"):
    with open(name, "wb") as f:
        f.write(data)
put(b"\xff\xfe-bad", b"undecodable")
put(b"lat\xe9")
put(b"new\nline", b"nl")
put(b"tab\there")
put(b"back\\slash", b"bs")
put(b"L" * 255, b"long")
put(b"\xff" * 255, b"long and undecodable")
# A valid name equal to the safe name the harness would pick for b"\xff\xfe-bad".
put(("_ale-name-" + hashlib.sha256(b"\xff\xfe-bad").hexdigest()[:16]).encode(), b"decoy")
os.mkdir(b"\xc0dir")
put(b"\xc0dir/inner.txt", b"inside an undecodable folder")
# Deeper than Python's recursion limit.
os.mkdir("deep"); os.chdir("deep")
for _ in range(1200):
    os.mkdir("d"); os.chdir("d")
put(b"leaf", b"deep")
os.chdir("/workspace")
# Longer than PATH_MAX.
os.mkdir("long"); os.chdir("long")
for _ in range(20):
    os.mkdir("P" * 250); os.chdir("P" * 250)
put(b"leaf", b"far")
os.chdir("/workspace")
put(b"answer.json", b'{"words": 1, "lines": 1}\n')
'''

BUILD_TYPES = r'''
import os, socket
os.chdir("/workspace")
def put(name, data=b"x", mode=None):
    with open(name, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(name, mode)
os.mkdir("closed"); put("closed/inside", b"s"); os.chmod("closed", 0)
put("nope", b"t", 0)
put("writeonly", b"w", 0o200)
os.mkfifo("fifo")
s = socket.socket(socket.AF_UNIX); s.bind("/workspace/sock")
os.symlink("loopa", "loopb"); os.symlink("loopb", "loopa")
os.symlink("/", "root"); os.symlink(".", "self"); os.symlink("/etc/passwd", "passwd")
put("h1", b"h"); os.link("h1", "h2")
with open("sparse", "wb") as f:
    f.truncate(100 * 1024**3)
put("suid", b"s", 0o4755); put("sgid", b"g", 0o2755); put("sticky", b"k", 0o1644)
os.mkdir("empty")
put("answer.json", b'{"words": 1, "lines": 1}\n', 0o444)
'''

BUILD_MANY = r'''
import os
os.mkdir("/workspace/many")
for i in range(50000):
    with open("/workspace/many/f%05d" % i, "wb") as f:
        f.write(b"x")
with open("/workspace/answer.json", "w") as f:
    f.write('{"words": 1, "lines": 1}\n')
'''


def _script_file(tmp: Path, steps: list[dict]) -> str:
    """A replay script on disk: its text may hold escapes (lone surrogates) that a
    plan (UTF-8 JSON) could not."""
    p = tmp / f"script-{uuid.uuid4().hex[:8]}.json"
    p.write_text(json.dumps(steps))  # ensure_ascii: "\ud800" is written as an escape
    return str(p)


def _hostile_run(docker_client, tmp_path: Path, steps: list[dict]):
    from ale.plan import AgentSpec, Limits, RunPlan
    from ale.runs.lifecycle import execute_run
    from ale.sandbox.docker import DockerProvider
    from ale.sandbox.policy import IsolationPolicy
    from tests.conftest import EXAMPLES, TOOLS_IMAGE, our_containers

    plan = RunPlan(
        run_id=f"hostile-{uuid.uuid4().hex[:10]}",
        task_dir=str(EXAMPLES / "files" / "word_count"),
        agent=AgentSpec(name="replay", config={"script": _script_file(tmp_path, steps)}),
        image=TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * 1024**2),
        limits=Limits(wall_time_s=300),
        runs_dir=str(tmp_path / "runs"),
    )
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    run_dir = plan.run_dir
    assert our_containers(docker_client, **{"ale.run_id": plan.run_id}) == [], "a container outlived its run"
    assert not (Path(plan.runs_dir) / ".scratch" / plan.run_id).exists(), "scratch folder left behind"
    assert result.status.value in {"scored", "agent_failed", "timeout"}, (result.status, result.error)
    assert (run_dir / "result.json").is_file() and (run_dir / "attestation.dsse.json").is_file()
    report = verify_run_dir(run_dir)
    assert report.valid, report.reasons
    manifest = DeliverablesManifest.model_validate_json((run_dir / "deliverables.json").read_bytes())
    assert _name_problems(manifest) == []
    return result, run_dir, manifest


def _py(source: str) -> dict:
    return {"tool": "shell", "args": {"command": f"python3 - <<'ALE_EOF'\n{source}\nALE_EOF", "timeout": 240}}


@pytest.mark.docker
def test_names_depth_and_hostile_tool_bytes(docker_client, tmp_path):
    steps = [
        _py(BUILD_NAMES),
        # Output that is not UTF-8, with NULs; and arguments with lone surrogates.
        {"tool": "shell", "args": {"command": r"printf '\377\376\000abc\300'; printf '\377' >&2"}},
        {"tool": "shell", "args": {"command": "echo \ud800", "\udcffkey": "v\udfff", "nested": ["\ud83d\ude00", "\udcff"]}},
        {"tool": "write_file", "args": {"path": "/workspace/s.txt", "content": "a\ud800b"}},
        {"tool": "write_file", "args": {"path": "/workspace/b64", "content_b64": "!!not base64"}},
        {"tool": "read_file", "args": {"path": "/workspace/\udcff"}},
        {"tool": "list_dir", "args": {"path": "/workspace"}},
    ]
    result, run_dir, m = _hostile_run(docker_client, tmp_path, steps)
    assert result.status.value == "scored", result.error
    by = entries_by_name(m)
    files = by["files"]
    for name in (b"\xff\xfe-bad", b"lat\xe9", b"new\nline", b"tab\there", b"back\\slash", b"L" * 255, b"\xff" * 255,
                 b"\xc0dir/inner.txt", b"answer.json"):
        assert name in files, name
    decoy = ("_ale-name-" + hashlib.sha256(b"\xff\xfe-bad").hexdigest()[:16]).encode()
    assert files[decoy].stored_as is None  # the valid name keeps its name ...
    bad = files[b"\xff\xfe-bad"]
    assert bad.path == "\\xff\\xfe-bad" and base64.b64decode(bad.path_b64) == b"\xff\xfe-bad"
    assert bad.stored_as is not None and bad.stored_as.startswith(SAFE_NAME_PREFIX) and bad.stored_as != decoy.decode()
    assert (run_dir / "deliverables" / bad.stored_as).read_bytes() == b"undecodable"
    assert (run_dir / "deliverables" / files[b"new\nline"].stored_path).read_bytes() == b"nl"
    inner = files[b"\xc0dir/inner.txt"]
    assert inner.stored_as is not None and inner.stored_as.endswith("/inner.txt")
    assert b"\xc0dir" in by["dirs"]
    assert files[b"back\\slash"].stored_as is not None  # a backslash is not kept in the signed folder
    # Depth: the 256th level is recorded, not visited; PATH_MAX: the copy that cannot fit is skipped.
    skipped = by["skipped"]
    too_deep = [p for p, e in skipped.items() if p.startswith(b"deep/") and "depth limit" in e.reason]
    assert len(too_deep) == 1 and too_deep[0].count(b"/") == 256
    too_long = [e for p, e in skipped.items() if p.startswith(b"long/") and "path too long" in e.reason]
    assert len(too_long) == 1
    assert m.limits is not None and m.limits.max_depth == 256 and m.stopped is None
    # The trajectory: every step recorded, the exact bytes kept, refusals named.
    traj = load_trajectory(run_dir / "trajectory.json")
    steps_ = traj.steps
    assert len(steps_) == len(steps)
    out = steps_[1]
    ref = out.files["stdout"]
    assert ref.kind == "bytes" and (run_dir / ref.path).read_bytes() == b"\xff\xfe\x00abc\xc0"
    assert (run_dir / out.files["stderr"].path).read_bytes() == b"\xff"
    sur = steps_[2]
    assert not sur.ok and "not valid Unicode" in (sur.error or "")
    cmd = sur.files["args.command"]
    assert cmd.kind == "text-surrogatepass"
    assert (run_dir / cmd.path).read_bytes().decode("utf-8", "surrogatepass") == "echo \ud800"
    restored = lossless.restore(json.loads((run_dir / "trajectory.json").read_text())["steps"][2]["args"])
    assert restored["nested"] == ["😀", "\udcff"]  # nested values: ale.lossless.json_safe (JSON joined the pair)
    value = sur.files["args.\\udcffkey"]  # a top-level value: display text inline, exact in its file
    assert restored["\udcffkey"] == "v\\udfff" and (run_dir / value.path).read_bytes() == "v\udfff".encode("utf-8", "surrogatepass")
    assert not steps_[3].ok and "not valid Unicode" in (steps_[3].error or "")
    assert not steps_[4].ok and "base64" in (steps_[4].error or "")
    assert not steps_[5].ok
    listing = steps_[6]
    assert listing.ok and listing.files["output"].kind == "bytes"
    assert b"\xff\xfe-bad\n" in (run_dir / listing.files["output"].path).read_bytes()


@pytest.mark.docker
def test_special_files_modes_links_and_sparse(docker_client, tmp_path):
    t0 = time.monotonic()
    result, run_dir, m = _hostile_run(docker_client, tmp_path, [_py(BUILD_TYPES)])
    assert result.status.value == "scored", result.error
    by = entries_by_name(m)
    files, skipped = by["files"], by["skipped"]
    reasons = {p: e.reason for p, e in skipped.items()}
    assert reasons[b"fifo"] == "not a regular file (fifo)" and reasons[b"sock"] == "not a regular file (socket)"
    for link in (b"loopa", b"loopb", b"root", b"self", b"passwd"):
        assert reasons[link] == "symlink"
    # Hard links: copied under each name (both inside the workspace, the candidate's own content).
    assert b"h1" not in reasons and b"h2" not in reasons and files[b"h1"].sha256 == files[b"h2"].sha256
    assert reasons[b"suid"] == reasons[b"sgid"] == "setuid/setgid"
    assert "size cap" in reasons[b"sparse"] and skipped[b"sparse"].size == 100 * 1024**3
    assert time.monotonic() - t0 < 60  # the sparse file was never read
    if IS_ROOT:  # root reads what the candidate made unreadable, and keeps its mode
        assert files[b"nope"].mode == 0 and files[b"closed/inside"].size == 1
        assert by["dirs"][b"closed"].mode == 0
        assert stat.S_IMODE((run_dir / "deliverables" / "nope").stat().st_mode) == 0
        assert files[b"writeonly"].mode == 0o200
    assert files[b"sticky"].mode == 0o1644
    assert files[b"answer.json"].mode == 0o444 and b"empty" in by["dirs"]


@pytest.mark.docker
def test_fifty_thousand_files(docker_client, tmp_path):
    result, _run_dir, m = _hostile_run(docker_client, tmp_path, [_py(BUILD_MANY)])
    assert result.status.value == "scored", result.error
    # The default count cap is the copy's entry budget (100,000): every file is copied.
    assert len(m.files) == 50_001 and m.limits is not None and m.limits.max_files == 100_000
    assert m.files[0].path == "answer.json"  # a folder's files before its subfolders
    assert m.entries_visited == 50_002  # many/, its files and answer.json
    assert "warnings" not in result.extra


# -- extract_deliverables on the host: limits -------------------------------------------
def test_time_limit_skips_the_rest_with_its_reason(tmp_path):
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    for i in range(5):
        (ws / f"f{i}").write_text("x")
        (ws / "sub" / f"g{i}").write_text("y")
    m = extract_deliverables(ws, tmp_path / "out", max_files=100, max_bytes=10**6, time_limit_s=0)
    assert m.files == [] and m.stopped == "time limit"
    assert {s.path for s in m.skipped} == {f"f{i}" for i in range(5)} | {"sub"}
    assert all("time limit" in s.reason and s.limit == "time" for s in m.skipped)


def test_entry_limit_bounds_the_walk(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(2000):
        (ws / f"d{i:04d}").mkdir()
    t0 = time.monotonic()
    m = extract_deliverables(ws, tmp_path / "out", max_files=10, max_bytes=10**6, max_entries=500)
    assert time.monotonic() - t0 < 10
    assert m.entries_visited == 500 and m.stopped == "entry limit"
    assert len(m.directories) == 500
    assert [s.path for s in m.skipped if "entry limit" in s.reason] == ["."]
    assert [s.path for s in m.skipped if s.limit == "entries"] == ["."]


def test_an_environment_that_sorts_first_never_starves_a_nested_answer(tmp_path):
    """hg002 writes its answers under output/submission/; a tool environment beside it
    (.conda_env, node_modules, a venv) that fills the entry budget is visited after
    the ordinary folders, wherever its name sorts (round 4: a correct answer scored 0)."""
    ws = tmp_path / "ws"
    for heavy in (".conda_env", "node_modules", "env", "Cache"):
        (ws / heavy).mkdir(parents=True)
        for i in range(60):
            (ws / heavy / f"f{i:03d}").write_text("x")
    (ws / "submission" / "calls").mkdir(parents=True)
    (ws / "submission" / "calls" / "hg002.vcf").write_text("answer")
    (ws / "report.md").write_text("r")
    m = extract_deliverables(ws, tmp_path / "out", max_files=1000, max_bytes=10**6, max_entries=100)
    copied = {f.path for f in m.files}
    assert {"report.md", "submission/calls/hg002.vcf"} <= copied, sorted(copied)[:5]
    assert m.stopped == "entry limit" and any(s.limit == "entries" for s in m.skipped)
    assert [d.path for d in m.directories][:2] == ["submission", "submission/calls"]


def test_a_missing_workspace_is_recorded_not_raised(tmp_path):
    m = extract_deliverables(tmp_path / "gone", tmp_path / "out", max_files=1, max_bytes=1)
    assert m.files == [] and m.skipped[0].path == "." and "cannot be opened" in m.skipped[0].reason


def test_a_file_larger_than_what_is_left_is_never_read(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with open(ws / "sparse", "wb") as f:
        f.truncate(1 << 40)
    t0 = time.monotonic()
    m = extract_deliverables(ws, tmp_path / "out", max_files=10, max_bytes=1 << 30)
    assert time.monotonic() - t0 < 5
    assert m.skipped[0].reason == f"total size cap of {1 << 30} bytes reached" and m.skipped[0].size == 1 << 40
    assert m.skipped[0].limit == "bytes"


def test_each_skip_names_the_limit_that_kept_it_out_or_none(tmp_path):
    """The run's warning is raised from ``limit``, never from the reason's wording."""
    ws = tmp_path / "ws"
    (ws / "a" / "b" / "c").mkdir(parents=True)
    (ws / "link").symlink_to("/etc/passwd")
    os.mkfifo(ws / "fifo")
    for i in range(3):
        (ws / f"f{i}").write_text("x")
    (ws / ("n" * 200)).write_text("y")
    m = extract_deliverables(ws, tmp_path / "out", max_files=2, max_bytes=10**6, max_depth=2)
    limits = {s.path: s.limit for s in m.skipped}
    assert limits["link"] is None and limits["fifo"] is None
    assert limits["a/b/c"] == "depth"
    assert sorted(p for p, v in limits.items() if v == "files") == ["f2", "n" * 200]


# -- (b) property: any workspace -----------------------------------------------------------
NAME_BYTES = st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"/", b"_").replace(b"\0", b"_")).filter(
    lambda b: b not in (b".", b".."))
NAMES = st.one_of(
    NAME_BYTES,
    st.sampled_from([b"a", b"new\nline", b"back\\slash", b"\xff", b"\xc0\x80", b"\xed\xa0\x80", "é".encode(),
                     b"_ale-name-0000000000000000", b"x" * 255, b"\xfe" * 255, b" ", b"-"]),
)
FILE_MODES = st.sampled_from([0o644, 0o600, 0o000, 0o444, 0o755, 0o4755, 0o2755, 0o1644, 0o200])
DIR_MODES = st.sampled_from([0o755, 0o700, 0o000, 0o555, 0o1777]) if IS_ROOT else st.just(0o755)

ENTRY = st.deferred(lambda: st.one_of(
    st.tuples(st.just("file"), st.binary(max_size=64), FILE_MODES),
    st.tuples(st.just("symlink"), st.binary(min_size=1, max_size=60).map(lambda b: b.replace(b"\0", b"_"))),
    st.tuples(st.just("fifo")),
    st.tuples(st.just("socket")),
    st.tuples(st.just("hardlink")),
    st.tuples(st.just("chain"), st.integers(1, 40)),
    st.tuples(st.just("dir"), st.dictionaries(NAMES, ENTRY, max_size=4), DIR_MODES),
))
TREE = st.dictionaries(NAMES, ENTRY, max_size=8)


def _build(root: bytes, tree: dict, made: list[bytes], dir_modes: list[tuple[bytes, int]]) -> None:
    for name, spec in tree.items():
        path = root + b"/" + name
        kind = spec[0]
        if kind == "file":
            with open(path, "wb") as f:
                f.write(spec[1])
            os.chmod(path, spec[2])
            made.append(path)
        elif kind == "symlink":
            os.symlink(spec[1], path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":
            if len(path) > 100:  # sun_path holds 108 bytes
                continue
            s = socket.socket(socket.AF_UNIX)
            try:
                s.bind(path)
            finally:
                s.close()
        elif kind == "hardlink":
            target = next((p for p in made if os.path.isfile(p)), None)
            if target is None:
                continue
            os.link(target, path)
        elif kind == "chain":
            os.mkdir(path)
            p = path
            for _ in range(spec[1]):
                p += b"/c"
                os.mkdir(p)
            with open(p + b"/leaf", "wb") as f:
                f.write(b"leaf")
        elif kind == "dir":
            os.mkdir(path)
            _build(path, spec[1], made, dir_modes)
            dir_modes.append((path, spec[2]))


def _on_disk(root: bytes) -> dict[bytes, str]:
    """Every entry below root (relative, exact bytes) and its kind, walked as root walks it."""
    out: dict[bytes, str] = {}
    stack = [b""]
    while stack:
        rel = stack.pop()
        for name in os.listdir(root + b"/" + rel if rel else root):
            r = rel + b"/" + name if rel else name
            st_ = os.lstat(root + b"/" + r)
            if stat.S_ISDIR(st_.st_mode):
                out[r] = "dir"
                stack.append(r)
            else:
                out[r] = "other"
    return out


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tree=TREE, max_files=st.integers(0, 20), max_bytes=st.integers(0, 400), max_depth=st.integers(1, 12),
       max_entries=st.integers(1, 200))
def test_any_workspace_is_accounted_for(tree, max_files, max_bytes, max_depth, max_entries):
    with tempfile.TemporaryDirectory() as tmp:
        ws = os.fsencode(tmp) + b"/ws"
        os.mkdir(ws)
        dir_modes: list[tuple[bytes, int]] = []
        _build(ws, tree, [], dir_modes)
        on_disk = _on_disk(ws)
        for path, mode in dir_modes:  # innermost first: the walk above needed them open
            os.chmod(path, mode)
        dest = Path(tmp) / "out"
        try:
            m = extract_deliverables(Path(os.fsdecode(ws)), dest, max_files=max_files, max_bytes=max_bytes,
                                     max_depth=max_depth, max_entries=max_entries, time_limit_s=60)
        finally:
            for path, _mode in reversed(dir_modes):
                os.chmod(path, 0o755)
        # The manifest is UTF-8 JSON and round-trips.
        text = m.model_dump_json()
        text.encode("utf-8")
        assert DeliverablesManifest.model_validate_json(text) == m
        assert _name_problems(m) == []
        by = entries_by_name(m)
        files, dirs, skipped = by["files"], by["dirs"], by["skipped"]
        # Every name maps back to an entry that exists, and nothing is both copied and skipped.
        for raw in [*files, *dirs, *(p for p in skipped if p != b".")]:
            assert raw in on_disk, raw
        assert not set(files) & set(skipped)
        # Every entry is accounted for: copied, recreated, skipped, or below a folder
        # recorded as not (completely) visited.
        cut = {p for p, e in skipped.items() if e.kind == "dir"}
        for raw in on_disk:
            if raw in files or raw in dirs or raw in skipped:
                continue
            parts = raw.split(b"/")
            assert b"." in cut or any(b"/".join(parts[:i]) in cut for i in range(1, len(parts))), raw
        # Copies hold the exact bytes of the file they name, within the caps.
        assert len(m.files) <= max_files and m.total_bytes <= max_bytes
        for raw, f in files.items():
            data = (dest / f.stored_path).read_bytes()
            with open(ws + b"/" + raw, "rb") as src:
                assert data == src.read()
            assert hashlib.sha256(data).hexdigest() == f.sha256
            assert f.stored_path.encode("utf-8") == raw or f.stored_as is not None
        stored = [os.path.relpath(os.path.join(d, n), dest) for d, _ds, ns in os.walk(dest) for n in ns]
        assert sorted(stored) == sorted(f.stored_path for f in m.files)
        for s in m.skipped:
            assert s.reason


# -- (c) the event log and the trajectory ------------------------------------------------
HOSTILE_TEXT = st.text(st.one_of(st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
                       max_size=50)
HOSTILE_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), HOSTILE_TEXT, st.binary(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(HOSTILE_TEXT, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=examples(200), deadline=None)
@given(values=st.lists(HOSTILE_VALUE, min_size=1, max_size=5))
def test_event_log_holds_any_strings_and_bytes(values):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        log = EventLog(path)
        for v in values:
            log.append("hostile\ud800", value=v)
        raw = path.read_bytes()
        raw.decode("utf-8")  # strict UTF-8, every line
        events, problems = read_chain(path)
        assert problems == [] and len(events) == len(values)
        for ev_, v in zip(events, values, strict=True):
            assert lossless.restore(ev_["data"]["value"]) == _json_normal(v)
        # A resumed log re-derives every hash from the lines alone.
        EventLog(path, resume=True).append("after")
        assert read_chain(path)[1] == []


def _json_normal(v):
    """What JSON makes of a value: tuples are lists, keys strings."""
    if isinstance(v, dict):
        return {k: _json_normal(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_normal(x) for x in v]
    return v


def test_event_log_huge_and_nul():
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        log = EventLog(path)
        big = "\x00" * 10 + "\ud800" + "é" * 2_000_000
        log.append("big", text=big, blob=b"\x00\xff" * 100_000, pair="\ud83d\ude00", joined="😀")
        events, problems = read_chain(path)
        assert problems == []
        data = lossless.restore(events[0]["data"])
        assert data["text"] == big and data["blob"] == b"\x00\xff" * 100_000
        assert data["pair"] == "\ud83d\ude00" and len(data["pair"]) == 2 and data["joined"] == "😀"


def test_evidence_json_holds_what_utf8_cannot():
    text = to_json_text({"name\udcff": "\ud800", "b": b"\xff", "ok": "é"})
    text.encode("utf-8")
    assert lossless.restore(json.loads(text)) == {"name\udcff": "\ud800", "b": b"\xff", "ok": "é"}
    assert to_json_text({"ok": "é"}) == '{"ok": "é"}\n'  # unchanged when nothing needs it
    literal = {"$base64": "not a marker", "$$x": 1, "n": {"$utf8_surrogatepass_base64": "AA=="}}
    assert lossless.restore(json.loads(to_json_text(literal))) == literal


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=HOSTILE_TEXT, raw=st.binary(max_size=200), key=HOSTILE_TEXT, big=st.booleans())
@example(text="0\x80\x80\ud800\U00010000\U00010000", raw=b"", key="", big=False)  # found by CI: args.n as a file
def test_trajectory_records_any_bytes_exactly(text, raw, key, big):
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        w = TrajectoryWriter(run_dir, "r", "a", inline_limit=64)
        raw = raw * 10 if big else raw
        w.record({"tool": "shell", "args": {"command": text, "x" + key: raw, "n": {"x": [text]}}, "ok": True,
                  "stdout": raw.decode("utf-8", "replace"), "stdout_bytes": raw, "stderr": text, "error": text})
        w.close(end="finished")
        doc = (run_dir / "trajectory.json").read_bytes()
        doc.decode("utf-8")
        step = load_trajectory(run_dir / "trajectory.json").steps[0]
        line = json.loads((run_dir / "trajectory.jsonl").read_text().split("\n")[0])  # not splitlines: U+2028 is text
        assert line["index"] == step.index == 1

        def exact(field: str, inline: str) -> bytes | str:
            ref = step.files.get(field)
            if ref is None:
                return inline
            data = (run_dir / ref.path).read_bytes()
            assert len(data) == ref.bytes and hashlib.sha256(data).hexdigest() == ref.sha256
            return data.decode("utf-8", "surrogatepass") if ref.kind in ("text", "text-surrogatepass") else data

        got = exact("stdout", step.stdout)
        assert got == raw or got == raw.decode("utf-8")
        assert exact("stderr", step.stderr) == text and exact("error", step.error or "") == text
        assert exact("args.command", step.args["command"]) == text
        nested = step.files.get("args.n")  # past the inline limit once encoded: a file of its JSON
        kept = step.args["n"] if nested is None else json.loads((run_dir / nested.path).read_bytes())
        assert nested is None or nested.kind == "json"
        assert lossless.restore(kept) == {"x": [text]}
        assert not any(k.startswith("stdout_bytes") for k in step.extra)
