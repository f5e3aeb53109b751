"""Tuning benchmark: 5 folds × 3 seeds on 3,600 records for 500 steps, in one program vs a Python loop.

    python -m experiments.bench_tune [--quick] [--field-sets gates all]

Records: the real (M, R, A) of the 3,600 pooled B1/B2/B3 records of the committed paper-scale run with
their Section 5.3 oracle labels (uniform random signals and labels if that file is absent). Folds:
``oracle.stratified_folds(y, 5, seed=0)``. For each field set, measured in the same process:
  - one program: ``tune_many`` with the 15 runs, first call (compilation included, in a fresh process
    so nothing is cached) and warm;
  - Python loop: ``tune`` called once per run (its program compiled on the first call and reused),
    first pass and warm pass.
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RECORDS = Path(__file__).parent / "results" / "paper-scale-200x3" / "records.jsonl"


def data():
    if RECORDS.exists():
        from mdl_repro.analysis.oracle import load_records, oracle_labels, pooled, stratified_folds

        df = pooled(load_records(RECORDS)[0])
        y = oracle_labels(df)
        M, R, A = (df[c].to_numpy(np.float32) for c in ("M", "R", "A"))
        src = "paper-scale-200x3 records, oracle labels"
        folds = stratified_folds(y, 5, seed=0)
    else:
        from sklearn.model_selection import StratifiedKFold

        rng = np.random.default_rng(0)
        M, R, A = rng.uniform(size=(3, 3600)).astype(np.float32)
        y = rng.integers(0, 2, 3600)
        src = "uniform random"

        folds = list(StratifiedKFold(5, shuffle=True, random_state=0).split(np.zeros((len(y), 1)), y))
    return M, R, A, y, folds, src


def runs(y, folds, seeds=(0, 1, 2)):
    wt, ss = [], []
    for tr, _ in folds:
        for s in seeds:
            w = np.zeros(len(y), np.float32)
            w[tr] = 1
            wt.append(w)
            ss.append(s)
    return np.stack(wt), ss


CHILD = """
import json, sys, time
import numpy as np
from experiments.bench_tune import data, runs
from mdl_jax.controller.tuning import FIELD_SETS, TuneSettings, tune_many
M, R, A, y, folds, _ = data()
wt, seeds = runs(y, folds)
steps = int(sys.argv[2])
t = time.perf_counter()
tune_many(M, R, A, y, train_weights=wt, val_weights=np.zeros_like(wt), field_sets=[FIELD_SETS[sys.argv[1]]] * len(seeds),
          seeds=seeds, settings=TuneSettings(steps=steps))
print(json.dumps({"first_s": time.perf_counter() - t}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 steps instead of 500")
    p.add_argument("--field-sets", nargs="+", default=["gates", "all"])
    args = p.parse_args(argv)
    from mdl_jax import tune
    from mdl_jax.controller.tuning import FIELD_SETS, TuneSettings, tune_many

    steps = 100 if args.quick else 500
    M, R, A, y, folds, src = data()
    wt, seeds = runs(y, folds)
    res = {"records": src, "n_records": len(y), "runs": len(seeds), "steps": steps}
    rows = []
    for fs in args.field_sets:
        child = subprocess.run([sys.executable, "-c", CHILD, fs, str(steps)], capture_output=True,
                               text=True, check=True, cwd=Path(__file__).resolve().parents[1])
        first = json.loads(child.stdout.strip().splitlines()[-1])["first_s"]
        kw = dict(train_weights=wt, val_weights=np.zeros_like(wt), field_sets=[FIELD_SETS[fs]] * len(seeds),
                  seeds=seeds, settings=TuneSettings(steps=steps))
        tune_many(M, R, A, y, **kw)  # compiled in this process too
        t = time.perf_counter()
        tune_many(M, R, A, y, **kw)
        warm = time.perf_counter() - t

        def loop(fs=fs):
            for w, s in zip(wt, seeds):
                tune(M, R, A, y, fields=FIELD_SETS[fs], weights=w, steps=steps, seed=s)
        t = time.perf_counter()
        loop()
        loop_first = time.perf_counter() - t
        t = time.perf_counter()
        loop()
        loop_warm = time.perf_counter() - t
        res[fs] = {"one_program_first_s": first, "one_program_warm_s": warm, "loop_first_s": loop_first,
                   "loop_warm_s": loop_warm, "speedup_first": loop_first / first,
                   "speedup_warm": loop_warm / warm}
        rows.append((f"{fs}: one program, first call (fresh process)", f"{first:.1f} s",
                     f"loop first pass {loop_first:.1f} s → {loop_first / first:.1f}×"))
        rows.append((f"{fs}: one program, warm", f"{warm:.2f} s",
                     f"loop warm pass {loop_warm:.2f} s → {loop_warm / warm:.1f}×"))
    print(f"tuning benchmark: {len(seeds)} runs (5 folds × 3 seeds) × {steps} steps on {len(y)} records ({src})")
    width = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"{a:<{width}}  {b:>9}  {c}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
