"""One module per CLI command: typer options only, work delegated to library modules."""
