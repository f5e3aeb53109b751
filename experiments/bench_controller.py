"""Controller benchmark: the paper-style NumPy path vs jitted ``decide``, single record and batched.

    python -m experiments.bench_controller [--quick] [--sizes 3600 1000000 10000000]

All measured in one run on the same inputs: (a) the NumPy per-decision reference (tests/reference.py;
the paper reports 40.1 µs per decision), (b) one call of ``decide`` on a single record, next to the
pure-JAX single-record path and a plain ``jit(decide_one)``, (c) batched throughput of ``decide`` at
several N, next to the pure-JAX chunked path (what ``decide`` runs without the native kernel) and the
plain ``jit(vmap(decide_one))`` form. Throughputs are measured in interleaved rounds (the dev VM is
noisy, ±10-30% from minute to minute) and the median round is reported, the best in the JSON.
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax import MDLConfig, decide, decide_one
from mdl_jax.controller import api
from mdl_jax.controller import native
from tests.reference import NumpyMDL


def _median_us(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def _throughputs(fns: dict, n: int, rounds: int, min_time: float) -> dict:
    """decisions/s of each fn: interleaved rounds of >= min_time each; (median, best) per fn."""
    for fn in fns.values():
        jax.block_until_ready(fn())  # compile + warm
    per = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            reps, t0 = 0, time.perf_counter()
            while True:
                jax.block_until_ready(fn())
                reps += 1
                if time.perf_counter() - t0 >= min_time and reps >= 2:
                    break
            per[k].append(n * reps / (time.perf_counter() - t0))
    return {k: (statistics.median(v), max(v)) for k, v in per.items()}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (< 30 s)")
    p.add_argument("--sizes", type=int, nargs="*", default=None)
    args = p.parse_args(argv)
    sizes = args.sizes or ([3600, 1_000_000] if args.quick else [3600, 1_000_000, 10_000_000])
    min_time, rounds = (0.3, 3) if args.quick else (1.0, 5)
    cfg = MDLConfig()
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(3, 3600)).astype(np.float32)
    t = time.perf_counter()
    native_ok = api._native_ok(cfg)
    res: dict = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                 "cpus": os.cpu_count(), "backend": jax.default_backend(), "jax": jax.__version__,
                 "native_kernel": native_ok, "native_load_s": time.perf_counter() - t,
                 "native_status": native.status()}

    # (a) paper-style NumPy, one decision per call
    ref = NumpyMDL(cfg)
    recs = [tuple(float(v) for v in x[:, i]) for i in range(x.shape[1])]
    n_np = 600 if args.quick else 3600
    ts = []
    for m, r, a in recs[:n_np]:
        t = time.perf_counter()
        ref.decide(m, r, a)
        ts.append(time.perf_counter() - t)
    res["numpy_per_decision_us_median"] = statistics.median(ts) * 1e6
    res["numpy_per_decision_us_mean"] = statistics.fmean(ts) * 1e6

    # (b) one decide on a single record (validation + dispatch included), and the references
    m, r, a = recs[0]
    jax.block_until_ready(decide(m, r, a))
    reps = 2000 if args.quick else 10000
    single = {
        "decide": lambda: jax.block_until_ready(decide(m, r, a)),
        "pure_jax_scalar": lambda: jax.block_until_ready(api._decide_default_scalar(m, r, a)),
    }
    plain_one = jax.jit(decide_one)
    args1 = tuple(jnp.float32(v) for v in (m, r, a))
    single["plain_jit"] = lambda: jax.block_until_ready(plain_one(*args1, cfg))
    # a non-default concrete config (the README's decide(M, R, A, cal.config) workflow): the shipped
    # calibrated config, as an MDLConfig and as a file path; and the general path it took before the
    # one-record fast path covered concrete configs (NumPy scalars in still take it)
    from mdl_jax import load_config
    from mdl_jax.pipeline.experiment import SHIPPED

    cal_path = SHIPPED / "smollm2-truthfulqa.json"
    cal = load_config(cal_path)
    nm, nr, na = (np.float64(v) for v in (m, r, a))
    single["decide_calibrated"] = lambda: jax.block_until_ready(decide(m, r, a, cal))
    single["decide_config_file"] = lambda: jax.block_until_ready(decide(m, r, a, cal_path))
    single["decide_calibrated_general"] = lambda: jax.block_until_ready(decide(nm, nr, na, cal))
    trivial = jax.jit(lambda v: v)
    one = jnp.float32(0.5)
    single["trivial_jit"] = lambda: jax.block_until_ready(trivial(one))
    for fn in single.values():
        fn()
    # interleaved: three passes, median of the per-pass medians
    passes = {k: [] for k in single}
    for _ in range(3):
        for k, fn in single.items():
            passes[k].append(_median_us(fn, reps // 3))
    res["single_call_us_median"] = statistics.median(passes["decide"])
    res["pure_jax_single_us_median"] = statistics.median(passes["pure_jax_scalar"])
    res["plain_jit_single_us_median"] = statistics.median(passes["plain_jit"])
    res["trivial_jit_dispatch_us_median"] = statistics.median(passes["trivial_jit"])
    for k in ("decide_calibrated", "decide_config_file", "decide_calibrated_general"):
        res[k + "_us_median"] = statistics.median(passes[k])
        res[k + "_ratio_vs_default"] = res[k + "_us_median"] / res["single_call_us_median"]

    # (c) batched throughput
    plain = jax.jit(jax.vmap(decide_one, in_axes=(0, 0, 0, None)))
    res["batched"] = {}
    for n in sizes:
        xs = [jnp.asarray(rng.uniform(size=n).astype(np.float32)) for _ in range(3)]
        got = _throughputs({
            "decide": lambda: decide(*xs, cfg),
            "decide_unvalidated": lambda: decide(*xs, cfg, validate=False),
            "pure_jax_chunked": lambda: api._decide_jit(*xs, cfg),
            "plain_vmap": lambda: plain(*xs, cfg),
        }, n, rounds, min_time)
        row = {k: v[0] for k, v in got.items()}
        row["best"] = {k: v[1] for k, v in got.items()}
        row["ratio_vs_pure_jax"] = row["decide"] / row["pure_jax_chunked"]
        row["ratio_vs_plain_vmap"] = row["decide"] / row["plain_vmap"]
        row["ratio_vs_numpy"] = row["decide"] * res["numpy_per_decision_us_mean"] * 1e-6
        res["batched"][str(n)] = row

    res["ratio_single_vs_numpy"] = res["numpy_per_decision_us_median"] / res["single_call_us_median"]
    res["ratio_single_vs_pure_jax"] = res["pure_jax_single_us_median"] / res["single_call_us_median"]
    res["ratio_single_vs_plain_jit"] = res["plain_jit_single_us_median"] / res["single_call_us_median"]
    res["targets"] = {"batched_per_s": 3e7, "single_call_us": 20.0}

    print(f"MDL controller benchmark ({res['machine']}, {res['cpus']} CPUs, backend {res['backend']},"
          f" jax {res['jax']}; native kernel: {'on' if native_ok else 'OFF'})")
    print(f"{'path':46s} {'value':>14s}")
    print(f"{'NumPy per decision (median / mean)':46s} {res['numpy_per_decision_us_median']:8.1f} / "
          f"{res['numpy_per_decision_us_mean']:.1f} µs")
    print(f"{'decide, one record (median)':46s} {res['single_call_us_median']:11.1f} µs")
    for k, label in (("decide_calibrated", "decide, one record, calibrated config"),
                     ("decide_config_file", "decide, one record, config file path"),
                     ("decide_calibrated_general", "  the same config, general path (before)")):
        print(f"{label:46s} {res[k + '_us_median']:11.1f} µs  ({res[k + '_ratio_vs_default']:.2f}× default)")
    print(f"{'pure-JAX single-record path (median)':46s} {res['pure_jax_single_us_median']:11.1f} µs")
    print(f"{'plain jit(decide_one), one record (median)':46s} {res['plain_jit_single_us_median']:11.1f} µs")
    print(f"{'trivial jitted call (dispatch floor)':46s} {res['trivial_jit_dispatch_us_median']:11.1f} µs")
    for n, row in res["batched"].items():
        print(f"{'decide, N=' + n:46s} {row['decide']:11.3e} /s  (unvalidated {row['decide_unvalidated']:.2e};"
              f" pure JAX {row['pure_jax_chunked']:.2e} = {row['ratio_vs_pure_jax']:.1f}×; plain vmap "
              f"{row['plain_vmap']:.2e} = {row['ratio_vs_plain_vmap']:.1f}×; {row['ratio_vs_numpy']:.0f}× NumPy)")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
