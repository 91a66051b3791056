"""The QEMU provider: a sealed VM per run (a read-only base disk, a per-run overlay, no route out)."""
