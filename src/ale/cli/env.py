"""`ale env build PATH`: build the tasks' environment images ahead of their runs.

PATH is a task folder, a tree of them (ALE's ``tasks/``) or an experiment file.
Each task's needs (its card's ``software``, an ``environment`` block, the overlay)
are resolved; each distinct set is built once (content-cached, layers shared), with
progress and sizes. A variant's ``input/runtime_env/`` manifests live in its data:
with ``--data`` (or the card's ``data_source``) each variant's are read too, so the
image its runs need is the one built here.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ale.cli.output import SafeConsole, fail
from ale.defaults import DEFAULT_TOOLS_IMAGE

env_app = typer.Typer(no_args_is_help=True, help="Task environments: each task's software, built before its runs.")
err = SafeConsole(stderr=True, soft_wrap=True)


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


@contextlib.contextmanager
def _variant_inputs(task_dir: Path, data: str | None,
                    say: Callable[[str], None]) -> Iterator[list[tuple[int | None, Path | None]]]:
    """(variant index, input folder holding runtime_env/) per variant of the task, read
    from ``data`` (or the card's data_source); ``[(None, None)]`` when there is no data to
    read. A local source is read in place; a remote one fetches only the manifests; an
    image's input is staged to a temporary folder."""
    from ale.data.local import LocalSource
    from ale.data.remote import RemoteSource
    from ale.data.sources import open_source
    from ale.provision.sources import MANIFESTS, RUNTIME_ENV
    from ale.runs.screening import OK, screen_task
    from ale.sandbox.docker_images import DockerImageStore

    screen = screen_task(task_dir, "docker", build_env=True)
    spec = data or screen.data_source
    keyed = list(screen.variants) if screen.status == OK else []
    if not spec or not keyed:
        yield [(None, None)]
        return
    from ale.data.base import DataError, VariantKey

    store = None
    if spec.strip().startswith("image:"):
        from ale.sandbox.docker import connect

        store = DockerImageStore(connect())
    source = open_source(spec, base_dir=task_dir if data is None else None, image_store=store)
    with tempfile.TemporaryDirectory(prefix="ale-env-inputs-") as tmp:
        out: list[tuple[int | None, Path | None]] = []
        for v in keyed:
            key = VariantKey.parse(v.data_key)
            staged = Path(tmp) / str(v.index)
            input_dir: Path | None = staged
            try:
                if isinstance(source, LocalSource):
                    input_dir = source.variant_dir(key) / "input"
                elif isinstance(source, RemoteSource):
                    source.fetch_input_files(key, [f"{RUNTIME_ENV}/{m}" for m in MANIFESTS], staged)
                else:
                    say(f"{v.data_key}: staging its input from {spec} to read runtime_env/")
                    source.stage_input(key, staged)
            except DataError as e:
                if v.needs_data:
                    raise
                say(f"{v.data_key}: no data in {spec} ({e}); built without runtime_env/")
                input_dir = None
            out.append((v.index, input_dir))
        yield out


@env_app.command("build")
def build(
    path: Annotated[Path, typer.Argument(help="A task folder, a tree of them, or an experiment file.")],
    overlay: Annotated[Path | None, typer.Option("--overlay", envvar="ALE_OVERLAY",
                                                 help="An operator's overlay of software needs (YAML/JSON).")] = None,
    image: Annotated[str | None, typer.Option("--image", help="The base image (default: the tools image, "
                                                              "or the experiment's).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object per task on stdout.")] = False,
    data: Annotated[str | None, typer.Option("--data", envvar="ALE_DATA",
                                             help="Data source (local:DIR, gs://, s3://, hf://, image:REF): read each "
                                                  "variant's input/runtime_env/ manifests too (default: the card's "
                                                  "data_source, when it names one).")] = None,
) -> None:
    """Resolve every task's software and build its environment image (cached by content)."""
    from ale.data.base import DataError
    from ale.runs.software import SoftwareError, build_for, read_overlay, resolve
    from ale.sandbox.image import build_tools_image
    from ale.tasks.card import load_card
    from ale.tasks.errors import TaskError

    if not path.exists():
        fail(f"{path}: no such file or folder")
    try:
        dirs, exp_overlay, exp_image = _task_dirs(path)
        ov = read_overlay(str(overlay) if overlay is not None else exp_overlay)
    except (SoftwareError, ValueError) as e:
        fail(str(e))
    if not dirs:
        fail(f"{path}: no task folder (a folder with main.py) under it")
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
            with _variant_inputs(d, data, say) as inputs:
                variants = []
                for index, input_dir in inputs:
                    prov = resolve(d, input_dir=input_dir, overlay=ov)
                    key = f"{prov.spec.key()}:{prov.image}"
                    if key not in built:
                        at = "" if index is None else f" (variant {index})"
                        err.print(f"[bold][{i}/{len(dirs)}][/] {escape(str(d))}{at}: {len(prov.needs)} need(s), "
                                  f"{len(prov.missing)} missing")
                        built[key], doc = build_for(prov, base, say)
                    else:
                        doc = {"image": built[key], "kind": "shared",
                               "missing": [m.model_dump(mode="json") for m in prov.missing]}
                    variants.append((index, prov, built[key], doc))
            index, prov, image_ref, doc = variants[0]
            row.update(image=image_ref, kind=doc.get("kind"), size=doc.get("size"), build_s=doc.get("build_s"),
                       cached=doc.get("cached"), declared=prov.declared,
                       provisioned=[n.name for n in prov.needs],
                       missing=[{"name": m.get("name"), "why": m.get("why")} for m in doc.get("missing", [])])
            if index is not None:
                row["variants"] = [{"variant": ix, "image": im, "provisioned": [n.name for n in pv.needs],
                                    "missing": [{"name": m.get("name"), "why": m.get("why")}
                                                for m in dc.get("missing", [])]}
                                   for ix, pv, im, dc in variants]
        except (SoftwareError, TaskError, DataError, ValueError, OSError) as e:
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
            err.print(f"  [yellow]missing[/] {escape(Path(r['task']).name)}: {escape(str(m['name']))}: "
                      f"{escape(str(m['why']))}")
    if failed:
        raise typer.Exit(1)
