"""Where ale keeps its files on the operator's machine (overridable by env vars)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def config_dir() -> Path:
    return Path(os.environ.get("ALE_CONFIG_DIR") or platformdirs.user_config_dir("ale"))


def cache_dir() -> Path:
    return Path(os.environ.get("ALE_CACHE_DIR") or platformdirs.user_cache_dir("ale"))




def repo_root() -> Path | None:
    """The source checkout this package runs from, if any (for images/ and examples/)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "images" / "Dockerfile").is_file() and (parent / "pyproject.toml").is_file():
            return parent
    return None
