"""What the bundled engine loads and how it computes with it: target weights from a Hugging Face folder or a GGUF
file (``loader``), EAGLE head checkpoints (``heads``), the GGUF's quantized weights run natively (``quant``), and the
compute path chosen per machine (``compute_paths``)."""
