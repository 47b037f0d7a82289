"""The bundled engine's run time: the engine loop (``loop``), admission and slots (``scheduler``), a request inside
the engine (``sequence``), the speculative step (``speculative``), draft verification (``sampling``), tokenization
(``tokenizer``), and the two ways of running the target's forwards faster (``compiled``: torch.compile on CPU;
``cuda_graphs``: captured graphs on CUDA)."""
