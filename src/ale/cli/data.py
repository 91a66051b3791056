"""`ale data ...` (pull, seal, unseal, validate) and `ale image bake`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ale.cli.output import fail
from ale.data.base import DataError, ImageStore, VariantKey
from ale.defaults import DEFAULT_TOOLS_IMAGE

data_app = typer.Typer(no_args_is_help=True, help="Fetch, seal and check task data.")

SecretsOpt = Annotated[
    Path | None,
    typer.Option(
        "--secret-store",
        envvar="ALE_GRADER_SECRETS",
        help="The grader's password file (default: <config dir>/grader-secrets.json).",
    ),
]


LayoutOpt = Annotated[
    str | None,
    typer.Option(
        "--layout",
        help="Data root layout: auto (each variant under <root>/<d>/<t>/<v> or <root>/tasks/<d>/<t>/<v>), "
             "ale or tasks.",
    ),
]


def _image_store(spec: str) -> ImageStore | None:
    """The Docker image store for an image: spec, else None (no engine needed)."""
    if not spec.strip().startswith("image:"):
        return None
    from ale.sandbox.docker import connect
    from ale.sandbox.docker_images import DockerImageStore

    return DockerImageStore(connect())


def _targets(target: Path, data: str | None) -> list[tuple[str, list[VariantKey], Path]]:
    """(source spec, variant keys, base dir) for a task folder or an experiment file."""
    from ale.data.sources import anchor_spec
    from ale.tasks.card import load_card
    from ale.tasks.process import inspect_task_sync

    if target.is_file() and target.suffix in (".yaml", ".yml"):
        try:
            from ale.runs.experiment import load_experiment, resolve_tasks
        except ImportError as exc:
            raise DataError(f"{target}: experiment files are not supported in this build") from exc
        try:
            exp = load_experiment(target)
            resolved = resolve_tasks(exp)
        except ValueError as exc:  # ExperimentError
            raise DataError(str(exc)) from exc
        # Where each spec came from is its base: --data the current folder, the
        # experiment's its file's folder, a card's its task folder.
        env_data = anchor_spec(exp.environment.data_source, exp.base_dir) if exp.environment.data_source else None
        given = anchor_spec(data, Path.cwd()) if data else None
        out = []
        for rt in resolved:
            spec = given or env_data or load_card(rt.task_dir).data_source
            if not spec:
                raise DataError(f"{rt.task_dir}: no data source (task card, experiment or --data)")
            variants = inspect_task_sync(rt.task_dir).variants
            keys = sorted({variants[i].data_key for i in rt.variants if i < len(variants)}, key=lambda k: k.relpath)
            out.append((spec, keys, rt.task_dir))
        return out
    if not target.is_dir():
        raise DataError(f"{target} is neither a task folder nor an experiment file (.yaml)")
    card = load_card(target)
    spec = anchor_spec(data, Path.cwd()) if data else card.data_source
    if not spec:
        raise DataError(f"{target}: the task card names no data_source; pass --data SOURCE")
    keys = sorted({v.data_key for v in inspect_task_sync(target).variants}, key=lambda k: k.relpath)
    return [(spec, keys, target.resolve())]


@data_app.command()
def pull(
    target: Annotated[Path, typer.Argument(help="A task folder or an experiment file.")],
    data: Annotated[str | None, typer.Option(
        "--data", envvar="ALE_DATA", help="Data source (default: the task card's).")] = None,
    reference: Annotated[bool, typer.Option(
        "--reference/--no-reference", help="Also cache the reference (sealed or not); trusted machines only.")] = False,
    anon: Annotated[bool, typer.Option("--anon", help="Anonymous access (public buckets).")] = False,
    layout: LayoutOpt = None,
) -> None:
    """Prefetch a task's (or an experiment's) data into the verified cache."""
    from ale.data.sources import prefetch

    try:
        total = 0
        for spec, keys, base in _targets(target, data):
            total += prefetch(
                spec, keys, base_dir=base, layout=layout, reference=reference, anon=anon or None,
                image_store=_image_store(spec),
            )
        typer.echo(f"{total} bytes cached")
    except (DataError, ValueError) as exc:  # TaskError is a ValueError
        fail(str(exc), 1)
    except Exception as exc:  # SandboxError from connect(): the engine is not running
        fail(str(exc), 1)


@data_app.command()
def seal(
    variant_dirs: Annotated[list[Path], typer.Argument(help="Variant folders holding reference/.")],
    secret_store: SecretsOpt = None,
    remove_clear: Annotated[bool, typer.Option(
        "--remove-clear", help="Delete the clear reference/ after sealing.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Re-seal over an existing reference.7z (new password).")] = False,
    compression: Annotated[str, typer.Option(
        "--compression", help="zstd (fast, default) | deflate | lzma2 | copy.")] = "zstd",
) -> None:
    """Pack reference/ into an encrypted reference.7z; the password goes to the grader's secret store."""
    from ale.data.sealing import seal_variant

    try:
        for v in variant_dirs:
            r = seal_variant(v, secret_store, remove_clear=remove_clear, force=force, compression=compression)
            typer.echo(f"{r.archive}: sha256 {r.sha256}, {r.files} files, {r.size} bytes; password in {r.secret_store}")
    except DataError as exc:
        fail(str(exc), 1)


@data_app.command()
def unseal(
    variant_dirs: Annotated[list[Path], typer.Argument(help="Variant folders holding reference.7z.")],
    secret_store: SecretsOpt = None,
) -> None:
    """For authors: decrypt reference.7z back into reference/."""
    from ale.data.sealing import unseal_variant

    try:
        for v in variant_dirs:
            typer.echo(f"unsealed into {unseal_variant(v, secret_store)}")
    except DataError as exc:
        fail(str(exc), 1)


@data_app.command()
def validate(
    root: Annotated[Path, typer.Argument(help="A data root (<root>/<domain>/... or <root>/tasks/<domain>/...).")],
    require_sealed: Annotated[bool, typer.Option("--require-sealed", help="A clear reference/ is an error.")] = False,
    huge: Annotated[int, typer.Option("--huge-bytes", help="Warn about files larger than this.")] = 1024**3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the problems as JSON.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too.")] = False,
    layout: LayoutOpt = None,
) -> None:
    """Check a data root's layout: missing input or reference, stray or huge files, unsealed references."""
    from ale.data.validate import validate_root

    try:
        problems = validate_root(root, layout=layout or "auto", require_sealed=require_sealed, huge_bytes=huge)
    except DataError as exc:
        fail(str(exc), 1)
        return
    if as_json:
        typer.echo(json.dumps([p.model_dump() for p in problems], indent=2))
    else:
        for p in problems:
            typer.secho(str(p), fg=typer.colors.RED if p.severity == "error" else typer.colors.YELLOW)
        errors = sum(p.severity == "error" for p in problems)
        typer.echo(f"{errors} error(s), {len(problems) - errors} warning(s)")
    if any(p.severity == "error" or strict for p in problems):
        raise typer.Exit(1)


def bake_command(
    data_root: Annotated[Path, typer.Argument(help="A data root (either layout) with sealed references.")],
    tag: Annotated[str, typer.Option("--tag", help="The image to build.")] = "ale-data:latest",
    base: Annotated[str, typer.Option("--base", help="The image to build FROM.")] = DEFAULT_TOOLS_IMAGE,
    task: Annotated[list[str] | None, typer.Option(
        "--task", help="domain/task/variant to include (repeatable; default: all).")] = None,
    image_data_root: Annotated[str, typer.Option(
        "--data-root", help="Where the data lives inside the image.")] = "/opt/ale-data",
    layout: LayoutOpt = None,
) -> None:
    """Bake task data (input, software, reference.7z; never a clear reference) into an image."""
    from ale.data.baked import bake_image
    from ale.data.base import check_layout
    from ale.sandbox.docker import connect
    from ale.sandbox.docker_images import DockerImageStore

    try:
        keys = [VariantKey.parse(t) for t in task] if task else None
        choice = check_layout(layout or "auto", "--layout")
        store = DockerImageStore(connect())
        image_id = bake_image(store, data_root, keys, tag, base, image_data_root=image_data_root, layout=choice)
        typer.echo(f"{tag} {image_id}")
        typer.echo(f"use it with --data image:{tag}")
    except DataError as exc:
        fail(str(exc), 1)
    except Exception as exc:  # SandboxError from connect(): the engine is not running
        fail(str(exc), 1)
