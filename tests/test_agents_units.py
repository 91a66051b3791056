"""Agent pieces that need no container: trajectory, replay scripts, registry,
environment allowlist and redaction."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from ale.agents.errors import AgentConfigError
from ale.agents.registry import agent_evidence, known_agents, make_agent
from ale.agents.replay import load_script
from ale.agents.secrets import REDACTED, build_agent_env, is_forbidden_env
from ale.agents.trajectory import (
    INLINE_LIMIT,
    Trajectory,
    TrajectoryWriter,
    load_trajectory,
    write_schema,
)
from ale.plan import AgentSpec

REPO = Path(__file__).resolve().parents[1]


def _step(i: int, **kw) -> dict:
    base = {
        "index": i, "tool": "shell", "args": {"command": "echo hi"}, "ok": True, "refused": False,
        "exit_code": 0, "stdout": "hi\n", "stderr": "", "output": "", "truncated": False, "timed_out": False,
        "error": None, "started_at": "2026-01-01T00:00:00+00:00", "ended_at": "2026-01-01T00:00:01+00:00", "seconds": 1.0,
    }
    base.update(kw)
    return base


# -- trajectory --------------------------------------------------------------------


def test_trajectory_streams_each_step_and_closes(tmp_path):
    w = TrajectoryWriter(tmp_path, "run-1", "replay")
    w(_step(1))
    lines = (tmp_path / "trajectory.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["stdout"] == "hi\n"  # on disk before close
    w(_step(2, tool="read_file", args={"path": "/input/a"}, stdout="", output="text"))
    path = w.close(usage={"total_tokens": 7}, end="finished")
    doc = load_trajectory(path)
    assert [s.index for s in doc.steps] == [1, 2]
    assert doc.usage == {"total_tokens": 7} and doc.ended == "finished" and doc.run_id == "run-1"
    assert len((tmp_path / "trajectory.jsonl").read_text().splitlines()) == 2


def test_trajectory_large_outputs_and_binary_args_go_to_files(tmp_path):
    w = TrajectoryWriter(tmp_path, "run-2", "oracle")
    big = "x" * (INLINE_LIMIT + 10)
    w(_step(1, stdout=big))
    w(_step(2, tool="write_file", args={"path": "/workspace/a.bin", "content": b"\x00\x01\xff"}, stdout=""))
    w.close(end="finished")
    doc = load_trajectory(tmp_path / "trajectory.json")
    ref = doc.steps[0].files["stdout"]
    stored = (tmp_path / ref.path).read_bytes()
    assert stored == big.encode() and ref.bytes == len(big) and ref.sha256 == hashlib.sha256(stored).hexdigest()
    assert len(doc.steps[0].stdout) < 4096 and ref.path in doc.steps[0].stdout
    bref = doc.steps[1].files["args.content"]
    assert (tmp_path / bref.path).read_bytes() == b"\x00\x01\xff"
    assert len((tmp_path / "trajectory.jsonl").read_text()) < 16_000


def test_trajectory_unknown_keys_land_in_extra_and_overwrite_is_refused(tmp_path):
    w = TrajectoryWriter(tmp_path, "run-3", "nop")
    step = w.record(_step(1, new_field={"a": 1}))
    assert step.extra == {"new_field": {"a": 1}}
    w.close(end="finished")
    with pytest.raises(FileExistsError, match=str(tmp_path)):
        TrajectoryWriter(tmp_path, "run-3", "nop")


def test_trajectory_models_are_strict():
    with pytest.raises(ValueError):
        Trajectory.model_validate({"run_id": "r", "agent": "a", "started_at": "t", "surprise": 1})


def test_published_schema_is_current(tmp_path):
    fresh = write_schema(tmp_path / "t.json").read_text()
    published = REPO / "schemas" / "trajectory.schema.json"
    assert published.exists(), "run `ale agents schema` to publish schemas/trajectory.schema.json"
    assert json.loads(published.read_text()) == json.loads(fresh), "schemas/trajectory.schema.json is stale: run `ale agents schema`"


# -- replay scripts ------------------------------------------------------------------


def test_replay_script_errors_name_file_and_index(tmp_path):
    bad = tmp_path / "script.json"
    bad.write_text(json.dumps([{"tool": "shell", "args": {"command": "ls"}}, {"tool": "shell", "argz": {}}]))
    with pytest.raises(AgentConfigError, match=r"script\.json, index 1: argz"):
        load_script(bad)
    bad.write_text(json.dumps([{"tool": "rm_rf", "args": {}}]))
    with pytest.raises(AgentConfigError, match=r"index 0: unknown tool 'rm_rf'"):
        load_script(bad)
    bad.write_text("[{")
    with pytest.raises(AgentConfigError, match=r"script\.json is not valid JSON \(line 1"):
        load_script(bad)
    bad.write_text('{"tool": "shell"}')
    with pytest.raises(AgentConfigError, match="expected a JSON list"):
        load_script(bad)
    with pytest.raises(AgentConfigError, match="cannot read"):
        load_script(tmp_path / "missing.json")


# -- registry ------------------------------------------------------------------------


def test_registry_builds_known_agents_and_names_them_on_error(tmp_path):
    assert set(known_agents()) == {"oracle", "nop", "replay", "command", "llm", "claude-code", "codex", "gemini-cli"}
    assert make_agent(AgentSpec(name="nop")).name == "nop"
    assert make_agent(AgentSpec(name="replay", config={"steps": [{"tool": "list_dir", "args": {}}]})).name == "replay"
    assert make_agent(AgentSpec(name="command", config={"command": ["true"]})).name == "command"
    assert make_agent(AgentSpec(name="llm", config={"model": "m"})).name == "llm"
    with pytest.raises(AgentConfigError, match=r"unknown agent 'gpt'\W+known agents: oracle, nop, replay, command, llm"):
        make_agent(AgentSpec(name="gpt"))
    with pytest.raises(AgentConfigError, match="unknown tools in allowlist"):
        make_agent(AgentSpec(name="nop", allowlist=("shell", "browser")))
    with pytest.raises(AgentConfigError, match="unknown config keys"):
        make_agent(AgentSpec(name="command", config={"command": ["x"], "shel": True}))


def test_nop_does_nothing(tmp_path):
    agent = make_agent(AgentSpec(name="nop"))
    assert asyncio.run(agent.run(None)).end.value == "finished"  # type: ignore[arg-type]


def test_agent_evidence_redacts_secrets(monkeypatch):
    monkeypatch.setenv("ALE_JUDGE_API_KEY", "judge-secret-abcdef123")
    spec = AgentSpec(
        name="llm",
        allowlist=("read_file", "write_file"),
        config={"model": "m", "api_key": "sk-live-123456", "system_prompt": "x judge-secret-abcdef123 y"},
    )
    ev = agent_evidence(spec)
    text = json.dumps(ev)
    assert "sk-live-123456" not in text and "judge-secret-abcdef123" not in text
    assert ev["config"]["api_key"] == REDACTED
    assert ev["allowlist"] == ["read_file", "write_file"] and ev["refused_tools"] == ["shell", "list_dir", "computer"]
    cmd = agent_evidence(AgentSpec(name="command", config={"command": "harness {prompt}", "env_pass": ["ANTHROPIC_API_KEY"], "confine": False}))
    assert "ANTHROPIC_API_KEY" in cmd["details"]["env_names"] and "ALE_JUDGE_API_KEY" not in cmd["details"]["env_names"]


# -- environment allowlist -----------------------------------------------------------


def test_agent_env_is_an_allowlist_and_never_carries_grader_or_cloud_keys():
    environ = {
        "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "ANTHROPIC_API_KEY": "a-key-1234567",
        "ALE_JUDGE_API_KEY": "judge-key-7654321", "AWS_SECRET_ACCESS_KEY": "aws-secret-99999", "OTHER": "x",
    }
    env = build_agent_env(passthrough=["ANTHROPIC_API_KEY"], constants={"MODE": "ci"}, environ=environ)
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "ANTHROPIC_API_KEY": "a-key-1234567", "MODE": "ci"}
    for name in ("ALE_JUDGE_API_KEY", "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "DOCKER_HOST", "HF_TOKEN"):
        assert is_forbidden_env(name)
        with pytest.raises(AgentConfigError, match=name):
            build_agent_env(passthrough=[name], environ=environ)
    with pytest.raises(AgentConfigError, match="contains the value of a forbidden variable"):
        build_agent_env(constants={"SMUGGLE": "judge-key-7654321"}, environ=environ)
    with pytest.raises(AgentConfigError, match="ALE_JUDGE_API_KEY"):
        make_agent(AgentSpec(name="command", config={"command": ["x"], "env_pass": ["ALE_JUDGE_API_KEY"]}))
    with pytest.raises(AgentConfigError, match="grader or cloud credential"):
        make_agent(AgentSpec(name="llm", config={"model": "m", "api_key_env": "ALE_JUDGE_API_KEY"}))


def test_trajectory_folds_in_the_gateways_model_turns(tmp_path):
    from ale.agents.trajectory import MODEL_TURNS, TrajectoryWriter, load_trajectory

    (tmp_path / MODEL_TURNS).parent.mkdir(parents=True)
    (tmp_path / MODEL_TURNS).write_text(json.dumps({"turns": [
        {"request": 2, "api": "anthropic", "model": "m", "messages": 1, "tools_offered": ["mcp__ale__shell"], "decision": "forwarded",
         "status": 200, "usage": {"input_tokens": 3}, "text": "", "reasoning": "think",
         "tool_calls": [{"name": "mcp__ale__shell", "arguments": {"command": "true"}, "step": 1}]},
        {"request": 4, "text": "done", "tool_calls": []}]}))
    w = TrajectoryWriter(tmp_path, "r", "a")
    w.record({"tool": "shell", "args": {"command": "true"}, "ok": True, "started_at": "t", "ended_at": "t", "seconds": 0})
    traj = load_trajectory(w.close(end="finished"))
    assert [t.request for t in traj.model_turns] == [2, 4] and traj.model_turns[0].reasoning == "think"
    assert traj.model_turns[0].tool_calls[0].step == 1 and traj.model_turns[1].text == "done"


def test_trajectory_leaves_out_model_turns_that_do_not_validate(tmp_path):
    from ale.agents.trajectory import MODEL_TURNS, TrajectoryWriter, load_trajectory

    (tmp_path / MODEL_TURNS).parent.mkdir(parents=True)
    (tmp_path / MODEL_TURNS).write_text(json.dumps({"turns": [{"request": 1, "surprise": True}]}))
    traj = load_trajectory(TrajectoryWriter(tmp_path, "r", "a").close(end="finished"))
    assert traj.model_turns == [] and (tmp_path / MODEL_TURNS).exists()


# -- a confined harness's installation, read from its command line ------------------------


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_installation_of_an_npm_harness_and_its_interpreter_is_inferred(tmp_path):
    from ale.agents.gateway.confine import infer_install

    prefix = tmp_path / "opt" / "harness"
    cli = _exe(prefix / "node_modules" / "@vendor" / "cli" / "bin" / "cli.js", "#!/usr/bin/env node\n")
    (prefix / "node_modules" / ".bin").mkdir(parents=True)
    (prefix / "node_modules" / ".bin" / "cli").symlink_to("../@vendor/cli/bin/cli.js")
    node = _exe(tmp_path / "nvm" / "v22" / "bin" / "node", "\x7fELF")
    folders, files = infer_install([str(prefix / "node_modules" / ".bin" / "cli"), "-p", str(cli)],
                                   path_env=f"{node.parent}:/usr/bin")
    assert folders == sorted([str(prefix), str(tmp_path / "nvm" / "v22")], key=len)
    assert files == [str(cli)]


def test_a_venv_harness_brings_its_venv_and_base_interpreter(tmp_path):
    from ale.agents.gateway.confine import infer_install

    base = _exe(tmp_path / "py" / "3.11" / "bin" / "python3.11", "\x7fELF")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base.parent}\n")
    (venv / "bin" / "python").symlink_to(base)
    tool = _exe(venv / "bin" / "my-harness", f"#!{venv / 'bin' / 'python'}\n")
    folders, _ = infer_install([str(tool)])
    assert set(folders) == {str(venv), str(tmp_path / "py" / "3.11")}
    assert infer_install(["/usr/bin/env", "true"]) == ([], [])  # /usr is bound anyway


def test_an_installation_that_would_show_the_runs_folder_is_refused(tmp_path):
    from ale.agents.command import CommandAgent
    from ale.agents.errors import AgentConfigError

    repo = tmp_path / "repo"
    harness = _exe(repo / "bin" / "harness", "#!/bin/sh\n")
    agent = CommandAgent({"command": [str(harness)]})  # confined by default; installation: repo/
    assert agent.evidence()["confined"] is True
    with pytest.raises(AgentConfigError, match=f"installation folder '{repo}' would show"):
        agent.preflight(private=[repo / "runs", tmp_path / "task"])
    agent.preflight(private=[tmp_path / "runs"])  # elsewhere: fine
    named = CommandAgent({"command": [str(harness)], "confine": {"install": [str(repo / "bin")], "infer": False}})
    named.preflight(private=[repo / "runs"])
    assert CommandAgent({"command": [str(harness)], "confine": False}).evidence()["confined"] is False
