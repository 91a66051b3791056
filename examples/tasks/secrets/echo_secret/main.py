"""Example task ``secrets/echo_secret``: copy a per-run random secret.

Done the ALE way (``demo/readfile_secret``): ``load()`` draws a fresh token,
which the harness calls once per run; ``start()`` writes it into the input and
the expected value into the private reference store. A score of 1.0 proves the
agent really read the file it was given: the token exists nowhere else the agent
can reach and is never in the prompt.
"""

from __future__ import annotations

import secrets

import cua_bench as cb

INPUT_DIR = "/input"
OUTPUT_DIR = "/workspace"
REFERENCE_DIR = "/reference"


def _description(meta: dict) -> str:
    src = f"{meta['input_dir']}/secret.txt"
    dst = f"{meta['remote_output_dir']}/secret.txt"
    return (
        f"The file {src} (read-only) holds one secret token on a single line. "
        f"Write exactly that token to {dst} (a trailing newline is fine, nothing else). "
        "The token is random and appears nowhere else: you must read it from the file."
    )


@cb.tasks_config(split="train")
def load():
    meta = {
        "input_dir": INPUT_DIR,
        "remote_output_dir": OUTPUT_DIR,
        "reference_dir": REFERENCE_DIR,
        "variant": "base",
        "secret": f"ALE-SECRET-{secrets.token_hex(16)}",
    }
    return [
        cb.Task(description=_description(meta), task_id="secrets/echo_secret/base", metadata=meta)
    ]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    meta = task_cfg.metadata
    token = meta["secret"]
    await session.write_file(f"{meta['input_dir']}/secret.txt", token + "\n")
    await session.write_file(f"{meta['reference_dir']}/expected.txt", token + "\n")


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    meta = task_cfg.metadata
    # The reference start() wrote is the truth; if it is gone the grader is broken: raise.
    expected = (await session.read_file(f"{meta['reference_dir']}/expected.txt")).strip()
    if not expected:
        raise ValueError("the reference expected.txt is empty")
    answer_path = f"{meta['remote_output_dir']}/secret.txt"
    if not await session.file_exists(answer_path):
        return [0.0]
    try:
        answer = (await session.read_file(answer_path)).strip()
    except OSError:
        return [0.0]
    return [1.0 if answer == expected else 0.0]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    meta = task_cfg.metadata
    token = (await session.read_file(f"{meta['input_dir']}/secret.txt")).strip()
    await session.write_file(f"{meta['remote_output_dir']}/secret.txt", token + "\n")
