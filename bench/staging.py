"""Staging speed: `LocalSource.stage_input` against `cp -r` + `sha256sum`, and
decrypting a 100 MiB reference.7z.

    .venv/bin/python bench/staging.py [--small-files 8000] [--large-mib 768] [--repeats 3] [--no-write]

Builds a 1 GiB input (many small files and one large one) in a temporary folder,
then, interleaved and repeated, (a) stages it with ale (one pass: copy + sha256 of
every file + tree digest) and (b) runs `cp -r` followed by `sha256sum` over the
copy. Page cache is warmed first so both read from memory. Medians are reported,
and written to bench/results/staging.{json,md} (docs/benchmarks.md cites them).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from publish import publish

from ale.data.base import VariantKey
from ale.data.sealing import seal_variant
from ale.data.sources import LocalSource

KEY = VariantKey("bench", "staging", "v0")
MIB = 1024 * 1024


def build_input(root: Path, small_files: int, large_mib: int, total_mib: int) -> tuple[int, int]:
    inp = root / KEY.relpath / "input"
    rng = random.Random(1)
    small_budget = total_mib * MIB - large_mib * MIB
    sizes = [rng.randint(1024, 2 * small_budget // small_files - 1024) for _ in range(small_files)]
    scale = small_budget / sum(sizes)
    sizes = [max(1, int(s * scale)) for s in sizes]
    blob = os.urandom(max(sizes) + 4096)
    for i, size in enumerate(sizes):
        d = inp / f"d{i % 64:02d}" / f"e{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        off = rng.randint(0, 4096)
        (d / f"f{i:05d}.bin").write_bytes(blob[off : off + size])
    with open(inp / "large.bin", "wb") as f:
        chunk = os.urandom(8 * MIB)
        for _ in range(large_mib // 8):
            f.write(chunk)
    total = sum(p.stat().st_size for p in inp.rglob("*") if p.is_file())
    return total, small_files + 1


def warm(path: Path) -> None:
    subprocess.run(f"find {path} -type f -print0 | xargs -0 cat > /dev/null", shell=True, check=True)


def time_ale(src: LocalSource, dest: Path) -> float:
    t0 = time.perf_counter()
    src.stage_input(KEY, dest)
    return time.perf_counter() - t0


def time_cp(inp: Path, dest: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["cp", "-r", str(inp), str(dest)], check=True)
    subprocess.run(
        f"find {dest} -type f -print0 | xargs -0 sha256sum > /dev/null", shell=True, check=True
    )
    return time.perf_counter() - t0


def bench_decrypt(tmp: Path, mib: int) -> tuple[float, float, int]:
    root = tmp / "refroot"
    v = root / KEY.relpath
    (v / "input").mkdir(parents=True)
    (v / "input" / "x").write_text("x")
    ref = v / "reference"
    ref.mkdir()
    chunk = os.urandom(4 * MIB)
    for i in range(mib // 4):
        (ref / f"part{i:03d}.bin").write_bytes(chunk[i:] + chunk[:i])
    store = tmp / "secrets.json"
    t0 = time.perf_counter()
    r = seal_variant(v, store, remove_clear=True)
    seal_s = time.perf_counter() - t0
    src = LocalSource(root, secret_store=store)
    c = src.commit_reference(KEY)
    t0 = time.perf_counter()
    src.stage_reference(KEY, tmp / "grading" / "reference", c)
    stage_s = time.perf_counter() - t0
    return seal_s, stage_s, r.size


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small-files", type=int, default=8000)
    ap.add_argument("--large-mib", type=int, default=768)
    ap.add_argument("--total-mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decrypt-mib", type=int, default=100)
    ap.add_argument("--no-write", action="store_true", help="print only; write no bench/results/staging.{json,md}")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ale-bench-staging-", dir=os.environ.get("ALE_BENCH_TMP")) as tmp_s:
        tmp = Path(tmp_s)
        print(f"building a {args.total_mib} MiB input ({args.small_files} small files + {args.large_mib} MiB file)...")
        total, nfiles = build_input(tmp / "data", args.small_files, args.large_mib, args.total_mib)
        inp = tmp / "data" / KEY.relpath / "input"
        warm(inp)
        src = LocalSource(tmp / "data")
        ale_t: list[float] = []
        cp_t: list[float] = []
        for i in range(args.repeats):
            for which in ("ale", "cp") if i % 2 == 0 else ("cp", "ale"):
                dest = tmp / f"out-{which}-{i}"
                if which == "ale":
                    ale_t.append(time_ale(src, dest / "input"))
                else:
                    dest.mkdir()
                    cp_t.append(time_cp(inp, dest / "input"))
                shutil.rmtree(dest)
            print(f"  repeat {i + 1}: ale {ale_t[-1]:.2f}s, cp+sha256sum {cp_t[-1]:.2f}s")
        a, b = statistics.median(ale_t), statistics.median(cp_t)
        ratio = a / b
        print(f"staging {total / MIB:.0f} MiB in {nfiles} files: ale {a:.2f}s, cp -r + sha256sum {b:.2f}s, "
              f"ratio {ratio:.2f}x")
        seal_s, stage_s, size = bench_decrypt(tmp, args.decrypt_mib)
        print(f"reference.7z of {size / MIB:.0f} MiB: sealing {seal_s:.2f}s, check + decrypt + stage {stage_s:.2f}s")
    section = (
        f"`bench/staging.py` ({datetime.now(UTC):%Y-%m-%d}; {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {sys.platform}). Input of {total / MIB:.0f} MiB: {nfiles - 1} small files "
        f"and one of {args.large_mib} MiB; page cache warm; {args.repeats} interleaved repeats, medians.\n\n"
        "| what | seconds |\n| --- | ---: |\n"
        f"| `LocalSource.stage_input` (copy + sha256 per file + tree digest, one read pass) | {a:.2f} |\n"
        f"| `cp -r` then `sha256sum` over the copy | {b:.2f} |\n\n"
        f"Ratio ale / (cp + sha256sum): **{ratio:.2f}x** (target at most 1.3x).\n\n"
        f"A sealed `reference.7z` of {size / MIB:.0f} MiB (random data, zstd + AES-256, encrypted "
        f"headers): sealing {seal_s:.2f} s; at grading, copy + digest check + decrypt with limits + "
        f"stage **{stage_s:.2f} s**.\n"
    )
    if not args.no_write:
        figures = {"total_mib": total / MIB, "files": nfiles, "ale_s": ale_t, "cp_sha256sum_s": cp_t, "ratio": ratio,
                   "reference_mib": size / MIB, "seal_s": seal_s, "stage_reference_s": stage_s}
        print("wrote", *publish("staging", figures, section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
