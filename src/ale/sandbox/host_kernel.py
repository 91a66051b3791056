"""What the host's kernel does with a crash in a sandbox: ``kernel.core_pattern``.

The pattern is one value per kernel, not per namespace: the sandbox's crashes go
where the host's do. Each run records it in the engine evidence; a pipe is warned
about (``core_pattern_warning``).
"""

from __future__ import annotations

from typing import Any

from ale.lossless import printable

CORE_PATTERN = "/proc/sys/kernel/core_pattern"


def core_pattern_record(path: str = CORE_PATTERN) -> dict[str, Any]:
    """The kernel's ``core_pattern`` as the harness's host reads it (one value per
    kernel: the containers' too, when the engine runs on this host). A pattern that
    starts with ``|`` makes the kernel run that program as root on the host for every
    crash, a sandbox's included, whatever the crashing process's core limit (the
    kernel ignores RLIMIT_CORE for a pipe): recorded, and warned about by the run."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
    except OSError as e:
        return {"core_pattern": None, "core_pattern_error": e.strerror or type(e).__name__}
    pattern = raw.decode("utf-8", "backslashreplace").rstrip("\n")
    return {"core_pattern": pattern, "core_pattern_pipe": pattern.startswith("|")}


def core_pattern_warning(engine: dict[str, Any]) -> str | None:
    """The run's warning for a pipe ``core_pattern`` in the engine evidence, or None."""
    if not engine.get("core_pattern_pipe"):
        return None
    return ("the host's kernel.core_pattern is a pipe "
            f"({printable(str(engine.get('core_pattern')))[:200]}): the kernel runs that handler as root on the host "
            "for a crash in the sandbox, whatever its core limit (ulimit core=0 keeps no core file, not the handler "
            "from running); set a file pattern (sysctl kernel.core_pattern=core) on hosts that run candidates")
