"""The bundled engine behind an OpenAI-compatible HTTP server (aiohttp).

Routes: POST /v1/chat/completions, POST /v1/completions (stream and non-stream), GET /v1/models, /health,
/metrics (Prometheus), /server_info and /get_server_info (SGLang's shape: ``internal_states[0]`` with
``speculative_num_steps`` and ``avg_spec_accept_length``), POST /spectune/num_steps (change the static num_steps,
and the draft-confidence cutoff ``draft_p_min``, while idle; the ``local`` sweep backend uses it).

Hardening (docs/engine.md, "Bad requests"):

- every error, whatever raised it (validation, an unknown route, a body over the size limit, a bug), is an
  OpenAI-style JSON body ``{"error": {"message", "type", "param", "code"}}`` (:meth:`Server._errors`);
- request bodies are parsed and validated in one step (:mod:`spectune.backends.local.server.protocol`), then checked
  against the engine's limits (:meth:`spectune.backends.local.engine.loop.Engine.check_request`): 400 before anything
  reaches the engine;
- a request that still fails inside the engine fails alone (500 JSON, or an ``error`` event in a stream) and
  the engine keeps serving;
- with an API key, every route except ``/health`` (and ``/metrics`` when ``metrics_without_key``) needs
  ``Authorization: Bearer KEY``, compared in constant time (:func:`hmac.compare_digest`);
- a client that disconnects, streaming or not, has its sequence aborted: the app runner sets aiohttp's
  ``handler_cancellation`` (aiohttp docs, Web Server Advanced, "Peer disconnection": off by default since 3.9,
  where only a later read or write raises), so the handler of a non-streaming request is cancelled when its
  connection closes;
- tokenization (and the chat template) runs on a worker thread, never on the event loop, and prompts far longer
  than the context could hold are refused before tokenizing; large bodies are parsed on that thread too.

A full queue gets 503.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import signal
import sys
import threading
import time
import uuid
from typing import Awaitable, Callable, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from pydantic import ValidationError

from spectune.backends.local.engine.loop import Engine, EngineFull, InvalidRequest
from spectune.backends.local.engine.sequence import RequestOutput, SamplingParams
from spectune.backends.local.server import protocol as P
from spectune.backends.local.server.metrics import ServerMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
"""An aiohttp request handler, as a middleware receives it."""
R = TypeVar("R")

BIG_BODY_BYTES = 64 * 1024
"""Bodies larger than this are parsed on the worker thread (a few MB of JSON take tens of ms to parse)."""
MAX_BODY_BYTES = 64 * 2**20
"""aiohttp's ``client_max_size``: larger bodies get 413."""
BYTES_PER_TOKEN_BOUND = 8
"""A token covers at most ``BYTES_PER_TOKEN_BOUND`` x (the longest vocabulary entry) bytes of UTF-8 text (byte-level
BPE: one byte per character of the entry; SentencePiece: up to 4; x2 margin for normalisation). A prompt with more
bytes than the context times that cannot fit, so it is refused without being tokenized."""


class _OneLineHttpErrors(logging.Filter):
    """aiohttp logs every malformed HTTP request (bad request line, header too long, a body that does not match its
    Content-Encoding...) with a traceback; its parser answers them with a 400 before the application sees a request
    (or after the handler answered, while it drains the body). Log those as one line instead, so a client sending
    garbage cannot flood the server log; real exceptions keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (HttpProcessingError, RequestPayloadError)):
            record.msg, record.args = "bad HTTP request refused: %s", (" ".join(str(exc).split())[:200],)
            record.exc_info, record.exc_text = None, None
        return True


_HTTP_LOG_FILTER = _OneLineHttpErrors()


def _json_error(message: str, status: int = 400, param: str | None = None) -> web.Response:
    return web.json_response(P.error_body(message, status, param), status=status)


def _key_matches(header: str, key: str) -> bool:
    """True when an ``Authorization`` header is ``Bearer <key>`` (the scheme case-insensitive, RFC 7235 section 2.1);
    the key is compared in constant time (:func:`hmac.compare_digest`, on bytes: it refuses non-ASCII str)."""
    scheme, _, token = header.partition(" ")
    try:
        given = token.strip().encode("utf-8", "surrogateescape")
    except UnicodeError:
        return False
    same = hmac.compare_digest(given, key.encode("utf-8", "surrogateescape"))
    return same and scheme.lower() == "bearer"


class Server:
    """Serves one engine under one model name.

    Args:
        engine: a built (not yet started) :class:`Engine`.
        model_name: the id in /v1/models; requests naming another model get 400.
        api_key: when set, every route except ``/health`` needs ``Authorization: Bearer <api_key>`` (401
            otherwise).
        metrics_without_key: with an API key, leave ``/metrics`` open too (for a Prometheus scraper without
            credentials).
    """

    def __init__(self, engine: Engine, model_name: str, api_key: str | None = None,
                 metrics_without_key: bool = False) -> None:
        self.engine, self.model_name, self.api_key = engine, model_name, api_key or None
        self.open_paths = {"/health"} | ({"/metrics"} if metrics_without_key else set())
        self.metrics = ServerMetrics(engine, model_name)
        self.started = time.time()
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spectune-tokenize")
        server_log = logging.getLogger("aiohttp.server")
        if _HTTP_LOG_FILTER not in server_log.filters:
            server_log.addFilter(_HTTP_LOG_FILTER)
        vocab = engine.tokenizer.hf.get_vocab() if hasattr(engine.tokenizer, "hf") else {}
        self.max_token_chars = max((len(t) for t in vocab), default=64)

    def app(self, own_engine_thread: bool = True) -> web.Application:
        """The aiohttp application.

        With ``own_engine_thread`` it starts the engine's background thread on startup and stops it on cleanup;
        :func:`serve` passes False and runs the engine loop on the main thread itself. Serve it through
        :meth:`app_runner` (which turns on handler cancellation).
        """
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=MAX_BODY_BYTES)
        app.add_routes([
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/metrics", self.prometheus),
            web.get("/server_info", self.server_info),
            web.get("/get_server_info", self.server_info),
            web.post("/spectune/num_steps", self.set_num_steps),
        ])
        if own_engine_thread:
            app.on_startup.append(self._start_engine)
            app.on_cleanup.append(self._stop_engine)
        app.on_cleanup.append(self._stop_worker)
        return app

    def app_runner(self, own_engine_thread: bool = True) -> web.AppRunner:
        """An :class:`aiohttp.web.AppRunner` for :meth:`app` with ``handler_cancellation=True``: a handler is
        cancelled when its client disconnects, so a non-streaming request is aborted too (aiohttp docs, "Web
        handler cancellation")."""
        return web.AppRunner(self.app(own_engine_thread), access_log=None, handler_cancellation=True)

    async def _start_engine(self, _: web.Application) -> None:
        self.engine.start()

    async def _stop_engine(self, _: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.engine.shutdown)

    async def _stop_worker(self, _: web.Application) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, fn: Callable[..., R], *args: object) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every error as OpenAI-style JSON: HTTP errors keep their status (404, 405, 413...), anything else
        raised by a handler is a 500 (the server keeps serving)."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            text = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
            return _json_error(text or exc.reason, exc.status)
        except RequestPayloadError as exc:  # e.g. "Content-Encoding: gzip" on a body that is not gzip
            return _json_error(f"the request body cannot be read ({' '.join(str(exc).split())[:200]})", 400)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must not turn into a text/plain 500 or a dead server
            return _json_error(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}", 500)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.api_key and request.path not in self.open_paths:
            if not _key_matches(request.headers.get("Authorization", ""), self.api_key):
                return _json_error("invalid or missing API key: send 'Authorization: Bearer KEY'", 401)
        return await handler(request)

    # ---- info routes ---------------------------------------------------------------------------------------
    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": int(self.started), "owned_by": "spectune",
             "max_model_len": self.engine.context_len}]})

    async def health(self, _: web.Request) -> web.Response:
        if self.engine.error is not None:
            return _json_error(f"engine failed: {self.engine.error!r}", 503)
        return web.Response(text="OK")

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain")

    async def server_info(self, _: web.Request) -> web.Response:
        s, e = self.engine.stats, self.engine
        head = e.decoder.head
        return web.json_response({
            "model_path": self.model_name,
            "speculative_algorithm": None if head is None else head.cfg.kind.upper(),
            "speculative_num_steps": e.cfg.num_steps,
            "adaptive": e.cfg.policy is not None,
            "max_running_requests": e.cfg.max_num_seqs,
            "internal_states": [{"speculative_num_steps": s.active_num_steps,
                                 "avg_spec_accept_length": s.avg_accept_length,
                                 "num_steps_switches": s.num_steps_switches}],
            "request_errors": e.num_request_errors,
            "engine_path": e.path.to_json() if e.path is not None else None,
            "step_model": e.guard.to_json(),
            "draft_length": e.decoder.rule.to_json() if e.decoder.rule is not None else None,
        })

    async def set_num_steps(self, request: web.Request) -> web.Response:
        try:
            body = P.NumStepsRequest.model_validate_json(await request.read())
        except ValidationError as err:
            message, param = P.validation_message(err)
            return _json_error(f'{message}; send {{"num_steps": K}} with K in 0..{P.MAX_NUM_STEPS}, and optionally '
                               '"draft_p_min": P in 0..1', 400, param)
        try:
            self.engine.set_num_steps(body.num_steps, body.draft_p_min)
        except RuntimeError as err:
            return _json_error(str(err), 409)
        except InvalidRequest as err:
            return _json_error(str(err), 400, err.param)
        rule = self.engine.decoder.rule
        return web.json_response({"num_steps": body.num_steps,
                                  "draft_p_min": rule.threshold if rule is not None and rule.strategy == "p_min"
                                  else 0.0})

    # ---- generation ----------------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _tokenize(self, req: P.ChatCompletionRequest | P.CompletionRequest, chat: bool) -> list[int]:
        tok = self.engine.tokenizer
        if chat:
            return tok.encode_chat([{"role": m.role, "content": m.text()} for m in req.messages])
        return list(req.prompt) if isinstance(req.prompt, list) else tok.encode(req.prompt)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        raw = await request.read()
        model = P.ChatCompletionRequest if chat else P.CompletionRequest
        try:
            req = await self._off_loop(model.model_validate_json, raw) if len(raw) > BIG_BODY_BYTES \
                else model.model_validate_json(raw)
        except ValidationError as err:
            message, param = P.validation_message(err)
            return _json_error(message, 400, param)
        if req.model is not None and req.model != self.model_name:
            return _json_error(f"model {req.model!r} does not exist; this server serves {self.model_name!r}", 400,
                               "model")
        context = self.engine.context_len
        where = "messages" if chat else "prompt"
        if req.text_bytes() > context * BYTES_PER_TOKEN_BOUND * self.max_token_chars:
            return _json_error(f"the {where} has {req.text_bytes()} bytes of text, more than the context of "
                               f"{context} tokens can hold: shorten it", 400, where)
        try:
            ids = await self._off_loop(self._tokenize, req, chat)
        except ValueError as err:
            return _json_error(str(err), 400, where)
        max_tokens = req.requested_max_tokens() or max(1, context - len(ids))
        if len(ids) >= context:
            return _json_error(f"prompt is {len(ids)} tokens; the context is {context} tokens", 400, where)
        if len(ids) + max_tokens > context:
            return _json_error(f"max_tokens {max_tokens} + prompt {len(ids)} tokens exceeds the context of "
                               f"{context} tokens", 400, "max_tokens")
        params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                top_k=max(req.top_k, 0), stop=req.stop_list(),
                                stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
                                seed=req.seed)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            self.engine.add_request(rid, ids, params, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out))
        except EngineFull as err:
            return _json_error(str(err), 503)
        except InvalidRequest as err:
            return _json_error(str(err), 400, where if err.param == "prompt" else err.param)
        if req.stream:
            return await self._stream(request, req, rid, chat, queue, t0)
        return await self._collect(rid, chat, queue, t0)

    async def _collect(self, rid: str, chat: bool, queue: asyncio.Queue, t0: float) -> web.Response:
        parts: list[str] = []
        t_first = None
        try:
            while True:
                out = await queue.get()
                if t_first is None and out.new_token_ids:
                    t_first = time.perf_counter()
                parts.append(out.text_delta)
                if out.finished:
                    break
        except asyncio.CancelledError:  # the client disconnected (handler cancellation): free the slot
            self.engine.abort(rid)
            raise
        self._observe(t0, t_first, out)
        if out.finish_reason == "error":
            return _json_error(f"the engine failed on this request ({out.error}); other requests are unaffected",
                               500)
        return web.json_response(P.full_response(rid, self.model_name, chat, "".join(parts), out.finish_reason,
                                                 P.usage(out.num_prompt_tokens, out.num_output_tokens),
                                                 out.spec.to_json()))

    async def _stream(self, request: web.Request, req: P.ChatCompletionRequest | P.CompletionRequest, rid: str,
                      chat: bool, queue: asyncio.Queue, t0: float) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        opts = req.stream_options or P.StreamOptions()
        first, t_first = True, None
        try:
            await resp.prepare(request)
            while True:
                out = await queue.get()
                if out.finish_reason == "error":  # OpenAI-style error event, then the end of the stream
                    body = P.error_body(f"the engine failed on this request ({out.error})", 500)
                    await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")
                    break
                if t_first is None and out.new_token_ids:
                    t_first = time.perf_counter()
                use = P.usage(out.num_prompt_tokens, out.num_output_tokens) if opts.continuous_usage_stats else None
                if out.text_delta or out.new_token_ids or out.finished:
                    data = P.chunk(rid, self.model_name, chat, out.text_delta, out.finish_reason if out.finished
                                   else None, first, use, out.spec.to_json() if out.finished else None)
                    await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                    first = False
                if out.finished:
                    break
            if opts.include_usage and out.finish_reason != "error":
                final = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                         "created": int(time.time()), "model": self.model_name, "choices": [],
                         "usage": P.usage(out.num_prompt_tokens, out.num_output_tokens)}
                await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self.engine.abort(rid)  # the client went away: free the slot
            raise
        self._observe(t0, t_first, out)
        return resp

    def _observe(self, t0: float, t_first: float | None, out: RequestOutput) -> None:
        t_end = time.perf_counter()
        ttft = None if t_first is None else t_first - t0
        tpot = (t_end - t_first) / (out.num_output_tokens - 1) if t_first and out.num_output_tokens > 1 else None
        self.metrics.observe_request(ttft, tpot, t_end - t0, out.finish_reason or "abort")


def serve(engine: Engine, model_name: str, host: str, port: int, api_key: str | None = None,
          metrics_without_key: bool = False) -> None:
    """Serve until SIGTERM/SIGINT (blocks): HTTP on a side thread, the engine loop on the calling (main) thread.

    The engine must run its torch work on the thread that built it: on CPU, decoding from a second thread after the
    main thread has run torch ops was measured 30% slower per token (24 -> 31 ms, SmolLM2 on 2 cores; PyTorch's
    OpenMP pools are per calling thread), which would bias every CPU sweep against num_steps 0.

    Raises:
        OSError: the port cannot be bound.
    """
    engine_log = logging.getLogger("spectune.engine")  # the engine's interval lines (loop.interval_line) on stderr
    if not engine_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        engine_log.addHandler(handler)
        engine_log.setLevel(logging.INFO)
        engine_log.propagate = False
    loop = asyncio.new_event_loop()
    app_runner = Server(engine, model_name, api_key, metrics_without_key).app_runner(own_engine_thread=False)
    loop.run_until_complete(app_runner.setup())
    loop.run_until_complete(web.TCPSite(app_runner, host, port).start())  # raises here if the port is taken
    threading.Thread(target=loop.run_forever, name="spectune-http", daemon=True).start()

    def _stop(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        engine.run()
    finally:
        try:
            asyncio.run_coroutine_threadsafe(app_runner.cleanup(), loop).result(timeout=5)
        except Exception:  # noqa: BLE001 - exiting anyway; open streams are simply cut
            pass
