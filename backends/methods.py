"""The draft algorithm, spelled once: spectune's method names (lower case, as :func:`spectune.backends.eagle_heads
.eagle_version` and sweep.json's ``draft_algorithm`` write them) and how each engine spells them.

- SGLang: ``--speculative-algorithm EAGLE|EAGLE3`` (``python/sglang/srt/speculative/spec_info.py``,
  ``SpeculativeAlgorithm``: upper-case names; any other algorithm is passed upper-cased).
- vLLM: ``--speculative-config '{"method": "eagle"|"eagle3", ...}'`` (``vllm/config/speculative.py``,
  ``SpeculativeConfig.method``: lower-case names; any other method is passed lower-cased).
- llama.cpp: ``--spec-type draft-eagle3`` for an EAGLE-3 head, ``draft-simple`` for a classic draft model
  (``common/speculative.cpp`` type names); llama.cpp has no EAGLE-1.
"""

from __future__ import annotations

from typing import Callable

from spectune.backends.eagle_heads import eagle_version

DEFAULT_METHOD = "eagle"
"""The method assumed when neither an option nor the head's config tells (SGLang and vLLM)."""

SPELLINGS: dict[str, dict[str, str]] = {
    "sglang": {"eagle": "EAGLE", "eagle3": "EAGLE3"},
    "vllm": {"eagle": "eagle", "eagle3": "eagle3"},
    "llamacpp": {"eagle3": "draft-eagle3", "draft": "draft-simple"},
}
"""Engine -> {spectune's method name: the engine's spelling} (see the module docstring for the sources)."""

_OTHER: dict[str, Callable[[str], str]] = {"sglang": str.upper, "vllm": str.lower}
"""How an engine spells a method the table does not list."""


def engine_method(engine: str, method: str | None) -> str | None:
    """``engine``'s spelling of ``method`` (any case; None: :data:`DEFAULT_METHOD`): the table's, else the name in
    the engine's case (SGLang upper, vLLM lower), else None (an engine that takes only the listed methods)."""
    name = method.lower() if method else DEFAULT_METHOD
    table = SPELLINGS[engine]
    if name in table:
        return table[name]
    other = _OTHER.get(engine)
    return other(method or name) if other is not None else None


def launch_method(engine: str, option: str | None, draft: str | None) -> tuple[str, str]:
    """(``engine``'s spelling of the method to launch, how it was decided): the ``--algorithm`` ``option``, else
    the ``draft`` head's EAGLE version (:func:`~spectune.backends.eagle_heads.eagle_version`: its config.json or
    name), else :data:`DEFAULT_METHOD`."""
    if option:
        return engine_method(engine, option) or option, "option"
    if draft:
        version, source = eagle_version(draft)
        return engine_method(engine, version) or version, source
    return engine_method(engine, None) or DEFAULT_METHOD, "default"


def spellings(engine: str, *methods: str) -> tuple[str, ...]:
    """``engine``'s spellings of ``methods`` (default: every method it lists), in that order."""
    table = SPELLINGS[engine]
    return tuple(table[m] for m in (methods or table))


__all__ = ["DEFAULT_METHOD", "SPELLINGS", "engine_method", "launch_method", "spellings"]
