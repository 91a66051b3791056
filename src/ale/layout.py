"""The run folder: every file name a run writes, defined once.

The lifecycle writes these files, ``ale verify`` reads them back, reports and
the viewer find results and trajectories through them. A file name that appears
anywhere else as a literal is a bug.

    <run>/plan.json  result.json  events.jsonl  trajectory.json  trajectory.jsonl
          trajectory-files/  deliverables/  deliverables.json
          manifest.json  attestation.dsse.json  public_key.pem  task.log
          agent/{prompt.txt,command.json,stdout.log,stderr.log,mcp-config.json,
                 mcp-settings.json,confinement.json,llm-transcript.jsonl,
                 harness-transcript.json,harness-transcript/,
                 gateway/{records.jsonl,bodies/,turns.json}}
          evidence/{policy,harness,engine,input-staged,mounts,inspect-before,image,
                    probes-before.txt,input-after-start,workspace-empty,
                    reference-commit,agent,network,probes-after.txt,inspect-after,
                    input-after-run,reference-check,checks,phases}.json
          evidence/{vm-expectation,vm-before,vm-after}.json  vm-probes-{before,after}.txt  (a VM)
"""

from __future__ import annotations

import os
from pathlib import Path

# -- top level -------------------------------------------------------------------
PLAN = "plan.json"
RESULT = "result.json"
RESULT_TMP = "result.json.tmp"  # the result being written; renamed to result.json when whole
EVENTS = "events.jsonl"
TRAJECTORY = "trajectory.json"
TRAJECTORY_LOG = "trajectory.jsonl"
TRAJECTORY_FILES = "trajectory-files"
DELIVERABLES_DIR = "deliverables"
DELIVERABLES = "deliverables.json"
MANIFEST = "manifest.json"
ATTESTATION = "attestation.dsse.json"
PUBLIC_KEY = "public_key.pem"
TASK_LOG = "task.log"  # what the task process printed (only when it printed anything)
EVIDENCE_DIR = "evidence"
AGENT_DIR = "agent"  # what the agent's side wrote on the controller (outside the sandbox)
GATEWAY_DIR = f"{AGENT_DIR}/gateway"  # the model gateway's record of the agent's model calls
START_DIR = "start"  # what the task's start() wrote, kept for a regrade (ale.runs.start_writes)
START_PUBLIC = f"{START_DIR}/public"  # ... into the public package (evidence/start-writes.json lists it)
START_REFERENCE = f"{START_DIR}/reference"  # ... into the reference (evidence/reference-check.json's kept)
# A resumed run: the interrupted run's gateway record it replays (a run folder's shape below it)
# and resume.json naming that run (ale.agents.gateway.resume).
RESUME_DIR = "resume"
RESUME_SOURCE = f"{RESUME_DIR}/source"
RESUME_INFO = f"{RESUME_DIR}/resume.json"


class Agent:
    """File names inside ``agent/``."""

    PROMPT = "prompt.txt"  # the task prompt a command agent's harness reads
    COMMAND = "command.json"  # the harness's command line, folder and environment names
    STDOUT = "stdout.log"
    STDERR = "stderr.log"
    MCP_CONFIG = "mcp-config.json"  # the MCP bridge's address for the harness (its token redacted afterwards)
    MCP_SETTINGS = "mcp-settings.json"  # the same for Gemini CLI, in its settings format
    CONFINEMENT = "confinement.json"  # a confined harness's bubblewrap record
    LLM_TRANSCRIPT = "llm-transcript.jsonl"  # the built-in LLM agent's requests and answers
    # A native harness's own transcript, copied out of its HOME in the sandbox: written by the candidate.
    HARNESS_TRANSCRIPT = "harness-transcript"  # the files, by their path under the harness's HOME
    HARNESS_TRANSCRIPT_MANIFEST = "harness-transcript.json"  # each file's path, size, sha256; what was left out


class Gateway:
    """File names inside ``agent/gateway/``."""

    RECORDS = "records.jsonl"  # the hash-chained record of every model request
    BODIES = "bodies"  # request and answer bodies too big to inline
    TURNS = "turns.json"  # the model turns folded into trajectory.json


def agent_path(name: str) -> str:
    """The run-relative path of a file in ``agent/`` (``agent/<name>``)."""
    return f"{AGENT_DIR}/{name}"


def gateway_path(name: str) -> str:
    """The run-relative path of a file in ``agent/gateway/``."""
    return f"{GATEWAY_DIR}/{name}"


class Evidence:
    """File names inside ``evidence/``, in the order a run writes them."""

    POLICY = "policy.json"
    HARNESS = "harness.json"
    ENGINE = "engine.json"
    INPUT_STAGED = "input-staged.json"
    MOUNTS = "mounts.json"
    INSPECT_BEFORE = "inspect-before.json"
    IMAGE = "image.json"
    INPUT_AFTER_START = "input-after-start.json"
    START_WRITES = "start-writes.json"  # what start() added to the public package, kept under start/public/
    WORKSPACE_EMPTY = "workspace-empty.json"
    REFERENCE_COMMIT = "reference-commit.json"
    AGENT = "agent.json"
    NETWORK = "network.json"
    INSPECT_AFTER = "inspect-after.json"
    INPUT_AFTER_RUN = "input-after-run.json"
    REFERENCE_CHECK = "reference-check.json"
    TASK_PROCESS = "task-process.json"
    CHECKS = "checks.json"
    PHASES = "phases.json"
    CONTROLLER = "controller.json"  # the model gateway's summary and the harness's confinement
    ENVIRONMENT = "environment.json"  # the run's software: its image, each need and origin, what it holds
    STOP = "stop.json"  # the end of the turn: the host-side stop (method, kills, time), its bound, the probes' uid
    SANDBOX_STOPPED = "sandbox-stopped.json"  # the sandbox stopped during the agent's turn: why, its state
    GRADING_ATTEMPTS = "grading-attempts.json"  # each evaluate() attempt: times, scores or error
    DESKTOP = "desktop.json"  # a desktop task's desktop: its spec, image, tool resolution, start
    CUA = "cua.json"  # a cua-compatible image's computer-server: its start, tunnel, rights beside the candidate's
    # a desktop run's screen after start() and at the end of the agent's turn (the PNGs beside)
    SCREENS = "screens.json"

    @staticmethod
    def screen(moment: str) -> str:
        """``screen-after-start.png`` / ``screen-end-of-turn.png``: the whole screen, as the desktop captured it."""
        return f"screen-{moment.replace('_', '-')}.png"

    @staticmethod
    def probes(phase: str) -> str:
        """``probes-before.txt`` / ``probes-after.txt``: raw probe output."""
        return f"probes-{phase}.txt"

    @staticmethod
    def vm_probes(phase: str) -> str:
        """``vm-probes-before.txt`` / ``vm-probes-after.txt``: the probes' raw output in a VM's guest."""
        return f"vm-probes-{phase}.txt"

    # A VM run (`--provider qemu`, judged by ale.isolation.vm_rules): what the run planned for
    # its VM, and what QEMU reported of it before and after the agent (capture_vm).
    VM_EXPECTATION = "vm-expectation.json"
    VM_BEFORE = "vm-before.json"
    VM_AFTER = "vm-after.json"


def evidence_path(name: str) -> str:
    """The run-relative path of an evidence file (``evidence/<name>``)."""
    return f"{EVIDENCE_DIR}/{name}"


# -- an experiment's output folder -------------------------------------------------
REPORT_JSON = "report.json"  # `ale exp report`'s report, as JSON
REPORT_HTML = "report.html"  # and as one self-contained HTML page
EXPERIMENT_RECORD = "experiment.json"  # the experiment, its content hash, its history
UNITS = "units.json"  # unit id -> task, variant, agent, repeat
RUNS_INDEX = "index.sqlite"  # a cache over the run folders (ale.runs.store)
RUNS_DIR = "runs"
INCOMPLETE_DIR = ".incomplete"  # run folders a crash left without result.json
LOCK = ".lock"
NODES = "nodes.json"  # a cluster experiment: each node's public key (ale verify --trusted-keys)
SUPERSEDED_DIR = "superseded"  # a cluster's late results of attempts already declared lost
INCOMING_DIR = ".incoming"  # under runs/: run folders shipped back, until checked
# under runs/: each run's scratch (its staged package, workspace, private reference), removed at its end
SCRATCH_DIR = ".scratch"
PROBES_DIR = ".probes"  # under runs/: ``ale task check``'s grading probes' folders; never run folders


def scratch_dir(runs_dir: str | os.PathLike[str], run_id: str) -> Path:
    """The scratch folder of run ``run_id`` (absolute: its sub-folders are bind-mount sources)."""
    return Path(runs_dir).resolve() / SCRATCH_DIR / run_id
