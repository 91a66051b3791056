"""Whole runs with the model gateway and a confined harness (the stand-in harness,
real containers): refusals make the run invalid with the right attribution, a
confined harness reaches no host file and no other address and the run is still
graded, and ``ale verify`` re-derives the offered tools from the gateway's record."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import sys
import uuid
from pathlib import Path

import pytest

from ale.plan import AgentSpec, RunPlan
from ale.record import evidence as ev
from ale.record.signing import load_or_create_signing_key
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import IsolationPolicy
from ale.status import InvalidAttribution, RunStatus
from tests.conftest import EXAMPLES, REPO, TOOLS_IMAGE
from tests.fake_model_api import FakeModelAPI
from tests.test_agents_support import STANDIN

pytestmark = pytest.mark.docker

TASK = EXAMPLES / "files" / "word_count"
BRIDGE = [{"name": f"mcp__ale__{t}", "input_schema": {"type": "object"}} for t in ("shell", "read_file")]


@pytest.fixture
def fake_api():
    api = FakeModelAPI().start()
    try:
        yield api
    finally:
        api.stop()


def _plan(tmp_path: Path, config: dict) -> RunPlan:
    return RunPlan(
        run_id=f"g-{uuid.uuid4().hex[:12]}", task_dir=str(TASK), variant=0,
        agent=AgentSpec(name="command", config=config), image=TOOLS_IMAGE,
        policy=IsolationPolicy(memory_bytes=512 * 1024**2), runs_dir=str(tmp_path / "runs"),
        signing_key=str(tmp_path / "key.pem"),
    )


def _standin(mode: str, env: dict, fake: FakeModelAPI | None = None, **more) -> dict:
    cfg = {"command": [sys.executable, str(STANDIN), "--mcp-config", "{mcp_config}", "--prompt", "{prompt}", "--mode", mode],
           "env": env, **more}
    if fake is not None:
        cfg["ALE_GATEWAY_ANTHROPIC_UPSTREAM"] = fake.url
    return cfg


def _run(plan: RunPlan, client):
    return asyncio.run(execute_run(plan, provider=DockerProvider(client)))


def test_forbidden_tool_in_the_first_request_is_the_controllers_configuration(docker_client, tmp_path, fake_api):
    tools = [[*BRIDGE, {"name": "Bash", "input_schema": {"type": "object"}}]]
    plan = _plan(tmp_path, _standin("model", {"ALE_TEST_MODEL_TOOLS": json.dumps(tools)}, fake_api))
    result = _run(plan, docker_client)
    assert result.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT and result.score is None
    assert result.invalid_attribution is InvalidAttribution.CONTROLLER_CONFIGURATION and not result.retryable
    assert any("gateway.tools_allowed" in v and "Bash" in v for v in result.violations), result.violations
    assert not [r for r in fake_api.requests if r["path"] == "/v1/messages"], "a refused request reached the model"
    doc = json.loads((plan.run_dir / "evidence" / "controller.json").read_text())
    assert doc["gateway"]["requests"][0]["tools"] == ["Bash", "mcp__ale__read_file", "mcp__ale__shell"]
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons

    # An edited record: the tool removed from the recorded request, the chain and the
    # whole folder re-sealed with the run's own key. The re-derivation still catches it.
    rec_path = plan.run_dir / "agent" / "gateway" / "records.jsonl"
    from ale.agents.gateway import record as gr

    lines = [json.loads(x) for x in rec_path.read_text().splitlines()]
    prev = gr.GENESIS
    for rec in lines:
        if rec["type"] == "request":
            body = rec["body"]
            doc_body = body["json"] if "json" in body else json.loads((plan.run_dir / body["file"]).read_bytes())
            doc_body["tools"] = [t for t in doc_body["tools"] if t["name"] != "Bash"]
            data = json.dumps(doc_body).encode()
            body.update({"json": doc_body, "bytes": len(data), "sha256": ev.sha256_bytes(data)})
            body.pop("file", None)
        rec["prev"] = prev
        rec["hash"] = gr.record_hash(rec)
        prev = rec["hash"]
    rec_path.write_bytes(b"".join(gr.canonical(r) + b"\n" for r in lines))
    for name in ("manifest.json", "attestation.dsse.json"):
        (plan.run_dir / name).unlink()
    ev.write_manifest_and_sign(plan.run_dir, load_or_create_signing_key(Path(plan.signing_key)))
    report = verify_run_dir(plan.run_dir)
    assert not report.valid
    failed = {c["id"] for c in report.checks if c["ok"] is not True}
    assert {"gateway.tools_rederived", "gateway.evidence_matches", "gateway.event"} <= failed, report.reasons


def test_server_side_web_search_after_an_answer_is_charged_to_the_agent(docker_client, tmp_path, fake_api):
    tools = [BRIDGE, [*BRIDGE, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]]
    plan = _plan(tmp_path, _standin("model", {"ALE_TEST_MODEL_TOOLS": json.dumps(tools)}, fake_api))
    result = _run(plan, docker_client)
    assert result.status is RunStatus.INVALID_EVALUATION_ENVIRONMENT
    assert result.invalid_attribution is InvalidAttribution.AFTER_AGENT_START
    assert any("server:web_search_20250305" in v for v in result.violations), result.violations
    assert len([r for r in fake_api.requests if r["path"] == "/v1/messages"]) == 1  # only the allowed one
    assert result.extra["usage"]["input_tokens"] == 100 and result.extra["usage"]["requests"] == 1
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons


@pytest.mark.requires(shutil.which("bwrap") is not None, "needs bubblewrap")
def test_a_confined_harness_reads_no_host_file_and_reaches_no_other_address(docker_client, tmp_path, fake_api):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    (tmp_path / "home-config").mkdir()
    secret = tmp_path / "home-config" / "settings.json"
    secret.write_text('{"apiKey": "operator"}')
    plan = _plan(tmp_path, {})
    scratch_input = Path(plan.runs_dir) / ".scratch" / plan.run_id / "input" / "document.txt"
    files = [str(secret), str(TASK / "main.py"), str(scratch_input), "/etc/shadow", str(Path.home() / ".bashrc"),
             str(REPO / "pyproject.toml")]
    install = sorted({sys.prefix, str(Path(sys.executable).resolve().parents[1]), str(STANDIN.parent)})
    env = {"ALE_TEST_HOST_FILES": ":".join(files), "ALE_TEST_CONNECT": f"127.0.0.1:{listener.getsockname()[1]},1.1.1.1:80,172.17.0.1:2375"}
    plan = plan.model_copy(update={"agent": AgentSpec(name="command", config=_standin("attack", env, fake_api, confine={"install": install}))})
    result = _run(plan, docker_client)
    listener.close()
    log = (plan.run_dir / "agent" / "stdout.log").read_text()
    attacks = [x for x in log.splitlines() if x.startswith("ATTACK")]
    assert len(attacks) == len(files) + 3 + 1 and all(x.endswith(("failed FileNotFoundError", "failed PermissionError",
                                                              "failed ConnectionRefusedError", "failed OSError", "failed TimeoutError"))
                                                   for x in attacks), attacks
    assert result.status is RunStatus.SCORED and result.scores is not None, (result.error, result.violations)
    doc = json.loads((plan.run_dir / "evidence" / "controller.json").read_text())
    assert doc["confinement"]["kind"] == "bubblewrap" and "net" in doc["confinement"]["namespaces"]
    assert doc["confinement"]["capabilities"] == []
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons
