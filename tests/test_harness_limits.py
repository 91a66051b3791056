"""A native harness and the sandbox's limits: the rule that raises a policy's limits
to what the harness needs (within the policy's bounds, never above what an operator
or a task card states, nor the host), the record of what the sandbox used (peak
pids, memory, /tmp against their limits), the outcome naming the limit a harness ran
into, and a real Claude Code run with sub-agents at the default limits."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid

import pytest

from ale.agents.base import AgentEnd, AgentOutcome
from ale.agents.errors import AgentConfigError
from ale.agents.harness import SANDBOX_NEEDS, _name_limits
from ale.agents.registry import make_agent
from ale.plan import AgentSpec, RunPlan
from ale.sandbox.policy import GIB, MIB, IsolationPolicy, LimitNeeds, LimitRefused, raise_to_needs
from ale.sandbox.usage import UsageMonitor, cgroup_dirs, limit_reached
from tests.conftest import EXAMPLES, TOOLS_IMAGE, require

NEEDS = LimitNeeds(pids=128, memory_bytes=1 * GIB, tmp_bytes=256 * MIB)


# -- the rule ------------------------------------------------------------------------
def test_the_default_policy_fits_every_native_harness_unchanged():
    policy = IsolationPolicy()
    fitted, raised = raise_to_needs(policy, SANDBOX_NEEDS, who="claude-code")
    assert fitted is policy and raised == {}
    for name in ("claude-code", "codex", "gemini-cli"):
        agent = make_agent(AgentSpec(name=name, config={"mode": "native"}))
        assert agent.fit_policy(policy) == policy  # type: ignore[attr-defined]
        assert agent.sandbox_limits["raised"] == {}  # type: ignore[attr-defined]


def _defaults(**values) -> IsolationPolicy:
    """A policy whose values are the defaults' as far as the rule knows (none stated)."""
    p = IsolationPolicy(**values)
    return IsolationPolicy.model_construct(**dict(p), _fields_set=set())


def test_limits_left_to_their_default_are_raised_to_the_needs_and_tmp_refitted():
    low = _defaults(pids_limit=64, memory_bytes=512 * MIB, tmpfs=(IsolationPolicy().tmpfs[0].with_size(192 * MIB),))
    fitted, raised = raise_to_needs(low, NEEDS, who="claude-code", host_memory=16 * GIB)
    assert fitted.pids_limit == 128 and fitted.memory_bytes == 1 * GIB
    tmp = [t for t in fitted.tmpfs if t.path == "/tmp"][0].size_bytes
    assert tmp is not None and tmp >= 256 * MIB and fitted.tmpfs_problem() is None
    assert raised == {"pids_limit": {"from": 64, "to": 128}, "memory_bytes": {"from": 512 * MIB, "to": GIB},
                      "tmp_bytes": {"from": 192 * MIB, "to": tmp}}
    # Only /tmp short: memory is raised as far as /tmp needs it (tmpfs take at most half of it), no further.
    fitted, raised = raise_to_needs(_defaults(memory_bytes=256 * MIB), LimitNeeds(tmp_bytes=256 * MIB), who="x", host_memory=16 * GIB)
    assert set(raised) == {"memory_bytes", "tmp_bytes"} and fitted.memory_bytes == 768 * MIB and fitted.tmpfs_problem() is None


def test_a_limit_an_operator_states_is_never_raised_the_refusal_names_it_and_the_fix():
    with pytest.raises(LimitRefused, match=r"pids_limit >= 128.*gives 64.*Set pids_limit to at least 128.*bridge mode"):
        raise_to_needs(IsolationPolicy(pids_limit=64), NEEDS, who="claude-code (native mode)")
    with pytest.raises(LimitRefused, match=r"memory_bytes >= 1024 MiB.*gives 512 MiB"):
        raise_to_needs(IsolationPolicy(memory_bytes=512 * MIB), NEEDS, who="codex")
    small_tmp = IsolationPolicy(tmpfs=(IsolationPolicy().tmpfs[0].with_size(64 * MIB),))
    with pytest.raises(LimitRefused, match=r"tmpfs /tmp size >= 256 MiB.*gives 64 MiB"):
        raise_to_needs(small_tmp, NEEDS, who="gemini-cli")
    # A task card's memory is stated too (ale.tasks.card.policy_for_card): refused, the operator's policy can lift it.
    from ale.tasks.card import TaskCard, policy_for_card

    carded, _ = policy_for_card(IsolationPolicy(), TaskCard(resources={"memory": 512 * MIB}))
    with pytest.raises(LimitRefused, match="memory_bytes"):
        raise_to_needs(carded, NEEDS, who="claude-code")
    # An operator's limit above the needs is kept as it is.
    mine = IsolationPolicy(pids_limit=200, memory_bytes=2 * GIB)
    assert raise_to_needs(mine, NEEDS, who="x") == (mine, {})


def test_never_above_the_hosts_memory():
    with pytest.raises(LimitRefused, match=r"this host \(75% of its memory\) gives 768 MiB.*more memory"):
        raise_to_needs(_defaults(memory_bytes=256 * MIB), NEEDS, who="claude-code", host_memory=1 * GIB)


def test_the_agent_refuses_at_preflight_with_the_limit_named():
    agent = make_agent(AgentSpec(name="gemini-cli", config={"mode": "native"}))
    with pytest.raises(AgentConfigError, match=r"gemini-cli \(native mode\) needs pids_limit >= 128"):
        agent.fit_policy(IsolationPolicy(pids_limit=32))  # type: ignore[attr-defined]


def test_gemini_cli_sizes_its_heap_by_the_sandbox_and_runs_its_sub_agents_on_the_run_model():
    agent = make_agent(AgentSpec(name="gemini-cli", config={"mode": "native", "model": "gemini-fake-1"}))
    settings = json.loads(agent._native_files()[".gemini/settings.json"])  # type: ignore[attr-defined]
    assert settings["advanced"]["autoConfigureMemory"] is False  # no relaunch with half the host's memory as its heap
    overrides = settings["agents"]["overrides"]
    assert overrides["codebase_investigator"]["modelConfig"]["model"] == "gemini-fake-1"
    assert {o["modelConfig"]["model"] for o in overrides.values()} == {"gemini-fake-1"}


# -- what the sandbox used, and the outcome naming the limit hit ---------------------------
def test_usage_record_names_each_limit_hit():
    rec = {"available": True, "pids": {"limit": 64, "peak": 64, "refused_forks": 3},
           "memory": {"limit_bytes": 512 * MIB, "peak_bytes": 512 * MIB, "oom_kills": 1},
           "tmpfs": {"/tmp": {"size_bytes": 64 * MIB, "peak_bytes": 64 * MIB, "full": True}}}
    hit = limit_reached(rec)
    assert len(hit) == 3 and "pids limit (64)" in hit[0] and "EAGAIN" in hit[0] and "OOM" in hit[1] and "ENOSPC" in hit[2]
    out = _name_limits(AgentOutcome(AgentEnd.FAILED, detail="harness exited with code 1"), rec)
    assert out.detail is not None and out.detail.startswith("the sandbox's pids limit (64) was reached")
    assert out.detail.endswith("harness exited with code 1")
    # A harness that exits 0 after its shell calls were refused (Codex at 32 pids) is scored; the record says why.
    finished = _name_limits(AgentOutcome(AgentEnd.FINISHED, detail="harness exited with code 0"), rec)
    assert finished.end is AgentEnd.FINISHED and finished.usage["sandbox_limits_hit"] == hit
    assert finished.detail is not None and "EAGAIN" in finished.detail
    clean = {**rec, "pids": {**rec["pids"], "refused_forks": 0}, "memory": {**rec["memory"], "oom_kills": 0},
             "tmpfs": {"/tmp": {**rec["tmpfs"]["/tmp"], "full": False}}}
    untouched = _name_limits(AgentOutcome(AgentEnd.FINISHED, detail="harness exited with code 0"), clean)
    assert untouched.detail == "harness exited with code 0" and "sandbox_limits_hit" not in untouched.usage
    assert limit_reached({"available": False, "reason": "remote engine"}) == []
    assert UsageMonitor(None).record() == {"available": False, "reason": UsageMonitor(None).reason}


@pytest.mark.docker
def test_usage_monitor_reads_a_real_containers_cgroup(docker_client, label):
    c = docker_client.containers.run(TOOLS_IMAGE, ["sh", "-c", "head -c 8388608 /dev/zero > /tmp/x; for i in 1 2 3 4 5; do sleep 30 & done; sleep 30"],
                                     detach=True, pids_limit=64, mem_limit="256m", tmpfs={"/tmp": "size=32m"},
                                     labels={"ale.managed": "1", "ale.test": label}, user="1000:1000")
    try:
        c.reload()
        mon = UsageMonitor(c.attrs["State"]["Pid"])
        require(mon.available or os.geteuid() == 0, f"the cgroup is not readable without root: {mon.reason}")
        assert mon.available, mon.reason
        dirs = cgroup_dirs(c.attrs["State"]["Pid"])
        assert dirs["pids"].is_dir() and dirs["memory"].is_dir()

        async def watch() -> dict:
            async with mon.watching(0.1):
                await asyncio.sleep(1.5)
            return mon.record()

        rec = asyncio.run(watch())
    finally:
        c.remove(force=True)
    assert rec["pids"]["limit"] == 64 and 6 <= rec["pids"]["peak"] < 64 and rec["pids"]["refused_forks"] == 0
    assert rec["memory"]["limit_bytes"] == 256 * MIB and rec["memory"]["peak_bytes"] >= 8 * MIB
    assert rec["tmpfs"]["/tmp"]["size_bytes"] == 32 * MIB and rec["tmpfs"]["/tmp"]["peak_bytes"] >= 8 * MIB
    assert limit_reached(rec) == []


# -- a real run: Claude Code with sub-agents at the default limits -----------------------
needs_npm = pytest.mark.requires(shutil.which("npm") is not None, "native mode fetches the harness with the host's npm")


@pytest.mark.docker
@needs_npm
def test_claude_code_with_sub_agents_fits_the_default_limits_and_records_its_peaks(docker_client, tmp_path):
    from ale.runs.lifecycle import execute_run
    from ale.sandbox.docker import DockerProvider
    from ale.status import RunStatus
    from tests.fake_model_api import FakeModelAPI, heavy_script
    from tests.test_harness_native import ANSWER

    api = FakeModelAPI(script=heavy_script(ANSWER)["claude-code"]).start()
    cfg = {"mode": "native", "model": "claude-fake-1", "ALE_GATEWAY_ANTHROPIC_UPSTREAM": api.url}
    plan = RunPlan(run_id=f"hl-{uuid.uuid4().hex[:12]}", task_dir=str(EXAMPLES / "files" / "word_count"), variant=0,
                   agent=AgentSpec(name="claude-code", config=cfg), image=TOOLS_IMAGE, policy=IsolationPolicy(),
                   runs_dir=str(tmp_path / "runs"), signing_key=str(tmp_path / "key.pem"))
    try:
        result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    finally:
        api.stop()
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.error, result.violations)
    # Two sub-agents ran (their requests carry the mark) and each ran Bash: its tool result came back.
    sub = [r for r in api.requests if r["body"] and "ALE-SUBAGENT" in json.dumps(r["body"].get("messages", [])[:1])]
    assert len({json.dumps(r["body"]["messages"][0]) for r in sub}) >= 1 and any("tool_result" in json.dumps(r["body"]) for r in sub)
    conf = json.loads((plan.run_dir / "agent" / "confinement.json").read_text())
    res = conf["resources"]
    assert res["available"], res
    assert res["pids"]["limit"] == 256 and 0 < res["pids"]["peak"] <= SANDBOX_NEEDS.pids, res  # within its declared need
    assert res["memory"]["limit_bytes"] == 8 * GIB and 0 < res["memory"]["peak_bytes"] <= SANDBOX_NEEDS.memory_bytes, res
    assert res["tmpfs"]["/tmp"]["size_bytes"] == 1 * GIB and not res["tmpfs"]["/tmp"]["full"], res
    assert res["pids"]["refused_forks"] == 0 and not res["memory"]["oom_kills"]
    assert conf["sandbox_limits"]["raised"] == {} and conf["sandbox_limits"]["needs"]["pids_limit"] == 128
    agent_doc = json.loads((plan.run_dir / "evidence" / "agent.json").read_text())
    assert agent_doc["details"]["sandbox_needs"] == SANDBOX_NEEDS.to_dict()


@pytest.mark.docker
@needs_npm
def test_a_raised_limit_is_what_the_sandbox_got_and_is_recorded(docker_client, tmp_path):
    """A policy whose pids are left to a (lowered) default is raised to the harness's need:
    the sandbox gets it (its cgroup says so), evidence/policy.json holds it, the event log
    and the agent's record say what was raised; the run verifies."""
    from ale.record.verify import verify_run_dir
    from ale.runs.lifecycle import execute_run
    from ale.sandbox.docker import DockerProvider
    from ale.status import RunStatus
    from tests.fake_model_api import FakeModelAPI
    from tests.test_harness_native import ANSWER

    api = FakeModelAPI(native_command=ANSWER).start()
    cfg = {"mode": "native", "model": "claude-fake-1", "ALE_GATEWAY_ANTHROPIC_UPSTREAM": api.url}
    low = IsolationPolicy.model_construct(**dict(IsolationPolicy(pids_limit=64, memory_bytes=2 * GIB)), _fields_set={"memory_bytes"})
    plan = RunPlan(run_id=f"hl-{uuid.uuid4().hex[:12]}", task_dir=str(EXAMPLES / "files" / "word_count"), variant=0,
                   agent=AgentSpec(name="claude-code", config=cfg), image=TOOLS_IMAGE, policy=low,
                   runs_dir=str(tmp_path / "runs"), signing_key=str(tmp_path / "key.pem"))
    try:
        result = asyncio.run(execute_run(plan, provider=DockerProvider(docker_client)))
    finally:
        api.stop()
    run = plan.run_dir
    assert result.status is RunStatus.SCORED and result.score == 1.0, (result.error, result.violations)
    assert json.loads((run / "plan.json").read_text())["policy"]["pids_limit"] == 64  # what was asked
    assert json.loads((run / "evidence" / "policy.json").read_text())["pids_limit"] == 128  # what ran
    conf = json.loads((run / "agent" / "confinement.json").read_text())
    assert conf["sandbox_limits"]["raised"] == {"pids_limit": {"from": 64, "to": 128}}
    assert conf["resources"]["pids"]["limit"] == 128  # the cgroup's own value
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["raised"] for e in events if e["type"] == "policy.raised"] == [{"pids_limit": {"from": 64, "to": 128}}]
    report = verify_run_dir(run)
    assert report.valid, report.reasons

