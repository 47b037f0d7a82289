"""SGLang's own code for the contract tests (tests/backends/test_sglang_contract.py), found or fetched once.

Where it comes from, first hit wins:

1. ``$SPECTUNE_SGLANG_PATH``: a folder made by ``pip install --no-deps --target DIR sglang==... ...`` (an SGLang of
   your choosing, e.g. main with the throughput-aware controller);
2. an ``sglang`` importable in this environment;
3. spectune's cache, ``$SPECTUNE_CACHE_DIR/sglang/<version>`` (``~/.cache/spectune``): made once, by the same
   ``pip install --no-deps --target`` of the pinned wheel plus the pure-Python modules its import chain needs
   (Triton is replaced by SGLang's own stub inside the probe). No GPU package is installed.

Only when pip cannot fetch them (no network, no index) are the tests skipped, with pip's last line as the reason.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SGLANG_VERSION = "0.5.23"
"""The SGLang release the contract is checked against (its wheel is pure Python)."""
PACKAGES = (f"sglang=={SGLANG_VERSION}", "orjson", "psutil", "pybase64", "starlette", "msgspec", "pyzmq", "ipython",
            "traitlets")
"""What ``pip install --no-deps --target`` installs: SGLang without its GPU dependencies, plus the modules that
``sglang.srt.speculative`` and ``sglang.srt.arg_groups`` import on the way."""


def cache_folder() -> Path:
    """``$SPECTUNE_CACHE_DIR/sglang/<version>`` (default ``~/.cache/spectune/sglang/0.5.23``)."""
    root = Path(os.environ.get("SPECTUNE_CACHE_DIR") or Path.home() / ".cache" / "spectune")
    return root / "sglang" / SGLANG_VERSION


def sglang_path() -> tuple[str | None, str]:
    """``(PYTHONPATH entry, why)``: the folder holding SGLang's code ("" when this environment imports it), or
    None with the reason it could not be had."""
    env = os.environ.get("SPECTUNE_SGLANG_PATH", "")
    if env:
        return env, "SPECTUNE_SGLANG_PATH"
    if importlib.util.find_spec("sglang") is not None:
        return "", "installed"
    folder = cache_folder()
    if (folder / "sglang" / "__init__.py").is_file():
        return str(folder), "cache"
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{SGLANG_VERSION}.", dir=folder.parent))
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "--no-deps", "--target", str(tmp), *PACKAGES],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            return None, f"pip could not fetch SGLang {SGLANG_VERSION}: {lines[-1] if lines else proc.returncode}"
        try:
            tmp.rename(folder)
        except OSError:  # another session made it first
            pass
        return str(folder), "cache"
    except subprocess.TimeoutExpired:
        return None, f"pip ran 10 minutes fetching SGLang {SGLANG_VERSION}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
