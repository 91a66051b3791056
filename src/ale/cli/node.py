"""`ale node start|stop|status`: Ray nodes with a Docker engine, capacity and a signing key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ale.cli.output import err, fail

node_app = typer.Typer(no_args_is_help=True,
                       help="Cluster nodes: a Ray node with its Docker engine, slots and signing key.")


@node_app.command("start")
def start_command(
    head: Annotated[bool, typer.Option(
        "--head", help="Start the cluster's head (prints the cluster's address last).")] = False,
    address: Annotated[str | None, typer.Option(
        "--address", help="Join the cluster at HOST:PORT (the head's address).")] = None,
    port: Annotated[int, typer.Option("--port", help="The head's GCS port (0: any free port).")] = 6379,
    node_ip: Annotated[str | None, typer.Option(
        "--node-ip",
        help="The address this node is reached at (head default: 127.0.0.1, a cluster on this machine only).")] = None,
    docker_host: Annotated[str | None, typer.Option(
        "--docker-host", help="The node's Docker engine (default: DOCKER_HOST or the local socket).")] = None,
    slots: Annotated[int | None, typer.Option(
        "--slots", min=0, help="Sandboxes at once on this node (default: 1 on a worker, 0 on a head).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="The node's name on this machine (default: HOSTNAME-RANDOM).")] = None,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file",
        help="Ray's authentication token (default: RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; "
             "the head creates it).")] = None,
) -> None:
    """Start a Ray node that runs ale's sandboxes; token authentication is always on."""
    from ale.runs.node import NodeError, start_node
    from ale.sandbox.base import SandboxError

    try:
        rec = start_node(head=head, address=address, port=port, node_ip=node_ip, docker_host=docker_host,
                         slots=slots, name=name, token_file=token_file,
                         log=lambda m: err.print(m, markup=False, highlight=False))
    except (NodeError, SandboxError) as e:
        fail(str(e), 1)
    err.print(f"node {rec['name']} started ({'head' if rec['head'] else 'worker'}, {rec['slots']} slot(s)); "
              f"signing key sha256:{rec['public_key_sha256']}; token {rec['token_file']}",
              markup=False, highlight=False)
    print(rec["address"])


@node_app.command("stop")
def stop_command(
    names: Annotated[list[str] | None, typer.Argument(help="Nodes to stop (default: the only one running).")] = None,
    all_: Annotated[bool, typer.Option(
        "--all", help="Stop every node `ale node start` started on this machine.")] = False,
) -> None:
    """Stop nodes started here (their own processes only; never other Ray processes)."""
    from ale.runs.node import NodeError, list_nodes, stop_nodes

    known = list_nodes()
    if all_:
        targets = [n["name"] for n in known]  # a node killed earlier still has things to clean
    elif names:
        targets = list(names)
    else:
        alive = [n["name"] for n in known if n["alive"]]
        if len(alive) > 1:
            fail(f"{len(alive)} nodes run here ({', '.join(alive)}): name one, or pass --all", 2)
        targets = alive
    try:
        stopped = stop_nodes(targets)
    except NodeError as e:
        fail(str(e), 1)
    for rec in stopped:
        removed = rec.get("containers_removed") or []
        err.print(f"stopped node {rec['name']}" + (f"; removed {len(removed)} container(s)" if removed else ""))
    if not targets:
        err.print("no node is running here")


@node_app.command("status")
def status_command(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The nodes started on this machine."""
    from ale.runs.node import list_nodes

    known = list_nodes()
    if as_json:
        print(json.dumps(known, indent=2))
        return
    for n in known:
        print(f"{n['name']}\t{'alive' if n['alive'] else 'stopped'}\t{'head' if n.get('head') else 'worker'}\t"
              f"slots={n.get('slots')}\t{n.get('address')}\tdocker={n.get('docker_host') or 'default'}")
