"""Adaptive retrieval (AdaRAGUE) and CRAG's score: gates judged by the answers their choices lead to.

An adaptive-retrieval gate chooses, per question, between the answer written with retrieval and the one
written without; a gate that may also decline is judged by CRAG's three grades. Here a score's positive
class is "retrieve" (a memory gate's "do not adopt" score is passed with ``higher_is="negative"``).

  AdaRAGUE      Moskvoretskii et al., 2025, arXiv 2501.12835. In-Accuracy = mean of the correctness of
                the answer the gate's choice leads to, correct_with where it retrieves and
                correct_without where not (the paper's correctness is "a gold answer occurs in the
                reply"; any judge's 0/1 fits); retrieval calls = the mean number of retriever calls per
                record; the self-knowledge ROC-AUC = AUROC of the "retrieve" score against the oracle
                "retrieval is needed", which the authors' evaluation code defines as "the answer without
                retrieval is wrong" (``rule="adarague"``, whatever retrieval does); ``rule="helps"``
                takes the stricter "wrong without retrieval and right with it"
  CRAG score    Yang et al., 2024 (arXiv 2406.04744), the automatic evaluation's three grades: mean of
                +1 (answered, accurate), −1 (answered, wrong: hallucinated), 0 (abstained, "missing")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mdl_jax.evaluation.metrics.columns import (
    Kernel,
    binary,
    check_rule,
    correct_and_abstained,
    counts,
    mean_or_nan,
    score_column,
)
from mdl_jax.evaluation.metrics.ranking import auroc_of


def in_accuracy_of(r: np.ndarray, cw: np.ndarray, cwo: np.ndarray) -> float:
    """In-Accuracy of checked (N,) bool columns: retrieve, correct_with, correct_without."""
    return mean_or_nan(np.where(r, cw, cwo).astype(np.float64))


def oracle_of(cwo: np.ndarray, cw: np.ndarray | None, rule: str) -> np.ndarray:
    """(N,) bool "retrieval is needed" from checked columns (retrieval_oracle); cw may be None for "adarague"."""
    if rule == "adarague":
        return ~cwo
    if cw is None:
        raise ValueError("correct_with: required by rule='helps' (wrong without retrieval, right with it)")
    return ~cwo & cw


def crag_of(c: np.ndarray, a: np.ndarray) -> float:
    """CRAG score of checked (N,) bool columns: correct, abstained."""
    return mean_or_nan(np.where(a, 0.0, np.where(c, 1.0, -1.0)))


def in_accuracy(retrieve, correct_with, correct_without) -> float:
    """AdaRAGUE's In-Accuracy: accuracy of the final answers when the gate chooses to retrieve or not.

    Args:
      retrieve: (N,) bool or 0/1, 1 = the gate retrieves (the answer with retrieval is the one given).
      correct_with: (N,) bool or 0/1, the answer written with retrieval is right.
      correct_without: (N,) bool or 0/1, the answer written without retrieval is right.

    Returns:
      mean(correct_with where retrieve, else correct_without); NaN for N = 0.

    Raises:
      ValueError: a column not binary or not 1-D, or lengths that differ, naming the argument.
    """
    return in_accuracy_of(*_prep_in_accuracy(retrieve, correct_with, correct_without))


def retrieval_calls(calls) -> float:
    """AdaRAGUE's retrieval calls: the mean number of retriever calls per record (question).

    Args:
      calls: (N,) bool (retrieved or not) or non-negative counts (multi-round methods).

    Returns:
      mean(calls); NaN for N = 0.

    Raises:
      ValueError: a negative, NaN or non-numeric count, or a column not 1-D.
    """
    return mean_or_nan(counts(calls, "calls"))


def retrieval_oracle(correct_without, correct_with=None, *, rule: str = "adarague") -> np.ndarray:
    """The oracle label "retrieval is needed" for each record (module docstring).

    Args:
      correct_without: (N,) bool or 0/1, the answer without retrieval is right.
      correct_with: (N,) bool or 0/1, the answer with retrieval is right; required by ``rule="helps"``.
      rule: "adarague" (needed ⇔ wrong without retrieval, the authors' code) or "helps" (needed ⇔ wrong
        without retrieval and right with it).

    Returns:
      (N,) bool.

    Raises:
      ValueError: an unknown rule, ``rule="helps"`` without ``correct_with``, or a bad column.
    """
    check_rule(rule)
    cwo = binary(correct_without, "correct_without")
    cw = None if correct_with is None else binary(correct_with, "correct_with", len(cwo))
    return oracle_of(cwo, cw, rule)


def retrieval_auroc(score, correct_without, correct_with=None, *, rule: str = "adarague",
                    higher_is: str = "positive") -> float:
    """AdaRAGUE's self-knowledge ROC-AUC: AUROC of a "retrieve" score against ``retrieval_oracle``.

    Args:
      score: (N,) finite scores; higher = retrieve unless ``higher_is="negative"`` (a memory gate's
        "do not adopt" score, a confidence).
      correct_without: (N,) bool or 0/1.
      correct_with: (N,) bool or 0/1; required by ``rule="helps"``.
      rule: "adarague" or "helps" (``retrieval_oracle``).
      higher_is: "positive" (higher = retrieve) or "negative".

    Returns:
      The AUROC; NaN when the oracle is constant.

    Raises:
      ValueError: as ``auroc`` and ``retrieval_oracle``.
    """
    s = score_column(score, "score", higher_is=higher_is)
    check_rule(rule)
    cwo = binary(correct_without, "correct_without", len(s))
    cw = None if correct_with is None else binary(correct_with, "correct_with", len(s))
    return auroc_of(s, oracle_of(cwo, cw, rule))


def crag_score(correct, abstained) -> float:
    """CRAG's score: mean of +1 (answered, accurate), −1 (answered, hallucinated), 0 (abstained).

    Args:
      correct: (N,) bool or 0/1, the answer is accurate (ignored where abstained).
      abstained: (N,) bool or 0/1, no answer ("missing").

    Returns:
      accuracy − hallucination rate, in [−1, 1]; NaN for N = 0.

    Raises:
      ValueError: a column not binary or not 1-D, or lengths that differ, naming the argument.
    """
    return crag_of(*correct_and_abstained(correct, abstained))


def _prep_in_accuracy(retrieve, correct_with, correct_without) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = binary(retrieve, "retrieve")
    return r, binary(correct_with, "correct_with", len(r)), binary(correct_without, "correct_without", len(r))


def _prep_calls(calls) -> tuple[np.ndarray]:
    return (counts(calls, "calls"),)


def _prep_retrieval(score, correct_without, correct_with=None) -> tuple[np.ndarray, np.ndarray]:
    s = score_column(score, "score")
    if correct_with is not None:  # checked, though the default rule, "adarague", does not read it
        binary(correct_with, "correct_with", len(s))
    return s, ~binary(correct_without, "correct_without", len(s))


KERNELS: dict[Callable[..., Any], Kernel] = {
    in_accuracy: Kernel(in_accuracy_of, _prep_in_accuracy),
    retrieval_calls: Kernel(mean_or_nan, _prep_calls),
    retrieval_auroc: Kernel(auroc_of, _prep_retrieval),
    crag_score: Kernel(crag_of, correct_and_abstained),
}
"""This module's metrics and their kernels (``columns.Kernel``), for the bootstrap."""
