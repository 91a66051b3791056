"""`ale agents ...`: agent-side commands (mounted by the main CLI as a sub-app).

- ``ale agents list``: the agents and tools known.
- ``ale agents schema [PATH]``: publish the trajectory JSON Schema.
- ``ale agents check-script FILE``: validate a replay script.
- ``ale agents mcp-stdio --container NAME``: serve the MCP bridge over stdio for
  one running ale container (for harnesses that only launch stdio servers).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from ale.agents.errors import AgentConfigError
from ale.cli.output import fail
from ale.defaults import CANDIDATE_USER, DEFAULT_OUTPUT_DIR
from ale.sandbox.tools import ALL_TOOLS

app = typer.Typer(help="Agents: list them, check replay scripts, publish schemas, serve the MCP bridge.",
                  no_args_is_help=True)

DEFAULT_SCHEMA_PATH = Path("schemas/trajectory.schema.json")


@app.command("list")
def list_agents() -> None:
    """Print the agents ale can run and the tools an allowlist may name."""
    from ale.agents.registry import AGENTS
    from ale.sandbox.harness_image import HARNESSES

    for name, (module, cls) in AGENTS.items():
        h = HARNESSES.get(name)
        pinned = f"  {h.spec}, mode: native (default) | bridge" if h is not None else ""
        typer.echo(f"{name:11s} {module}.{cls}{pinned}")
    typer.echo("tools:   " + ", ".join(ALL_TOOLS))


@app.command("schema")
def schema(path: Path = typer.Argument(DEFAULT_SCHEMA_PATH, help="Where to write the JSON Schema.")) -> None:
    """Write the trajectory JSON Schema (trajectory.json conforms to it)."""
    from ale.agents.trajectory import write_schema

    typer.echo(str(write_schema(path)))


@app.command("check-script")
def check_script(path: Path) -> None:
    """Validate a replay script; exits 1 with the file and index at fault."""
    from ale.agents.replay import load_script

    try:
        calls = load_script(path)
    except AgentConfigError as e:
        fail(str(e), 1)
    typer.echo(f"{path}: {len(calls)} call(s): " + ", ".join(c.tool for c in calls))


@app.command("mcp-stdio")
def mcp_stdio(
    container: str = typer.Option(..., help="Name or id of a running container ale created (label ale.managed=1)."),
    workdir: str = typer.Option(DEFAULT_OUTPUT_DIR, help="The workspace path inside the container."),
    allow: str = typer.Option(",".join(ALL_TOOLS), help="Comma-separated tool allowlist."),
    user: str = typer.Option(CANDIDATE_USER, help="The candidate uid:gid tools run as."),
    trajectory_dir: Path | None = typer.Option(
        None, help="Record steps to DIR/trajectory.jsonl (and .json at the end)."),
    max_steps: int | None = typer.Option(None, help="Refuse tool calls past this many."),
) -> None:
    """Serve the MCP tools of one container over stdin/stdout."""
    from ale.agents.mcp_bridge import serve_stdio
    from ale.agents.trajectory import TrajectoryWriter
    from ale.sandbox.base import LABEL_MANAGED, SandboxError, SandboxGone
    from ale.sandbox.policy import IsolationPolicy
    from ale.sandbox.providers import make_provider
    from ale.sandbox.tools import ToolBox

    allowlist = tuple(t.strip() for t in allow.split(",") if t.strip())
    unknown = set(allowlist) - set(ALL_TOOLS)
    if unknown:
        fail(f"unknown tools {sorted(unknown)}; known: {', '.join(ALL_TOOLS)}", 2)
    try:
        # Only `user` is read from the policy on the exec path; the rest stays at its defaults.
        sandbox = make_provider().attach(container, IsolationPolicy(user=user, cpus=1.0))
        found = sandbox.inspect()
    except SandboxGone as e:
        fail(f"container {container!r} not found: {e}", 1)
    except SandboxError as e:
        fail(str(e), 1)
    labels = (found.get("Config") or {}).get("Labels") or {}
    status = (found.get("State") or {}).get("Status")
    if labels.get(LABEL_MANAGED) != "1":
        fail(f"container {container!r} was not created by ale (no {LABEL_MANAGED}=1 label); refusing", 1)
    if status != "running":
        fail(f"container {container!r} is {status}, not running", 1)
    writer = TrajectoryWriter(trajectory_dir, "mcp-stdio", "mcp-stdio") if trajectory_dir else None
    tools = ToolBox(sandbox, workdir=workdir, allowlist=allowlist, recorder=writer)
    try:
        asyncio.run(serve_stdio(tools, max_steps=max_steps))
    finally:
        if writer is not None:
            writer.close(usage={"tool_calls": tools.steps}, end="finished")


if __name__ == "__main__":  # `python -m ale.cli.agents mcp-stdio ...` works without the main CLI
    app()
