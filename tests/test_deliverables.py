from __future__ import annotations

import hashlib
import os

import pytest

from ale.grading.deliverables import extract_deliverables


def test_copies_regular_files_and_skips_everything_else(tmp_path):
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("alpha")
    (ws / "sub" / "b.bin").write_bytes(b"\x00\x01")
    (ws / "link").symlink_to("/etc/passwd")
    os.link(ws / "a.txt", ws / "hard")
    os.mkfifo(ws / "fifo")
    (ws / "suid").write_text("x")
    os.chmod(ws / "suid", 0o4755)
    m = extract_deliverables(ws, tmp_path / "out", max_files=100, max_bytes=10**6)
    paths = {f.path for f in m.files}
    assert paths == {"a.txt", "hard", "sub/b.bin"}  # a hard-linked file: copied under each of its names
    assert (tmp_path / "out" / "hard").read_text() == "alpha" and not (tmp_path / "out" / "hard").samefile(ws / "a.txt")
    reasons = {s.path: s.reason for s in m.skipped}
    assert reasons["link"] == "symlink" and "hard" not in reasons and "a.txt" not in reasons
    assert "regular" in reasons["fifo"] and reasons["suid"] == "setuid/setgid"
    assert not (tmp_path / "out" / "link").exists()
    f = next(f for f in m.files if f.path == "sub/b.bin")
    assert f.sha256 == hashlib.sha256(b"\x00\x01").hexdigest()


def test_caps_on_count_and_size(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(5):
        (ws / f"f{i}").write_bytes(b"x" * 100)
    m = extract_deliverables(ws, tmp_path / "o1", max_files=3, max_bytes=10**6)
    assert len(m.files) == 3 and sum("count cap" in s.reason for s in m.skipped) == 2
    m = extract_deliverables(ws, tmp_path / "o2", max_files=100, max_bytes=250)
    assert len(m.files) == 2 and m.total_bytes == 200


def test_refuses_existing_destination(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        extract_deliverables(tmp_path / "ws", tmp_path / "out", max_files=1, max_bytes=1)


def test_a_link_to_a_file_inside_the_workspace_is_copied_as_that_file(tmp_path):
    """As the grader would read it on ALE's VM; a link that leaves the workspace
    (to the reference, the host, a loop, a folder, another link) is still skipped."""
    ws = tmp_path / "ws"
    (ws / "final").mkdir(parents=True)
    (ws / "final" / "answer.json").write_text('{"v": 1}')
    (ws / "submission.json").symlink_to("final/answer.json")
    (ws / "final" / "again.json").symlink_to("../final/./answer.json")
    (ws / "abs.json").symlink_to("/workspace/final/answer.json")
    (ws / "ref.json").symlink_to("../reference/answer.json")
    (ws / "host").symlink_to("/etc/passwd")
    (ws / "chain").symlink_to("submission.json")
    (ws / "folder").symlink_to("final")
    (ws / "loop").symlink_to("loop")
    (ws / "up").symlink_to("final/../../ws/final/answer.json")
    m = extract_deliverables(ws, tmp_path / "out", max_files=100, max_bytes=10**6, mount_point="/workspace")
    copied = {f.path for f in m.files}
    assert copied == {"final/answer.json", "submission.json", "final/again.json", "abs.json"}
    assert (tmp_path / "out" / "submission.json").read_text() == '{"v": 1}'
    assert not (tmp_path / "out" / "submission.json").is_symlink()
    reasons = {s.path: s.reason for s in m.skipped}
    assert reasons == {n: "symlink" for n in ("ref.json", "host", "chain", "folder", "loop", "up")}
    # Without the mount point an absolute target is never resolved.
    m2 = extract_deliverables(ws, tmp_path / "out2", max_files=100, max_bytes=10**6)
    assert "abs.json" not in {f.path for f in m2.files}
