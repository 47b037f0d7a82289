"""The ``spectune`` command line: a thin typer app.

Each command's options live in ``spectune/commands/<name>.py`` (typer ``Annotated`` parameters; only light imports
at module level so ``spectune --help`` starts fast); the work lives in the library modules they call. User errors
are one exception type, :class:`spectune.core.errors.UserError`, caught only here: one line on stderr, exit code 2
(or
the error's own), no traceback.
"""

from __future__ import annotations

import sys

import typer

from spectune.commands import (draft, gate, llamacpp, presets, recommend, report, serve, simulate, sweep, validate,
                               vllm)
from spectune.core.errors import UserError

app = typer.Typer(
    name="spectune",
    help="Benchmark and tune speculative decoding (EAGLE num_steps per batch size) for SGLang, vLLM, "
    "llama.cpp and a bundled engine.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.command("sweep")(sweep.sweep)
app.command("recommend")(recommend.recommend)
app.command("gate")(gate.gate)
app.command("report")(report.report)
app.command("serve")(serve.serve)
app.command("simulate")(simulate.simulate)
app.command("validate")(validate.validate)
app.add_typer(presets.app, name="presets", help="List and show built-in SGLang adaptive-speculation presets.")
app.add_typer(draft.app, name="draft", help="Train, evaluate and export EAGLE draft heads.")
app.add_typer(llamacpp.app, name="llamacpp", help="Build or locate llama.cpp's llama-server for --backend llamacpp.")
app.add_typer(vllm.app, name="vllm", help="Install or locate the vLLM that --backend vllm launches.")


def main() -> None:
    """Console-script entry point: run the app, turning :class:`UserError` into a one-line error and exit code."""
    try:
        app()
    except UserError as err:
        from rich.console import Console
        from rich.markup import escape

        # escaped: a message may hold square brackets (pip install -e ".[ray]") that are not markup
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(err.message)}",
                                                                    markup=True)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
