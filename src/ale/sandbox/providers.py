"""Sandbox providers by name: what ``EnvironmentSpec.provider`` / ``RunPlan.provider`` select."""

from __future__ import annotations

from ale.sandbox.base import SandboxError, SandboxProvider
from ale.sandbox.docker import DockerProvider

PROVIDERS = ("docker",)


def make_provider(name: str = "docker", *, docker_host: str | None = None) -> SandboxProvider:
    """The provider called ``name``; ``docker_host`` selects a Docker engine
    (default: ``DOCKER_HOST`` or the local socket). Raises ``SandboxError`` for
    an unknown name."""
    if name == "docker":
        return DockerProvider(base_url=docker_host)
    raise SandboxError(f"unknown sandbox provider {name!r}: choose one of {', '.join(PROVIDERS)}")
