"""The host and package versions recorded in sweep.json and validate.json."""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def environment() -> dict[str, Any]:
    """``host`` and ``versions`` for sweep.json and validate.json (package versions read from metadata: nothing
    is imported)."""
    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    versions = {n: ver(n) for n in ("spectune", "aiohttp", "numpy", "torch", "transformers")}
    versions["python"] = platform.python_version()
    host = {"hostname": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
            "cpus": os.cpu_count()}
    return {"host": host, "versions": versions}
