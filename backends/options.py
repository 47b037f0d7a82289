"""What a backend is built with: the options every backend reads (:class:`BackendOptions`), each engine's own
settings in its own record (:class:`BundledEngineOptions`, :class:`LlamaCppOptions`), and a ready server
(:class:`Endpoint`). Plain frozen records: the interface (:mod:`spectune.backends.base`) and every caller that builds
options import them from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Endpoint:
    """A ready OpenAI-compatible server.

    Attributes:
        base_url: scheme://host:port with no trailing slash and no ``/v1`` (``http://127.0.0.1:8000``).
        model: the model name to put in requests, or None to use the first id from ``GET /v1/models``.
    """

    base_url: str
    model: str | None = None


@dataclass(frozen=True)
class BundledEngineOptions:
    """What only the bundled engine (``--backend local``, :mod:`spectune.backends.local`) reads of the command line.

    Attributes:
        device: ``auto`` (cuda when available), ``cpu`` or ``cuda``.
        dtype: the compute path: ``auto``, ``native``, ``bfloat16`` or ``float32`` (docs/engine.md "Compute paths").
        compile: ``auto``, ``on`` or ``off``: torch.compile of the target's decode layers on CPU (docs/engine.md
            "Compiled decode layers").
    """

    device: str = "auto"
    dtype: str = "auto"
    compile: str = "auto"


@dataclass(frozen=True)
class LlamaCppOptions:
    """What only llama.cpp's backend (``--backend llamacpp``, :mod:`spectune.backends.llamacpp`) reads.

    Attributes:
        server_bin: the ``llama-server`` program to run, or None to search for it
            (:func:`spectune.backends.llamacpp.install.find_llama_server`).
    """

    server_bin: str | None = None


@dataclass(frozen=True)
class BackendOptions:
    """Everything the CLI may pass to a backend: the settings every engine's backend reads, and one record per
    engine for the settings only that engine has (:class:`BundledEngineOptions`, :class:`LlamaCppOptions`), so a
    backend's own settings are named by its record. Frozen: a caller that sizes the servers for a plan
    (``max_concurrency``, ``max_tokens``, ``log_dir``) makes a copy with :func:`dataclasses.replace`.

    Attributes:
        endpoints: already-running servers (``openai``, ``sglang``, ``vllm``): num_steps -> base URL; key ``-1``
            means one URL for every num_steps.
        launch: a command template (``launch`` backend) with ``{steps}``, ``{draft_tokens}``, ``{port}``,
            ``{model}``, ``{draft}`` placeholders, split with :func:`shlex.split` and run without a shell.
        model: target model path or name.
        draft: draft head path or name (None: the backend's default, if any).
        algorithm: speculative method name in the engine's spelling (``EAGLE``/``EAGLE3`` for SGLang,
            ``eagle``/``eagle3`` for vLLM), or None to infer it from the head's config.json.
        host: interface launched servers bind to (loopback by default).
        port: port for launched servers; None picks a free one.
        server_args: extra arguments appended to launched servers' command lines.
        startup_timeout_s: s to wait for a launched server to answer its health check.
        log_dir: folder for launched servers' logs (the results folder's ``logs/``), or None.
        max_concurrency: the highest concurrency the sweep will drive (servers are sized for it).
        api_key_env: name of the environment variable holding the API key sent as a Bearer token.
        max_tokens: the longest output the sweep will request (servers are sized for it).
        adaptive_config: path of a per-batch-size num_steps config for the server to run instead of a static
            num_steps (``spectune validate``): an SGLang ``--speculative-adaptive-config`` JSON (``sglang``, ``local``)
            or a vLLM ``num_speculative_tokens_per_batch_size`` schedule (``vllm``, ``local``); with it, the K passed
            to ``start`` is only the initial tier (SGLang, bundled engine) or the maximum (vLLM). ``launch``
            templates get it as ``{adaptive_config}``. None: static num_steps.
        schedule_server_max_k: when set, every ``start(K)`` launches the engine's *schedule server* pinned to K: the
            server a per-batch-size config whose largest K is this value runs, told to use K at every batch size
            (:meth:`Backend.schedule_server`; ``spectune sweep --schedule-server``). None: the static server of K
            (K = 0: no drafter at all).
        draft_p_min: when set, every server with a drafter (K > 0) also gets this draft-confidence cutoff P: a row
            stops drafting at the first draft token whose probability is under P, K caps the draft
            (:meth:`Backend.p_min_args`; ``spectune sweep --p-min``). None: the engine's default (llama.cpp: 0.0,
            never stop early).
        local: the bundled engine's own settings.
        llamacpp: llama.cpp's own settings.
    """

    endpoints: dict[int, str] | None = None
    launch: str | None = None
    model: str | None = None
    draft: str | None = None
    algorithm: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    server_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 600.0
    log_dir: Path | None = None
    max_concurrency: int = 1
    api_key_env: str = "OPENAI_API_KEY"
    max_tokens: int = 256
    adaptive_config: str | None = None
    schedule_server_max_k: int | None = None
    draft_p_min: float | None = None
    local: BundledEngineOptions = field(default_factory=BundledEngineOptions)
    llamacpp: LlamaCppOptions = field(default_factory=LlamaCppOptions)
