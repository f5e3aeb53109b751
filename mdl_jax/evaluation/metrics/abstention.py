"""Abstention as a binary decision, scored against the label "should abstain".

A gate that withholds memories, or an answerer that declines, makes one yes/no call per record; these
are the counts AbstentionBench (Kirichenko et al., 2025: "AbstentionBench: Reasoning LLMs Fail on
Unanswerable Questions") reports, with abstention the positive class: TP = abstained where it should,
FP = abstained on an answerable one, FN = answered where it should abstain, TN the rest, Q = FP + TN
the answerable records.

  precision            TP / (TP + FP)
  recall               TP / (TP + FN)
  F1                   2 TP / (2 TP + FP + FN) (the harmonic mean of the two where both are defined)
  over-refusal rate    FP / Q (abstained on answerable ones / answerable ones)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mdl_jax.evaluation.metrics.columns import NAN, Kernel, binary


def _confusion(a: np.ndarray, y: np.ndarray) -> tuple[int, int, int, int]:
    tp = int(np.sum(a & y))
    fp = int(np.sum(a & ~y))
    fn = int(np.sum(~a & y))
    return tp, fp, fn, len(a) - tp - fp - fn


def precision_of(a: np.ndarray, y: np.ndarray) -> float:
    """TP / (TP + FP) of checked (N,) bool columns: abstained, should abstain."""
    tp, fp, _, _ = _confusion(a, y)
    return tp / (tp + fp) if tp + fp else NAN


def recall_of(a: np.ndarray, y: np.ndarray) -> float:
    """TP / (TP + FN) of checked (N,) bool columns: abstained, should abstain."""
    tp, _, fn, _ = _confusion(a, y)
    return tp / (tp + fn) if tp + fn else NAN


def f1_of(a: np.ndarray, y: np.ndarray) -> float:
    """2 TP / (2 TP + FP + FN) of checked (N,) bool columns: abstained, should abstain."""
    tp, fp, fn, _ = _confusion(a, y)
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else NAN


def over_refusal_of(a: np.ndarray, y: np.ndarray) -> float:
    """FP / (FP + TN) of checked (N,) bool columns: abstained, should abstain."""
    _, fp, _, tn = _confusion(a, y)
    return fp / (fp + tn) if fp + tn else NAN


def _pair(abstained, should_abstain) -> tuple[np.ndarray, np.ndarray]:
    a = binary(abstained, "abstained")
    return a, binary(should_abstain, "should_abstain", len(a))


def abstention_precision(abstained, should_abstain) -> float:
    """Share of the abstentions that were called for: TP / (TP + FP) (AbstentionBench).

    Args:
      abstained: (N,) bool or 0/1, 1 = the system gave no answer (or the gate did not adopt).
      should_abstain: (N,) bool or 0/1, 1 = abstaining is right here (the label).

    Returns:
      The precision; NaN when nothing was abstained on.

    Raises:
      ValueError: a column not binary or not 1-D, or lengths that differ, naming the argument.
    """
    return precision_of(*_pair(abstained, should_abstain))


def abstention_recall(abstained, should_abstain) -> float:
    """Share of the called-for abstentions made: TP / (TP + FN) (AbstentionBench's headline metric).

    Args:
      abstained: (N,) bool or 0/1.
      should_abstain: (N,) bool or 0/1.

    Returns:
      The recall; NaN when no record should be abstained on.

    Raises:
      ValueError: as ``abstention_precision``.
    """
    return recall_of(*_pair(abstained, should_abstain))


def abstention_f1(abstained, should_abstain) -> float:
    """F1 of abstention as the positive class: 2 TP / (2 TP + FP + FN).

    Args:
      abstained: (N,) bool or 0/1.
      should_abstain: (N,) bool or 0/1.

    Returns:
      The F1, the harmonic mean of precision and recall where both are defined (0 when TP = 0 and
      anything was abstained on or called for); NaN when nothing was abstained on and nothing called for.

    Raises:
      ValueError: as ``abstention_precision``.
    """
    return f1_of(*_pair(abstained, should_abstain))


def over_refusal_rate(abstained, should_abstain) -> float:
    """Abstentions on answerable records / answerable records: FP / (FP + TN).

    Args:
      abstained: (N,) bool or 0/1.
      should_abstain: (N,) bool or 0/1 (0 = answerable).

    Returns:
      The over-refusal rate; NaN when no record is answerable.

    Raises:
      ValueError: as ``abstention_precision``.
    """
    return over_refusal_of(*_pair(abstained, should_abstain))


KERNELS: dict[Callable[..., Any], Kernel] = {
    abstention_precision: Kernel(precision_of, _pair),
    abstention_recall: Kernel(recall_of, _pair),
    abstention_f1: Kernel(f1_of, _pair),
    over_refusal_rate: Kernel(over_refusal_of, _pair),
}
"""This module's metrics and their kernels (``columns.Kernel``), for the bootstrap."""
