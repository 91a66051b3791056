"""`ale verify-vm`: judge a running QEMU someone else started, as `verify-container` judges a container.

It connects to the VM's QMP socket, takes the process answering it from the kernel
(SO_PEERCRED), hashes the base disk, captures the VM (`capture_vm`) and judges it against
a stored `VmExpectation` (the JSON of `evidence/vm-expectation.json`) at least as strict as
planned: fewer vCPUs or less memory pass and say so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ale.cli.output import fail


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_vm(qmp_path: str, expectation: Any, *, timeout: float = 10.0) -> tuple[dict[str, Any], list[Any]]:
    """The capture of the VM at `qmp_path` and its checks (moment "running", fit "at_least")."""
    from ale.isolation.vm_rules import judge_vm_state
    from ale.sandbox.qemu.capture import capture_vm
    from ale.sandbox.qemu.qmp import QmpClient

    try:
        digest: str | None = _sha256(expectation.base_path)
    except OSError:
        digest = None  # the digest rule is then unknown, and says so
    with QmpClient(qmp_path, timeout=timeout).connect() as qmp:
        capture = capture_vm(qmp, qmp.peer()["pid"], base_sha256=digest)
    return capture, judge_vm_state(capture, expectation, "running", fit="at_least")


def verify_vm_command(
    qmp: Annotated[Path, typer.Option("--qmp", help="The VM's QMP unix socket.")],
    expectation: Annotated[Path, typer.Option("--expectation", help="The planned VM (vm-expectation.json).")],
    save_capture: Annotated[Path | None, typer.Option("--save-capture", help="Write the raw capture here.")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Check a running QEMU VM against a planned one. Exit 0 sealed, 1 not, 2 unusable input."""
    from ale.isolation.checks import failures, violation_line
    from ale.isolation.registry import stricter_notes
    from ale.isolation.vm_rules import VmExpectation
    from ale.sandbox.base import SandboxError

    try:
        exp = VmExpectation.from_dict(json.loads(expectation.read_text()))
        capture, checks = verify_vm(str(qmp), exp)
    except (OSError, ValueError, SandboxError) as e:
        fail(str(e), 2)
    if save_capture is not None:
        save_capture.write_text(json.dumps(capture, indent=1, sort_keys=True) + "\n")
    bad = failures(checks)
    if json_out:
        typer.echo(json.dumps({"ok": not bad, "checks": [c.to_dict() for c in checks],
                               "violations": [violation_line("vm", c) for c in bad],
                               "stricter": stricter_notes(checks)}, indent=2, default=str))
    else:
        typer.echo(("SEALED" if not bad else "NOT SEALED") + f": {len(checks) - len(bad)}/{len(checks)} VM checks pass")
        for c in bad:
            typer.echo(f"  x {violation_line('vm', c)}")
        for line in stricter_notes(checks):
            typer.echo(f"  stricter than planned: {line}")
    raise typer.Exit(1 if bad else 0)
