"""Latency the model gateway adds: the same fake model API reached directly and
through a run's gateway (record, tool check, key swap, pass-through), interleaved.

Per request (an Anthropic Messages request offering the bridge's four tools, a
small JSON answer): median and p95 of the whole round trip. Streamed (the same
request with ``stream: true``; the fake sends its first SSE event at once, the
rest 20 ms apart): median and p95 of the time to the first streamed byte. The
gateway, the fake API and the client each run in their own thread and event loop
(the harness is another process in a real run; here the three share one GIL).
Writes the numbers to bench/results/gateway.{json,md} (docs/benchmarks.md cites them).

    .venv/bin/python bench/gateway.py [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent))

import httpx2 as httpx  # noqa: E402
from publish import publish  # noqa: E402
from tests.fake_model_api import FakeModelAPI  # noqa: E402

from ale.agents.gateway.server import ModelGateway, serve_gateway  # noqa: E402
from ale.agents.gateway.tools import ToolPolicy  # noqa: E402

TOOLS = [{"name": f"mcp__ale__{t}", "description": "x" * 200, "input_schema": {"type": "object", "properties": {}}}
         for t in ("shell", "read_file", "write_file", "list_dir")]
BODY = {"model": "claude-fake-1", "max_tokens": 100, "messages": [{"role": "user", "content": "hello " * 200}],
        "tools": TOOLS}


def start_gateway(run_dir: Path, upstream: str) -> tuple[str, str, threading.Event]:
    ready, stop = threading.Event(), threading.Event()
    out: dict[str, str] = {}

    def run() -> None:
        async def main() -> None:
            gw = ModelGateway(run_dir, ToolPolicy(("shell", "read_file", "write_file", "list_dir")),
                              upstreams={"openai": upstream + "/v1", "anthropic": upstream, "gemini": upstream},
                              keys={"anthropic": "sk-bench"})
            async with serve_gateway(gw) as url:
                out.update(url=url, token=gw.token)
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return out["url"], out["token"], stop


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def measure(n: int, direct: str, via: str, token: str) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {"direct": [], "gateway": [], "direct_ttfb": [], "gateway_ttfb": []}
    async with httpx.AsyncClient(timeout=30) as c:
        targets = {"direct": (direct, {"x-api-key": "sk-bench"}), "gateway": (via + "/anthropic", {"x-api-key": token})}
        for i in range(n + 20):
            for name, (base, headers) in (list(targets.items()) if i % 2 == 0
                                          else list(reversed(list(targets.items())))):
                t0 = time.perf_counter()
                r = await c.post(base + "/v1/messages", json=BODY, headers=headers)
                dt = time.perf_counter() - t0
                assert r.status_code == 200, r.text
                t0 = time.perf_counter()
                ttfb = None
                async with c.stream("POST", base + "/v1/messages", json={**BODY, "stream": True}, headers=headers) as s:
                    async for _ in s.aiter_raw():
                        if ttfb is None:
                            ttfb = time.perf_counter() - t0
                assert ttfb is not None
                if i >= 20:  # warm-up
                    res[name].append(dt * 1000)
                    res[name + "_ttfb"].append(ttfb * 1000)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    fake = FakeModelAPI(chunk_delay_s=0.02).start()
    with tempfile.TemporaryDirectory() as td:
        url, token, stop = start_gateway(Path(td), fake.url)
        try:
            res = asyncio.run(measure(a.requests, fake.url, url, token))
        finally:
            stop.set()
            fake.stop()
    rows = []
    for label, d, g in (("request (JSON answer)", "direct", "gateway"),
                        ("first streamed byte (SSE)", "direct_ttfb", "gateway_ttfb")):
        md, mg = statistics.median(res[d]), statistics.median(res[g])
        rows.append(f"| {label} | {md:.2f} / {pct(res[d], 95):.2f} | {mg:.2f} / {pct(res[g], 95):.2f} | "
                    f"**{mg - md:+.2f}** / {pct(res[g], 95) - pct(res[d], 95):+.2f} |")
    lines = [
        "`bench/gateway.py`: the same fake model API (aiohttp, 127.0.0.1) reached directly and through a run's",
        f"model gateway, {a.requests} interleaved requests each way (after 20 warm-up), an Anthropic Messages request",
        "of ~2 KB offering the bridge's four tools. The gateway checks the token, extracts and checks the tools,",
        "records request and response (hash chain, bodies past 16 KiB as files), swaps the key and passes the",
        "response through chunk by chunk. Milliseconds, median / p95; target: at most 2 ms added at the median.",
        "",
        "| what | direct | through the gateway | added |",
        "| --- | --- | --- | --- |",
        *rows,
    ]
    print("\n".join(lines))
    if not a.no_write:
        print("wrote", *publish("gateway", {"requests": a.requests, "ms": res}, "\n".join(lines)))


if __name__ == "__main__":
    main()
