"""`ale view RUN_DIR|EXP_DIR` and `ale export RUN_DIR|EXP_DIR --format atif`
(wired into the main CLI by ``ale.cli.main``)."""

from __future__ import annotations

import functools
import http.server
import os
import threading
import webbrowser
from pathlib import Path
from typing import Annotated

import typer

from ale.cli.output import err, fail


def _serve_root(page: Path, target: Path) -> Path:
    """The folder a local server must serve: it holds the page and the run folders it links."""
    return Path(os.path.commonpath([page.resolve().parent, target.resolve()]))


def view_command(
    target: Annotated[Path, typer.Argument(help="A run folder, or an experiment's output folder.")],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="The page to write (default: <run>.view.html beside the run folder; "
                            "<output>/views/index.html for an experiment, with a page per run beside it).")] = None,
    serve: Annotated[bool, typer.Option(
        "--serve", help="Also serve the page on 127.0.0.1 until Ctrl-C (the page needs no server).")] = False,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="The port for --serve (0: any free one).")] = 0,
    open_: Annotated[bool, typer.Option("--open", help="Open the page in a browser.")] = False,
    no_verify: Annotated[bool, typer.Option(
        "--no-verify", help="Leave out the evidence verdict (ale verify) to write faster.")] = False,
) -> None:
    """Write a static, self-contained HTML page of a run (or of an experiment and each of its runs)."""
    from ale.report.viewer import is_experiment_dir, timed_view

    if not target.exists():
        fail(f"{target}: no such folder")

    def progress(n: int, total: int, run_id: str) -> None:
        if n == total or n % 50 == 0:
            err.print(f"  {n}/{total} run pages written")

    try:
        page, seconds = timed_view(target, out, verify=not no_verify,
                                   progress=progress if is_experiment_dir(target) else None)
    except ValueError as e:
        fail(str(e))
    err.print(f"wrote {page} in {seconds:.2f} s")
    url = page.resolve().as_uri()
    server = None
    if serve:
        root = _serve_root(page, target)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        rel = page.resolve().relative_to(root).as_posix()
        url = f"http://127.0.0.1:{server.server_address[1]}/{rel}"
        err.print(f"serving {root} at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    if open_:
        threading.Timer(0.3 if server else 0, webbrowser.open, args=(url,)).start()
    print(url if server else page)
    if server is not None:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


def export_command(
    target: Annotated[Path, typer.Argument(help="A run folder, or an experiment's output folder.")],
    format_: Annotated[str, typer.Option(
        "--format", "-f", help="The format: atif (Harbor's Agent Trajectory Interchange Format).")] = "atif",
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Where to write (default: <run>.atif.json beside the run folder; "
                            "<output>/atif/ for an experiment, one file per run).")] = None,
) -> None:
    """Export trajectories in a format other tools read; prints each file written."""
    from pydantic import ValidationError

    from ale.report.atif import export

    if format_.lower() != "atif":
        fail(f"unknown format {format_!r}: the formats are atif")
    if not target.exists():
        fail(f"{target}: no such folder")
    try:
        written = export(target, out)
    except ValueError as e:  # ValidationError too: the export would not be valid ATIF
        fail(str(e) if not isinstance(e, ValidationError) else f"the export does not validate as ATIF: {e}", 1)
    for path in written:
        print(path)
    err.print(f"wrote {len(written)} ATIF file(s)")
