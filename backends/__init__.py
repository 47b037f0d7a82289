"""Sweep targets: start/select a server per num_steps, read its spec-decode metrics, stop it.

``make_backend(name, options)`` builds one of :data:`BACKEND_NAMES` and validates its options at once, so a bad
command line fails before anything is measured:

- ``openai``: already-running OpenAI-compatible servers (``options.endpoints``), never launched or stopped.
- ``launch``: any server from a command template (``options.launch``) with ``{steps}``, ``{draft_tokens}``,
  ``{port}``, ``{model}``, ``{draft}``, ``{host}``, ``{adaptive_config}`` placeholders.
- ``sglang`` / ``vllm``: launch SGLang / vLLM with the right speculative flags per num_steps (or use running
  servers given as ``options.endpoints``), with engine-specific acceptance metrics.
- ``llamacpp``: llama.cpp's ``llama-server`` per num_steps (``spectune.backends.llamacpp``), EAGLE-3 heads as GGUF.
- ``local``: the bundled PyTorch EAGLE engine (``spectune.backends.local``).

After construction the sweep calls ``await backend.preflight(steps_list)`` once (missing endpoints or
executables, unreachable servers and busy ports raise ``UserError``; it returns warnings to show), then the
lifecycle of :mod:`spectune.backends.base` per point.
"""

from __future__ import annotations

import importlib

from spectune.backends.base import Backend
from spectune.backends.options import BackendOptions
from spectune.core.errors import UserError

BACKENDS: dict[str, tuple[str, str]] = {
    "openai": ("spectune.backends.openai", "OpenAIBackend"),
    "launch": ("spectune.backends.launch", "LaunchBackend"),
    "sglang": ("spectune.backends.sglang", "SGLangBackend"),
    "vllm": ("spectune.backends.vllm", "VLLMBackend"),
    "llamacpp": ("spectune.backends.llamacpp.backend", "LlamaCppBackend"),
    "local": ("spectune.backends.local.backend", "LocalBackend"),
}
"""The one registry: backend name (``--backend``, sweep.json's ``backend.backend``) -> (module, class). Modules are
imported only when their backend is asked for, so ``spectune --help`` and a remote sweep never import an engine's
package; this module imports only the interface and its option records."""
BACKEND_NAMES = tuple(BACKENDS)


def _load(key: str) -> type[Backend]:
    module, cls = BACKENDS[key]
    return getattr(importlib.import_module(module), cls)


def backend_class(name: str) -> type[Backend] | None:
    """The class of the backend called ``name`` (as in sweep.json's ``backend.backend``), or None if unknown."""
    key = (name or "").strip().lower()
    if key not in BACKENDS:
        return None
    try:
        return _load(key)
    except ModuleNotFoundError:
        return None


def p_min_backends() -> list[str]:
    """``NAME (FLAG)`` of every backend whose servers take a draft-confidence cutoff (:attr:`Backend.p_min_flag`),
    in registry order: what a ``--p-min`` error names."""
    out = []
    for name in BACKENDS:
        cls = backend_class(name)
        if cls is not None and cls.p_min_flag is not None:
            out.append(f"{name} ({cls.p_min_flag})")
    return out


def draft_algorithm(description: dict | None) -> tuple[str | None, str]:
    """The speculative method (lower case: ``"eagle"``, ``"eagle3"``, ...) of the draft head a recorded sweep used,
    and how it was found, from its sweep.json ``backend`` description (:meth:`Backend.draft_algorithm` of the
    backend named there); ``(None, "unknown")`` when the description does not tell."""
    if not isinstance(description, dict):
        return None, "unknown"
    cls = backend_class(str(description.get("backend", "")))
    return (cls or Backend).draft_algorithm(description)


def draft_head(description: dict | None) -> str | None:
    """The draft head (a path or hub id) a recorded sweep loaded, from its sweep.json ``backend`` description: its
    ``draft``; with none recorded and no ``model`` either, on a backend that runs the embedded default pair
    (:attr:`Backend.embeds_default_pair`), the bundled head folder on this machine; else None."""
    if not isinstance(description, dict):
        return None
    if description.get("draft"):
        return str(description["draft"])
    cls = backend_class(str(description.get("backend", "")))
    if cls is None or not cls.embeds_default_pair:
        return None
    from spectune.backends.local.options import DEFAULT_HEAD  # the default pair, read once a backend embeds it
    from spectune.backends.local.weights.loader import is_default_model

    return str(DEFAULT_HEAD) if is_default_model(description.get("model") or None) else None


def make_backend(name: str, options: BackendOptions) -> Backend:
    """Build and validate the backend called ``name``.

    Raises:
        UserError: an unknown name (listing the valid ones), options that backend cannot work with (missing
            endpoints, template or model; a malformed URL; a bad placeholder), or ``local`` before the bundled
            engine exists.
    """
    key = (name or "").strip().lower()
    if options.max_concurrency < 1:
        raise UserError(f"max concurrency must be >= 1, got {options.max_concurrency}")
    if key not in BACKENDS:
        raise UserError(f"unknown backend {name!r}: use one of {', '.join(BACKEND_NAMES)}")
    return _load(key)(options)


__all__ = ["BACKENDS", "BACKEND_NAMES", "Backend", "BackendOptions", "backend_class", "draft_algorithm",
           "draft_head", "make_backend", "p_min_backends"]
