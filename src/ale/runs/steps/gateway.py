"""AGENT's record: the model gateway's, and what it says of a failed turn."""

from __future__ import annotations

from typing import Any

from ale.agents.base import AgentEnd, AgentOutcome
from ale.agents.gateway.record import channel_checks
from ale.agents.gateway.record import evidence_record as gateway_evidence
from ale.isolation.checks import Check
from ale.layout import Evidence
from ale.phases import CheckGroup
from ale.runs.state import RunState
from ale.status import AgentLimit, InvalidAttribution, ModelFailure, not_the_agents


def name_model_failure(state: RunState, gw: dict[str, Any]) -> None:
    """An agent's turn that failed where the gateway's record shows the model's provider
    failing (past its retries, or the last answer the harness got) is infrastructure's,
    never the agent's; one that failed on the agent's own context length or a refusal
    says so (``ale.status.ModelFailure``)."""
    outcome = state.live.agent_outcome
    last = gw.get("last_failure")
    final: Any
    if outcome is not None and outcome.end is AgentEnd.TIMEOUT and outcome.limit is AgentLimit.WALL_TIME and \
            isinstance(last, dict) and not_the_agents(last["failure"]):
        final = last  # the time ran out while the provider kept failing
    elif outcome is None or outcome.end is not AgentEnd.FAILED:
        return
    else:
        final = gw.get("provider_failure") or last
    if not isinstance(final, dict):
        return
    failure = ModelFailure(final["failure"])
    if not_the_agents(failure):
        state.live.agent_outcome = AgentOutcome(
            AgentEnd.PROVIDER_FAILED, usage=outcome.usage, model_failure=failure,
            detail=f"the model's provider failed: {failure.value} (HTTP {final.get('status')}) on request "
                   f"{final.get('request')} after {final.get('retries', 0)} retries; the agent's turn ended: "
                   f"{(outcome.detail or '')[:500]}")
    else:
        outcome.model_failure = failure
        outcome.detail = f"the model's answer was {failure.value} (the agent's): {outcome.detail or ''}"


def record_model_gateway(state: RunState) -> None:
    """The model gateway's record (agents that reach a model through it): its summary
    and the harness's confinement as evidence, its chain head in the event log. A
    request that offered the model a forbidden tool makes the run invalid, charged to
    the controller's configuration when no model answer came before it."""
    doc = gateway_evidence(state.folder.run_dir)
    if doc is None:
        return
    gw = doc["gateway"]
    state.live.gateway = gw
    name_model_failure(state, gw)
    state.record.store.write_json(Evidence.CONTROLLER, doc)
    state.record.events.append("gateway.recorded", head=gw.get("head"), records=gw.get("records"),
                        tools_offered=gw.get("tools_offered", []), refusals=gw.get("refusals", []))
    problems, refusals = gw.get("problems", []), gw.get("refusals", [])
    state.record.add_checks(CheckGroup.AGENT, [
        Check("gateway.record", not problems, "an intact gateway record", problems or None, "; ".join(problems)),
        Check("gateway.tools_allowed", not refusals, "only the run's allowlisted tools offered to the model",
              [{"request": r["seq"], "forbidden": r["forbidden"]} for r in refusals] or None,
              "; ".join(f"request {r['seq']} offered the model {', '.join(r['forbidden'])}, outside the run's "
                        "allowlist; refused"
                        for r in refusals)),
        *channel_checks(doc.get("confinement")),  # a native harness's channel (none otherwise)
    ])
    if gw.get("refusals") and gw["refusals"][0].get("before_any_answer"):
        state.record.invalid_attribution = InvalidAttribution.CONTROLLER_CONFIGURATION
