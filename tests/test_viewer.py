"""`ale view` and `ale export --format atif`, on real run folders, in a real browser.

Pages are generated for real runs (word_count with the oracle; click_button with a
replay agent that takes screenshots) and for synthetic ones (a model's turns;
candidate text holding markup, script and ANSI escapes; 10,000 steps with 100 MB
of output), then loaded in headless Chromium (Debian's /usr/bin/chromium, driven
by Playwright as tests/test_report_html.py does): no console error, the key
elements there, screenshots shown, hostile text inert. The ATIF export is
checked against the models written from Harbor's RFC (ale.report.atif).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ale import layout
from ale.agents.trajectory import ModelToolCall, ModelTurn, Trajectory, TrajectoryStep
from ale.record.verify import verify_run_dir
from ale.report import atif
from ale.report.viewer import clean, default_run_page, json_for_script, view, write_run_page
from tests.conftest import EXAMPLES, REPO, TOOLS_IMAGE, require

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"]
ALE = [sys.executable, "-m", "ale.cli"]
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
ANSI = "\x1b[31mred text\x1b[0m and \x1b]0;set-title\x07 bell\x07"
# Bound for opening a 10,000-step page (generation and browser load each); measured
# at 1-2 s each on the project's busy 2-core machine (docs/benchmarks.md).
BIG_STEPS, BIG_OUTPUT = 10_000, 100 * 1024 * 1024
BIG_BOUND_S = 20.0


# -- real runs -------------------------------------------------------------------------
def _ale_run(task: Path, runs: Path, *args: str) -> Path:
    proc = subprocess.run([*ALE, "run", str(task), "--runs-dir", str(runs), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert (run_dir / layout.RESULT).is_file(), proc.stdout + proc.stderr
    return run_dir


def _desktop_image() -> bool:
    try:
        import docker

        docker.from_env(timeout=30).images.get("ale-desktop:latest")
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import _docker_client

    require(_docker_client() is not None, f"no Docker engine or no {TOOLS_IMAGE} image (run `make setup`)")
    return _ale_run(EXAMPLES / "files" / "word_count", tmp_path_factory.mktemp("oracle"), "--agent", "oracle")


@pytest.fixture(scope="module")
def gui_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import _docker_client

    require(_docker_client() is not None and _desktop_image(), "no Docker engine or no ale-desktop:latest image (make setup)")
    root = tmp_path_factory.mktemp("gui")
    script = root / "calls.json"
    script.write_text(json.dumps([
        {"tool": "computer", "args": {"action": "screenshot"}},
        {"tool": "computer", "args": {"action": "left_click", "coordinate": [468, 229]}},
        {"tool": "computer", "args": {"action": "screenshot"}},
    ]))
    return _ale_run(EXAMPLES / "gui" / "click_button", root / "runs", "--agent", "replay", "--script", str(script))


# -- synthetic runs ---------------------------------------------------------------------
def _step(i: int, tool: str = "shell", **kw: Any) -> TrajectoryStep:
    t = f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.000000+00:00"
    base: dict[str, Any] = {"index": i, "tool": tool, "args": {"command": f"echo {i}"}, "ok": True, "exit_code": 0,
                            "stdout": f"{i}\n", "started_at": t, "ended_at": t, "seconds": 0.01}
    base.update(kw)
    return TrajectoryStep(**base)


def synthetic_run(root: Path, steps: list[TrajectoryStep], *, turns: list[ModelTurn] | None = None,
                  result: dict[str, Any] | None = None, prompt: str | None = None, task_log: str | None = None,
                  deliverables: dict[str, Any] | None = None, name: str = "synthetic-run") -> Path:
    """A run folder holding what the viewer reads (not signed: `ale verify` calls it unusable)."""
    run = root / name
    run.mkdir(parents=True)
    (run / layout.PLAN).write_text(json.dumps({"run_id": name, "task_dir": str(root / "no-task"), "variant": 0,
                                               "agent": {"name": "command", "label": "synthetic", "config": {}}}))
    res = {"schema_version": 1, "run_id": name, "task_id": "synthetic/task", "task_dir": str(root / "no-task"),
           "variant": 0, "agent": "synthetic", "status": "scored", "scores": [0.5], "score": 0.5,
           "phases": [{"name": "agent", "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:10:00Z", "seconds": 600.0}],
           "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:10:01Z", "harness_version": "0.1.0"}
    res.update(result or {})
    (run / layout.RESULT).write_text(json.dumps(res))
    traj = Trajectory(run_id=name, agent="synthetic", started_at="2026-01-01T00:00:00+00:00", ended="finished",
                      steps=steps, model_turns=turns or [])
    (run / layout.TRAJECTORY).write_text(traj.model_dump_json())
    (run / layout.DELIVERABLES).write_text(json.dumps(deliverables or {"files": [], "skipped": [], "total_bytes": 0}))
    if prompt is not None:
        (run / layout.AGENT_DIR).mkdir()
        (run / layout.agent_path(layout.Agent.PROMPT)).write_text(prompt)
    if task_log is not None:
        (run / layout.TASK_LOG).write_text(task_log)
    return run


def hostile_run(root: Path) -> Path:
    steps = [
        _step(1, stdout=HOSTILE + "\n" + ANSI, stderr=ANSI, args={"command": HOSTILE}),
        _step(2, tool=HOSTILE, ok=False, exit_code=3, error=HOSTILE),
    ]
    deliverables = {"files": [{"path": HOSTILE, "size": 3, "sha256": "0" * 64}],
                    "skipped": [{"path": "<b>x</b>", "reason": HOSTILE, "kind": "fifo"}], "total_bytes": 3}
    return synthetic_run(root, steps, prompt="Do it. " + HOSTILE + ANSI, task_log=HOSTILE + ANSI, deliverables=deliverables,
                         result={"status": "agent_failed", "score": None, "scores": None, "error": HOSTILE + ANSI},
                         name="hostile-run")


def turns_run(root: Path) -> Path:
    steps = [_step(1), _step(2, tool="read_file", args={"path": "/input/a.txt"}, stdout="", output="hello"), _step(3)]
    turns = [
        ModelTurn(request=2, time="2026-01-01T00:00:00.500000+00:00", api="anthropic", model="claude-test", messages=1,
                  decision="forwarded", status=200, text="I will look.", reasoning="first, list",
                  usage={"input_tokens": 100, "output_tokens": 20, "cached_input_tokens": 10, "cost_usd": 0.001},
                  tool_calls=[ModelToolCall(name="mcp__ale__shell", arguments={"command": "echo 1"}, step=1),
                              ModelToolCall(name="mcp__ale__read_file", arguments='{"path": "/input/a.txt"}', step=2)]),
        ModelTurn(request=4, time="2026-01-01T00:00:05.000000+00:00", api="anthropic", model="claude-test", messages=3,
                  decision="forwarded", status=200, text="Done.", usage={"input_tokens": 150, "output_tokens": 5},
                  tool_calls=[ModelToolCall(name="TodoWrite", arguments={"todos": []})]),
    ]
    return synthetic_run(root, steps, turns=turns, prompt="Count the words.", name="turns-run")


def big_run(root: Path, n: int = BIG_STEPS, total: int = BIG_OUTPUT) -> Path:
    each = total // n
    line = "0123456789abcdef" * 4 + "\n"
    out = (line * (each // len(line) + 1))[:each]
    return synthetic_run(root, [_step(i, stdout=out) for i in range(1, n + 1)], name="big-run")


# -- the browser ---------------------------------------------------------------------------
def _browser():
    require(CHROMIUM is not None, "Debian's chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "playwright is not installed (pip install playwright)")
    return sync_playwright


class Loaded:
    def __init__(self, page: Any, errors: list[str], requests: list[str], seconds: float):
        self.page, self.errors, self.requests, self.seconds = page, errors, requests, seconds


def load(page_path: Path, check: Any, *, screenshot: Path | None = None, height: int = 2000) -> Loaded:
    """Open ``page_path`` in headless Chromium; ``check(loaded)`` runs while it is open."""
    sync_playwright = _browser()
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": height})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: errors.append(f"dialog: {d.message}") or d.dismiss())  # type: ignore[func-returns-value]
            t0 = time.perf_counter()
            page.goto(page_path.resolve().as_uri(), timeout=120_000)
            page.wait_for_selector("body[data-ready='1']", timeout=120_000)
            loaded = Loaded(page, errors, requests, time.perf_counter() - t0)
            check(loaded)
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    return loaded


# -- tests ---------------------------------------------------------------------------------
def test_clean_strips_ansi_and_escapes_controls() -> None:
    assert clean(ANSI) == "red text and  bell\\x07"
    assert clean("a\x00b\x1bc") == "a\\x00b\\x1bc"
    assert "<" not in json_for_script({"x": HOSTILE}) and "&" not in json_for_script({"x": "a&b"})


def test_run_page_of_a_real_run(oracle_run: Path) -> None:
    page = view(oracle_run)
    assert page == default_run_page(oracle_run) and page.parent == oracle_run.parent  # outside the signed folder
    report = verify_run_dir(oracle_run)
    assert report.valid, report.reasons  # viewing leaves the run verifiable

    def check(x: Loaded) -> None:
        pg = x.page
        assert pg.locator("#status").inner_text() == "scored"
        assert pg.locator("#verdict-label").inner_text() == "VALID"
        assert pg.locator("#phases tr").count() == 1 + 8
        assert pg.locator("#steps-list .step").count() == 3
        assert "wc -w" in pg.locator("#step-1").inner_text()
        assert pg.locator("#deliverable-files a", has_text="answer.json").count() == 1
        href = pg.locator("#deliverable-files a").first.get_attribute("href")
        assert (page.parent / href).resolve().is_file()
        assert "run_command" in pg.locator("#task-log-text").inner_text()
        # every run records the prompt its agent received (agent/prompt.txt, signed)
        assert "not recorded in this run folder" not in pg.locator("#prompt").inner_text()
        assert pg.locator("#prompt").inner_text().startswith("Count the words and the lines of the text file")
        pg.select_option("#steps-tool", "write_file")
        assert pg.locator("#steps-list .step").count() == 1

    x = load(page, check)
    assert x.errors == []
    assert all(u.startswith(("file://", "data:")) for u in x.requests), x.requests


def test_gui_run_shows_its_screenshots(gui_run: Path, tmp_path: Path) -> None:
    page = view(gui_run, tmp_path / "gui.html")
    assert verify_run_dir(gui_run).valid

    def check(x: Loaded) -> None:
        imgs = x.page.locator("#steps-list img.screenshot")
        assert imgs.count() == 2
        for k in range(2):
            assert imgs.nth(k).evaluate("i => i.complete && i.naturalWidth") == 1024
        assert x.page.locator("#step-2").inner_text().count("left_click") >= 1

    x = load(page, check)
    assert x.errors == []


def test_candidate_text_is_inert(tmp_path: Path) -> None:
    run = hostile_run(tmp_path)
    page = view(run, tmp_path / "hostile.html", verify=False)
    text = page.read_text()
    assert "\x1b" not in text and "<script>document" not in text and "onerror=\"document" not in text

    def check(x: Loaded) -> None:
        pg = x.page
        assert pg.title() == "ale run hostile-run"  # the candidate's script never ran
        assert pg.evaluate("document.querySelectorAll('script').length") == 2  # ours: the data and the code
        assert pg.evaluate("document.querySelectorAll('img').length") == 0  # its <img> is text, not an element
        body = pg.locator("body").inner_text()
        assert body.count("<script>document.title='pwned'</script>") >= 6  # shown, as text
        assert "red text" in body and "\x1b" not in body and "[31m" not in body
        assert "<script>document.title" in pg.locator("#reason").inner_text()
        assert "<script>" in pg.locator("#prompt").inner_text()
        assert pg.locator("#step-2 .tool").inner_text() == HOSTILE

    x = load(page, check)
    assert x.errors == []


def test_model_turns_are_joined_to_their_steps(tmp_path: Path) -> None:
    run = turns_run(tmp_path)
    page = view(run, tmp_path / "turns.html", verify=False)

    def check(x: Loaded) -> None:
        pg = x.page
        order = pg.evaluate("Array.from(document.querySelectorAll('#steps-list > div')).map(e => e.id)")
        assert order == ["turn-1", "step-1", "step-2", "step-3", "turn-2"]
        assert "claude-test" in pg.locator("#turn-1").inner_text() and "input_tokens 100" in pg.locator("#turn-1").inner_text()
        assert pg.locator("#turn-1 a", has_text="step 2").count() == 1
        assert "asked for by model turn 1" in pg.locator("#step-2").inner_text()
        assert "(no bridge step)" in pg.locator("#turn-2").inner_text()
        assert pg.locator("#prompt").inner_text() == "Count the words."

    assert load(page, check).errors == []


def test_experiment_page_lists_filters_and_links_runs(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    (exp / layout.RUNS_DIR).mkdir(parents=True)
    turns_run(exp / layout.RUNS_DIR)
    hostile_run(exp / layout.RUNS_DIR)
    index = view(exp, verify=False)
    assert index == exp / "views" / "index.html"
    assert (exp / "views" / "turns-run.html").is_file() and (exp / "views" / "hostile-run.html").is_file()

    def check(x: Loaded) -> None:
        pg = x.page
        assert pg.locator("#runs tbody tr").count() == 2
        pg.select_option("#filter-status", "agent_failed")
        assert pg.locator("#runs tbody tr:visible").count() == 1
        assert "1 of 2" in pg.locator("#shown").inner_text()
        pg.select_option("#filter-status", "")
        pg.fill("#filter-text", "turns")
        assert pg.locator("#runs tbody tr:visible").count() == 1
        href = pg.locator("#runs a", has_text="turns-run").get_attribute("href")
        assert (index.parent / href).is_file()
        assert pg.title() == "ale experiment exp"
        assert "<script>document.title" in pg.locator("#reasons").inner_text()

    assert load(index, check).errors == []


def test_a_10000_step_run_opens_quickly(tmp_path: Path) -> None:
    run = big_run(tmp_path)
    t0 = time.perf_counter()
    page = write_run_page(run, tmp_path / "big.html", verify=False)
    generate = time.perf_counter() - t0
    size = page.stat().st_size
    assert size < 25 * 1024 * 1024  # cut: 1 KB of each 10 KB output shown (the page's budget, spread)

    def check(x: Loaded) -> None:
        assert x.page.locator("#steps-list .step").count() == 100  # a page of steps at a time
        assert "page 1 of 100" in x.page.locator("#steps-page").inner_text()
        x.page.click("#steps-next")
        assert x.page.locator("#step-101").count() == 1

    x = load(page, check)
    print(f"\n10,000-step page: {size / 1e6:.1f} MB, generated in {generate:.2f} s, loaded in {x.seconds:.2f} s")
    assert x.errors == []
    assert generate < BIG_BOUND_S and x.seconds < BIG_BOUND_S


def test_the_page_is_never_written_into_the_run_folder(tmp_path: Path) -> None:
    run = turns_run(tmp_path)
    with pytest.raises(ValueError, match="signed"):
        view(run, run / "view.html", verify=False)
    with pytest.raises(ValueError, match="signed"):
        atif.export(run, run / "x.json")


# -- ATIF ------------------------------------------------------------------------------------
def test_atif_models_refuse_what_the_rfc_refuses() -> None:
    from pydantic import ValidationError

    good: dict[str, Any] = {
        "schema_version": "ATIF-v1.7", "session_id": "s", "agent": {"name": "a", "version": "1"},
        "steps": [{"step_id": 1, "source": "user", "message": "hi", "timestamp": "2026-01-01T00:00:00Z"},
                  {"step_id": 2, "source": "agent", "message": "",
                   "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {}}],
                   "observation": {"results": [{"source_call_id": "c1", "content": "ok"}]},
                   "metrics": {"prompt_tokens": 1, "completion_tokens": 1}}]}
    atif.validate(good)
    bad = [
        lambda d: d.update(surprise=1),
        lambda d: d["steps"][0].update(note="x"),
        lambda d: d.update(schema_version="ATIF-v2.0"),
        lambda d: d.update(steps=[]),
        lambda d: d["steps"][1].update(step_id=3),
        lambda d: d["steps"][0].update(metrics={}),
        lambda d: d["steps"][1]["observation"]["results"][0].update(source_call_id="c9"),
        lambda d: d["steps"][0].update(timestamp="yesterday"),
        lambda d: d["steps"][1]["tool_calls"][0].update(arguments="ls"),
        lambda d: d["steps"][1]["metrics"].update(prompt_tokens=1.5),
        lambda d: d["steps"][0].update(message=[{"type": "image", "source": {"media_type": "image/bmp", "path": "x"}}]),
        lambda d: d["steps"][0].update(message=[{"type": "image", "text": "x", "source": {"media_type": "image/png", "path": "x"}}]),
        lambda d: d["steps"][1].update(llm_call_count=0),
    ]
    for n, mutate in enumerate(bad):
        doc = json.loads(json.dumps(good))
        mutate(doc)
        with pytest.raises(ValidationError):
            atif.validate(doc)
            pytest.fail(f"case {n} validated")


def test_atif_export_of_model_turns(tmp_path: Path) -> None:
    run = turns_run(tmp_path)
    [path] = atif.export(run)
    assert path == run.with_name(run.name + atif.EXPORT_SUFFIX)
    doc = json.loads(path.read_text())
    traj = atif.validate(doc)
    assert traj.schema_version == atif.ATIF_VERSION and traj.session_id == "turns-run"
    assert traj.steps[0].source == "user" and traj.steps[0].message == "Count the words."
    turn = traj.steps[1]
    assert turn.source == "agent" and turn.model_name == "claude-test" and turn.message == "I will look."
    assert turn.reasoning_content == "first, list" and turn.metrics is not None and turn.metrics.prompt_tokens == 100
    assert [c.function_name for c in turn.tool_calls or []] == ["mcp__ale__shell", "mcp__ale__read_file"]
    assert (turn.tool_calls or [])[1].arguments == {"path": "/input/a.txt"}  # a JSON string, as OpenAI sends it, parsed
    assert [r.content for r in turn.observation.results] == ["1\n", "hello"]  # type: ignore[union-attr]
    assert [s.source for s in traj.steps] == ["user", "agent", "agent", "agent"]  # step 3 had no turn: its own step
    assert traj.final_metrics is not None and traj.final_metrics.total_prompt_tokens == 250
    assert traj.final_metrics.total_cost_usd == 0.001 and traj.final_metrics.total_steps == 4


def test_atif_export_of_real_runs(oracle_run: Path, gui_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    proc = subprocess.run([*ALE, "export", str(oracle_run), "--format", "atif", "--out", str(out / "oracle.json")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    traj = atif.validate(json.loads((out / "oracle.json").read_text()))
    assert [c.function_name for s in traj.steps for c in s.tool_calls or []] == ["shell", "shell", "write_file"]
    assert traj.extra and traj.extra["ale"]["status"] == "scored"
    [gui] = atif.export(gui_run, out / "gui.json")
    doc = json.loads(gui.read_text())
    atif.validate(doc)
    images = [part["source"]["path"] for s in doc["steps"] for r in (s.get("observation") or {}).get("results", [])
              if isinstance(r.get("content"), list) for part in r["content"] if part["type"] == "image"]
    assert len(images) == 2 and all((gui.parent / p).is_file() for p in images)
    assert verify_run_dir(oracle_run).valid and verify_run_dir(gui_run).valid


def test_cli_view_and_export_of_an_experiment(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    (exp / layout.RUNS_DIR).mkdir(parents=True)
    turns_run(exp / layout.RUNS_DIR)
    proc = subprocess.run([*ALE, "view", str(exp), "--no-verify"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == exp / "views" / "index.html"
    proc = subprocess.run([*ALE, "export", str(exp)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    [written] = [Path(p) for p in proc.stdout.split()]
    assert written == exp / atif.EXPORT_DIR / ("turns-run" + atif.EXPORT_SUFFIX)
    atif.validate(json.loads(written.read_text()))
    proc = subprocess.run([*ALE, "export", str(exp), "--format", "csv"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "atif" in proc.stderr
    proc = subprocess.run([*ALE, "view", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "neither a run folder" in proc.stderr



def test_an_unfinished_run_folder_still_has_a_page(tmp_path: Path) -> None:
    """No result.json, no trajectory.json (a run that died): the page says so, the
    steps come from trajectory.jsonl, the export still validates."""
    run = turns_run(tmp_path)
    steps = json.loads((run / layout.TRAJECTORY).read_text())["steps"]
    (run / layout.TRAJECTORY_LOG).write_text("".join(json.dumps(s) + "\n" for s in steps))
    (run / layout.RESULT).unlink()
    (run / layout.TRAJECTORY).unlink()
    page = view(run, tmp_path / "unfinished.html")

    def check(x: Loaded) -> None:
        assert "no result.json" in x.page.locator("#header-reason").inner_text()
        assert x.page.locator("#steps-list .step").count() == 3
        assert x.page.locator("#verdict-label").inner_text() in ("INVALID", "UNUSABLE")

    assert load(page, check).errors == []
    [path] = atif.export(run, tmp_path / "unfinished.json")
    assert len(atif.validate(json.loads(path.read_text())).steps) == 1 + 3
