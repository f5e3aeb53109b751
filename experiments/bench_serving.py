"""Short-request latency of the local model server beside a long chat prompt's prefill.

    python -m experiments.bench_serving [--repo PATH] [--lines 470] [--shorts 5]

Starts ``python -m mdl_repro.serve`` (from ``--repo``: this checkout, or an older one to compare) on
127.0.0.1 and measures, with the bundled SmolLM2:

- baseline: a short chat request (4-word prompt, 2 tokens, greedy) alone, median of ``--shorts``;
- beside prefill: the same short request sent while a ~7,450-token chat prompt (``--lines`` lines,
  ``max_tokens`` 1, the long lane) is being read, median of those answered while it still ran;
- the long request's own time alone and with the short ones beside it (what yielding costs it);
- let go: seconds from its client leaving mid-prefill until the long lane is idle (target 1 s).

Target: short requests keep their latency, ≤ 2× baseline, whatever long work runs beside
them. Prints a table with the target beside each figure, the CPU's flags, then one JSON object as the
last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _cpu_flags() -> str:
    from experiments._machine import cpu_flags, cpu_model

    wanted = cpu_flags(("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"))
    return f"{cpu_model()}, {os.cpu_count()} cores, {' '.join(wanted) or 'no AVX2'}"


class Server:
    def __init__(self, repo: Path):
        env = {**os.environ, "PYTHONPATH": str(repo)}
        self.proc = subprocess.Popen([sys.executable, "-m", "mdl_repro.serve", "--port", "0"], cwd=repo,
                                     stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if " on http://" not in line:
            raise RuntimeError(f"the server did not start: {line!r}")
        self.url = line.split(" on ")[-1].strip()

    def health(self) -> dict:
        return httpx.get(self.url[:-len("/v1")] + "/health", timeout=60).json()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def short(url: str) -> float:
    t = time.monotonic()
    r = httpx.post(url + "/chat/completions", json={"messages": _chat("Say hi to me."), "max_tokens": 2,
                                                     "temperature": 0}, timeout=600)
    r.raise_for_status()
    return time.monotonic() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=ROOT, help="checkout whose server to measure")
    p.add_argument("--lines", type=int, default=470, help="lines of the long prompt (~16 tokens each)")
    p.add_argument("--shorts", type=int, default=5, help="short requests per measurement")
    args = p.parse_args(argv)
    text = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(args.lines))
    long_body = {"messages": _chat(text), "max_tokens": 1, "temperature": 0}
    srv = Server(args.repo)
    url = srv.url
    try:
        short(url)  # warm
        base = statistics.median(short(url) for _ in range(args.shorts))

        t = time.monotonic()
        r = httpx.post(url + "/chat/completions", json=long_body, timeout=900)
        r.raise_for_status()
        long_alone = time.monotonic() - t
        n_long = r.json()["usage"]["prompt_tokens"]

        done: dict = {}

        def long_request():
            t0 = time.monotonic()
            httpx.post(url + "/chat/completions", json=long_body, timeout=900).raise_for_status()
            done["s"] = time.monotonic() - t0

        th = threading.Thread(target=long_request)
        th.start()
        while not srv.health()["running"].get("long"):
            time.sleep(0.02)
        beside: list[float] = []
        while "s" not in done and len(beside) < args.shorts:
            took = short(url)
            if "s" not in done:  # answered while the long prompt still ran
                beside.append(took)
        th.join()
        long_beside = done["s"]

        # let go: the client of a long prompt leaves 1 s into its prefill
        def leave():
            try:
                httpx.post(url + "/chat/completions", json=long_body, timeout=1.0)
            except httpx.TimeoutException:
                pass

        th = threading.Thread(target=leave)
        th.start()
        th.join()
        t = time.monotonic()
        while srv.health()["running"].get("long"):
            time.sleep(0.02)
        let_go = time.monotonic() - t
    finally:
        srv.close()
    under = statistics.median(beside) if beside else float("nan")
    rows = [("short request alone (median, s)", f"{base:.2f}", ""),
            ("short request beside the prefill (median, s)", f"{under:.2f}", f"<= {2 * base:.2f} (2x)"),
            ("  ratio", f"{under / base:.2f}x", "<= 2x"),
            ("  short requests answered during the prefill", f"{len(beside)}", f"{args.shorts}"),
            (f"long request alone ({n_long} prompt tokens, s)", f"{long_alone:.2f}", ""),
            ("long request with the short ones beside (s)", f"{long_beside:.2f}", ""),
            ("abandoned long prefill let go after (s)", f"{let_go:.2f}", "<= 1"),
            ]
    print(f"server from {args.repo}; CPU: {_cpu_flags()}")
    for name, fig, target in rows:
        print(f"{name:<48} {fig:>8}   target {target or '-'}")
    print(json.dumps({"repo": str(args.repo), "cpu": _cpu_flags(), "prompt_tokens": n_long,
                      "short_alone_s": base, "short_beside_prefill_s": under, "ratio": under / base,
                      "shorts_during_prefill": len(beside), "long_alone_s": long_alone,
                      "long_beside_s": long_beside, "let_go_s": let_go}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
