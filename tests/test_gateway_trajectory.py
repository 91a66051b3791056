"""A native harness's trajectory, derived from the gateway's record: one step per
tool call the model made, joined to the result a later request carried back, per API
format; malformed and missing results; the harness's own transcript copied out."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from ale import layout
from ale.agents.gateway.record import GatewayRecorder
from ale.agents.gateway.steps import NO_RESULT, derive_steps
from ale.agents.gateway.tools import HarnessProfile, ToolPolicy
from ale.agents.harness_transcript import MAX_FILE_BYTES, ingest
from ale.agents.trajectory import TrajectoryWriter, load_trajectory
from ale.record.evidence import run_files


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


class Record:
    """Writes a gateway record the way the gateway does: start, then request/response pairs."""

    def __init__(self, run_dir: Path, *, native: bool = True):
        self.run_dir = run_dir
        self.rec = GatewayRecorder(run_dir)
        policy = ToolPolicy(("shell",), HarnessProfile(), client_tools=native)
        self.rec.append("gateway.start", policy=policy.to_dict(), upstreams={}, limits={})

    def exchange(self, api: str, path: str, body: Any, response: bytes, *, streamed: bool = False, status: int = 200,
                 usage: dict[str, Any] | None = None) -> int:
        seq = self.rec.seq + 1
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.rec.append("request", api=api, method="POST", path=path, query=[], headers=[], body=self.rec.body(seq, "request", raw),
                        model_call=True, model=None, tools=[], forbidden=[], decision="forwarded")
        self.rec.append("response", request=seq, status=status, headers=[], body=self.rec.body(seq + 1, "response", response),
                        streamed=streamed, model_call=True, by="upstream", usage=usage or {"input_tokens": 100, "output_tokens": 20})
        return seq

    def close(self) -> Path:
        self.rec.close()
        return self.run_dir


def _anthropic_use(*calls: tuple[str, str, dict[str, Any]]) -> bytes:
    return json.dumps({"type": "message", "role": "assistant", "stop_reason": "tool_use",
                       "content": [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]}).encode()


def _anthropic_text(text: str = "done") -> bytes:
    return json.dumps({"type": "message", "role": "assistant", "content": [{"type": "text", "text": text}]}).encode()


def test_anthropic_calls_join_their_results_by_id_even_when_the_ids_repeat(tmp_path: Path) -> None:
    r = Record(tmp_path)
    user = {"role": "user", "content": "count the words"}
    use1 = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "wc -w f"}}]}
    res1 = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "42 f"}]}
    use2 = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "Write",
                                              "input": {"file_path": "/workspace/a.json", "content": "{}"}}]}
    res2 = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "is_error": True,
                                         "content": [{"type": "text", "text": "File exists"}]}]}
    # Streamed first answer (SSE deltas), then plain JSON answers.
    stream = _sse([{"type": "message_start", "message": {"usage": {"input_tokens": 100}}},
                   {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {}}},
                   {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"command": '}},
                   {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '"wc -w f"}'}},
                   {"type": "content_block_stop", "index": 0}])
    s1 = r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": [user]}, stream, streamed=True,
                    usage={"input_tokens": 100, "output_tokens": 20, "cost_usd": 0.0006})
    # Token counting carries the same history: never the source of a result.
    r.exchange("anthropic", "/v1/messages/count_tokens", {"model": "m", "messages": [user, use1, res1]}, b'{"input_tokens": 9}')
    s2 = r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": [user, use1, res1]},
                    _anthropic_use(("toolu_01", "Write", {"file_path": "/workspace/a.json", "content": "{}"})))
    s3 = r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": [user, use1, res1, use2, res2]}, _anthropic_text())
    d = derive_steps(r.close())
    steps = d["steps"]
    assert [(s["tool"], s["args"], s["ok"], s.get("output")) for s in steps] == [
        ("Bash", {"command": "wc -w f"}, True, "42 f"),
        ("Write", {"file_path": "/workspace/a.json", "content": "{}"}, False, "File exists"),
    ]
    assert steps[1]["error"] and "error" in steps[1]["error"]
    g1, g2 = steps[0]["gateway"], steps[1]["gateway"]
    assert (g1["call_request"], g1["result_request"], g1["call_id"]) == (s1, s2, "toolu_01")
    assert (g2["call_request"], g2["result_request"]) == (s2, s3)
    assert g1["turn_usage"]["cost_usd"] == 0.0006 and g1["turn_usage"]["output_tokens"] == 20
    records = [json.loads(line) for line in (tmp_path / layout.GATEWAY_DIR / layout.Gateway.RECORDS).read_text().splitlines()]
    by_seq = {rec["seq"]: rec for rec in records}
    assert g1["call_record"] == by_seq[s1 + 1]["hash"] and g1["result_record"] == by_seq[s2]["hash"]
    assert d["derivation"]["calls"] == 2 and d["derivation"]["answered"] == 2 and d["derivation"]["malformed"] == 0


def test_responses_function_and_custom_tool_calls_join_by_call_id(tmp_path: Path) -> None:
    r = Record(tmp_path)
    exec_call = {"type": "function_call", "call_id": "call_a", "name": "exec_command", "arguments": json.dumps({"cmd": "wc -w f"})}
    patch = "*** Begin Patch\n*** Add File: answer.json\n+{}\n*** End Patch\n"
    patch_call = {"type": "custom_tool_call", "call_id": "call_b", "name": "apply_patch", "input": patch}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    out_a = {"type": "function_call_output", "call_id": "call_a", "output": "Process exited with code 0\nOutput:\n42 f"}
    out_b = {"type": "custom_tool_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "Success."}]}
    completed = {"type": "response.completed", "response": {"output": [exec_call], "usage": {"input_tokens": 1}}}
    r.exchange("openai", "/responses", {"model": "m", "input": [user]}, _sse([completed]), streamed=True)
    # Only output_item.done events (a completed event without output): still read.
    r.exchange("openai", "/responses", {"model": "m", "input": [user, exec_call, out_a]},
               _sse([{"type": "response.output_item.done", "item": patch_call}, {"type": "response.completed", "response": {}}]), streamed=True)
    r.exchange("openai", "/responses", {"model": "m", "input": [user, exec_call, out_a, patch_call, out_b]},
               json.dumps({"output": [{"type": "message", "content": [{"type": "output_text", "text": "done"}]}]}).encode())
    steps = derive_steps(r.close())["steps"]
    assert [(s["tool"], s["args"], s["ok"], s["output"]) for s in steps] == [
        ("exec_command", {"cmd": "wc -w f"}, True, "Process exited with code 0\nOutput:\n42 f"),
        ("apply_patch", {"input": patch}, True, "Success."),
    ]
    assert steps[1]["extra"] == {"call_kind": "custom_tool_call"} and steps[1]["gateway"]["call_id"] == "call_b"


def test_chat_completions_tool_calls_join_role_tool_messages(tmp_path: Path) -> None:
    r = Record(tmp_path)
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "shell", "arguments": '{"command":'}}]}}]}
    chunk2 = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ' "ls"}'}}]}}]}
    r.exchange("openai", "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "go"}]},
               _sse([chunk, chunk2]) + b"data: [DONE]\n\n", streamed=True)
    r.exchange("openai", "/chat/completions", {"model": "m", "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}]},
        json.dumps({"choices": [{"message": {"content": "done"}}]}).encode())
    steps = derive_steps(r.close())["steps"]
    assert [(s["tool"], s["args"], s["ok"], s["output"]) for s in steps] == [("shell", {"command": "ls"}, True, "a.txt\nb.txt")]


def test_gemini_calls_join_function_responses_by_name_and_order(tmp_path: Path) -> None:
    r = Record(tmp_path)
    path = "/v1beta/models/g:streamGenerateContent"

    def answer(*parts: dict[str, Any]) -> bytes:
        return _sse([{"candidates": [{"content": {"role": "model", "parts": list(parts)}}], "usageMetadata": {"promptTokenCount": 5}}])

    user = {"role": "user", "parts": [{"text": "go"}]}
    call1 = {"functionCall": {"name": "run_shell_command", "args": {"command": "wc -w f"}}}
    call2 = {"functionCall": {"name": "run_shell_command", "args": {"command": "wc -l f"}}}
    write = {"functionCall": {"name": "write_file", "args": {"file_path": "/workspace/a.json", "content": "{}"}}}
    # Gemini CLI gives responses ids of its own: never the model's.
    resp = [{"functionResponse": {"id": "x-1", "name": "run_shell_command", "response": {"output": "42 f"}}},
            {"functionResponse": {"id": "x-2", "name": "run_shell_command", "response": {"output": "7 f"}}}]
    r.exchange("gemini", path, {"contents": [user]}, answer(call1, call2), streamed=True)
    r.exchange("gemini", path, {"contents": [user, {"role": "model", "parts": [call1, call2]}, {"role": "user", "parts": resp}]},
               answer(write), streamed=True)
    r.exchange("gemini", path, {"contents": [user, {"role": "model", "parts": [call1, call2]}, {"role": "user", "parts": resp},
                                             {"role": "model", "parts": [write]},
                                             {"role": "user", "parts": [{"functionResponse": {"name": "write_file",
                                                                                              "response": {"error": "denied"}}}]}]},
               answer({"text": "done"}), streamed=True)
    steps = derive_steps(r.close())["steps"]
    assert [(s["tool"], s["args"].get("command"), s["ok"], s["output"]) for s in steps] == [
        ("run_shell_command", "wc -w f", True, "42 f"), ("run_shell_command", "wc -l f", True, "7 f"),
        ("write_file", None, False, '{"error": "denied"}')]
    assert [s["gateway"]["call_id"] for s in steps] == [None, None, None]


def test_a_call_without_a_result_is_a_step_that_says_so(tmp_path: Path) -> None:
    r = Record(tmp_path)
    r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "go"}]},
               _anthropic_use(("toolu_9", "Bash", {"command": "sleep 999"})))
    d = derive_steps(r.close())
    (step,) = d["steps"]
    assert step["ok"] is False and step["error"] == NO_RESULT and step["gateway"]["result_request"] is None
    assert d["derivation"]["unanswered"] == 1


@pytest.mark.parametrize("body", [
    b"\xff\xfe not json",
    b"[1, 2, 3]",
    b"[" * 5000 + b"]" * 5000,  # deeper than the JSON parser goes
    json.dumps({"messages": "not a list"}).encode(),
    json.dumps({"messages": [17, None, {"content": "x"}, {"content": [5, {"type": "tool_result"},
                                                                      {"type": "tool_result", "tool_use_id": 3, "content": "x"},
                                                                      {"type": "tool_result", "tool_use_id": "toolu_1", "content": {"a": 1}}]}]}).encode(),
])
def test_hostile_request_bodies_are_skipped_and_counted_never_fatal(tmp_path: Path, body: bytes) -> None:
    r = Record(tmp_path)
    r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": []}, _anthropic_use(("toolu_1", "Bash", {"command": "ls"})))
    r.exchange("anthropic", "/v1/messages", body, _anthropic_text())
    # A response that is not what the API sends either.
    r.exchange("anthropic", "/v1/messages", {"model": "m"}, json.dumps({"content": [3, {"type": "tool_use", "name": 7}]}).encode())
    d = derive_steps(r.close())
    assert [s["tool"] for s in d["steps"]] == ["Bash"] and d["steps"][0]["error"] == NO_RESULT
    assert d["derivation"]["malformed"] >= 1, d["derivation"]


def test_the_native_trajectory_takes_its_steps_from_the_gateway_with_large_results_beside(tmp_path: Path) -> None:
    r = Record(tmp_path)
    big = "x" * (200 * 1024)
    r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": []}, _anthropic_use(("toolu_1", "Bash", {"command": "yes x"})))
    r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big}]}]}, _anthropic_text())
    r.close()
    from ale.agents.gateway.turns import write_turns

    write_turns(tmp_path)
    ingest(tmp_path, "claude-code", "/tmp/h", b"")
    writer = TrajectoryWriter(tmp_path, "run-1", "claude-code")
    traj = load_trajectory(writer.close(end="finished"))
    assert traj.steps_source == "gateway" and traj.steps_derivation is not None and traj.steps_derivation.calls == 1
    (step,) = traj.steps
    assert step.tool == "Bash" and step.ok and step.gateway is not None and step.gateway.call_request == 2
    ref = step.files["output"]
    assert (tmp_path / ref.path).read_text() == big and len(step.output) < len(big)
    assert traj.model_turns[0].tool_calls[0].step == 1 and traj.model_turns[0].tool_calls[0].id == "toolu_1"
    assert traj.harness_transcript == layout.agent_path(layout.Agent.HARNESS_TRANSCRIPT_MANIFEST)
    # A second close() does not derive (or store) the steps again.
    traj2 = load_trajectory(writer.close(end="finished"))
    assert len(traj2.steps) == 1 and traj2.steps[0].files["output"].path == ref.path


def test_a_bridge_runs_trajectory_keeps_the_toolbox_steps(tmp_path: Path) -> None:
    r = Record(tmp_path, native=False)
    r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": []}, _anthropic_use(("toolu_1", "mcp__ale__shell", {"command": "ls"})))
    r.close()
    writer = TrajectoryWriter(tmp_path, "run-1", "command")
    writer.record({"tool": "shell", "args": {"command": "ls"}, "ok": True, "output": "a"})
    traj = load_trajectory(writer.close(end="finished"))
    assert traj.steps_source == "toolbox" and traj.steps_derivation is None and len(traj.steps) == 1 and traj.steps[0].gateway is None


def _line(path: str, data: bytes = b"", **kw: Any) -> bytes:
    return json.dumps({"path": path, "size": len(data), "data": base64.b64encode(data).decode(), **kw}).encode()


def test_the_harness_transcript_is_copied_out_bounded_and_labelled_candidate_written(tmp_path: Path) -> None:
    lines = [
        _line(".claude/projects/-workspace/s1.jsonl", b'{"type":"user"}\n'),
        _line(".claude/projects/-workspace/s1.jsonl", b"again"),  # the same path twice: kept once
        _line("../../etc/passwd", b"root"), _line("/etc/passwd", b"root"), _line(".claude/settings.json", b"{}"),
        _line(".claude/projects/a b\n/c", b"x"), _line(".claude/projects/big.jsonl", b"y" * (MAX_FILE_BYTES + 1)),
        json.dumps({"path": ".claude/projects/link", "skipped": "not a regular file"}).encode(),
        json.dumps({"path": ".claude/projects/x.jsonl", "data": "!!not base64"}).encode(),
        b"not json", b"[1]",
    ]
    m = ingest(tmp_path, "claude-code", "/tmp/ale-harness-home/claude-code", b"\n".join(lines))
    assert m["written_by"] == "candidate" and [f["source"] for f in m["files"]] == ["$HOME/.claude/projects/-workspace/s1.jsonl"]
    (f,) = m["files"]
    assert f["written_by"] == "candidate" and f["path"] == "agent/harness-transcript/.claude/projects/-workspace/s1.jsonl"
    assert (tmp_path / f["path"]).read_bytes() == b'{"type":"user"}\n' and f["bytes"] == 16
    assert m["skipped_count"] == 10, m["skipped"]
    assert not (tmp_path / "etc").exists() and not list((tmp_path / "agent").rglob("passwd"))
    on_disk = json.loads((tmp_path / layout.agent_path(layout.Agent.HARNESS_TRANSCRIPT_MANIFEST)).read_text())
    assert on_disk == m
    # Covered by the run's signed manifest like every other file of the run.
    files, odd = run_files(tmp_path)
    assert f["path"] in files and layout.agent_path(layout.Agent.HARNESS_TRANSCRIPT_MANIFEST) in files and not odd


def test_view_and_atif_show_the_gateway_steps_with_their_records(tmp_path: Path) -> None:
    from ale.agents.gateway.turns import write_turns
    from ale.report import atif, viewer
    from tests.test_viewer import synthetic_run

    src = tmp_path / "src"
    r = Record(src)
    r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": []}, _anthropic_use(("toolu_1", "Bash", {"command": "wc -w f"})))
    r.exchange("anthropic", "/v1/messages", {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42 f"}]}]},
        _anthropic_use(("toolu_2", "Write", {"file_path": "/workspace/a.json", "content": "{}"})))
    r.close()
    write_turns(src)
    traj = load_trajectory(TrajectoryWriter(src, "native-run", "claude-code").close(end="timeout"))
    run = synthetic_run(tmp_path, traj.steps, turns=traj.model_turns, name="native-run")
    (run / layout.TRAJECTORY).write_text(traj.model_dump_json())
    data = viewer.load_run(run, verify=False)
    assert any("derived from the gateway's record" in n and "1 call(s) without a result" in n for n in data.notes), data.notes
    html = viewer.render_run(data, run / "view.html")
    assert "Bash" in html and "Write" in html and "42 f" in html
    [path] = atif.export(run)
    doc = atif.validate(json.loads(path.read_text()))
    assert doc.extra and doc.extra["ale"]["steps_source"] == "gateway"
    results = [res for s in doc.steps for res in (s.observation.results if s.observation else [])]
    assert [res.content for res in results] == ["42 f", f"[error] {NO_RESULT}"]
    assert [res.extra["ale"]["gateway"]["call_request"] for res in results if res.extra] == [2, 4]


def test_a_tool_search_the_harness_runs_itself_is_a_client_tool() -> None:
    from ale.agents.gateway.tools import offered_tools

    tools = [{"type": "tool_search", "execution": "client", "parameters": {}}, {"type": "custom", "name": "apply_patch"}]
    assert offered_tools("openai", "/responses", {"tools": tools}) == ["apply_patch", "tool_search"]
    assert offered_tools("openai", "/responses", {"tools": [{"type": "tool_search"}]}) == ["server:tool_search"]
