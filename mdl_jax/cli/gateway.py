"""``mdl-jax gateway``: the command (flags checked at parse time; the HTTP stack imported on run)."""

from __future__ import annotations

import argparse
import sys

from mdl_jax.cli.args import DefaultsHelpFormatter


def _port(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {s!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {v}")
    return v


def _upstream(s: str) -> str:
    from urllib.parse import urlsplit

    u = urlsplit(s)
    if u.scheme not in ("http", "https") or not u.hostname or "?" in s or "#" in s:
        # a query or fragment would end up before the paths the gateway appends (/chat/completions)
        raise argparse.ArgumentTypeError(f"expected an http(s) base URL like http://127.0.0.1:8123/v1, without "
                                         f"?query or #fragment, got {s!r}")
    return s


def _risk(s: str):
    if s in ("truthfulqa", "halueval"):
        return s
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], 'truthfulqa' or 'halueval', got {s!r}") \
            from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {s}")
    return v


def _seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        v = float("nan")
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {s!r}")
    return v


def register(sub) -> None:
    from mdl_jax.signals.embeddings import EMBED_BACKENDS  # here: the module stays light to import

    p = sub.add_parser(
        "gateway", help="an OpenAI-compatible MDL gateway in front of any OpenAI-compatible server",
        description="Serve /v1/chat/completions and /v1/models: MDL decides per request from the "
                    "memories in the request's \"mdl\" field, the messages for the action go upstream, "
                    "Opt-Out answers without calling it. Starts in a few seconds (loads MiniLM); "
                    "stop with Ctrl-C.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("--upstream", required=True, type=_upstream,
                   help="base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8123/v1")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8300, help="port (0: any free one)")
    p.add_argument("--config", default=None, help="an MDL config JSON file (default: the paper's defaults, MDLConfig())")
    p.add_argument("--risk", type=_risk, default=0.5,
                   help="A when a request gives none: a number in [0, 1] or a preset (truthfulqa, halueval)")
    p.add_argument("--embedder", default=None, help="sentence-transformers name or path (default: bundled MiniLM)")
    p.add_argument("--embed-backend", default="auto",
                   choices=EMBED_BACKENDS,
                   help="what runs the embedder: auto = OpenVINO bfloat16 on a CPU with it, else ONNX "
                        "Runtime float32, where installed (the signals extra), else torch")
    p.add_argument("--timeout", type=_seconds, default=300.0,
                   help="seconds one whole upstream call may take, answer or stream included (then 502, "
                        "or an error event ending the stream), and a client may take none of its answer "
                        "(then it is disconnected)")
    p.set_defaults(func=run)


def run(args) -> int:
    import dataclasses

    from mdl_jax.gate import MemoryGate
    from mdl_jax.serving.connections import bind, run_app
    from mdl_jax.serving.protocol import LIMITS

    kw = {"risk": args.risk, "config": args.config, "embed_backend": args.embed_backend}
    if args.embedder:
        kw["embedder"] = args.embedder
    try:
        gate = MemoryGate(**kw)
    except (ValueError, OSError) as e:
        print(f"mdl-jax: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    from mdl_jax.serving.gateway import Gateway, make_app

    gw = Gateway(gate, args.upstream, LIMITS, timeout=args.timeout)
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f"mdl-jax: error: --port: cannot bind {args.host}:{args.port}: {e.strerror}", file=sys.stderr)
        return 2
    try:  # the embedder loads here, so a model that cannot load is one line now, not a 500 later
        gate.decide("warm up", ["the embedder loads before the first request"])
    except ValueError as e:
        sock.close()
        # the embedder's messages begin "embedder: ", its name for what this command calls --embedder
        print(f"mdl-jax: error: --embedder: {' '.join(str(e).split()).removeprefix('embedder: ')}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    print(f"MDL gateway on http://{host}:{port}/v1 -> {gw.where}", flush=True)
    # a client may go as long without taking any of its answer as the upstream had to give it
    run_app(make_app(gw), sock, dataclasses.replace(LIMITS, send_timeout_s=args.timeout))
    return 0
