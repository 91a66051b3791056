"""What the code declares once stays declared once: each claim a module makes
("the only place they are spelled", "a literal anywhere else is a bug") is
checked over the whole of ``src/ale`` here, so a second spelling fails a test
instead of drifting from the first.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale import layout
from ale.status import InvalidAttribution, RunStatus

SRC = Path(__file__).resolve().parents[1] / "src" / "ale"

# KNOWN DEBT, TEMPORARY: files that still break a rule, each until its owner fixes
# it (issue 17); remove an entry as soon as its file is clean. Keep this empty.
KNOWN_DEBT: dict[str, set[str]] = {
}


def _sources(root: Path = SRC, *, skip: tuple[str, ...] = ()) -> Iterator[tuple[str, ast.Module]]:
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel not in skip:
            yield rel, ast.parse(p.read_text(), filename=str(p))


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _suffixes(tree: ast.Module) -> set[int]:
    """ids of the literals that end another string (``f"{key}.lock"``, ``name + ".tmp"``)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.update(id(b) for a, b in zip(node.values, node.values[1:], strict=False)
                       if isinstance(a, ast.FormattedValue) and isinstance(b, ast.Constant)
                       and str(b.value).startswith("."))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant):
            out.add(id(node.right))
    return out


def _strings(tree: ast.Module, *, suffixes: bool = True) -> Iterator[tuple[int, str, ast.AST | None]]:
    """(line, text, parent) of every string literal that is not a docstring; the
    literal parts of f-strings too; without ``suffixes``, not those that end
    another string."""
    skip = _docstrings(tree) | (set() if suffixes else _suffixes(tree))
    parents = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            parent = parents.get(id(node))
            yield node.lineno, node.value, parents.get(id(parent)) if isinstance(parent, ast.JoinedStr) else parent


def _debt(rule: str, hits: list[str]) -> list[str]:
    """The hits a known debt does not cover; a debt already paid fails (remove it)."""
    allowed = KNOWN_DEBT.get(rule, set())
    paid = sorted(f for f in allowed if not any(h.split(":", 1)[0] == f for h in hits))
    assert not paid, f"{paid} no longer break the {rule!r} rule: remove them from KNOWN_DEBT"
    return [h for h in hits if h.split(":", 1)[0] not in allowed]


# -- statuses: ale/status.py spells them -------------------------------------------
# "timeout" is also a tool argument, a command and an agent's end (AgentEnd): too
# common a word to find by its spelling; every other status and attribution is not.
STATUS_WORDS = {s.value for s in (*RunStatus, *InvalidAttribution)} - {RunStatus.TIMEOUT.value}


def test_statuses_are_spelled_only_in_status_py() -> None:
    hits = [f"{rel}:{line}: {text!r}" for rel, tree in _sources(skip=("status.py",))
            for line, text, _ in _strings(tree) if text in STATUS_WORDS]
    bad = _debt("statuses", hits)
    assert not bad, "status literals outside ale/status.py (use RunStatus / InvalidAttribution):\n" + "\n".join(bad)


# -- run-folder names: ale/layout.py defines them ------------------------------------
def _layout_names() -> dict[str, str]:
    """Every name layout.py defines -> where (``layout.RESULT``, ``layout.Evidence.AGENT``)."""
    names: dict[str, str] = {}
    for owner, prefix in ((layout, "layout"), (layout.Evidence, "layout.Evidence"),
                          (layout.Agent, "layout.Agent"), (layout.Gateway, "layout.Gateway")):
        for k, v in vars(owner).items():
            if k.isupper() and isinstance(v, str):
                names.setdefault(v, f"{prefix}.{k}")
    for phase in ("before", "after"):
        names[layout.Evidence.probes(phase)] = "layout.Evidence.probes"
    return names


# The same spelling for another thing than a run folder's file.
NOT_RUN_FOLDER = {
    ("data/sealing.py", "manifest.json"): "a sealed data variant's manifest (ale.data.sealing.MANIFEST_NAME)",
    ("runs/node.py", "runs"): "a node's staging folder for one run, shipped back afterwards",
}


def layout_literals(root: Path = SRC, skip: tuple[str, ...] = ("layout.py",)) -> list[str]:
    """``file:line: 'literal' (use layout.X)`` for every literal that spells a name of
    the run folder outside layout.py: a file name (``result.json``, also with a suffix
    such as ``result.json.tmp``) anywhere but as the end of another name (``f"{key}.lock"``), a folder name (``agent``, ``deliverables``)
    that starts a path (``"agent/…"``) or is joined to one (``run_dir / "agent"``).
    Text with spaces (a message) and URLs are not paths."""
    names = _layout_names()
    files = {n for n in names if any(c in n for c in "./-")}
    words = set(names) - files
    hits = []
    for rel, tree in _sources(root, skip=skip):
        for line, text, parent in _strings(tree, suffixes=False):
            if not text or "://" in text or any(c.isspace() for c in text):
                continue
            parts = [p for p in text.split("/") if p]
            found = [p for p in parts if p in files or any(p.startswith(f + ".") for f in files)]
            if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
                found += [p for p in parts if p in words]
            elif "/" in text and parts and parts[0] in words:
                found.append(parts[0])
            found = [f for f in found if (rel, f) not in NOT_RUN_FOLDER]
            if found:
                use = ", ".join(names.get(f, names.get(f.rpartition(".")[0], "layout")) for f in found)
                hits.append(f"{rel}:{line}: {text!r} (use {use})")
    return hits


def test_run_folder_names_are_spelled_only_in_layout_py() -> None:
    bad = _debt("layout", layout_literals())
    assert not bad, "run-folder names spelled outside ale/layout.py:\n" + "\n".join(bad)


def test_the_layout_rule_finds_what_it_must(tmp_path: Path) -> None:
    """The rule above, on literals it must catch and literals it must leave."""
    caught = ['tmp = run_dir / "result.json.tmp"', 'x = p / ".lock"', 'p = run / "agent"', 'f"evidence/{name}.json"',
              'x = "agent/gateway/turns.json"', 'prefix = "deliverables/"', 'store.write_json("desktop.json", {})']
    left = ['raise E(f"{p} is not result.json: bad")', 'x = f"{key}.lock"', 'y = str(t) + ".lock"', 'plan = {"agent": 1}', 'cfg.get("gateway", True)', 'Path("runs")']
    for i, code in enumerate(caught + left):
        (tmp_path / f"m{i}.py").write_text(code + "\n")
    hits = {h.split(":", 1)[0] for h in layout_literals(tmp_path)}
    assert hits == {f"m{i}.py" for i in range(len(caught))}, hits


# -- the score tolerance: ale.result.SCORE_EPSILON ------------------------------
# Small numbers that are not a tolerance on scores.
NOT_SCORE_TOLERANCE = {
    ("isolation/checks.py", 1e-6): "a container's CPU quota against the policy's",
    ("isolation/inspect_rules.py", 1e-6): "a container's CPU quota against the policy's",
    ("runs/progress.py", 1e-6): "a division guard for the elapsed time",
}


def test_the_score_tolerance_is_one_constant() -> None:
    """A tolerance is a small literal (below 1e-3) or a literal ``abs_tol``/``rel_tol``:
    on scores, each must be ``SCORE_EPSILON``, defined once in result.py."""
    hits = []
    for rel, tree in _sources():
        defining = {id(n.value) for n in ast.walk(tree) if rel == "result.py" and isinstance(n, ast.Assign)
                    and [ast.unparse(t) for t in n.targets] == ["SCORE_EPSILON"]}
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg in ("abs_tol", "rel_tol") and isinstance(node.value, ast.Constant):
                hits.append(f"{rel}:{node.value.lineno}: {node.arg}={node.value.value!r}")
            elif (isinstance(node, ast.Constant) and isinstance(node.value, float) and 0 < node.value < 1e-3
                  and id(node) not in defining and (rel, node.value) not in NOT_SCORE_TOLERANCE):
                hits.append(f"{rel}:{node.lineno}: {node.value!r}")
    bad = _debt("score tolerance", sorted(set(hits)))
    assert not bad, "tolerances outside ale.result.SCORE_EPSILON:\n" + "\n".join(bad)


# -- secret names: ale.redaction.is_secret_name ---------------------------------------
# What only a rule for secret names spells: a credential family's prefix or pattern
# (``"AWS_"``, ``"CLOUDSDK_*"``), a name no code reads (``KUBECONFIG``,
# ``SSH_AUTH_SOCK``), a regular expression of secret-sounding words. Reading one
# variable (``os.environ.get("AWS_ENDPOINT_URL")``) is not a rule.
_FAMILY = re.compile(r"(AWS|AZURE|GCP|GCLOUD|GOOGLE|CLOUDSDK|ARM_CLIENT|HF|HUGGING\w*|DOCKER)_?\*?")


def _rule_like(text: str) -> bool:
    return (text in ("KUBECONFIG", "SSH_AUTH_SOCK") or _FAMILY.fullmatch(text) is not None
            or ("|" in text and re.search("token", text, re.I) is not None and re.search("secret", text, re.I) is not None))
NAMES = ("CLOUDSDK_CONFIG", "KUBECONFIG", "SSH_AUTH_SOCK", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "HF_TOKEN",
         "HUGGING_FACE_HUB_TOKEN", "DOCKER_HOST", "ALE_JUDGE_OPENAI_API_KEY", "ALE_SIGNING_KEY",
         "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CLIENT_SECRET", "OPENAI_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD",
         "SESSION_COOKIE", "PATH", "HOME", "LANG", "AUTHOR", "EDITOR")


def test_secret_names_are_spelled_only_in_redaction_py() -> None:
    hits = [f"{rel}:{line}: {text!r}" for rel, tree in _sources(skip=("redaction.py",))
            for line, text, _ in _strings(tree) if _rule_like(text)]
    bad = _debt("secret names", hits)
    assert not bad, "secret-name rules outside ale/redaction.py (use is_secret_name):\n" + "\n".join(bad)


@pytest.mark.parametrize("name", NAMES)
def test_agents_and_evidence_share_the_secret_name_rule(name: str) -> None:
    from ale.agents.errors import AgentConfigError
    from ale.agents.secrets import build_agent_env, is_forbidden_env
    from ale.redaction import REDACTED, is_secret_name, is_trusted_side_credential, redact

    trusted = is_trusted_side_credential(name)
    assert is_forbidden_env(name) is trusted and (not trusted or is_secret_name(name))
    try:
        build_agent_env(passthrough=[name], environ={name: "value-0123456789"})
        refused = False
    except AgentConfigError:
        refused = True
    assert refused is trusted, f"the agent's environment and the rule disagree on {name}"
    assert (redact({name: "plain"})[name] == REDACTED) is is_secret_name(name), f"redaction and the rule disagree on {name}"
    assert is_secret_name(name) is (name not in ("PATH", "HOME", "LANG", "AUTHOR", "EDITOR"))


@pytest.mark.parametrize("name", NAMES)
def test_the_sandbox_check_shares_the_secret_name_rule(name: str) -> None:
    """The sandbox's environment check: the same rule, plus proxies (a route out)."""
    from ale.isolation.checks import looks_like_credential
    from ale.redaction import is_secret_name

    assert looks_like_credential(name) is is_secret_name(name)
    assert looks_like_credential("HTTPS_PROXY")


# -- the bubblewrap builder: ale.tasks.jail.bwrap_base --------------------------------
BWRAP_SPELLINGS = ("--cap-drop", "--unshare-pid", "--die-with-parent", "nsswitch.conf", "ld.so.cache")


def test_bubblewrap_sandboxes_are_built_only_in_tasks_jail() -> None:
    hits = [f"{rel}:{line}: {text!r}" for rel, tree in _sources(skip=("tasks/jail.py",))
            for line, text, _ in _strings(tree) if text in BWRAP_SPELLINGS]
    assert not hits, "a second bubblewrap builder or /etc list (use ale.tasks.jail.bwrap_base):\n" + "\n".join(hits)


def test_the_task_jail_and_a_confined_harness_start_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from ale.agents.gateway import confine
    from ale.tasks import jail

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/usr/bin/bwrap" if name == "bwrap" else None)
    monkeypatch.delenv("ALE_TASK_SANDBOX", raising=False)
    (tmp_path / "cwd").mkdir()
    task = jail.jail_argv(["true"], python="/usr/bin/python3", read_only=[], home=tmp_path, cwd=tmp_path)
    harness, record = confine.bwrap_argv(["true"], cwd=tmp_path / "cwd", home=tmp_path, install=[], files=[], sockets={})
    base, etc = jail.bwrap_base("/usr/bin/bwrap", network=False)
    named, _ = jail.bwrap_base("/usr/bin/bwrap", network=False, hostname="ale-harness")
    assert task is not None and task[: len(base)] == base
    assert harness[: len(named)] == named
    assert [p for p in record["read_only"] if p.startswith("/etc/")] == etc
    assert etc and all(e[len("/etc/"):] in jail.ETC_FILES for e in etc)
