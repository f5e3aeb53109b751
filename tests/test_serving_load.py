"""The servers under load and hostile input, scaled to a 2-core machine, on
127.0.0.1 only, every test bounded in time.

Local model server (one real SmolLM2 server process, ``--header-timeout 1.5 --max-connections 200``):
a short request keeps its latency beside a long scoring request (scoring yields between chunks) and
beside a long chat prompt (read in chunks that yield);
work whose client left is cancelled (generation within a token, scoring within a chunk); the
tokenizers of the server's threads are never shared (the "Unable to create tensor" 500s); slow
clients are timed out and shed so a real client is served; temperatures below the floor are greedy.
What both servers run on (``connections.run_app``, a toy app on it): a client that does not take an
answer, or stops reading a stream, is reset at the send deadline; one that reads gets it whole.

Gateway (the real ``mdl-jax gateway`` before a hostile fake upstream): NaN, lone surrogates and deep
nesting from the upstream are 502s naming it, a NaN in a request is a 400, garbage server-sent events
end the stream with an OpenAI-style error event, an oversized (gzip-bombed) answer is a 502 with the
gateway's memory bounded, and client-supplied memories never reach the disk cache; memories over the
per-request byte limit are a 400 naming it, and the embedding cache holds digests, never texts, within
its byte bound. Before a slow upstream (an asyncio server that drips bytes or hangs): ``--timeout`` is
a deadline for the whole call (a 502, or an error event ending a stream), clients that leave free
their upstream connections at once, and a client that does not take a non-streamed answer of several
MiB is let go at --timeout.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[1]
HEADER_TIMEOUT = 1.5
MAX_CONN = 200
pytestmark = pytest.mark.slow


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-m", "mdl_repro.serve", "--port", "0", "--header-timeout",
                             str(HEADER_TIMEOUT), "--max-connections", str(MAX_CONN)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    line = proc.stdout.readline()
    assert " on http://127.0.0.1:" in line, line
    url = line.split(" on ")[-1].strip()
    try:
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def health(url: str) -> dict:
    return httpx.get(url[:-len("/v1")] + "/health", timeout=30).json()


def short(url: str, text: str = "Hi", timeout: float = 120) -> float:
    t = time.monotonic()
    r = httpx.post(url + "/chat/completions", json={"messages": chat(text), "max_tokens": 2,
                                                     "temperature": 0}, timeout=timeout)
    assert r.status_code == 200, r.text
    return time.monotonic() - t


def until(cond, seconds: float, step: float = 0.05) -> float | None:
    """Seconds until ``cond()`` held, or None when it did not within ``seconds``."""
    t = time.monotonic()
    while time.monotonic() - t < seconds:
        if cond():
            return time.monotonic() - t
        time.sleep(step)
    return None


def send_and_hold(url: str, path: str, body: dict) -> socket.socket:
    """POST ``body`` on a raw connection and return it unread: closing it is the client leaving
    (an httpx stream would not return before a non-streamed answer's headers, that is, its end)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(f"POST /v1{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


LONG_TEXT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))  # ~900 tok


def test_a_short_request_keeps_its_latency_beside_long_scoring_and_the_scoring_stops_when_abandoned(server):
    url, _ = server
    short(url)  # warm
    base = min(short(url) for _ in range(2))
    # echo scoring of ~900 tokens; its client leaves when the socket is closed
    s = send_and_hold(url, "/completions", {"prompt": LONG_TEXT, "max_tokens": 0, "echo": True, "logprobs": 1})
    try:
        assert until(lambda: health(url)["running"].get("score"), 60), "the scoring never started"
        took = short(url, timeout=max(10.0, 4 * base))
        assert health(url)["running"]["score"]  # answered while the scoring still ran
        print(f"\nshort request: {took:.2f} s beside scoring, baseline {base:.2f} s "
              f"(ratio {took / base:.2f})")
        assert took <= 2 * base + 1.0  # the target is 2x; 1 s of slack for a 2-core machine shared
    finally:
        s.close()
    freed = until(lambda: not health(url)["running"]["score"], 10, 0.02)
    print(f"abandoned scoring stopped {freed} s after its client left")
    assert freed is not None and freed <= 3.0  # one chunk (64 positions) on a loaded 2-core machine


CHAT_TEXT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(470))  # ~7,450 tok


def test_a_long_chat_prompt_is_read_in_chunks_that_yield_to_a_short_request_and_stop_when_abandoned(server):
    """A ~7,450-token chat prompt (the long lane) is read in chunks of 256 tokens: a short request
    sent while it is being read is answered before the reading is done (the long lane waits for it
    between chunks), and when the long prompt's client leaves, the lane comes free within a chunk,
    not at the end of the prompt. Before, the prompt was one uninterruptible forward pass: a short
    request ran beside it, contended, and an abandoned prompt was read to its end."""
    url, _ = server
    short(url)  # warm
    s = send_and_hold(url, "/chat/completions", {"messages": chat(CHAT_TEXT), "max_tokens": 4, "temperature": 0})
    try:
        assert until(lambda: health(url)["running"].get("long"), 60), "the long prompt never started"
        time.sleep(0.3)  # into its prompt
        took = short(url)
        h = health(url)
        reading = (h.get("prefill") or {}).get("long")  # (tokens read, of) while it reads
        print(f"\nshort request beside a 7,450-token prefill: {took:.2f} s; long lane then {reading}")
    finally:
        s.close()
    freed = until(lambda: not health(url)["running"]["long"], 10, 0.02)
    print(f"abandoned long prompt let go {freed} s after its client left")
    assert freed is not None and freed <= 3.0  # target 1 s: one chunk (slower on a loaded 2-core VM)
    # the short request was answered while the long prompt was still being read
    assert h["running"]["long"] and reading is not None and reading[0] < reading[1], h


def test_a_prompt_read_in_chunks_generates_what_one_pass_does(local_backend):
    """``LocalBackend.generate(prefill_chunk=K)``: the prompts of a left-padded batch read K tokens
    at a time into the KV cache give the same tokens, greedy and seeded sampling, as one pass (in
    float32: in bf16 the two differ by rounding, as another batch shape does); ``on_prefill`` is
    called before each chunk, and a true return ends the batch there with every row empty."""
    import copy

    import torch

    from mdl_repro.pipeline.generation import LocalBackend

    tok, lm = local_backend._lm()
    # the bundled weights in float32 (a second load would dequantize again); torch's own .float(): a model
    # read straight from the GGUF (a fresh cache, before the converted checkpoint exists) counts as
    # quantised to transformers, whose .float() refuses, though its weights are plain tensors
    lm32 = torch.nn.Module.float(copy.deepcopy(lm))
    b = LocalBackend(local_backend.model, max_new_tokens=4)
    b._lm = lambda: (tok, lm32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on the shared 2-core VM two intra-op threads ran these calls ~9x slower
    facts = " ".join(f"Box {i} holds {i * 7 % 13} marbles." for i in range(10))
    prompts = [chat(facts + " How many marbles are in box 5?"), chat(facts[:80] + " Summarise."),
               "Once upon a time, " + facts[:60]]
    try:
        for temp in (0.0, 0.7):
            one = b.generate(prompts, seed=[1, 2, 3], temperature=temp)
            calls: list = []
            chunked = b.generate(prompts, seed=[1, 2, 3], temperature=temp, prefill_chunk=32,
                                 on_prefill=lambda a, n, calls=calls: calls.append((a, n)) and False)
            assert [g.text for g in chunked] == [g.text for g in one], temp
            assert [g.prompt_tokens for g in chunked] == [g.prompt_tokens for g in one]
            n = calls[0][1]
            assert n == max(g.prompt_tokens for g in one) and calls == [(a, n) for a in range(0, n - 1, 32)]
        calls = []
        stopped = b.generate(prompts, seed=1, prefill_chunk=32, on_prefill=lambda a, n: calls.append(a) or a >= 32)
        assert calls == [0, 32] and [g.text for g in stopped] == ["", "", ""]
    finally:
        torch.set_num_threads(threads)


def test_abandoned_requests_are_cancelled_and_a_later_request_is_not_held_up(server):
    """4 generation requests (max_tokens 400, the long lane) and 6 scoring requests whose clients
    leave: the lanes come free within about a second, and a small request after them is answered
    in its usual time (before: 193 s and 731 s of work for nobody)."""
    url, _ = server
    base = short(url)
    before = health(url)["cancelled"]
    abandoned = []  # requests whose client left before the answer: the server must cancel these

    def leave(body, path, after):
        try:
            httpx.post(url + path, json=body, timeout=after)
        except httpx.TimeoutException:
            abandoned.append(path)

    gens = [threading.Thread(target=leave, args=({"messages": chat(f"Count to {400 + i}."), "max_tokens": 400,
                                                  "temperature": 0}, "/chat/completions", 4.0))
            for i in range(4)]
    scores = [threading.Thread(target=leave, args=({"prompt": LONG_TEXT + str(i), "max_tokens": 0,
                                                    "echo": True, "logprobs": 0}, "/completions", 4.0))
              for i in range(6)]
    for th in gens + scores:
        th.start()
    for th in gens + scores:
        th.join()
    left = time.monotonic()

    def idle():
        h = health(url)
        return not any(h["running"].values()) and not any(h["queued"].values())

    freed = until(idle, 10, 0.02)
    print(f"\nabandoned work let go {freed} s after the clients left")
    assert freed is not None and freed <= 3.0  # target 1 s: one decoding step (slower on a loaded 2-core VM)
    took = short(url, timeout=max(10.0, 4 * base))
    assert took <= 2 * base + 1.0, (took, base)
    # every request whose client left is cancelled (one may finish in the instant its client leaves);
    # a scoring request that completed within its client's 4 s was never abandoned
    assert len(abandoned) >= 4, abandoned  # 400 tokens take longer than 4 s on any CPU here
    assert health(url)["cancelled"] - before >= len(abandoned) - 1, (health(url), abandoned)
    assert time.monotonic() - left < 15


def test_the_lanes_and_the_prompt_counter_tokenize_at_once_without_failing(local_backend):
    """What each of the server's threads tokenizes, hammered at once from threads as under mixed
    load: each lane's batched, padded call (what ``generate`` does with its ``_lm()`` tokenizer) and
    the prompt counter's unpadded one (``ModelServer._count``). None fails, and no two threads hold
    the same tokenizer. Through one shared Hugging Face tokenizer (83c229c) the counter's call turned
    padding off between a lane's setting it and encoding, and the lane raised "Unable to create
    tensor, you should probably activate truncation and/or padding" (the 48 500s of 2,250)."""
    import asyncio

    from mdl_repro.model_server import ModelServer

    srv = ModelServer(local_backend)

    async def start():  # lanes exist once started (83c229c built them in ``start``)
        srv.start()

    asyncio.run(start())
    lanes = [*srv.lanes.values(), *([srv.score_lane] if hasattr(srv, "score_lane") else [])]
    count = getattr(srv, "_count", srv.count)  # the counting thread's call (83c229c: on the event loop)
    errors: list[str] = []
    texts = ["a", "b c d e f g h i j k l m n o p"]

    def hammer(call):
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                call()
            except Exception as e:  # noqa: BLE001 - what the test counts
                errors.append(f"{type(e).__name__}: {str(e)[:80]}")

    calls = [functools.partial(lane.backend._lm()[0], texts, return_tensors="pt", padding=True) for lane in lanes]
    calls += [functools.partial(count, chat("How many tokens is this prompt?")), functools.partial(count, "x y z " * 20)]
    threads = [threading.Thread(target=hammer, args=(c,)) for c in calls]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: through one tokenizer ~10 failures per 0.5 s, not ~1
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, f"{len(errors)} failed calls: {sorted(set(errors))[:3]}"
    toks = [lane.backend._lm()[0] for lane in lanes] + [getattr(srv, "count_tok", srv.tok), srv.tok]
    assert len({id(t) for t in toks}) == len(toks)


def test_mixed_load_gets_no_5xx(server):
    """Short, streamed, long-lane and scoring requests at once (scaled down from 2,250): all 200."""
    url, _ = server
    bodies = [("/chat/completions", {"messages": chat(f"Say {i}."), "max_tokens": 2, "seed": i})
              for i in range(8)]
    bodies += [("/chat/completions", {"messages": chat("Name a colour."), "max_tokens": 260, "stop": ["."],
                                      "temperature": 0})]
    bodies += [("/completions", {"prompt": f"Some text {i} to score.", "max_tokens": 0, "echo": True,
                                 "logprobs": 1}) for i in range(4)]
    bodies += [("/completions", {"prompt": ["The sky is", "Grass is"], "max_tokens": 2})]
    out: list = [None] * len(bodies)

    def one(i):
        out[i] = httpx.post(url + bodies[i][0], json=bodies[i][1], timeout=300).status_code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert out == [200] * len(bodies), out


def test_temperatures_below_the_floor_are_greedy(server):
    url, _ = server

    def text(t):
        r = httpx.post(url + "/chat/completions", json={"messages": chat("Name a fruit."), "max_tokens": 4,
                                                         "temperature": t}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    greedy = text(0)
    for t in (1e-38, 5e-324, 1e-6):
        got = text(t)
        assert "\ufffd" not in got and got == greedy, (t, got, greedy)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_slow_clients_are_timed_out_and_shed_while_a_real_client_is_served(server):
    """300 connections that hold partial headers (scaled from 4,000; the server's limit is 200 here),
    plus 50 that never send a byte: a real client is answered at once; every slow connection is
    closed by the server within the header timeout (+1 s), and the server's descriptors come back.
    Idle keep-alive connections are closed after the keep-alive timeout."""
    url, pid = server
    host, port = "127.0.0.1", int(url.split(":")[-1].split("/")[0])
    fds0 = _fds(pid)
    slow = []
    for i in range(350):
        s = socket.create_connection((host, port), timeout=5)
        if i < 300:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app")
        slow.append(s)
    t0 = time.monotonic()
    t = time.monotonic()
    r = httpx.get(url + "/models", timeout=10)
    served = time.monotonic() - t
    assert r.status_code == 200 and served < 3.0, (r.status_code, served)
    print(f"\nreal client beside 350 slow connections: {served:.3f} s")

    def closed(s) -> bool:
        s.settimeout(HEADER_TIMEOUT + 1.5 - min(time.monotonic() - t0, HEADER_TIMEOUT + 1.4))
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    return True
                assert b.startswith(b"HTTP/1.1 408") or b.startswith(b"HTTP/1.1 503"), b[:80]
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    still_open = sum(not closed(s) for s in slow)
    for s in slow:
        s.close()
    assert still_open == 0, f"{still_open} slow connections still open {HEADER_TIMEOUT + 1.5} s on"
    assert until(lambda: _fds(pid) <= fds0 + 5, 5) is not None, (_fds(pid), fds0)

    kept = []
    for _ in range(50):  # keep-alive: one request each, then idle
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        head, body = got.split(b"\r\n\r\n", 1)
        n = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")).split(b":")[1])
        while len(body) < n:
            body += s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200")
        kept.append(s)
    t = time.monotonic()
    for s in kept:
        s.settimeout(max(0.1, 5.0 + 2.0 - (time.monotonic() - t)))
        try:
            assert s.recv(1) == b""
        except TimeoutError:
            pytest.fail("an idle keep-alive connection was not closed after 5 s (+2)")
        finally:
            s.close()


SEND_TIMEOUT = 3.0   # send_timeout_s of the server below
ANSWERS_APP = """
import asyncio, dataclasses, json, sys
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from mdl_jax.serving.connections import bind, run_app
from mdl_jax.serving.protocol import LIMITS

async def answer(request):  # written whole, as both servers write a JSON answer
    return Response(b"x" * (8 << 20), media_type="application/json")

async def stream(request):  # 30 chunks over 3 s: longer than the deadline, for a client that reads
    async def chunks():
        for _ in range(30):
            yield b"y" * (256 << 10)
            await asyncio.sleep(0.1)
    return StreamingResponse(chunks(), media_type="text/event-stream")

async def endless(request):
    async def chunks():
        while True:
            yield b"z" * (64 << 10)
            await asyncio.sleep(0)   # (one that never waits would hold the loop once its client is gone)
    return StreamingResponse(chunks(), media_type="text/event-stream")

sock = bind("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
run_app(Starlette(routes=[Route("/answer", answer), Route("/stream", stream), Route("/endless", endless)]),
        sock, dataclasses.replace(LIMITS, send_timeout_s=float(sys.argv[1]), **json.loads(sys.argv[2])))
"""


@contextlib.contextmanager
def answers_server(log: Path, **limits):
    """ANSWERS_APP on a free port of 127.0.0.1 (its port), its log written to ``log``; ``limits``
    replace those of ``LIMITS`` (besides send_timeout_s, SEND_TIMEOUT)."""
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", ANSWERS_APP, str(SEND_TIMEOUT), json.dumps(limits)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline() or 0)
        assert port, log.read_text()
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_client_that_does_not_take_what_it_is_sent_is_reset_at_the_send_deadline(tmp_path):
    """What both servers run on (``connections.run_app``, the local model server's JSON answers
    included): an answer went into the server's buffers whole, and a client that read none of it kept
    them and its connection for good (a close waits for the buffer to be taken); a stream it stopped
    reading, likewise. Now a client that has not taken an answer within send_timeout_s, or whose
    stream stalled that long, is reset there, one line logged for each; a client that reads gets a
    large answer whole, and a stream that runs longer than the deadline, read as it comes, whole."""
    log = tmp_path / "server.log"
    with answers_server(log) as port:
        url = f"http://127.0.0.1:{port}"
        r = httpx.get(url + "/answer", timeout=30)
        assert r.status_code == 200 and r.content == b"x" * (8 << 20)
        with httpx.stream("GET", url + "/stream", timeout=30) as r:
            assert sum(len(c) for c in r.iter_bytes()) == 30 * (256 << 10)
        socks, polls = [], []
        for path in ("/answer", "/endless"):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # takes a few KiB, then reads nothing
            s.connect(("127.0.0.1", port))
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            socks.append(s)
            polls.append(select.poll())   # the server's reset, seen without reading
            polls[-1].register(s, select.POLLHUP | select.POLLERR)
        try:
            closed = [until(lambda p=p: bool(p.poll(0)), SEND_TIMEOUT + 3) for p in polls]
        finally:
            for s in socks:
                s.close()
        assert None not in closed, f"still open {SEND_TIMEOUT + 3:g} s on (answer, stream): {closed}"
        assert closed[0] >= SEND_TIMEOUT - 0.5, f"closed after {closed[0]:.1f} s, before the deadline"
        said = [x for x in log.read_text().splitlines() if "not taken within" in x]
        assert len(said) == 2 and all(f"within {SEND_TIMEOUT:g} s" in x for x in said), said


def test_the_connection_past_the_limit_sheds_the_oldest_silent_one_and_is_served(tmp_path):
    """max_connections = 3: three connections that send nothing are allowed; a fourth is served, and
    opening it closed the oldest silent one (silently: it sent no bytes), no other."""
    with answers_server(tmp_path / "server.log", max_connections=3, header_timeout_s=60.0) as port:
        silent = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                got = b""
                while data := s.recv(65536):
                    got += data
            assert got.startswith(b"HTTP/1.1 404"), got[:80]
            # the shed came before the fourth was read: the oldest's end is already there, no wait
            ended = [bool(select.select([c], [], [], 0)[0]) and c.recv(1) == b"" for c in silent]
            assert ended == [True, False, False], ended
        finally:
            for c in silent:
                c.close()


def test_a_kept_alive_connection_that_starts_its_next_request_and_stalls_gets_the_header_timeout():
    """The header timeout runs again after each answer: a client that, on a kept-alive connection,
    sends part of its next request's headers and no more is answered 408 and closed (uvicorn's own
    keep-alive timeout stops once any byte arrives), not held open for good."""
    # 4 s: room for this process to be descheduled between the answer and its next bytes on a loaded
    # machine (past the timeout the connection ends silently, as an idle kept-alive one does)
    with answers_server(Path(os.devnull), header_timeout_s=4.0) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got and (data := s.recv(65536)):
                got += data
            head, body = got.split(b"\r\n\r\n", 1)
            n = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")).split(b":")[1])
            while len(body) < n and (data := s.recv(65536)):
                body += data
            assert head.startswith(b"HTTP/1.1 404") and len(body) == n, got[:80]
            s.sendall(b"GET /nowhere HTTP/1.1\r\nHo")   # within the timeout (else it ends silently)
            rest = b""
            while data := s.recv(65536):   # a TimeoutError here: the connection was held
                rest += data
            assert rest.startswith(b"HTTP/1.1 408") and b"headers not received within 4 s" in rest, rest[:200]


def test_a_slow_but_steady_reader_of_a_big_answer_is_not_cut_off_at_the_send_deadline(tmp_path):
    """The deadline is for a client that takes nothing: one reading an 8 MiB answer steadily, at a pace
    that needs about twice send_timeout_s, was reset at the deadline mid-answer (the clock ran from
    the write, whatever the client took since). The clock starts again each time some has gone out."""
    log = tmp_path / "server.log"
    rate = (8 << 20) / (2 * SEND_TIMEOUT)   # bytes a second: the whole answer in about 2 deadlines
    with answers_server(log) as port:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        got, t = 0, time.monotonic()
        try:
            while data := s.recv(64 << 10):   # a reset here: cut off mid-answer
                got += len(data)
                time.sleep(max(0.0, got / rate - (time.monotonic() - t)))
        finally:
            s.close()
        took = time.monotonic() - t
    assert got > 8 << 20 and took > SEND_TIMEOUT + 1, (got, took)
    assert "not taken within" not in log.read_text(), log.read_text()


# --- the gateway before a hostile upstream -----------------------------------------------------------

BIG = 48 << 20  # decoded bytes of the gzip-bombed answer (the gateway's limit is 8 MiB)


class Hostile(BaseHTTPRequestHandler):
    """An OpenAI-compatible upstream that misbehaves as the request's ``model`` says."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, body: bytes, ctype="application/json", extra=()):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send(b'{"object": "list", "data": [{"id": "x", "object": "model"}]}')

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        m = req["model"]
        done = b'{"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": ' \
               b'{"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]'
        if m == "nan":
            self.send(done + b', "usage": {"prompt_tokens": NaN}}')
        elif m == "surrogate":
            self.send(done + b', "x": "\\ud800"}')
        elif m == "deep":
            self.send(done + b', "x": ' + b"[" * 100000 + b"]" * 100000 + b"}")
        elif m == "big":
            pad = b'{"choices": [], "x": "' + b"a" * BIG + b'"}'
            self.send(gzip.compress(pad, 6), extra=[("Content-Encoding", "gzip")])
        elif m == "garbage-sse":
            self.send(b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "o"}}]}\n\n'
                      b"data: this is not json\n\ndata: [DONE]\n\n", "text/event-stream")
        elif m == "empty-sse":
            self.send(b": nothing here\n\nevent: ping\n\n", "text/event-stream")
        elif m == "cr-sse":   # the SSE format's third line end, a lone CR
            self.send(b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "o"}}]}\r\r'
                      b"data: [DONE]\r", "text/event-stream")
        elif m == "error-first-sse":
            self.send(b'data: {"error": {"message": "a warning"}}\n\n'
                      b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "o"}}]}\n\n'
                      b"data: [DONE]\n\n", "text/event-stream")
        elif m == "flood-sse":   # one event of 1.2 million empty data lines (7 MB, under the stream's 8 MiB)
            self.send(b"data:\n" * 1_200_000 + b"\ndata: [DONE]\n\n", "text/event-stream")
        elif m == "blank-flood-sse":   # 7 MB of blank lines, no event
            self.send(b"\n" * 7_000_000 + b"data: [DONE]\n\n", "text/event-stream")
        elif m in ("limit-sse", "limit-plus-one-sse"):   # one data line of exactly max_event_bytes, or one more
            n = (1 << 20) - len(b'{"choices": [], "x": ""}') + (m == "limit-plus-one-sse")
            self.send(b'data: {"choices": [], "x": "' + b"a" * n + b'"}\n\ndata: [DONE]\n\n', "text/event-stream")
        elif m == "error-null-sse":
            self.send(b'data: {"id": "c", "error": null, "choices": [{"index": 0, "delta": {"content": "o"}}]}\n\n'
                      b"data: [DONE]\n\n", "text/event-stream")
        elif m == "split-sse":   # one event of two data lines, its CRLFs split across writes
            parts = [b'data: {"id": "c",\r', b'\ndata: "choices": [{"index": 0, "delta": {"content": "o"}}]}\r',
                     b"\n\r", b"\ndata: [DONE]\r", b"\n\r\n"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(sum(map(len, parts))))
            self.end_headers()
            for part in parts:
                self.wfile.write(part)
                self.wfile.flush()
                time.sleep(0.05)
        elif m == "rate-limited-html":
            body = b"<html>429 Too Many Requests</html>"
            self.send_response(429)
            for k, v in (("Content-Type", "text/html"), ("Content-Length", str(len(body))), ("Retry-After", "5")):
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        elif m == "rate-limited":
            body = b'{"error": {"message": "slow down", "type": "rate_limit_error"}}'
            self.send_response(429)
            for k, v in (("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                         ("Retry-After", "17"), ("Retry-After", "18"), ("x-ratelimit-remaining-requests", "0"),
                         ("Set-Cookie", "s=1")):
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send(done + b"}")


@pytest.fixture(scope="module")
def hostile():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def gateway(hostile, tmp_path_factory):
    d = tmp_path_factory.mktemp("gw")
    cache = d / "cache"
    cache.mkdir()
    log = d / "gateway.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "mdl_jax", "gateway", "--upstream", hostile,
                                 "--port", "0", "--timeout", "30"], cwd=ROOT,
                                env={**os.environ, "MDL_JAX_CACHE_DIR": str(cache)},
                                stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    assert "MDL gateway on http://127.0.0.1:" in line, (line, log.read_text())
    try:
        yield line.split(" on ")[1].split(" ")[0], proc.pid, log, cache, hostile
    finally:
        proc.terminate()
        proc.wait(timeout=30)


Q = "What is the capital of France?"
MDL = {"memories": ["France is famous for its cheese and wine."], "risk": 0.5}


def _post(url, model, **kw):
    return httpx.post(url + "/chat/completions", timeout=60, json={
        "model": model, "messages": chat(Q), "mdl": MDL, **kw})


def test_gateway_upstream_json_it_cannot_pass_on_is_a_502_naming_the_upstream(gateway):
    url, _, log, _, up = gateway
    where = up.split("//")[1].split("/")[0]
    ok = _post(url, "fine")
    assert ok.status_code == 200 and ok.json()["mdl"]["upstream"], ok.text[:300]
    for m in ("nan", "surrogate", "deep"):
        r = _post(url, m)
        assert r.status_code == 502, (m, r.status_code, r.text[:200])
        err = r.json()["error"]
        assert err["type"] == "upstream_error" and where in err["message"], err
    assert "Traceback" not in log.read_text()
    # a NaN (or an infinity) in a field the gateway forwards is the client's error
    for blob in (b"NaN", b"Infinity", b"1e999"):
        r = httpx.post(url + "/chat/completions", timeout=60, headers={"Content-Type": "application/json"},
                       content=b'{"model": "fine", "temperature": ' + blob + b', "messages": '
                               b'[{"role": "user", "content": "Hi"}]}')
        assert r.status_code == 400, (blob, r.status_code, r.text[:200])


def test_gateway_garbage_server_sent_events_end_in_an_openai_error_event(gateway):
    url, _, _, _, up = gateway
    where = up.split("//")[1].split("/")[0]
    c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
    for m in ("garbage-sse", "empty-sse"):
        with pytest.raises(openai.APIError) as e:
            for _ in c.chat.completions.create(model=m, messages=chat(Q), stream=True,
                                               extra_body={"mdl": MDL}):
                pass
        assert where in str(e.value.message), (m, e.value.message)
        with httpx.stream("POST", url + "/chat/completions", timeout=60, json={
                "model": m, "messages": chat(Q), "stream": True, "mdl": MDL}) as r:
            events = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2]), events
        assert "mdl" in json.loads(events[0]) or m == "empty-sse", events  # the decision went upstream


def test_gateway_reads_every_sse_line_end_puts_the_decision_on_the_first_answer_and_bounds_an_event(gateway):
    """A lone CR ends a line too (SSE's third line end); an upstream's error event first does not take
    the decision away from the answer after it; a flood of empty data lines is an event over the limit
    (each used to count 0 bytes, and summing the lines per line made one event quadratic in time)."""
    url, _, log, _, _ = gateway

    def events(m):
        with httpx.stream("POST", url + "/chat/completions", timeout=60, json={
                "model": m, "messages": chat(Q), "stream": True, "mdl": MDL}) as r:
            return [json.loads(x[6:]) if x[6:] != "[DONE]" else "[DONE]" for x in r.iter_lines()
                    if x.startswith("data: ")]

    cr = events("cr-sse")
    assert cr[-1] == "[DONE]" and cr[0]["choices"][0]["delta"]["content"] == "o" and "mdl" in cr[0], cr
    first = events("error-first-sse")
    assert "error" in first[0] and "mdl" not in first[0] and "mdl" in first[1] and first[2] == "[DONE]", first
    flood = events("flood-sse")
    assert flood[-1] == "[DONE]" and "sent an event over" in flood[-2]["error"]["message"], flood
    blank = events("blank-flood-sse")
    assert "lines that are no event" in blank[-2]["error"]["message"], blank
    exact, over = events("limit-sse"), events("limit-plus-one-sse")   # the limit counts the event's data
    assert "mdl" in exact[0] and exact[1] == "[DONE]", exact[0].keys()
    assert "sent an event over" in over[-2]["error"]["message"], over
    split = events("split-sse")   # a CR that ends a write and the LF that opens the next are one line end
    assert split[0]["choices"][0]["delta"]["content"] == "o" and "mdl" in split[0] and split[1] == "[DONE]", split
    null = events("error-null-sse")   # {"error": null} is an answer's chunk: it carries the decision
    assert "mdl" in null[0] and null[-1] == "[DONE]", null
    assert "Traceback" not in log.read_text()


def test_gateway_answers_a_request_that_is_not_http_in_openais_error_shape(gateway):
    """A request line, header or Content-Length that h11 cannot parse got uvicorn's text/plain 400;
    every error is OpenAI's JSON, and the connection is closed (nothing after such a request is read)."""
    host, port = gateway[0].split("//")[1].split("/")[0].split(":")
    for bad in (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                b"NOT HTTP AT ALL\r\n\r\n", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(bad)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head.lower(), got
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_http", err


def test_gateway_refuses_a_body_that_is_not_declared_json_before_reading_it(gateway):
    """A form or text/plain POST, what a web page may send to 127.0.0.1 without a preflight, was served:
    it is a 415 naming Content-Type, before the body is read; JSON, +json and no Content-Type are read."""
    url = gateway[0]
    body = json.dumps({"model": "fine", "messages": chat(Q), "mdl": MDL}).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = httpx.post(url + "/chat/completions", content=body, headers={"Content-Type": kind}, timeout=60)
        assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type", (kind, r.text[:200])
        assert r.json()["error"]["code"] == "unsupported_media_type"
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json", None):
        r = httpx.post(url + "/chat/completions", content=body, timeout=60,
                       headers={"Content-Type": kind} if kind else {})
        assert r.status_code == 200, (kind, r.text[:200])


def test_gateway_passes_an_upstream_4xx_with_its_retry_headers(gateway):
    r = _post(gateway[0], "rate-limited")
    assert r.status_code == 429 and r.json()["error"]["message"] == "slow down", r.text[:200]
    assert r.headers["retry-after"] == "17" and r.headers["x-ratelimit-remaining-requests"] == "0"   # the first value
    assert "set-cookie" not in r.headers   # only what says when to come back, not the upstream's session
    html = _post(gateway[0], "rate-limited-html")   # a proxy's text body: OpenAI's shape, the status and header kept
    assert html.status_code == 429 and html.headers["retry-after"] == "5", html.text[:200]
    assert html.json()["error"]["type"] == "rate_limit_error", html.text[:200]


def _hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_gateway_refuses_an_oversized_upstream_answer_with_its_memory_bounded(gateway):
    url, pid, _, _, _ = gateway
    _post(url, "fine")
    before = _hwm_kb(pid)
    r = _post(url, "big")
    grew = (_hwm_kb(pid) - before) / 1024
    print(f"\n48 MB (gzip-decoded) answer: HTTP {r.status_code}, gateway peak RSS +{grew:.1f} MB")
    assert r.status_code == 502 and "limit" in r.json()["error"]["message"], r.text[:200]
    assert grew < 24, grew  # the 8 MiB limit, not the 48 MB answer


def test_gateway_client_memories_never_fill_the_disk(gateway):
    url, _, _, cache, _ = gateway

    def size():
        return sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())

    _post(url, "fine")
    before = size()
    for k in range(3):
        mems = [f"memory {k}-{i}: a new text the gateway has never seen." for i in range(64)]
        r = httpx.post(url + "/chat/completions", timeout=120, json={
            "model": "fine", "messages": chat("Hi"), "mdl": {"memories": mems, "risk": 0.5}})
        assert r.status_code == 200, r.text[:200]
    assert size() == before  # nothing a client sends is written to disk
    h = httpx.get(url[:-len("/v1")] + "/health", timeout=10).json()["embedding_cache"]
    assert 0 < h["texts"] <= h["max_texts"], h


def test_bounded_embedder_keeps_at_most_its_bound_and_agrees_with_the_disk_cached_one(tmp_path):
    import numpy as np

    from mdl_jax.serving.gateway import BoundedEmbedder
    from mdl_jax.signals.embeddings import Embedder

    e = BoundedEmbedder(max_texts=10)
    texts = [f"text number {i}" for i in range(25)]
    a = e.embed(texts)
    assert a.shape[0] == 25 and len(e.cache) == 10 and list(e.cache)[-1] == e.key(texts[-1])
    b = Embedder(cache_dir=tmp_path).embed(texts)
    assert np.allclose(a, b, atol=1e-5)


@pytest.fixture(scope="module")
def warm_embedder(embedder):
    """The session's real MiniLM ``Embedder``, loaded (here, not inside a test's time)."""
    embedder.embed(["the model loads before the test"])
    return embedder


def test_bounded_embedder_holds_digests_not_texts_and_never_more_bytes_than_its_bound(warm_embedder):
    """The cache kept each text itself as its key, so the gateway grew by each new memory's size,
    up to 20,000 of them. Now it keeps a digest of each text and its vector, at most ``max_bytes`` of
    them as ``nbytes`` counts, and that count is the sum over what it holds; a vector served from it
    is the one computed."""
    import numpy as np

    from mdl_jax.serving.gateway import BoundedEmbedder

    one = BoundedEmbedder.like(warm_embedder, max_texts=1)
    one.embed(["a short text"])
    per_entry = one.nbytes  # what one kept vector costs, whatever its text's length
    assert 0 < per_entry < 4096
    e = BoundedEmbedder.like(warm_embedder, max_texts=1000, max_bytes=10 * per_entry + per_entry // 2)
    assert e.max_bytes < 11 * per_entry
    huge = "memory: " + "a long retrieved passage about nothing in particular. " * 17000
    assert len(huge.encode()) > 900_000
    for batch in ([huge], [f"text {i}" for i in range(8)], [huge] + [f"text {i}" for i in range(4, 12)],
                  [f"text {i}" for i in range(20, 40)]):
        e.embed(batch)
        assert e.nbytes <= e.max_bytes and len(e.cache) <= 10, (e.nbytes, e.max_bytes, len(e.cache))
        assert e.nbytes == sum(e.entry_bytes(k, v) for k, v in e.cache.items())
        assert all(isinstance(k, bytes) and len(k) == 32 for k in e.cache)  # digests, never a text
        assert e.nbytes == len(e.cache) * per_entry  # the 900 kB text costs what a short one does
    assert len(e.cache) == 10 and e.n_cached == 5  # the huge text and texts 4-7 came from the cache
    # what it serves from the cache is what it computed
    kept = [f"text {i}" for i in range(30, 40)]
    fresh, _ = warm_embedder.encode_uncached(kept)
    assert np.allclose(e.embed(kept), fresh, atol=1e-6) and e.n_cached == 5 + len(kept)
    with pytest.raises(ValueError, match="max_bytes"):
        BoundedEmbedder(max_bytes=0)


def test_gateway_refuses_memories_over_the_per_request_byte_limit_naming_it(gateway):
    from mdl_jax.serving.protocol import LIMITS

    url = gateway[0]
    limit = LIMITS.max_memory_bytes
    assert limit < LIMITS.max_body_bytes // 2  # the body limit alone let 900 kB memories through
    words = "a retrieved passage of ordinary words. "
    over = [words * (limit // len(words) // 2 + 1), words * (limit // len(words) // 2 + 1)]  # together > limit
    r = httpx.post(url + "/chat/completions", timeout=60, json={
        "model": "fine", "messages": chat(Q), "mdl": {"memories": over, "risk": 0.5}})
    assert r.status_code == 400, (r.status_code, r.text[:200])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == "mdl.memories", err
    assert "max_memory_bytes" in err["message"] and str(limit) in err["message"], err
    at = [words * (limit // len(words) // 2), {"text": words * (limit // len(words) // 2)}]  # together <= limit
    assert sum(len((m if isinstance(m, str) else m["text"]).encode()) for m in at) <= limit
    r = httpx.post(url + "/chat/completions", timeout=60, json={
        "model": "fine", "messages": chat(Q), "mdl": {"memories": at, "risk": 0.5}})
    assert r.status_code == 200, (r.status_code, r.text[:200])


# --- the gateway before a slow upstream --------------------------------------------------------------

GW_TIMEOUT = 5.0  # the gateway's --timeout here
DRIP_S = 0.1      # the slow upstream's pause between bytes
BIG_ANSWER = 6 << 20  # the "big" answer's content: several MiB, under the gateway's max_upstream_bytes


class SlowUpstream:
    """A tiny asyncio HTTP/1.1 upstream in a thread of its own. Model "drip": the whole answer
    (status line and headers included) one byte every DRIP_S, ~20 s in all, each byte well within
    any per-read timeout; "drip-events": the stream's headers at once, then its events one byte every
    DRIP_S; "hang": nothing until the caller closes the connection (or 30 s); "firehose": a stream of
    events as fast as the caller takes them, without end; "big": at once, an answer of BIG_ANSWER bytes. ``open`` counts the "hang" connections the
    caller still holds, ``pouring`` the "firehose" ones."""

    def __init__(self):
        import asyncio

        self.open = self.pouring = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def handle(self, reader, writer):
        import asyncio

        try:
            head = await reader.readuntil(b"\r\n\r\n")
            n = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                      if x.lower().startswith(b"content-length:")), 0)
            req = json.loads(await reader.readexactly(n)) if n else {}
            model = req.get("model")
            if model == "hang":
                self.open += 1
                try:
                    await asyncio.wait_for(reader.read(1), 30)  # b"": the caller let go
                finally:
                    self.open -= 1
                return
            if model == "firehose":
                self.pouring += 1
                try:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                    event = b'data: {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, ' \
                            b'"delta": {"content": "' + b"y" * 16000 + b'"}, "finish_reason": null}]}\n\n'
                    while True:
                        writer.write(event)
                        await writer.drain()
                finally:
                    self.pouring -= 1
            if model == "big":
                body = json.dumps({"id": "c", "object": "chat.completion", "choices": [{
                    "index": 0, "message": {"role": "assistant", "content": "x" * BIG_ANSWER},
                    "finish_reason": "stop"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                return
            if model == "drip-events":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Connection: close\r\n\r\n")
                slow = b'data: {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, ' \
                       b'"delta": {"content": "o"}, "finish_reason": null}]}\n\n' * 2 + b"data: [DONE]\n\n"
            else:
                body = b'{"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": ' \
                       b'{"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}'
                slow = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + \
                    str(len(body)).encode() + b"\r\n\r\n" + body
            for i in range(len(slow)):
                writer.write(slow[i:i + 1])
                await writer.drain()
                await asyncio.sleep(DRIP_S)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.fixture(scope="module")
def slow_gateway(tmp_path_factory):
    up = SlowUpstream()
    d = tmp_path_factory.mktemp("gw-slow")
    log = d / "gateway.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "mdl_jax", "gateway", "--upstream", up.url,
                                 "--port", "0", "--timeout", str(GW_TIMEOUT)], cwd=ROOT,
                                env={**os.environ, "MDL_JAX_CACHE_DIR": str(d)},
                                stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    assert "MDL gateway on http://127.0.0.1:" in line, (line, log.read_text())
    try:
        yield line.split(" on ")[1].split(" ")[0], up, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        up.close()


def test_gateway_timeout_is_a_deadline_for_the_whole_upstream_call(slow_gateway):
    """--timeout bounded each read, not the call: an upstream sending its answer a byte at a time
    reached the client long after it. Now it bounds the whole call: a 502 at the deadline."""
    url, _, _ = slow_gateway
    t = time.monotonic()
    r = httpx.post(url + "/chat/completions", timeout=GW_TIMEOUT + 3, json={
        "model": "drip", "messages": chat(Q), "mdl": MDL})
    took = time.monotonic() - t
    assert r.status_code == 502, (r.status_code, r.text[:200])
    err = r.json()["error"]
    assert err["code"] == "upstream_error" and f"within {GW_TIMEOUT:g} s" in err["message"], err
    assert GW_TIMEOUT - 0.5 <= took <= GW_TIMEOUT + 1.5, took


def test_gateway_timeout_ends_a_dripping_stream_with_an_error_event_at_the_deadline(slow_gateway):
    """A stream whose status line has gone out and whose events drip ends at the deadline with an
    OpenAI-style error event naming it, then [DONE] (it ran to the upstream's end, ~20 s, before)."""
    url, _, _ = slow_gateway
    t = time.monotonic()
    events = []
    with httpx.stream("POST", url + "/chat/completions", timeout=GW_TIMEOUT + 3, json={
            "model": "drip-events", "messages": chat(Q), "mdl": MDL, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
            assert time.monotonic() - t <= GW_TIMEOUT + 1.5, events  # the upstream takes ~20 s
    took = time.monotonic() - t
    assert events[-1] == "[DONE]" and f"within {GW_TIMEOUT:g} s" in json.loads(events[-2])["error"]["message"]
    assert GW_TIMEOUT - 0.5 <= took <= GW_TIMEOUT + 1.5, took


def test_gateway_timeout_ends_the_upstream_call_of_a_client_that_stops_reading(slow_gateway):
    """A stream waits on its client as well as on its upstream: a client that took the first events
    and then read nothing held its upstream call (and a connection of the gateway's upstream pool) for
    as long as it stayed, past --timeout, the deadline being checked only while waiting on the
    upstream. Now a send that waits past the deadline ends the stream there, the upstream call
    with it, and the client's connection is closed."""
    url, up, _ = slow_gateway
    host, port = url.split("//")[1].split("/")[0].split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a client that takes little and then stops
    s.connect((host, int(port)))
    data = json.dumps({"model": "firehose", "messages": chat(Q), "mdl": MDL, "stream": True}).encode()
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    try:
        assert until(lambda: up.pouring == 1, 10) is not None, "the stream never reached the upstream"
        t = time.monotonic()
        ended = until(lambda: up.pouring == 0, GW_TIMEOUT + 5, 0.05)
        assert ended is not None, f"the upstream call still ran {time.monotonic() - t:.1f} s on, past --timeout"
        s.settimeout(10)   # what was sent, then the end: the connection is closed, not left open
        with contextlib.suppress(ConnectionResetError):
            while s.recv(1 << 16):
                pass
    finally:
        s.close()
    assert httpx.get(url[:-len("/v1")] + "/health", timeout=10).json()["status"] == "ok"


def test_gateway_lets_go_of_the_upstream_when_its_client_leaves(slow_gateway):
    """Clients that left a long upstream call left the gateway's upstream connections open until
    the upstream answered (or --timeout). Now the call is raced against the client's disconnect:
    20 clients (every fourth streaming) that leave while their upstream calls hang free every
    upstream connection at once."""
    url, up, _ = slow_gateway
    n = 20
    socks = [send_and_hold(url, "/chat/completions", {"model": "hang", "messages": chat(Q), "mdl": MDL,
                                                      "stream": i % 4 == 0}) for i in range(n)]
    try:
        assert until(lambda: up.open == n, 10) is not None, up.open  # every call has reached the upstream
    finally:
        left = time.monotonic()
        for s in socks:
            s.close()
    freed = until(lambda: up.open == 0, 2.0, 0.02)
    print(f"\n{n} abandoned upstream calls let go {freed} s after their clients left")
    assert freed is not None, f"{up.open} upstream connections still open {time.monotonic() - left:.1f} s on"
    assert httpx.get(url[:-len("/v1")] + "/health", timeout=10).json()["status"] == "ok"


def test_gateway_timeout_lets_go_of_a_client_that_does_not_take_a_non_streamed_answer(slow_gateway):
    """A non-streamed answer goes into the server's buffers whole: a client that read none of it kept
    them, and its connection, for as long as it stayed (a close waits for the buffer to be taken),
    with no time bound. Now a client that has not taken its answer within --timeout is disconnected
    there (a reset: the kernel's copy is dropped too), with one line in the log, neither body nor key
    in it; a client that reads gets the whole answer."""
    url, _, log = slow_gateway
    r = httpx.post(url + "/chat/completions", timeout=60, json={"model": "big", "messages": chat(Q), "mdl": MDL})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "x" * BIG_ANSWER
    logged = len(log.read_text())
    host, port = url.split("//")[1].split("/")[0].split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # takes a few KiB, then reads nothing
    s.connect((host, int(port)))
    data = json.dumps({"model": "big", "messages": chat(Q), "mdl": MDL}).encode()
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Authorization: Bearer sk-not-for-the-log\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    gone = select.poll()   # the server's reset, seen without reading
    gone.register(s, select.POLLHUP | select.POLLERR)
    try:
        closed = until(lambda: bool(gone.poll(0)), GW_TIMEOUT + 3)
    finally:
        s.close()
    assert closed is not None, f"the connection was still open {GW_TIMEOUT + 3:g} s on, past --timeout"
    assert closed >= GW_TIMEOUT - 0.5, f"closed after {closed:.1f} s, before the deadline"
    said = [x for x in log.read_text()[logged:].splitlines() if "not taken within" in x]
    assert len(said) == 1 and f"within {GW_TIMEOUT:g} s" in said[0], said
    assert "sk-not-for-the-log" not in log.read_text() and "xxxx" not in said[0], said
    assert httpx.get(url[:-len("/v1")] + "/health", timeout=10).json()["status"] == "ok"
