"""How often do the question-bootstrap intervals cover the truth? (docs/api/metrics.md)

Simulated data sets with a known truth, records grouped into questions that correlate:
  mean: a question random effect shared by its five records (intra-question correlation 0.5);
        ``bootstrap_mean_ci(groups=)`` against the record-level interval, at 10 and 30 questions.
  AUROC: the label and part of the score noise shared by a question's four records (as the seeds of one
        question are); ``bootstrap(auroc, groups=)`` against the record-level bootstrap, at 30 and 80.
Each line prints the share of data sets whose 95% interval holds the truth, and the mean width.

    python -m experiments.interval_coverage [--sets 1000] [--n-boot 400] [--seed 11]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from tqdm import tqdm

import mdl_jax.evaluation.metrics as metrics


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def mean_coverage(rng, questions: int, sets: int, n_boot: int, per_question: int = 5, rho: float = 0.5):
    hits = {"question": 0, "record": 0}
    width = {"question": 0.0, "record": 0.0}
    for _ in tqdm(range(sets), desc=f"mean, {questions} questions", leave=False):
        g = np.repeat(np.arange(questions), per_question)
        x = (rng.normal(size=questions) * math.sqrt(rho))[g] + rng.normal(size=g.size) * math.sqrt(1 - rho)
        for kind, groups in (("question", g), ("record", None)):
            lo, hi = metrics.bootstrap_mean_ci(x, n_boot=n_boot, seed=int(rng.integers(2**31)), groups=groups)
            hits[kind] += lo <= 0.0 <= hi
            width[kind] += hi - lo
    return {k: (hits[k] / sets, width[k] / sets) for k in hits}


def auroc_coverage(rng, questions: int, sets: int, n_boot: int, per_question: int = 4, d: float = 1.0):
    truth = _phi(d / math.sqrt(2.0))  # score = d·label + N(0, 0.8²) per question + N(0, 0.6²) per record
    hits = {"question": 0, "record": 0}
    width = {"question": 0.0, "record": 0.0}
    for _ in tqdm(range(sets), desc=f"AUROC, {questions} questions", leave=False):
        g = np.repeat(np.arange(questions), per_question)
        y = (rng.uniform(size=questions) < 0.4)[g]
        s = d * y + 0.8 * rng.normal(size=questions)[g] + 0.6 * rng.normal(size=g.size)
        for kind, groups in (("question", g), ("record", None)):
            e = metrics.bootstrap(metrics.auroc, s, y, groups=groups, n_boot=n_boot, seed=int(rng.integers(2**31)))
            hits[kind] += e.lo <= truth <= e.hi
            width[kind] += e.hi - e.lo
    return {k: (hits[k] / sets, width[k] / sets) for k in hits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=1000, help="simulated data sets per case (AUROC: a third)")
    ap.add_argument("--n-boot", type=int, default=400)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    for q in (10, 30):
        r = mean_coverage(rng, q, a.sets, a.n_boot)
        print(f"mean, {q} questions × 5 records, {a.sets} sets: by question {r['question'][0]:.3f} "
              f"(width {r['question'][1]:.3f}), by record {r['record'][0]:.3f} (width {r['record'][1]:.3f})")
    for q in (30, 80):
        n = max(1, a.sets // 3)
        r = auroc_coverage(rng, q, n, a.n_boot)
        print(f"AUROC, {q} questions × 4 records, {n} sets: by question {r['question'][0]:.3f} "
              f"(width {r['question'][1]:.3f}), by record {r['record'][0]:.3f} (width {r['record'][1]:.3f})")


if __name__ == "__main__":
    main()
