"""spectune: benchmark and tune speculative decoding (EAGLE num_steps per batch size) for LLM serving."""

__version__ = "0.1.0"
