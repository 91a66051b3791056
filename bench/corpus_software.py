"""How much of a task tree's declared software ale's catalogue provisions.

    python bench/corpus_software.py PATH/TO/tasks [--overlay FILE] [--all-os] [--json]

For every task folder with a ``task_card.json`` whose VM is Linux (``cpu-free-ubuntu``;
``--all-os`` takes every card), resolves the card's needs (``ale.provision``) and
prints: the number of tasks whose every declared name is provided, the tasks that
are not (with what they miss), and every missing name with its reason and count.
Reads the tree; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from ale.provision.needs import resolve_needs, software_summary
from ale.provision.sources import load_overlay
from ale.tasks.card import LINUX_SNAPSHOTS, load_card


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", type=Path)
    ap.add_argument("--overlay", type=Path)
    ap.add_argument("--all-os", action="store_true", help="every card, not only Linux ones")
    ap.add_argument("--json", action="store_true", help="print the per-task rows as JSON")
    args = ap.parse_args(argv)
    overlay = load_overlay(args.overlay) if args.overlay else None
    rows = []
    for card_path in sorted(args.tasks.rglob("task_card.json")):
        d = card_path.parent
        if not (d / "main.py").is_file():
            continue
        card = load_card(d)
        if not args.all_os and card.snapshot not in LINUX_SNAPSHOTS:
            continue
        p = resolve_needs(d, overlay=overlay, card=card)
        rows.append((d.relative_to(args.tasks).as_posix(), p))
    if args.json:
        print(json.dumps([{"task": t, "software": software_summary(p)} for t, p in rows], indent=1))
        return 0
    full = [t for t, p in rows if p.complete]
    names = {n for _, p in rows for n in p.declared}
    print(f"{len(rows)} task(s); {len(names)} distinct declared name(s); "
          f"{len(full)} fully provisioned, {len(rows) - len(full)} not")
    kinds: Counter[str] = Counter(m.kind for _, p in rows for m in p.missing)
    alone: Counter[str] = Counter()
    for _, p in rows:
        ks = {m.kind for m in p.missing}
        if len(ks) == 1:
            alone[ks.pop()] += 1
    print("missing by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    print("tasks missing only one kind: " + ", ".join(f"{k} {n}" for k, n in alone.most_common()))
    print("\nnot fully provisioned:")
    for t, p in rows:
        if not p.complete:
            print(f"  {t}: " + "; ".join(m.name for m in p.missing))
    print("\nmissing names (tasks, kind, why):")
    why: dict[str, tuple[str, str]] = {}
    count: Counter[str] = Counter()
    for _, p in rows:
        for m in p.missing:
            why[m.name] = (m.kind, m.why)
            count[m.name] += 1
    by_kind: dict[str, list[str]] = defaultdict(list)
    for n in why:
        by_kind[why[n][0]].append(n)
    for kind in sorted(by_kind):
        for n in sorted(by_kind[kind], key=str.lower):
            print(f"  {count[n]:>3}  {kind:<12} {n}: {why[n][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
