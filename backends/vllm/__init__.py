"""vLLM: the ``vllm`` backend (:mod:`.backend`), the vLLM it launches (:mod:`.install`: ``spectune vllm install``),
and a GGUF target as the HF folder vLLM loads (:mod:`.target`)."""

from spectune.backends.vllm.backend import (VLLMBackend, cpu_server_settings, data_parallel_size, detect_gpu,
                                            engine_count, kv_bytes_per_token, per_request_acceptance,
                                            spec_decoding_metrics, vllm_argv, vllm_default_max_num_seqs)
from spectune.backends.vllm.install import VllmInstall, find_vllm, install_vllm

__all__ = ["VLLMBackend", "VllmInstall", "cpu_server_settings", "data_parallel_size", "detect_gpu", "engine_count",
           "find_vllm", "install_vllm", "kv_bytes_per_token", "per_request_acceptance", "spec_decoding_metrics",
           "vllm_argv", "vllm_default_max_num_seqs"]
