"""The one directory set-up of every kind: its state, its record, its folders."""

from __future__ import annotations

import os
from pathlib import Path

from ale import layout
from ale.phases import RunKind
from ale.record import evidence as ev
from ale.runs.extensions import make_extension
from ale.runs.state import LiveHandles, Prepared, RunFolder, RunRecord, RunState
from ale.sandbox.scratch import mount_workspace_tmpfs


def new_state(prep: Prepared, folder: RunFolder, record_dir: Path, *, kind: RunKind = RunKind.RUN,
              durable: bool = True) -> RunState:
    """The state of one run-like thing of ``kind``: ``folder`` its paths, its record
    (events, evidence) written in ``record_dir`` (fsynced when ``durable``)."""
    record = RunRecord(events=ev.EventLog(record_dir / layout.EVENTS, durable=durable),
                       store=ev.EvidenceStore(record_dir, durable=durable))
    return RunState(prep, folder, record, LiveHandles(), make_extension(prep), kind)


def make_dirs(state: RunState) -> None:
    """The one directory set-up: the scratch (private), the public package, the
    workspace, the private reference folders. A run's workspace is made the
    candidate's (or a capped tmpfs); a grading probe's and a regrade's are the harness's."""
    state.folder.scratch.mkdir(parents=True, mode=0o700)
    os.chmod(state.folder.scratch, 0o700)
    state.folder.public_host.mkdir(mode=0o755)
    if state.folder.input_host != state.folder.public_host:
        state.folder.input_host.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    state.folder.workspace_host.mkdir(mode=0o755)
    if state.kind is RunKind.RUN:
        policy, cap = state.plan.policy, state.plan.limits.workspace_max_bytes
        if cap is not None and os.geteuid() == 0:  # a hard cap; otherwise the watchdog's
            mount_workspace_tmpfs(state.folder.workspace_host, max_bytes=cap, uid=policy.uid, gid=policy.gid)
        else:
            try:
                os.chown(state.folder.workspace_host, policy.uid, policy.gid)
            except PermissionError:
                os.chmod(state.folder.workspace_host, 0o777)
    state.folder.private.mkdir(mode=0o700)
    state.folder.setup_reference_host.mkdir(mode=0o700)
