"""A real Ray cluster on one machine: a head and two workers, each worker in its own
network namespace with its own Docker engine. An experiment spreads over both,
one worker is SIGKILLed mid-way: every unit ends once, the lost attempts are
retried on the other node, the killed node's containers are gone when it returns,
and `ale report` / `ale verify` agree with a local run of the same experiment.

Bounded: the whole module runs in a few minutes; the rig (namespaces, engines,
nodes) is torn down on every path out.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_rig import Rig, can_build_rig  # noqa: E402
from tests.conftest import require  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.timeout(420)]
WHY = can_build_rig()
require(not WHY, f"the Ray cluster test {WHY}", allow_module_level=True)

TASK = textwrap.dedent("""\
    import asyncio

    import cua_bench as cb


    @cb.tasks_config
    def load():
        return [cb.Task(description=f"Do nothing ({i}).", task_id=f"quick-{i}") for i in range(3)]


    @cb.setup_task
    async def start(cfg, session):
        await asyncio.sleep(4)  # a window in which a node can be lost mid-run


    @cb.solve_task(split="train")
    async def solve(cfg, session):
        await session.run_command("true", check=True)


    @cb.evaluate_task
    async def evaluate(cfg, session):
        return [1.0 if cfg.task_id.endswith(("0", "2")) else 0.0]
""")


def write_experiment(tmp: Path, name: str, out: str) -> Path:
    task = tmp / "tasks" / "quick"
    if not task.exists():
        task.mkdir(parents=True)
        (task / "main.py").write_text(TASK)
    f = tmp / f"{out}.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: {name}
        tasks_root: tasks
        agents: [{{name: nop}}, {{name: oracle}}]
        tasks: [{{path: quick, variants: all}}]
        repeats: 1
        concurrency: 2
        retry: {{max_attempts: 3, backoff_initial_s: 0.5, backoff_max_s: 2}}
        environment:
          policy: {{cpus: 1, memory_bytes: 268435456}}
        output: {out}
    """))
    return f


def node_of(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "evidence" / "engine.json").read_text())["node"]["name"]
    except (OSError, KeyError, ValueError):
        return None


def results(out: Path) -> dict[str, dict]:
    found = {}
    for p in sorted((out / "runs").glob("*/result.json")) if (out / "runs").is_dir() else []:
        try:
            found[p.parent.name] = json.loads(p.read_text())
        except ValueError:
            continue
    return found


def containers(sock: str, label: str = "ale.managed=1") -> list[str]:
    p = subprocess.run(["docker", "-H", sock, "ps", "-aq", "--filter", f"label={label}"],
                       capture_output=True, text=True, timeout=30)
    return p.stdout.split()


def running_runs(sock: str, experiment: str) -> list[str]:
    """The run ids of the experiment's containers running on an engine."""
    p = subprocess.run(["docker", "-H", sock, "ps", "--filter", f"label=ale.experiment={experiment}",
                        "--filter", "status=running", "--format", '{{.Label "ale.run_id"}}'],
                       capture_output=True, text=True, timeout=30)
    return sorted(set(p.stdout.split()))


def report(rig: Rig, out: Path) -> dict:
    rep = json.loads(rig.ale("report", str(out), "--json").stdout)
    return {
        "counts": {k: v for k, v in rep["counts_by_status"].items() if v},
        "agents": sorted((a["agent"], a["mean"], a["runs"]) for a in rep["agents"]),
    }


def verify_all(rig: Rig, out: Path, *extra: str) -> dict[str, int]:
    codes = {}
    for run_id, res in results(out).items():
        if res["status"] != "infrastructure_error":
            codes[run_id] = rig.ale("verify", str(out / "runs" / run_id), *extra, check=False).returncode
    return codes


@pytest.fixture(scope="module")
def rig():
    with Rig(workers=2, slots=1) as r:
        yield r


JOIN = """
import os, sys, ray
if sys.argv[2] == "without":
    os.environ["RAY_AUTH_MODE"] = "disabled"
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
except Exception as e:
    print("refused", type(e).__name__)
else:
    print("connected")
"""


def _join(rig: Rig, token: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in rig.env.items() if not k.startswith("RAY_AUTH")}
    if token:  # as ale's cluster client joins (ale.runs.node): token mode, the rig's token file
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=rig.env["RAY_AUTH_TOKEN_PATH"])
    return subprocess.run([sys.executable, "-c", JOIN, rig.address, "with" if token else "without"],
                          capture_output=True, text=True, env=env, timeout=120)


def refused_for_the_token(p: subprocess.CompletedProcess) -> bool:
    """The cluster's own refusal: GCS answers Unauthenticated / InvalidAuthToken (not
    an unreachable address, a crash or a timeout, which refuse anyone)."""
    return p.stdout.strip() == "refused ConnectionError" and "InvalidAuthToken" in p.stderr


def test_token_auth_on_and_no_public_dashboard(rig: Rig) -> None:
    without = _join(rig, token=False)
    assert refused_for_the_token(without), without.stdout + without.stderr[-2000:]
    with_token = _join(rig, token=True)  # the same client, with the token: the refusal was the token's
    assert with_token.stdout.strip() == "connected", with_token.stdout + with_token.stderr[-2000:]
    listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
    dash = [line.split()[3] for line in listening.splitlines() if line.split()[3].endswith(":8265")]
    assert all(a.startswith(("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")) for a in dash), dash


def test_experiment_survives_a_lost_node(rig: Rig, tmp_path: Path) -> None:
    name = f"cl-{uuid.uuid4().hex[:6]}"
    exp = write_experiment(tmp_path, name, "out")
    out = tmp_path / "out"
    e1, e2 = rig.engines
    w1, w2 = f"w1{rig.tag}", f"w2{rig.tag}"
    proc = subprocess.Popen([*rig_cmd(), "exp", "run", str(exp), "--plain", "--cluster", f"ray:{rig.address}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=rig.env,
                            start_new_session=True)
    lost: list[str] = []
    left: list[str] = []
    try:
        # Wait until a run has finished on each node and one is live on worker 1: its
        # container running, its result not yet written (a run at its very end, its
        # container already being removed, would not test that a lost node's leftovers stay).
        deadline = time.monotonic() + 180
        while True:
            done = {node_of(out / "runs" / r) for r in results(out)}
            live = [r for r in running_runs(e1.sock, name) if not (out / "runs" / r / "result.json").exists()]
            if {w1, w2} <= done and live:
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"no run on both nodes: {done}"
            time.sleep(0.2)
        rig.kill_worker(e1)
        lost = sorted(set(live))
        time.sleep(1.0)  # a removal the engine had already accepted completes
        # Nothing of the killed node is left to remove its containers: they stay until it returns.
        left = [c for r in lost for c in containers(e1.sock, f"ale.run_id={r}")]
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    res = results(out)
    units = json.loads((out / "units.json").read_text())
    unit_ids = list(units) if isinstance(units, dict) else [u["unit_id"] for u in units]
    assert len(unit_ids) == 6

    # Every unit ends exactly once: one final attempt, the others infrastructure errors.
    for uid in unit_ids:
        attempts = sorted(r for r in res if r.rsplit("-a", 1)[0] == uid)
        finals = [r for r in attempts if res[r]["status"] != "infrastructure_error"]
        assert len(finals) == 1, (uid, attempts)
        assert finals[0] == attempts[-1]
    # The attempts lost with worker 1 were declared lost and retried on worker 2.
    assert lost, "a run was live on worker 1 when it was killed"
    for run_id in lost:
        assert res[run_id]["status"] == "infrastructure_error"
        assert "lost with its node" in res[run_id]["error"]
        unit, n = run_id.rsplit("-a", 1)
        retry = f"{unit}-a{int(n) + 1}"
        assert res[retry]["status"] == "scored" and node_of(out / "runs" / retry) == w2
    # The evidence names both nodes, with their engines.
    engines = [json.loads((out / "runs" / r / "evidence" / "engine.json").read_text())["node"]
               for r in res if node_of(out / "runs" / r)]
    assert {n["name"] for n in engines} == {w1, w2}
    assert all(n["engine_id"] and n["engine_version"] and n["ray_node_id"] and n["hostname"] for n in engines)
    assert not (out / "superseded").exists() or all(not (out / "runs" / p.name).exists()
                                                     for p in (out / "superseded").iterdir())

    # The killed node's containers stayed while it was gone; its janitor removes them on return.
    assert left, "the lost run's container should outlive its node"
    assert [c for r in lost for c in containers(e1.sock, f"ale.run_id={r}")], "removed while the node was gone"
    rig.start_worker(e1)
    assert not [c for r in lost for c in containers(e1.sock, f"ale.run_id={r}")]
    assert not containers(e2.sock, f"ale.experiment={name}")

    # Signed by the nodes' keys, registered in nodes.json; verify accepts that set.
    nodes = json.loads((out / "nodes.json").read_text())["nodes"]
    assert {n["name"] for n in nodes.values()} >= {w1, w2}
    cluster_codes = verify_all(rig, out, "--trusted-keys", str(out / "nodes.json"))
    assert cluster_codes and set(cluster_codes.values()) == {0}, cluster_codes

    # The same experiment, locally: the same report and the same verdicts.
    local_exp = write_experiment(tmp_path, name + "-local", "local")
    p = rig.ale("exp", "run", str(local_exp), "--plain", "--cluster", "local", timeout=300)
    assert p.returncode == 0
    assert report(rig, out) == report(rig, tmp_path / "local")
    local_codes = verify_all(rig, tmp_path / "local")
    assert sorted(local_codes.values()) == sorted(cluster_codes.values())


def test_run_folders_arrive_byte_for_byte(rig: Rig, tmp_path: Path) -> None:
    """The sha256 of every file, computed on the node, equals that of the folder at home."""
    import pickle

    from ale.runs.cluster import deliver
    from ale.runs.experiment import load_experiment, plan_units

    exp = load_experiment(write_experiment(tmp_path, f"cb-{uuid.uuid4().hex[:6]}", "bytes"))
    plan = plan_units(exp)[0].plan
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    script = textwrap.dedent(f"""
        import pickle, sys
        from pathlib import Path
        from ale.runs.cluster import RayCluster
        from ale.runs import node as nodes
        c = RayCluster({rig.address!r}, Path({str(tmp_path)!r}))
        ref = c._execute.options(resources={{nodes.RESOURCE: 1}}).remote(Path({str(tmp_path / "plan.json")!r}).read_text())
        Path({str(tmp_path / "payload.pickle")!r}).write_bytes(pickle.dumps(c.ray.get(ref, timeout=180)))
        c.close()
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=rig.env, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    payload = pickle.loads((tmp_path / "payload.pickle").read_bytes())
    dest, result = deliver(payload, plan, exp.output_dir, expected_key=payload["node"]["public_key_sha256"])
    assert result is not None and result.status.value == "scored"
    home = {p.relative_to(dest).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(dest.rglob("*")) if p.is_file()}
    assert home == payload["files"] and len(home) > 5
    assert rig.ale("verify", str(dest), "--trusted-keys", str(tmp_path / "nodes.json"), check=False).returncode == 0


def rig_cmd() -> list[str]:
    return [sys.executable, "-m", "ale.cli"]
