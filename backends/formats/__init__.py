"""Engine config formats, registered in one place: each engine's files, launch line and ``best-static.json``
flags (:class:`~spectune.backends.formats.base.EngineFormat`), written from a plain-data
:class:`~spectune.backends.formats.base.Plan`. ``spectune recommend`` iterates :func:`engine_formats` and never
names an engine. Modules are imported when first asked for.
"""

from __future__ import annotations

import importlib

from spectune.backends.formats.base import ConfigFile, EngineFormat, Plan, StaticChoice

FORMATS: dict[str, tuple[str, str]] = {
    "sglang": ("spectune.backends.formats.sglang", "SGLangFormat"),
    "vllm": ("spectune.backends.formats.vllm", "VLLMFormat"),
    "trtllm": ("spectune.backends.formats.trtllm", "TRTLLMFormat"),
    "llamacpp": ("spectune.backends.formats.llamacpp", "LlamaCppFormat"),
}
"""The one registry: engine -> (module, class), in the order recommend writes files and recommendation.md lists
them."""


def engine_format(engine: str) -> EngineFormat:
    """The format of ``engine`` (a key of :data:`FORMATS`).

    Raises:
        KeyError: an unknown engine.
    """
    module, cls = FORMATS[engine]
    return getattr(importlib.import_module(module), cls)()


def engine_formats() -> list[EngineFormat]:
    """Every registered format, in :data:`FORMATS` order."""
    return [engine_format(engine) for engine in FORMATS]


__all__ = ["FORMATS", "ConfigFile", "EngineFormat", "Plan", "StaticChoice", "engine_format", "engine_formats"]
