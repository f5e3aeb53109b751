"""The field-benchmarks run's wall time: every shared benchmark scored (reader-free) and AdaRAGUE's replay,
into a fresh folder, so every data set's signals are recomputed; the embeddings come from the embedder's
on-disk cache when it holds them (the target: the full run in ≤ 15 min on 2 cores with that cache warm).

    python -m experiments.bench_field [--limit N]

It runs ``mdl-jax benchmarks`` in-process twice: first into one temporary folder (this warms the embedding
cache if it was cold; its time is printed as "first"), then into a second fresh folder ("warm": signals
recomputed from the warm cache, every gate fitted, every table and figure written). The figure to compare
with the target is "warm". Prints the CPU, its flags and the load average beside each time, then one JSON
object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from experiments._machine import cpu_flags, cpu_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench_field", description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="questions per data set (a quick check)")
    a = ap.parse_args(argv)
    if a.limit is not None and a.limit < 1:
        ap.error(f"--limit: expected a positive number of questions, got {a.limit}")
    from mdl_jax.evaluation.run import ALL, run_benchmarks
    from mdl_jax.runtime import synchronous_cpu_dispatch

    synchronous_cpu_dispatch()  # as the command line runs it
    out: dict = {"cpu": cpu_model(), "flags": cpu_flags(("avx2", "avx512f", "avx512_bf16", "amx_bf16")),
                 "limit": a.limit, "data_sets": len(ALL)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("first", "warm"):
            t0 = time.perf_counter()
            run_benchmarks(os.path.join(tmp, name), ALL, limit=a.limit, progress=False, log=lambda s: None)
            out[f"{name}_s"] = round(time.perf_counter() - t0, 1)
            out[f"{name}_load"] = round(os.getloadavg()[0], 1)
            print(f"{name:5s}: {out[f'{name}_s']:8.1f} s  (load {out[f'{name}_load']})", flush=True)
    target = 15 * 60
    met = out["warm_s"] <= target
    print(f"CPU: {out['cpu']} [{' '.join(out['flags'])}]; warm run {out['warm_s']:.0f} s against the target "
          f"{target} s: {'met' if met else 'not met'}")
    out["target_s"], out["met"] = target, met
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
