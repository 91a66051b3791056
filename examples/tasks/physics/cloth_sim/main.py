"""Example task ``physics/cloth_sim``: step a small mass-spring cloth through time.

The input holds the initial particle grid (``init.npy``) and the parameters
(``params.json``); the agent writes one ``.npy`` file per frame. The grader
compares each frame with the hidden reference frames within an absolute
tolerance and scores each frame 1.0 or 0.0. It only returns scores: no
per-frame error is written anywhere. The oracle runs ``simulate.py`` (this
folder) inside the sandbox; ``examples/data/generate_cloth.py`` made the
reference with the same file.
"""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import cua_bench as cb
import numpy as np

INPUT_DIR = "/input"
OUTPUT_DIR = "/workspace"
REFERENCE_DIR = "/reference"
N_FRAMES = 10
ATOL = 1e-4
SIMULATE = Path(__file__).resolve().parent / "simulate.py"


def _description(meta: dict) -> str:
    i, o = meta["input_dir"], meta["remote_output_dir"]
    return (
        "Simulate a small piece of cloth falling under gravity while hanging from two pinned corners.\n\n"
        "Inputs (read-only):\n"
        f"- {i}/init.npy: a float64 numpy array of shape (8, 8, 3), the initial position (x, y, z) "
        "of each particle of an 8x8 grid, indexed [row, col].\n"
        f"- {i}/params.json: dt, steps_per_frame, n_frames, mass, stiffness, damping, "
        "gravity (a 3-vector) and pinned (a list of [row, col]).\n\n"
        "Model: every particle has mass `mass` and starts at rest (velocity 0). Springs join each "
        "particle (r, c) to (r, c+1) and (r+1, c) (structural) and to (r+1, c+1) and (r+1, c-1) "
        "(shear), wherever both ends exist. Each spring's rest length is its length in init.npy. "
        "For a spring from particle a to particle b, with d = x_b - x_a and L = |d|, the force on a "
        "is stiffness * (L - rest) / L * d and the force on b is its opposite.\n"
        "One time step (semi-implicit Euler, all particles at once): F = mass * gravity + the "
        "spring forces at the current positions; v = (1 - damping) * (v + dt * F / mass); "
        "v = 0 for every pinned particle; x = x + dt * v.\n\n"
        f"Output: write n_frames files {o}/frames/frame_000.npy, {o}/frames/frame_001.npy, ... "
        f"(three-digit numbers). frame_NNN.npy holds the positions after (NNN + 1) * steps_per_frame "
        "steps, as a float64 array of shape (8, 8, 3) saved with numpy.save. python3 with numpy is "
        f"available. Each frame is compared with a hidden reference within an absolute tolerance of {ATOL:g}."
    )


@cb.tasks_config(split="train")
def load():
    meta = {
        "input_dir": INPUT_DIR,
        "remote_output_dir": OUTPUT_DIR,
        "reference_dir": REFERENCE_DIR,
        "variant": "base",
        "n_frames": N_FRAMES,
        "atol": ATOL,
    }
    return [
        cb.Task(description=_description(meta), task_id="physics/cloth_sim/base", metadata=meta)
    ]


def _load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _frame_matches(candidate: bytes, expected: np.ndarray, atol: float) -> bool:
    try:
        got = _load_npy(candidate)
    except Exception:
        return False
    if got.shape != expected.shape or got.dtype.kind not in "fiu":
        return False
    got = got.astype(np.float64)
    return bool(np.isfinite(got).all() and np.allclose(got, expected, rtol=0.0, atol=atol))


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    meta = task_cfg.metadata
    n_frames, atol = int(meta["n_frames"]), float(meta["atol"])
    ref_dir = f"{meta['reference_dir']}/frames"
    out_dir = f"{meta['remote_output_dir']}/frames"
    scores: list[float] = []
    for n in range(n_frames):
        name = f"frame_{n:03d}.npy"
        # A missing or unreadable reference frame is a broken grader, never a 0: let it raise.
        expected = _load_npy(await session.read_bytes(f"{ref_dir}/{name}"))
        path = f"{out_dir}/{name}"
        if not await session.file_exists(path):
            scores.append(0.0)
            continue
        try:
            candidate = await session.read_bytes(path)
        except OSError:
            scores.append(0.0)
            continue
        scores.append(1.0 if _frame_matches(candidate, expected, atol) else 0.0)
    return scores


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    meta = task_cfg.metadata
    script = SIMULATE.read_text()
    frames = f"{meta['remote_output_dir']}/frames"
    command = (
        f"python3 - {shlex.quote(meta['input_dir'])} {shlex.quote(frames)} <<'ALE_CLOTH_SIMULATE'\n"
        f"{script}\nALE_CLOTH_SIMULATE\n"
    )
    result = await session.run_command(command, timeout=300, check=False)
    if result["return_code"] != 0:
        raise RuntimeError(
            f"the cloth simulation failed (exit {result['return_code']}): {result['stderr'][-2000:]}"
        )
