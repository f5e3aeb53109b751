"""An OpenAI-compatible server on 127.0.0.1 for a ``LocalBackend`` model (default: the bundled SmolLM2).

    python -m mdl_repro.serve [--port 8123] [--model bundled:smollm2] [--fail-first N]

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (messages, temperature, top_p,
max_tokens / max_completion_tokens, seed, stop, stream, logprobs + top_logprobs) and the legacy
``POST /v1/completions`` (a raw prompt, no chat template; ``echo: true, max_tokens: 0, logprobs: k``
returns the log-probability of every prompt token: teacher-forced scoring).

How requests run: each is validated (types and ranges, 400 otherwise), its prompt counted in tokens
(prompt + max_tokens must fit the model's context) and queued on one of three lanes, each with its
own thread and tokenizer: short requests; long ones (a prompt over ``long_prompt_tokens`` or
max_tokens over ``long_max_tokens``); and echo scoring (``max_tokens: 0``), computed in chunks of
``score_chunk_tokens`` positions. Short requests come first: while one is queued or running, the long
lane waits between tokens (and between chunks of ``prefill_chunk_tokens`` while it reads a long
prompt) and the scoring lane between chunks (``ShortFirst``). A client that disconnects cancels its
work: queued, it never runs; running, its row stops at the next token (its scoring, or a long
prompt's prefill once every client of the batch has gone, at the next chunk). Temperatures below
``min_temperature`` decode greedily. A lane's batcher collects what is queued for a few ms, groups requests
with the same temperature and top_p (up to ``batch_rows`` rows and ``batch_tokens`` tokens) and runs
``LocalBackend.generate`` on them in its own thread; each row keeps its own max_tokens, stop strings
and stream. A request's answer is the one ``LocalBackend.generate`` gives the same prompt with the
same seed (paired sampling across backends), up to bf16 rounding under another batch shape (or, in
the long lane, a prompt read in chunks).

``logprobs`` on chat completions: ``choices[0].logprobs.content`` holds the first reply token only,
with its ``top_logprobs`` most likely alternatives (what CRAG and Self-RAG read). ``n`` > 1 and
penalties are refused (400), not ignored. ``--fail-first N`` answers the first N completion requests
with HTTP 503 (fault injection for the client's retry path, off by default).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import dataclasses
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from mdl_jax.serving.connections import bind, run_app
from mdl_jax.serving.protocol import (
    LIMITS,
    SSE_HEADERS,
    APIError,
    ChatRequest,
    CompletionRequest,
    Limits,
    disconnected,
    install_error_handlers,
    new_id,
    now,
    parse,
    read_json,
    sse,
)
from mdl_repro.pipeline.generation import LocalBackend


class ShortFirst:
    """Short requests before everything else. The short lane holds it from the moment a request is
    queued there until its lane is empty again; the long lane waits on it between tokens and the
    scoring lane between chunks, so a short request waits for at most one decoding step or one
    scoring chunk of the long work beside it, then has the CPU (or GPU) to itself. The long lane reads
    a long prompt in chunks of ``prefill_chunk_tokens`` and waits between them too, so a short request
    also waits for at most one chunk of a long prompt's prefill."""

    def __init__(self) -> None:
        self._idle = threading.Event()
        self._idle.set()

    def hold(self) -> None:
        self._idle.clear()

    def release(self) -> None:
        self._idle.set()

    def wait(self, cancelled: Callable[[], bool]) -> None:
        """In a worker thread: until no short request is queued or running (or ``cancelled()``)."""
        while not self._idle.wait(0.05):
            if cancelled():
                return


class _LaneBackend(LocalBackend):
    """A ``LocalBackend`` with a tokenizer of its own. A Hugging Face fast tokenizer is not
    thread-safe: each batched call sets padding on the one Rust object it wraps, so two threads
    tokenizing through it at once get "Unable to create tensor" or an unpadded batch. Each lane's
    thread therefore tokenizes with its own copy; the weights stay shared (read-only)."""

    def __init__(self, model: str, **kw: Any) -> None:
        super().__init__(model, **kw)
        tok, _ = super()._lm()
        self._tok = copy.deepcopy(tok)

    def _lm(self):
        _, lm = super()._lm()
        return self._tok, lm


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
    """A queue, a batcher and one worker thread; the model is shared with the other lanes. The short
    lane holds ``gate`` while it has work; the long lane (``yields``) waits on it between tokens."""

    def __init__(self, name: str, backend, limits: Limits, gate: ShortFirst, *, holds: bool = False,
                 yields: bool = False):
        self.name, self.backend, self.limits, self.gate = name, backend, limits, gate
        self.holds, self.yields = holds, yields
        self.jobs: list[Job] = []
        self.wake = asyncio.Event()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"mdl-serve-{name}")
        self.batches = itertools.count(1)
        self.started = 0
        self.running: str | None = None  # the batch in the worker thread now (health endpoint)
        self.prefill: tuple[int, int] | None = None  # (prompt tokens read, of) while it reads a prompt in chunks
        self.enqueued_at: dict[int, tuple[float, int]] = {}

    def put(self, job: Job) -> None:
        job.future = asyncio.get_running_loop().create_future()
        self.enqueued_at[id(job)] = (time.monotonic(), self.started)
        self.jobs.append(job)
        if self.holds:
            self.gate.hold()
        self.wake.set()

    def _take(self) -> list[Job]:
        for j in self.jobs:
            if j.cancelled:  # the client went away while it was queued: it never runs
                self.enqueued_at.pop(id(j), None)
        self.jobs = [j for j in self.jobs if not j.cancelled]
        if not self.jobs:
            return []
        key = self.jobs[0].key  # the oldest request sets the sampling group: nobody starves
        batch: list[Job] = []
        tokens = 0
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

    def _idle(self) -> None:
        if self.holds and not self.jobs and self.running is None:
            self.gate.release()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.limits.batch_wait_s)  # let concurrent requests join
            batch = self._take()
            if not self.jobs:
                self.wake.clear()
            if not batch:
                self._idle()
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
                    if j.future is not None and not j.future.done():
                        j.future.set_result(r)
            except Exception as e:  # noqa: BLE001 - a failed batch fails its requests, not the server
                for j in batch:
                    if j.future is not None and not j.future.done():
                        j.future.set_exception(APIError(500, f"generation failed: {type(e).__name__}: "
                                                             f"{str(e)[:200]}", "server_error"))
            self.running = None
            self._idle()
            for j in batch:
                if j.stream is not None:
                    j.stream.put_nowait(None)

    def _generate(self, batch: list[Job], loop) -> list:
        """In the lane's thread: one ``generate`` call for the batch, then the requested logprobs."""
        def gone() -> bool:
            return all(j.cancelled for j in batch)

        def on_token(i: int, token: int) -> bool:
            self.prefill = None
            if self.yields and i == 0:  # once per step: short requests first
                self.gate.wait(gone)
            j = batch[i]
            if j.stream is not None:
                loop.call_soon_threadsafe(j.stream.put_nowait, token)
            return j.cancelled  # the client went away: end the row

        def on_prefill(done: int, total: int) -> bool:
            self.prefill = (done, total)
            self.gate.wait(gone)  # between chunks of a long prompt: short requests first
            return gone()         # every client left: the rest of the prompt is not read

        chunked = dict(prefill_chunk=self.limits.prefill_chunk_tokens, on_prefill=on_prefill) if self.yields \
            else {}
        try:
            gens = self.backend.generate([j.prompt for j in batch], seed=[j.seed for j in batch],
                                         max_new_tokens=[j.max_tokens for j in batch],
                                         temperature=batch[0].temperature, top_p=batch[0].top_p,
                                         stop=[j.stop for j in batch], on_token=on_token, **chunked)
        finally:
            self.prefill = None
        out = []
        for j, g in zip(batch, gens):
            lp = None
            if j.logprobs is not None and not isinstance(j.prompt, str) and not j.cancelled:
                k = j.logprobs
                tops, first = self.backend.top_logprobs(j.prompt, max(k, 1), g.text)
                token, x = first or tops[0]
                lp = {"content": [{"token": token, "logprob": x, "bytes": list(token.encode()),
                                   "top_logprobs": [{"token": t, "logprob": y, "bytes": list(t.encode())}
                                                    for t, y in tops[:k]]}]}
            out.append((g, lp))
        return out


class Cancelled(Exception):
    """The client of a scoring job went away: its remaining chunks are not computed."""


@dataclasses.dataclass(eq=False)
class ScoreJob:
    """One prompt to score (legacy completions, ``echo`` + ``logprobs``, ``max_tokens`` 0)."""
    text: str
    k: int
    future: asyncio.Future | None = None
    cancelled: bool = False


class ScoreLane:
    """Teacher-forced scoring in its own queue and thread, in chunks of ``score_chunk_tokens``
    positions (a KV cache carries the prefix): between chunks it yields to short requests and stops
    when its client has gone, so a 6,000-token prompt neither holds back a short chat nor outlives
    its client by more than one chunk."""

    name = "score"

    def __init__(self, backend, limits: Limits, gate: ShortFirst):
        self.backend, self.limits, self.gate = backend, limits, gate
        self.jobs: collections.deque[ScoreJob] = collections.deque()
        self.wake = asyncio.Event()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mdl-serve-score")
        self.running: str | None = None
        self.done = 0

    def put(self, job: ScoreJob) -> None:
        job.future = asyncio.get_running_loop().create_future()
        self.jobs.append(job)
        self.wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.jobs:
                j = self.jobs.popleft()
                if j.cancelled:
                    continue
                self.running = f"score-{self.done + 1}"
                try:
                    r = await loop.run_in_executor(self.pool, self.score, j)
                    if j.future is not None and not j.future.done():
                        j.future.set_result(r)
                except Cancelled:
                    pass
                except Exception as e:  # noqa: BLE001 - a failed prompt fails its request only
                    if j.future is not None and not j.future.done():
                        j.future.set_exception(APIError(500, f"scoring failed: {type(e).__name__}: "
                                                             f"{str(e)[:200]}", "server_error"))
                self.done += 1
                self.running = None

    def score(self, job: ScoreJob):
        """In the lane's thread: ``LocalBackend.prompt_logprobs`` of ``job.text``, chunk by chunk."""
        import torch
        from transformers import DynamicCache

        from mdl_repro.pipeline.generation import head_fp32, plain_head
        from mdl_repro.pipeline.generation.local import cache_kw

        tok, lm = self.backend._lm()
        if not plain_head(lm):  # no body/head split to chunk: one pass (not interruptible)
            return self.backend.prompt_logprobs(job.text, job.k)
        enc = tok(job.text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        tokens = [tok.decode([t]) for t in ids]
        offsets = [int(a) for a, _ in enc["offset_mapping"]]
        lps: list = [None]
        tops: list = [None]
        step = self.limits.score_chunk_tokens
        if len(ids) > 1:
            x = torch.tensor([ids], device=self.backend.device)
            cache = DynamicCache()
            with torch.inference_mode():
                for a in range(0, len(ids) - 1, step):
                    self.gate.wait(lambda: job.cancelled)
                    if job.cancelled:
                        raise Cancelled
                    b = min(a + step, len(ids) - 1)  # positions a..b-1 predict tokens a+1..b
                    hidden = lm.model(input_ids=x[:, a:b], use_cache=True,
                                      **{cache_kw(lm): cache}).last_hidden_state[0]
                    logp = torch.log_softmax(head_fp32(lm, hidden), -1).cpu()
                    tgt = torch.tensor(ids[a + 1:b + 1])
                    lps += logp[torch.arange(b - a), tgt].tolist()
                    if job.k > 0:
                        v, ix = torch.topk(logp, min(job.k, logp.shape[-1]), -1)
                        tops += [{tok.decode([int(t)]): float(y) for t, y in zip(ix_r, v_r)}
                                 for ix_r, v_r in zip(ix, v)]
        return tokens, lps, offsets, (tops if job.k > 0 else None)


class ModelServer:
    """State of one server: the backend, its names, the lanes, the fault injection counter.

    Tokenizers: each lane's thread has its own (``_LaneBackend``); prompts are counted in one
    thread of their own with another; streamed text is decoded on the event loop with a third."""

    def __init__(self, backend, limits: Limits = LIMITS, fail_first: int = 0,
                 names: list[str] | None = None, api_key: str | None = None):
        self.backend, self.limits = backend, limits
        self.api_key = api_key
        self.to_fail = fail_first
        self.requests = 0
        self.cancelled = 0  # requests whose client left before the answer (health endpoint)
        m = backend.model
        self.names = names or [m] + (["smollm2"] if m == "bundled:smollm2" else
                                     [os.path.basename(m.rstrip("/"))] if os.path.basename(m.rstrip("/")) != m
                                     else [])
        tok, lm = backend._lm()
        self.tok = copy.deepcopy(tok)          # the event loop's (stream decoding)
        self.count_tok = copy.deepcopy(tok)    # the counting thread's
        self.count_pool = ThreadPoolExecutor(1, thread_name_prefix="mdl-serve-count")
        self.context = int(getattr(lm.config, "max_position_embeddings", 2048))
        self.gate = ShortFirst()

        def lane_backend():
            return _LaneBackend(backend.model, batch_size=limits.batch_rows, device=backend.device,
                                dtype=backend.dtype)

        self.lanes: dict[str, Lane] = {
            "short": Lane("short", lane_backend(), limits, self.gate, holds=True),
            "long": Lane("long", lane_backend(), limits, self.gate, yields=True)}
        self.score_lane = ScoreLane(lane_backend(), limits, self.gate)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        runners: list[Lane | ScoreLane] = [*self.lanes.values(), self.score_lane]
        self.tasks = [loop.create_task(lane.run()) for lane in runners]

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

    async def read_request(self, request, kind):
        """A generation request's checked body and the model it names: the authorisation, the JSON
        body parsed into ``kind`` (a request model of ``protocol``), its unsupported fields refused."""
        self.auth(request)
        req = parse(kind, await read_json(request, self.limits))
        req.unsupported()
        return req, self.check_model(req.model)

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

    def temperature(self, value: float | None) -> float:
        """The paper's 0.7 by default; below ``min_temperature`` greedy (0): dividing logits by a
        temperature near zero overflows float32 (1e-38 gave replacement characters)."""
        t = 0.7 if value is None else value
        return 0.0 if t < self.limits.min_temperature else t

    def _count(self, prompt) -> int:
        tok = self.count_tok
        text = prompt if isinstance(prompt, str) else \
            tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return len(tok(text)["input_ids"])

    async def count(self, prompt) -> int:
        """The prompt's length in tokens, counted in the counting thread (its own tokenizer)."""
        return await asyncio.get_running_loop().run_in_executor(self.count_pool, self._count, prompt)

    def check_context(self, n_prompt: int, max_tokens: int, param: str) -> None:
        if n_prompt + max_tokens > self.context:
            raise APIError(400, f"{param}: this model's context is {self.context} tokens; the prompt has "
                                f"{n_prompt} and max_tokens asks for {max_tokens}", param=param,
                           code="context_length_exceeded")

    def queued(self) -> int:
        return sum(len(lane.jobs) for lane in self.lanes.values()) + len(self.score_lane.jobs)

    def check_queue(self, n: int = 1) -> None:
        """503 unless ``n`` more prompts fit the queue: a request is refused whole, before any of its
        prompts is queued (one queued and then refused would run for a client told "busy")."""
        if self.queued() + n > self.limits.max_queue:
            raise APIError(503, f"server busy: {self.queued()} prompts queued of at most "
                                f"{self.limits.max_queue}, and this request has {n}",
                           "server_error", code="overloaded")

    def enqueue(self, job: Job) -> Job:
        self.check_queue()
        long = job.prompt_tokens > self.limits.long_prompt_tokens or \
            job.max_tokens > self.limits.long_max_tokens
        self.lanes["long" if long else "short"].put(job)
        return job

    def enqueue_score(self, job: ScoreJob) -> ScoreJob:
        self.check_queue()
        self.score_lane.put(job)
        return job


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def until_answered(srv: ModelServer, request: Request, jobs: list) -> list:
    """The jobs' results in order; when the client disconnects first, every job is cancelled (a
    queued one never runs, a running one stops at its next token or chunk) and ClientGone raised."""
    futs = [j.future for j in jobs if j.future is not None]
    watch = asyncio.ensure_future(disconnected(request))
    try:
        while not all(f.done() for f in futs):
            await asyncio.wait({watch, *(f for f in futs if not f.done())},
                               return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                for j in jobs:
                    j.cancelled = True
                srv.cancelled += 1
                raise ClientGone
        return [f.result() for f in futs]
    finally:
        watch.cancel()


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
        lanes = {**srv.lanes, "score": srv.score_lane}
        return {"status": "ok", "queued": {k: len(v.jobs) for k, v in lanes.items()},
                "running": {k: v.running for k, v in lanes.items()},
                "prefill": {k: v.prefill for k, v in srv.lanes.items()}, "requests": srv.requests,
                "cancelled": srv.cancelled}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req, name = await srv.read_request(request, ChatRequest)
        if req.stream and req.logprobs:
            raise APIError(400, "logprobs: not supported with stream", param="logprobs")
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        mt = srv.max_tokens(req.max_completion_tokens or req.max_tokens, srv.limits.default_max_tokens)
        prompt = req.chat()
        n_prompt = await srv.count(prompt)
        srv.check_context(n_prompt, mt, "messages")
        srv.injected_failure()
        job = Job(prompt, 0 if req.seed is None else req.seed, mt, srv.temperature(req.temperature),
                  0.9 if req.top_p is None else req.top_p, list(req.stop or []), n_prompt,
                  logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                  stream=asyncio.Queue() if req.stream else None)
        srv.enqueue(job)
        cid = new_id("chatcmpl")
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(_stream_chat(srv, job, cid, name, usage), headers=SSE_HEADERS,
                                     media_type="text/event-stream")
        try:
            ((g, lp),) = await until_answered(srv, request, [job])
        except ClientGone:
            return _gone()
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
        req, name = await srv.read_request(request, CompletionRequest)
        if req.stream:
            raise APIError(400, "stream: not supported on /v1/completions (use /v1/chat/completions)",
                           param="stream")
        mt = srv.max_tokens(req.max_tokens, 16)  # 16: the legacy endpoint's default
        if req.logprobs is not None and mt > 0:
            raise APIError(400, "logprobs: only for scoring a prompt (echo: true, max_tokens: 0) here",
                           param="logprobs")
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        counts = [await srv.count(p) for p in prompts]
        for n in counts:
            if n == 0:   # nothing to continue or score (generation failed on it with a 500)
                raise APIError(400, "prompt: expected at least one token, got an empty prompt", param="prompt")
            srv.check_context(n, mt, "prompt")
        srv.injected_failure()
        choices, jobs, n_completion = [], [], 0
        if mt == 0:
            scoring = req.logprobs is not None and bool(req.echo)
            if scoring:
                srv.check_queue(len(prompts))
            sjobs = [srv.enqueue_score(ScoreJob(p, req.logprobs or 0)) for p in prompts] if scoring else []
            try:
                scored = await until_answered(srv, request, sjobs) if sjobs else []
            except ClientGone:
                return _gone()
            for i, p in enumerate(prompts):
                lp = None
                if scoring:
                    tokens, lps, offs, tops = scored[i]
                    lp = {"tokens": tokens, "token_logprobs": lps, "text_offset": offs,
                          "top_logprobs": tops}
                elif req.logprobs is not None:
                    lp = {"tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": []}
                choices.append({"index": i, "text": p if req.echo else "", "logprobs": lp,
                                "finish_reason": "length"})
        else:
            srv.check_queue(len(prompts))
            for p, n in zip(prompts, counts):
                jobs.append(srv.enqueue(Job(p, 0 if req.seed is None else req.seed, mt,
                                            srv.temperature(req.temperature),
                                            0.9 if req.top_p is None else req.top_p, list(req.stop or []), n)))
            try:
                gens = await until_answered(srv, request, jobs)
            except ClientGone:
                return _gone()
            for i, (p, (g, _)) in enumerate(zip(prompts, gens)):
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


def _gone() -> Response:
    """What a request whose client has gone gets (nobody reads it; 499 as nginx logs it)."""
    return Response(status_code=499)


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

    if job.stream is None or job.future is None:
        raise ValueError("_stream_chat: expected a queued streaming job")
    tokens, result = job.stream, job.future
    ids: list[int] = []
    sent = ""
    try:
        yield chunk({"role": "assistant", "content": ""})
        while (token := await tokens.get()) is not None:
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
            g, _ = await result
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
    p = argparse.ArgumentParser(prog="python -m mdl_repro.serve", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8123, help="port (0: any free one)")
    p.add_argument("--model", default="bundled:smollm2", help="bundled:smollm2, a Hugging Face id or a path")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-tokens", type=int, default=LIMITS.max_tokens, help="cap on a request's max_tokens")
    p.add_argument("--body-timeout", type=float, default=LIMITS.body_timeout_s,
                   help="seconds a request body may take to arrive (then 408)")
    p.add_argument("--header-timeout", type=float, default=LIMITS.header_timeout_s,
                   help="seconds a connection may take to send a request's headers (then 408 and closed)")
    p.add_argument("--send-timeout", type=float, default=LIMITS.send_timeout_s,
                   help="seconds a client may take none of its answer, and a stream may stall unread "
                        "(then its connection is reset)")
    p.add_argument("--max-connections", type=int, default=LIMITS.max_connections,
                   help="open connections at most (beyond: the oldest still sending headers is closed, else 503)")
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
    if not 0 < args.header_timeout <= 3600:
        p.error(f"--header-timeout: expected seconds in (0, 3600], got {args.header_timeout}")
    if not 0 < args.send_timeout <= 86400:
        p.error(f"--send-timeout: expected seconds in (0, 86400], got {args.send_timeout}")
    if not 1 <= args.max_connections <= 1 << 20:
        p.error(f"--max-connections: expected >= 1, got {args.max_connections}")
    try:
        import torch

        torch.device(args.device)
    except (RuntimeError, ValueError):
        p.error(f"--device: expected a torch device (cpu, cuda, cuda:0, mps), got {args.device!r}")
    if args.model.startswith(("/", "./", "../", "~")) and not os.path.exists(os.path.expanduser(args.model)):
        p.error(f"--model: {args.model}: no such model folder (a local path; a Hugging Face id looks like "
                "'org/name')")
    limits = dataclasses.replace(LIMITS, max_tokens=args.max_tokens, body_timeout_s=args.body_timeout,
                                 header_timeout_s=args.header_timeout, send_timeout_s=args.send_timeout,
                                 max_connections=args.max_connections)
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f"mdl_repro.serve: error: cannot bind {args.host}:{args.port}: {e.strerror}", file=sys.stderr)
        return 2
    backend = LocalBackend(args.model, batch_size=limits.batch_rows, device=args.device)
    try:
        srv = ModelServer(backend, limits, args.fail_first,
                          api_key=args.api_key or os.environ.get("MDL_JAX_SERVE_API_KEY") or None)
    except (OSError, ValueError, RuntimeError) as e:  # no such model, no weights, a bad device
        sock.close()
        print(f"mdl_repro.serve: error: --model {args.model} on --device {args.device}: "
              f"{' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 2  # loads the model before accepting requests
    host, port = sock.getsockname()[:2]
    print(f"serving {args.model} on http://{host}:{port}/v1", flush=True)
    run_app(make_app(srv), sock, limits)
    return 0
