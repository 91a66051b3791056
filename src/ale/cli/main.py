"""The `ale` command: thin; every verb calls into the packages."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ale.cli.output import SafeConsole, err, fail, software_progress
from ale.defaults import DEFAULT_INPUT_DIR, DEFAULT_OUTPUT_DIR, DEFAULT_TOOLS_IMAGE
from ale.lossless import printable
from ale.result import reason_line
from ale.status import RunStatus

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Run AI agents on benchmark tasks in sandboxes proven sealed.")
image_app = typer.Typer(no_args_is_help=True, help="Build the sandbox images.")
task_app = typer.Typer(no_args_is_help=True, help="Check task folders before publishing them.")
app.add_typer(image_app, name="image")
app.add_typer(task_app, name="task")

out = SafeConsole()
# Statuses that end `ale run` with exit 1 (printed red): no valid outcome for the agent.
FAILED_RUN = frozenset({RunStatus.INVALID_EVALUATION_ENVIRONMENT, RunStatus.GRADING_FAILED,
                        RunStatus.INFRASTRUCTURE_ERROR})

RunsDir = Annotated[Path, typer.Option("--runs-dir", envvar="ALE_RUNS_DIR", help="Where run folders are written.")]
ImageOpt = Annotated[str, typer.Option("--image", envvar="ALE_IMAGE", help="The sandbox image.")]
PolicyOpt = Annotated[Path | None, typer.Option(
    "--policy", envvar="ALE_POLICY", help="Isolation policy file (JSON/YAML).")]
RuntimeOpt = Annotated[str | None, typer.Option(
    "--runtime", envvar="ALE_RUNTIME",
    help="The sandbox's OCI runtime: runc, or runsc (gVisor, docs/operator-runbook.md); overrides the policy's.")]
KeyOpt = Annotated[Path | None, typer.Option(
    "--signing-key", envvar="ALE_SIGNING_KEY",
    help="Ed25519 PEM key that signs evidence (default: created in the config dir).")]


def _plan(task_dir: Path, agent: str, variant: int, data: str | None, runs_dir: Path, script: Path | None,
          image: str, policy: Path | None, signing_key: Path | None, timeout: float | None, config: dict | None = None,
          workspace_max_bytes: int | None = None, *, software: bool = True, overlay: Path | None = None,
          runtime: str | None = None, provider: str = "docker", vm_images: list[str] | None = None):
    from ale.plan import AgentSpec, Limits, RunPlan, new_run_id
    from ale.sandbox.policy import IsolationPolicy

    cfg = dict(config or {})
    if script is not None:
        cfg["script"] = str(script.resolve())
    from ale.data.sources import anchor_spec
    from ale.tasks.card import load_card, policy_for_card

    card = load_card(task_dir)
    try:
        pol, notes = policy_for_card(IsolationPolicy.load(policy).with_runtime(runtime), card)
    except ValueError as e:
        fail(str(e))
    mapped: dict[str, str] = {}
    for item in vm_images or []:
        snap, sep, ref = item.partition("=")
        if not sep or not snap.strip() or not ref.strip():
            fail(f"--vm-image {item!r}: give SNAPSHOT=PATH-or-URL (e.g. cpu-free=/disks/win10.qcow2)")
        mapped[snap.strip()] = ref.strip()
    if mapped and provider != "qemu":
        fail("--vm-image maps a task's vm.snapshot to a disk for the qemu provider: add --provider qemu")
    for note in notes:
        err.print(f"note: {note}", markup=False, highlight=False)
    return RunPlan(
        run_id=new_run_id(task_dir.resolve().name, variant, agent),
        task_dir=str(task_dir.resolve()),
        variant=variant,
        agent=AgentSpec(name=agent, config=cfg),
        data_source=anchor_spec(data, Path.cwd()) if data else None,  # relative: the current folder
        image=image,
        policy=pol,
        limits=Limits(wall_time_s=timeout, workspace_max_bytes=workspace_max_bytes),
        runs_dir=str(runs_dir),
        signing_key=str(signing_key) if signing_key else None,
        provision_software=software,
        software_overlay=str(overlay.resolve()) if overlay is not None else None,
        provider=provider,
        vm_image=mapped.get(card.snapshot or ""),
    )


def _resume_plan(source: Path, runs_dir: Path):
    """The interrupted run's own plan, as a new run (its id, in ``runs_dir``) resuming from it."""
    from ale import layout
    from ale.agents.gateway.resume import source_turns
    from ale.plan import RunPlan, new_run_id

    try:
        old = RunPlan.model_validate_json((source / layout.PLAN).read_text())
    except (OSError, ValueError) as e:
        fail(f"--resume-from {source}: no run plan to resume ({e})")
    if (source / layout.RESULT).is_file():
        err.print(f"note: {source} has a result; resuming it anyway", markup=False, highlight=False)
    turns, _, problems = source_turns(source)
    if problems or not turns:
        fail(f"--resume-from {source}: "
             + ("; ".join(problems[:3]) if problems else "its gateway record holds no answered model turn"))
    _clear_interrupted(source, old)
    name = Path(old.task_dir).name
    return old.model_copy(update={"run_id": new_run_id(name, old.variant, old.agent.name), "runs_dir": str(runs_dir),
                                  "resume_from": str(source.resolve())})


def _clear_interrupted(source: Path, plan) -> None:
    """What a killed ``ale run`` left (reconcile does this for experiments): its sandboxes
    (labelled with its run id) and its scratch folder's mounts."""
    from ale import layout
    from ale.sandbox.base import SandboxError
    from ale.sandbox.providers import make_provider
    from ale.sandbox.scratch import release_scratch

    with contextlib.suppress(SandboxError, OSError, ValueError):
        removed = make_provider(plan.provider).remove_managed(run_id=plan.run_id)
        if removed:
            err.print(f"removed {len(removed)} sandbox(es) the interrupted run left", markup=False, highlight=False)
    scratch = layout.scratch_dir(plan.runs_dir, plan.run_id)
    if scratch.is_dir():
        release_scratch(scratch)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end a command as Ctrl-C does (what `timeout`, systemd,
    `docker stop` and a closed terminal send): asyncio cancels the run, whose
    cleanup removes its containers and scratch, instead of the process dying with
    them still running."""

    def handler(signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # Started with SIGINT ignored (`cmd &` in a script, `nohup ... &`): raising
            # SIGINT would do nothing, so interrupt as the default Ctrl-C handler does.
            signal.default_int_handler(signum, None)
        signal.raise_signal(signal.SIGINT)

    # A signal the process was started ignoring (`nohup` ignores SIGHUP) stays ignored.
    sigs = [sig for sig in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) is not signal.SIG_IGN]
    try:
        old = {sig: signal.signal(sig, handler) for sig in sigs}
    except ValueError:  # not the main thread: leave the process's handlers alone
        yield
        return
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _ready(plans: list, *, data_flag: str = "--data") -> None:
    """Before any sandbox starts: refuse a plan whose agent, task or data cannot do
    (exit 2, saying what to pass), then build the images the plans need (ale's
    own, when missing; cached by content)."""
    from ale.agents.errors import AgentConfigError
    from ale.agents.registry import check_agent
    from ale.runs.images import ensure_images, images_for
    from ale.runs.screening import OK, no_data_reason, screen_task
    from ale.sandbox.base import EngineUnreachable, SandboxError

    for plan in plans:
        try:
            check_agent(plan.agent)
        except AgentConfigError as e:
            fail(f"--agent {plan.agent.name}: {e}")
        screen = screen_task(plan.task_dir, plan.provider, build_env=True)
        if screen.status != OK:
            fail(f"{plan.task_dir}: {screen.status}: {screen.reason}")
        facts = next((v for v in screen.variants if v.index == plan.variant), None)
        if facts is None:
            fail(f"{plan.task_dir}: variant {plan.variant} does not exist: the task has {len(screen.variants)}")
        if facts.unsupported:
            fail(f"{plan.task_dir}: variant {plan.variant} {facts.unsupported}")
        if facts.needs_data and not (plan.data_source or screen.data_source):
            fail(f"{plan.task_dir}: {no_data_reason(facts, data_flag)}")
    _require_runtimes(plans)
    say = lambda m: err.print(m, markup=False, highlight=False)  # noqa: E731
    vm_plans = [p for p in plans if p.provider == "qemu"]
    if vm_plans:
        _ensure_vm_image(vm_plans, say)
    try:
        ensure_images(images_for([p for p in plans if p.provider != "qemu"]), say=say)
    except EngineUnreachable as e:  # nothing can begin: as every preflight refusal (exit 2)
        fail(str(e))
    except SandboxError as e:  # an image build that failed
        fail(str(e), 1)


def _ensure_vm_image(plans: list, say) -> None:
    """The qemu provider's guest (``ale image build --vm``), built when missing; the
    accelerator chosen now (``--accel kvm`` refuses here when KVM cannot run a guest)."""
    from ale.sandbox.base import ImageMissing, SandboxError
    from ale.sandbox.qemu.image import ensure_vm_images
    from ale.sandbox.qemu.provider import QemuProvider

    provider = QemuProvider()
    try:
        provider.ping()
    except SandboxError as e:
        fail(str(e))
    try:
        # a plan with a mapped disk boots that disk (ale's guest or a foreign one), not ale-vm:latest
        ensure_vm_images([p.image for p in plans if not p.vm_image], say)
    except ImageMissing as e:
        fail(str(e))
    except SandboxError as e:
        fail(str(e), 1)
    try:
        accel = provider.accel()
    except SandboxError as e:
        fail(str(e))
    if accel.get("warning"):
        say(f"warning: {accel['warning']}")


def _require_runtimes(plans: list) -> None:
    """Refuse, before any sandbox, a runtime the engine lacks (saying how to add it)."""
    from ale.sandbox.base import SandboxError
    from ale.sandbox.providers import require_runtime

    for provider, runtime in sorted({(p.provider, p.policy.runtime) for p in plans}):
        try:
            require_runtime(provider, runtime)
        except SandboxError as e:
            fail(str(e))


def _execute(plan):
    from ale.runs.lifecycle import PreflightError, execute_run

    try:
        with terminate_as_interrupt(), software_progress():
            return asyncio.run(execute_run(plan))
    except PreflightError as e:
        fail(str(e))
    except KeyboardInterrupt:
        err.print("interrupted: the run's containers were removed")
        raise typer.Exit(130) from None


def _print_result(result, run_dir: Path) -> None:
    colour = "green" if result.status is RunStatus.SCORED else "red" if result.status in FAILED_RUN else "yellow"
    score = "-" if result.score is None else f"{result.score:.3f}"
    # Task ids, violations and errors are any text (a grader's "[name]" or "[/path]"): never markup.
    # ... and may hold a recorded name: every control escaped, line breaks too (one line each).
    err.print(f"[bold {colour}]{result.status.value}[/]  score={score}  scores={result.scores}  "
              f"task={escape(printable(str(result.task_id)))} variant={result.variant} "
              f"agent={escape(printable(str(result.agent)))}")
    for v in result.violations:
        err.print(f"  [red]violation[/] {escape(printable(v))}")
    for w in result.extra.get("warnings", []):
        err.print(f"  [yellow]warning[/] {escape(printable(str(w)))}")
    why = reason_line(result)
    if why:
        err.print(f"  [yellow]why: {escape(printable(why))}[/]")
    print(run_dir)


@app.command()
def run(
    task_dir: Annotated[Path | None, typer.Argument(
        help="The task folder (holding main.py); not with --resume-from.")] = None,
    agent: Annotated[str, typer.Option("--agent", "-a", help="oracle | nop | replay | command | llm")] = "oracle",
    variant: Annotated[int, typer.Option("--variant", "-v")] = 0,
    data: Annotated[str | None, typer.Option(
        "--data", envvar="ALE_DATA", help="Data source: local:<dir>, s3://, gs://, hf://, image:<ref>.")] = None,
    runs_dir: RunsDir = Path("runs"),
    script: Annotated[Path | None, typer.Option("--script", help="Replay agent: JSON file of tool calls.")] = None,
    image: ImageOpt = DEFAULT_TOOLS_IMAGE,
    policy: PolicyOpt = None,
    signing_key: KeyOpt = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Agent wall time in seconds (default: the task card's).")] = None,
    agent_config: Annotated[str | None, typer.Option("--agent-config", help="Agent configuration as JSON.")] = None,
    workspace_max_bytes: Annotated[int | None, typer.Option(
        "--workspace-max-bytes", min=1,
        help="Cap the workspace in bytes (as root a tmpfs of this size; else the watchdog ends the turn there). "
             "Default: 20 GiB or half the free disk.")] = None,
    software: Annotated[bool, typer.Option(
        "--software/--no-software",
        help="Provide the task's declared software (its environment image, built on first use; "
             "docs/software.md).")] = True,
    overlay: Annotated[Path | None, typer.Option(
        "--overlay", envvar="ALE_OVERLAY", help="An operator's overlay of software needs (YAML/JSON).")] = None,
    runtime: RuntimeOpt = None,
    provider: Annotated[str, typer.Option(
        "--provider",
        help="Sandbox provider: docker (containers) or qemu (ale's Linux VM guest, "
             "`ale image build --vm`).")] = "docker",
    accel: Annotated[str | None, typer.Option(
        "--accel", envvar="ALE_QEMU_ACCEL",
        help="qemu provider: auto (KVM when a probe shows it runs a guest, else TCG), kvm "
             "(refuse without it) or tcg.")] = None,
    vm_image: Annotated[list[str] | None, typer.Option(
        "--vm-image",
        help="qemu provider: SNAPSHOT=PATH-or-URL, the base disk for a task whose vm.snapshot is SNAPSHOT (a .qcow2, "
             "or a folder or gs://, s3://, hf:// URL in ALE's published layout; docs/vm.md). Repeatable.")] = None,
    resume_from: Annotated[Path | None, typer.Option(
        "--resume-from",
        help="Resume an interrupted run: its plan again, in a fresh sandbox, its recorded model turns replayed from "
             "its gateway record until the first that differs (docs/experiments.md).")] = None,
) -> None:
    """Run one task variant with one agent; print the run folder last."""
    from ale.sandbox.providers import PROVIDERS

    if provider not in PROVIDERS:
        fail(f"--provider {provider}: choose one of {', '.join(PROVIDERS)}")
    if accel is not None:
        os.environ["ALE_QEMU_ACCEL"] = accel
    if resume_from is not None:
        plan = _resume_plan(resume_from, runs_dir)
        _ready([plan])
        result = _execute(plan)
        _print_result(result, plan.run_dir)
        if result.status in FAILED_RUN:
            raise typer.Exit(1)
        return
    if task_dir is None:
        fail("a task folder is required (or --resume-from RUN_DIR)")
    cfg = None
    if agent_config:
        try:
            cfg = json.loads(agent_config)
        except json.JSONDecodeError as e:
            fail(f"--agent-config is not valid JSON: {e}")
    plan = _plan(task_dir, agent, variant, data, runs_dir, script, image, policy, signing_key, timeout, cfg,
                 workspace_max_bytes, software=software, overlay=overlay, runtime=runtime, provider=provider,
                 vm_images=vm_image)
    _ready([plan])
    result = _execute(plan)
    _print_result(result, plan.run_dir)
    if result.status in FAILED_RUN:
        raise typer.Exit(1)


@task_app.command("check")
def task_check(
    task_dir: Annotated[Path, typer.Argument(help="The task folder.")],
    data: Annotated[str | None, typer.Option("--data", envvar="ALE_DATA")] = None,
    runs_dir: RunsDir = Path("runs"),
    image: ImageOpt = DEFAULT_TOOLS_IMAGE,
    policy: PolicyOpt = None,
    runtime: RuntimeOpt = None,
    adversarial: Annotated[bool, typer.Option(
        "--adversarial/--no-adversarial",
        help="Also run the adversarial outputs (and the missing-reference probe) against the grader.")] = True,
    strategy: Annotated[list[str] | None, typer.Option(
        "--strategy", "-s", help="Run only this adversarial strategy (repeatable; default: all).")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1,
        help="Sandbox lifecycles at once, or twice as many grading probes (default: the machine's cores, "
             "at least 2).")] = None,
    full_adversarial: Annotated[bool, typer.Option(
        "--full-adversarial",
        help="Run each adversarial output (and the missing-reference probe) through the full sealed lifecycle, "
             "a candidate sandbox each, instead of as a grading probe.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the whole check as JSON on stdout.")] = False,
    oracle_script: Annotated[str | None, typer.Option(
        "--oracle-script",
        help="A replay script (JSON tool calls) that solves the task, as the oracle, for tasks without solve() "
             "(ALE's); '{variant}' in the path is the variant's index.")] = None,
) -> None:
    """Oracle must score 1.0 on every component, nop must score 0, on every variant;
    then no adversarial output may score above nop and the grader must raise
    without its reference. Exit 1 on any failure."""
    from ale.grading.adversarial import render_stages, select_strategies
    from ale.grading.task_flaws import run_problem
    from ale.runs.lifecycle import PreflightError
    from ale.sandbox.policy import host_cpu_count
    from ale.tasks.errors import TaskError
    from ale.tasks.process import TaskProcessError, inspect_task_sync

    try:
        chosen = select_strategies(strategy)
    except ValueError as e:
        fail(str(e))
    try:
        info = inspect_task_sync(task_dir)
    except (TaskError, PreflightError, TaskProcessError) as e:
        fail(str(e))
    problems: list[str] = []
    variants: list[dict] = []
    tried = 0
    _ready([_plan(task_dir, "nop", v, data, runs_dir, None, image, policy, None, None, runtime=runtime)
            for v in range(len(info.variants))])
    plans = []
    for v in range(len(info.variants)):
        script = None
        if oracle_script is not None:
            script = Path(oracle_script.replace("{variant}", str(v)))
            if not script.is_file():
                fail(f"--oracle-script: {script} (variant {v}) is not a file")
        plans.append((_plan(task_dir, "replay" if script is not None else "oracle", v, data, runs_dir, script, image,
                            policy, None, None, runtime=runtime),
                      _plan(task_dir, "nop", v, data, runs_dir, None, image, policy, None, None, runtime=runtime)))
    check = _run_check(task_dir, info.variants, plans, adversarial, chosen, jobs or max(2, host_cpu_count()),
                       full_adversarial)
    for vc in check.variants:
        for agent, (_, result, ok) in vc.runs.items():
            if not ok:
                problems.append(run_problem(vc.variant, agent, result))
        if vc.skipped_adversarial:
            err.print(f"[yellow]variant {vc.variant}: adversarial outputs skipped until the oracle scores 1.0 "
                      "and nop 0[/]")
        if vc.report is not None:
            tried += sum(1 for o in vc.report.outcomes if o.verdict != "skipped")
            if not json_out:
                _print_adversarial(vc.report)
            for o in vc.report.failed:
                problems.append(f"variant {vc.variant} {o.strategy}: {o.verdict}: {o.detail}")
        variants.append(vc.to_dict())
    err.print("stage times (wall clock):", highlight=False)
    for line in render_stages(check):
        err.print(escape(line), highlight=False)
    if json_out:
        print(json.dumps({"task_dir": str(task_dir), "ok": not problems, "variants": variants, "problems": problems,
                          "timing": check.timing()}, indent=1))
    if problems:
        for p in problems:
            err.print(f"[red]- {escape(p)}[/]", highlight=False)
        raise typer.Exit(1)
    n = len(info.variants)
    tail = f"; no adversarial output beats nop ({tried} run(s))" if adversarial else ""
    err.print(f"[green]{escape(str(task_dir))}: {n} variant(s) pass (oracle 1.0, nop 0){escape(tail)}[/]")


def _run_check(task_dir: Path, variants, plans, adversarial: bool, strategies, jobs: int, full: bool):
    """Every variant's oracle and nop runs, then its adversarial outputs and the
    missing-reference probe (grading probes, or with `full` runs through the whole
    lifecycle), independent stages at once within `jobs` slots."""
    from ale.grading import adversarial as adv
    from ale.runs.grading_only import WarmProcesses, grade_probe
    from ale.runs.lifecycle import PreflightError, execute_run
    from ale.sandbox.base import SandboxError
    from ale.sandbox.providers import make_provider

    def say_run(v: int, agent: str, plan, result, ok: bool) -> None:
        mark = "[green]ok[/]" if ok else "[red]FAIL[/]"
        err.print(f"{mark} variant {v} {agent}: {result.status.value} scores={result.scores}  "
                  f"{escape(str(plan.run_dir))}")

    def say(v: int, o) -> None:
        colour = "red" if o.failed else ("yellow" if o.verdict in ("skipped", "solution", "note") else "green")
        kind = " (grading probe)" if o.kind == adv.GRADING_PROBE else ""
        err.print(f"  [{colour}]{o.verdict}[/] variant {v} {escape(o.strategy)}: {o.status or '-'} "
                  f"scores={o.scores}{kind}", highlight=False)

    async def go():
        try:
            store = make_provider(plans[0][0].provider).image_store()
        except SandboxError:
            store = None
        warm = WarmProcesses()  # the probes' task processes: forks of warm ones (load() once each)
        # started while the oracle and nop run
        warming = asyncio.ensure_future(
            warm.warm_up(plans[0][0], 2 * jobs) if adversarial and not full else asyncio.sleep(0))
        try:
            return await adv.check_task(Path(task_dir).resolve(), variants, plans, execute_run,
                                        probe=None if full else functools.partial(grade_probe, warm=warm),
                                        adversarial=adversarial, strategies=strategies,
                                        jobs=jobs, image_store=store, say_run=say_run, say=say)
        finally:
            warming.cancel()
            await asyncio.gather(warming, return_exceptions=True)
            await warm.close()

    try:
        with terminate_as_interrupt(), software_progress():
            return asyncio.run(go())
    except PreflightError as e:
        fail(str(e))
    except KeyboardInterrupt:
        err.print("interrupted: the run's containers were removed")
        raise typer.Exit(130) from None


def _print_adversarial(report) -> None:
    from ale.grading.adversarial import render_rows

    rows = render_rows(report)
    print(f"variant {report.variant}: adversarial outputs (nop scored {report.nop_score:g}; as: probe = graded "
          "without a candidate sandbox, not a run)")
    header = ("strategy", "status", "score [scores]", "verdict", "as", "detail")
    widths = [max(len(r[i]) for r in [*rows, header]) for i in range(5)]
    for r in [header, *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + ("  " + r[5] if r[5] else ""))


@task_app.command("list")
def task_list(
    path: Annotated[Path, typer.Argument(help="A task folder or a tree of them (e.g. ALE's tasks/).")],
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print a JSON list of {path, status, reason, variants, snapshot, software}.")] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Tasks loaded at once.")] = 4,
    overlay: Annotated[Path | None, typer.Option(
        "--overlay", envvar="ALE_OVERLAY", help="An operator's overlay of software needs (YAML/JSON).")] = None,
) -> None:
    """Every task folder under PATH: ok (variants), unsupported (why) or error (the message), and its declared software."""  # noqa: E501 (typer shows a docstring's line breaks)
    import json as _json

    from ale.provision.needs import listing_software
    from ale.provision.sources import ProvisionError, load_overlay
    from ale.tasks.listing import list_tasks

    if not path.exists():
        fail(f"{path}: no such file or folder")
    try:
        ov = load_overlay(overlay) if overlay is not None else None
    except ProvisionError as e:
        fail(str(e))
    rows = list_tasks(path, workers=jobs)
    for r in rows:
        r.software = listing_software(r.path, ov)
    if json_out:
        print(_json.dumps([r.to_dict() for r in rows], indent=1))
    else:
        base = path.resolve()
        for r in rows:
            rel = Path(r.path).relative_to(base).as_posix() if Path(r.path) != base else r.path
            detail = f"{r.variants} variant(s)" if r.status == "ok" else (r.reason or "").splitlines()[0][:300]
            sw = r.software
            if sw and r.status == "ok":
                detail += f"  software {len(sw['provisioned'])}/{len(sw['declared'])}"
                if sw["missing"]:
                    detail += " (missing: " + ", ".join(m["name"] for m in sw["missing"])[:200] + ")"
                if sw.get("error"):
                    detail += f" ({sw['error']})"
            print(f"{r.status:<12} {rel}  {detail}")
    counts = {s: sum(1 for r in rows if r.status == s) for s in ("ok", "unsupported", "error")}
    err.print(f"{len(rows)} task folder(s): {counts['ok']} ok, {counts['unsupported']} unsupported, "
              f"{counts['error']} error", markup=False)
    ok = [r.software for r in rows if r.status == "ok" and r.software is not None]
    full = sum(1 for s in ok if not s["missing"] and not s.get("error"))
    names = {m["name"] for s in ok for m in s["missing"]}
    err.print(f"software: {full} of {len(ok)} ok task(s) have every declared name provisioned; "
              f"{len(names)} distinct name(s) missing", markup=False)


@task_app.command("env")
def task_env(
    path: Annotated[Path, typer.Argument(help="A task folder inside the tree whose environment to build.")],
) -> None:
    """Build (or find cached) the Python environment a task tree declares; print its interpreter."""
    from ale.tasks.environment import EnvironmentBuildError, find_declaration, resolve_environment
    from ale.tasks.errors import TaskError

    try:
        decl = find_declaration(path)
        env = resolve_environment(path, say=lambda m: err.print(m, markup=False, highlight=False))
    except (TaskError, EnvironmentBuildError) as e:
        fail(str(e), 1)
    if decl is None or not decl.dependencies:
        err.print(f"{path}: its tree declares no dependencies; task code runs with the harness's Python", markup=False)
    elif not env.description.get("requires_python_satisfied", True):
        err.print(f"note: requires-python {decl.requires_python!r} is not met by any interpreter here; "
                  f"using Python {env.description.get('python_version')}", markup=False)
    print(env.python)


@image_app.command("build")
def image_build(
    base: Annotated[str | None, typer.Option(
        "--base", envvar="ALE_BASE_IMAGE",
        help="Base image (default python:3.11-slim; 'debian-bootstrap' forces a local Debian bootstrap).")] = None,
    tag: Annotated[str | None, typer.Option("--tag")] = None,
    desktop: Annotated[bool, typer.Option(
        "--desktop", help="Build the desktop image (Xvfb, openbox, xdotool, Chromium) FROM the tools image.")] = False,
    cua: Annotated[bool, typer.Option(
        "--cua",
        help="Build a cua-compatible image: cua's computer-server (PyPI) as its entrypoint, "
             "on a Debian 13 root bootstrapped here.")] = False,
    vm: Annotated[bool, typer.Option(
        "--vm",
        help="Build the qemu provider's Linux guest (kernel, initrd, qcow2 base) from Debian packages and the cua "
             "image.")] = False,
    foreign_test: Annotated[bool, typer.Option(
        "--foreign-test",
        help="With --vm: build a foreign-style test disk instead (its own MBR, syslinux and kernel, computer-server "
             "on guest port 5000, no ale agent), to map with --vm-image SNAPSHOT=PATH.")] = False,
) -> None:
    """Build the tools image, with --desktop the desktop image, with --cua a cua-compatible image (cached by content: a second build is a lookup)."""  # noqa: E501 (typer shows a docstring's line breaks)
    from ale.sandbox.base import SandboxError
    from ale.sandbox.desktop import DEFAULT_DESKTOP_IMAGE
    from ale.sandbox.image import build_desktop_image, build_tools_image

    if foreign_test and not vm:
        fail("--foreign-test goes with --vm", 2)
    if vm and foreign_test:
        from ale.sandbox.qemu.foreign_disk import build_foreign_test_disk

        if cua or desktop:
            fail("--vm builds a VM guest: not with --cua or --desktop", 2)
        try:
            disk = build_foreign_test_disk(say=lambda m: err.print(m, markup=False, highlight=False))
        except SandboxError as e:
            fail(str(e), 1)
        err.print(f"foreign test disk: {disk} (map it: ale run TASK --provider qemu --vm-image SNAPSHOT={disk})",
                  markup=False, highlight=False)
        print(disk)
        return
    if vm:
        from ale.sandbox.qemu.image import build_vm_image

        if cua or desktop:
            fail("--vm builds a VM guest: not with --cua or --desktop", 2)
        try:
            img = build_vm_image(say=lambda m: err.print(m, markup=False, highlight=False))
        except SandboxError as e:
            fail(str(e), 1)
        err.print(f"VM guest: {img.manifest['ref']} ({img.base}, sha256 {img.sha256})", markup=False, highlight=False)
        return
    if cua:
        from ale.sandbox.cua.image import DEFAULT_CUA_IMAGE, build_cua_image

        if desktop:
            fail("--cua and --desktop build different images: choose one", 2)
        try:
            ref = build_cua_image(tag=tag or DEFAULT_CUA_IMAGE,
                                  say=lambda m: err.print(m, markup=False, highlight=False))
        except SandboxError as e:
            fail(str(e), 1)
        err.print(f"cua image: {ref} (tagged {tag or DEFAULT_CUA_IMAGE})")
        return
    tag = tag or (DEFAULT_DESKTOP_IMAGE if desktop else DEFAULT_TOOLS_IMAGE)
    try:
        build = build_desktop_image if desktop else build_tools_image
        ref = build(base=base, tag=tag, say=lambda m: err.print(m))
    except SandboxError as e:
        fail(str(e), 1)
    err.print(f"{'desktop' if desktop else 'tools'} image: {ref} (tagged {tag})")


@app.command()
def schema(out_dir: Annotated[Path, typer.Argument()] = Path("schemas")) -> None:
    """Write the JSON Schemas of result.json and trajectory.json."""
    from ale.result import write_schema

    out_dir.mkdir(parents=True, exist_ok=True)
    write_schema(str(out_dir / "result.schema.json"))
    try:
        from ale.agents.trajectory import write_schema as write_traj_schema

        write_traj_schema(str(out_dir / "trajectory.schema.json"))
    except ImportError:
        pass
    print(out_dir)


@app.command()
def verify(
    run_dir: Annotated[Path, typer.Argument(
        help="A run folder, or an experiment's output folder (its runs, then its report re-derived).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    public_key: Annotated[Path | None, typer.Option(
        "--public-key", help="Verify against this Ed25519 public key (PEM) instead of the recorded one.")] = None,
    trusted_keys: Annotated[Path | None, typer.Option(
        "--trusted-keys",
        help="Accept a signature by any of these keys: an experiment's nodes.json, "
             "a PEM bundle or a folder of PEMs.")] = None,
) -> None:
    """Re-check a run from its evidence alone (an experiment: every run, then every figure
    of its stored report re-derived). Exit 0 valid, 1 invalid, 2 unusable."""
    import tempfile

    from ale import layout
    from ale.cli.verify import verify_command
    from ale.record.signing import SignatureInvalid
    from ale.record.trusted_keys import load_trusted_keys, signer_key

    if (run_dir / layout.EXPERIMENT_RECORD).is_file():  # an experiment: its runs, then its report re-derived
        from ale.cli.verify import verify_experiment_command

        raise typer.Exit(verify_experiment_command(run_dir, json_out, public_key, trusted_keys))
    if trusted_keys is None:
        raise typer.Exit(verify_command(run_dir, json_out, public_key))
    if public_key is not None:
        fail("give --public-key or --trusted-keys, not both")
    try:
        keys = load_trusted_keys(trusted_keys)
        pem = signer_key(run_dir, keys)
    except SignatureInvalid as e:
        fail(str(e))
    with tempfile.TemporaryDirectory() as tmp:
        key_file = Path(tmp) / "trusted.pem"
        key_file.write_bytes(pem)
        code = verify_command(run_dir, json_out, key_file, keys)
    raise typer.Exit(code)


@app.command("verify-container")
def verify_container_cmd(
    name_or_id: Annotated[str, typer.Argument(help="The container to check.")],
    input_dir: Annotated[Path, typer.Option("--input", help="Host folder that must be mounted read-only.")],
    workspace: Annotated[Path, typer.Option("--workspace", help="Host folder that must be mounted read-write.")],
    policy: PolicyOpt = None,
    input_target: Annotated[str, typer.Option("--input-target")] = DEFAULT_INPUT_DIR,
    workspace_target: Annotated[str, typer.Option("--workspace-target")] = DEFAULT_OUTPUT_DIR,
    save_inspect: Annotated[Path | None, typer.Option(
        "--save-inspect", help="Write the raw inspect JSON here.")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Check a container someone created from the template. Exit 0 sealed, 1 not."""
    from ale.isolation.verify_container import render_report, verify_container
    from ale.sandbox.base import SandboxError
    from ale.sandbox.policy import IsolationPolicy
    from ale.sandbox.providers import make_provider

    try:
        pol = IsolationPolicy.load(policy)
        provider = make_provider()
        provider.ping()  # fails here, with a clear message, when no engine answers
    except (ValueError, SandboxError) as e:
        fail(str(e))
    report = verify_container(
        provider, name_or_id, input_dir=str(input_dir.resolve()), workspace_dir=str(workspace.resolve()),
        policy=pol, input_target=input_target, workspace_target=workspace_target, save_inspect=save_inspect,
    )
    print(report.model_dump_json(indent=2) if json_out else render_report(report))
    raise typer.Exit(0 if report.ok else 1)


def _register_subcommands() -> None:
    from ale.cli.agents import app as agents_app
    from ale.cli.data import bake_command, data_app
    from ale.cli.env import env_app
    from ale.cli.exp import cleanup_command, exp_app, report_command
    from ale.cli.node import node_app
    from ale.cli.view import export_command, view_command

    app.add_typer(exp_app, name="exp")
    app.add_typer(data_app, name="data")
    app.add_typer(env_app, name="env")
    app.add_typer(agents_app, name="agents")
    app.add_typer(node_app, name="node")
    app.command("report")(report_command)
    app.command("cleanup")(cleanup_command)
    from ale.cli.regrade import regrade_command

    app.command("regrade")(regrade_command)
    app.command("view")(view_command)
    from ale.cli.vm import verify_vm_command

    app.command("verify-vm")(verify_vm_command)
    app.command("export")(export_command)
    from ale.cli.show import key_app, task_show_command

    app.add_typer(key_app, name="key")
    task_app.command("show")(task_show_command)
    image_app.command("bake")(bake_command)


_register_subcommands()


def main() -> None:  # pragma: no cover
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
