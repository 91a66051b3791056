"""The one list of tests that cannot run on the kind of machine CI runs on.

CI (``.ci/run``, ``ALE_CI=1``) skips nothing else: a test that lacks a capability this
machine could have fails there (``tests/conftest.py``'s ``require`` and the
``requires`` marker). A test that truly cannot run on this kind of machine (Debian 12,
root, docker.io 20.10 on cgroup v1, 2 cores) is named here with the reason; conftest
skips exactly these, and every pytest run prints this list in its header, so a green
CI run says what it did not run.

Keys are pytest node ids, or a prefix of one ending at ``::`` or ``[`` (a whole module,
a whole test function's parameters). ``tests/test_no_bare_skips.py`` keeps every
other skip out of the suite.
"""

from __future__ import annotations

# node id (or prefix) -> why it cannot run on this kind of machine
CANNOT_RUN_HERE: dict[str, str] = {}


def _matches(nodeid: str, key: str) -> bool:
    if nodeid == key:
        return True
    return nodeid.startswith(key) and (key.endswith(("::", "[")) or nodeid[len(key)] in ":[")


def why_not_here(nodeid: str) -> str | None:
    """Why the test ``nodeid`` cannot run on this kind of machine, or None."""
    for key, why in CANNOT_RUN_HERE.items():
        if _matches(nodeid, key):
            return why
    return None


def header() -> list[str]:
    """The lines pytest prints at the start of every run."""
    if not CANNOT_RUN_HERE:
        return ["cannot run here (tests/cannot_run_here.py): none; nothing else may skip under ALE_CI=1"]
    return ["cannot run here (tests/cannot_run_here.py), skipped even under ALE_CI=1:",
            *(f"  {key}: {why}" for key, why in CANNOT_RUN_HERE.items())]


if __name__ == "__main__":  # scripts/test.sh (and so .ci/run) prints it first
    print("\n".join(header()))
