"""A set of trusted signing keys (a cluster's node keys) and the one that signed a run.

``ale verify RUN --trusted-keys FILE`` accepts a run signed by any key of the set:
``FILE`` is an experiment's ``nodes.json`` (each node's ``public_key_pem``), a PEM
file holding one or more public keys, or a folder of ``*.pem`` files. The key is
chosen by the envelope's ``keyid`` (sha256 of the raw public key); the signature
itself is then verified with that key as with ``--public-key``. A run whose
signer is not in the set is checked against the set's first key, and fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from ale import layout
from ale.record.signing import SignatureInvalid, public_key_sha256

_PEM_RE = re.compile(rb"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", re.S)


def load_trusted_keys(path: Path) -> dict[str, bytes]:
    """sha256 key id -> PEM, from a nodes.json, a PEM bundle or a folder of PEMs."""
    pems: list[bytes] = []
    if path.is_dir():
        for p in sorted(path.glob("*.pem")):
            pems += _PEM_RE.findall(p.read_bytes())
    else:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise SignatureInvalid(f"cannot read trusted keys {path}: {e.strerror or e}") from e
        if path.suffix == ".json":
            try:
                nodes = json.loads(data).get("nodes", {})
                pems = [n["public_key_pem"].encode() for n in nodes.values() if n.get("public_key_pem")]
            except (ValueError, AttributeError, KeyError) as e:
                raise SignatureInvalid(f"{path} is not a nodes.json with public keys: {e}") from e
        else:
            pems = _PEM_RE.findall(data)
    keys: dict[str, bytes] = {}
    for pem in pems:
        try:
            key = serialization.load_pem_public_key(pem)
            keys[public_key_sha256(key)] = pem  # type: ignore[arg-type]
        except (ValueError, TypeError) as e:
            raise SignatureInvalid(f"{path} holds a key that is not an Ed25519 public key: {e}") from e
    if not keys:
        raise SignatureInvalid(f"{path} holds no public key")
    return keys


def signer_key(run_dir: Path, trusted: dict[str, bytes]) -> bytes:
    """The trusted PEM whose id the run's envelope names (else the set's first)."""
    try:
        envelope = json.loads((run_dir / layout.ATTESTATION).read_text())
        ids = [s.get("keyid") for s in envelope.get("signatures", []) if isinstance(s, dict)]
    except (OSError, ValueError, AttributeError):
        ids = []
    for kid in ids:
        if kid in trusted:
            return trusted[kid]
    return next(iter(trusted.values()))
