"""Latency a native harness's channel adds (``ale.sandbox.channel``): the same
client, the same request, the same run gateway in front of the same fake model API,
reached directly from the host and from inside a sealed sandbox through the
exec-attached stream (relay on 127.0.0.1:8417 in the sandbox, frames over
``docker exec``, the host end connecting to the gateway). Per request: median and
p95 of the round trip (an Anthropic Messages request of ~2 KB, a small JSON answer,
one kept-alive connection, 20 warm-up requests), in alternating rounds. Also the
channel's start-up (the relay's exec until it listens).

    .venv/bin/python bench/channel.py [--requests 300] [--image ale-harness:TAG]

The image defaults to the claude-code layer over ale-tools:latest (built if missing).
Prints a Markdown table for docs/benchmarks.md ("## Native harness channel").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent))

import docker  # noqa: E402
from tests.fake_model_api import FakeModelAPI  # noqa: E402

from ale.agents.gateway.server import ModelGateway, serve_gateway  # noqa: E402
from ale.agents.gateway.tools import ToolPolicy  # noqa: E402
from ale.sandbox.channel import ExecChannel  # noqa: E402
from ale.sandbox.harness_image import build_harness_image  # noqa: E402

CLIENT = r"""
import http.client, json, sys, time
host, port, token, n, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), 20
body = json.dumps({"model": "claude-fake-1", "max_tokens": 100, "messages": [{"role": "user", "content": "hello " * 300}]})
c = http.client.HTTPConnection(host, port, timeout=30)
out = []
for i in range(n + warm):
    t = time.perf_counter()
    c.request("POST", "/anthropic/v1/messages", body, {"x-api-key": token, "content-type": "application/json"})
    r = c.getresponse(); r.read()
    if r.status != 200:
        sys.exit(f"status {r.status}")
    if i >= warm:
        out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""  # noqa: E501


def _stats(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[int(len(xs) * 0.95) - 1]


async def main(n: int, image: str | None, rounds: int) -> None:
    client = docker.from_env()
    image = image or build_harness_image(client, "ale-tools:latest", "claude-code", say=lambda m: None)[0]
    fake = FakeModelAPI().start()
    container = client.containers.run(image, ["sleep", "infinity"], detach=True, network_mode="none", read_only=True,
                                      cap_drop=["ALL"], user="1000:1000", tmpfs={"/tmp": "size=64m"},
                                      security_opt=["no-new-privileges"],
                                      labels={"ale.managed": "1", "ale.role": "bench"})
    direct: list[float] = []
    channel: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            gw = ModelGateway(Path(tmp), ToolPolicy((), client_tools=True), keys={"anthropic": "k"},
                              upstreams={"openai": fake.url, "anthropic": fake.url, "gemini": fake.url})
            async with serve_gateway(gw) as url:
                port = int(url.rsplit(":", 1)[1])
                sandbox = SimpleNamespace(client=client, id=container.id, name=container.name,
                                          policy=SimpleNamespace(user="1000:1000"))
                ch = ExecChannel(sandbox, gateway=("127.0.0.1", port))
                async with ch.serve():
                    for _ in range(rounds):
                        r = await asyncio.to_thread(subprocess.run,
                                                    ["python3", "-c", CLIENT, "127.0.0.1", str(port), gw.token, str(n)],
                                                    capture_output=True, text=True, check=True)
                        direct += json.loads(r.stdout)
                        code, out = await asyncio.to_thread(container.exec_run,
                                                            ["python3", "-c", CLIENT, "127.0.0.1", "8417",
                                                             gw.token, str(n)],
                                                            user="1000:1000", demux=True)
                        if code != 0:
                            raise SystemExit(f"inside: {out}")
                        channel += json.loads(out[0])
                rec = await ch.record()
    finally:
        container.remove(force=True)
        fake.stop()
    (dm, dp), (cm, cp) = _stats(direct), _stats(channel)
    print(f"{len(direct)} requests each way, {rounds} alternating rounds; channel start-up "
          f"{rec['start_s'] * 1000:.0f} ms; connections {rec['connections']}, protocol errors {rec['protocol_errors']}")
    print("| what | host → gateway | sandbox → channel → gateway | added |")
    print("| --- | --- | --- | --- |")
    print(f"| request (JSON answer) | {dm:.2f} / {dp:.2f} | {cm:.2f} / {cp:.2f} | "
          f"**+{cm - dm:.2f}** / +{cp - dp:.2f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--image")
    a = p.parse_args()
    asyncio.run(main(a.requests // a.rounds, a.image, a.rounds))
