"""``spectune draft export``: an EAGLE-3 head as the GGUF llama.cpp loads (``backends/llamacpp/head_gguf.py``).

Real components only: the bundled head, the embedded SmolLM2 target GGUF, llama.cpp's own converter from the kept
source tree (``spectune llamacpp install``) and a real ``llama-server``; tests that need the last two skip with the
reason when they are absent.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from spectune.backends.llamacpp.backend import cpu_workarounds
from spectune.backends.llamacpp.head_gguf import cached_head_gguf, export_head_gguf
from spectune.backends.llamacpp.install import find_llama_server, llama_cpp_source_dir, server_features
from spectune.backends.local.options import DEFAULT_HEAD
from spectune.backends.local.weights.loader import default_model_path
from spectune.core.errors import UserError
from helpers.paths import ROOT as REPO_ROOT

ROOT = REPO_ROOT
#: Keys spectune's file may have and the converter's lacks (documented in head_gguf's module docstring).
DOCUMENTED_EXTRA_KEYS = {"tokenizer.ggml.add_space_prefix"}
PROMPTS = ["Write a short poem about the sea.", "Give me three tips for learning Python."]


@pytest.fixture(scope="module")
def target() -> Path:
    return default_model_path()


@pytest.fixture(scope="module")
def own_gguf(tmp_path_factory: pytest.TempPathFactory, target: Path) -> Path:
    return export_head_gguf(DEFAULT_HEAD, target, tmp_path_factory.mktemp("own") / "head.gguf")


@pytest.fixture(scope="module")
def converter_gguf(tmp_path_factory: pytest.TempPathFactory, target: Path) -> Path:
    tree = llama_cpp_source_dir()
    if tree is None:
        pytest.skip("no llama.cpp source tree with convert_hf_to_gguf.py: run `spectune llamacpp install`")
    if importlib.util.find_spec("sentencepiece") is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py imports sentencepiece: pip install sentencepiece")
    return export_head_gguf(DEFAULT_HEAD, target, tmp_path_factory.mktemp("conv") / "head.gguf", tree)


def _dump(path: Path) -> tuple[dict, list]:
    """Every KV field (types, value) and every tensor (name, shape, type, bytes) via the gguf package's reader."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    kv = {k: (list(f.types), f.contents()) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [(t.name, [int(x) for x in t.shape], t.tensor_type.name, np.asarray(t.data).tobytes())
               for t in reader.tensors]
    return kv, tensors


@pytest.fixture(scope="module")
def own_dump(own_gguf: Path) -> tuple[dict, list]:
    return _dump(own_gguf)


@pytest.fixture(scope="module")
def dumps(own_dump, converter_gguf: Path) -> tuple[tuple[dict, list], tuple[dict, list]]:
    return own_dump, _dump(converter_gguf)


# --- spectune's writer against llama.cpp's converter -----------------------------------------------------------


def test_writer_has_every_converter_key(dumps) -> None:
    (own, _), (conv, _) = dumps
    assert set(conv) - set(own) == set()


def test_writer_adds_only_documented_keys(dumps) -> None:
    (own, _), (conv, _) = dumps
    assert set(own) - set(conv) <= DOCUMENTED_EXTRA_KEYS


def test_writer_key_types_and_values_equal_converter(dumps) -> None:
    (own, _), (conv, _) = dumps
    assert [k for k in conv if k in own and own[k] != conv[k]] == []


def test_writer_tensor_names_shapes_types_equal_converter(dumps) -> None:
    (_, own), (_, conv) = dumps
    assert [t[:3] for t in own] == [t[:3] for t in conv]


def test_writer_tensor_data_equal_converter(dumps) -> None:
    (_, own), (_, conv) = dumps
    assert [t[0] for t in own if t[3] != dict((c[0], c[3]) for c in conv).get(t[0])] == []


# --- what the written file holds, checked without the converter --------------------------------------------------


def _tensor(dump: tuple[dict, list], name: str) -> bytes:
    return next(t[3] for t in dump[1] if t[0] == name)


def test_d2t_holds_absolute_target_ids(own_dump) -> None:
    from safetensors import safe_open

    with safe_open(str(DEFAULT_HEAD / "model.safetensors"), "np") as f:
        offsets = f.get_tensor("d2t")
    assert _tensor(own_dump, "d2t") == (offsets + np.arange(offsets.size)).astype("<i8").tobytes()


def test_q_rows_are_permuted_for_llama_cpp_rope(own_dump) -> None:
    import torch
    from safetensors.torch import load_file

    q = load_file(str(DEFAULT_HEAD / "model.safetensors"))["midlayer.self_attn.q_proj.weight"]
    n_head = json.loads((DEFAULT_HEAD / "config.json").read_text())["num_attention_heads"]
    expected = q.reshape(n_head, 2, q.shape[0] // n_head // 2, q.shape[1]).swapaxes(1, 2).reshape(q.shape)
    assert _tensor(own_dump, "blk.0.attn_q.weight") == expected.contiguous().view(torch.int16).numpy().tobytes()


# --- a real llama-server -----------------------------------------------------------------------------------------


def _server_binary() -> Path:
    try:
        binary = find_llama_server()
    except UserError as err:
        pytest.skip(f"no llama-server: {err}")
    if not server_features(str(binary)).eagle3:
        pytest.skip(f"{binary} has no --spec-type draft-eagle3")
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def _serve_and_ask(binary: Path, target: Path, head: Path, log: Path) -> tuple[list[str], float]:
    """Greedy chat outputs (32 tokens) for PROMPTS and ``spec_decode_num_drafts_total`` from ``/metrics``."""
    port = _free_port()
    argv = [str(binary), "-m", str(target), "-md", str(head), "--spec-type", "draft-eagle3", "--spec-draft-n-max",
            "3", "--metrics", "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-c", "2048", "-np", "1",
            *cpu_workarounds()]
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while _get(base + "/health")[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                pytest.fail(f"llama-server did not become healthy (exit {proc.poll()}): {' | '.join(tail)}")
            time.sleep(0.2)
        outputs = []
        for prompt in PROMPTS:
            body = json.dumps({"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                               "max_tokens": 32}).encode()
            req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                outputs.append(json.loads(r.read())["choices"][0]["message"]["content"])
        metrics = _get(base + "/metrics", timeout=30)[1]
        drafts = sum(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith(("llamacpp:spec_decode_num_drafts_total ", "llamacpp:spec_decode_num_drafts ")))
        return outputs, drafts
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def own_served(own_gguf: Path, target: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], float]:
    binary = _server_binary()
    return _serve_and_ask(binary, target, own_gguf, tmp_path_factory.mktemp("srv") / "own.log")


def test_llama_server_drafts_with_written_head(own_served) -> None:
    _, drafts = own_served
    assert drafts > 0


def test_llama_server_greedy_output_same_as_converter_file(own_served, converter_gguf: Path, target: Path,
                                                           tmp_path: Path) -> None:
    outputs, _ = own_served
    reference, _ = _serve_and_ask(_server_binary(), target, converter_gguf, tmp_path / "conv.log")
    assert outputs == reference


# --- bad input: one-line UserError -------------------------------------------------------------------------------


def _head_copy(tmp_path: Path, **config_changes) -> Path:
    """The bundled head's config (changed) beside a link to its weights."""
    folder = tmp_path / "head"
    folder.mkdir()
    cfg = json.loads((DEFAULT_HEAD / "config.json").read_text())
    cfg.update(config_changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").symlink_to(DEFAULT_HEAD / "model.safetensors")
    return folder


def test_missing_head_folder_is_a_user_error(tmp_path: Path, target: Path) -> None:
    with pytest.raises(UserError, match="is not a folder"):
        export_head_gguf(tmp_path / "no-such-head", target, tmp_path / "out.gguf")


def test_eagle1_head_is_a_user_error(tmp_path: Path, target: Path) -> None:
    folder = tmp_path / "eagle1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle"], "model_type": "llama",
                                                    "hidden_size": 576, "num_hidden_layers": 1,
                                                    "vocab_size": 49152}))
    with pytest.raises(UserError, match="not an EAGLE-3 head"):
        export_head_gguf(folder, target, tmp_path / "out.gguf")


def test_full_model_as_head_is_a_user_error(tmp_path: Path, target: Path) -> None:
    folder = tmp_path / "full"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": 30, "vocab_size": 49152}))
    with pytest.raises(UserError, match="not an EAGLE-3 head"):
        export_head_gguf(folder, target, tmp_path / "out.gguf")


def test_head_vocab_other_than_target_is_a_user_error(tmp_path: Path, target: Path) -> None:
    with pytest.raises(UserError, match="vocab_size 32000 but target"):
        export_head_gguf(_head_copy(tmp_path, vocab_size=32000), target, tmp_path / "out.gguf")


def test_d2t_beyond_target_vocab_is_a_user_error(tmp_path: Path, target: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _head_copy(tmp_path)
    tensors = load_file(str(DEFAULT_HEAD / "model.safetensors"))
    tensors["d2t"] = tensors["d2t"] + 49152
    (folder / "model.safetensors").unlink()
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(UserError, match="outside the target's 49152 tokens"):
        export_head_gguf(folder, target, tmp_path / "out.gguf")


def test_unreadable_target_is_a_user_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    with pytest.raises(UserError, match="cannot read target"):
        export_head_gguf(DEFAULT_HEAD, broken, tmp_path / "out.gguf")


def test_failed_export_leaves_no_output_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(UserError):
        export_head_gguf(DEFAULT_HEAD, broken, tmp_path / "out.gguf")
    assert list(tmp_path.iterdir()) == [broken]


def _head_with_extra_tensor(tmp_path: Path) -> Path:
    """A head with a tensor (``extra_proj.weight``) that llama.cpp's EAGLE-3 model has no name for."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = _head_copy(tmp_path)
    tensors = load_file(str(DEFAULT_HEAD / "model.safetensors"))
    tensors["extra_proj.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    (folder / "model.safetensors").unlink()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_tensor_llama_cpp_lacks_is_a_user_error(tmp_path: Path, target: Path) -> None:
    with pytest.raises(UserError, match="has tensor 'extra_proj.weight', which llama.cpp's EAGLE-3 model does not"):
        export_head_gguf(_head_with_extra_tensor(tmp_path), target, tmp_path / "out.gguf")


def test_converter_failure_is_a_one_line_user_error(tmp_path: Path, target: Path, converter_gguf: Path) -> None:
    with pytest.raises(UserError, match=r"convert_hf_to_gguf.py failed on .*: .*extra_proj") as err:
        export_head_gguf(_head_with_extra_tensor(tmp_path), target, tmp_path / "out.gguf", llama_cpp_source_dir())
    assert "\n" not in str(err.value)


def test_llama_cpp_dir_without_converter_is_a_user_error(tmp_path: Path, target: Path) -> None:
    with pytest.raises(UserError, match="has no convert_hf_to_gguf.py"):
        export_head_gguf(DEFAULT_HEAD, target, tmp_path / "out.gguf", llama_cpp_dir=tmp_path)


# --- the cache --------------------------------------------------------------------------------------------------


def test_cached_head_gguf_writes_once_and_reuses(tmp_path: Path, target: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(tmp_path))
    first = cached_head_gguf(DEFAULT_HEAD, target)
    before = first.stat()
    second = cached_head_gguf(DEFAULT_HEAD, target)
    after = second.stat()
    assert (second, after.st_ino, after.st_mtime_ns) == (first, before.st_ino, before.st_mtime_ns)


def test_cached_head_gguf_lives_under_the_cache_dir(tmp_path: Path, target: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(tmp_path))
    path = cached_head_gguf(DEFAULT_HEAD, target)
    assert path.parent == tmp_path / "llamacpp-heads"


# --- the command ------------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectune.cli", "draft", "export", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_export_writes_the_file_it_names(tmp_path: Path, own_gguf: Path) -> None:
    from typer.testing import CliRunner

    from spectune.cli import app

    out = tmp_path / "head.gguf"
    result = CliRunner().invoke(app, ["draft", "export", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out} (")
    assert out.read_bytes() == own_gguf.read_bytes()


def test_cli_bad_head_is_one_line_error(tmp_path: Path) -> None:
    proc = _cli("--output", str(tmp_path / "x.gguf"), "--head", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: draft head {tmp_path / 'missing'} is not a folder: give an "
                                                "EAGLE-3 head folder (config.json + model.safetensors), or omit "
                                                "--head for the bundled one"]
