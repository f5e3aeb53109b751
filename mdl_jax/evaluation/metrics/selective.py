"""Selective answering: what a system that may decline gets right on what it answers.

A gate that abstains trades coverage for accuracy; these metrics measure both sides and the whole
trade-off, from ``correct`` (1 where the answer given, or that would have been given, is right) and
``abstained`` (1 where no answer was given), or from a score that ranks the records by how inclined the
gate is to abstain:

  coverage             1 − mean(abstained)
  selective accuracy   mean(correct | answered); selective risk = 1 − selective accuracy
  risk–coverage        answer the k records with the lowest score (the most confident) and abstain on
                       the rest: risk(k) = errors among them / k for k = 1..N, tied scores sharing their
                       errors evenly; AURC = mean_k risk(k)

``rates`` and ``risk_coverage`` are the record-level forms the analyses of records use (a hallucination
column, a confidence that runs the other way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from mdl_jax.evaluation.metrics.columns import (
    Kernel,
    binary,
    column,
    correct_and_abstained,
    mean_or_nan,
    numeric,
    score_column,
)


def rates(h, answered) -> dict:
    """Coverage, selective risk and overall rate of one system on N records.

    Args:
      h: (N,) 0/1 hallucination of the answer given (any value where not answered).
      answered: (N,) bool.

    Returns:
      {"n", "answered", "coverage", "selective_risk" (hallucinated among the answered), "overall"
      (hallucinated / N, an abstention counted safe)}; NaN where a denominator is 0.

    Raises:
      ValueError: a column not 1-D, ``answered`` not binary or of another length than ``h``, a value of
        ``h`` outside [0, 1] (or NaN) where answered.
    """
    h = numeric(column(h, "h"), "h")
    n = len(h)
    a = binary(answered, "answered", n)
    _check_rate(h, a, "where answered")
    hits = float(np.sum(np.where(a, h, 0.0)))
    return {"n": int(n), "answered": int(a.sum()), "coverage": float(a.mean()) if n else float("nan"),
            "selective_risk": hits / a.sum() if a.any() else float("nan"),
            "overall": hits / n if n else float("nan")}


def _check_rate(h: np.ndarray, where: np.ndarray, what: str) -> None:
    # a hallucination is 0/1 (or a rate in between); NaN would make the risk NaN, 2 would push it past 1
    bad = where & ~((h >= 0) & (h <= 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"h: expected a hallucination in [0, 1] (1 = the answer is wrong){' ' + what if what else ''}"
                         f", got {h[i].item()!r} at index {i} ({int(bad.sum())} such record(s))")


class Curve(NamedTuple):
    """A risk–coverage curve.

    Attributes:
      coverage: (N,) k / N for k = 1..N.
      risk: (N,) selective risk of the k most confident records.
      aurc: the mean of ``risk``.
    """

    coverage: np.ndarray
    risk: np.ndarray
    aurc: float


def risk_coverage(h, score) -> Curve:
    """Risk–coverage curve of answers ``h`` ranked by a confidence ``score``, higher = more confident.

    Records with equal scores form one block whose hallucinations are spread evenly over its positions
    (the expectation over every order of the tie), so a constant score gives a flat curve at the rate.

    Args:
      h: (N,) 0/1, 1 = the answer is wrong (hallucinated).
      score: (N,) confidence: the highest is answered first (the opposite of ``aurc``'s default).

    Returns:
      ``Curve``; AURC NaN for N = 0.

    Raises:
      ValueError: a column not 1-D, a value of ``h`` outside [0, 1] (or NaN), ``score`` of another length
        than ``h`` or not finite.
    """
    h = numeric(column(h, "h"), "h")
    n = len(h)
    _check_rate(h, np.ones(n, bool), "")
    s = score_column(score, "score", n)
    if n == 0:
        return Curve(np.zeros(0), np.zeros(0), float("nan"))
    order = np.argsort(-s, kind="stable")
    hs, ss = h[order], s[order]
    # blocks of equal score: each position in a block gets the block's mean hallucination
    starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
    sums = np.add.reduceat(hs, starts)
    sizes = np.diff(np.r_[starts, n])
    per = np.repeat(sums / sizes, sizes)
    k = np.arange(1, n + 1)
    risk = np.cumsum(per) / k
    return Curve(k / n, risk, float(risk.mean()))


def coverage_of(a: np.ndarray) -> float:
    """1 − mean of a checked (N,) bool column abstained."""
    return 1.0 - mean_or_nan(a.astype(np.float64))


def selective_accuracy_of(c: np.ndarray, a: np.ndarray) -> float:
    """mean(correct | not abstained) of checked (N,) bool columns."""
    return mean_or_nan(c[~a].astype(np.float64))


def selective_risk_of(c: np.ndarray, a: np.ndarray) -> float:
    """1 − selective_accuracy_of."""
    return 1.0 - selective_accuracy_of(c, a)


def aurc_of(c: np.ndarray, s: np.ndarray) -> float:
    """AURC of a checked (N,) bool correct and (N,) float64 score, higher = abstain."""
    return risk_coverage(1.0 - c, -s).aurc


def coverage(abstained) -> float:
    """Share of records answered: 1 − mean(abstained).

    Args:
      abstained: (N,) bool or 0/1.

    Returns:
      The coverage; NaN for N = 0.

    Raises:
      ValueError: a column not binary or not 1-D.
    """
    return coverage_of(binary(abstained, "abstained"))


def selective_accuracy(correct, abstained) -> float:
    """Accuracy among the answered records: mean(correct | not abstained).

    Args:
      correct: (N,) bool or 0/1, 1 = the answer is right (ignored where abstained).
      abstained: (N,) bool or 0/1.

    Returns:
      The selective accuracy; NaN when every record was abstained on.

    Raises:
      ValueError: a column not binary or not 1-D, or lengths that differ, naming the argument.
    """
    return selective_accuracy_of(*correct_and_abstained(correct, abstained))


def selective_risk(correct, abstained) -> float:
    """Error rate among the answered records: 1 − ``selective_accuracy``.

    Args:
      correct: (N,) bool or 0/1.
      abstained: (N,) bool or 0/1.

    Returns:
      The selective risk; NaN when every record was abstained on.

    Raises:
      ValueError: as ``selective_accuracy``.
    """
    return selective_risk_of(*correct_and_abstained(correct, abstained))


def aurc(correct, score, *, higher_is: str = "positive") -> float:
    """Area under the risk–coverage curve of answers ranked by a gate's score (lower is better).

    The curve answers first the records the gate is least inclined to abstain on: the lowest score
    under the default convention (higher = abstain), the highest with ``higher_is="negative"`` (a
    confidence). See ``risk_coverage`` for the treatment of ties.

    Args:
      correct: (N,) bool or 0/1, 1 = the answer is right.
      score: (N,) finite scores.
      higher_is: "positive" (higher = abstain) or "negative" (higher = answer).

    Returns:
      mean over k = 1..N of the error rate among the k records answered first; NaN for N = 0.

    Raises:
      ValueError: as ``auroc``, for ``correct`` and ``score``.
    """
    return aurc_of(*_prep_aurc(correct, score, higher_is))


def _prep_coverage(abstained) -> tuple[np.ndarray]:
    return (binary(abstained, "abstained"),)


def _prep_aurc(correct, score, higher_is: str = "positive") -> tuple[np.ndarray, np.ndarray]:
    c = binary(correct, "correct")
    return c, score_column(score, "score", len(c), higher_is)


KERNELS: dict[Callable[..., Any], Kernel] = {
    coverage: Kernel(coverage_of, _prep_coverage),
    selective_accuracy: Kernel(selective_accuracy_of, correct_and_abstained),
    selective_risk: Kernel(selective_risk_of, correct_and_abstained),
    aurc: Kernel(aurc_of, _prep_aurc),
}
"""This module's metrics and their kernels (``columns.Kernel``), for the bootstrap."""
