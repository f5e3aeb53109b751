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

``--baseline DIR`` (another checkout, e.g. ``git worktree add /tmp/base <commit>``) also starts that
checkout's gateway on the same upstream, with its own fresh cache, and sends every question to it too
(the three calls in rotating order): a before/after comparison in one run, under the same load.
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


def _start(cmd, env, marker: str, cwd: Path = ROOT):
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None  # stdout=PIPE
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
    p.add_argument("--baseline", type=Path, default=None,
                   help="another mdl-jax checkout whose gateway is measured beside this one")
    args = p.parse_args(argv)
    n = 12 if args.quick else args.n
    if n < 2 or args.max_tokens < 1:
        p.error("--n: expected >= 2; --max-tokens: expected >= 1")
    if args.baseline is not None and not (args.baseline / "mdl_jax" / "__init__.py").is_file():
        p.error(f"--baseline: expected a checkout of mdl-jax (a folder with mdl_jax/), got {args.baseline}")
    import httpx

    from mdl_jax.prompts import memory_block

    cache = tempfile.mkdtemp(prefix="mdl-bench-gw-")
    env = {**os.environ, "MDL_JAX_CACHE_DIR": cache}
    up, up_url = _start([sys.executable, "-m", "mdl_repro.serve", "--port", "0"], env, "serving")
    gw = base = None
    try:
        gw_cmd = [sys.executable, "-m", "mdl_jax", "gateway", "--upstream", up_url, "--port", "0"]
        gw, gw_url = _start(gw_cmd, env, "MDL gateway on")
        urls = {"gateway": gw_url, "direct": up_url}
        if args.baseline is not None:
            b = args.baseline.resolve()
            benv = {**env, "PYTHONPATH": str(b),
                    "MDL_JAX_CACHE_DIR": tempfile.mkdtemp(prefix="mdl-bench-gw-")}
            base, urls["baseline"] = _start(gw_cmd, benv, "MDL gateway on", cwd=b)
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

        for i in range(3):  # warm-up: every path, first compilations, connections
            q, mems = question(1000 + i)
            for u in (urls["gateway"], urls.get("baseline")):
                if u:
                    timed(u, {"model": "smollm2", "messages": [{"role": "user", "content": q}],
                              "max_tokens": args.max_tokens, "mdl": {"memories": mems, "risk": 0.2}})
            timed(up_url, {"model": "smollm2", "messages": [{"role": "user", "content": q}],
                           "max_tokens": args.max_tokens})
        gw_s, direct_s, decision_s, optout_s, actions = [], [], [], [], []
        base_s, base_decision_s = [], []
        for i in range(n):
            q, mems = question(i)
            body = {"model": "smollm2", "messages": [{"role": "user", "content": q}],
                    "max_tokens": args.max_tokens, "seed": i, "temperature": 0.7}
            gbody = {**body, "mdl": {"memories": mems, "risk": 0.2}}
            # the messages the gateway forwards for an Active decision (checked below)
            fwd = [{"role": "user", "content": memory_block(mems) + q}]
            order = list(urls)[i % len(urls):] + list(urls)[:i % len(urls)]  # drift falls on every path
            got = {k: timed(urls[k], {**body, "messages": fwd} if k == "direct" else gbody) for k in order}
            d, dr = got["direct"]
            g, gr = got["gateway"]
            info = gr.json()["mdl"]
            actions.append(info["action"])
            answer = dr.json()["choices"][0]["message"]["content"]
            if info["action"] == "Active":  # same upstream work on both paths
                assert gr.json()["choices"][0]["message"]["content"] == answer
                gw_s.append(g)
                direct_s.append(d)
                decision_s.append(float(gr.headers["x-mdl-decision-ms"]) / 1e3)
                if "baseline" in got:
                    bt, br = got["baseline"]
                    assert br.json()["mdl"]["action"] == "Active"
                    assert br.json()["choices"][0]["message"]["content"] == answer
                    base_s.append(bt)
                    base_decision_s.append(float(br.headers["x-mdl-decision-ms"]) / 1e3)
            o, _ = timed(gw_url, {**body, "mdl": {"memories": [f"Bananas are yellow ({i})."], "risk": 0.9}})
            optout_s.append(o)
        h.close()
    finally:
        for proc in (gw, base, up):
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
    if base_s:
        added_b = np.asarray(base_s) - np.asarray(direct_s)
        res.update({"baseline": str(args.baseline),
                    "baseline_gateway_p50_ms": ms(_pct(base_s, 50)),
                    "baseline_gateway_p99_ms": ms(_pct(base_s, 99)),
                    "baseline_added_p50_ms": ms(_pct(added_b, 50)),
                    "baseline_added_p99_ms": ms(_pct(added_b, 99)),
                    "baseline_decision_p50_ms": ms(_pct(base_decision_s, 50)),
                    "baseline_decision_p99_ms": ms(_pct(base_decision_s, 99))})
    print(f"{n} questions, {len(gw_s)} Active (compared), max_tokens {args.max_tokens}, sequential; "
          f"1-min load average {res['load_avg_1m']:.1f} (a loaded machine inflates every figure)")
    print(f"{'':26s} {'p50 ms':>9s} {'p99 ms':>9s}")
    for name, key in [("upstream directly", "direct"), ("through the gateway", "gateway"),
                      ("added by the gateway", "added"), ("  of which the decision", "decision"),
                      ("Opt-Out (no upstream)", "optout")]:
        print(f"{name:26s} {res[key + '_p50_ms']:9.1f} {res[key + '_p99_ms']:9.1f}")
    if base_s:
        print(f"baseline checkout {args.baseline}, same run:")
        for name, key in [("through its gateway", "gateway"), ("added by its gateway", "added"),
                          ("  of which the decision", "decision")]:
            k = "baseline_" + key
            print(f"{name:26s} {res[k + '_p50_ms']:9.1f} {res[k + '_p99_ms']:9.1f}")
    print(f"decision p50 / added p50: {res['decision_share_of_added_p50']:.0%} (both noisy); "
          f"target: added p50 <= {TARGET_ADDED_P50_MS:.0f} ms -> "
          f"{'met' if res['added_p50_ms'] <= TARGET_ADDED_P50_MS else 'NOT met'}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
