"""Named harness agents in ``native`` mode: the real Claude Code CLI (npm, pinned)
inside the sealed sandbox, its only way out the exec channel to the run's model
gateway, against tests/fake_model_api.py on the trusted side. Whole runs of
files/word_count, scored and verified; a hostile command inside the sandbox tries
every other way out and tries to bend the gateway."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path

import pytest

from ale.agents.errors import AgentConfigError
from ale.agents.gateway.record import read_body, read_records
from ale.agents.registry import agent_evidence, make_agent
from ale.plan import AgentSpec, RunPlan
from ale.record.verify import verify_run_dir
from ale.runs.lifecycle import execute_run
from ale.sandbox.docker import DockerProvider
from ale.sandbox.policy import IsolationPolicy
from ale.status import RunStatus
from tests.conftest import EXAMPLES, TOOLS_IMAGE, require
from tests.fake_model_api import FakeModelAPI
from tests.test_agents_support import box  # noqa: F401 - a fixture

TASK = EXAMPLES / "files" / "word_count"
# No command substitution: Gemini CLI's shell tool refuses it ("command injection").
ANSWER = ("{ printf '{\"words\": '; wc -w < /input/document.txt | tr -d '\\n'; printf ', \"lines\": '; "
          "wc -l < /input/document.txt | tr -d '\\n'; echo '}'; } > /workspace/answer.json")
HOSTILE = ANSWER + r""" && python3 - <<'EOF'
import json, os, socket, urllib.error, urllib.request
out = {}
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except Exception as e:
        return type(e).__name__
out["tcp 1.1.1.1:443"] = tcp("1.1.1.1", 443)
out["tcp 172.17.0.1:2375"] = tcp("172.17.0.1", 2375)
out["tcp 127.0.0.1:8418"] = tcp("127.0.0.1", 8418)
try:
    socket.getaddrinfo("example.com", 443)
    out["dns"] = "resolved"
except Exception as e:
    out["dns"] = type(e).__name__
for path in ("/var/run/docker.sock", "/run/containerd/containerd.sock"):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        out[path] = "connected"
    except Exception as e:
        out[path] = type(e).__name__
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
def call(method, path, body=None, key=token):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"x-api-key": key, "content-type": "application/json", "anthropic-version": "2023-06-01"})
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
msg = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
out["GET /v1/models"] = call("GET", "/v1/models")
out["POST /v1/files"] = call("POST", "/v1/files", {})
out["POST /v1/messages/batches"] = call("POST", "/v1/messages/batches", {"requests": []})
out["another model"] = call("POST", "/v1/messages", {"model": "claude-other-9", **msg})
out["no token"] = call("POST", "/v1/messages", {"model": "claude-fake-1", **msg}, key="guess")
image = {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}}
out["remote image"] = call("POST", "/v1/messages", {"model": "claude-fake-1", "max_tokens": 5,
                                                    "messages": [{"role": "user", "content": [image]}]})
out["provider state"] = call("POST", "/v1/messages", {"model": "claude-fake-1", "container": "cntr_1", **msg})
out["server tool"] = call("POST", "/v1/messages", {"model": "claude-fake-1", **msg,
                                                   "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
out["stolen token"], out["gateway url"] = token, base  # exfiltrated through the deliverables
json.dump(out, open("/workspace/hostile.json", "w"), indent=1)
EOF"""

needs_npm = pytest.mark.requires(shutil.which("npm") is not None, "native mode fetches the harness with the host's npm")

# Variant 0 (essay): the fake model's answer, counted here the way wc counts.
_DOC = (EXAMPLES.parent / "data" / "tasks" / "files" / "word_count" / "essay" / "input" / "document.txt").read_text()
ANSWER_JSON = json.dumps({"words": len(_DOC.split()), "lines": _DOC.count("\n")})
COUNT = "wc -w -l /input/document.txt"
# Each harness's own shell, then its own file writer: what the trajectory must show.
SHELL_THEN_WRITE = {
    "claude-code": [[("Bash", {"command": COUNT})],
                    [("Write", {"file_path": "/workspace/answer.json", "content": ANSWER_JSON})]],
    "codex": [[("exec_command", {"cmd": COUNT})],
              [("apply_patch", {"input": f"*** Begin Patch\n*** Add File: /workspace/answer.json\n+{ANSWER_JSON}\n*** End Patch\n"})]],
    "gemini-cli": [[("run_shell_command", {"command": COUNT})],
                   [("write_file", {"file_path": "/workspace/answer.json", "content": ANSWER_JSON})]],
}


# Gemini CLI's own file reader on the public package (outside its workspace folder).
GEMINI_READ_THEN_WRITE = [[("read_file", {"file_path": "/input/document.txt"})],
                          [("write_file", {"file_path": "/workspace/answer.json", "content": ANSWER_JSON})]]


@pytest.fixture
def fake_api(request):
    api = FakeModelAPI(native_command=request.param).start()
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def scripted_api(request):
    api = FakeModelAPI(script={"steps": SHELL_THEN_WRITE[request.param]}).start()
    try:
        yield api
    finally:
        api.stop()


def _assert_native_trajectory(run: Path, shell: str, write: str) -> None:
    """The trajectory's steps are the gateway's: the harness's shell (its result holds the counts), then its
    file writer, each joined to the records it came from and to its model turn; the harness's transcript kept
    beside, labelled as the candidate's."""
    from ale.agents.trajectory import load_trajectory

    traj = load_trajectory(run / "trajectory.json")
    assert traj.steps_source == "gateway" and traj.steps_derivation is not None, traj.steps_source
    assert [s.tool for s in traj.steps] == [shell, write], [(s.tool, s.args) for s in traj.steps]
    assert all(s.ok and s.gateway is not None and s.gateway.result_request for s in traj.steps), traj.steps
    counts = json.loads(ANSWER_JSON)
    assert str(counts["words"]) in traj.steps[0].output and str(counts["lines"]) in traj.steps[0].output, traj.steps[0].output
    assert any(ANSWER_JSON in str(v) for v in traj.steps[1].args.values()), traj.steps[1].args
    assert traj.steps_derivation.calls == 2 and traj.steps_derivation.unanswered == 0
    requests = {r["seq"]: r for r in _requests(run)}
    for step in traj.steps:
        g = step.gateway
        assert g is not None and g.turn_usage.get("cost_usd", 0) > 0 and g.turn_usage.get("output_tokens") == 20
        assert g.result_record == requests[g.result_request]["hash"] and g.call_request in requests  # type: ignore[index]
    joined = {c.step: t.request for t in traj.model_turns for c in t.tool_calls if c.step}
    assert joined == {1: traj.steps[0].gateway.call_request, 2: traj.steps[1].gateway.call_request}  # type: ignore[union-attr]
    manifest = json.loads((run / "agent" / "harness-transcript.json").read_text())
    assert traj.harness_transcript == "agent/harness-transcript.json"
    assert manifest["written_by"] == "candidate" and manifest["error"] is None and manifest["files"], manifest
    for f in manifest["files"]:
        assert f["written_by"] == "candidate" and (run / f["path"]).stat().st_size == f["bytes"]


# Per harness: the model the fake API answers as, its gateway upstream variable and path, its prices.
# Codex's model is one it knows, so that it edits files with apply_patch (a free-form tool).
NATIVE = {"claude-code": ("claude-fake-1", "ALE_GATEWAY_ANTHROPIC_UPSTREAM", "", (3.0, 15.0)),
          "codex": ("gpt-5.5", "ALE_GATEWAY_OPENAI_UPSTREAM", "/v1", (1.25, 10.0)),
          "gemini-cli": ("gemini-fake-1", "ALE_GATEWAY_GEMINI_UPSTREAM", "", (1.25, 10.0))}


def _plan(tmp_path: Path, api: FakeModelAPI, harness: str = "claude-code", **config) -> RunPlan:
    model, upstream, path, (p_in, p_out) = NATIVE[harness]
    cfg = {"mode": "native", "model": model, upstream: api.url + path,
           "prices": {model: {"input_per_mtok": p_in, "output_per_mtok": p_out}}, **config}
    return RunPlan(
        run_id=f"n-{uuid.uuid4().hex[:12]}", task_dir=str(TASK), variant=0, agent=AgentSpec(name=harness, config=cfg),
        image=TOOLS_IMAGE, policy=IsolationPolicy(memory_bytes=2 * 1024**3), runs_dir=str(tmp_path / "runs"),
        signing_key=str(tmp_path / "key.pem"),
    )


def _requests(run_dir: Path) -> list[dict]:
    records, problems = read_records(run_dir)
    assert not problems
    return [r for r in records if r["type"] == "request"]


def test_named_harness_agents_pin_their_version_and_name_their_mode():
    for name in ("claude-code", "codex", "gemini-cli"):
        agent = make_agent(AgentSpec(name=name, config={"mode": "native"}))
        assert agent.mode == "native" and agent.native  # type: ignore[attr-defined]
        doc = agent_evidence(AgentSpec(name=name, config={"mode": "native", "model": "m-1"}))
        assert doc["details"]["mode"] == "native" and doc["details"]["model"] == "m-1"
        assert doc["details"]["gateway_limits"]["models"] == ["m-1"] and doc["details"]["gateway_limits"]["model_calls_only"]
    with pytest.raises(AgentConfigError, match="pinned"):
        make_agent(AgentSpec(name="claude-code", config={"version": "1.0.0"}))
    with pytest.raises(AgentConfigError, match="mode"):
        make_agent(AgentSpec(name="codex", config={"mode": "outside"}))
    with pytest.raises(AgentConfigError, match="budgets"):
        make_agent(AgentSpec(name="codex", config={"budgets": {"max_tokens": 5}}))


@pytest.mark.docker
@needs_npm
@pytest.mark.parametrize("scripted_api", ["claude-code"], indirect=True)
def test_claude_code_native_solves_word_count_inside_the_seal(docker_client, tmp_path, scripted_api):
    fake_api = scripted_api
    plan = _plan(tmp_path, fake_api)
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    run = plan.run_dir
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.error, result.violations)
    assert result.extra["agent_mode"] == "native"
    assert result.extra["usage"]["requests"] >= 2 and result.extra["usage"]["cost_usd"] > 0
    evidence = json.loads((run / "evidence" / "agent.json").read_text())
    assert evidence["details"]["mode"] == "native" and evidence["details"]["version"] == "2.1.197"
    # The gateway saw the harness's own tools, and the model's Bash call came back as a tool result.
    reqs = _requests(run)
    offered = {t for r in reqs for t in r["tools"]}
    assert {"Bash", "Edit", "Read", "Write"} <= offered, offered
    assert all(r["decision"] == "forwarded" for r in reqs if r["model_call"]), reqs
    assert any("tool_result" in json.dumps(read_body(run, r["body"])[0]) for r in reqs)
    controller = json.loads((run / "evidence" / "controller.json").read_text())
    ch = controller["confinement"]["channel"]
    assert controller["confinement"]["kind"] == "sandbox-native" and ch["kind"] == "exec-stream"
    assert ch["process"]["user"] == plan.policy.user and ch["process"]["privileged"] is False and ch["connections"] >= 1
    checks = json.loads((run / "evidence" / "checks.json").read_text())
    assert {c["id"] for c in checks if c["phase"] == "agent"} >= {"channel.process", "channel.frames"}
    # The layer: built FROM the run's image, recorded; the sandbox still had exactly its two mounts (inspect rules).
    layer = json.loads((run / "agent" / "harness-image.json").read_text())
    assert layer["tag"].startswith("ale-harness:") and layer["version"] == "2.1.197"
    report = verify_run_dir(run)
    assert report.valid, report.reasons
    passed = {c["id"] for c in report.checks if c["ok"] is True}
    assert {"gateway.mode", "gateway.channel.process", "gateway.channel.frames"} <= passed
    _assert_native_trajectory(run, "Bash", "Write")


@pytest.mark.docker
@needs_npm
@pytest.mark.parametrize("fake_api", [HOSTILE], indirect=True)
def test_hostile_command_inside_a_native_sandbox_reaches_only_the_gateway(docker_client, tmp_path, fake_api):
    plan = _plan(tmp_path, fake_api)
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    run = plan.run_dir
    out = json.loads((run / "deliverables" / "hostile.json").read_text())
    for key in ("tcp 1.1.1.1:443", "tcp 172.17.0.1:2375", "tcp 127.0.0.1:8418", "dns",
                "/var/run/docker.sock", "/run/containerd/containerd.sock"):
        assert out[key] != "connected" and out[key] != "resolved", (key, out)
    assert out["GET /v1/models"] == 404 and out["POST /v1/files"] == 404 and out["POST /v1/messages/batches"] == 404, out
    assert out["another model"] == 403 and out["no token"] == 401, out
    assert out["remote image"] == 403 and out["provider state"] == 403 and out["server tool"] == 403, out
    # Refused and recorded, never forwarded: the fake model API saw none of them.
    seen = [r["path"] for r in fake_api.requests]
    assert not [p for p in seen if p != "/v1/messages"], seen
    assert not [r for r in fake_api.requests if r["body"] and r["body"].get("model") != "claude-fake-1"]
    blocked = {(r["path"], r.get("refused_for")) for r in _requests(run) if r["decision"] == "refused"}
    assert {("/v1/models", "endpoint"), ("/v1/files", "endpoint"), ("/v1/messages", "model"),
            ("/v1/messages", "remote_media"), ("/v1/messages", "provider_state"), ("/v1/messages", "server_tool")} <= blocked, blocked
    controller = json.loads((run / "evidence" / "controller.json").read_text())
    assert {b["kind"] for b in controller["gateway"]["blocked"]} == {"endpoint", "model", "remote_media", "provider_state",
                                                                     "server_tool"}
    assert not controller["gateway"]["refusals"]  # withheld, not a refusal that voids the run
    # Harmless: the run is still scored (the answer was right) and verifies.
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.error, result.violations)
    report = verify_run_dir(run)
    assert report.valid, report.reasons
    _stolen_token_is_worthless_after_the_run(out["stolen token"], fake_api, tmp_path)


def _stolen_token_is_worthless_after_the_run(stolen: str, api: FakeModelAPI, tmp_path: Path) -> None:
    """The token the harness held (and the candidate exfiltrated) is the run's own: it is not a
    provider key, and no gateway accepts it once its run has ended, a later run's gateway included."""
    import httpx2 as httpx

    from ale.agents.gateway.server import ModelGateway, serve_gateway
    from ale.agents.gateway.tools import ToolPolicy

    assert stolen and stolen not in {"k", ""} and not stolen.startswith(("sk-", "AIza"))
    msg = {"model": "claude-fake-1", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    before = len(api.requests)

    async def later_run():
        (tmp_path / "later").mkdir()
        gw = ModelGateway(tmp_path / "later", ToolPolicy(("shell",), client_tools=True), keys={"anthropic": "k"},
                          upstreams={"openai": api.url, "anthropic": api.url, "gemini": api.url})
        async with serve_gateway(gw) as url, httpx.AsyncClient(timeout=30) as c:
            stolen_r = await c.post(url + "/anthropic/v1/messages", headers={"x-api-key": stolen}, json=msg)
            own_r = await c.post(url + "/anthropic/v1/messages", headers={"x-api-key": gw.token}, json=msg)
        return stolen_r.status_code, own_r.status_code

    assert asyncio.run(later_run()) == (401, 200)
    assert len(api.requests) == before + 1  # only the later run's own request reached the model API


def test_gateway_limits_refuse_endpoints_models_and_budgets_and_verify_rederives_them(tmp_path):
    import httpx2 as httpx

    from ale.agents.gateway.limits import GatewayLimits
    from ale.agents.gateway.record import summarize
    from ale.agents.gateway.server import ModelGateway, serve_gateway
    from ale.agents.gateway.tools import ToolPolicy

    api = FakeModelAPI().start()
    msg = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "Bash", "input_schema": {}}]}
    remote = {"role": "user", "content": [{"type": "document", "source": {"type": "file", "file_id": "file_1"}}]}
    calls = [("GET", "/anthropic/v1/models", None), ("POST", "/anthropic/v1/files", {}),
             ("POST", "/anthropic/v1/messages", {"model": "other", **msg}),
             ("POST", "/anthropic/v1/messages", {"model": "m1", **msg, "messages": [remote]}),
             ("POST", "/anthropic/v1/messages", {"model": "m1", "container": "c1", **msg}),
             ("POST", "/anthropic/v1/messages", {"model": "m1", **msg}),
             ("POST", "/anthropic/v1/messages", {"model": "m1", **msg}), ("POST", "/anthropic/v1/messages", {"model": "m1", "x": "y" * 5000})]

    async def scenario():
        limits = GatewayLimits.from_config({"max_requests": 1, "max_body_bytes": 4000}, models=("m1",), model_calls_only=True)
        gw = ModelGateway(tmp_path, ToolPolicy(("shell",), client_tools=True), keys={"anthropic": "k"}, limits=limits,
                          upstreams={"openai": api.url, "anthropic": api.url, "gemini": api.url})
        async with serve_gateway(gw) as url, httpx.AsyncClient(timeout=30) as c:
            rs = [await c.request(m, url + p, headers={"x-api-key": gw.token}, json=b) for m, p, b in calls]
        return gw, rs

    try:
        gw, rs = asyncio.run(scenario())
    finally:
        api.stop()
    assert [r.status_code for r in rs] == [404, 404, 403, 403, 403, 200, 429, 413]
    assert gw.budget_reached.is_set() and "1 model requests" in (gw.budget_reason or "")
    assert [r["path"] for r in api.requests] == ["/v1/messages"]  # only the one within every limit left
    s = summarize(tmp_path)
    assert s is not None and not s["problems"], s["problems"]
    assert [b["kind"] for b in s["blocked"]] == ["endpoint", "endpoint", "model", "remote_media", "provider_state", "budget",
                                                  "body_size"]
    assert not s["refusals"]  # the harness's own tools are allowed in native mode: Bash is no refusal


@pytest.mark.docker
@pytest.mark.requires(shutil.which("bwrap") is not None, "bridge mode confines the harness with bubblewrap")
@pytest.mark.parametrize("fake_api", [None], indirect=True)
def test_claude_code_bridge_mode_is_the_command_design_with_the_gateway_limits(box, tmp_path, fake_api):  # noqa: F811
    from ale.agents.base import AgentEnd
    from ale.agents.gateway.record import summarize
    from ale.agents.harness import harness_prefix
    from tests.test_agents_support import make_ctx

    require((harness_prefix() / "claude" / "node_modules" / ".bin" / "claude").exists(),
            f"Claude Code is not installed under {harness_prefix()} (scripts/setup.sh)")
    agent = make_agent(AgentSpec(name="claude-code", config={"mode": "bridge", "model": "claude-fake-1",
                                                              "ALE_GATEWAY_ANTHROPIC_UPSTREAM": fake_api.url}))
    assert agent_evidence(AgentSpec(name="claude-code", config={"mode": "bridge"}))["details"]["mode"] == "bridge"
    ctx, writer = make_ctx(box, tmp_path)
    out = asyncio.run(agent.run(ctx))
    writer.close(usage=out.usage, end=out.end.value)
    assert out.end == AgentEnd.FINISHED, (out.detail, (tmp_path / "agent" / "stderr.log").read_text()[-3000:])
    assert (box.workspace / "answer.txt").read_text() == "42\n"
    s = summarize(tmp_path)
    assert s is not None and not s["problems"] and not s["refusals"]
    assert s["limits"]["models"] == ["claude-fake-1"] and s["limits"]["model_calls_only"] is True
    assert all(set(r["tools"]) <= {f"mcp__ale__{t}" for t in ("shell", "read_file", "write_file", "list_dir")} for r in s["requests"])
    assert json.loads((tmp_path / "agent" / "confinement.json").read_text())["kind"] == "bubblewrap"


@pytest.mark.docker
@needs_npm
@pytest.mark.parametrize("scripted_api", ["codex"], indirect=True)
def test_codex_native_solves_word_count_inside_the_seal(docker_client, tmp_path, scripted_api):
    # At a model it knows (NATIVE) Codex also offers tool_search, executed by Codex itself ("execution": "client"): a client tool.
    _solves_natively(docker_client, tmp_path, scripted_api, "codex", "exec_command", "apply_patch", also={"tool_search"})


@pytest.mark.docker
@needs_npm
@pytest.mark.parametrize("scripted_api", ["gemini-cli"], indirect=True)
def test_gemini_cli_native_solves_word_count_inside_the_seal(docker_client, tmp_path, scripted_api):
    _solves_natively(docker_client, tmp_path, scripted_api, "gemini-cli", "run_shell_command", "write_file")


def _solves_natively(docker_client, tmp_path: Path, api: FakeModelAPI, harness: str, shell: str, write: str,
                     also: frozenset[str] | set[str] = frozenset()) -> None:
    """The harness solves word_count inside the seal with its own shell then its own writer: scored 1.0,
    its tools offered and every model call forwarded, the run verifies, the trajectory shows both."""
    plan = _plan(tmp_path, api, harness)
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    run = plan.run_dir
    reqs = _requests(run)
    offered = {t for r in reqs for t in r["tools"]}
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.error, result.violations, offered,
                                                                       [(r["path"], r["decision"], r.get("refused_for")) for r in reqs])
    assert result.extra["agent_mode"] == "native" and {shell, write, *also} <= offered, offered
    assert all(r["decision"] == "forwarded" for r in reqs if r["model_call"]), reqs
    report = verify_run_dir(run)
    assert report.valid, report.reasons
    _assert_native_trajectory(run, shell, write)


@pytest.mark.docker
@needs_npm
@pytest.mark.parametrize("fake_api", [ANSWER], indirect=True)
def test_a_spent_budget_ends_a_native_turn_as_timeout_with_the_reason(docker_client, tmp_path, fake_api):
    plan = _plan(tmp_path, fake_api, budgets={"max_requests": 1})
    result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    assert result.status is RunStatus.TIMEOUT and "budget of 1 model requests" in (result.error or ""), result.error
    assert len([r for r in fake_api.requests if r["path"] == "/v1/messages"]) == 1
    assert [r.get("refused_for") for r in _requests(plan.run_dir) if r["decision"] == "refused"][:1] == ["budget"]
    report = verify_run_dir(plan.run_dir)
    assert report.valid, report.reasons


@pytest.mark.docker
@needs_npm
def test_gemini_cli_native_reads_the_public_package_with_its_own_file_tool(docker_client, tmp_path):
    """Gemini CLI's file tools reach only its workspace folders; the input folder is made one
    (`--include-directories`), so its read_file returns the document instead of a refusal."""
    from ale.agents.trajectory import load_trajectory

    api = FakeModelAPI(script={"steps": GEMINI_READ_THEN_WRITE}).start()
    try:
        plan = _plan(tmp_path, api, "gemini-cli")
        result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    finally:
        api.stop()
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.status, result.error)
    steps = load_trajectory(plan.run_dir / "trajectory.json").steps
    assert [s.tool for s in steps] == ["read_file", "write_file"], [(s.tool, s.output[:200]) for s in steps]
    first_line = _DOC.strip().splitlines()[0][:40]
    assert first_line in steps[0].output, steps[0].output[:500]
