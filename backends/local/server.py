"""The bundled engine behind an OpenAI-compatible HTTP server (aiohttp).

Routes: POST /v1/chat/completions, POST /v1/completions (stream and non-stream), GET /v1/models, /health,
/metrics (Prometheus), /server_info and /get_server_info (SGLang's shape: ``internal_states[0]`` with
``speculative_num_steps`` and ``avg_spec_accept_length``), POST /spectune/num_steps (change the static num_steps
while idle; the ``local`` sweep backend uses it). Bad requests get a 400 JSON error and the server keeps serving; a
full queue gets 503; a client that disconnects mid-stream has its sequence aborted.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from backends.local import protocol as P
from backends.local.engine import Engine, EngineFull
from backends.local.metrics import ServerMetrics
from backends.local.sequence import RequestOutput, SamplingParams


def _json_error(message: str, status: int = 400, param: str | None = None) -> web.Response:
    return web.json_response(P.error_body(message, status, param), status=status)


def _validation_message(err: ValidationError) -> tuple[str, str | None]:
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    return f"{loc}: {first.get('msg', 'invalid value')}" if loc else first.get("msg", "invalid request"), loc or None


class Server:
    """Serves one engine under one model name.

    Args:
        engine: a built (not yet started) :class:`Engine`.
        model_name: the id in /v1/models; requests naming another model get 400.
        api_key: when set, requests must send ``Authorization: Bearer <api_key>``.
    """

    def __init__(self, engine: Engine, model_name: str, api_key: str | None = None) -> None:
        self.engine, self.model_name, self.api_key = engine, model_name, api_key
        self.metrics = ServerMetrics(engine, model_name)
        self.started = time.time()

    def app(self, own_engine_thread: bool = True) -> web.Application:
        """The aiohttp application.

        With ``own_engine_thread`` it starts the engine's background thread on startup and stops it on cleanup;
        :func:`serve` passes False and runs the engine loop on the main thread itself.
        """
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 2**20)
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
        return app

    async def _start_engine(self, _: web.Application) -> None:
        self.engine.start()

    async def _stop_engine(self, _: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.engine.shutdown)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.api_key and request.path.startswith("/v1/"):
            if request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
                return _json_error("invalid or missing API key", 401)
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
        head = e.runner.head
        return web.json_response({
            "model_path": self.model_name,
            "speculative_algorithm": None if head is None else head.cfg.kind.upper(),
            "speculative_num_steps": e.cfg.num_steps,
            "adaptive": e.cfg.policy is not None,
            "max_running_requests": e.cfg.max_num_seqs,
            "internal_states": [{"speculative_num_steps": s.active_num_steps,
                                 "avg_spec_accept_length": s.avg_accept_length,
                                 "num_steps_switches": s.num_steps_switches}],
        })

    async def set_num_steps(self, request: web.Request) -> web.Response:
        try:
            k = int((await request.json())["num_steps"])
            if k < 0:
                raise ValueError
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            return _json_error('body must be {"num_steps": <non-negative int>}')
        try:
            self.engine.set_num_steps(k)
        except RuntimeError as err:
            return _json_error(str(err), 409)
        except ValueError as err:
            return _json_error(str(err))
        return web.json_response({"num_steps": k})

    # ---- generation ----------------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _json_error("request body is not valid JSON")
        try:
            req = (P.ChatCompletionRequest if chat else P.CompletionRequest).model_validate(body)
        except ValidationError as err:
            message, param = _validation_message(err)
            return _json_error(message, 400, param)
        if req.model is not None and req.model != self.model_name:
            return _json_error(f"model {req.model!r} does not exist; this server serves {self.model_name!r}", 400,
                               "model")
        tok = self.engine.tokenizer
        try:
            if chat:
                ids = tok.encode_chat([{"role": m.role, "content": m.text()} for m in req.messages])
            else:
                ids = list(req.prompt) if isinstance(req.prompt, list) else tok.encode(req.prompt)
        except ValueError as err:
            return _json_error(str(err), 400, "messages")
        context = self.engine.context_len
        max_tokens = req.requested_max_tokens() or max(1, context - len(ids))
        if len(ids) >= context:
            return _json_error(f"prompt is {len(ids)} tokens; the context is {context} tokens", 400, "messages")
        if len(ids) + max_tokens > context:
            return _json_error(f"max_tokens {max_tokens} + prompt {len(ids)} tokens exceeds the context of "
                               f"{context} tokens", 400, "max_tokens")
        params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                top_k=max(req.top_k, 0), stop=req.stop_list(),
                                stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            self.engine.add_request(rid, ids, params, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out))
        except EngineFull as err:
            return _json_error(str(err), 503)
        except ValueError as err:
            return _json_error(str(err), 400, "max_tokens")
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
        except asyncio.CancelledError:
            self.engine.abort(rid)
            raise
        self._observe(t0, t_first, out)
        return web.json_response(P.full_response(rid, self.model_name, chat, "".join(parts), out.finish_reason,
                                                 P.usage(out.num_prompt_tokens, out.num_output_tokens),
                                                 out.spec.to_json()))

    async def _stream(self, request: web.Request, req: Any, rid: str, chat: bool, queue: asyncio.Queue,
                      t0: float) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        opts = req.stream_options or P.StreamOptions()
        first, t_first = True, None
        try:
            await resp.prepare(request)
            while True:
                out = await queue.get()
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
            if opts.include_usage:
                final = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                         "created": int(time.time()), "model": self.model_name, "choices": [],
                         "usage": P.usage(out.num_prompt_tokens, out.num_output_tokens)}
                await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(rid)  # the client went away: free the slot
            raise
        self._observe(t0, t_first, out)
        return resp

    def _observe(self, t0: float, t_first: float | None, out: RequestOutput) -> None:
        t_end = time.perf_counter()
        ttft = None if t_first is None else t_first - t0
        tpot = (t_end - t_first) / (out.num_output_tokens - 1) if t_first and out.num_output_tokens > 1 else None
        self.metrics.observe_request(ttft, tpot, t_end - t0, out.finish_reason or "abort")


def serve(engine: Engine, model_name: str, host: str, port: int, api_key: str | None = None) -> None:
    """Serve until SIGTERM/SIGINT (blocks): HTTP on a side thread, the engine loop on the calling (main) thread.

    The engine must run its torch work on the thread that built it: on CPU, decoding from a second thread after the
    main thread has run torch ops was measured 30% slower per token (24 -> 31 ms, SmolLM2 on 2 cores; PyTorch's
    OpenMP pools are per calling thread), which would bias every CPU sweep against num_steps 0.

    Raises:
        OSError: the port cannot be bound.
    """
    import signal
    import threading

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(Server(engine, model_name, api_key).app(own_engine_thread=False), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, host, port).start())  # raises here if the port is taken
    threading.Thread(target=loop.run_forever, name="spectune-http", daemon=True).start()

    def _stop(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        engine.run()
    finally:
        try:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=5)
        except Exception:  # noqa: BLE001 - exiting anyway; open streams are simply cut
            pass
