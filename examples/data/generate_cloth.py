"""Generate the data of the physics/cloth_sim example task.

Writes, under examples/data/tasks/physics/cloth_sim/base/:
  input/init.npy        initial particle positions, (8, 8, 3) float64
  input/params.json     simulation parameters
  reference/frames/frame_NNN.npy   the expected positions after each frame

The reference comes from the task's own simulate.py (the file its solve()
oracle runs inside the sandbox). Run from anywhere:
  python examples/data/generate_cloth.py
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VARIANT_DIR = HERE / "tasks" / "physics" / "cloth_sim" / "base"
SIMULATE = HERE.parent / "tasks" / "physics" / "cloth_sim" / "simulate.py"

ROWS, COLS, SPACING, SEED = 8, 8, 0.1, 20240611
PARAMS = {
    "dt": 0.002,
    "steps_per_frame": 10,
    "n_frames": 10,
    "mass": 0.05,
    "stiffness": 60.0,
    "damping": 0.02,
    "gravity": [0.0, 0.0, -9.81],
    "pinned": [[0, 0], [0, COLS - 1]],
}


def initial_state() -> np.ndarray:
    """A flat horizontal sheet with a small fixed ripple, so it is not symmetric."""
    i, j = np.meshgrid(np.arange(ROWS), np.arange(COLS), indexing="ij")
    x = np.stack([j * SPACING, i * SPACING, np.zeros((ROWS, COLS))], axis=-1).astype(np.float64)
    rng = np.random.default_rng(SEED)
    x[..., 2] += rng.normal(0.0, 0.005, size=(ROWS, COLS))
    return x


def load_simulate():
    spec = importlib.util.spec_from_file_location("cloth_simulate", SIMULATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    input_dir = VARIANT_DIR / "input"
    frames_dir = VARIANT_DIR / "reference" / "frames"
    input_dir.mkdir(parents=True, exist_ok=True)
    if frames_dir.exists():
        shutil.rmtree(frames_dir)
    frames_dir.mkdir(parents=True)
    x0 = initial_state()
    np.save(input_dir / "init.npy", x0)
    (input_dir / "params.json").write_text(json.dumps(PARAMS, indent=2) + "\n")
    sim = load_simulate()
    frames = sim.simulate(x0, PARAMS)
    for n, frame in enumerate(frames):
        np.save(frames_dir / f"frame_{n:03d}.npy", frame)
    drop = float(x0[..., 2].mean() - frames[-1][..., 2].mean())
    print(f"wrote {len(frames)} frames to {frames_dir} (mean drop {drop:.4f})")


if __name__ == "__main__":
    main()
