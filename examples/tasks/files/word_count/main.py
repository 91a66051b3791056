"""Example task ``files/word_count``: count the words and lines of a text file.

Two variants (``essay``, ``poem``) share the code and differ by data. The agent
writes ``answer.json``; the grader compares each field with the hidden
``reference/answer.json`` and returns one score per field (words, lines).
"""

from __future__ import annotations

import json
import shlex

import cua_bench as cb

INPUT_DIR = "/input"
OUTPUT_DIR = "/workspace"
REFERENCE_DIR = "/reference"
FIELDS = ("words", "lines")
VARIANTS = ("essay", "poem")


def _description(meta: dict) -> str:
    doc = f"{meta['input_dir']}/document.txt"
    answer = f"{meta['remote_output_dir']}/answer.json"
    return (
        f"Count the words and the lines of the text file {doc} (read-only).\n"
        "- words: the number of maximal runs of non-whitespace characters (what `wc -w` counts);\n"
        "- lines: the number of newline characters in the file (what `wc -l` prints).\n"
        f"Write the result to {answer} as a JSON object with integer values, exactly of the form "
        '{"words": <int>, "lines": <int>}. Each field is scored separately.'
    )


@cb.tasks_config(split="train")
def load():
    tasks = []
    for variant in VARIANTS:
        meta = {
            "input_dir": INPUT_DIR,
            "remote_output_dir": OUTPUT_DIR,
            "reference_dir": REFERENCE_DIR,
            "variant": variant,
        }
        tasks.append(
            cb.Task(
                description=_description(meta), task_id=f"files/word_count/{variant}", metadata=meta
            )
        )
    return tasks


@cb.setup_task(split="train")
async def start(task_cfg, session):
    # The staged input must hold the document; failing here beats grading nonsense later.
    doc = f"{task_cfg.metadata['input_dir']}/document.txt"
    if not await session.file_exists(doc):
        raise FileNotFoundError(f"the staged input has no {doc}")


def _as_count(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session) -> list[float]:
    meta = task_cfg.metadata
    # The reference must be readable and complete: a broken reference raises, never scores 0.
    expected = json.loads(await session.read_file(f"{meta['reference_dir']}/answer.json"))
    missing = [f for f in FIELDS if _as_count(expected.get(f)) is None]
    if missing:
        raise ValueError(f"reference answer.json lacks integer fields {missing}")
    answer_path = f"{meta['remote_output_dir']}/answer.json"
    if not await session.file_exists(answer_path):
        return [0.0] * len(FIELDS)
    try:
        answer = json.loads(await session.read_file(answer_path))
    except (OSError, ValueError):
        return [0.0] * len(FIELDS)
    if not isinstance(answer, dict):
        return [0.0] * len(FIELDS)
    return [1.0 if _as_count(answer.get(f)) == _as_count(expected[f]) else 0.0 for f in FIELDS]


@cb.solve_task(split="train")
async def solve(task_cfg, session):
    meta = task_cfg.metadata
    doc = shlex.quote(f"{meta['input_dir']}/document.txt")
    words = await session.run_command(f"wc -w < {doc}", check=True)
    lines = await session.run_command(f"wc -l < {doc}", check=True)
    answer = {"words": int(words["stdout"].strip()), "lines": int(lines["stdout"].strip())}
    await session.write_file(f"{meta['remote_output_dir']}/answer.json", json.dumps(answer) + "\n")
