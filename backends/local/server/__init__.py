"""The bundled engine's HTTP side: the aiohttp server (``app``), the OpenAI-compatible request and response models
(``protocol``) and its Prometheus metrics (``metrics``)."""
