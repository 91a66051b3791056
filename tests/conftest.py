"""Shared fixtures: a Docker client, the tools image, and sealed test containers."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

TOOLS_IMAGE = os.environ.get("ALE_IMAGE", "ale-tools:latest")
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "tasks"


def _docker_client():
    try:
        import docker

        c = docker.from_env(timeout=120)
        c.ping()
        c.images.get(TOOLS_IMAGE)
        return c
    except Exception:
        return None


@pytest.fixture(scope="session")
def docker_client():
    c = _docker_client()
    if c is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a Docker engine and the image {TOOLS_IMAGE} (run `make setup`)")
        pytest.skip(f"no Docker engine or no {TOOLS_IMAGE} image")
    return c


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path_factory, monkeypatch):
    """Keep signing keys and caches of tests out of the operator's folders."""
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("ALE_CONFIG_DIR", str(base / "ale-config"))
    monkeypatch.setenv("ALE_CACHE_DIR", str(base / "ale-cache"))
    # Tables (status, report) are laid out for the terminal; tests pin a width
    # so that none depends on the one it runs in. Errors are never wrapped.
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def label():
    """A unique label value for containers a test creates."""
    return f"test-{uuid.uuid4().hex[:10]}"


def our_containers(client, **labels) -> list:
    filters = ["ale.managed=1"] + [f"{k}={v}" for k, v in labels.items()]
    return client.containers.list(all=True, filters={"label": filters})
