"""`ale env build PATH`: build the tasks' environment images ahead of their runs.

PATH is a task folder, a tree of them (ALE's ``tasks/``) or an experiment file.
Each task's needs (its card's ``software``, an ``environment`` block, the overlay)
are resolved; each distinct set is built once (content-cached, layers shared), with
progress and sizes. A variant's ``input/runtime_env/`` manifests live in its data:
runs add them on first use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ale.defaults import DEFAULT_TOOLS_IMAGE

env_app = typer.Typer(no_args_is_help=True, help="Task environments: each task's software, built before its runs.")
err = Console(stderr=True, soft_wrap=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


def _task_dirs(path: Path) -> tuple[list[Path], str | None, str]:
    """The task folders PATH names, the experiment's overlay (if any) and base image."""
    if path.is_file() and path.suffix in (".yaml", ".yml", ".json"):
        from ale.runs.experiment import load_experiment, resolve_tasks

        exp = load_experiment(path)
        dirs = list(dict.fromkeys(Path(t.task_dir) for t in resolve_tasks(exp)))
        env = exp.environment
        overlay = str(exp.resolve(env.software_overlay)) if env.software_overlay else None
        return dirs, overlay, env.image
    from ale.tasks.listing import find_task_dirs

    return find_task_dirs(path), None, DEFAULT_TOOLS_IMAGE


@env_app.command("build")
def build(
    path: Annotated[Path, typer.Argument(help="A task folder, a tree of them, or an experiment file.")],
    overlay: Annotated[Path | None, typer.Option("--overlay", envvar="ALE_OVERLAY",
                                                 help="An operator's overlay of software needs (YAML/JSON).")] = None,
    image: Annotated[str | None, typer.Option("--image", help="The base image (default: the tools image, "
                                                              "or the experiment's).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object per task on stdout.")] = False,
) -> None:
    """Resolve every task's software and build its environment image (cached by content)."""
    from ale.runs.software import SoftwareError, build_for, read_overlay, resolve
    from ale.sandbox.image import build_tools_image
    from ale.tasks.card import load_card
    from ale.tasks.errors import TaskError

    if not path.exists():
        raise _fail(f"{path}: no such file or folder")
    try:
        dirs, exp_overlay, exp_image = _task_dirs(path)
        ov = read_overlay(str(overlay) if overlay is not None else exp_overlay)
    except (SoftwareError, ValueError) as e:
        raise _fail(str(e)) from None
    if not dirs:
        raise _fail(f"{path}: no task folder (a folder with main.py) under it")
    say = lambda line: err.print(f"[dim]{escape(line)}[/]")  # noqa: E731
    base = image or exp_image
    if base == DEFAULT_TOOLS_IMAGE:
        base = build_tools_image(say=say)
    rows: list[dict[str, Any]] = []
    built: dict[str, str] = {}
    failed = 0
    for i, d in enumerate(dirs, 1):
        row: dict[str, Any] = {"task": str(d)}
        try:
            reason = load_card(d).unsupported_reason("docker")
            if reason is not None:  # a Windows VM: nothing to build here
                row.update(skipped=reason)
                rows.append(row)
                if json_out:
                    print(json.dumps(row), flush=True)
                continue
            prov = resolve(d, input_dir=None, overlay=ov)
            key = f"{prov.spec.key()}:{prov.image}"
            if key not in built:
                err.print(f"[bold][{i}/{len(dirs)}][/] {escape(str(d))}: {len(prov.needs)} need(s), "
                          f"{len(prov.missing)} missing")
                built[key], doc = build_for(prov, base, say)
            else:
                doc = {"image": built[key], "kind": "shared", "missing": [m.model_dump(mode="json") for m in prov.missing]}
            row.update(image=built[key], kind=doc.get("kind"), size=doc.get("size"), build_s=doc.get("build_s"),
                       cached=doc.get("cached"), declared=prov.declared,
                       provisioned=[n.name for n in prov.needs],
                       missing=[{"name": m.get("name"), "why": m.get("why")} for m in doc.get("missing", [])])
        except (SoftwareError, TaskError, ValueError, OSError) as e:
            failed += 1
            row["error"] = str(e)
            err.print(f"[red]✗[/] {escape(str(d))}: {escape(str(e))}")
        rows.append(row)
        if json_out:
            print(json.dumps(row), flush=True)
    images = sorted({r["image"] for r in rows if "image" in r})
    built_rows = [r for r in rows if "image" in r]
    complete = sum(1 for r in built_rows if not r["missing"])
    skipped = sum(1 for r in rows if "skipped" in r)
    err.print(f"{len(rows)} task(s): {complete} fully provisioned, {len(built_rows) - complete} with missing software, "
              f"{skipped} skipped (unsupported here), {failed} failed; {len(images)} distinct image(s)")
    for r in rows:
        for m in r.get("missing", []):
            err.print(f"  [yellow]missing[/] {escape(Path(r['task']).name)}: {escape(str(m['name']))}: {escape(str(m['why']))}")
    if failed:
        raise typer.Exit(1)
