"""llama.cpp: the ``llamacpp`` sweep backend (:mod:`spectune.backends.llamacpp.backend`), finding or building
``llama-server`` (:mod:`spectune.backends.llamacpp.install`) and writing EAGLE-3 heads as GGUF files
(:mod:`spectune.backends.llamacpp.head_gguf`)."""
