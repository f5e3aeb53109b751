"""Sweep benchmark: the sweep engine vs the nested-vmap pattern and a per-point Python loop.

    python -m experiments.bench_sweep [--quick]

Workloads (the issue's): a σ sweep of 441 values and the (g_a, g_b) 21 × 21 grid, each × 10 bootstrap
resamples × 3,600 records. The records are the real (M, R, A) signals of the 3,600 pooled B1/B2/B3
records of the committed paper-scale run (uniform random ones if that file is absent); labels are
'safe answer' (1) / 'hallucinated' (0): only speed is measured here.

Decisions are counted as configs × resamples × records (1.6 × 10^7 per workload), the unit of the
issue's targets; the sweep engine evaluates the controller once per (config, record) and scores the
resamples as weighted sums, so it also reports controller evaluations per second.
  - sweep: ``mdl_jax.sweep`` on every engine that runs here beside the default, engine="jax" (the
    pure-JAX program): "native" (the CPU kernel), "pallas" (the fused GPU kernel, on a GPU) and
    "auto", warm in interleaved rounds (median), each as a ratio to the default (an engine earns its
    place at ≥ 2× the default; one that cannot run here is named with its reason), and the native and
    jax engines' first call in a fresh process with its peak RSS;
    the native engine also without folding records that share (M, R, A) (these records hold 400
    distinct triples of 3,600), to show what the kernel alone gains;
  - nested vmap: the README's pattern, ``jax.vmap`` over ``MDLConfig(sigma=s)`` around
    ``decide(..., validate=False)`` on the explicitly resampled records (36,000), then accuracy;
  - Python loop: one ``decide`` call per config (the default engine) on the resampled records, accuracy
    in NumPy; and the same loop on the 3,600 records with the resamples as NumPy weights.
Prints the CPU's model and flags, a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from experiments._machine import cpu_flags, cpu_model
from mdl_jax import MDLConfig, bootstrap_weights, config_grid, decide, sweep
from mdl_jax.controller import api
from mdl_jax.engines import native_sweep

FLAGS_SHOWN = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "amx_tile")
RECORDS = Path(__file__).parent / "results" / "paper-scale-200x3" / "records.jsonl"


def load_signals(n: int = 3600):
    if RECORDS.exists():
        rows = [json.loads(x) for x in RECORDS.read_text().splitlines() if x.strip()]
        rows = [r for r in rows if r["system"] in ("B1", "B2", "B3") and not r["failed"]][:n]
        M, R, A = (np.array([r[c] for r in rows], np.float32) for c in ("M", "R", "A"))
        y = np.array([0 if r["hallucinated"] else 1 for r in rows], np.int32)
        return M, R, A, y, "paper-scale-200x3 records"
    rng = np.random.default_rng(0)
    M, R, A = rng.uniform(size=(3, n)).astype(np.float32)
    return M, R, A, rng.integers(0, 2, n), "uniform random"


def _timed(fn, rounds: int):
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), min(ts)


CHILD = """
import json, sys, time
import numpy as np, jax
from experiments.bench_sweep import load_signals, workload
M, R, A, y, _ = load_signals()
cfgs, w = workload(sys.argv[1], int(sys.argv[2]), len(M))
t = time.perf_counter()
r = jax.block_until_ready(__import__('mdl_jax').sweep(M, R, A, cfgs, adopt=y, weights=w, engine=sys.argv[3]))
dt = time.perf_counter() - t
# VmHWM, not ru_maxrss: the latter survives exec and can report the (large) parent at fork time
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"first_s": dt, "peak_rss_mb": hwm / 1024}))
"""


def workload(name: str, size: int, n: int):
    if name == "sigma":
        cfgs = config_grid(MDLConfig(), sigma=np.linspace(0.05, 0.5, size))
    else:
        side = int(round(size ** 0.5))
        cfgs = config_grid(MDLConfig(), g_a=np.linspace(0, 1, side), g_b=np.linspace(0, 1, side))
    return cfgs, bootstrap_weights(n, 10, seed=0)


def first_call(name: str, size: int, engine: str = "auto") -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, name, str(size), engine], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])



def _nested_accuracy(Mj, Rj, Aj, yj, W: int, N: int):
    """The README's nested-vmap pattern: jitted σ -> (W,) accuracy over the resamples, one σ per row."""

    @jax.jit
    def nested(sigmas):
        def acc(s):
            a = decide(Mj, Rj, Aj, MDLConfig(sigma=s), validate=False).action
            return (((a == 0) == yj).reshape(W, N)).mean(1)
        return jax.vmap(acc)(sigmas)

    return nested


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller grids and fewer rounds (< 30 s)")
    p.add_argument("--rounds", type=int, default=None)
    args = p.parse_args(argv)
    size = 49 if args.quick else 441
    rounds = args.rounds or (3 if args.quick else 5)
    M, R, A, y, source = load_signals()
    N = len(M)
    W = 10
    load_before = __import__("os").getloadavg()
    res = {"records": source, "n_records": N, "resamples": W, "configs": size, "rounds": rounds,
           "devices": jax.device_count(), "jax": jax.__version__, "cpu_model": cpu_model(),
           "cpu_flags": cpu_flags(FLAGS_SHOWN)}
    rows = []
    for name in ("sigma", "gates"):
        cfgs, w = workload(name, size, N)
        K = size
        decisions = K * W * N
        whys = {e: api.engine_module(e).sweep_why_not(cfgs, K) for e in ("native", "pallas")}
        if whys["native"] is not None:
            raise SystemExit(f"bench_sweep: the native engine cannot run here ({whys['native']}): nothing to "
                             "measure beside the default")
        engines = [e for e, why in whys.items() if why is None]
        res.setdefault("engines_unavailable", {}).update({e: why for e, why in whys.items() if why is not None})
        fc = first_call(name, size, "native")
        fc_jax = first_call(name, size, "jax")
        runs: dict[str, Callable[..., Any]] = {e: (lambda e=e, cfgs=cfgs, w=w: sweep(M, R, A, cfgs, adopt=y, weights=w, engine=e))
                for e in ("jax", *engines, "auto")}

        def native_unfolded(cfgs=cfgs, w=w):
            # the native engine without folding records that share (M, R, A) (see native_sweep.DEDUP): what
            # the kernel alone gains; these 3,600 records hold 400 distinct triples
            native_sweep.DEDUP = False
            try:
                return sweep(M, R, A, cfgs, adopt=y, weights=w, engine="native")
            finally:
                native_sweep.DEDUP = True

        runs["native_unfolded"] = native_unfolded
        for fn in runs.values():
            fn()  # compile / build and warm
        per: dict[str, list[float]] = {e: [] for e in runs}
        for _ in range(rounds):  # interleaved: load from other jobs hits both engines alike
            for e, fn in runs.items():
                per[e].append(_timed(fn, 1)[0])
        med, best = statistics.median(per["native"]), min(per["native"])
        med_jax = statistics.median(per["jax"])
        r = {"sweep_warm_s": med, "sweep_best_s": best, "sweep_first_s": fc["first_s"],
             "peak_rss_mb": fc["peak_rss_mb"], "decisions": decisions,
             "sweep_decisions_per_s": decisions / med, "sweep_evaluations_per_s": K * N / med,
             "jax_warm_s": med_jax, "jax_first_s": fc_jax["first_s"], "jax_peak_rss_mb": fc_jax["peak_rss_mb"],
             "native_vs_jax": med_jax / med,
             "native_unfolded_warm_s": statistics.median(per["native_unfolded"]),
             "native_unfolded_vs_jax": med_jax / statistics.median(per["native_unfolded"]),
             "distinct_records": int(len(np.unique(np.stack([M, R, A], 1), axis=0))),
             "native_vs_jax_per_round": [b / a for a, b in zip(per["native"], per["jax"])],
             "engines_speed_vs_default": {e: med_jax / statistics.median(per[e]) for e in (*engines, "auto")}}
        # the per-point Python loop on the resampled records (native decide), and with NumPy weights
        idx = [np.repeat(np.arange(N), w[b].astype(int)) for b in range(W)]
        flat = np.concatenate(idx)
        Mr, Rr, Ar, yr = M[flat], R[flat], A[flat], y[flat]
        sig = np.asarray(cfgs.sigma)
        gates = np.asarray(cfgs.gate_coeffs)

        def cfg_at(k, sig=sig, gates=gates):
            return MDLConfig(sigma=float(sig[k]), gate_coeffs=(float(gates[k, 0]), float(gates[k, 1])))

        def loop_resampled(K=K, Mr=Mr, Rr=Rr, Ar=Ar, yr=yr, cfg_at=cfg_at):
            out = []
            for k in range(K):
                a = np.asarray(decide(Mr, Rr, Ar, cfg_at(k), validate=False).action)
                out.append(((a == 0) == yr).reshape(W, N).mean(1))
            return np.stack(out)

        def loop_weighted(K=K, w=w, cfg_at=cfg_at):
            out = []
            for k in range(K):
                a = np.asarray(decide(M, R, A, cfg_at(k), validate=False).action)
                out.append(w @ ((a == 0) == y) / N)
            return np.stack(out)

        r["loop_resampled_s"], _ = _timed(loop_resampled, max(1, rounds // 2))
        r["loop_weighted_s"], _ = _timed(loop_weighted, max(1, rounds // 2))
        if name == "sigma":
            # The README's nested-vmap pattern on the resampled records (36,000 per σ).
            Mj, Rj, Aj = (jax.numpy.asarray(x) for x in (Mr, Rr, Ar))
            yj = jax.numpy.asarray(yr)

            nested = _nested_accuracy(Mj, Rj, Aj, yj, W, N)
            sj = jax.numpy.asarray(sig)
            t = time.perf_counter()
            jax.block_until_ready(nested(sj))
            r["nested_first_s"] = time.perf_counter() - t
            r["nested_warm_s"], _ = _timed(lambda nested=nested, sj=sj: nested(sj), max(1, rounds // 2))
        res[name] = r
        label = "σ sweep" if name == "sigma" else "(g_a, g_b) grid"
        rows.append((f"{label}: sweep engine='native', warm (median)", f"{med:.3f} s",
                     f"{decisions / med:.2e} /s ({K * N / med:.2e} evaluations/s)"))
        rows.append((f"{label}: sweep engine='jax', warm (median)", f"{med_jax:.3f} s",
                     f"{decisions / med_jax:.2e} /s; native is {r['native_vs_jax']:.1f}× faster "
                     f"(target ≥ 3×: {'met' if r['native_vs_jax'] >= 3 else 'NOT met'}; per round "
                     + ", ".join(f"{x:.1f}" for x in r["native_vs_jax_per_round"]) + ")"))
        for e, ratio in r["engines_speed_vs_default"].items():
            keep = "" if e == "auto" else (f"; keep it (≥ 2× the default)? {'yes' if ratio >= 2 else 'NO'}")
            rows.append((f"{label}: engine={e!r} beside the default 'jax'", f"{statistics.median(per[e]):.3f} s",
                         f"{ratio:.2f}× the default's speed{keep}"))
        for e, why in res.get("engines_unavailable", {}).items():
            rows.append((f"{label}: engine={e!r} beside the default 'jax'", "–", f"not available: {why}"))
        rows.append((f"{label}: engine='native', records not folded", f"{r['native_unfolded_warm_s']:.3f} s",
                     f"{r['native_unfolded_vs_jax']:.1f}× the jax engine ({r['distinct_records']} distinct (M, R, A) "
                     f"of {N}; folded by default)"))
        rows.append((f"{label}: first call (fresh process), native / jax",
                     f"{fc['first_s']:.2f} / {fc_jax['first_s']:.2f} s",
                     f"peak RSS {fc['peak_rss_mb']:.0f} / {fc_jax['peak_rss_mb']:.0f} MB"))
        if "nested_warm_s" in r:
            rows.append((f"{label}: nested vmap (README pattern), warm / first",
                         f"{r['nested_warm_s']:.2f} s / {r['nested_first_s']:.1f} s",
                         f"{decisions / r['nested_warm_s']:.2e} /s; sweep is "
                         f"{r['nested_warm_s'] / med:.0f}× faster"))
        rows.append((f"{label}: Python loop over decide, resampled records", f"{r['loop_resampled_s']:.2f} s",
                     f"{decisions / r['loop_resampled_s']:.2e} /s; sweep is "
                     f"{r['loop_resampled_s'] / med:.1f}× faster"))
        rows.append((f"{label}: Python loop over decide, NumPy weights", f"{r['loop_weighted_s']:.2f} s",
                     f"{decisions / r['loop_weighted_s']:.2e} /s; sweep is "
                     f"{r['loop_weighted_s'] / med:.1f}× faster"))
    import os

    res["load_before"] = load_before
    res["load_after"] = os.getloadavg()
    print(f"sweep benchmark: {size} configs × {W} resamples × {N} records ({source}), "
          f"{jax.device_count()} device(s), {len(os.sched_getaffinity(0))} CPUs, jax {jax.__version__}; "
          f"load average {load_before[0]:.1f} before, {res['load_after'][0]:.1f} after")
    print(f"CPU: {res['cpu_model']}; flags: {' '.join(res['cpu_flags']) or '-'}")
    width = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"{a:<{width}}  {b:>16}  {c}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    # as the command line runs: JAX's CPU work on the calling thread
    from mdl_jax.runtime import synchronous_cpu_dispatch

    synchronous_cpu_dispatch()
    raise SystemExit(main())
