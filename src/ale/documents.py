"""Reading the JSON and YAML files users hand to ale (policies, experiments, scripts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def load_document(path: str | Path, what: str, error: type[Exception] = ValueError) -> Any:
    """Parse `path` as JSON (`.json`) or YAML (anything else; YAML reads JSON too).
    Errors are `error` and name `what`, the path, and where the text is wrong."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise error(f"cannot read {what} {p}: {e.strerror or e}") from e
    try:
        return json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
    except yaml.YAMLError as e:
        raise error(f"{what} {p} is not valid YAML: {e}") from e
