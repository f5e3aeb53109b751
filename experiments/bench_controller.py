"""Controller benchmark: the paper-style NumPy path vs jitted ``decide``, single record and batched.

    python -m experiments.bench_controller [--quick] [--sizes 3600 1000000 10000000]

All measured in one run on the same inputs: (a) the NumPy per-decision reference (tests/reference.py;
the paper reports 40.1 µs per decision), (b) one call of the jitted ``decide`` on a single record,
(c) batched throughput of ``decide`` at several N, next to the plain ``jit(vmap(decide_one))`` form.
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax import MDLConfig, decide, decide_one
from tests.reference import NumpyMDL


def _median_us(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def _throughput(fn, n: int, min_time: float) -> float:
    jax.block_until_ready(fn())  # compile + warm
    reps, t0 = 0, time.perf_counter()
    while True:
        jax.block_until_ready(fn())
        reps += 1
        if time.perf_counter() - t0 >= min_time and reps >= 2:
            break
    return n * reps / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (< 30 s)")
    p.add_argument("--sizes", type=int, nargs="*", default=None)
    args = p.parse_args(argv)
    sizes = args.sizes or ([3600, 1_000_000] if args.quick else [3600, 1_000_000, 10_000_000])
    min_time = 0.5 if args.quick else 2.0
    cfg = MDLConfig()
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(3, 3600)).astype(np.float32)
    res: dict = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                 "cpus": jax.local_device_count() and __import__("os").cpu_count(),
                 "backend": jax.default_backend(), "jax": jax.__version__}

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

    # (b) one jitted decide on a single record (dispatch + validation included)
    m, r, a = recs[0]
    jax.block_until_ready(decide(m, r, a))
    reps = 2000 if args.quick else 10000
    res["single_call_us_median"] = _median_us(lambda: jax.block_until_ready(decide(m, r, a)), reps)
    plain_one = jax.jit(decide_one)
    args1 = tuple(jnp.float32(v) for v in (m, r, a))
    jax.block_until_ready(plain_one(*args1, cfg))
    res["plain_jit_single_us_median"] = _median_us(
        lambda: jax.block_until_ready(plain_one(*args1, cfg)), reps)
    trivial = jax.jit(lambda v: v)
    one = jnp.float32(0.5)
    jax.block_until_ready(trivial(one))
    res["trivial_jit_dispatch_us_median"] = _median_us(lambda: jax.block_until_ready(trivial(one)), reps)

    # (c) batched throughput
    plain = jax.jit(jax.vmap(decide_one, in_axes=(0, 0, 0, None)))
    res["batched"] = {}
    for n in sizes:
        xs = [jnp.asarray(rng.uniform(size=n).astype(np.float32)) for _ in range(3)]
        row = {
            "decide": _throughput(lambda: decide(*xs, cfg), n, min_time),
            "decide_unvalidated": _throughput(lambda: decide(*xs, cfg, validate=False), n, min_time),
            "plain_vmap": _throughput(lambda: plain(*xs, cfg), n, min_time),
        }
        row["ratio_vs_plain_vmap"] = row["decide"] / row["plain_vmap"]
        row["ratio_vs_numpy"] = row["decide"] * res["numpy_per_decision_us_mean"] * 1e-6
        res["batched"][str(n)] = row

    res["ratio_single_vs_numpy"] = res["numpy_per_decision_us_median"] / res["single_call_us_median"]
    res["ratio_single_vs_plain_jit"] = res["plain_jit_single_us_median"] / res["single_call_us_median"]
    res["targets"] = {"batched_per_s": 3e7, "single_call_us": 20.0}

    print(f"MDL controller benchmark ({res['machine']}, {res['cpus']} CPUs, backend {res['backend']},"
          f" jax {res['jax']})")
    print(f"{'path':44s} {'value':>14s}")
    print(f"{'NumPy per decision (median / mean)':44s} {res['numpy_per_decision_us_median']:8.1f} / "
          f"{res['numpy_per_decision_us_mean']:.1f} µs")
    print(f"{'decide, one record (median)':44s} {res['single_call_us_median']:11.1f} µs")
    print(f"{'plain jit(decide_one), one record (median)':44s} {res['plain_jit_single_us_median']:11.1f} µs")
    print(f"{'trivial jitted call (dispatch floor)':44s} {res['trivial_jit_dispatch_us_median']:11.1f} µs")
    for n, row in res["batched"].items():
        print(f"{'decide, N=' + n:44s} {row['decide']:11.3e} /s  ({row['ratio_vs_plain_vmap']:.1f}× plain"
              f" vmap {row['plain_vmap']:.2e}/s; unvalidated {row['decide_unvalidated']:.2e}/s; "
              f"{row['ratio_vs_numpy']:.0f}× NumPy)")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
