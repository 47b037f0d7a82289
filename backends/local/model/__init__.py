"""The bundled engine's networks: the Llama-family target (``target``) and its configuration (``config``), the EAGLE
draft heads (``eagle``), and the layers they share (``attention`` over the slot KV cache in ``kv_cache``, ``rope``,
``linear``)."""
