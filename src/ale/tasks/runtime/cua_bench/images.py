"""``cua_bench.images``: older cua-bench-basic tasks name their image with
``image("BENCH_WEB")``; here the harness picks the image (the desktop image for a
task with a screen), so the name is only recorded in the variant's spec."""

from __future__ import annotations


def image(name: str) -> str:
    return f"cua-bench:{name}"
