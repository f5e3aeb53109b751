"""An OpenAI-compatible MDL gateway: MDL decides, per request, whether and how retrieved memories reach
the model behind it.

    mdl-jax gateway --upstream http://127.0.0.1:8123/v1 [--host 127.0.0.1] [--port 8300] [--config FILE]

A client sends an ordinary chat completion with its retrieved memories in one extra field (with the
``openai`` client: ``extra_body={"mdl": {...}}``)::

    "mdl": {"memories": ["text", {"text": "...", "source": "..."}, ...],   # default []
            "risk": 0.7,            # optional: A in [0, 1] for this request (else the gateway's --risk)
            "category": "Health"}   # optional: for a category table / preset risk assessor

The gateway decides on the last user message and the memories (``mdl_jax.gate.MemoryGate``), builds
the messages for the action (Active: the memories before the question; Supp: with the caution;
Silent: the chat unchanged) and forwards them upstream with every other field as sent; Opt-Out
answers with the abstention and never calls the upstream. The answer is the upstream's completion
plus an ``mdl`` object: ``{"action", "scalars": {M, R, A, phi, C, alpha, C_final, E_wm, E_r, E_a},
"memories", "upstream": bool}``. Streaming passes through; the ``mdl`` object rides on the first chunk.
Headers ``x-mdl-decision-ms`` / ``x-mdl-decision-batch``: the decision's time and how many requests shared it.

The caller's ``Authorization`` header goes upstream as is and is never logged (no access log).
Malformed requests get OpenAI-style 4xx errors (memories over ``max_memory_bytes`` in one request
included); an upstream 4xx comes back as it was; an upstream that fails (refused, reset, 5xx, not
strict JSON, over ``max_upstream_bytes``, or not done within ``--timeout``, which bounds the whole
call, not each read) gives 502 with the reason, and the gateway keeps serving; a stream whose upstream
sends garbage or runs past the deadline ends with an error event. A client that leaves ends its
upstream call and closes that connection. Memory vectors are kept in memory under a digest of their
text (``BoundedEmbedder``, ``embed_cache_texts`` and ``embed_cache_bytes``), never on disk. Decisions
run off the event loop, batched across concurrent requests (one embedding pass): that side of the
gateway, ``GateBatcher`` and ``BoundedEmbedder``, is ``mdl_jax.serving.decisions``; this module is the
HTTP side (the request, the upstream call, the stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import zlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator
from starlette.responses import JSONResponse, Response, StreamingResponse

from mdl_jax.serving.decisions import BoundedEmbedder as BoundedEmbedder
from mdl_jax.serving.decisions import GateBatcher as GateBatcher
from mdl_jax.serving.protocol import (
    LIMITS,
    SSE_HEADERS,
    APIError,
    Limits,
    Message,
    disconnected,
    install_error_handlers,
    new_id,
    now,
    parse,
    read_json,
    sse,
    strict_json,
)
from mdl_jax.signals.embeddings import Embedder
from mdl_jax.strict_json import StrictJSONError


class MemoryItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: StrictStr


class MDLField(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memories: list[StrictStr | MemoryItem] = Field(default_factory=list, max_length=256)
    risk: float | None = Field(None, strict=True, ge=0.0, le=1.0)
    category: StrictStr | None = None

    @field_validator("memories")
    @classmethod
    def _texts(cls, v):
        for m in v:
            if not (m if isinstance(m, str) else m.text).strip():
                raise ValueError("a memory text must not be empty")
        return v


class GatewayRequest(BaseModel):
    """What the gateway reads; every other field goes upstream untouched (the upstream validates it)."""
    model_config = ConfigDict(extra="allow")
    model: StrictStr
    messages: list[Message] = Field(min_length=1, max_length=LIMITS.max_messages)
    stream: bool | None = Field(None, strict=True)
    mdl: MDLField = Field(default_factory=lambda: MDLField.model_validate({}))

    def query(self) -> str:
        users = [m for m in self.messages if m.role == "user"]
        if not users or not users[-1].text().strip():
            raise APIError(400, "messages: expected a user message with text (MDL decides on the last one)",
                           param="messages")
        return users[-1].text()


class TooLarge(Exception):
    """An upstream answer over ``max_upstream_bytes`` (decoded)."""


class ClientGone(Exception):
    """The client left before its upstream call ended."""


class _Decoder:
    """Content-Encoding (identity, gzip, deflate) undone with the output bounded per call: a small
    gzip body cannot expand past the limit in memory (httpx would decode each chunk whole)."""

    def __init__(self, r: httpx.Response):
        enc = r.headers.get("content-encoding", "identity").strip().lower()
        if enc not in ("", "identity", "gzip", "x-gzip", "deflate"):
            raise ValueError(f"an unsupported Content-Encoding ({enc[:40]})")
        self.z = None if enc in ("", "identity") else zlib.decompressobj(zlib.MAX_WBITS | 32)
        self.raw_deflate = enc == "deflate"

    def feed(self, data: bytes, room: int) -> bytes:
        """Decoded bytes of ``data``, at most ``room`` + 1 of them (one more means: over)."""
        if self.z is None:
            return data[:room + 1]
        out = bytearray()
        while data and len(out) <= room:
            try:
                out += self.z.decompress(data, room + 1 - len(out))
            except zlib.error:
                if not (self.raw_deflate and not out):
                    raise
                self.z, self.raw_deflate = zlib.decompressobj(-zlib.MAX_WBITS), False  # raw deflate
                continue
            data = self.z.unconsumed_tail
        return bytes(out)


def as_request_error(e: ValueError) -> tuple[str, str]:
    """(message, param) of a ``MemoryGate.check`` error for one request, its field named as the request
    names it: ``categories[0]`` is ``mdl.category``, ``memories_lists[0][i]`` ``mdl.memories[i]``."""
    field, sep, why = str(e).partition(":")
    renamed = {"queries[0]": "messages", "categories[0]": "mdl.category", "risks[0]": "mdl.risk"}.get(field)
    if renamed is None and field.startswith("memories_lists[0]"):
        renamed = "mdl.memories" + field[len("memories_lists[0]"):]
    if renamed is None or not sep:
        return f"mdl: {e}", "mdl"
    return f"{renamed}:{why}", renamed.partition("[")[0]


class Gateway:
    """MDL in front of one upstream: the gate, the upstream's address, the limits, the HTTP client.

    Args:
      gate: a ``MemoryGate`` (its ``Embedder`` is replaced by a ``BoundedEmbedder``).
      upstream: the upstream's base URL, http(s).
      limits: the servers' ``Limits``.
      timeout: seconds one whole upstream call may take (default ``limits.upstream_timeout_s``).

    Raises:
      ValueError: ``upstream`` is not an http(s) base URL (a query or fragment would stand before the
        paths the gateway appends), or ``timeout`` is not a number > 0.
    """

    def __init__(self, gate, upstream: str, limits: Limits = LIMITS, timeout: float | None = None):
        u = urlsplit(upstream)
        if u.scheme not in ("http", "https") or not u.hostname or "?" in upstream or "#" in upstream:
            raise ValueError(f"upstream: expected an http(s) base URL like http://127.0.0.1:8123/v1, without "
                             f"?query or #fragment, got {upstream!r}")
        timeout = limits.upstream_timeout_s if timeout is None else timeout
        if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and 0 < timeout < float("inf")):
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        self.upstream = upstream.rstrip("/")
        self.where = f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"  # for errors
        if isinstance(getattr(gate, "embedder", None), Embedder):
            # clients send the memories: keep their vectors bounded, never on disk (see BoundedEmbedder)
            gate.embedder = BoundedEmbedder.like(gate.embedder, limits.embed_cache_texts, limits.embed_cache_bytes)
        self.gate, self.limits, self.timeout = gate, limits, float(timeout)
        self.batcher: GateBatcher | None = None
        self.http: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        """The upstream HTTP client (made when the app starts, by its lifespan)."""
        if self.http is None:
            raise RuntimeError("the gateway's app has not started (no HTTP client yet)")
        return self.http

    def decisions(self) -> GateBatcher:
        if self.batcher is None:
            raise RuntimeError("the gateway's app has not started (no decision batcher yet)")
        return self.batcher

    def headers(self, request: Request) -> dict:
        """What goes upstream: the caller's key (never logged) and content type."""
        h = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}
        for name in ("authorization", "openai-organization", "openai-project"):
            if name in request.headers:
                h[name] = request.headers[name]
        return h

    def failed(self, e: Exception) -> APIError:
        if isinstance(e, httpx.TimeoutException):
            why = f"no answer within {self.timeout:g} s"
        elif isinstance(e, httpx.ConnectError):
            why = "connection refused"
        else:
            why = f"{type(e).__name__}"
        return APIError(502, f"upstream {self.where} failed: {why}", "upstream_error", code="upstream_error")

    def bad(self, why: str) -> APIError:
        return APIError(502, f"upstream {self.where} {why}", "upstream_error", code="upstream_error")

    def late(self) -> APIError:
        return self.bad(f"failed: no complete answer within {self.timeout:g} s (the gateway's --timeout)")

    def deadline(self) -> float:
        """When an upstream call starting now must have ended (the event loop's clock)."""
        return asyncio.get_running_loop().time() + self.timeout

    async def bounded(self, request: Request, work, deadline: float):
        """``work`` (a coroutine: one upstream call) to its end, its ``deadline`` or its client's
        leaving, whichever comes first. httpx's timeout bounds each read, not the call (an upstream
        dripping a byte a second never trips it), and a client that left would otherwise hold the
        upstream connection to the end: the call is cancelled, which closes its connection, and
        this returns only after that.

        Raises:
          APIError: 502 at the deadline (and whatever ``work`` raises).
          ClientGone: the client disconnected first.
        """
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(disconnected(request))
        try:
            left = deadline - asyncio.get_running_loop().time()
            done, _ = await asyncio.wait({task, watch}, timeout=max(left, 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            if watch in done:
                raise ClientGone
            raise self.late()
        finally:
            task.cancel()
            watch.cancel()
            await asyncio.gather(task, watch, return_exceptions=True)

    async def chunks(self, r: httpx.Response, limit: int) -> AsyncIterator[bytes]:
        """The decoded body of ``r`` as it arrives; TooLarge once more than ``limit`` bytes came."""
        try:
            dec = _Decoder(r)
        except ValueError as e:
            raise self.bad(f"answered with {e}") from None
        got = 0
        async for raw in r.aiter_raw():
            try:
                data = dec.feed(raw, limit - got)
            except zlib.error:
                raise self.bad("answered with a body that does not decompress") from None
            got += len(data)
            if got > limit:
                raise TooLarge
            yield data

    async def read(self, r: httpx.Response) -> bytes:
        """The whole (decoded) body of ``r``, or a 502 when it is over ``max_upstream_bytes``."""
        limit = self.limits.max_upstream_bytes
        cl = r.headers.get("content-length", "")
        too_big = self.bad(f"answered with more than {limit} bytes (the gateway's limit)")
        if cl.isdigit() and int(cl) > limit and "content-encoding" not in r.headers:
            raise too_big
        buf = bytearray()
        try:
            async for data in self.chunks(r, limit):
                buf += data
        except TooLarge:
            raise too_big from None
        return bytes(buf)

    async def send(self, request, method: str, url: str, body) -> httpx.Response:
        """The upstream's answer to ``body``, its body not yet read (the caller closes it); a call
        that fails raises ``failed``'s error."""
        try:
            req = self.client().build_request(method, url, json=body, headers=self.headers(request))
            return await self.client().send(req, stream=True)
        except httpx.HTTPError as e:
            raise self.failed(e) from None

    async def read_and_close(self, r: httpx.Response) -> bytes:
        """``read``, with ``r`` closed after, however it ends (a body that fails mid-way raises
        ``failed``'s error)."""
        try:
            return await self.read(r)
        except httpx.HTTPError as e:
            raise self.failed(e) from None
        finally:
            await r.aclose()

    def parse(self, body: bytes, what: str):
        """The upstream's JSON, strictly (no NaN, no lone surrogates, not too deep), else a 502."""
        try:
            return strict_json(body, self.limits.max_json_depth)
        except StrictJSONError as e:
            raise self.bad(f"{what} ({e})") from None

    async def call(self, method: str, path: str, request, *, what: str, json_body=None,
                   valid=lambda o: True):
        """One upstream call, within ``timeout`` and only while its client is there: its JSON body,
        or the caller's answer for an upstream 4xx (a Response); a refused / timed-out call, a 5xx,
        a body over the size limit or one that is not ``valid`` strict JSON raises a 502 saying so;
        a client that left raises ClientGone."""

        async def fetch() -> tuple[httpx.Response, bytes]:
            r = await self.send(request, method, self.upstream + path, json_body)
            return r, await self.read_and_close(r)

        r, body = await self.bounded(request, fetch(), self.deadline())
        if r.status_code != 200:
            err = self.upstream_status(r, body)
            if isinstance(err, APIError):
                raise err
            return err
        out = self.parse(body, what)
        if not valid(out):
            raise self.bad(what)
        return out

    def upstream_status(self, r: httpx.Response, body: bytes) -> APIError | JSONResponse:
        """An upstream error answer: 4xx back to the caller as it was (its fault); else 502."""
        try:
            obj = strict_json(body, self.limits.max_json_depth)
        except StrictJSONError:
            obj = None
        if 400 <= r.status_code < 500:
            # with what tells the client when to come back (a 429's Retry-After): a header's first value
            kept: dict[str, str] = {}
            for k, v in r.headers.multi_items():
                if k.lower() in _PASSED_HEADERS or k.lower().startswith("x-ratelimit-"):
                    kept.setdefault(k.lower(), v)
            if not isinstance(obj, dict):   # a text or HTML body (a proxy's): OpenAI's shape, the status kept
                obj = APIError(r.status_code, f"upstream {self.where}: HTTP {r.status_code}",
                               "rate_limit_error" if r.status_code == 429 else "invalid_request_error").body()
            return JSONResponse(obj, status_code=r.status_code, headers=kept)
        try:
            msg = str(obj["error"]["message"])[:200]
        except (KeyError, TypeError):
            msg = body[:200].decode("utf-8", "replace")
        return APIError(502, f"upstream {self.where} answered HTTP {r.status_code}: {msg}",
                        "upstream_error", code="upstream_error")


# An upstream 4xx's headers the caller gets with its body (and every x-ratelimit-*): when to retry, and
# the upstream's id of the request for its logs
_PASSED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")


def make_app(gw: Gateway):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        gw.http = httpx.AsyncClient(timeout=httpx.Timeout(gw.timeout, connect=10.0),
                                    limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        gw.batcher = GateBatcher(gw.gate)
        task = asyncio.get_running_loop().create_task(gw.batcher.run())
        yield
        task.cancel()
        await gw.http.aclose()

    app = FastAPI(title="mdl-jax gateway", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        e = getattr(gw.gate, "embedder", None)
        cache = {"texts": len(e.cache), "max_texts": e.max_texts, "bytes": e.nbytes, "max_bytes": e.max_bytes} \
            if isinstance(e, BoundedEmbedder) else None
        return {"status": "ok", "upstream": gw.where, "embedding_cache": cache}

    @app.get("/v1/models")
    async def models(request: Request):
        try:
            out = await gw.call("GET", "/models", request, what="answered /models with a body that is not JSON")
        except ClientGone:
            return Response(status_code=499)  # the client left: nobody reads it (499 as nginx logs it)
        return out if isinstance(out, Response) else JSONResponse(out)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        obj = await read_json(request, gw.limits)
        req = parse(GatewayRequest, obj)
        query = req.query()
        mems = [m if isinstance(m, str) else m.model_dump() for m in req.mdl.memories]
        size = sum(len((m if isinstance(m, str) else m.text).encode()) for m in req.mdl.memories)
        if size > gw.limits.max_memory_bytes:
            raise APIError(400, f"mdl.memories: {size} bytes of memory text in one request, over the limit "
                                f"of {gw.limits.max_memory_bytes} (max_memory_bytes)", param="mdl.memories",
                           code="memories_too_large")
        try:
            gw.gate.check([query], [mems], [req.mdl.category], [req.mdl.risk])
        except ValueError as e:
            message, param = as_request_error(e)
            raise APIError(400, message, param=param) from None
        d, took, rows = await gw.decisions().decide(query, mems, req.mdl.category, req.mdl.risk)
        timing = {"x-mdl-decision-ms": f"{1e3 * took:.2f}", "x-mdl-decision-batch": str(rows)}
        messages = d.build_messages([m.model_dump(exclude_none=True) for m in req.messages])
        info = {**d.to_dict(), "upstream": messages is not None}
        if messages is None:  # Opt-Out: the abstention, no model call
            return _abstain(req, d.abstention, info, timing)
        body = {k: v for k, v in obj.items() if k != "mdl"}
        body["messages"] = messages
        url = gw.upstream + "/chat/completions"
        try:
            if req.stream:
                return await _forward_stream(gw, request, url, body, info, timing)
            out = await gw.call("POST", "/chat/completions", request, json_body=body,
                                what="answered with a body that is not a chat completion",
                                valid=lambda o: isinstance(o, dict) and isinstance(o.get("choices"), list))
        except ClientGone:
            return Response(status_code=499)  # as above
        if isinstance(out, Response):
            return out
        out["mdl"] = info
        return JSONResponse(out, headers=timing)

    return app


def _abstain(req: GatewayRequest, text: str, info: dict, timing: dict):
    cid, created = new_id("chatcmpl-mdl"), now()
    if not req.stream:
        return JSONResponse({
            "id": cid, "object": "chat.completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "mdl": info}, headers=timing)

    # stream_options.include_usage: as OpenAI streams it, "usage": null on each chunk and a last chunk
    # of no choices carrying it (zeros: no model was called)
    options = (req.model_extra or {}).get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True

    def chunk(delta, finish=None, **extra):
        return sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                    **({"usage": None} if usage else {}), **extra})

    async def events():
        yield chunk({"role": "assistant", "content": ""}, mdl=info)
        yield chunk({"content": text})
        yield chunk({}, "stop")
        if usage:
            yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                       "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
        yield sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream", headers={**SSE_HEADERS, **timing})


_LINE_END = re.compile(rb"\r\n|\r|\n")


async def _forward_stream(gw: Gateway, request: Request, url: str, body: dict, info: dict, timing: dict):
    """Open the upstream stream first (its errors are still an HTTP status), then pass events through,
    the ``mdl`` object added to the first one. Every event is checked (strict JSON object or
    ``[DONE]``, at most ``max_event_bytes``, the stream at most ``max_upstream_bytes``): an upstream
    that sends garbage, too much, ends without ``[DONE]``, dies mid-stream or is not done by the
    call's deadline gets the client an OpenAI-style error event naming it, then ``[DONE]`` (the
    status line has gone out). Until the stream opens, a client that leaves ends the call
    (ClientGone); after, the response's own disconnect watch does."""
    deadline = gw.deadline()

    async def open_stream() -> tuple[httpx.Response, bytes | None]:
        """The upstream's response, open when it is a stream; else closed, with its body."""
        r = await gw.send(request, "POST", url, body)
        if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
            return r, None
        return r, await gw.read_and_close(r)

    r, raw = await gw.bounded(request, open_stream(), deadline)
    if raw is not None:
        if r.status_code == 200:
            raise gw.bad("answered a stream request with something other than server-sent events "
                         f"(Content-Type {r.headers.get('content-type', 'none')[:60]!r})")
        err = gw.upstream_status(r, raw)
        if isinstance(err, APIError):
            raise err
        return err

    def event(data: bytes, first: bool) -> tuple[bytes, bool, bool]:
        """One upstream event's data → what the client gets, whether it was [DONE], and whether it
        carries the ``mdl`` object (the first event that is not an error does)."""
        if data.strip() == b"[DONE]":
            return sse("[DONE]"), True, False
        ev = gw.parse(data, "sent an event that is not a JSON object")
        if not isinstance(ev, dict):
            raise gw.bad("sent an event that is not a JSON object")
        carries = first and ev.get("error") is None   # {"error": null} is an answer's chunk
        if carries:
            ev["mdl"] = info
        return sse(ev), False, carries

    async def arriving() -> AsyncIterator[bytes]:
        """The stream's decoded chunks until the call's deadline (then a 502 error)."""
        it = gw.chunks(r, gw.limits.max_upstream_bytes).__aiter__()
        loop = asyncio.get_running_loop()
        while True:
            try:
                chunk = await asyncio.wait_for(it.__anext__(), max(deadline - loop.time(), 0.0))
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise gw.late() from None
            yield chunk

    async def events():
        limit_ev = gw.limits.max_event_bytes
        # Lines end at CRLF, LF or a lone CR (the SSE format's three). The buffer is read by position and
        # each byte is scanned once, so a chunk costs time linear in its size. ``size``: the current
        # event's data as it will be joined (its lines and the LFs between them); ``junk``: the bytes of
        # the other lines since the last event (comments, ids, blank lines): each bounded by
        # ``max_event_bytes``, so no flood of lines stalls the loop. A CR that ends a chunk ends its line
        # at once; an LF that opens the next chunk is then its pair, not a blank line.
        buf, pos, look = bytearray(), 0, 0
        data: list[bytes] = []
        size = junk = 0
        first, done, seen, after_cr = True, False, False, False
        try:
            async for chunk in arriving():
                buf += chunk
                if after_cr and len(buf) > pos:
                    pos, after_cr = pos + (buf[pos:pos + 1] == b"\n"), False
                    look = max(look, pos)
                while not done:
                    m = _LINE_END.search(buf, look)
                    if m is None:
                        look = len(buf)
                        pending = len(buf) - pos - len(b"data: ")   # the least the unfinished line adds
                        if pending > 0 and size + (1 if data else 0) + pending > limit_ev:
                            raise gw.bad(f"sent an event over {limit_ev} bytes (the gateway's limit)")
                        break
                    line, pos = bytes(buf[pos:m.start()]), m.end()
                    look, after_cr = pos, m.group() == b"\r" and pos == len(buf)
                    if line.startswith(b"data:"):
                        data.append(line[5:].removeprefix(b" "))
                        size += len(data[-1]) + (1 if len(data) > 1 else 0)
                        if size > limit_ev:
                            raise gw.bad(f"sent an event over {limit_ev} bytes (the gateway's limit)")
                    elif not line and data:  # a blank line ends an event
                        out, done, carried = event(b"\n".join(data), first)
                        data, size, junk, first, seen = [], 0, 0, first and not carried, True
                        yield out
                    else:
                        junk += len(line) + 1
                        if junk > limit_ev:
                            raise gw.bad(f"sent over {limit_ev} bytes of lines that are no event (the gateway's limit)")
                del buf[:pos]
                look, pos = look - pos, 0
                if done:
                    return
            if data:  # the last event without its blank line
                out, done, _ = event(b"\n".join(data), first)
                yield out
            if not done:
                raise gw.bad("ended the stream without [DONE]" if seen or data else
                             "ended the stream without sending an event")
        except TooLarge:
            yield sse(gw.bad(f"sent a stream over {gw.limits.max_upstream_bytes} bytes "
                             "(the gateway's limit)").body())
            yield sse("[DONE]")
        except APIError as e:
            yield sse(e.body())
            yield sse("[DONE]")
        except httpx.HTTPError as e:
            yield sse(gw.failed(e).body())
            yield sse("[DONE]")
        finally:
            await r.aclose()

    return _Stream(events(), deadline, headers={**SSE_HEADERS, **timing})


class _Stream(StreamingResponse):
    """A stream that waits on its client no longer than on its upstream (a client that stopped reading held
    the upstream call and a pooled connection past the deadline): a send not taken by ``deadline`` ends it
    and the upstream call, the response unfinished (the server closes it); past it no send waits."""

    def __init__(self, events, deadline: float, headers: dict):
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.deadline = deadline

    async def stream_response(self, send) -> None:
        async def timed(message) -> None:
            async with asyncio.timeout_at(self.deadline):
                await send(message)
        try:
            await super().stream_response(timed)
        except TimeoutError:
            await self.body_iterator.aclose()  # events()'s finally closes the upstream call
