"""Ed25519 keys and DSSE envelopes (ale.record.signing)."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ale.record.signing import (
    PAYLOAD_TYPE,
    STATEMENT_TYPE,
    SignatureInvalid,
    SigningError,
    dsse_pae,
    load_or_create_signing_key,
    load_public_key,
    public_key_pem,
    public_key_sha256,
    sign_envelope,
    verify_envelope,
)

STATEMENT = {
    "_type": STATEMENT_TYPE,
    "subject": [{"name": "result.json", "digest": {"sha256": "00" * 32}}],
    "predicateType": "https://ale.dev/evidence/v1",
    "predicate": {"run_id": "r1", "score": 0.5},
}


def test_pae_matches_the_dsse_spec_example() -> None:
    assert dsse_pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_sign_then_verify_returns_the_statement() -> None:
    key = Ed25519PrivateKey.generate()
    env = sign_envelope(STATEMENT, key)
    assert env["payloadType"] == PAYLOAD_TYPE
    assert env["signatures"][0]["keyid"] == public_key_sha256(key)
    assert verify_envelope(env, key.public_key()) == STATEMENT
    # The envelope survives a JSON round trip (what is signed is the payload bytes).
    assert verify_envelope(json.loads(json.dumps(env, indent=4)), key.public_key()) == STATEMENT


def test_altered_payload_is_rejected() -> None:
    key = Ed25519PrivateKey.generate()
    env = sign_envelope(STATEMENT, key)
    forged = dict(STATEMENT, predicate={"run_id": "r1", "score": 1.0})
    env["payload"] = base64.b64encode(json.dumps(forged).encode()).decode()
    with pytest.raises(SignatureInvalid, match="altered after signing, or it was signed by another key"):
        verify_envelope(env, key.public_key())


def test_another_key_is_rejected() -> None:
    env = sign_envelope(STATEMENT, Ed25519PrivateKey.generate())
    with pytest.raises(SignatureInvalid, match="no signature verifies"):
        verify_envelope(env, Ed25519PrivateKey.generate().public_key())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.update(payloadType="application/json"), "payloadType"),
        (lambda e: e.update(payload="not base64!"), "not valid base64"),
        (lambda e: e.update(signatures=[]), "no signatures"),
        (lambda e: e.update(payload=base64.b64encode(b"{}").decode()), "not an in-toto Statement"),
    ],
)
def test_malformed_envelopes_say_what_is_wrong(mutate, message: str) -> None:
    key = Ed25519PrivateKey.generate()
    env = sign_envelope(STATEMENT, key)
    mutate(env)
    with pytest.raises(SignatureInvalid, match=message):
        verify_envelope(env, key.public_key())


def test_statement_type_is_required() -> None:
    with pytest.raises(SigningError, match="_type"):
        sign_envelope({"subject": []}, Ed25519PrivateKey.generate())


def test_key_is_created_owner_only_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "signing_key.pem"
    key = load_or_create_signing_key(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    again = load_or_create_signing_key(path)
    assert public_key_sha256(again) == public_key_sha256(key)
    assert [p.name for p in path.parent.iterdir()] == ["signing_key.pem"]


def test_default_key_lives_in_the_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALE_CONFIG_DIR", str(tmp_path / "conf"))
    key = load_or_create_signing_key(None)
    assert (tmp_path / "conf" / "signing_key.pem").is_file()
    assert public_key_sha256(load_or_create_signing_key(None)) == public_key_sha256(key)


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    load_or_create_signing_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(SigningError, match="chmod 600"):
        load_or_create_signing_key(path)


def test_non_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    path.write_text("hello")
    os.chmod(path, 0o600)
    with pytest.raises(SigningError, match="not an unencrypted PEM private key"):
        load_or_create_signing_key(path)


def test_public_key_file_round_trip(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    (tmp_path / "pub.pem").write_bytes(public_key_pem(key))
    assert public_key_sha256(load_public_key(tmp_path / "pub.pem")) == public_key_sha256(key)
    (tmp_path / "bad.pem").write_text("nope")
    with pytest.raises(SignatureInvalid, match="bad.pem"):
        load_public_key(tmp_path / "bad.pem")
