"""``--server-args`` reach the bundled engine's launched servers (backends/local/options.py parse_server_args), read
with ``spectune serve``'s own options, or fail as one line naming what the bundled engine accepts; never dropped."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from spectune.backends.options import BackendOptions
from spectune.backends.local.backend import LocalBackend
from spectune.backends.local.options import SERVER_ARGS, SWEEP_SETS, EngineOptions, parse_server_args
from spectune.core.errors import UserError

from helpers.paths import ROOT


def test_an_engine_option_is_read_as_its_field() -> None:
    assert parse_server_args(["--native-dense-above", "8"]) == {"native_dense_above": "8"}


def test_flag_equals_value_is_read_with_its_type() -> None:
    assert parse_server_args(["--threads=2", "--kv-cache-gb", "1.5"]) == {"threads": 2, "kv_cache_gb": 1.5}


def test_an_option_the_sweep_sets_names_where_to_set_it() -> None:
    with pytest.raises(UserError, match=r"--num-steps: the sweep sets it .*\(--steps\)"):
        parse_server_args(["--num-steps", "3"])


def test_an_unknown_option_names_what_the_engine_accepts() -> None:
    with pytest.raises(UserError, match="takes --dtype, --device, --native-dense-above"):
        parse_server_args(["--ctx-size", "4096"])


def test_a_value_outside_its_choices_is_an_error() -> None:
    with pytest.raises(UserError, match="--compile 'maybe': use one of auto, on, off"):
        parse_server_args(["--compile", "maybe"])


def test_a_value_of_the_wrong_type_is_an_error() -> None:
    with pytest.raises(UserError, match="--threads 'two': give an integer"):
        parse_server_args(["--threads", "two"])


def test_a_missing_value_is_an_error() -> None:
    with pytest.raises(UserError, match="--seed needs a value"):
        parse_server_args(["--seed"])


def test_every_serve_option_is_either_taken_or_set_by_the_sweep() -> None:
    """The table is spectune serve's options, no more and no fewer (a new serve option must be placed)."""
    from spectune.cli import app

    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    flags = {opt for p in serve.params for opt in p.opts if opt.startswith("--")}
    assert flags == set(SERVER_ARGS) | set(SWEEP_SETS)


def test_every_taken_option_is_an_engine_options_field() -> None:
    fields = set(EngineOptions.__dataclass_fields__)
    assert {name for name, _, _ in SERVER_ARGS.values()} <= fields


def test_the_launched_servers_options_carry_the_server_args() -> None:
    backend = LocalBackend(BackendOptions(server_args=["--native-dense-above", "8", "--dtype", "native"]))
    argv = backend.build_argv(2, "127.0.0.1", 8000)
    opts = json.loads(argv[argv.index("--options") + 1])
    assert (opts["native_dense_above"], opts["dtype"]) == ("8", "native")


def test_sweep_json_records_the_server_args() -> None:
    backend = LocalBackend(BackendOptions(server_args=["--native-dense-above", "8"]))
    assert backend.describe()["engine"]["server_args"] == {"native_dense_above": "8"}


def test_the_sweep_cli_rejects_a_bad_server_arg_in_one_line(tmp_path) -> None:
    run = subprocess.run([sys.executable, "-m", "spectune.cli", "sweep", "--steps", "0", "--concurrency", "1",
                          "--server-args", "--port 9000", "--output-dir", str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr.strip().count("\n"), "Traceback" in run.stderr) == (2, 0, False)
    assert "--server-args --port: the sweep sets it" in run.stderr


def test_cpu_kernels_reach_the_bundled_server() -> None:
    assert parse_server_args(["--cpu-kernels", "off"]) == {"cpu_kernels": "off"}


class _Running:
    """A launched server as the backend sees it between points."""

    base_url = "http://127.0.0.1:9"

    def alive(self) -> bool:
        return True


def _holding_server(**options) -> LocalBackend:
    backend = LocalBackend(BackendOptions(**options))
    backend.capacity = backend.server_capacity = 4
    backend.server = _Running()
    backend.launches.append({"steps": 4, "command": "python -m spectune.backends.local", "pid": 7, "port": 9})
    return backend


def _successor(**options) -> LocalBackend:
    backend = LocalBackend(BackendOptions(**options))
    backend.capacity = 4
    return backend


def test_a_cutoffs_backend_takes_over_the_static_server() -> None:
    static, cutoff = _holding_server(), _successor(draft_p_min=0.7)
    server = static.server
    assert asyncio.run(static.hand_over(cutoff)) is True
    assert (cutoff.server, static.server) == (server, None)
    assert cutoff.launches == [{"adopted": True, "command": "python -m spectune.backends.local", "port": 9, "pid": 7}]


def test_a_server_handed_on_twice_names_its_log_from_each_results_folder(tmp_path: Path) -> None:
    """sweep --p-min: the static sweep's server passes from cutoff to cutoff; each folder's sweep.json names the one
    log, relative to that folder (p-min/P/ sits two levels below the static folder)."""
    static = _holding_server(log_dir=str(tmp_path / "sweep" / "logs"))
    static.launches[-1]["log"] = str(tmp_path / "sweep" / "logs" / "server-steps0.log")
    first = _successor(draft_p_min=0.3, log_dir=str(tmp_path / "sweep" / "p-min" / "0.3" / "logs"))
    second = _successor(draft_p_min=0.5, log_dir=str(tmp_path / "sweep" / "p-min" / "0.5" / "logs"))
    assert asyncio.run(static.hand_over(first)) and asyncio.run(first.hand_over(second))
    assert second.launches[-1]["log"] == os.path.join("..", "..", "logs", "server-steps0.log")


def test_a_backend_for_another_server_shape_is_not_handed_the_server() -> None:
    static = _holding_server()
    assert asyncio.run(static.hand_over(_successor(draft_p_min=0.7, max_concurrency=8))) is False
    assert static.server is not None
