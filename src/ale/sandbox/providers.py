"""Sandbox providers by name: what ``EnvironmentSpec.provider`` / ``RunPlan.provider`` select."""

from __future__ import annotations

from ale.sandbox.base import SandboxError, SandboxProvider
from ale.sandbox.docker import DockerProvider

PROVIDERS = ("docker", "qemu")


def make_provider(name: str = "docker", *, docker_host: str | None = None) -> SandboxProvider:
    """The provider called ``name``; ``docker_host`` selects a Docker engine
    (default: ``DOCKER_HOST`` or the local socket). Raises ``SandboxError`` for
    an unknown name."""
    if name == "docker":
        return DockerProvider(base_url=docker_host)
    if name == "qemu":  # ale's own Linux guests under QEMU (ale.sandbox.qemu)
        from ale.sandbox.qemu.provider import QemuProvider

        return QemuProvider()
    raise SandboxError(f"unknown sandbox provider {name!r}: choose one of {', '.join(PROVIDERS)}")


def require_runtime(name: str, runtime: str) -> None:
    """Refuse (``SandboxError``, saying how to add it) an OCI runtime the provider
    ``name``'s engine lacks; the default runtime, or a provider without runtimes, passes."""
    from ale.sandbox.runtimes import DEFAULT_RUNTIME

    if runtime == DEFAULT_RUNTIME:
        return
    require = getattr(make_provider(name), "require_runtime", None)
    if require is not None:
        require(runtime)
