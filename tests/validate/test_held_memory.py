"""``spectune validate --servers together|kept`` refuses servers that cannot fit in memory at once, before any starts
(spectune/validate/held_memory.py), and the bundled engine's backend says what one of its servers holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT
from spectune.backends.base import Backend
from spectune.backends.local.backend import SERVER_BASE_GIB, LocalBackend
from spectune.backends.options import BackendOptions
from spectune.core.errors import UserError
from spectune.validate.held_memory import available_gib, check_held_memory


class Sized(Backend):
    """A backend whose servers report ``gib`` each (None: unknown); nothing is ever started."""

    name = "sized"

    def __init__(self, gib: float | None) -> None:
        self.gib = gib

    async def start(self, steps: int):  # pragma: no cover - the check runs before any start
        raise AssertionError("started")

    async def stop(self) -> None:
        return None

    def server_memory_gib(self, steps: int) -> float | None:
        return self.gib


def test_servers_that_fit_pass():
    check_held_memory([(Sized(2.0), 0), (Sized(2.0), 1)], "together", available=10.0)


def test_servers_over_the_headroom_are_refused_with_the_fix():
    with pytest.raises(UserError, match=r"--servers together: 3 servers up at once need about 9\.0 GiB .* "
                                         r"10\.0 GiB available; pass --servers one"):
        check_held_memory([(Sized(3.0), k) for k in range(3)], "together", available=10.0)


def test_unknown_sizes_or_memory_pass():
    check_held_memory([(Sized(None), 0)] * 8, "kept", available=1.0)
    check_held_memory([(Sized(50.0), 0)], "kept", available=None)


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25000000 kB\nMemAvailable:   20971520 kB\n")
    assert available_gib(meminfo) == 20.0


def test_unreadable_meminfo_is_unknown(tmp_path):
    assert available_gib(tmp_path / "missing") is None


def test_a_bundled_cpu_server_holds_its_cache_budget_and_the_base():
    backend = LocalBackend(BackendOptions(server_args=["--kv-cache-gb", "3.5", "--device", "cpu"]))
    assert backend.server_memory_gib(2) == pytest.approx(3.5 + SERVER_BASE_GIB)


@pytest.mark.skipif(available_gib() is None, reason="no /proc/meminfo here")
def test_validate_refuses_held_servers_that_cannot_fit_before_starting_any(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(4)))
    config = tmp_path / "schedule.json"
    config.write_text(json.dumps([[1, 64, 1]]))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "spectune.cli", "validate", "--config", str(config), "--steps", "0,1",
                           "--servers", "together", "--server-args", "--kv-cache-gb 100000", "--dataset",
                           f"jsonl:{prompts}", "--num-prompts", "4", "--max-tokens", "8", "--output-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--servers together: 2 servers up at once need about" in proc.stderr  # static 0 and 1 (the config is K=1)
    assert "Traceback" not in proc.stderr
    assert "spectune.backends.local" not in proc.stdout + proc.stderr  # no server was launched
