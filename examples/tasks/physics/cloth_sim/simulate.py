"""Reference cloth simulation for the physics/cloth_sim task (numpy only).

Usage: python3 simulate.py INPUT_DIR FRAMES_DIR

Reads INPUT_DIR/init.npy (particle positions, shape (rows, cols, 3), float64)
and INPUT_DIR/params.json; writes FRAMES_DIR/frame_000.npy ... one per frame.
The task's solve() runs this very file inside the sandbox, and
examples/data/generate_cloth.py runs it to make the hidden reference, so the
oracle and the reference cannot drift apart.
"""

import json
import os
import sys

import numpy as np

# (row offset, col offset) of each spring family: structural then shear.
SPRING_OFFSETS = ((0, 1), (1, 0), (1, 1), (1, -1))


def _pairs(rows, cols, di, dj):
    """Slices selecting the two ends (a, b) of every spring with offset (di, dj)."""
    a_rows = slice(0, rows - di)
    b_rows = slice(di, rows)
    if dj >= 0:
        a_cols, b_cols = slice(0, cols - dj), slice(dj, cols)
    else:
        a_cols, b_cols = slice(-dj, cols), slice(0, cols + dj)
    return (a_rows, a_cols), (b_rows, b_cols)


def simulate(x0, params):
    """Return the list of frames (each a copy of the positions)."""
    x = np.array(x0, dtype=np.float64)
    rows, cols, _ = x.shape
    v = np.zeros_like(x)
    dt = float(params["dt"])
    mass = float(params["mass"])
    k = float(params["stiffness"])
    damping = float(params["damping"])
    gravity = np.array(params["gravity"], dtype=np.float64)
    pinned = [tuple(p) for p in params["pinned"]]

    springs = []
    for di, dj in SPRING_OFFSETS:
        a, b = _pairs(rows, cols, di, dj)
        rest = np.sqrt(((x[b] - x[a]) ** 2).sum(axis=-1))
        springs.append((a, b, rest))

    frames = []
    for _frame in range(int(params["n_frames"])):
        for _step in range(int(params["steps_per_frame"])):
            f = np.empty_like(x)
            f[...] = mass * gravity
            for a, b, rest in springs:
                d = x[b] - x[a]
                length = np.sqrt((d**2).sum(axis=-1))
                fs = (k * (length - rest) / length)[..., None] * d
                f[a] += fs
                f[b] -= fs
            v = (1.0 - damping) * (v + dt * f / mass)
            for i, j in pinned:
                v[i, j] = 0.0
            x = x + dt * v
        frames.append(x.copy())
    return frames


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: simulate.py INPUT_DIR FRAMES_DIR\n")
        return 2
    in_dir, out_dir = argv[1], argv[2]
    x0 = np.load(os.path.join(in_dir, "init.npy"), allow_pickle=False)
    with open(os.path.join(in_dir, "params.json")) as fh:
        params = json.load(fh)
    os.makedirs(out_dir, exist_ok=True)
    for n, frame in enumerate(simulate(x0, params)):
        np.save(os.path.join(out_dir, f"frame_{n:03d}.npy"), frame)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
