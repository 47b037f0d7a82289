"""The bundled engine: a small continuous-batching server for a Llama-family target with an EAGLE-1/EAGLE-3 draft
head (chain drafting, paged KV cache, OpenAI-compatible HTTP, Prometheus metrics), and its :class:`LocalBackend`
lifecycle. docs/engine.md describes it; ``python -m spectune.backends.local`` runs its server."""
