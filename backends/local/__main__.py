"""``python -m spectune.backends.local``: run the bundled server from a JSON EngineOptions (what the ``local`` sweep
backend
launches; users run ``spectune serve``)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from spectune.backends.local.build import build_engine
from spectune.backends.local.options import EngineOptions
from spectune.core.errors import UserError


def main(argv: list[str] | None = None) -> None:
    """Parse ``--options JSON --host H --port P [--model-name N] [--api-key-env NAME] [--metrics-without-key]`` and
    serve until killed. The API key is read from the environment variable named by ``--api-key-env`` (never from
    the command line, which other users of the machine can read)."""
    parser = argparse.ArgumentParser(prog="python -m spectune.backends.local")
    parser.add_argument("--options", required=True, help="EngineOptions as a JSON object")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--api-key-env", default=None)
    parser.add_argument("--metrics-without-key", action="store_true")
    args = parser.parse_args(argv)
    from spectune.backends.local.server.app import serve

    try:
        engine = build_engine(EngineOptions(**json.loads(args.options)))
    except UserError as err:
        print(f"error: {err.message}", file=sys.stderr)
        sys.exit(err.exit_code)
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    serve(engine, args.model_name or engine.model_name, args.host, args.port, key, args.metrics_without_key)


if __name__ == "__main__":
    main()
