"""Ranking metrics: how well a gate's score orders the positive records above the negative ones.

AUROC and AUPRC judge a score without a threshold, so any gate's column (MDL's, a baseline's, a user's)
is compared on the same footing; ``auroc_weighted`` is AUROC under record multiplicities, which the
analyses' question bootstraps pass as weights. Definitions, P positives and Q negatives among N records:

  AUROC   P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) over positive/negative pairs: (R⁺ − P(P + 1)/2) / (P Q), R⁺ the
          sum of the positives' ranks, tied scores sharing their average rank (Mann–Whitney); NaN when
          P = 0 or Q = 0
  AUPRC   average precision Σ_k (r_k − r_{k−1}) p_k over the distinct scores taken as thresholds,
          highest first (r recall, p precision at "score ≥ threshold"); tied scores enter at one
          threshold (scikit-learn's ``average_precision_score``); NaN when P = 0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mdl_jax.evaluation.metrics.columns import NAN, Kernel, binary, column, numeric, score_column


def auroc_weighted(score, pos, weights) -> np.ndarray:
    """AUROCs of ``score`` for the binary ``pos`` under record multiplicities (a question bootstrap).

    Records with a non-finite score are left out (the analyses' lenient form; ``auroc`` refuses them).

    Args:
      score: (N,) scores, higher = positive.
      pos: (N,) binary labels.
      weights: (T, N) or (N,) non-negative multiplicities of the records, one row per resample.

    Returns:
      (T,) float64: P(positive's score > negative's) + ½ P(equal) under each row's weights; NaN where a
      row weighs no positive or no negative.

    Raises:
      ValueError: ``score`` not a 1-D column of numbers, ``pos`` not binary or of another length,
        ``weights`` not (T, N) or (N,), negative or not finite, naming the argument.
    """
    s = numeric(column(score, "score"), "score")
    p = binary(pos, "pos", len(s))
    w = np.asarray(weights)
    if w.ndim not in (1, 2) or w.shape[-1] != len(s):
        raise ValueError(f"weights: expected (T, {len(s)}) or ({len(s)},) multiplicities (one row per "
                         f"resample, one value per record), got shape {w.shape}")
    w = np.atleast_2d(numeric(w.ravel(), "weights").reshape(w.shape))
    if not (np.isfinite(w).all() and (w >= 0).all()):
        raise ValueError("weights: expected non-negative finite multiplicities")
    ok = np.isfinite(s)
    s, p = s[ok], p[ok]
    w = w[:, ok]
    u, inv = np.unique(s, return_inverse=True)
    K = len(u)
    T = w.shape[0]
    wp = np.zeros((T, K))
    wn = np.zeros((T, K))
    for t in range(T):
        wp[t] = np.bincount(inv, weights=w[t] * p, minlength=K)
        wn[t] = np.bincount(inv, weights=w[t] * ~p, minlength=K)
    below = np.cumsum(wn, 1) - wn  # negatives strictly below each score value
    num = np.sum(wp * (below + 0.5 * wn), 1)
    den = wp.sum(1) * wn.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(den > 0, num / den, np.nan)
    return r


def auroc_of(s: np.ndarray, y: np.ndarray) -> float:
    """AUROC of checked columns: (N,) float64 scores, (N,) bool labels."""
    n = len(s)
    n_pos = int(np.count_nonzero(y))
    if n_pos == 0 or n_pos == n:
        return NAN
    ss = np.sort(s)
    sp = s[y]
    # a positive's 1-based rank, ties at their average: (#below + #at-or-below + 1) / 2
    r = np.searchsorted(ss, sp, "left") + np.searchsorted(ss, sp, "right")
    return float(((r.sum() + n_pos) / 2 - n_pos * (n_pos + 1) / 2) / (n_pos * (n - n_pos)))


def auprc_of(s: np.ndarray, y: np.ndarray) -> float:
    """Average precision of checked columns: (N,) float64 scores, (N,) bool labels."""
    n_pos = int(y.sum())
    if n_pos == 0:
        return NAN
    order = np.argsort(-s, kind="stable")
    ss, yy = s[order], y[order]
    last = np.r_[np.flatnonzero(ss[1:] != ss[:-1]), len(ss) - 1]  # the last record of each tie block
    tps = np.cumsum(yy)[last].astype(np.float64)
    precision = tps / (last + 1.0)
    recall = tps / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def auroc(score, label, *, higher_is: str = "positive") -> float:
    """AUROC of a score against a binary label (module docstring: ties at their average rank).

    Args:
      score: (N,) finite scores; higher means the positive class unless ``higher_is="negative"``.
      label: (N,) bool or 0/1; 1 = the positive class ("do not adopt", "should abstain").
      higher_is: "positive" or "negative": which class a higher score means.

    Returns:
      P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) in [0, 1]; NaN when every label is equal (or N = 0), where it is undefined.

    Raises:
      ValueError: a column that is not 1-D, lengths that differ, a label that is not binary, a NaN or
        infinite score, or an unknown ``higher_is``, naming the argument.
    """
    return auroc_of(*_prep(score, label, higher_is))


def auprc(score, label, *, higher_is: str = "positive") -> float:
    """Area under the precision–recall curve as average precision (module docstring).

    Args:
      score: (N,) finite scores; higher means the positive class unless ``higher_is="negative"``.
      label: (N,) bool or 0/1; 1 = the positive class.
      higher_is: "positive" or "negative".

    Returns:
      Σ_k (r_k − r_{k−1}) p_k in [0, 1], equal to scikit-learn's ``average_precision_score``; NaN when no
      label is 1 (recall is undefined); 1.0 when every label is 1.

    Raises:
      ValueError: as ``auroc``.
    """
    return auprc_of(*_prep(score, label, higher_is))


def _prep(score, label, higher_is: str = "positive") -> tuple[np.ndarray, np.ndarray]:
    s = score_column(score, "score", higher_is=higher_is)
    return s, binary(label, "label", len(s))


KERNELS: dict[Callable[..., Any], Kernel] = {
    auroc: Kernel(auroc_of, _prep),
    auprc: Kernel(auprc_of, _prep),
}
"""This module's metrics and their kernels (``columns.Kernel``), for the bootstrap."""
