"""The `ale` command: ``main`` holds the top-level verbs and wires in the others
(``agents``, ``data``, ``env``, ``exp``, ``node``, ``regrade``, ``show``, ``verify``,
``view``, ``vm``); ``output`` is how every command prints, and fails (``fail``).

``app`` (the console script ``ale.cli:app``) is loaded on first use, so that
``python -m ale.cli.exp`` or ``python -m ale.cli.agents`` runs its own verbs without
loading the main CLI first.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from ale.cli.main import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
