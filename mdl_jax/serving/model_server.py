"""An OpenAI-compatible server on 127.0.0.1 for a ``LocalBackend`` model (default: the bundled SmolLM2).

    python -m mdl_jax.serve [--port 8123] [--model bundled:smollm2] [--fail-first N]

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (messages, temperature, top_p,
max_tokens / max_completion_tokens, seed, stop, stream, logprobs + top_logprobs) and the legacy
``POST /v1/completions`` (a raw prompt, no chat template; ``echo: true, max_tokens: 0, logprobs: k``
returns the log-probability of every prompt token: teacher-forced scoring).

How requests run: each is validated (types and ranges, 400 otherwise), its prompt counted in tokens
(prompt + max_tokens must fit the model's context) and queued on one of two lanes: long requests
(a prompt over ``long_prompt_tokens`` or max_tokens over ``long_max_tokens``) on their own, so they
never hold back short ones. A lane's batcher collects what is queued for a few ms, groups requests
with the same temperature and top_p (up to ``batch_rows`` rows and ``batch_tokens`` tokens) and runs
``LocalBackend.generate`` on them in its own thread; each row keeps its own max_tokens, stop strings
and stream. A request's answer is the one ``LocalBackend.generate`` gives the same prompt with the
same seed (paired sampling across backends), up to bf16 rounding under another batch shape.

``logprobs`` on chat completions: ``choices[0].logprobs.content`` holds the first reply token only,
with its ``top_logprobs`` most likely alternatives (what CRAG and Self-RAG read). ``n`` > 1 and
penalties are refused (400), not ignored. ``--fail-first N`` answers the first N completion requests
with HTTP 503 (fault injection for the client's retry path, off by default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, StreamingResponse

from mdl_jax.serving.protocol import (
    LIMITS,
    SSE_HEADERS,
    APIError,
    ChatRequest,
    CompletionRequest,
    Limits,
    bind,
    install_error_handlers,
    new_id,
    now,
    parse,
    read_json,
    run_app,
    sse,
)


@dataclasses.dataclass(eq=False)
class Job:
    """One row to generate: a chat (or raw text) prompt with its own sampling settings."""
    prompt: Any
    seed: int
    max_tokens: int
    temperature: float
    top_p: float
    stop: list
    prompt_tokens: int
    logprobs: int | None = None  # top_logprobs wanted (chat), None for none
    stream: asyncio.Queue | None = None
    future: asyncio.Future | None = None
    cancelled: bool = False
    batch: str = ""               # "<lane>-<n>": which batch it ran in (x-mdl-batch header)
    batch_rows: int = 0
    queued_s: float = 0.0         # enqueue → its batch starts
    waited: int = 0               # batches its lane started while it was queued
    span: tuple = (0.0, 0.0)      # its batch's start and end (server's monotonic clock)

    @property
    def key(self):
        return (self.temperature, self.top_p)

    @property
    def cost(self) -> int:
        return self.prompt_tokens + self.max_tokens


class Lane:
    """A queue, a batcher and one worker thread; the model is shared with the other lane."""

    def __init__(self, name: str, backend, limits: Limits):
        self.name, self.backend, self.limits = name, backend, limits
        self.jobs: list[Job] = []
        self.wake = asyncio.Event()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"mdl-serve-{name}")
        self.batches = itertools.count(1)
        self.started = 0
        self.running: str | None = None  # the batch in the worker thread now (health endpoint)
        self.enqueued_at: dict[int, tuple[float, int]] = {}

    def put(self, job: Job) -> None:
        job.future = asyncio.get_running_loop().create_future()
        self.enqueued_at[id(job)] = (time.monotonic(), self.started)
        self.jobs.append(job)
        self.wake.set()

    def _take(self) -> list[Job]:
        self.jobs = [j for j in self.jobs if not j.cancelled]
        if not self.jobs:
            return []
        key = self.jobs[0].key  # the oldest request sets the sampling group: nobody starves
        batch, tokens = [], 0
        for j in self.jobs:
            if j.key != key:
                continue
            if batch and (len(batch) >= self.limits.batch_rows
                          or tokens + j.cost > self.limits.batch_tokens):
                break
            batch.append(j)
            tokens += j.cost
        taken = set(map(id, batch))
        self.jobs = [j for j in self.jobs if id(j) not in taken]
        return batch

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.limits.batch_wait_s)  # let concurrent requests join
            batch = self._take()
            if not self.jobs:
                self.wake.clear()
            if not batch:
                continue
            name = f"{self.name}-{next(self.batches)}"
            t = time.monotonic()
            for j in batch:
                t0, n0 = self.enqueued_at.pop(id(j), (t, self.started))
                j.batch, j.batch_rows, j.queued_s, j.waited = name, len(batch), t - t0, self.started - n0
            self.started += 1
            self.running = name
            try:
                results = await loop.run_in_executor(self.pool, self._generate, batch, loop)
                for j in batch:
                    j.span = (t, time.monotonic())
                for j, r in zip(batch, results):
                    if not j.future.done():
                        j.future.set_result(r)
            except Exception as e:  # noqa: BLE001 - a failed batch fails its requests, not the server
                for j in batch:
                    if not j.future.done():
                        j.future.set_exception(APIError(500, f"generation failed: {type(e).__name__}: "
                                                             f"{str(e)[:200]}", "server_error"))
            self.running = None
            for j in batch:
                if j.stream is not None:
                    j.stream.put_nowait(None)

    def _generate(self, batch: list[Job], loop) -> list:
        """In the lane's thread: one ``generate`` call for the batch, then the requested logprobs."""
        def on_token(i: int, token: int) -> bool:
            j = batch[i]
            if j.stream is not None:
                loop.call_soon_threadsafe(j.stream.put_nowait, token)
            return j.cancelled  # the client went away: end the row

        gens = self.backend.generate([j.prompt for j in batch], seed=[j.seed for j in batch],
                                     max_new_tokens=[j.max_tokens for j in batch],
                                     temperature=batch[0].temperature, top_p=batch[0].top_p,
                                     stop=[j.stop for j in batch], on_token=on_token)
        out = []
        for j, g in zip(batch, gens):
            lp = None
            if j.logprobs is not None and not isinstance(j.prompt, str):
                k = j.logprobs
                tops, first = self.backend.top_logprobs(j.prompt, max(k, 1), g.text)
                token, x = first or tops[0]
                lp = {"content": [{"token": token, "logprob": x, "bytes": list(token.encode()),
                                   "top_logprobs": [{"token": t, "logprob": y, "bytes": list(t.encode())}
                                                    for t, y in tops[:k]]}]}
            out.append((g, lp))
        return out


class ModelServer:
    """State of one server: the backend, its names, the lanes, the fault injection counter."""

    def __init__(self, backend, limits: Limits = LIMITS, fail_first: int = 0,
                 names: list[str] | None = None, api_key: str | None = None):
        self.backend, self.limits = backend, limits
        self.api_key = api_key
        self.to_fail = fail_first
        self.requests = 0
        m = backend.model
        self.names = names or [m] + (["smollm2"] if m == "bundled:smollm2" else
                                     [os.path.basename(m.rstrip("/"))] if os.path.basename(m.rstrip("/")) != m
                                     else [])
        tok, lm = backend._lm()
        self.tok = tok
        self.context = int(getattr(lm.config, "max_position_embeddings", 2048))
        self.lanes: dict[str, Lane] = {}

    def start(self) -> None:
        from mdl_jax.pipeline.generation import LocalBackend

        for name in ("short", "long"):
            b = LocalBackend(self.backend.model, batch_size=self.limits.batch_rows,
                             device=self.backend.device, dtype=self.backend.dtype)
            lane = Lane(name, b, self.limits)
            self.lanes[name] = lane
            asyncio.get_running_loop().create_task(lane.run())

    def auth(self, request) -> None:
        """With ``--api-key``, every /v1 request must carry ``Authorization: Bearer <key>`` (401)."""
        if self.api_key is None:
            return
        import hmac

        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.api_key}".encode()):
            raise APIError(401, "Incorrect API key provided (Authorization: Bearer <key>)",
                           code="invalid_api_key")

    def check_model(self, model: str | None) -> str:
        if model is None:
            return self.names[0]
        if model not in self.names:
            raise APIError(404, f"model: {model!r} is not served here (served: {', '.join(self.names)})",
                           param="model", code="model_not_found")
        return model

    def injected_failure(self) -> None:
        self.requests += 1
        if self.to_fail > 0:
            self.to_fail -= 1
            raise APIError(503, "injected failure (--fail-first)", "server_error")

    def max_tokens(self, value: int | None, default: int) -> int:
        m = default if value is None else value
        if m > self.limits.max_tokens:
            raise APIError(400, f"max_tokens: at most {self.limits.max_tokens} on this server (got {m})",
                           param="max_tokens")
        return m

    def count(self, prompt) -> int:
        text = prompt if isinstance(prompt, str) else \
            self.tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return len(self.tok(text)["input_ids"])

    def check_context(self, n_prompt: int, max_tokens: int, param: str) -> None:
        if n_prompt + max_tokens > self.context:
            raise APIError(400, f"{param}: this model's context is {self.context} tokens; the prompt has "
                                f"{n_prompt} and max_tokens asks for {max_tokens}", param=param,
                           code="context_length_exceeded")

    def enqueue(self, job: Job) -> Job:
        if sum(len(lane.jobs) for lane in self.lanes.values()) >= self.limits.max_queue:
            raise APIError(503, f"server busy: {self.limits.max_queue} requests already queued",
                           "server_error", code="overloaded")
        long = job.prompt_tokens > self.limits.long_prompt_tokens or \
            job.max_tokens > self.limits.long_max_tokens
        self.lanes["long" if long else "short"].put(job)
        return job


def _headers(jobs: list[Job]) -> dict:
    return {"x-mdl-batch": ",".join(j.batch for j in jobs),
            "x-mdl-batch-rows": ",".join(str(j.batch_rows) for j in jobs),
            "x-mdl-queued-ms": ",".join(f"{1e3 * j.queued_s:.1f}" for j in jobs),
            "x-mdl-waited-batches": ",".join(str(j.waited) for j in jobs),
            "x-mdl-batch-span": ",".join(f"{j.span[0]:.6f}:{j.span[1]:.6f}" for j in jobs)}


def make_app(srv: ModelServer):
    """The ASGI app (FastAPI) of one ``ModelServer``."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        srv.start()
        yield

    app = FastAPI(title="mdl-jax local model server", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    install_error_handlers(app)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "mdl-jax"}

    @app.get("/v1/models")
    async def models(request: Request):
        srv.auth(request)
        return {"object": "list", "data": [model_card(n) for n in srv.names]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request):
        srv.auth(request)
        return model_card(srv.check_model(name))

    @app.get("/health")
    async def health():
        return {"status": "ok", "queued": {k: len(v.jobs) for k, v in srv.lanes.items()},
                "running": {k: v.running for k, v in srv.lanes.items()}, "requests": srv.requests}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        srv.auth(request)
        req = parse(ChatRequest, await read_json(request, srv.limits))
        req.unsupported()
        name = srv.check_model(req.model)
        if req.stream and req.logprobs:
            raise APIError(400, "logprobs: not supported with stream", param="logprobs")
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        mt = srv.max_tokens(req.max_completion_tokens or req.max_tokens, srv.limits.default_max_tokens)
        prompt = req.chat()
        n_prompt = await run_in_threadpool(srv.count, prompt)
        srv.check_context(n_prompt, mt, "messages")
        srv.injected_failure()
        job = Job(prompt, 0 if req.seed is None else req.seed, mt,
                  0.7 if req.temperature is None else req.temperature,
                  0.9 if req.top_p is None else req.top_p, list(req.stop or []), n_prompt,
                  logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                  stream=asyncio.Queue() if req.stream else None)
        srv.enqueue(job)
        cid = new_id("chatcmpl")
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(_stream_chat(srv, job, cid, name, usage), headers=SSE_HEADERS,
                                     media_type="text/event-stream")
        g, lp = await job.future
        return JSONResponse({
            "id": cid, "object": "chat.completion", "created": now(), "model": name,
            "system_fingerprint": None,
            "choices": [{"index": 0, "finish_reason": g.finish_reason or "stop", "logprobs": lp,
                         "message": {"role": "assistant", "content": g.text}}],
            "usage": {"prompt_tokens": g.prompt_tokens, "completion_tokens": g.n_tokens,
                      "total_tokens": g.prompt_tokens + g.n_tokens},
        }, headers=_headers([job]))

    @app.post("/v1/completions")
    async def completions(request: Request):
        srv.auth(request)
        req = parse(CompletionRequest, await read_json(request, srv.limits))
        req.unsupported()
        name = srv.check_model(req.model)
        if req.stream:
            raise APIError(400, "stream: not supported on /v1/completions (use /v1/chat/completions)",
                           param="stream")
        mt = srv.max_tokens(req.max_tokens, 16)  # 16: the legacy endpoint's default
        if req.logprobs is not None and mt > 0:
            raise APIError(400, "logprobs: only for scoring a prompt (echo: true, max_tokens: 0) here",
                           param="logprobs")
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        counts = [await run_in_threadpool(srv.count, p) for p in prompts]
        for n in counts:
            srv.check_context(n, mt, "prompt")
        srv.injected_failure()
        choices, jobs, n_completion = [], [], 0
        if mt == 0:
            short = srv.lanes["short"]
            loop = asyncio.get_running_loop()
            for i, p in enumerate(prompts):
                lp = None
                if req.logprobs is not None and req.echo:
                    # in the short lane's thread: serialised with its batches, never beside them
                    tokens, lps, offs, tops = await loop.run_in_executor(
                        short.pool, short.backend.prompt_logprobs, p, req.logprobs)
                    lp = {"tokens": tokens, "token_logprobs": lps, "text_offset": offs,
                          "top_logprobs": tops}
                elif req.logprobs is not None:
                    lp = {"tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": []}
                choices.append({"index": i, "text": p if req.echo else "", "logprobs": lp,
                                "finish_reason": "length"})
        else:
            for p, n in zip(prompts, counts):
                jobs.append(srv.enqueue(Job(p, 0 if req.seed is None else req.seed, mt,
                                            0.7 if req.temperature is None else req.temperature,
                                            0.9 if req.top_p is None else req.top_p, list(req.stop or []), n)))
            for i, (p, j) in enumerate(zip(prompts, jobs)):
                g, _ = await j.future
                n_completion += g.n_tokens
                choices.append({"index": i, "text": (p if req.echo else "") + g.text, "logprobs": None,
                                "finish_reason": g.finish_reason or "stop"})
        return JSONResponse({
            "id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": name,
            "choices": choices,
            "usage": {"prompt_tokens": sum(counts), "completion_tokens": n_completion,
                      "total_tokens": sum(counts) + n_completion},
        }, headers=_headers(jobs) if jobs else None)

    return app


async def _stream_chat(srv: ModelServer, job: Job, cid: str, name: str, usage: bool):
    """Server-sent events as OpenAI streams them: a role chunk, content deltas, a chunk with
    finish_reason, optionally a usage chunk, then ``[DONE]``. The deltas add up to exactly the text
    the same request gets without streaming (held back while a stop string or a multi-byte character
    may still be forming, and trimmed as the full answer is)."""
    created = now()

    def chunk(delta: dict, finish=None, **extra) -> bytes:
        return sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "system_fingerprint": None,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                    **extra})

    ids: list[int] = []
    sent = ""
    try:
        yield chunk({"role": "assistant", "content": ""})
        while (token := await job.stream.get()) is not None:
            ids.append(token)
            text = srv.tok.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):
                continue
            hit = min([j for j in (text.find(s) for s in job.stop) if j >= 0], default=None)
            text = text[:hit] if hit is not None else text[:len(text) - _stop_prefix(text, job.stop)]
            visible = text.lstrip().rstrip()
            if visible.startswith(sent) and len(visible) > len(sent):
                yield chunk({"content": visible[len(sent):]})
                sent = visible
        try:
            g, _ = await job.future
        except APIError as e:
            yield sse(e.body())
            yield sse("[DONE]")
            return
        if g.text.startswith(sent) and len(g.text) > len(sent):
            yield chunk({"content": g.text[len(sent):]})
        yield chunk({}, g.finish_reason or "stop")
        if usage:
            yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                       "choices": [], "usage": {"prompt_tokens": g.prompt_tokens,
                                                "completion_tokens": g.n_tokens,
                                                "total_tokens": g.prompt_tokens + g.n_tokens}})
        yield sse("[DONE]")
    finally:
        job.cancelled = True  # harmless when done; ends the row when the client went away


def _stop_prefix(text: str, stops) -> int:
    """Length of the longest end of ``text`` that may still grow into a stop string (held back)."""
    for k in range(min(len(text), max((len(s) - 1 for s in stops), default=0)), 0, -1):
        if any(s.startswith(text[-k:]) for s in stops):
            return k
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mdl_jax.serve", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8123, help="port (0: any free one)")
    p.add_argument("--model", default="bundled:smollm2", help="bundled:smollm2, a Hugging Face id or a path")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-tokens", type=int, default=LIMITS.max_tokens, help="cap on a request's max_tokens")
    p.add_argument("--body-timeout", type=float, default=LIMITS.body_timeout_s,
                   help="seconds a request body may take to arrive (then 408)")
    p.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer KEY); default MDL_JAX_SERVE_API_KEY, else none")
    p.add_argument("--fail-first", type=int, default=0,
                   help="answer the first N completion requests with 503 (fault injection)")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"--port: expected 0-65535, got {args.port}")
    if args.fail_first < 0:
        p.error(f"--fail-first: expected >= 0, got {args.fail_first}")
    if not 1 <= args.max_tokens <= 1 << 20:
        p.error(f"--max-tokens: expected >= 1, got {args.max_tokens}")
    if not 0 < args.body_timeout <= 3600:
        p.error(f"--body-timeout: expected seconds in (0, 3600], got {args.body_timeout}")
    limits = dataclasses.replace(LIMITS, max_tokens=args.max_tokens, body_timeout_s=args.body_timeout)
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f"mdl_jax.serve: error: cannot bind {args.host}:{args.port}: {e.strerror}", file=sys.stderr)
        return 2
    from mdl_jax.pipeline.generation import LocalBackend

    backend = LocalBackend(args.model, batch_size=limits.batch_rows, device=args.device)
    try:
        srv = ModelServer(backend, limits, args.fail_first,
                          api_key=args.api_key or os.environ.get("MDL_JAX_SERVE_API_KEY") or None)
    except (OSError, ValueError, RuntimeError) as e:  # no such model, no weights, a bad device
        sock.close()
        print(f"mdl_jax.serve: error: --model {args.model}: {' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 2  # loads the model before accepting requests
    host, port = sock.getsockname()[:2]
    print(f"serving {args.model} on http://{host}:{port}/v1", flush=True)
    run_app(make_app(srv), sock, limits)
    return 0
