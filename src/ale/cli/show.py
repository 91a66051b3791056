"""`ale task show TASK` (a task's variants and prompts) and `ale key show` (the
operator's public key, what `ale verify --public-key` takes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ale.cli.output import err, fail

key_app = typer.Typer(no_args_is_help=True, help="The operator's signing key.")


@key_app.command("show")
def key_show(
    signing_key: Annotated[Path | None, typer.Option(
        "--signing-key", envvar="ALE_SIGNING_KEY",
        help="The Ed25519 PEM private key runs are signed with (default: the one in the config dir, created on "
             "first use).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Also write the public key (PEM) to FILE.")] = None,
) -> None:
    """Print the operator's public key (PEM): give it to `ale verify --public-key FILE`."""
    from ale.record.signing import (
        SigningError,
        default_key_path,
        load_or_create_signing_key,
        public_key_pem,
        public_key_sha256,
    )

    path = signing_key or default_key_path()
    try:
        key = load_or_create_signing_key(path)
    except (SigningError, OSError, ValueError) as e:
        fail(f"{path}: {e}", 1)
    pem = public_key_pem(key)
    if out is not None:
        out.write_bytes(pem)
        err.print(f"wrote {out}", markup=False, highlight=False)
    print(pem.decode().rstrip("\n"))
    err.print(f"the public key of {path} (sha256:{public_key_sha256(key)}); check a run with "
              "`ale key show -o operator.pem && ale verify RUN --public-key operator.pem`",
              markup=False, highlight=False)


def task_show_command(
    task_dir: Annotated[Path, typer.Argument(help="The task folder (holding main.py).")],
    variant: Annotated[int | None, typer.Option("--variant", "-v", help="Only this variant.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the variants as JSON.")] = False,
) -> None:
    """Print a task's card facts and each variant: its id, what it needs, and the prompt the agent gets."""
    from ale.runs.screening import data_layout_hint, screen_task
    from ale.tasks.card import load_card
    from ale.tasks.environment import TaskEnvironment, resolve_environment
    from ale.tasks.errors import TaskError
    from ale.tasks.process import TaskCallFailed, TaskProcessError, inspect_task_sync

    if not (task_dir / "main.py").is_file():
        fail(f"{task_dir}: no main.py (a task folder holds main.py)")
    try:
        card = load_card(task_dir)
        try:
            env = resolve_environment(task_dir, build=False)
        except TaskError:
            env = TaskEnvironment()
        info = inspect_task_sync(task_dir, environment=env)
    except (TaskError, TaskProcessError, TaskCallFailed) as e:
        fail(f"{task_dir}: does not load: {e}", 1)
    screen = screen_task(task_dir)
    facts = {f.index: f for f in screen.variants}
    rows = []
    for v in info.variants:
        if variant is not None and v.index != variant:
            continue
        f = facts.get(v.index)
        rows.append({
            "variant": v.index,
            "task_id": v.task_id,
            "prompt": v.description,
            "input_dir": v.input_dir,
            "output_dir": v.output_dir,
            "desktop": bool(f and f.desktop),
            "needs_data": bool(f and f.needs_data),
            "data_key": v.data_key.name,
            "unsupported": f.unsupported if f else None,
        })
    if variant is not None and not rows:
        fail(f"{task_dir}: no variant {variant} (the task has {len(info.variants)})")
    if json_out:
        print(json.dumps({"task_dir": str(task_dir), "title": card.raw.get("title"), "data_source": card.data_source,
                          "timeout_s": card.timeout_s, "variants": rows}, indent=1))
        return
    title = card.raw.get("title") or task_dir.name
    print(f"{title}  ({task_dir})")
    need = any(r["needs_data"] for r in rows)
    source = card.data_source or ("none: its variants need task data, give --data" if need else "none")
    print(f"  {len(info.variants)} variant(s); data source: {source}; "
          f"agent time limit: {card.timeout_s or 'default'} s")
    for r in rows:
        needs = ["desktop" if r["desktop"] else "shell"]
        if r["needs_data"]:
            needs.append(f"task data ({data_layout_hint(str(r['data_key']))})" if not card.data_source else "task data")
        if r["unsupported"]:
            needs.append(f"UNSUPPORTED: {r['unsupported']}")
        print(f"\nvariant {r['variant']}: {r['task_id']}  [{'; '.join(needs)}]")
        print(f"  input {r['input_dir']}, deliverables {r['output_dir']}")
        print("  prompt:")
        for line in str(r["prompt"] or "(empty)").splitlines() or ["(empty)"]:
            print(f"    {line}")
