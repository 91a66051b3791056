"""The HTML report opens offline in headless Chromium: heat map present, no console errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ale.report import aggregate, write_html
from tests.conftest import require_module

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"]


def _report():
    from tests.test_report_aggregate import build

    results, units = build()
    return aggregate(results, units=units, run_paths={r.run_id: f"runs/{r.run_id}" for r in results}, experiment="html")


@pytest.mark.requires(CHROMIUM is not None, "Debian's chromium is not installed (apt-get install -y chromium)")
def test_html_report_renders_offline(tmp_path: Path) -> None:
    playwright = require_module("playwright.sync_api")
    exp_dir = tmp_path / "exp"
    (exp_dir / "runs" / "t1-v0-A-r0-a1").mkdir(parents=True)
    (exp_dir / "runs" / "t1-v0-A-r0-a1" / "trajectory.json").write_text("{}")
    page_path = write_html(_report(), tmp_path / "out" / "report.html", exp_dir)
    shot = tmp_path / "report.png"
    errors: list[str] = []
    requests: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            assert page.locator("svg#heatmap rect.cell").count() == 2 * 5  # agents × tasks
            assert page.locator("svg#histogram rect").count() > 0
            assert page.locator("table#invalid tr").count() == 1 + 5 + 1  # 5 invalid runs and 1 grading failure
            box = page.locator("svg#heatmap").bounding_box()
            assert box is not None and box["width"] > 100 and box["height"] > 100
            href = page.locator("a", has_text="trajectory.json").first.get_attribute("href")
            assert href == "../exp/runs/t1-v0-A-r0-a1/trajectory.json"
            assert (page_path.parent / href).resolve().is_file()
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert all(u.startswith("file://") for u in requests), requests  # nothing but the file itself
    assert shot.stat().st_size > 10_000
