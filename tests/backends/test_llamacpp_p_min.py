"""llama.cpp's draft-confidence cutoff (``--spec-draft-p-min``, ``common/speculative.cpp``
``common_speculative_impl_draft_eagle3``): the launch arguments a backend declares for it, the settings file that
carries it to ``spectune validate``, and one real ``llama-server`` that drafts shorter than its cap under it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.backends import make_backend, p_min_backends
from spectune.backends.llamacpp.settings import read_p_min, settings_json
from spectune.backends.options import BackendOptions, LlamaCppOptions
from spectune.core.errors import UserError
from spectune.validate.plan import static_equivalent
from helpers.llamacpp import SERVER, needs_server




def backend(tmp_path: Path, **kw):
    gguf, head = tmp_path / "target.gguf", tmp_path / "head.gguf"
    gguf.write_bytes(b"GGUF")
    head.write_bytes(b"GGUF")
    return make_backend("llamacpp", BackendOptions(model=str(gguf), draft=str(head), max_concurrency=2, **kw))


def settings_file(tmp_path: Path, steps: int, p_min: float | None) -> Path:
    path = tmp_path / "llamacpp-settings.json"
    path.write_text(json.dumps(settings_json(steps, p_min=p_min)))
    return path


def test_the_llamacpp_backend_declares_the_cutoff_flag(tmp_path):
    assert backend(tmp_path).p_min_args(0.3) == ["--spec-draft-p-min", "0.3"]


def test_a_backend_without_the_knob_declares_none():
    assert make_backend("openai", BackendOptions(endpoints={-1: "http://127.0.0.1:9"})).p_min_args(0.3) is None


def test_running_llama_servers_cannot_be_given_a_cutoff():
    assert make_backend("llamacpp", BackendOptions(endpoints={-1: "http://127.0.0.1:9"})).p_min_args(0.3) is None


def test_the_backends_that_take_a_cutoff_are_listed():
    assert {"llamacpp (--spec-draft-p-min)", "local (--draft-p-min)"} <= set(p_min_backends())


def test_a_server_with_a_draft_gets_the_cutoff(tmp_path):
    argv = backend(tmp_path, draft_p_min=0.6).build_argv(3, "127.0.0.1", 8000)
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0.6"


def test_a_server_without_a_draft_gets_no_cutoff(tmp_path):
    assert "--spec-draft-p-min" not in backend(tmp_path, draft_p_min=0.6).build_argv(0, "127.0.0.1", 8000)


def test_server_args_still_come_after_the_cutoff(tmp_path):
    argv = backend(tmp_path, draft_p_min=0.6, server_args=["--spec-draft-p-min", "0.1"]).build_argv(3, "h", 1)
    assert argv[-2:] == ["--spec-draft-p-min", "0.1"]


def test_settings_with_a_cutoff_give_it_to_the_config_server(tmp_path):
    b = backend(tmp_path, adaptive_config=str(settings_file(tmp_path, 4, 0.3)))
    assert b.build_argv(4, "h", 1)[-2:] == ["--spec-draft-p-min", "0.3"]


def test_settings_without_a_cutoff_are_still_refused_as_a_config(tmp_path):
    with pytest.raises(UserError, match="no per-batch-size num_steps"):
        backend(tmp_path, adaptive_config=str(settings_file(tmp_path, 4, None)))


def test_a_cutoff_outside_zero_to_one_is_refused(tmp_path):
    path = settings_file(tmp_path, 4, 0.3)
    path.write_text(path.read_text().replace('"spec_draft_p_min": 0.3', '"spec_draft_p_min": 3'))
    with pytest.raises(ValueError, match="spec_draft_p_min"):
        read_p_min(path)


def test_settings_with_a_cutoff_are_not_a_static_num_steps(tmp_path):
    assert static_equivalent(str(settings_file(tmp_path, 4, 0.3))) is None


def test_settings_with_a_zero_cutoff_are_the_static_num_steps(tmp_path):
    assert static_equivalent(str(settings_file(tmp_path, 4, 0.0)))[0] == 4


# -- a real llama-server -----------------------------------------------------------------------------------------
@needs_server
async def test_a_real_server_under_a_cutoff_drafts_fewer_than_its_cap(tmp_path):
    """The default pair at ``--spec-draft-n-max 3 --spec-draft-p-min 0.9``: draft tokens per drafting verify step
    (``/metrics`` counters) below 3, where a static server drafts exactly 3."""
    from spectune.loadgen import ClientConfig, ClosedLoop, Constraints, StreamingClient, run_point
    from spectune.loadgen.datasets import load_dataset

    b = make_backend("llamacpp", BackendOptions(max_concurrency=1, max_tokens=24, draft_p_min=0.9,
                                                llamacpp=LlamaCppOptions(server_bin=SERVER),
                                                log_dir=tmp_path / "logs"))
    await b.preflight([3])
    try:
        endpoint = await b.start(3)
        config = ClientConfig(endpoint.base_url, model="m", max_tokens=24, extra_body=b.request_extra(),
                              reuse_connections=b.reuse_connections)
        async with StreamingClient(config) as client:
            before = await b.snapshot()
            await run_point(client, load_dataset("mt-bench", 1, 0), ClosedLoop(1), Constraints(max_requests=1))
            after = await b.snapshot()
    finally:
        await b.close()
    drafts = after.num_drafts - before.num_drafts
    assert (after.num_draft_tokens - before.num_draft_tokens) / drafts < 3
