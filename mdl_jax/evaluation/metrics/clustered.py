"""Question-clustered uncertainty for the analyses of records: standard errors, bootstrap intervals of
means and paired differences, and the bootstrap's record weights.

The analyses of records (the reproduction's ``mdl_repro.analysis``) compare systems record by
record and need the same question-level resampling the metrics' intervals use, in the forms they
consume: a clustered SE, a 95% interval of a mean or of a paired difference, and the multiplicities a
weighted sweep scores exactly. They are NumPy only and take columns of numbers as they come (a NaN
value gives a NaN result), the lenient form those callers rely on; the resample count, the columns'
shapes, lengths and values that are no numbers, a missing or unorderable question id and an empty set
of questions are checked, each a ValueError naming the argument (the ids as ``bootstrap`` checks them).
"""

from __future__ import annotations

import numpy as np

from mdl_jax.evaluation.metrics.columns import column, numeric
from mdl_jax.evaluation.metrics.intervals import N_BOOT, check_boot, check_count, check_seed, group_index


def cluster_se(d, groups) -> float:
    """SE of mean(d) over records clustered by question: the linearised (ratio-estimator) variance.

    Args:
      d: (N,) per-record values (a paired difference).
      groups: (N,) question ids.

    Returns:
      sqrt(Σ_g (s_g − d̄ n_g)² / N² · G / (G − 1)), s_g the question's sum, n_g its records; with equal
      records per question, sd(question means) / √G. NaN for fewer than 2 questions.

    Raises:
      ValueError: ``d`` not a 1-D column of numbers; ``groups`` of another length, or holding a missing
        or unorderable id.
    """
    d = numeric(column(d, "d"), "d")
    g = group_index(groups, len(d))
    G, N = (int(g.max()) + 1 if len(g) else 0), len(d)
    if G < 2:
        return float("nan")
    s = np.bincount(g, weights=d, minlength=G)
    n = np.bincount(g, minlength=G).astype(np.float64)
    m = s.sum() / N
    return float(np.sqrt(np.sum((s - m * n) ** 2) / N ** 2 * G / (G - 1)))


def cluster_bootstrap_diff(a, b, groups, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    """95% percentile CI of mean(a) − mean(b) over paired records, resampling whole questions.

    Args:
      a: (N,) per-record values of one system.
      b: (N,) the other system's on the same records.
      groups: (N,) question ids.
      n_boot: resamples.
      seed: their seed.

    Returns:
      (lo, hi); NaN for fewer than 2 questions.

    Raises:
      ValueError: a column not 1-D, of another length than ``a`` or of values that are no numbers, a
        missing or unorderable question id, a bad ``n_boot`` or ``seed``.
    """
    check_boot(n_boot, 0.95)
    check_seed(seed)
    a = numeric(column(a, "a"), "a")
    b = numeric(column(b, "b", len(a)), "b")
    g = group_index(groups, len(a))
    G = int(g.max()) + 1 if len(g) else 0
    if G < 2:
        return float("nan"), float("nan")
    sum_d = np.bincount(g, weights=a - b, minlength=G)
    cnt = np.bincount(g, minlength=G).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, G, size=(n_boot, G))
    # multiplicity of each group per resample, then ratio of sums: one matmul, no Python loop
    # (bincount over resample × group cells gives the same counts as np.add.at)
    cell = (np.arange(n_boot)[:, None] * G + draws).ravel()
    mult = np.bincount(cell, minlength=n_boot * G).reshape(n_boot, G).astype(float)
    est = (mult @ sum_d) / (mult @ cnt)
    lo, hi = np.percentile(est, [2.5, 97.5])
    return float(lo), float(hi)


def question_bootstrap_weights(groups, n_resamples: int, seed: int = 0) -> np.ndarray:
    """Record multiplicities of a bootstrap over questions.

    Each resample draws G questions with replacement from the G in ``groups``, and every record of a
    drawn question gets that question's multiplicity, so a question's records always travel together
    (``sweep(..., weights=...)`` scores them exactly).

    Args:
      groups: (N,) question ids.
      n_resamples: resamples.
      seed: their seed.

    Returns:
      (n_resamples, N) float32 multiplicities.

    Raises:
      ValueError: ``groups`` empty or not 1-D, holding a missing or unorderable id, a bad
        ``n_resamples`` or ``seed``.
    """
    check_count(n_resamples, "n_resamples")
    check_seed(seed)
    g = group_index(groups)
    G = int(g.max()) + 1 if len(g) else 0
    if G == 0:
        raise ValueError("groups: expected at least one question id")
    rng = np.random.default_rng(seed)
    mult = rng.multinomial(G, np.full(G, 1.0 / G), size=n_resamples)
    return mult[:, g].astype(np.float32)


def bootstrap_mean_ci(x, n_boot: int = N_BOOT, seed: int = 0, groups=None) -> tuple[float, float]:
    """95% percentile CI of mean(x).

    Args:
      x: (N,) per-record values.
      n_boot: resamples.
      seed: their seed.
      groups: (N,) question ids: whole questions are resampled (use it whenever records share a
        question); None: records are resampled with replacement.

    Returns:
      (lo, hi); NaN with fewer than 2 records (or questions).

    Raises:
      ValueError: ``x`` (or ``groups``) not 1-D or of unequal lengths, ``x`` of values that are no
        numbers, a missing or unorderable question id, a bad ``n_boot`` or ``seed``.
    """
    check_boot(n_boot, 0.95)
    check_seed(seed)
    x = numeric(column(x, "x"), "x")
    if groups is not None:
        return cluster_bootstrap_diff(x, np.zeros_like(x), groups, n_boot, seed)
    if len(x) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    est = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    lo, hi = np.percentile(est, [2.5, 97.5])
    return float(lo), float(hi)
