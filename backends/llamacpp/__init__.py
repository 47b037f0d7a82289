"""llama.cpp: the ``llamacpp`` sweep backend (:mod:`backends.llamacpp.backend`), finding or building
``llama-server`` (:mod:`backends.llamacpp.install`) and writing EAGLE-3 heads as GGUF files
(:mod:`backends.llamacpp.head_gguf`)."""
