"""A small OpenAI-compatible chat-completions server on 127.0.0.1 serving a ``LocalBackend`` model.

    python -m mdl_jax.serve --port 8123 [--model bundled:smollm2] [--fail-first N]

Endpoints: GET /v1/models, POST /v1/chat/completions (model, messages, temperature, top_p,
max_tokens, seed, logprobs, top_logprobs). With ``logprobs: true`` the answer carries
``choices[0].logprobs.content[0]``: the first reply token, its log-probability and the
``top_logprobs`` most likely first tokens (0-20) with theirs, from one forward pass of the model, as
OpenAI's API does; CRAG and Self-RAG score their labels from them. It exists so the openai backend
can be exercised end to end against a real server with the real bundled model, offline.
``--fail-first N`` answers the first N completion requests with HTTP 503, to exercise the client's
retry path (fault injection, off by default).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mdl_jax.pipeline.generation import BUNDLED, LocalBackend


def make_server(host: str, port: int, backend: LocalBackend, fail_first: int = 0):
    lock = threading.Lock()
    state = {"to_fail": fail_first, "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _send(self, code: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": backend.model, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                msgs = req["messages"]
            except (ValueError, KeyError) as e:
                return self._send(400, {"error": {"message": f"bad request: {e}"}})
            with lock:
                state["requests"] += 1
                if state["to_fail"] > 0:
                    state["to_fail"] -= 1
                    return self._send(503, {"error": {"message": "injected failure"}})
                # The request's seed is the record seed: the answer is then the one LocalBackend gives
                # the same prompt for the same record (paired sampling across backends).
                g = backend.generate([msgs], seed=int(req.get("seed") or 0),
                                     max_new_tokens=int(req.get("max_tokens") or 150),
                                     temperature=float(req.get("temperature", 0.7)),
                                     top_p=float(req.get("top_p", 0.9)))[0]
                logprobs = None
                if req.get("logprobs"):
                    k = min(max(int(req.get("top_logprobs") or 0), 0), 20)
                    tops, first = backend.top_logprobs(msgs, max(k, 1), g.text)
                    token, lp = first or tops[0]
                    logprobs = {"content": [{
                        "token": token, "logprob": lp, "bytes": list(token.encode()),
                        "top_logprobs": [{"token": t, "logprob": x, "bytes": list(t.encode())}
                                         for t, x in tops[:k]]}]}
            self._send(200, {
                "id": f"chatcmpl-{state['requests']}", "object": "chat.completion",
                "created": int(time.time()), "model": req.get("model", backend.model),
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": logprobs,
                             "message": {"role": "assistant", "content": g.text}}],
                "usage": {"prompt_tokens": 0, "completion_tokens": g.n_tokens,
                          "total_tokens": g.n_tokens},
            })

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.state = state
    return srv


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--model", default=BUNDLED)
    p.add_argument("--fail-first", type=int, default=0)
    args = p.parse_args(argv)
    backend = LocalBackend(args.model, batch_size=1)
    backend._lm()  # load before accepting requests
    srv = make_server(args.host, args.port, backend, args.fail_first)
    print(f"serving {args.model} on http://{args.host}:{srv.server_port}/v1", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
