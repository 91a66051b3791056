"""Data roots: the two layouts every source reads, and how a variant is found in them.

- ``ale``: ``<root>/<domain>/<task>/<variant>/`` (ALE's buckets, its Hugging Face
  dataset, its local fetch);
- ``tasks``: ``<root>/tasks/<domain>/<task>/<variant>/``.

A source is told one layout or ``auto``. Under ``auto`` each variant is looked up
under both: it must exist under exactly one of them (a variant folder under both
is a DataError naming both paths, resolved by choosing a layout). The choice is
made with ``open_source(..., layout=...)`` or a spec option, ``<spec>#layout=ale``
(see `split_spec`).

Listing under ``auto`` reads both; a top-level ``tasks/`` folder is then always
the tasks layout, never an ALE domain called "tasks" (choose ``ale`` for that).
Names starting with a dot (``.git``, ``.cache``) are never variants.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ale.data.base import (
    DataError,
    DataMissing,
    Layout,
    LayoutChoice,
    VariantKey,
    check_layout,
)

LAYOUT_NAMES: dict[Layout, str] = {"ale": "ALE layout", "tasks": "tasks layout"}
SPEC_OPTIONS = ("layout",)
_OPTIONS_RE = re.compile(r"^[a-z_]+=[^&=#]*(&[a-z_]+=[^&=#]*)*$")


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`<spec>#name=value[&name=value]` into the spec and its options.

    Only a last `#` followed by `name=value` pairs starts options (a path holding
    a `#` otherwise keeps it). Raises DataError for an unknown option name or an
    option given twice; the only option is `layout` (auto | ale | tasks).
    """
    base, sep, fragment = spec.rpartition("#")
    if not sep or not _OPTIONS_RE.match(fragment):
        return spec, {}
    options: dict[str, str] = {}
    for pair in fragment.split("&"):
        name, _, value = pair.partition("=")
        if name not in SPEC_OPTIONS:
            raise DataError(
                f"data source {spec!r}: unknown option {name!r} (known: {', '.join(SPEC_OPTIONS)})"
            )
        if name in options:
            raise DataError(f"data source {spec!r}: option {name!r} given twice")
        options[name] = value
    if "layout" in options:
        check_layout(options["layout"], f"data source {spec!r}")
    return base, options


def choose_layout(spec: str, from_spec: str | None, given: str | None) -> LayoutChoice:
    """The layout a source uses: `given` (open_source's argument) or the spec's
    option, else "auto". DataError when both are set and differ, or either is unknown."""
    if given is not None:
        choice = check_layout(given, f"data source {spec!r}")
        if from_spec is not None and from_spec != choice:
            raise DataError(
                f"data source {spec!r} says layout={from_spec} but layout={choice} was asked for; "
                "give one of them"
            )
        return choice
    if from_spec is not None:
        return check_layout(from_spec, f"data source {spec!r}")
    return "auto"


def with_layout(spec: str, layout: LayoutChoice) -> str:
    """The spec that reopens a source with this layout (no option for "auto")."""
    return spec if layout == "auto" else f"{spec}#layout={layout}"


def candidates(choice: LayoutChoice) -> tuple[Layout, ...]:
    """The layouts a variant is looked up in, in the order messages name them."""
    if choice == "auto":
        return ("ale", "tasks")
    return (choice,)


def resolve_layout(
    key: VariantKey,
    choice: LayoutChoice,
    *,
    exists: Callable[[Layout], bool],
    location: Callable[[Layout], str],
    available: Callable[[Layout], tuple[int, str]],
) -> Layout:
    """The one layout `key`'s variant folder exists in.

    `exists(layout)` says whether the folder is there, `location(layout)` names it,
    and `available(layout)` gives (how many levels above the variant exist: 2 the
    task folder, 1 the domain folder, 0 neither; a hint of what is there) for the
    not-found message, which shows the hint of the layout that got furthest. Raises DataError naming every path tried
    when the folder is in none, and both paths when "auto" finds it in both.
    """
    tried = candidates(choice)
    found = [layout for layout in tried if exists(layout)]
    if len(found) == 1:
        return found[0]
    if found:
        raise DataError(
            f"variant {key.name} is under both layouts: {location('ale')} ({LAYOUT_NAMES['ale']}) and "
            f"{location('tasks')} ({LAYOUT_NAMES['tasks']}); choose one with layout='ale' or "
            "layout='tasks' (a spec suffix #layout=ale or #layout=tasks), or remove the other folder",
            retryable=False,
        )
    hints = {layout: available(layout) for layout in tried}
    if len(tried) == 1:
        (layout,) = tried
        raise DataMissing(f"variant folder {location(layout)} not found (available: {hints[layout][1]})")
    deepest = max(level for level, _ in hints.values())
    best = [layout for layout in tried if hints[layout][0] == deepest]
    if len(best) == 1:
        hint = hints[best[0]][1]
    else:
        hint = "; ".join(f"{LAYOUT_NAMES[layout]}: {hints[layout][1]}" for layout in tried)
    paths = " nor ".join(f"{location(layout)} ({LAYOUT_NAMES[layout]})" for layout in tried)
    raise DataMissing(f"variant folder for {key.name} not found: neither {paths} exists (available: {hint})")


def list_variants(choice: LayoutChoice, subdirs: Callable[[str], list[str]]) -> list[VariantKey]:
    """Every variant folder under a root, for the layouts `choice` reads.

    `subdirs(relpath)` lists the folder names in a folder of the root ("" is the
    root itself; [] when it is missing). Hidden names are skipped; under "auto" a
    top-level `tasks` folder is read as the tasks layout only.
    """
    found: set[VariantKey] = set()
    for layout in candidates(choice):
        top = "tasks" if layout == "tasks" else ""

        def below(*parts: str, top: str = top) -> list[str]:
            rel = "/".join(p for p in (top, *parts) if p)
            return [n for n in subdirs(rel) if not n.startswith(".")]

        for domain in below():
            if layout == "ale" and choice == "auto" and domain == "tasks":
                continue
            for task in below(domain):
                for variant in below(domain, task):
                    found.add(VariantKey(domain, task, variant))
    return sorted(found, key=lambda k: (k.domain, k.task, k.variant))

