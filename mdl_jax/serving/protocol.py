"""What the local model server and the MDL gateway share: the OpenAI wire protocol as pydantic models
that check types and ranges before any work, errors in OpenAI's JSON shape, the limits (one place),
a body reader that cannot be hung or flooded, and server-sent events.

Error body, always: ``{"error": {"message", "type", "param", "code"}}`` with 400 (bad request, NaN
or Infinity included; a request framed by both Content-Length and Transfer-Encoding, answered and
the connection closed), 404 (unknown model or route), 405, 408 (the headers or the body did not arrive
in time), 413 (body too large), 502 (the gateway's upstream failed, answered what cannot be passed on,
answered more than ``max_upstream_bytes`` or not within ``upstream_timeout_s``), 503 (overloaded:
queue or connection limit, or an injected failure). Streams end with such an error object as their
last event before ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from mdl_jax.strict_json import StrictJSONError, loads


@dataclasses.dataclass(frozen=True)
class Limits:
    """Every limit of both servers, and what exceeding it gets (CLI flags override some)."""
    # --- connections (both servers; enforced below HTTP, by ``mdl_jax.serving.connections``) ---
    header_timeout_s: float = 10.0      # a request's headers must arrive within this of the connection
                                        # opening (or of the previous answer) → 408, connection closed
    keep_alive_s: float = 5.0           # an idle keep-alive connection is closed after this (uvicorn;
                                        # whole seconds, rounded up)
    max_connections: int = 4096         # open connections; one more closes the oldest connection still
                                        # sending its headers, or (none such) gets 503 and is closed
    max_body_bytes: int = 1 << 20       # a request body; larger → 413 before it is read
    body_timeout_s: float = 10.0        # the whole body must arrive within this (a short body under a
                                        # larger Content-Length would otherwise pin the connection) → 408
    send_timeout_s: float = 300.0       # a client that takes none of its answer for this long after it
                                        # is written (a slow reader's clock restarts each time some goes
                                        # out), or whose stream stalls this long with over 64 KiB unsent,
                                        # is reset and its buffers freed (the gateway: its --timeout; the
                                        # model server: --send-timeout)
    # A request with both Content-Length and Transfer-Encoding is answered 400 and its connection
    # closed (RFC 9112 §6.1): a proxy that frames by Content-Length would otherwise pass bytes that
    # the server reads as a second request (request smuggling).
    # --- requests (both servers) ---
    max_tokens: int = 2048              # cap on max_tokens (default 150, the paper's) → 400
    default_max_tokens: int = 150
    max_messages: int = 512             # → 400
    max_stop: int = 4                   # stop strings per request (OpenAI's limit) → 400
    max_prompts: int = 64               # legacy completions: prompts per request → 400
    max_logprobs: int = 20              # → 400
    # JSON numbers must be finite: NaN, Infinity and 1e999 → 400 (strict JSON; json.loads takes them)
    max_json_depth: int = 64            # levels of objects and lists in a body (a request's → 400; an
                                        # upstream answer's at the gateway → 502)
    # --- the local model server ---
    min_temperature: float = 1e-5       # a temperature below this (but >= 0) is greedy decoding, as
                                        # vLLM's: logits / 1e-38 overflow float32
    max_queue: int = 512                # requests waiting for the model; more → 503
    batch_rows: int = 16                # rows per generation batch
    batch_tokens: int = 16384           # Σ (prompt + max_tokens) per batch
    batch_wait_s: float = 0.005         # how long the batcher waits for more requests to join
    long_prompt_tokens: int = 1024      # beyond either, a request runs in the long lane, so it never
    long_max_tokens: int = 256          # holds back the short ones
    score_chunk_tokens: int = 64        # echo scoring runs in chunks of this many positions: between
                                        # them it yields to short requests and notices a gone client
    prefill_chunk_tokens: int = 256     # the long lane reads a prompt in chunks of this many tokens:
                                        # between them it yields to short requests and notices a gone client
    # --- the gateway ---
    upstream_timeout_s: float = 300.0   # one whole upstream call, from sending the request to the last
                                        # byte of the answer or stream (--timeout): → 502, or an error
                                        # event ending a stream whose status line has gone out
    max_upstream_bytes: int = 8 << 20   # an upstream answer (decoded), or a whole upstream stream,
                                        # larger → 502 (or an error event ending the stream)
    max_event_bytes: int = 1 << 20      # one server-sent event from the upstream; larger → error event
    max_memory_bytes: int = 256 << 10   # the memories of one request together, UTF-8 bytes of their
                                        # texts; more → 400 naming mdl.memories
    embed_cache_texts: int = 20000      # memory and query embeddings kept (in memory, least recently
                                        # used dropped first; nothing a client sends is written to disk)
    embed_cache_bytes: int = 64 << 20   # and the bytes they hold at most: each kept under a digest of
                                        # its text (never the text), counted as the digest's and the
                                        # vector's Python size; least recently used dropped first


LIMITS = Limits()


class APIError(Exception):
    """An error answered as OpenAI does: HTTP ``status`` and ``{"error": {...}}``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def error_response(e: APIError):
    from starlette.responses import JSONResponse

    headers = {"Connection": "close"} if e.status in (408, 413, 415) else None   # (a body left unread)
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def install_error_handlers(app) -> None:
    """Every error the app can raise leaves as OpenAI-shaped JSON (routes, methods and crashes too)."""
    from starlette.exceptions import HTTPException

    async def api_error(request, exc: APIError):
        return error_response(exc)

    async def http_error(request, exc: HTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) \
            else str(exc.detail)
        return error_response(APIError(exc.status_code, msg, "invalid_request_error", None, kind))

    async def crash(request, exc: Exception):
        return error_response(APIError(500, f"internal error: {type(exc).__name__}", "server_error"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, crash)


# --- reading a request ----------------------------------------------------------------------------

def _check_strings(x, path: str = "") -> None:
    """Lone surrogates pass json.loads but cannot be encoded or tokenized: refuse them here (``x`` is
    nested no deeper than ``strict_json`` allowed, which it checked first)."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, f"{path or 'body'}: string contains a lone surrogate (not valid Unicode)",
                           param=path or None) from None
    elif isinstance(x, dict):
        for k, v in x.items():
            _check_strings(k, path)
            _check_strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _check_strings(v, f"{path}[{i}]")


# A body over the limit is read and dropped (up to this many bytes) before the 413 goes out: closing a
# connection with unread bytes in its receive buffer makes the kernel send a reset, which destroys the
# 413 before a keep-alive client (the openai client's pool) reads it. Larger bodies are not worth
# reading: for them the connection is closed at once (a reset is then the answer).
DRAIN_MAX_BYTES = 64 << 20
# Draining stops when nothing arrives for this long (a client that sent only the headers and waits).
DRAIN_IDLE_S = 0.5


async def _drain(stream, n_max: int, limits: Limits) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout_s
    got = 0
    while got < n_max:
        wait = min(DRAIN_IDLE_S, deadline - loop.time())
        if wait <= 0:
            return
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), wait)
        except Exception:  # noqa: BLE001 - the body's end, an idle client, one that went away: the 413 is next
            return
        got += len(chunk)


async def read_json(request, limits: Limits = LIMITS) -> dict:
    """The request body as a JSON object, or an APIError: 415 for a Content-Type other than JSON (none
    is read as JSON), 413 over ``max_body_bytes`` (by header or as it streams), 408 when it does not
    arrive within ``body_timeout_s``, 400 when it is not UTF-8, not JSON, not an object or holds lone
    surrogates."""
    kind = request.headers.get("content-type")
    if kind is not None:
        media = kind.split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            # a form or text/plain POST is what a web page may send to 127.0.0.1 without a preflight:
            # refused before its body is read, so no page can spend the model's time
            raise APIError(415, f"Content-Type: expected application/json, got {kind[:80]!r}",
                           param="Content-Type", code="unsupported_media_type")
    cl = request.headers.get("content-length")
    stream = request.stream().__aiter__()
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise APIError(400, f"Content-Length: expected an integer, got {cl!r}") from None
        if n > limits.max_body_bytes:
            if n <= DRAIN_MAX_BYTES:
                await _drain(stream, n, limits)
            raise APIError(413, f"body: {n} bytes is over the limit of {limits.max_body_bytes}",
                           code="request_too_large")

    async def collect() -> bytes | None:
        buf = bytearray()
        async for chunk in stream:
            buf += chunk
            if len(buf) > limits.max_body_bytes:
                return None   # over the limit: drained below, outside this wait (a 413, not a 408)
        return bytes(buf)

    try:
        raw = await asyncio.wait_for(collect(), limits.body_timeout_s)
    except TimeoutError:
        raise APIError(408, f"body: not received within {limits.body_timeout_s:g} s "
                            "(is Content-Length right?)", code="request_timeout") from None
    if raw is None:
        await _drain(stream, DRAIN_MAX_BYTES - limits.max_body_bytes, limits)
        raise APIError(413, f"body: over the limit of {limits.max_body_bytes} bytes", code="request_too_large")
    try:
        obj = strict_json(raw, limits.max_json_depth)
    except StrictJSONError as e:
        raise APIError(400, f"body: {e}", param=e.param) from None
    if not isinstance(obj, dict):
        raise APIError(400, f"body: expected a JSON object, got {_json_kind(obj)}")
    return obj


async def disconnected(request) -> None:
    """Returns when the client of ``request`` has gone. Call it once the body has been read: the
    next message is then the disconnect (or one empty body message for a request without a body)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # a stray empty body message: do not spin


def strict_json(raw: bytes, max_depth: int = LIMITS.max_json_depth):
    """Parse ``raw`` as strict JSON (``mdl_jax.strict_json.loads``): UTF-8, no NaN / Infinity /
    out-of-range numbers (Python's json takes them; they cannot be sent on), nesting of at most
    ``max_depth`` levels, no lone surrogates (they pass json.loads but cannot be encoded again).

    Args:
      raw: the body's bytes.
      max_depth: the levels of objects and lists allowed (``Limits.max_json_depth``).

    Returns:
      Its value.

    Raises:
      StrictJSONError: saying which rule the bytes break (and ``param``, where a string is not Unicode).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StrictJSONError(f"not valid UTF-8 (byte {e.start})") from None
    try:
        obj = loads(text, max_depth=max_depth)
    except StrictJSONError:
        raise
    except ValueError as e:
        raise StrictJSONError(f"not valid JSON ({e})") from None
    try:
        _check_strings(obj)
    except APIError as e:
        raise StrictJSONError(e.message.removeprefix("body: "), e.param) from None
    return obj


def _json_kind(x) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(x), "a number")


def parse(model: type[BaseModel], obj: dict):
    """Validate ``obj`` against a request model; the first error becomes a 400 naming the field."""
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        # the deepest error: for a union it is the member that matched the input's kind
        errs = e.errors(include_url=False)
        err = max(errs, key=lambda x: len([y for y in x["loc"] if not _union_tag(y)]))
        loc = [x for x in err["loc"] if not _union_tag(x)]
        param = "".join(f"[{x}]" if isinstance(x, int) else (f".{x}" if i else str(x))
                        for i, x in enumerate(loc)) or None
        got = err.get("input")
        shown = json.dumps(got, ensure_ascii=False)[:80] if _jsonable(got) else type(got).__name__
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        raise APIError(400, f"{param or 'body'}: {msg} (got {shown})", param=param) from None


def _union_tag(x) -> bool:
    """pydantic puts the tried member of a union into an error's location ('str', 'list[TextPart]')."""
    return isinstance(x, str) and (x in ("str", "int", "float", "bool", "list", "dict")
                                   or "[" in x or x.startswith("function-") or x[:1].isupper())


def _jsonable(x) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


# --- request models -------------------------------------------------------------------------------

class _Req(BaseModel):
    # Fields a client may send that we neither use nor refuse pass through (OpenAI adds fields over
    # time); fields we cannot honour are refused by name in ``unsupported``.
    model_config = ConfigDict(extra="allow")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(strict=True)


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: str | None = Field(None, strict=True)

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


def _stop_list(v):
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if len(v) > LIMITS.max_stop:
        raise ValueError(f"at most {LIMITS.max_stop} stop strings")
    if any(not s for s in v):
        raise ValueError("stop strings must not be empty")
    return v


class _Sampling(_Req):
    model: str | None = Field(None, strict=True)
    temperature: float | None = Field(None, strict=True, ge=0.0, le=2.0)
    top_p: float | None = Field(None, strict=True, ge=0.0, le=1.0)
    seed: int | None = Field(None, strict=True, ge=-(1 << 63), le=(1 << 63) - 1)
    stop: StrictStr | list[StrictStr] | None = None
    n: int | None = Field(None, strict=True, ge=1)
    stream: bool | None = Field(None, strict=True)
    stream_options: dict | None = Field(None, strict=True)
    presence_penalty: float | None = Field(None, strict=True, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, strict=True, ge=-2.0, le=2.0)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        return _stop_list(v)

    def unsupported(self) -> None:
        """400 for parameters this server would otherwise ignore without a word."""
        if (self.n or 1) != 1:
            raise APIError(400, f"n: only 1 is supported (got {self.n})", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name}: not supported (only 0)", param=name)
        extra = self.model_extra or {}
        for name in ("tools", "functions", "logit_bias", "response_format", "tool_choice",
                     "function_call", "best_of", "suffix"):
            v = extra.get(name)
            if v not in (None, [], {}) and not (name == "response_format" and v == {"type": "text"}) \
                    and not (name == "best_of" and v == 1) and not (name in ("tool_choice", "function_call")
                                                                    and v in ("none", "auto")):
                raise APIError(400, f"{name}: not supported by this server", param=name)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1, max_length=LIMITS.max_messages)
    max_tokens: int | None = Field(None, strict=True, ge=1)
    max_completion_tokens: int | None = Field(None, strict=True, ge=1)
    logprobs: bool | None = Field(None, strict=True)
    top_logprobs: int | None = Field(None, strict=True, ge=0, le=LIMITS.max_logprobs)

    def chat(self) -> list[dict]:
        """The messages as the backend takes them: role and text only."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr]
    max_tokens: int | None = Field(None, strict=True, ge=0)
    echo: bool | None = Field(None, strict=True)
    logprobs: int | None = Field(None, strict=True, ge=0, le=LIMITS.max_logprobs)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and not 1 <= len(v) <= LIMITS.max_prompts:
            raise ValueError(f"expected 1 to {LIMITS.max_prompts} prompts")
        return v


# --- responses ------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def sse(obj: Any) -> bytes:
    """One server-sent event carrying a JSON object (or the literal ``[DONE]``)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
