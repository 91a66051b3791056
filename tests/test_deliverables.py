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


# -- issue 33: one budget, holes kept, folding, names taken all the same ------------------
def _sparse(path, data_at: dict[int, bytes], size: int) -> None:
    with open(path, "wb") as f:
        for off, data in data_at.items():
            f.seek(off)
            f.write(data)
        f.truncate(size)


def test_both_copies_keep_holes_and_hash_the_content(tmp_path):
    import hashlib

    from ale.grading.deliverables import extract_deliverables
    from ale.grading.grader import working_copy

    ws = tmp_path / "ws"
    ws.mkdir()
    size = 256 * 1024**2
    _sparse(ws / "s.bin", {0: b"head", 100 * 1024**2: b"middle"}, size)
    (ws / "empty").write_bytes(b"")
    (ws / "hole-only").write_bytes(b"")
    os.truncate(ws / "hole-only", 5 * 1024**2)
    m = extract_deliverables(ws, tmp_path / "d", max_files=10, max_bytes=1024**3)
    want = hashlib.sha256((ws / "s.bin").read_bytes()).hexdigest()
    got = {f.path: f for f in m.files}
    assert got["s.bin"].sha256 == want and got["s.bin"].size == size
    assert got["hole-only"].sha256 == hashlib.sha256(bytes(5 * 1024**2)).hexdigest()
    assert got["empty"].size == 0
    for root in (tmp_path / "d", working_copy(tmp_path / "d", tmp_path / "g" / "output", owner=None)):
        st = os.stat(root / "s.bin")
        assert st.st_size == size and st.st_blocks * 512 < 1024**2, (root, st)
        assert (root / "s.bin").read_bytes() == (ws / "s.bin").read_bytes()
        assert os.stat(root / "hole-only").st_size == 5 * 1024**2


def test_a_sparse_file_past_the_byte_cap_is_refused_by_its_apparent_size(tmp_path):
    from ale.grading.deliverables import extract_deliverables

    ws = tmp_path / "ws"
    ws.mkdir()
    _sparse(ws / "big", {0: b"x"}, 10 * 1024**3)
    m = extract_deliverables(ws, tmp_path / "d", max_files=10, max_bytes=1024**3)
    assert not m.files and m.skipped[0].limit == "bytes"


def test_one_path_budget_for_the_longest_base(tmp_path):
    from ale.grading.deliverables import PATH_MAX, extract_deliverables, path_budget

    ws = tmp_path / "ws"
    ws.mkdir()
    longer = tmp_path / ("x" * 200) / ("y" * 200) / "output"
    m = extract_deliverables(ws, tmp_path / "d", max_files=10, max_bytes=10, also_under=[longer, "/w"])
    assert m.limits is not None and m.limits.max_path_bytes == path_budget(longer)
    assert path_budget(longer) == PATH_MAX - 2 - len(os.fsencode(str(longer)))


def test_the_working_copy_leaves_out_what_it_cannot_hold_and_says_so(tmp_path, monkeypatch):
    from ale.grading import grader

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "ok.txt").write_text("ok")
    (src / "sub" / "bad.txt").write_text("bad")
    real = grader.copy_keeping_holes

    def failing(s, d, **kw):
        if os.fstat(s).st_size == 3:
            raise OSError(28, "No space left on device")
        return real(s, d, **kw)

    monkeypatch.setattr(grader, "copy_keeping_holes", failing)
    problems: list[str] = []
    out = grader.working_copy(src, tmp_path / "g" / "output", owner=None, problems=problems)
    assert (out / "ok.txt").read_text() == "ok" and not (out / "sub" / "bad.txt").exists()
    assert problems == ["sub/bad.txt: not copied: No space left on device"]


def test_a_name_taken_in_the_run_folder_all_the_same_takes_a_safe_name(tmp_path, monkeypatch):
    """A folder whose own casefold attribute the probe did not see: the create finds
    its name taken (EEXIST); the copy takes a safe name rather than failing."""
    import errno

    from ale.grading import deliverables as d

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "A").write_text("upper")
    (ws / "a").write_text("lower")
    real = d._Extractor._create

    def folding_create(self, stored):
        if stored == b"a":
            raise d.DeliverablesWriteError(errno.EEXIST, "taken")
        return real(self, stored)

    monkeypatch.setattr(d._Extractor, "_create", folding_create)
    m = d.extract_deliverables(ws, tmp_path / "d", max_files=10, max_bytes=100)
    got = {f.path: f for f in m.files}
    assert got["A"].stored_as is None and got["a"].stored_as.startswith(d.SAFE_NAME_PREFIX)
    assert (tmp_path / "d" / got["a"].stored_as).read_text() == "lower"


def test_the_folding_probe_and_key(tmp_path):
    from ale.grading.deliverables import Folding, probe_folding

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        f = probe_folding(fd)
    finally:
        os.close(fd)
    assert f == Folding(False, False) and os.listdir(tmp_path) == []  # ext4/tmpfs here; the probe cleans up
    k = Folding(case=True, unicode=True).key
    assert k(b"Answer.json") == k(b"ANSWER.JSON") and k("caf\u00e9".encode()) == k("cafe\u0301".encode())
    assert Folding().key(b"A") != Folding().key(b"a")


def test_printed_names_have_their_controls_escaped():
    from ale.cli.output import terminal_safe
    from ale.lossless import display_name, printable

    name = "o\x1b]52;c;aGk=\x07\x9b2J\u2028x\ud800"
    assert printable(name) == "o\\x1b]52;c;aGk=\\x07\\x9b2J\u2028x\\ud800"
    assert terminal_safe("a\nb\tc\x1b") == "a\nb\tc\\x1b"
    assert display_name(b"\xff\x1b") == "\\xff\\x1b"


def test_any_renderable_a_console_prints_has_its_controls_escaped():
    import io

    from rich.table import Table

    from ale.cli.output import SafeConsole

    buf = io.StringIO()
    console = SafeConsole(file=buf, force_terminal=True, width=80)
    table = Table()
    table.add_column("name")
    table.add_row("o\x1b]52;c;aGk=\x9b2J")
    console.print(table)
    console.print("[bold]styled[/] \x1b[31m")
    out = buf.getvalue()
    assert "\x1b]52" not in out and "\x9b" not in out and "\x1b[31m" not in out
    assert "\\x1b]52" in out and "\\x9b2J" in out and "\x1b[1m" in out  # rich's own styles stay
