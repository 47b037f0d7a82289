"""`spectune presets list` and `spectune presets show NAME`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("list")
def list_presets() -> None:
    """List the built-in SGLang adaptive-speculation presets with a one-line description."""
    from spectune.presets import describe, preset_names

    for name in preset_names():
        typer.echo(f"{name}\t{describe(name)}")


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="Preset name, as printed by 'spectune presets list'.")]) -> None:
    """Print a preset's JSON (save it and pass it to SGLang's --speculative-adaptive-config)."""
    from spectune.presets import load_preset

    typer.echo(json.dumps(load_preset(name), indent=2))
