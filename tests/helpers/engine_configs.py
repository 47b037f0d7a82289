"""A recommendation's engine configs as the formats write them (:mod:`spectune.backends.formats`), from the
:class:`~spectune.tune.recommend.Recommendation` the tests build: each goes through
:func:`spectune.tune.configs.engine_plan` as ``spectune recommend`` does."""

from __future__ import annotations

from typing import Any

from spectune.backends.formats.llamacpp import llamacpp_settings as _llamacpp_settings
from spectune.backends.formats.trtllm import trtllm_config as _trtllm_config
from spectune.backends.formats.vllm import vllm_config as _vllm_config
from spectune.tune.configs import engine_plan, static_choice
from spectune.tune.recommend import Recommendation


def vllm_config(rec: Recommendation, method: str | None = None, head: str | None = None) -> dict[str, Any] | None:
    """vllm-speculative-config.json for ``rec`` (``method``: the draft head's, ``head``: its path)."""
    return _vllm_config(engine_plan(rec, algorithm=(method, "test"), head=head))


def trtllm_config(rec: Recommendation, version: str | None = None) -> dict[str, Any] | None:
    """trtllm-speculative-config.json for ``rec`` and TensorRT-LLM ``version`` (its warnings go to rec.warnings)."""
    return _trtllm_config(engine_plan(rec), version)


def llamacpp_settings(rec: Recommendation) -> dict[str, Any] | None:
    """llamacpp-settings.json for ``rec``."""
    return _llamacpp_settings(static_choice(rec))
