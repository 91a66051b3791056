"""Task trees in ALE's shapes, written by us (never ALE's code or data).

``make_tree(root)`` writes ``root/tasks/`` as ALE lays it out:

- ``tasks/`` is a PEP 420 namespace package (no ``__init__.py``); domain folders
  are regular packages; ``tasks/linux_runtime.py`` holds a ``LinuxTaskConfig``
  dataclass whose paths are properties over ``REMOTE_ROOT_DIR`` (read from the
  environment at import), ``DOMAIN_NAME``, ``TASK_NAME``, ``VARIANT_NAME``;
  ``tasks/common_config.py`` checks ``REMOTE_OUTPUT_DIR`` against an allow-list;
  ``tasks/common_setup.py`` is the shared no-op setup;
- ``tasks/lab/_shared/helpers.py`` is a shared helper module;
- ``tasks/lab/alpha`` and ``tasks/lab/beta`` each put their own ``scripts/`` on
  ``sys.path`` and ``import score_outputs``: twins that grade differently, so a
  task handed the other's module cannot score as its own would (alpha's takes
  ``(got, want)``, beta's one verdict and refuses anything but PASS/FAIL);
- ``beta`` imports ``tasks.lab.beta.scripts.verify`` lazily inside ``evaluate``,
  ships ``scripts/verify.py`` into the grading sandbox under
  ``/tmp/agenthle_eval/<task>`` (made with ``session.interface.create_dir``) and
  runs it with ``python``;
- ``alpha``'s prompt sends the agent to a wrapper in ``<task_dir>/software/``.

``make_data(root)`` writes ALE's data layout (no ``tasks/`` level):
``<root>/lab/<task>/base/{input,software,reference}``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

LINUX_RUNTIME = '''
import os
from dataclasses import dataclass

from tasks.common_config import GeneralTaskConfig


@dataclass
class LinuxTaskConfig(GeneralTaskConfig):
    REMOTE_ROOT_DIR: str = os.environ.get("REMOTE_ROOT_DIR", "/media/user/data/agenthle")
    DOMAIN_NAME: str = ""
    OS_TYPE: str = "linux"
    VARIANT_NAME: str = "base"

    @property
    def task_dir(self) -> str:
        return f"{self.REMOTE_ROOT_DIR}/{self.DOMAIN_NAME}/{self.TASK_NAME}/{self.VARIANT_NAME}"

    @property
    def input_dir(self) -> str:
        return f"{self.task_dir}/input"

    @property
    def software_dir(self) -> str:
        return f"{self.task_dir}/software"

    @property
    def reference_dir(self) -> str:
        return f"{self.task_dir}/reference"

    @property
    def remote_output_dir(self) -> str:
        return f"{self.task_dir}/{self.REMOTE_OUTPUT_DIR}"
'''

COMMON_CONFIG = '''
import os
from dataclasses import dataclass

ALLOWED_OUTPUT_DIRS = {"output", "output_test_pos", "output_test_neg"}


@dataclass
class GeneralTaskConfig:
    TASK_NAME: str = ""
    REMOTE_OUTPUT_DIR: str = os.environ.get("REMOTE_OUTPUT_DIR", "output")
    REQUIRES_TASK_DATA: bool = True

    def __post_init__(self):
        if self.REMOTE_OUTPUT_DIR not in ALLOWED_OUTPUT_DIRS:
            raise ValueError(f"REMOTE_OUTPUT_DIR={self.REMOTE_OUTPUT_DIR!r} is not allowed")

    def to_metadata(self) -> dict:
        return {
            "domain_name": self.DOMAIN_NAME,
            "task_name": self.TASK_NAME,
            "variant_name": self.VARIANT_NAME,
            "task_dir": self.task_dir,
            "input_dir": self.input_dir,
            "software_dir": self.software_dir,
            "remote_output_dir": self.remote_output_dir,
            "reference_dir": self.reference_dir,
            "requires_task_data": self.REQUIRES_TASK_DATA,
        }
'''

COMMON_SETUP = '''
async def run_common_setup(cfg, session):
    return None
'''

HELPERS = '''
def normalise(text: str) -> str:
    return " ".join(text.split()).lower()
'''

TASK = '''
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import cua_bench as cb

from tasks.common_setup import run_common_setup
from tasks.lab._shared.helpers import normalise
from tasks.linux_runtime import LinuxTaskConfig

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import score_outputs  # noqa: E402  (the twin of every other task's)

SEEN = {{}}


@dataclass
class Config(LinuxTaskConfig):
    DOMAIN_NAME: str = "lab"
    TASK_NAME: str = "{name}"


@cb.tasks_config
def load():
    cfg = Config()
    return [cb.Task(description={prompt!r}, metadata=cfg.to_metadata(),
                    computer={{"provider": "docker", "setup_config": {{"os_type": "linux"}}}})]


@cb.setup_task
async def start(task_cfg, session):
    SEEN["started"] = True
    SEEN["env_at_start"] = sorted(k for k in os.environ if "KEY" in k or "SECRET" in k)
    await run_common_setup(task_cfg, session)


@cb.solve_task
async def solve(task_cfg, session):
    m = task_cfg.metadata
    {solve}


@cb.evaluate_task
async def evaluate(task_cfg, session):
    m = task_cfg.metadata
    {evaluate}
'''

ALPHA_SOLVE = 'await session.run_command(f"{m[\'software_dir\']}/bin/answer.sh > {m[\'remote_output_dir\']}/answer.txt")'
ALPHA_EVALUATE = '''path = f"{m['remote_output_dir']}/answer.txt"
    if not await session.file_exists(path):
        return [0.0]
    got = normalise(await session.read_file(path))
    want = normalise(await session.read_file(f"{m['reference_dir']}/expected.txt"))
    return [score_outputs.score(got, want)]'''

BETA_SOLVE = '''q = await session.read_file(f"{m['input_dir']}/question.txt")
    await session.write_file(f"{m['remote_output_dir']}/answer.txt", q.strip()[::-1] + "\\n")'''
BETA_EVALUATE = '''from tasks.lab.beta.scripts import verify  # a lazy tasks.* import
    eval_dir = "/tmp/agenthle_eval/beta"
    await session.interface.create_dir(eval_dir)
    await session.write_file(f"{eval_dir}/verify.py", Path(verify.__file__).read_text())
    r = await session.run_command(
        f"python {eval_dir}/verify.py {m['remote_output_dir']}/answer.txt {m['reference_dir']}/expected.txt")
    if r["return_code"] not in (0, 1):
        raise RuntimeError(f"the verifier broke: {r}")
    return [score_outputs.score(r["stdout"].strip())]'''

SCORE_ALPHA = '''
def score(got: str, want: str) -> float:
    """alpha's grader: exact match."""
    return 1.0 if got == want else 0.0
'''
# Same module name, another grader: one argument (alpha's call fails on it), and
# no verdict but PASS or FAIL scores (alpha's answers would raise here).
SCORE_BETA = '''
def score(verdict: str) -> float:
    """beta's grader: the verifier's verdict."""
    return {"PASS": 1.0, "FAIL": 0.0}[verdict]
'''
VERIFY = '''
import os
import sys


def main() -> int:
    got = open(sys.argv[1]).read().strip() if os.path.isfile(sys.argv[1]) else ""
    want = open(sys.argv[2]).read().strip()
    print("PASS" if got == want else "FAIL")
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())
'''

CARD = '{{"taskId": "{name}", "vm": {{"snapshot": "cpu-free-ubuntu", "machineType": "c4-standard-4", "timeout": 600}}}}'


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def make_tree(root: Path, *, data_root: Path | None = None) -> Path:
    """Write the tree under ``root``; returns ``root/tasks``."""
    tasks = root / "tasks"
    write(tasks / "linux_runtime.py", LINUX_RUNTIME)
    write(tasks / "common_config.py", COMMON_CONFIG)
    write(tasks / "common_setup.py", COMMON_SETUP)
    write(tasks / "lab" / "__init__.py", "")
    write(tasks / "lab" / "_shared" / "__init__.py", "")
    write(tasks / "lab" / "_shared" / "helpers.py", HELPERS)
    specs = {
        "alpha": ("Run the tool in the task's software folder (software/bin/answer.sh) and save what it "
                  "prints to output/answer.txt in the task folder.", ALPHA_SOLVE, ALPHA_EVALUATE, SCORE_ALPHA),
        "beta": ("Read input/question.txt in the task folder and write it reversed to output/answer.txt.",
                 BETA_SOLVE, BETA_EVALUATE, SCORE_BETA),
    }
    for name, (prompt, solve, evaluate, scorer) in specs.items():
        d = tasks / "lab" / name
        write(d / "main.py", TASK.format(name=name, prompt=prompt, solve=solve, evaluate=evaluate))
        write(d / "scripts" / "__init__.py", "")
        write(d / "scripts" / "score_outputs.py", scorer)
        card = CARD.format(name=name)
        if data_root is not None:
            card = card[:-1] + f', "data_source": "local:{data_root}"}}'
        write(d / "task_card.json", card)
    write(tasks / "lab" / "beta" / "scripts" / "verify.py", VERIFY)
    return tasks


def make_data(root: Path) -> Path:
    """ALE's data layout for both tasks (no ``tasks/`` level); returns ``root``."""
    alpha = root / "lab" / "alpha" / "base"
    write(alpha / "input" / "readme.txt", "use the tool\n")
    tool = write(alpha / "software" / "bin" / "answer.sh", "#!/bin/sh\necho 'Forty Two'\n")
    tool.chmod(0o755)
    write(alpha / "reference" / "expected.txt", "forty two\n")
    beta = root / "lab" / "beta" / "base"
    write(beta / "input" / "question.txt", "stressed\n")
    write(beta / "reference" / "expected.txt", "desserts\n")
    return root
