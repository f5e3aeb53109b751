"""The local model server (``python -m mdl_repro.serve``) speaks the OpenAI protocol: through the real
``openai`` client and raw HTTP, against one real server process (the bundled SmolLM2) per module.

Properties: a wrong-typed request gets a 400 with an OpenAI error body (never a closed connection);
limits on body, prompt and max_tokens; a wrong Content-Length gets a 408 and pins nothing; streaming
adds up to the plain answer; stop, finish_reason and usage are true; the answer is LocalBackend's
(paired sampling); legacy echo scoring equals the local model's label scores; a huge request runs
beside, not ahead of, 20 concurrent small ones. Then the MDL gateway (``mdl-jax gateway``) in front of
that server: all four actions with exactly the action's messages forwarded (Opt-Out without an upstream
call), streaming with the decision on the first chunk, 50 concurrent requests, malformed requests, the
key never logged, and the upstream killed mid-stream (502s, the gateway stays up) and started again.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

# Every test here talks to a real server: the local one (SmolLM2 behind it) or the gateway (MiniLM).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ERROR_KEYS = {"message", "type", "param", "code"}


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "mdl_repro.serve", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline()  # printed once the model is loaded and the port bound
    assert "serving" in line and " on http://127.0.0.1:" in line, line  # 127.0.0.1 unless told
    return proc, line.split(" on ")[-1].strip()  # http://127.0.0.1:PORT/v1


KEY = "sk-test-serving-7f3a"
AUTH = {"Authorization": f"Bearer {KEY}"}
SERVER_ARGS = ("--body-timeout", "1", "--max-tokens", "512", "--api-key", KEY)


class Upstream:
    """The module's one real server; the last test kills it and starts it again on the same port."""

    def __init__(self):
        self.proc, self.url = start_server("--port", "0", *SERVER_ARGS)
        self.port = int(self.url.split(":")[-1].split("/")[0])

    def restart(self):
        self.proc, url = start_server("--port", str(self.port), *SERVER_ARGS)
        assert url == self.url


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    try:
        yield up
    finally:
        up.proc.terminate()
        up.proc.wait(timeout=30)


@pytest.fixture
def server(upstream):
    return upstream.url


def client(url: str, key: str = KEY):
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def raw(url: str, timeout: float = 120):
    return httpx.Client(base_url=url, headers=AUTH, timeout=timeout)


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assert_error(r, status: int, param="any"):
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["message"], err
    if param != "any":
        assert err["param"] == param, err
    return err


GOOD = {"model": "smollm2", "messages": chat("Hi"), "max_tokens": 1}

# (body, the param the error names): the 15 wrong-typed request kinds an audit sent and the ranges
BAD = [
    ({**GOOD, "messages": "hello"}, "messages"),
    ({**GOOD, "messages": []}, "messages"),
    ({**GOOD, "messages": [1, 2]}, "messages[0]"),
    ({**GOOD, "messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({**GOOD, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({**GOOD, "max_tokens": "abc"}, "max_tokens"),
    ({**GOOD, "max_tokens": -1}, "max_tokens"),
    ({**GOOD, "max_tokens": 0}, "max_tokens"),
    ({**GOOD, "max_tokens": 100000}, "max_tokens"),
    ({**GOOD, "max_tokens": True}, "max_tokens"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "temperature": 2.5}, "temperature"),
    ({**GOOD, "top_p": 1.5}, "top_p"),
    ({**GOOD, "seed": "abc"}, "seed"),
    ({**GOOD, "n": 2}, "n"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "stop": [""]}, "stop"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**GOOD, "presence_penalty": 1.0}, "presence_penalty"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({**GOOD, "top_logprobs": 3}, "top_logprobs"),
]
RAW_BAD = [  # bodies that are not a JSON object of the right kind
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    (b"[1, 2]", None),
    (b"null", None),
    (b'{"messages": ', None),
    (b'{"messages": "\xff\xfe"}', None),
    (b"[" * 100000 + b"]" * 100000, None),
]


def test_every_wrong_typed_or_out_of_range_request_gets_a_400_naming_its_field(server):
    with raw(server, 60) as h:
        for body, param in BAD:
            assert_error(h.post("/chat/completions", json=body), 400, param)
        for blob, param in RAW_BAD:
            assert_error(h.post("/chat/completions", content=blob,
                                headers={"Content-Type": "application/json"}), 400, param)
        # the server is still up and answers a good request; null means "the default" (OpenAI)
        r = h.post("/chat/completions", json={**GOOD, "temperature": None, "seed": None})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
        assert_error(h.get("/nowhere"), 404)
        assert_error(h.get("/chat/completions"), 405)
    c = client(server)
    for kw, param in [({"max_tokens": 0}, "max_tokens"), ({"temperature": 5.0}, "temperature"),
                      ({"top_p": -0.1}, "top_p"), ({"n": 2}, "n")]:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="smollm2", messages=chat("Hi"), **kw)
        assert e.value.body["param"] == param


def test_an_empty_completions_prompt_is_a_400_naming_prompt(server):
    # alone it reached generation and came back a 500 with a torch error; batched with others, a 200
    with raw(server, 60) as h:
        for body in ({"model": "smollm2", "prompt": "", "max_tokens": 2},
                     {"model": "smollm2", "prompt": ["Hello", ""], "max_tokens": 2},
                     {"model": "smollm2", "prompt": "", "max_tokens": 0, "echo": True, "logprobs": 1}):
            err = assert_error(h.post("/completions", json=body), 400, "prompt")
            assert "empty prompt" in err["message"]


def test_a_request_is_refused_whole_before_any_of_its_prompts_is_queued():
    """A 64-prompt request meeting a queue with room for 40 queued 40 of them, then answered 503: the
    40 ran for a client told "busy". Through the real app and its /v1/completions handler, over a
    stand-in for the model (the queue only): the refusal comes before any prompt is queued."""
    import asyncio
    from types import SimpleNamespace

    from mdl_jax.serving.protocol import LIMITS, CompletionRequest
    from mdl_repro.model_server import ModelServer, make_app

    queue: list = []
    srv = SimpleNamespace(limits=LIMITS, queued=lambda: len(queue), requests=0)
    srv.check_queue = lambda n=1: ModelServer.check_queue(srv, n)

    async def read_request(request, kind):
        return CompletionRequest(**await request.json()), "m"

    async def count(prompt):
        return 3

    def enqueue(job):
        srv.check_queue()
        queue.append(job)
        return job

    srv.read_request, srv.count, srv.enqueue = read_request, count, enqueue
    srv.max_tokens = lambda value, default: default if value is None else value
    srv.check_context = lambda n, mt, param: None
    srv.injected_failure = lambda: None
    queue.extend([None] * (LIMITS.max_queue - 40))   # room for 40 prompts

    async def post():
        import httpx

        transport = httpx.ASGITransport(app=make_app(srv))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.post("/v1/completions", json={"model": "m", "prompt": ["Hi"] * 41, "max_tokens": 4})

    r = asyncio.run(post())
    assert r.status_code == 503 and "and this request has 41" in r.json()["error"]["message"], r.text
    assert len(queue) == LIMITS.max_queue - 40   # nothing of it was queued


def test_unknown_model_is_404_and_models_are_listed(server):
    c = client(server)
    assert {"smollm2", "bundled:smollm2"} <= {m.id for m in c.models.list()}
    with pytest.raises(openai.AuthenticationError):  # --api-key: a wrong key is refused
        client(server, key="sk-wrong").models.list()
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-99", messages=chat("Hi"), max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and "gpt-99" in e.value.body["message"]
    with raw(server) as h:
        assert_error(h.post("/completions", json={"model": "gpt-99", "prompt": "x"}), 404, "model")
        assert_error(h.get("/models/gpt-99"), 404, "model")


def test_prompt_beyond_the_context_and_oversized_bodies_are_refused_before_any_work(server):
    c = client(server)
    long_text = "word " * 9000  # > 8192 tokens, < the 1 MiB body cap
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="smollm2", messages=chat(long_text), max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    # a body over the cap is refused from its Content-Length, before it is read
    host, port = server.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                  b"Content-Length: 5000000\r\n\r\n")
        head, body = _read_response(s)
    assert head.startswith(b"HTTP/1.1 413") and json.loads(body)["error"]["code"] == "request_too_large"


def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_a_413(server):
    from mdl_jax.serving.protocol import LIMITS

    host, port = server.split("//")[1].split("/")[0].split(":")
    got = []
    for n in (LIMITS.max_body_bytes, LIMITS.max_body_bytes + 1):
        body = b'{"pad": "' + b"x" * (n - 11) + b'"}'
        assert len(body) == n
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                      b"Content-Length: " + str(n).encode() + b"\r\n\r\n" + body)
            head, answer = _read_response(s)
        got.append((head.split(b"\r\n")[0], json.loads(answer)["error"]["param"]))
    # the first is read whole and refused for what it lacks; the second for its size
    assert got == [(b"HTTP/1.1 400 Bad Request", "messages"), (b"HTTP/1.1 413 Request Entity Too Large", None)], got


def test_a_json_media_type_is_known_in_any_case_with_parameters_or_as_a_json_suffix(server):
    host, port = server.split("//")[1].split("/")[0].split(":")
    for kind in (b"Application/JSON; charset=UTF-8", b"application/merge-patch+json"):
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: " + kind + b"\r\n"
                      b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 2\r\n\r\n{}")
            head, answer = _read_response(s)
        # read as JSON, and refused for the field it lacks (not a 415 for its media type)
        assert head.startswith(b"HTTP/1.1 400") and json.loads(answer)["error"]["param"] == "messages", (kind, head)


def test_a_body_refused_unread_for_its_media_type_closes_its_connection(server):
    # its bytes were never read: kept alive, they would be parsed as the next request
    host, port = server.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 2\r\n\r\n{}")
        head, answer = _read_response(s)
    assert head.startswith(b"HTTP/1.1 415") and b"\r\nconnection: close" in head.lower(), head
    assert json.loads(answer)["error"]["code"] == "unsupported_media_type"


def test_a_body_that_is_json_but_not_an_object_is_a_400_saying_what_it_is(server):
    with raw(server) as h:
        r = h.post("/chat/completions", content=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert assert_error(r, 400)["message"] == "body: expected a JSON object, got an array"


def test_a_completions_prompt_list_holds_one_to_the_limits_prompts():
    from mdl_jax.serving.protocol import LIMITS, APIError, CompletionRequest, parse

    assert parse(CompletionRequest, {"prompt": ["a"] * LIMITS.max_prompts}).prompt == ["a"] * LIMITS.max_prompts
    for n in (0, LIMITS.max_prompts + 1):
        with pytest.raises(APIError, match=f"^prompt: expected 1 to {LIMITS.max_prompts} prompts"):
            parse(CompletionRequest, {"prompt": ["a"] * n})


def test_a_request_may_state_as_many_stop_strings_as_the_limit_and_no_more():
    from mdl_jax.serving.protocol import LIMITS, APIError, ChatRequest, parse

    base = {"messages": [{"role": "user", "content": "hi"}]}
    stops = [f"s{i}" for i in range(LIMITS.max_stop + 1)]
    assert parse(ChatRequest, {**base, "stop": stops[:-1]}).stop == stops[:-1]
    with pytest.raises(APIError, match=f"stop: at most {LIMITS.max_stop} stop strings"):
        parse(ChatRequest, {**base, "stop": stops})


@pytest.mark.parametrize("which", ["server", "gateway"])
def test_an_oversized_body_on_a_kept_alive_connection_gets_its_413_not_a_reset(which, request):
    # Both servers answered 413 from the Content-Length and closed with the body unread: the kernel's
    # reset then destroyed the 413 before a pooled client read it (openai: "Connection error").
    server = request.getfixturevalue("server") if which == "server" else request.getfixturevalue("gateway")[0]
    big = {"model": "smollm2", "messages": chat("x" * (2 << 20))}
    with raw(server) as h:
        assert h.get("/models").status_code == 200          # the pool now holds a kept-alive connection
        for _ in range(3):
            assert_error(h.post("/chat/completions", json=big), 413)
            assert h.get("/models").status_code == 200      # and the client goes on (a new connection)
    with pytest.raises(openai.APIStatusError) as e:
        c = client(server)
        c.models.list()
        c.chat.completions.create(**big)
    assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"


def test_a_chunked_body_over_the_limit_on_a_kept_alive_connection_gets_its_413_not_a_reset(server):
    # no Content-Length to refuse it by: it is read up to the limit, then the rest drained before the 413
    big = json.dumps({"model": "smollm2", "messages": chat("x" * (2 << 20))}).encode()
    with raw(server) as h:
        assert h.get("/models").status_code == 200          # the pool now holds a kept-alive connection
        for _ in range(3):
            chunks = iter([big[i:i + 65536] for i in range(0, len(big), 65536)])   # sent chunked
            assert_error(h.post("/chat/completions", content=chunks, headers={"Content-Type": "application/json"}),
                         413)
            assert h.get("/models").status_code == 200


def test_a_chunked_body_over_the_limit_that_keeps_trickling_gets_413_not_408(server):
    # Over the limit, the rest was drained inside the body's time limit, so a client still sending
    # when it ran out got 408 for a body that was simply too large.
    host, port = server.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        block = b"x" * 65536
        s.sendall((b"%x\r\n" % len(block) + block + b"\r\n") * 18)   # 1.1 MiB: over the 1 MiB limit

        def trickle():   # then 100 bytes every 0.2 s, past the server's 1 s body timeout
            try:
                for _ in range(15):
                    s.sendall(b"64\r\n" + b"y" * 100 + b"\r\n")
                    time.sleep(0.2)
            except OSError:
                pass

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        head, body = _read_response(s)
        t.join()
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(body)["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("which", ["server", "gateway"])
def test_a_request_framed_by_both_content_length_and_chunked_is_refused_and_closed(which, request):
    """CL.TE request smuggling: a request with both Content-Length and Transfer-Encoding: chunked
    was answered 200 by both servers on a kept connection, and the bytes after the chunked body
    were answered as a second request, one a proxy framing by Content-Length never saw. RFC 9112
    §6.1: now a 400 in OpenAI's error shape, and the connection closed; the hidden request is never
    read."""
    server = request.getfixturevalue("server") if which == "server" else request.getfixturevalue("gateway")[0]
    body = json.dumps({"model": "smollm2", "messages": chat("Hi"), "max_tokens": 1}).encode()
    chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    hidden = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    host, port = server.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                  b"Content-Length: " + str(len(chunked + hidden)).encode() + b"\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + chunked + hidden)
        head, answer = _read_response(s)
        rest = b""
        while chunk := s.recv(65536):  # the server closes the connection: nothing more comes
            rest += chunk
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"connection: close" in head.lower(), head
    err = json.loads(answer)["error"]
    assert set(err) == ERROR_KEYS and "Transfer-Encoding" in err["message"], err
    assert rest == b"", rest[:200]  # the hidden request got no answer


def _read_response(s: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
    while len(body) < n:
        body += s.recv(65536)
    return head, body


def test_a_wrong_content_length_gets_408_and_pins_nothing(server):
    host, port = server.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                  b"Content-Length: 100\r\n\r\n{\"model\":")
        # while that body never completes, others are served
        r = client(server).chat.completions.create(model="smollm2", messages=chat("Hi"), max_tokens=1)
        assert r.choices[0].message.role == "assistant"
        head, body = _read_response(s)
        assert head.startswith(b"HTTP/1.1 408"), head
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert s.recv(10) == b""  # and the connection is closed


def test_finish_reason_usage_stop_and_paired_answers_are_true(server, local_backend):
    c = client(server)
    q = chat("Name three colors of the rainbow.")
    r = c.chat.completions.create(model="smollm2", messages=q, max_tokens=6, seed=11)
    tok, _ = local_backend._lm()
    n_prompt = len(tok(tok.apply_chat_template(q, tokenize=False, add_generation_prompt=True))["input_ids"])
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 6)
    assert r.usage.total_tokens == n_prompt + 6
    # the answer is LocalBackend's for the same prompt and seed (paired sampling across backends)
    local = local_backend.generate([q], seed=11, max_new_tokens=6)[0]
    assert r.choices[0].message.content == local.text
    # a stop string ends the answer before it
    words = local.text.split()
    assert len(words) >= 2
    r2 = c.chat.completions.create(model="smollm2", messages=q, max_tokens=6, seed=11, stop=[words[1]])
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == local.text[:local.text.index(words[1])].strip()
    assert r2.usage.completion_tokens < 6
    # an answer that ends by itself: finish_reason "stop", fewer tokens than the cap
    r3 = c.chat.completions.create(model="smollm2", messages=chat("Reply with one word: hello."),
                                   max_tokens=64, temperature=0.0)
    assert r3.choices[0].finish_reason == "stop" and r3.usage.completion_tokens < 64


def test_streaming_adds_up_to_the_plain_answer(server):
    c = client(server)
    q = chat("What is the capital of France?")
    plain = c.chat.completions.create(model="smollm2", messages=q, max_tokens=8, seed=3)
    chunks = list(c.chat.completions.create(model="smollm2", messages=q, max_tokens=8, seed=3, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content and len([ch for ch in chunks if ch.choices]) >= 3
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    # raw SSE: data lines, the last one [DONE]
    with raw(server) as h:
        with h.stream("POST", "/chat/completions", json={"model": "smollm2", "messages": q,
                                                         "max_tokens": 8, "seed": 3, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert {e["object"] for e in events} == {"chat.completion.chunk"}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == text


def test_legacy_echo_scoring_equals_the_local_models_label_scores(server, local_backend):
    """/v1/completions with echo + max_tokens 0 + logprobs: each prompt token's log-probability in
    OpenAI's legacy format; on a chat-templated prompt + label they sum to ``LocalBackend.score``."""
    tok, _ = local_backend._lm()
    q = chat("Is the sky blue? Reply with exactly one word: Yes or No.")
    head = tok.apply_chat_template(q, tokenize=False, add_generation_prompt=True)
    want = local_backend.score([q], ["Yes", "No"])[0]
    c = client(server)
    for label, w in zip(["Yes", "No"], want):
        r = c.completions.create(model="smollm2", prompt=head + label, max_tokens=0, echo=True, logprobs=0)
        ch = r.choices[0]
        lp = ch.logprobs
        assert ch.text == head + label and "".join(lp.tokens) == head + label
        assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
        assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
        got = sum(x for x, o in zip(lp.token_logprobs, lp.text_offset) if o >= len(head))
        assert got == pytest.approx(w, abs=0.1)
        assert r.usage.prompt_tokens == len(lp.tokens) and r.usage.completion_tokens == 0
    with raw(server) as h:
        body = h.post("/completions", json={"model": "smollm2", "prompt": ["a b", "c"], "max_tokens": 0,
                                            "echo": True, "logprobs": 2}).json()
        assert [ch["index"] for ch in body["choices"]] == [0, 1]
        tops = body["choices"][0]["logprobs"]["top_logprobs"]
        assert tops[0] is None and len(tops[1]) == 2
        assert_error(h.post("/completions", json={"prompt": "x", "max_tokens": 5, "logprobs": 1}), 400, "logprobs")
        assert_error(h.post("/completions", json={"prompt": 5}), 400, "prompt")
        gen = h.post("/completions", json={"prompt": "The capital of France is", "max_tokens": 3,
                                           "temperature": 0}).json()
        assert gen["choices"][0]["finish_reason"] in ("length", "stop") and gen["usage"]["completion_tokens"] <= 3


def test_a_huge_request_runs_beside_twenty_concurrent_small_ones(server):
    """Load: one huge request (500 tokens to generate) and 20 small ones at once. The huge one runs in
    the long lane; every small one is answered while it is still generating (none waits for it), in
    the short lane, after at most the batch running there when it came plus one full batch queued
    ahead of it; small ones share batches."""
    root = server[:-len("/v1")]
    seen = {"chunks": 0}
    stop = threading.Event()

    def huge():  # streamed, so that closing it ends the row: the test does not wait for 500 tokens
        with raw(server, 300) as h, h.stream("POST", "/chat/completions", json={
                "model": "smollm2", "max_tokens": 500, "temperature": 0, "stream": True,
                "messages": chat("Count from 1 to 1000, one number after another, separated by commas.")}) as r:
            for line in r.iter_lines():
                seen["chunks"] += line.startswith("data: {")
                if stop.is_set():
                    break

    def running():
        return httpx.get(root + "/health", timeout=60).json()["running"]

    t = threading.Thread(target=huge)
    t.start()
    for _ in range(1200):  # until the huge batch is generating
        if running()["long"] and seen["chunks"] > 1:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the huge request never started")
    huge_batch = running()["long"]
    small = [None] * 20

    def one(i):
        with raw(server, 300) as h:
            small[i] = h.post("/chat/completions", json={"model": "smollm2", "max_tokens": 3, "seed": i,
                                                         "messages": chat(f"Say the number {i}.")})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert running()["long"] == huge_batch  # every small one was answered while the huge one ran
    stop.set()
    t.join()
    for r in small:
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        assert r.headers["x-mdl-batch"].startswith("short-")
        assert int(r.headers["x-mdl-waited-batches"]) <= 2
    assert max(int(r.headers["x-mdl-batch-rows"]) for r in small) > 1  # batched, not one at a time
    for _ in range(1200):  # the closed stream ends its row: the long lane comes free
        if not running()["long"]:
            break
        time.sleep(0.05)
    assert not running()["long"]


# --- the MDL gateway (mdl-jax gateway) with this module's server as its upstream ------------------

Q = "What is the capital of France?"
CASES = {  # (memories, risk) → the action the real MiniLM + the paper's config give
    "Active": (["Paris is the capital of France.", "The capital city of France is Paris."], 0.2),
    "Supp": (["Europe has many old cities with museums.", "Wine is produced in many regions."], 0.5),
    "Silent": (["France is famous for its cheese and wine.", "The Eiffel Tower is in a French city."], 0.85),
    "Opt-Out": (["Bananas are rich in potassium.", "The Pacific is the largest ocean."], 0.85),
}


@pytest.fixture(scope="module")
def gateway(upstream, cache_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("gw") / "gateway.log"
    env = {**os.environ, "MDL_JAX_CACHE_DIR": str(cache_dir)}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "mdl_jax", "gateway", "--upstream", upstream.url,
                                 "--port", "0", "--timeout", "60"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    assert "MDL gateway on http://127.0.0.1:" in line, (line, log.read_text())  # 127.0.0.1 unless told
    try:
        yield line.split(" on ")[1].split(" ")[0], log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _gw(gateway, q=Q, case="Active", **kw):
    mems, risk = CASES[case]
    return client(gateway[0]).chat.completions.create(
        model="smollm2", messages=chat(q), max_tokens=kw.pop("max_tokens", 4), seed=kw.pop("seed", 1),
        extra_body={"mdl": {"memories": mems, "risk": risk}}, **kw)


def _upstream_requests(upstream) -> int:
    return httpx.get(upstream.url[:-len("/v1")] + "/health").json()["requests"]


def test_gateway_reaches_every_action_and_forwards_the_messages_for_it(upstream, gateway):
    from mdl_jax.prompts import CAUTION, memory_block

    c = client(upstream.url)
    for case, (mems, risk) in CASES.items():
        before = _upstream_requests(upstream)
        r = _gw(gateway, case=case)
        info = r.model_extra["mdl"]
        assert info["action"] == case and set(info["scalars"]) >= {"M", "R", "A", "C", "alpha", "C_final"}
        assert info["scalars"]["A"] == pytest.approx(risk)
        if case == "Opt-Out":  # the abstention, and the upstream never called
            assert not info["upstream"] and r.choices[0].message.content
            assert _upstream_requests(upstream) == before
            continue
        assert info["upstream"] and _upstream_requests(upstream) == before + 1
        # the answer is the upstream's to exactly the messages of the action (paired sampling)
        block = memory_block(mems, caution=case == "Supp") if case != "Silent" else ""
        direct = c.chat.completions.create(model="smollm2", messages=chat(block + Q), max_tokens=4, seed=1)
        assert r.choices[0].message.content == direct.choices[0].message.content
        assert r.usage.prompt_tokens == direct.usage.prompt_tokens
        assert info["memories"] == (mems if case != "Silent" else [])
        assert (CAUTION in block) == (case == "Supp")


def test_gateway_streams_with_the_decision_on_the_first_chunk(gateway):
    for case in ("Active", "Opt-Out"):
        plain = _gw(gateway, case=case, max_tokens=6)
        chunks = list(_gw(gateway, case=case, max_tokens=6, stream=True))
        assert chunks[0].model_extra["mdl"]["action"] == case
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
            plain.choices[0].message.content
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == plain.choices[0].finish_reason
        # include_usage: the last chunk has no choices and the usage (an abstention's: zeros, no model call)
        counted = list(_gw(gateway, case=case, max_tokens=6, stream=True, stream_options={"include_usage": True}))
        assert not counted[-1].choices and counted[-1].usage.total_tokens == (0 if case == "Opt-Out" else
                                                                              plain.usage.total_tokens)


def test_gateway_50_concurrent_requests_lose_and_mix_up_nothing(gateway):
    import asyncio

    async def main():
        c = openai.AsyncOpenAI(base_url=gateway[0], api_key=KEY, max_retries=0, timeout=300)
        reqs = []
        for i in range(50):
            mem = f"Note {i}: " + "the capital of France is Paris. " * (1 + i % 5)
            reqs.append(c.chat.completions.create(
                model="smollm2", messages=chat(Q), max_tokens=1, seed=i,
                extra_body={"mdl": {"memories": [mem, {"text": f"Paris is in France ({i}).", "id": i}],
                                    "risk": 0.2 if i % 2 else 0.85}}))
        out = await asyncio.gather(*reqs)
        await c.close()
        return out

    out = asyncio.run(main())
    by_len = {}
    for i, r in enumerate(out):
        info = r.model_extra["mdl"]
        assert info["scalars"]["A"] == pytest.approx(0.2 if i % 2 else 0.85)
        if info["upstream"] and info["memories"]:
            assert info["memories"][1] == {"text": f"Paris is in France ({i}).", "id": i}  # its own
            by_len.setdefault((i % 5, info["action"]), set()).add(r.usage.prompt_tokens - len(str(i)))
        assert r.choices[0].message.content is not None
    assert by_len  # answers forwarded with memories: their prompt length follows their own memory


def test_gateway_refuses_malformed_requests_with_openai_errors_and_never_logs_the_key(upstream, gateway):
    url, log = gateway
    good = {"model": "smollm2", "messages": chat(Q), "max_tokens": 1}
    with raw(url) as h:
        for body, param in [
            ({**good, "mdl": {"memories": "text"}}, "mdl.memories"),
            ({**good, "mdl": {"memories": [""]}}, "mdl.memories"),
            ({**good, "mdl": {"memories": [{"source": "x"}]}}, "mdl.memories[0].text"),
            ({**good, "mdl": {"risk": 1.5}}, "mdl.risk"),
            ({**good, "mdl": {"risk": "high"}}, "mdl.risk"),
            ({**good, "mdl": {"memorys": []}}, "mdl.memorys"),
            ({**good, "messages": "hi"}, "messages"),
            ({**good, "messages": [{"role": "system", "content": "x"}]}, "messages"),
            ({"messages": chat(Q)}, "model"),
        ]:
            assert_error(h.post("/chat/completions", json=body), 400, param)
        assert_error(h.post("/chat/completions", content=b"[1]", headers={"Content-Type": "application/json"}), 400)
    # the upstream's own 4xx comes back as it was: a wrong key (passed through), an unknown model
    active = {"mdl": {"memories": CASES["Active"][0], "risk": CASES["Active"][1]}}
    with pytest.raises(openai.AuthenticationError):
        client(url, key="sk-wrong-key-in-gateway").chat.completions.create(
            model="smollm2", messages=chat(Q), max_tokens=1, extra_body=active)
    with pytest.raises(openai.NotFoundError):
        client(url).chat.completions.create(model="nope", messages=chat(Q), max_tokens=1, extra_body=active)
    assert "smollm2" in {m.id for m in client(url).models.list()}
    text = log.read_text()
    assert KEY not in text and "sk-wrong-key-in-gateway" not in text


def test_gateway_survives_its_upstream_being_killed_and_recovers(upstream, gateway):
    """Last in the module: kill -9 the upstream mid-stream, get 502s with a reason (Opt-Out still
    answers), start the upstream again on its port, and the gateway serves again."""
    import signal

    stream = _gw(gateway, case="Silent", max_tokens=300, stream=True, temperature=0.0)
    first = next(iter(stream))
    assert first.model_extra["mdl"]["action"] == "Silent"
    upstream.proc.send_signal(signal.SIGKILL)
    upstream.proc.wait(timeout=30)
    try:
        for _ in stream:  # the rest of the stream: ends (an error event or a cut), never hangs
            pass
    except openai.APIError:
        pass
    for _ in range(3):
        with pytest.raises(openai.InternalServerError) as e:
            _gw(gateway, case="Active")
        assert e.value.status_code == 502 and "upstream" in e.value.message
    with raw(gateway[0]) as h:
        err = assert_error(h.post("/chat/completions", json={
            "model": "smollm2", "messages": chat(Q), "mdl": {"memories": CASES["Active"][0], "risk": 0.2}}), 502)
        assert err["code"] == "upstream_error" and "connection refused" in err["message"]
        assert_error(h.get("/models"), 502)
    assert _gw(gateway, case="Opt-Out").model_extra["mdl"]["action"] == "Opt-Out"  # no upstream needed
    upstream.restart()
    r = _gw(gateway, case="Active")
    assert r.model_extra["mdl"]["upstream"] and r.choices[0].message.content


def test_a_gate_check_error_names_the_requests_own_field():
    """The gate checks a batch of one (``categories[0]``, ``memories_lists[0][1]``); the gateway's 400
    names the field as the request sent it (a table gate's unknown category is ``mdl.category``)."""
    from mdl_jax.gate import MemoryGate
    from mdl_jax.serving.gateway import as_request_error
    from tests.gate_embedders import hashed

    gate = MemoryGate(embedder=hashed, risk={"medical": 0.85})
    for args, want in (((["q"], [["m"]], ["sports"], [None]), ("mdl.category: 'sports' is not in the risk table", "mdl.category")),
                       ((["q"], [["m", "a \ud800"]], [None], [0.5]), ("mdl.memories[1]: holds a lone surrogate", "mdl.memories")),
                       ((["q"], [["m"]], [None], [1.5]), ("mdl.risk: expected a number in [0, 1], got 1.5", "mdl.risk"))):
        with pytest.raises(ValueError) as e:
            gate.check(*args)
        message, param = as_request_error(e.value)
        assert message.startswith(want[0]) and param == want[1], (message, param)
    assert as_request_error(ValueError("something else")) == ("mdl: something else", "mdl")


@pytest.mark.parametrize("argv, said", [
    (["--device", "bogus"], "--device: expected a torch device (cpu, cuda, cuda:0, mps), got 'bogus'"),
    (["--model", "/nonexistent/model"], "--model: /nonexistent/model: no such model folder"),
])
def test_a_bad_device_or_missing_model_folder_is_named_before_loading(argv, said):
    # --device bogus was reported as a --model error; a missing folder as a Hugging Face id rule
    r = subprocess.run([sys.executable, "-m", "mdl_repro.serve", *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and said in r.stderr.strip().splitlines()[-1], r.stderr


@pytest.mark.parametrize("value", ["0", "nan"])
def test_a_send_timeout_that_is_not_seconds_is_named_before_loading(value):
    r = subprocess.run([sys.executable, "-m", "mdl_repro.serve", "--send-timeout", value], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--send-timeout: expected seconds in (0, 86400]" in r.stderr, r.stderr
