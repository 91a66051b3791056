"""Cluster plumbing without a cluster: the `cluster` value, run folders brought
home (intact, tampered, wrong signer, superseded), trusted key sets, and what
asking for Ray says when Ray is not installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ale import layout
from ale.plan import AgentSpec, RunPlan
from ale.record import evidence as ev
from ale.record.signing import load_or_create_signing_key, public_key_pem, public_key_sha256
from ale.record.trusted_keys import load_trusted_keys, signer_key
from ale.runs import node as nodes
from ale.runs.cluster import (
    SUPERSEDED_DIR,
    ClusterError,
    DeliveryError,
    deliver,
    parse_cluster,
    resolve_cluster,
)
from ale.runs.experiment import EnvironmentSpec


def test_cluster_values() -> None:
    assert str(parse_cluster(None)) == "local"
    assert str(parse_cluster("local")) == "local"
    spec = parse_cluster("ray:10.0.0.5:6379")
    assert (spec.kind, spec.address) == ("ray", "10.0.0.5:6379")
    for bad in ("ray:", "ray:host", "ray:host:0", "k8s:x", "ray:host:99999"):
        with pytest.raises(ValueError, match="ray:HOST:PORT"):
            parse_cluster(bad)
    assert EnvironmentSpec(cluster="ray:h:1").cluster == "ray:h:1"
    with pytest.raises(ValueError):
        EnvironmentSpec(cluster="ray:nope")


def test_option_then_env_then_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALE_CLUSTER", "ray:env:2")
    assert str(resolve_cluster("ray:opt:1", "ray:file:3")) == "ray:opt:1"
    assert str(resolve_cluster(None, "ray:file:3")) == "ray:env:2"
    monkeypatch.delenv("ALE_CLUSTER")
    assert str(resolve_cluster(None, "ray:file:3")) == "ray:file:3"
    assert str(resolve_cluster(None, "local")) == "local"


def _signed_run(tmp: Path, run_id: str = "u-a1") -> tuple[Path, RunPlan, object]:
    key = load_or_create_signing_key(tmp / "node" / "key.pem")
    plan = RunPlan(run_id=run_id, task_dir="/t", agent=AgentSpec(name="nop"), runs_dir=str(tmp / "node" / "runs"))
    run_dir = plan.run_dir
    (run_dir / "evidence").mkdir(parents=True)
    (run_dir / layout.PLAN).write_text(plan.model_dump_json())
    (run_dir / "evidence" / "engine.json").write_text(json.dumps({"version": {}, "node": {"name": "w1"}}))
    (run_dir / layout.RESULT).write_text(json.dumps({
        "run_id": run_id, "task_id": "t", "task_dir": "/t", "variant": 0, "agent": "nop", "status": "scored",
        "score": 1.0, "scores": [1.0], "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:00:01Z",
        "harness_version": "0", "attempt": 1}))
    ev.write_manifest_and_sign(run_dir, key)  # type: ignore[arg-type]
    return run_dir, plan, key


def _payload(run_dir: Path, run_id: str) -> dict:
    return {"run_id": run_id, "files": nodes.file_digests(run_dir), "tar": nodes.pack_run_dir(run_dir), "node": {}}


def test_a_run_folder_arrives_byte_for_byte(tmp_path: Path) -> None:
    run_dir, plan, key = _signed_run(tmp_path)
    sent = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    out = tmp_path / "exp"
    dest, result = deliver(_payload(run_dir, plan.run_id), plan, out, expected_key=public_key_sha256(key))
    assert dest == out / "runs" / plan.run_id and result is not None and result.status.value == "scored"
    assert {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == sent
    assert not list((out / "runs" / ".incoming").iterdir())


def test_tampered_or_foreign_folders_are_refused(tmp_path: Path) -> None:
    run_dir, plan, key = _signed_run(tmp_path)
    out = tmp_path / "exp"
    payload = _payload(run_dir, plan.run_id)
    payload["files"] = {**payload["files"], layout.RESULT: "0" * 64}
    with pytest.raises(DeliveryError, match="intact"):
        deliver(payload, plan, out, expected_key=None)
    other = load_or_create_signing_key(tmp_path / "other.pem")
    with pytest.raises(DeliveryError, match="registered key"):
        deliver(_payload(run_dir, plan.run_id), plan, out, expected_key=public_key_sha256(other))
    with pytest.raises(DeliveryError, match="returned run"):
        deliver(_payload(run_dir, plan.run_id), plan.model_copy(update={"run_id": "x-a1"}), out, expected_key=None)
    assert not (out / "runs" / plan.run_id).exists()


def test_a_late_result_is_superseded_never_counted(tmp_path: Path) -> None:
    run_dir, plan, key = _signed_run(tmp_path)
    out = tmp_path / "exp"
    # The attempt was declared lost: the driver wrote its infrastructure error.
    (out / "runs" / plan.run_id).mkdir(parents=True)
    (out / "runs" / plan.run_id / layout.RESULT).write_text("{}")
    dest, result = deliver(_payload(run_dir, plan.run_id), plan, out, expected_key=public_key_sha256(key))
    assert result is None and dest.parent == out / SUPERSEDED_DIR
    assert (out / "runs" / plan.run_id / layout.RESULT).read_text() == "{}"
    dest2, result2 = deliver(_payload(run_dir, "u-a1"), plan, out, expected_key=None, superseded=True)
    assert result2 is None and dest2.parent == out / SUPERSEDED_DIR


def test_trusted_key_sets(tmp_path: Path) -> None:
    run_dir, plan, key = _signed_run(tmp_path)
    other = load_or_create_signing_key(tmp_path / "other.pem")
    nodes_json = tmp_path / "nodes.json"
    nodes_json.write_text(json.dumps({"nodes": {
        "a": {"public_key_pem": public_key_pem(other).decode()},
        "b": {"public_key_pem": public_key_pem(key).decode()},  # type: ignore[arg-type]
    }}))
    keys = load_trusted_keys(nodes_json)
    assert signer_key(run_dir, keys) == public_key_pem(key)  # type: ignore[arg-type]
    bundle = tmp_path / "keys.pem"
    bundle.write_bytes(public_key_pem(other) + public_key_pem(key))  # type: ignore[arg-type]
    assert set(load_trusted_keys(bundle)) == set(keys)

    from ale.cli.main import app

    runner = CliRunner()
    ok = runner.invoke(app, ["verify", str(run_dir), "--trusted-keys", str(nodes_json), "--json"])
    checks = {c["id"]: c["ok"] for c in json.loads(ok.stdout)["checks"]}
    assert checks["signature.valid"] is True
    only_other = tmp_path / "other-only.pem"
    only_other.write_bytes(public_key_pem(other))
    bad = runner.invoke(app, ["verify", str(run_dir), "--trusted-keys", str(only_other), "--json"])
    assert bad.exit_code == 1
    assert {c["id"]: c["ok"] for c in json.loads(bad.stdout)["checks"]}["signature.valid"] is False


def test_asking_for_ray_without_ray_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    token = tmp_path / "token"
    token.write_text("x")
    token.chmod(0o600)
    from ale.runs.cluster import RayCluster

    with pytest.raises(ClusterError, match=r"pip install 'ale\[ray\]'"):
        RayCluster("127.0.0.1:1", tmp_path, token_file=token)
    with pytest.raises(nodes.NodeError, match=r"ale\[ray\]"):
        nodes.start_node(head=True)


def test_node_commands_without_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALE_NODE_ROOT", str(tmp_path / "nodes"))
    from ale.cli.main import app

    runner = CliRunner()
    assert runner.invoke(app, ["node", "status"]).exit_code == 0
    r = runner.invoke(app, ["node", "stop"])
    assert r.exit_code == 0 and "no node" in r.output
    r = runner.invoke(app, ["node", "stop", "nope"])
    assert r.exit_code == 1 and "no node named" in r.output
