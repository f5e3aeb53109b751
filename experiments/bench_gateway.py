"""The MDL gateway's added latency per request, against calling the same upstream directly.

    python -m experiments.bench_gateway [--n 40] [--max-tokens 4] [--quick]

Starts the local model server (the bundled SmolLM2) and ``mdl-jax gateway`` in front of it, both on
127.0.0.1, with an empty embedding cache (every memory text is embedded for the first time: the
gateway's worst case). For each of ``--n`` questions with three memories (risk 0.2: the gateway
forwards with the memories, Active), one request goes through the gateway and one straight to the
upstream with exactly the messages the gateway forwarded (same seed, same ``--max-tokens``), in
alternating order so drift in the machine's load falls on both. Added latency = gateway − direct, per
question: p50 and p99; the decision's share = the gate's time (``x-mdl-decision-ms``) / the added
latency. Also: an Opt-Out (answered by the gateway alone) per question. Sequential requests: latency,
not throughput. Target (set here, the issue names none): added p50 ≤ 50 ms. Prints a table, then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TARGET_ADDED_P50_MS = 50.0
COUNTRIES = ["France", "Japan", "Brazil", "Kenya", "Canada", "Norway", "Egypt", "Chile", "India", "Spain",
             "Peru", "Ghana", "Italy", "Nepal", "Cuba", "Greece", "Mexico", "Poland", "Sweden", "Turkey"]


def _start(cmd, env, marker: str):
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if marker not in line:
        proc.kill()
        raise SystemExit(f"bench_gateway: {cmd[2:4]} did not start: {line!r}")
    return proc, line.split(" on ")[1].split()[0]


def _pct(x, q) -> float:
    return float(np.percentile(np.asarray(x, float), q))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=40, help="questions (each: gateway + direct + Opt-Out)")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="12 questions")
    args = p.parse_args(argv)
    n = 12 if args.quick else args.n
    if n < 2 or args.max_tokens < 1:
        p.error("--n: expected >= 2; --max-tokens: expected >= 1")
    import httpx

    from mdl_jax.prompts import memory_block

    cache = tempfile.mkdtemp(prefix="mdl-bench-gw-")
    env = {**os.environ, "MDL_JAX_CACHE_DIR": cache}
    up, up_url = _start([sys.executable, "-m", "mdl_jax.serve", "--port", "0"], env, "serving")
    gw = None
    try:
        gw, gw_url = _start([sys.executable, "-m", "mdl_jax", "gateway", "--upstream", up_url, "--port", "0"],
                            env, "MDL gateway on")
        h = httpx.Client(timeout=300, headers={"Authorization": "Bearer sk-bench"})

        def question(i):
            c = COUNTRIES[i % len(COUNTRIES)]
            q = f"What is the capital of {c}? (question {i})"
            mems = [f"Record {i}: the capital of {c} is its largest administrative city.",
                    f"Record {i}: {c} has a capital city where its government sits.",
                    f"Record {i}: travellers to {c} often visit its capital first."]
            return q, mems

        def timed(url, body):
            t = time.perf_counter()
            r = h.post(url + "/chat/completions", json=body)
            dt = time.perf_counter() - t
            r.raise_for_status()
            return dt, r

        for i in range(3):  # warm-up: both paths, first compilations, connections
            q, mems = question(1000 + i)
            timed(gw_url, {"model": "smollm2", "messages": [{"role": "user", "content": q}],
                           "max_tokens": args.max_tokens, "mdl": {"memories": mems, "risk": 0.2}})
            timed(up_url, {"model": "smollm2", "messages": [{"role": "user", "content": q}],
                           "max_tokens": args.max_tokens})
        gw_s, direct_s, decision_s, optout_s, actions = [], [], [], [], []
        for i in range(n):
            q, mems = question(i)
            body = {"model": "smollm2", "messages": [{"role": "user", "content": q}],
                    "max_tokens": args.max_tokens, "seed": i, "temperature": 0.7}
            gbody = {**body, "mdl": {"memories": mems, "risk": 0.2}}
            if i % 2 == 0:
                g, gr = timed(gw_url, gbody)
            # the messages the gateway forwards for an Active decision (checked below)
            fwd = [{"role": "user", "content": memory_block(mems) + q}]
            d, dr = timed(up_url, {**body, "messages": fwd})
            if i % 2 == 1:
                g, gr = timed(gw_url, gbody)
            info = gr.json()["mdl"]
            actions.append(info["action"])
            if info["action"] == "Active":  # same upstream work on both paths
                assert gr.json()["choices"][0]["message"]["content"] == dr.json()["choices"][0]["message"]["content"]
                gw_s.append(g)
                direct_s.append(d)
                decision_s.append(float(gr.headers["x-mdl-decision-ms"]) / 1e3)
            o, _ = timed(gw_url, {**body, "mdl": {"memories": [f"Bananas are yellow ({i})."], "risk": 0.9}})
            optout_s.append(o)
        h.close()
    finally:
        for proc in (gw, up):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    if len(gw_s) < 2:
        raise SystemExit(f"bench_gateway: too few Active decisions to compare ({actions})")
    added = np.asarray(gw_s) - np.asarray(direct_s)
    ms = lambda x: 1e3 * x  # noqa: E731
    res = {
        "questions": n, "compared": len(gw_s), "max_tokens": args.max_tokens,
        "direct_p50_ms": ms(_pct(direct_s, 50)), "direct_p99_ms": ms(_pct(direct_s, 99)),
        "gateway_p50_ms": ms(_pct(gw_s, 50)), "gateway_p99_ms": ms(_pct(gw_s, 99)),
        "added_p50_ms": ms(_pct(added, 50)), "added_p99_ms": ms(_pct(added, 99)),
        "decision_p50_ms": ms(_pct(decision_s, 50)), "decision_p99_ms": ms(_pct(decision_s, 99)),
        "decision_share_of_added_p50": _pct(decision_s, 50) / max(_pct(added, 50), 1e-9),
        "optout_p50_ms": ms(_pct(optout_s, 50)), "optout_p99_ms": ms(_pct(optout_s, 99)),
        "target_added_p50_ms": TARGET_ADDED_P50_MS, "load_avg_1m": os.getloadavg()[0],
        "embeddings": "uncached (fresh cache dir)",
    }
    print(f"{n} questions, {len(gw_s)} Active (compared), max_tokens {args.max_tokens}, sequential; "
          f"1-min load average {res['load_avg_1m']:.1f} (a loaded machine inflates every figure)")
    print(f"{'':26s} {'p50 ms':>9s} {'p99 ms':>9s}")
    for name, key in [("upstream directly", "direct"), ("through the gateway", "gateway"),
                      ("added by the gateway", "added"), ("  of which the decision", "decision"),
                      ("Opt-Out (no upstream)", "optout")]:
        print(f"{name:26s} {res[key + '_p50_ms']:9.1f} {res[key + '_p99_ms']:9.1f}")
    print(f"decision p50 / added p50: {res['decision_share_of_added_p50']:.0%} (both noisy); "
          f"target: added p50 <= {TARGET_ADDED_P50_MS:.0f} ms -> "
          f"{'met' if res['added_p50_ms'] <= TARGET_ADDED_P50_MS else 'NOT met'}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
