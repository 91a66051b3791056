"""Ed25519 signatures over a run's evidence: an in-toto Statement in a DSSE envelope.

The envelope follows the DSSE spec (https://github.com/secure-systems-lab/dsse):
the signature covers the pre-authentication encoding (PAE) of the payload type
and the payload bytes, never the JSON around them, so re-serialising the
envelope cannot change what was signed.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ale.paths import config_dir

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
KEY_FILE_NAME = "signing_key.pem"


class SigningError(ValueError):
    """A key cannot be loaded or created, or an envelope cannot be made."""


class SignatureInvalid(ValueError):
    """An envelope is malformed or its signature does not verify with the given key."""


def canonical_json(obj: Any) -> bytes:
    """The one byte form of a JSON document that is hashed or signed (sorted keys, no spaces)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def default_key_path() -> Path:
    return config_dir() / KEY_FILE_NAME


def load_or_create_signing_key(path: Path | None) -> Ed25519PrivateKey:
    """The operator's signing key; None means ``config_dir()/signing_key.pem``.

    A missing key file is created (mode 0600, its folder 0700). An existing one
    must be an unencrypted PEM Ed25519 private key readable by its owner only.
    """
    key_path = Path(path) if path is not None else default_key_path()
    if not key_path.exists():
        _create_key_file(key_path)
    return _load_private_key(key_path)


def _create_key_file(key_path: Path) -> None:
    parent = key_path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o700)
        os.chmod(parent, 0o700)  # mkdir's mode is narrowed by the umask, not widened
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Written in full under a temporary name, then linked into place: a concurrent
    # run either creates the key or finds a complete one, never half a file.
    tmp = parent / f".{key_path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, key_path)
    except FileExistsError:
        pass
    except OSError as e:
        raise SigningError(f"cannot create signing key {key_path}: {e.strerror or e}") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _load_private_key(key_path: Path) -> Ed25519PrivateKey:
    try:
        st = os.stat(key_path)
        data = key_path.read_bytes()
    except OSError as e:
        raise SigningError(f"cannot read signing key {key_path}: {e.strerror or e}") from e
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SigningError(
            f"signing key {key_path} is accessible to other users (mode {oct(stat.S_IMODE(st.st_mode))}); "
            f"run `chmod 600 {key_path}`"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise SigningError(f"signing key {key_path} is not an unencrypted PEM private key: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"signing key {key_path} is a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (a private key file gives its public half)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SignatureInvalid(f"cannot read public key {path}: {e.strerror or e}") from e
    try:
        key: Any = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError) as e:
            raise SignatureInvalid(f"{path} holds no PEM public key: {e}") from e
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureInvalid(f"public key {path} is a {type(key).__name__}, not an Ed25519 key")
    return key


def _public(key: Ed25519PrivateKey | Ed25519PublicKey) -> Ed25519PublicKey:
    return key.public_key() if isinstance(key, Ed25519PrivateKey) else key


def public_key_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    return _public(key).public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_key_sha256(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The key's id: sha256 of its 32 raw public bytes (also the DSSE ``keyid``)."""
    raw = _public(key).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def dsse_pae(payload_type: str, payload: bytes) -> bytes:
    """DSSEv1 pre-authentication encoding: the exact bytes a signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sign_envelope(statement: dict, key: Ed25519PrivateKey) -> dict:
    """A DSSE envelope whose payload is ``statement`` as canonical JSON."""
    if statement.get("_type") != STATEMENT_TYPE:
        raise SigningError(f"statement _type must be {STATEMENT_TYPE!r}, got {statement.get('_type')!r}")
    payload = canonical_json(statement)
    sig = key.sign(dsse_pae(PAYLOAD_TYPE, payload))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": public_key_sha256(key), "sig": base64.b64encode(sig).decode()}],
    }


def decode_envelope(envelope: Any) -> dict:
    """The statement inside an envelope, WITHOUT checking any signature.

    For reporting what a tampered envelope claims; trust only ``verify_envelope``.
    """
    if not isinstance(envelope, dict):
        raise SignatureInvalid(f"envelope must be a JSON object, got {type(envelope).__name__}")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise SignatureInvalid(f"envelope payloadType is {envelope.get('payloadType')!r}, expected {PAYLOAD_TYPE!r}")
    payload = _b64(envelope.get("payload"), "payload")
    try:
        statement = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SignatureInvalid(f"envelope payload is not JSON: {e}") from e
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise SignatureInvalid(f"envelope payload is not an in-toto Statement v1 (_type {STATEMENT_TYPE!r})")
    return statement


def verify_envelope(envelope: Any, public_key: Ed25519PublicKey) -> dict:
    """The statement, if one of the envelope's signatures verifies with ``public_key``.

    Raises SignatureInvalid saying what is wrong (shape, encoding, or no signature
    made by this key).
    """
    statement = decode_envelope(envelope)
    payload = _b64(envelope["payload"], "payload")
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise SignatureInvalid("envelope carries no signatures")
    pae = dsse_pae(PAYLOAD_TYPE, payload)
    want = public_key_sha256(public_key)
    keyids = []
    for i, entry in enumerate(sigs):
        if not isinstance(entry, dict):
            raise SignatureInvalid(f"signatures[{i}] is not an object")
        keyids.append(entry.get("keyid"))
        sig = _b64(entry.get("sig"), f"signatures[{i}].sig")
        try:
            public_key.verify(sig, pae)
            return statement
        except InvalidSignature:
            continue
    raise SignatureInvalid(
        f"no signature verifies with public key sha256:{want[:16]}… "
        f"(envelope signed by keyid(s) {', '.join(str(k)[:16] + '…' for k in keyids)}): "
        "the statement was altered after signing, or it was signed by another key"
    )


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise SignatureInvalid(f"envelope {what} must be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise SignatureInvalid(f"envelope {what} is not valid base64: {e}") from e
