"""Issue 20, item 7: what the documentation shows works as shown.

Every command a user would type in README.md and docs/*.md (the lines of their
fenced ``sh`` blocks) is listed in ``COMMANDS`` below, each either run, as
written, from the root of a fresh copy of the checkout (its tracked files; the
relative paths the docs use resolve there) with its documented outcome checked,
or skipped with the reason recorded here (external services, agents that need a
model, the operator's own placeholders, commands that would disturb other work
on the engine). A command added to the docs and not listed here fails
``test_every_documented_command_is_listed`` (an entry no longer documented is
ignored).

Placeholders the docs use are filled in from what earlier commands made:
``runs/<run-id>`` is the run folder ``ale run`` printed; ``my-calls.json`` is the
reader's replay script (a copy of ``examples/agents/replay_simple.json``);
``exp.yaml`` / ``results/demo`` and ``runs/demo`` are one experiment here
(``examples/demo.yaml``'s agents on ``files/word_count``; the whole demo is 24
sandboxes, its GUI half runs in tests/test_image_hints.py on an engine without
the desktop image).

docs/data.md shows usage synopses in untagged blocks (``ale data seal VARIANT_DIR...
[--force] ...``), not commands to run: ``test_data_md_synopses_match_the_cli`` checks
each against the CLI itself (the command, its options and their choices, its
arguments).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = ROOT / ".venv" / "bin"


# -- the commands, as the docs show them -------------------------------------------


def _strip_comment(line: str) -> str:
    """The line without its trailing shell comment (a '#' after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for each command line of each ```sh block, in order."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                cmd = " ".join(_strip_comment(line).split())
                if cmd:
                    out.append((doc.relative_to(ROOT).as_posix(), cmd))
    return out


# -- what each one is expected to do ---------------------------------------------------


@dataclass
class Ctx:
    root: Path
    made: dict[str, str] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    background: dict[str, tuple[subprocess.Popen, Path]] = field(default_factory=dict)


Check = Callable[[subprocess.CompletedProcess, Ctx], None]


@dataclass
class Run:
    check: Check | None = None
    needs: tuple[str, ...] = ()  # setup steps (SETUPS) before it
    slow: bool = False  # started in the background as the copy is made (the whole test stays within minutes)


@dataclass
class Skip:
    reason: str


def run_folder_printed(p: subprocess.CompletedProcess, ctx: Ctx, status: str | None = None) -> Path:
    last = p.stdout.strip().splitlines()[-1]
    run_dir = ctx.root / last
    doc = json.loads((run_dir / "result.json").read_text())
    if status is not None:
        assert doc["status"] == status, (doc["status"], doc.get("error"))
    return run_dir


def _oracle_run(p, ctx):
    ctx.made["run"] = str(run_folder_printed(p, ctx, "scored").relative_to(ctx.root))


def _replay_run(p, ctx):
    run_folder_printed(p, ctx)


def _scored_run(p, ctx):
    run_folder_printed(p, ctx, "scored")


def _task_check_ok(p, ctx):
    assert "pass (oracle 1.0, nop 0)" in p.stderr, p.stderr[-2000:]


def _verified_naming_the_key_command(p, ctx):
    assert "VALID" in p.stdout and "ale key show -o operator.pem" in p.stdout, p.stdout[-2000:]


def _file(path: str) -> Check:
    def check(p, ctx):
        assert (ctx.root / path.format(**ctx.made)).is_file(), path

    return check


def _contains(text: str, stream: str = "stdout") -> Check:
    def check(p, ctx):
        assert text in getattr(p, stream), getattr(p, stream)[-2000:]

    return check


def _one_atif_per_run(experiment: str) -> Check:
    """As docs/viewer.md says: one file per run, <experiment>/atif/<run>.atif.json, each printed."""
    def check(p, ctx):
        root = ctx.root / experiment
        runs = {d.name for d in (root / "runs").iterdir() if (d / "result.json").is_file()}
        printed = {Path(line.strip()).resolve() for line in p.stdout.splitlines() if line.strip()}
        expected = {(root / "atif" / f"{run}.atif.json").resolve() for run in runs}
        assert runs and printed == expected, (sorted(runs), p.stdout[-2000:])
        assert all(isinstance(json.loads(path.read_text()).get("steps"), list) for path in expected)

    return check


CORPUS = "needs ALE's task corpus (agents-last-exam) and its data store (network)"
CLEANUP = ("removes every ale-managed container on the engine, including those of tests running beside this one; "
           "tests/test_exp_docker.py checks cleanup on containers of its own")
VM = "boots ale's VM guest under QEMU (TCG here: tens of seconds a run)"
PLACEHOLDER = "path/to/task is the reader's task; these options are exercised in tests/test_task_check_adversarial.py"

COMMANDS: dict[str, Run | Skip] = {
    # README.md
    "make demo": Skip("setup (apt, the tools image) then the 24-sandbox demo, minutes: its experiment runs below on a "
                      "subset, its GUI tasks in tests/test_image_hints.py on an engine without the desktop image"),
    "make test": Skip("the test suite itself"),
    ". .venv/bin/activate": Run(),
    "ale task show examples/tasks/files/word_count": Run(_contains("prompt:")),
    "ale key show -o operator.pem": Run(_file("operator.pem")),
    "ale run examples/tasks/files/word_count --agent oracle": Run(_oracle_run),
    "ale run examples/tasks/files/word_count --agent replay --script my-calls.json": Run(_replay_run, ("my-calls",)),
    "ale task check examples/tasks/physics/cloth_sim": Run(_task_check_ok, slow=True),
    "ale verify runs/<run-id>": Run(_verified_naming_the_key_command, ("run",)),
    "ale view runs/<run-id>": Run(_file("{run}.view.html"), ("run",)),
    "ale exp run examples/demo.yaml": Skip("24 sandboxes (about 4 minutes); a subset of it, the same file's agents on "
                                           "files/word_count, writes runs/demo for the commands that read it"),
    "ale exp run exp.yaml --resume-turns": Skip("needs an interrupted experiment; tests/test_resume_runs.py SIGKILLs "
                                                "`ale exp run` at turn 20 and runs it again with --resume-turns"),
    "ale exp run examples/demo.yaml --resume-turns": Skip("the 24-sandbox demo again; resuming interrupted attempts from their "
                                                          "records is run by tests/test_resume_runs.py (ale exp run SIGKILLed, "
                                                          "then --resume-turns)"),
    "ale report runs/demo --html report.html": Run(_file("report.html"), ("demo",)),
    "ale cleanup": Skip(CLEANUP),
    "ale task list agents-last-exam/tasks": Skip(CORPUS),
    "ale task env agents-last-exam/tasks/<domain>/<task>": Skip(CORPUS),
    "ale run agents-last-exam/tasks/<domain>/<task> --agent nop --data gs://ale-data-public": Skip(CORPUS),
    "ale exp run ale.yaml": Skip(CORPUS),
    # docs/ale-compatibility.md
    "ale task list path/to/agents-last-exam/tasks": Skip(CORPUS),
    "ale task env path/to/agents-last-exam/tasks/<domain>/<task>": Skip(CORPUS),
    "ale run path/to/agents-last-exam/tasks/<domain>/<task> --agent replay --script solve.json --data local:/data/agenthle":
        Skip(CORPUS),
    "ale task check path/to/agents-last-exam/tasks/<domain>/<task> --oracle-script solve.json --data gs://ale-data-public":
        Skip(CORPUS),
    # docs/desktop.md
    "ale image build --desktop": Run(_contains("desktop image:", "stderr")),
    "ale image build --cua": Run(_contains("cua image:", "stderr")),
    "ale run examples/tasks/files/word_count --agent oracle --image ale-cua:latest": Run(_scored_run, ("cua-image",)),
    "ale task check examples/tasks/gui/click_button": Run(_task_check_ok, slow=True),
    """ale run examples/tasks/gui/fill_form --agent llm --agent-config '{"model": "..."}'""":
        Skip("needs a model API (the llm agent); tests/test_agents_llm.py drives it against a fake one"),
    # docs/experiments.md (exp.yaml: the demo's agents on files/word_count, output results/demo)
    "ale exp run exp.yaml --dry-run": Run(_contains("files-word_count-v0-oracle-r0"), ("exp.yaml",)),
    "ale exp run exp.yaml": Run(_contains("report.html"), ("exp.yaml",)),
    "ale exp run exp.yaml --retry-errors": Run(_contains("report.html"), ("demo",)),
    "ale exp status results/demo": Run(_contains("final / planned"), ("demo",)),
    "ale report results/demo": Run(_contains("pass ≥ 0.5"), ("demo",)),
    'ale regrade results/demo --tasks ../ale-v1.1/tasks --reason "graders repaired for v1.1"':
        Skip("needs a later version of the task tree (../ale-v1.1); tests/test_regrade.py regrades with repaired graders"),
    "ale verify results/demo": Run(_contains("VALID"), ("demo",)),
    'ale regrade results/demo/runs/files-word_count-v0-gpt-r0-a1 --reason "word_count: json.loads on deep arrays"':
        Skip("the run of an llm agent (gpt) the reader made; tests/test_regrade.py"),
    'ale regrade results/demo --tasks ~/ale-v1.1/tasks --reason "v1.1 graders"':
        Skip("needs a later version of the task tree (~/ale-v1.1); tests/test_regrade.py"),
    "ale regrade RUN --signing-key KEY": Skip("RUN and KEY are the reader's; tests/test_regrade.py"),
    "ale regrade RUN --trusted-keys nodes.json": Skip("a cluster's nodes.json (docs/scaling.md); tests/test_regrade.py"),
    # docs/operator-runbook.md
    "ale image build": Run(_contains("tools image:", "stderr")),
    "ale image build --base debian-bootstrap": Run(_contains("tools image:", "stderr")),
    "docker create --name RUN --network none --read-only --cap-drop ALL --security-opt no-new-privileges --ipc private "
    "--cgroupns private --pids-limit 256 --memory 8g --memory-swap 8g --cpus 2 --user 1000:1000 --tmpfs "
    "/tmp:rw,exec,nosuid,nodev,size=1g --sysctl kernel.shm_rmid_forced=1 --sysctl kernel.shmmax=67108864 "
    "--sysctl kernel.shmall=16384 --ulimit core=0 --log-opt max-size=10m --mount type=bind,src=RUN_INPUT,dst=/input,readonly "
    "--mount type=bind,src=RUN_WORKSPACE,dst=/workspace --workdir /workspace ale-tools:latest sleep infinity":
        Run(needs=("container",)),
    "ale verify-container RUN --input RUN_INPUT --workspace RUN_WORKSPACE [--policy policy.yaml] --save-inspect inspect.json":
        Run(_file("inspect.json"), ("container",)),
    # docs/scaling.md
    "pip install 'ale[ray]'": Skip("installs from the package index (network)"),
    "ale node start --head --node-ip 10.0.0.1 --port 6379": Skip("a Ray cluster of the reader's machines; tests/test_cluster_ray.py"),
    "ale node start --address 10.0.0.1:6379 --docker-host unix:///var/run/docker.sock --slots 4":
        Skip("a Ray cluster of the reader's machines; tests/test_cluster_ray.py"),
    "ale exp run exp.yaml --cluster ray:10.0.0.1:6379": Skip("a Ray cluster of the reader's machines; tests/test_cluster_ray.py"),
    "ale verify results/demo/runs/<run> --trusted-keys results/demo/nodes.json":
        Skip("runs signed by a cluster's nodes; tests/test_cluster_ray.py"),
    "ale node stop --all": Skip("the nodes ale started (a cluster); tests/test_cluster_ray.py"),
    # docs/task-check.md
    "ale task check examples/tasks/files/word_count": Run(_task_check_ok, slow=True),
    "ale task check path/to/task --strategy nan --strategy inf": Skip(PLACEHOLDER),
    "ale task check path/to/task --no-adversarial": Skip(PLACEHOLDER),
    "ale task check path/to/task --json > check.json": Skip(PLACEHOLDER),
    "ale task check path/to/task --full-adversarial": Skip(PLACEHOLDER),
    "ale task check path/to/task --jobs 4": Skip(PLACEHOLDER),
    # docs/software.md
    "ale env build examples/tasks": Run(_contains("fully provisioned", "stderr")),
    "ale env build agents-last-exam/tasks --overlay ops.yaml --json": Skip(CORPUS),
    "ale env build agents-last-exam/tasks --data gs://bucket/ale": Skip(CORPUS),
    "ale task list agents-last-exam/tasks --json": Skip(CORPUS),
    "ale run TASK --overlay ops.yaml": Skip("TASK and ops.yaml are the reader's; tests/test_software_runs.py runs overlays"),
    "ale task check path/to/ale-task --oracle-script solve-{variant}.json":
        Skip("an ALE task of the reader's with its replay scripts; tests/test_task_check_adversarial.py"),
    # docs/viewer.md
    "ale view runs/<run-id> --open": Skip("opens a desktop browser; the page it opens is the one `ale view` writes (run here)"),
    "ale view runs/demo": Run(_file("runs/demo/views/index.html"), ("demo",)),
    "ale view runs/demo --serve": Skip("serves until Ctrl-C; tests/test_viewer.py serves and fetches the page"),
    "ale view runs/<run-id> --out /tmp/run.html --no-verify": Run(_file("/tmp/run.html"), ("run",)),
    "ale export runs/<run-id> --format atif": Run(_file("{run}.atif.json"), ("run",)),
    "ale export runs/demo --format atif": Run(_one_atif_per_run("runs/demo"), ("demo",)),
    "ale export runs/<run-id> --format atif --out /tmp/t.json": Run(_file("/tmp/t.json"), ("run",)),
    # docs/vm.md, README.md: the qemu provider
    "bash scripts/setup.sh": Skip("installs Debian packages as root and builds the tools image: the machine's set-up, not a test's"),
    "ale image build --vm": Skip(VM + " (a 1 GB disk per cache); tests/test_qemu_*.py use the one built"),
    "ale run examples/tasks/files/word_count --provider qemu": Skip(VM + "; tests/test_qemu_run.py runs it"),
    "ale run examples/tasks/files/word_count --provider qemu --agent oracle": Skip(VM + "; tests/test_qemu_run.py runs it"),
    "ALE_QEMU_BOOT=warm ale run examples/tasks/files/word_count --provider qemu": Skip(VM + "; tests/test_qemu_warm.py runs it"),
    "ale run examples/tasks/gui/type_in_box --provider qemu": Skip(VM + "; tests/test_qemu_run.py runs it"),
    "ale image build --vm --foreign-test": Skip(VM + "; tests/test_qemu_foreign.py builds it"),
    "ale run TASK --provider qemu --vm-image cpu-free-ubuntu=/path/disk.qcow2":
        Skip(VM + "; tests/test_qemu_foreign.py runs word_count on the test disk so mapped"),
    "ALE_QEMU_BOOT=warm ale run examples/tasks/files/word_count --provider qemu --agent oracle":
        Skip(VM + "; tests/test_qemu_warm.py runs it"),
    "ale run examples/tasks/files/word_count --provider qemu --accel kvm":
        Skip(VM + "; tests/test_qemu_conformance.py checks that --accel kvm refuses where the probe failed"),
}


# -- set-up steps some commands need (what the reader would have made) -----------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env.pop("ALE_RUNS_DIR", None)
    return env


def sh(ctx: Ctx, command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=ctx.root, capture_output=True, text=True, env=_env(), timeout=timeout)


def _setup_run(ctx: Ctx) -> None:
    if "run" not in ctx.made:
        _oracle_run(sh(ctx, "ale run examples/tasks/files/word_count --agent oracle"), ctx)


def _setup_cua_image(ctx: Ctx) -> None:
    p = sh(ctx, "ale image build --cua")  # a lookup once built (cached by content)
    assert p.returncode == 0, p.stderr[-3000:]


def _setup_my_calls(ctx: Ctx) -> None:
    shutil.copy(ctx.root / "examples" / "agents" / "replay_simple.json", ctx.root / "my-calls.json")


def _setup_exp_yaml(ctx: Ctx) -> None:
    """exp.yaml: examples/demo.yaml's agents and environment on files/word_count, output results/demo."""
    if (ctx.root / "exp.yaml").is_file():
        return
    demo = yaml.safe_load((ctx.root / "examples" / "demo.yaml").read_text())
    demo["tasks_root"] = "examples/tasks"
    demo["tasks"] = [{"path": "files/word_count"}]
    for a in demo["agents"]:
        if isinstance(a.get("config", {}).get("script"), str):
            a["config"]["script"] = "examples/" + a["config"]["script"]
    demo["output"] = "results/demo"
    (ctx.root / "exp.yaml").write_text(yaml.safe_dump(demo, sort_keys=False))


def _setup_demo(ctx: Ctx) -> None:
    """results/demo (and runs/demo, the same folder): the experiment, run."""
    _setup_exp_yaml(ctx)
    if not (ctx.root / "results" / "demo" / "report.html").is_file():
        p = sh(ctx, "ale exp run exp.yaml --plain")
        assert p.returncode == 0, p.stderr[-3000:]
    (ctx.root / "runs").mkdir(exist_ok=True)
    if not (ctx.root / "runs" / "demo").exists():
        (ctx.root / "runs" / "demo").symlink_to(ctx.root / "results" / "demo")


def _setup_container(ctx: Ctx) -> None:
    if "container" in ctx.made:
        return
    name = f"ale-docs-{uuid.uuid4().hex[:8]}"
    for d in ("run-input", "run-workspace"):
        (ctx.root / d).mkdir(exist_ok=True)
    os.chmod(ctx.root / "run-workspace", 0o777)
    ctx.made.update(container=name)


SETUPS: dict[str, Callable[[Ctx], None]] = {
    "run": _setup_run, "my-calls": _setup_my_calls, "exp.yaml": _setup_exp_yaml, "demo": _setup_demo,
    "container": _setup_container, "cua-image": _setup_cua_image,
}


def fill_in(command: str, ctx: Ctx) -> str:
    out = command.replace("runs/<run-id>", ctx.made.get("run", "runs/<run-id>"))
    if "container" in ctx.made:
        out = (out.replace("--name RUN ", f"--name {ctx.made['container']} ")
               .replace("verify-container RUN ", f"verify-container {ctx.made['container']} ")
               .replace("RUN_INPUT", str(ctx.root / "run-input")).replace("RUN_WORKSPACE", str(ctx.root / "run-workspace"))
               .replace(" [--policy policy.yaml]", ""))
    return out


# -- the tests -------------------------------------------------------------------------


def test_every_documented_command_is_listed() -> None:
    documented = {cmd for _, cmd in documented_commands()}
    assert documented, "no ```sh blocks found"
    unlisted = sorted(documented - set(COMMANDS))
    assert not unlisted, f"documented but not in COMMANDS (run it here, or skip it with a reason): {unlisted}"
    for cmd, spec in COMMANDS.items():
        assert not isinstance(spec, Skip) or len(spec.reason) > 10, cmd


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory, request) -> Iterator[Ctx]:
    """The checkout's tracked files (as they are in the work tree) in a new folder,
    with the set-up's .venv: what `git clone` and `make setup` leave."""
    root = tmp_path_factory.mktemp("clone") / "ale"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split("\0")):
        src = ROOT / rel
        if src.is_file():
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    (root / ".venv").symlink_to(ROOT / ".venv")
    ctx = Ctx(root)
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("command") for item in request.session.items}
    for command, spec in COMMANDS.items():
        if isinstance(spec, Run) and spec.slow and command in selected:
            log = root.parent / f"bg-{len(ctx.background)}"
            proc = subprocess.Popen(["bash", "-c", command], cwd=root, env=_env(), text=True,
                                    stdout=open(f"{log}.out", "w"), stderr=open(f"{log}.err", "w"))  # noqa: SIM115
            ctx.background[command] = (proc, log)
    yield ctx
    for proc, _ in ctx.background.values():
        if proc.poll() is None:  # a test stopped early: let ale end its runs (Ctrl-C's cleanup)
            proc.send_signal(signal.SIGINT)
            proc.wait(300)


def _to_run() -> list[str]:
    documented = [cmd for _, cmd in documented_commands()]
    return [c for c in dict.fromkeys(documented) if isinstance(COMMANDS.get(c), Run)]


@pytest.mark.parametrize("command", _to_run())
def test_documented_command_works_as_shown(docker_client, fresh_clone: Ctx, command: str) -> None:
    spec = COMMANDS[command]
    assert isinstance(spec, Run)
    for need in spec.needs:
        SETUPS[need](fresh_clone)
    actual = fill_in(command, fresh_clone)
    t0 = time.monotonic()
    try:
        if command in fresh_clone.background:
            proc, log = fresh_clone.background[command]
            proc.wait(1200)
            p = subprocess.CompletedProcess(command, proc.returncode, Path(f"{log}.out").read_text(),
                                            Path(f"{log}.err").read_text())
        else:
            p = sh(fresh_clone, actual)
    finally:
        if command.startswith("ale verify-container"):
            subprocess.run(["docker", "rm", "-f", fresh_clone.made["container"]], capture_output=True)
    fresh_clone.times[command] = time.monotonic() - t0
    assert p.returncode == 0, f"{actual}\nexit {p.returncode}\n{p.stderr[-3000:]}"
    if spec.check is not None:
        spec.check(p, fresh_clone)


# -- docs/data.md's synopses (untagged blocks: usage lines, not commands to run) ------------


def synopses(doc: Path) -> list[str]:
    """The ``ale ...`` lines of ``doc``'s untagged fenced blocks."""
    out, fence = [], None
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence == "" and line.startswith("ale "):
            out.append(" ".join(line.split()))
    return out


def _command(words: list[str]):  # a click command of ale's CLI, by its words
    import typer.main

    from ale.cli.main import app

    cmd = typer.main.get_command(app)
    for w in words:
        cmd = cmd.commands[w]  # type: ignore[attr-defined]
    return cmd


def test_data_md_synopses_match_the_cli() -> None:
    """Issue 27, item 6: each synopsis in docs/data.md names a real command, its
    options exist (each documented choice among the option's choices or its help),
    and a positional placeholder stands for a real argument."""
    lines = synopses(ROOT / "docs" / "data.md")
    assert len(lines) >= 4, lines  # seal, unseal, bake, validate
    for line in lines:
        tokens = re.findall(r"\[[^\]]*\]|\S+", line)[1:]
        words = [t for t in tokens if re.fullmatch(r"[a-z][a-z-]*", t)]
        head = []
        for t in tokens:
            if t not in words:
                break
            head.append(t)
        cmd = _command(head)
        params = {o: p for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for opt, value in re.findall(r"(--[a-z][a-z-]*)(?:[ =]([^\]\s]+))?", line):
            assert opt in params, f"{line}: {opt} is not an option of ale {' '.join(head)}"
            p = params[opt]
            if value and "|" in value:
                choices = getattr(getattr(p, "bare_type", None), "choices", None) or []
                known = [str(c) for c in choices] + [str(getattr(p, "help", "") or "")]
                for choice in value.split("|"):
                    assert any(choice in k for k in known), f"{line}: {opt} {choice} is not among {known}"
        placeholders = [t for t in tokens[len(head):] if re.fullmatch(r"[A-Z][A-Z_]*(\.\.\.)?", t)]
        arguments = [p for p in cmd.params if type(p).__name__.endswith("Argument")]  # typer's own click
        assert len(arguments) >= len(placeholders), f"{line}: {placeholders} but the command takes {arguments}"
        for ph, arg in zip(placeholders, arguments, strict=False):
            assert ph.endswith("...") == (arg.nargs == -1), f"{line}: {ph} vs the argument {arg.name} (nargs {arg.nargs})"
