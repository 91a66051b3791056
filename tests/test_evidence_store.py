"""Evidence files, tree hashes, redaction and sealing (ale.record.evidence)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ale import layout
from ale.data.hashing import hash_tree as data_hash_tree
from ale.record import evidence as ev
from ale.record.signing import public_key_sha256, verify_envelope
from ale.redaction import REDACTED, redact, unredacted_secrets


def test_sha256_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    assert ev.sha256_file(tmp_path / "f") == hashlib.sha256(b"abc").hexdigest()


def test_hash_tree_matches_the_data_layer_format(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.txt").write_text("x")
    (tmp_path / "top.bin").write_bytes(b"\0" * 10)
    (tmp_path / "empty").mkdir()
    tree = ev.hash_tree(tmp_path)
    assert tree["files"] == {
        "a/b/x.txt": {"sha256": hashlib.sha256(b"x").hexdigest(), "size": 1},
        "top.bin": {"sha256": hashlib.sha256(b"\0" * 10).hexdigest(), "size": 10},
    }
    assert tree["count"] == 2 and tree["others"] == {}
    assert tree["digest"] == data_hash_tree(tmp_path)["digest"] == ev.tree_hash_digest(tree)


def test_hash_tree_records_links_without_following_them(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "f").write_text("f")
    (tmp_path / "secret").write_text("outside")
    (tmp_path / "outside_dir").mkdir()
    (tmp_path / "outside_dir" / "s").write_text("s")
    plain = ev.hash_tree(root)["digest"]
    os.symlink(tmp_path / "secret", root / "link")
    os.symlink(tmp_path / "outside_dir", root / "dirlink")
    os.mkfifo(root / "pipe")
    tree = ev.hash_tree(root)
    assert set(tree["files"]) == {"f"}
    assert tree["others"] == {
        "dirlink": {"type": "symlink", "target": str(tmp_path / "outside_dir")},
        "link": {"type": "symlink", "target": str(tmp_path / "secret")},
        "pipe": {"type": "fifo", "mode": tree["others"]["pipe"]["mode"]},
    }
    assert tree["digest"] != plain
    assert ev.tree_hash_digest(tree) == tree["digest"]


def test_store_writes_once_and_refuses_bad_names(tmp_path: Path) -> None:
    store = ev.EvidenceStore(tmp_path / "run")
    p = store.write_json("a.json", {"x": 1})
    assert p == tmp_path / "run" / "evidence" / "a.json"
    assert json.loads(p.read_text()) == {"x": 1}
    with pytest.raises(ev.EvidenceError, match="exists already"):
        store.write_json("a.json", {"x": 2})
    with pytest.raises(ev.EvidenceError, match="exists already"):
        store.write_text("a.json", "y")
    assert json.loads(p.read_text()) == {"x": 1}
    for bad in ("../x.json", "sub/x.json", "", ".hidden", ".."):
        with pytest.raises(ev.EvidenceError, match="plain file name"):
            store.path(bad)
    store.write_text("probe.txt", "raw\n")
    assert store.path("probe.txt").read_text() == "raw\n"


def test_redact_keys_and_values() -> None:
    cfg = {
        "model": "gpt-x",
        "api_key": "abc",
        "max_tokens": 4096,
        "author": "Jane",
        "nested": {"Authorization": "Bearer xyz", "list": ["sk-abcdefghijklmnop", "ok"], "password": ""},
        "command": "run --token-file /x --header 'Authorization: Bearer abcdefghijkl'",
        "OPENAI_API_KEY": "sk-xxxxxxxxxxxxxxxx",
        "credentials": {"user": "u", "secret": "s"},
    }
    out = redact(cfg)
    assert out == {
        "model": "gpt-x",
        "api_key": REDACTED,
        "max_tokens": 4096,
        "author": "Jane",
        "nested": {"Authorization": REDACTED, "list": [REDACTED, "ok"], "password": ""},
        "command": f"run --token-file /x --header 'Authorization: {REDACTED}'",
        "OPENAI_API_KEY": REDACTED,
        "credentials": {"user": "u", "secret": REDACTED},
    }
    assert cfg["api_key"] == "abc"  # a copy, the input is untouched
    assert unredacted_secrets(out) == []
    assert sorted(unredacted_secrets(cfg)) == [
        "OPENAI_API_KEY", "api_key", "command", "credentials.secret", "nested.Authorization", "nested.list[0]",
    ]
    assert unredacted_secrets({"api_key": "<redacted>"}) == []


def test_sign_refuses_a_second_seal_and_odd_entries(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"run_id": "r", "status": "scored", "score": 1.0}))
    key = Ed25519PrivateKey.generate()
    os.symlink("/etc/hostname", run / "link")
    with pytest.raises(ev.EvidenceError, match="not regular files: link"):
        ev.write_manifest_and_sign(run, key)
    (run / "link").unlink()
    assert not (run / layout.PUBLIC_KEY).exists()  # a refused seal leaves nothing behind
    env_path = ev.write_manifest_and_sign(run, key)
    statement = verify_envelope(json.loads(env_path.read_text()), key.public_key())
    assert {s["name"] for s in statement["subject"]} == {"result.json", "public_key.pem"}
    assert statement["predicate"]["public_key_sha256"] == public_key_sha256(key)
    assert json.loads((run / "manifest.json").read_text()) == {
        s["name"]: s["digest"]["sha256"] for s in statement["subject"]
    }
    with pytest.raises(ev.EvidenceError, match="signed before"):
        ev.write_manifest_and_sign(run, key)


def test_sign_needs_a_result(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(ev.EvidenceError, match="write the result before signing"):
        ev.write_manifest_and_sign(tmp_path / "run", Ed25519PrivateKey.generate())
