"""Issue 20, item 1: the images a run needs are built when first needed, and every
hint names a command that really fixes what it reports.

Nothing here removes an image other tests use: "absent" images are fresh tags of
ale's own repositories (``ale-tools:<fresh>``, ``ale-desktop:<fresh>``, also through
``ALE_DESKTOP_IMAGE``), built from the content cache and untagged afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from ale.sandbox.docker import image_hint

ROOT = Path(__file__).resolve().parents[1]
ALE = str(Path(sys.executable).with_name("ale"))


def test_each_image_hint_names_the_command_for_that_image() -> None:
    assert "`ale image build --desktop`" in image_hint("ale-desktop:latest")
    assert "`ale image build`" in image_hint("ale-tools:latest")
    assert "`ale image build --desktop --tag ale-desktop:x`" in image_hint("ale-desktop:x")
    assert "`ale image build --tag ale-tools:x`" in image_hint("ale-tools:x")
    assert "docker pull example.org/other:1" in image_hint("example.org/other:1")


def _fresh(repo: str) -> str:
    return f"{repo}:test-{uuid.uuid4().hex[:10]}"


def _untag(client, ref: str) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(ref, noprune=True)  # the content tag keeps the image


@pytest.mark.parametrize("repo", ["ale-tools", "ale-desktop"])
def test_running_the_hint_of_a_missing_image_puts_it_there(docker_client, repo: str) -> None:
    from ale.sandbox.base import ImageMissing
    from ale.sandbox.providers import make_provider

    ref = _fresh(repo)
    with pytest.raises(ImageMissing) as e:
        make_provider().image_inspect(ref)
    commands = re.findall(r"`([^`]+)`", str(e.value))
    assert commands and all(c.startswith("ale ") for c in commands), str(e.value)
    try:
        for command in commands:
            argv = [ALE, *shlex.split(command)[1:]]
            proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
            assert proc.returncode == 0, proc.stderr
        make_provider().image_inspect(ref)  # now there
    finally:
        _untag(docker_client, ref)


def test_ale_run_builds_a_missing_tools_image(docker_client, tmp_path: Path) -> None:
    ref = _fresh("ale-tools")
    try:
        proc = subprocess.run([ALE, "run", "examples/tasks/files/word_count", "--agent", "oracle", "--image", ref,
                               "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT, timeout=900)
        assert proc.returncode == 0, proc.stderr
        assert f"the tools image {ref} is not in the engine: building it" in proc.stderr
        run_dir = Path(proc.stdout.strip().splitlines()[-1])
        assert json.loads((run_dir / "result.json").read_text())["status"] == "scored"
    finally:
        _untag(docker_client, ref)


def test_the_demo_gui_tasks_run_when_the_desktop_image_is_absent(docker_client, tmp_path: Path) -> None:
    """`make demo`'s experiment (its GUI tasks, oracle and nop) on an engine without
    the desktop image it names: built on first use, no infrastructure_error."""
    ref = _fresh("ale-desktop")
    demo = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    demo.update(name="demo-clean-engine", tasks_root=str(ROOT / "examples" / "tasks"),
                tasks=[{"path": "gui/click_button"}, {"path": "gui/fill_form"}],
                agents=[a for a in demo["agents"] if a["name"] in ("oracle", "nop")], output=str(tmp_path / "out"))
    exp = tmp_path / "demo.yaml"
    exp.write_text(yaml.safe_dump(demo))
    env = {**os.environ, "ALE_DESKTOP_IMAGE": ref}
    try:
        proc = subprocess.run([ALE, "exp", "run", str(exp), "--plain"], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"the desktop image {ref} is not in the engine: building it" in proc.stderr
        statuses = {}
        for result in (tmp_path / "out" / "runs").glob("*/result.json"):
            doc = json.loads(result.read_text())
            statuses[doc["run_id"]] = doc["status"]
        assert len(statuses) == 4 and "infrastructure_error" not in statuses.values(), (statuses, proc.stderr[-3000:])
        assert sorted(statuses.values()) == ["scored"] * 4
    finally:
        _untag(docker_client, ref)


def test_scripts_demo_sh_needs_no_image_built_beforehand() -> None:
    """`make demo` is setup (the tools image) then `ale exp run examples/demo.yaml`,
    which builds whatever else its runs need (the desktop image): nothing else to run."""
    script = (ROOT / "scripts" / "demo.sh").read_text()
    assert "ale exp run examples/demo.yaml" in script
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: setup\n\tbash scripts/demo.sh", makefile, re.M)
    assert textwrap.dedent("""\
        ```sh
        make demo
        ```""") in (ROOT / "README.md").read_text()
