"""The bundled engine: a small continuous-batching server for a Llama-family target with an EAGLE-1/EAGLE-3 draft
head (chain drafting, slot KV cache, OpenAI-compatible HTTP, Prometheus metrics), and its :class:`LocalBackend`
lifecycle (``backend``). By concern: ``server`` (HTTP), ``engine`` (the loop, scheduling, the speculative step),
``model`` (target, draft head, layers), ``weights`` (loading, quantized weights, compute path); ``options`` and
``build`` assemble an engine. docs/engine.md describes it; ``python -m spectune.backends.local`` runs its server."""
