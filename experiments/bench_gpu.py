"""Every GPU check of the controller in one call (the device budget is 15 minutes a session).

    python -m experiments.bench_gpu [--n 100000000] [--parity-n 1000000] [--reps 5]
    python -m experiments.bench_gpu --allow-cpu --n 100000 --parity-n 10000   # smoke test, no GPU

(1) Parity: the same records decided on the CPU (``decide``: the native kernel; and the pure-JAX
    path) and on the GPU (pure JAX, every product at HIGHEST precision). Target: CPU and GPU agree to
    1e-5 on every float field. The same graph with DEFAULT precision (TF32 matmuls on recent NVIDIA
    GPUs) is measured beside it, to show what HIGHEST buys.
(2) Throughput on the GPU at N = 10^8: ``decide`` (validated: the checks run on the device, and
    unvalidated) next to the plain ``jit(vmap(decide_one))`` form in the same run. Target ≥ 10^10/s.
(3) The sweep engine (σ sweep, 441 configs × 10 resamples × 3,600 records) and tuning (15 runs ×
    500 steps on 3,600 records, gates and every field, in one program), first call and warm.
Prints a table, then one JSON object as the last line. Exit status 2 when no GPU is present (unless
``--allow-cpu``, which runs the same code on the CPU so the script can be tested anywhere).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax import MDLConfig, decide, decide_one
from mdl_jax.controller import api
from mdl_jax.controller import native
from mdl_jax.controller import decision as _decision

FLOATS = ("C", "alpha", "C_final", "v_meta", "energies", "norm", "g_A")


def _accelerator(allow_cpu: bool):
    for kind in ("gpu", "cuda", "rocm"):
        try:
            return jax.devices(kind)[0]
        except RuntimeError:
            continue
    return jax.devices("cpu")[0] if allow_cpu else None


def _max_diffs(a, b) -> dict:
    out = {f: float(np.max(np.abs(np.asarray(getattr(a, f), np.float64)
                                  - np.asarray(getattr(b, f), np.float64)))) for f in FLOATS}
    out["action_mismatches"] = int(np.sum(np.asarray(a.action) != np.asarray(b.action)))
    return out


def _with_precision(precision):
    """A fresh jitted pure-JAX decide whose products use ``precision`` (decision._HI at trace time)."""
    def f(M, R, A, cfg):
        saved = _decision._HI
        _decision._HI = precision
        try:
            return api._decide_shaped(M, R, A, cfg)
        finally:
            _decision._HI = saved
    return jax.jit(f)


def _rate(fn, n: int, reps: int) -> float:
    jax.block_until_ready(fn())
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return n / statistics.median(ts)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000_000, help="records for the throughput check")
    p.add_argument("--parity-n", type=int, default=1_000_000, help="records for the parity check")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--allow-cpu", action="store_true", help="run on the CPU when no GPU is present")
    p.add_argument("--sweep-configs", type=int, default=441, help="σ values of the sweep check")
    p.add_argument("--tune-steps", type=int, default=500, help="steps of the tuning check")
    args = p.parse_args(argv)
    dev = _accelerator(args.allow_cpu)
    if dev is None:
        print("bench_gpu: no GPU visible to JAX (jax.devices() = "
              f"{jax.devices()}); install mdl-jax[cuda] on a GPU machine", file=sys.stderr)
        sys.exit(2)
    cfg = MDLConfig()
    res: dict = {"device": str(dev), "device_kind": getattr(dev, "device_kind", ""), "jax": jax.__version__}

    # (1) parity, CPU vs device
    x = np.random.default_rng(0).uniform(size=(3, args.parity_n)).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    xc = [jax.device_put(v, cpu) for v in x]
    cpu_pure = api._decide_jit(*xc, cfg)
    # The native kernel, placed on the CPU explicitly: on a GPU machine decide() itself runs on the GPU.
    cpu_native = cpu_pure
    if native.load():
        cpu_native = api._native_jit(*xc, jax.device_put(native.pack(cfg), cpu), flags=native.flags(cfg),
                                     dims=cfg.dims)
    res["native_kernel"] = native.status()
    xd = [jax.device_put(v, dev) for v in x]
    dev_hi = api._decide_jit(*xd, cfg)
    dev_default = _with_precision(jax.lax.Precision.DEFAULT)(*xd, cfg)
    res["parity"] = {
        "cpu_native_vs_device_highest": _max_diffs(cpu_native, dev_hi),
        "cpu_pure_jax_vs_device_highest": _max_diffs(cpu_pure, dev_hi),
        "cpu_pure_jax_vs_device_default_precision": _max_diffs(cpu_pure, dev_default),
    }
    worst = max(v for k, v in res["parity"]["cpu_pure_jax_vs_device_highest"].items() if k in FLOATS)
    res["parity_max_abs_diff"] = worst
    res["parity_target"] = 1e-5
    del cpu_native, cpu_pure, dev_hi, dev_default

    # (2) throughput at N on the device; inputs generated there
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    with jax.default_device(dev):
        M, R, A = (jax.random.uniform(k, (args.n,), jnp.float32) for k in (k1, k2, k3))
    plain = jax.jit(jax.vmap(decide_one, in_axes=(0, 0, 0, None)))
    res["throughput"] = {
        "decide_unvalidated": _rate(lambda: decide(M, R, A, cfg, validate=False), args.n, args.reps),
        "decide": _rate(lambda: decide(M, R, A, cfg), args.n, args.reps),
        "plain_vmap": _rate(lambda: plain(M, R, A, cfg), args.n, args.reps),
    }
    res["throughput"]["ratio_vs_plain_vmap"] = res["throughput"]["decide"] / res["throughput"]["plain_vmap"]
    res["n"] = args.n
    res["targets"] = {"parity_abs": 1e-5, "decisions_per_s": 1e10}
    M = R = A = None  # free the N-record device arrays before the next checks

    # (3) sweep and tuning on the device (random records: only speed is measured)
    from mdl_jax import bootstrap_weights, config_grid, sweep
    from mdl_jax.controller.tuning import FIELD_SETS, tune_many

    rng = np.random.default_rng(1)
    Ms, Rs, As = rng.uniform(size=(3, 3600)).astype(np.float32)
    ys = rng.integers(0, 2, 3600)
    K = args.sweep_configs
    grid = config_grid(cfg, sigma=np.linspace(0.05, 0.5, K))
    w = bootstrap_weights(3600, 10, 0)
    with jax.default_device(dev):
        t = time.perf_counter()
        jax.block_until_ready(sweep(Ms, Rs, As, grid, adopt=ys, weights=w))
        first = time.perf_counter() - t
        warm = _rate(lambda: sweep(Ms, Rs, As, grid, adopt=ys, weights=w).counts, K * 10 * 3600, args.reps)
        res["sweep_sigma"] = {"first_s": first, "decisions_per_s": warm}
        wt = np.stack([(np.arange(3600) % 5 != f).astype(np.float32) for f in range(5)] * 3)
        for fs in ("gates", "all"):
            kw = dict(train_weights=wt, val_weights=np.zeros_like(wt), field_sets=[FIELD_SETS[fs]] * 15,
                      seeds=[0] * 5 + [1] * 5 + [2] * 5, steps=args.tune_steps)
            t = time.perf_counter()
            tune_many(Ms, Rs, As, ys, **kw)
            first = time.perf_counter() - t
            t = time.perf_counter()
            tune_many(Ms, Rs, As, ys, **kw)
            res[f"tune_{fs}"] = {"first_s": first, "warm_s": time.perf_counter() - t}

    print(f"MDL controller GPU checks on {res['device']} ({res['device_kind']}), jax {res['jax']}")
    for k, v in res["parity"].items():
        print(f"parity {k:42s} max |Δ| {max(v[f] for f in FLOATS):.2e}  actions differing "
              f"{v['action_mismatches']}")
    for k, v in res["throughput"].items():
        print(f"throughput N={args.n:,} {k:24s} {v:.3e}" + ("" if k.startswith("ratio") else " /s"))
    print(f"sweep σ ({K} × 10 × 3,600): first {res['sweep_sigma']['first_s']:.2f} s, "
          f"{res['sweep_sigma']['decisions_per_s']:.3e} decisions/s warm")
    for fs in ("gates", "all"):
        print(f"tune 15 runs × {args.tune_steps} steps ({fs}): first {res[f'tune_{fs}']['first_s']:.1f} s, "
              f"warm {res[f'tune_{fs}']['warm_s']:.2f} s")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
