"""Metrics of any gate on the same records, with intervals from a bootstrap over questions.

Every function takes columns: NumPy arrays (or anything ``np.asarray`` reads: lists, pandas Series) of
shape (N,), one value per record, all of the same length. A record is one answer to one question; a
question may have several records (seeds, memory sets), and those records are not independent, so every
interval resamples whole questions (``groups``), never single records.

Sign convention. A gate's ``score`` is one number per record, and by default a higher score means the
positive class of the metric: "do not adopt" (the memories are withheld) for a memory gate, "abstain" for
a selective answerer, "retrieve" for the adaptive-retrieval metrics. A score that runs the other way (a
confidence: higher = adopt / answer) is passed with ``higher_is="negative"``, which negates it; nothing is
inferred from the values. A ``label`` is binary (bool or 0/1) and 1 marks the positive class ("should not
adopt", "should abstain"). ``correct`` is binary: 1 where the answer the system gives (or would give, had it
answered) is right. ``abstained`` is binary: 1 where the system gave no answer.

The metrics, N records, P = Σ label, Q = N − P:

  AUROC              P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) over positive/negative pairs: (R⁺ − P(P + 1)/2) / (P Q),
                     R⁺ the sum of the positives' ranks, tied scores sharing their average rank
                     (Mann–Whitney); NaN when P = 0 or Q = 0
  AUPRC              average precision Σ_k (r_k − r_{k−1}) p_k over the distinct scores taken as
                     thresholds, highest first (r recall, p precision at "score ≥ threshold"); tied
                     scores enter at one threshold (scikit-learn's ``average_precision_score``); NaN
                     when P = 0
  abstention         AbstentionBench (Kirichenko et al., 2025: "AbstentionBench: Reasoning LLMs Fail on
                     Unanswerable Questions"), abstention the positive class: TP = abstained where it
                     should, FP = abstained on an answerable one, FN = answered where it should abstain.
                     precision TP / (TP + FP); recall TP / (TP + FN); F1 2 TP / (2 TP + FP + FN) (the
                     harmonic mean of the two where both are defined); over-refusal rate FP / Q (abstained
                     on answerable ones / answerable ones)
  selective          coverage 1 − mean(abstained); selective accuracy mean(correct | answered); selective
                     risk 1 − selective accuracy; the risk–coverage curve answers the k records with the
                     lowest score (the most confident) and abstains on the rest, risk(k) = errors among
                     them / k for k = 1..N, tied scores sharing their errors evenly; AURC = mean_k risk(k)
  adaptive retrieval AdaRAGUE (Moskvoretskii et al., 2025, arXiv 2501.12835): In-Accuracy = mean of the
                     correctness of the answer the gate's choice leads to, correct_with where it
                     retrieves and correct_without where not (the paper's correctness is "a gold answer
                     occurs in the reply"; any judge's 0/1 fits); retrieval calls = the mean number of
                     retriever calls per record; the self-knowledge ROC-AUC = AUROC of the "retrieve"
                     score against the oracle "retrieval is needed", which the authors' evaluation code
                     defines as "the answer without retrieval is wrong" (``rule="adarague"``, whatever
                     retrieval does); ``rule="helps"`` takes the stricter "wrong without retrieval and
                     right with it"
  CRAG score         Yang et al., 2024 (arXiv 2406.04744), the automatic evaluation's three grades:
                     mean of +1 (answered, accurate), −1 (answered, wrong: hallucinated), 0 (abstained,
                     "missing")

Intervals: ``bootstrap`` recomputes a metric on ``n_boot`` resamples that draw G questions with
replacement from the G in ``groups`` (a drawn question brings all its records, once per draw) and returns
the percentile interval; ``paired_difference`` does the same for the difference of two gates on the same
records (both gates on the same draw), with the bootstrap SE and the minimum detectable difference at
80% power, two-sided α = 0.05: (t_{0.975, G−1} + t_{0.80, G−1}) · SE with fewer than 30 questions,
(z_{0.975} + z_{0.80}) · SE = 2.80 · SE from 30 on. ``evaluate`` gives every gate column of a table the
whole set at once.

The record-level helpers the analyses of records use (``rates``, ``risk_coverage``, ``auroc_weighted``,
``cluster_se``, ``mde``, ``cluster_bootstrap_diff``, ``question_bootstrap_weights``,
``bootstrap_mean_ci``) live here too; ``mdl_repro.analysis`` imports them from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

N_BOOT = 2000
Z_A, Z_B = 1.959964, 0.841621  # two-sided α = 0.05, power 0.80 (minimum detectable differences)
MIN_GROUPS_Z = 30  # from this many questions on, the MDE uses z; below it, t with G − 1 degrees of freedom

# Student's t quantiles t_{0.975, df} and t_{0.80, df} for df = 1..29 (the MDE below 30 questions); SciPy
# is not a dependency of the library, and tests/test_evaluation_metrics.py checks them against
# scipy.stats.t.ppf.
_T_975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157,
          2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.13145, 2.119905, 2.109816, 2.100922,
          2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831,
          2.048407, 2.04523)
_T_80 = (1.376382, 1.06066, 0.978472, 0.940965, 0.919544, 0.905703, 0.89603, 0.88889, 0.883404,
         0.879058, 0.87553, 0.872609, 0.870152, 0.868055, 0.866245, 0.864667, 0.863279, 0.862049,
         0.860951, 0.859964, 0.859074, 0.858266, 0.85753, 0.856855, 0.856236, 0.855665, 0.855137,
         0.854647, 0.854192)

RULES = ("adarague", "helps")
SIGNS = ("positive", "negative")
NAN = float("nan")

__all__ = [
    "Curve", "Difference", "Estimate", "MIN_GROUPS_Z", "N_BOOT", "RULES", "Z_A", "Z_B",
    "abstention_f1", "abstention_precision", "abstention_recall", "aurc", "auprc", "auroc",
    "auroc_weighted", "bootstrap", "bootstrap_mean_ci", "cluster_bootstrap_diff", "cluster_se", "coverage",
    "crag_score", "evaluate", "in_accuracy", "mde", "mde_for", "over_refusal_rate", "paired_difference",
    "question_bootstrap_weights", "rates", "retrieval_auroc", "retrieval_calls", "retrieval_oracle",
    "risk_coverage", "selective_accuracy", "selective_risk",
]


# ------------------------------------------------------------------------------------- input checks

def _column(x, name: str, n: int | None = None) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D column (one value per record), got shape {a.shape}")
    if n is not None and len(a) != n:
        raise ValueError(f"{name}: expected {n} values (one per record, as many as the other columns), "
                         f"got {len(a)}")
    return a


def _numeric(a: np.ndarray, name: str) -> np.ndarray:
    if a.dtype == bool:
        return a.astype(np.float64)
    if a.dtype.kind == "O":
        try:
            return a.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected numbers, got values such as {a[0]!r}") from None
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{name}: expected numbers, got dtype {a.dtype}")
    return a.astype(np.float64)


def _binary(x, name: str, n: int | None = None) -> np.ndarray:
    """(N,) bool from a bool or 0/1 column; anything else is a ValueError naming ``name``."""
    a = _column(x, name, n)
    if a.dtype == bool:
        return a
    v = _numeric(a, name)
    ok = (v == 0) | (v == 1)
    if not ok.all():
        raise ValueError(f"{name}: expected a binary column (bool or 0/1), got the value {v[~ok][0]!r} "
                         f"({int((~ok).sum())} such record(s))")
    return v == 1


def _sign(higher_is: str, name: str = "higher_is") -> float:
    if higher_is not in SIGNS:
        raise ValueError(f"{name}: expected 'positive' (a higher score means the positive class) or "
                         f"'negative' (a higher score means the negative class), got {higher_is!r}")
    return 1.0 if higher_is == "positive" else -1.0


def _score(x, name: str, n: int | None = None, higher_is: str = "positive") -> np.ndarray:
    """(N,) float64 score oriented so that higher means the positive class; NaN or ±inf is a ValueError."""
    sign = _sign(higher_is)
    v = _numeric(_column(x, name, n), name)
    bad = ~np.isfinite(v)
    if bad.any():
        raise ValueError(f"{name}: expected finite scores, got {int(bad.sum())} NaN or infinite value(s) "
                         "(drop those records, or fill them, first)")
    return v if sign > 0 else -v


def _counts(x, name: str, n: int | None = None) -> np.ndarray:
    v = _numeric(_column(x, name, n), name)
    if not (np.isfinite(v).all() and (v >= 0).all()):
        raise ValueError(f"{name}: expected non-negative finite counts (or a bool per record)")
    return v


def _rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    return rule


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else NAN


def _prep_score_label(score, label):
    s = _score(score, "score")
    return s, _binary(label, "label", len(s))


def _prep_correct_score(correct, score):
    c = _binary(correct, "correct")
    return c, _score(score, "score", len(c))


def _prep_correct_abstained(correct, abstained):
    c = _binary(correct, "correct")
    return c, _binary(abstained, "abstained", len(c))


def _prep_in_accuracy(retrieve, correct_with, correct_without):
    r = _binary(retrieve, "retrieve")
    return r, _binary(correct_with, "correct_with", len(r)), _binary(correct_without, "correct_without", len(r))


def _prep_retrieval(score, correct_without, correct_with=None):
    s = _score(score, "score")
    if correct_with is not None:  # checked, though the default rule, "adarague", does not read it
        _binary(correct_with, "correct_with", len(s))
    return s, ~_binary(correct_without, "correct_without", len(s))


# ------------------------------------------------------------------------------ ranking: AUROC, AUPRC

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
    """
    s = np.asarray(score, np.float64)
    p = np.asarray(pos, bool)
    ok = np.isfinite(s)
    s, p = s[ok], p[ok]
    w = np.atleast_2d(np.asarray(weights, np.float64))[:, ok]
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


def _auroc(s: np.ndarray, y: np.ndarray) -> float:
    n = len(s)
    n_pos = int(np.count_nonzero(y))
    if n_pos == 0 or n_pos == n:
        return NAN
    ss = np.sort(s)
    sp = s[y]
    # a positive's 1-based rank, ties at their average: (#below + #at-or-below + 1) / 2
    r = np.searchsorted(ss, sp, "left") + np.searchsorted(ss, sp, "right")
    return float(((r.sum() + n_pos) / 2 - n_pos * (n_pos + 1) / 2) / (n_pos * (n - n_pos)))


def _auprc(s: np.ndarray, y: np.ndarray) -> float:
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
    s = _score(score, "score", higher_is=higher_is)
    return _auroc(s, _binary(label, "label", len(s)))


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
    s = _score(score, "score", higher_is=higher_is)
    return _auprc(s, _binary(label, "label", len(s)))


# --------------------------------------------------------------------------------- abstention (binary)

def _confusion(a: np.ndarray, y: np.ndarray) -> tuple[int, int, int, int]:
    tp = int(np.sum(a & y))
    fp = int(np.sum(a & ~y))
    fn = int(np.sum(~a & y))
    return tp, fp, fn, len(a) - tp - fp - fn


def _precision(a, y) -> float:
    tp, fp, _, _ = _confusion(a, y)
    return tp / (tp + fp) if tp + fp else NAN


def _recall(a, y) -> float:
    tp, _, fn, _ = _confusion(a, y)
    return tp / (tp + fn) if tp + fn else NAN


def _f1(a, y) -> float:
    tp, fp, fn, _ = _confusion(a, y)
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else NAN


def _over_refusal(a, y) -> float:
    _, fp, _, tn = _confusion(a, y)
    return fp / (fp + tn) if fp + tn else NAN


def _pair(abstained, should_abstain) -> tuple[np.ndarray, np.ndarray]:
    a = _binary(abstained, "abstained")
    return a, _binary(should_abstain, "should_abstain", len(a))


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
    return _precision(*_pair(abstained, should_abstain))


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
    return _recall(*_pair(abstained, should_abstain))


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
    return _f1(*_pair(abstained, should_abstain))


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
    return _over_refusal(*_pair(abstained, should_abstain))


# ------------------------------------------------------------------------------ selective answering

def rates(h, answered) -> dict:
    """Coverage, selective risk and overall rate of one system on N records.

    Args:
      h: (N,) 0/1 hallucination of the answer given (any value where not answered).
      answered: (N,) bool.

    Returns:
      {"n", "answered", "coverage", "selective_risk" (hallucinated among the answered), "overall"
      (hallucinated / N, an abstention counted safe)}; NaN where a denominator is 0.
    """
    h = np.asarray(h, np.float64)
    a = np.asarray(answered, bool)
    n = len(h)
    hits = float(np.sum(np.where(a, h, 0.0)))
    return {"n": int(n), "answered": int(a.sum()), "coverage": float(a.mean()) if n else float("nan"),
            "selective_risk": hits / a.sum() if a.any() else float("nan"),
            "overall": hits / n if n else float("nan")}


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
    """
    h = np.asarray(h, np.float64)
    s = np.asarray(score, np.float64)
    n = len(h)
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


def _coverage(a: np.ndarray) -> float:
    return 1.0 - _mean(a.astype(np.float64))


def _selective_accuracy(c: np.ndarray, a: np.ndarray) -> float:
    return _mean(c[~a].astype(np.float64))


def _selective_risk(c: np.ndarray, a: np.ndarray) -> float:
    return 1.0 - _selective_accuracy(c, a)


def _aurc(c: np.ndarray, s: np.ndarray) -> float:
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
    return _coverage(_binary(abstained, "abstained"))


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
    return _selective_accuracy(*_prep_correct_abstained(correct, abstained))


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
    return _selective_risk(*_prep_correct_abstained(correct, abstained))


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
    c = _binary(correct, "correct")
    return _aurc(c, _score(score, "score", len(c), higher_is))


# -------------------------------------------------------------------------- adaptive retrieval, CRAG

def _in_accuracy(r: np.ndarray, cw: np.ndarray, cwo: np.ndarray) -> float:
    return _mean(np.where(r, cw, cwo).astype(np.float64))


def _oracle(cwo: np.ndarray, cw: np.ndarray | None, rule: str) -> np.ndarray:
    if rule == "adarague":
        return ~cwo
    if cw is None:
        raise ValueError("correct_with: required by rule='helps' (wrong without retrieval, right with it)")
    return ~cwo & cw


def _crag(c: np.ndarray, a: np.ndarray) -> float:
    return _mean(np.where(a, 0.0, np.where(c, 1.0, -1.0)))


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
    return _in_accuracy(*_prep_in_accuracy(retrieve, correct_with, correct_without))


def retrieval_calls(calls) -> float:
    """AdaRAGUE's retrieval calls: the mean number of retriever calls per record (question).

    Args:
      calls: (N,) bool (retrieved or not) or non-negative counts (multi-round methods).

    Returns:
      mean(calls); NaN for N = 0.

    Raises:
      ValueError: a negative, NaN or non-numeric count, or a column not 1-D.
    """
    return _mean(_counts(calls, "calls"))


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
    _rule(rule)
    cwo = _binary(correct_without, "correct_without")
    cw = None if correct_with is None else _binary(correct_with, "correct_with", len(cwo))
    return _oracle(cwo, cw, rule)


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
    s = _score(score, "score", higher_is=higher_is)
    _rule(rule)
    cwo = _binary(correct_without, "correct_without", len(s))
    cw = None if correct_with is None else _binary(correct_with, "correct_with", len(s))
    return _auroc(s, _oracle(cwo, cw, rule))


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
    return _crag(*_prep_correct_abstained(correct, abstained))


# The library's own metrics, validated once and then recomputed on every resample through their kernel
# (bootstrap and paired_difference look them up here; any other callable runs as given).
_KERNELS: dict[Callable[..., Any], tuple[Callable[..., float], Callable[..., tuple]]] = {
    auroc: (_auroc, _prep_score_label),
    auprc: (_auprc, _prep_score_label),
    abstention_precision: (_precision, _pair),
    abstention_recall: (_recall, _pair),
    abstention_f1: (_f1, _pair),
    over_refusal_rate: (_over_refusal, _pair),
    coverage: (_coverage, lambda abstained: (_binary(abstained, "abstained"),)),
    selective_accuracy: (_selective_accuracy, _prep_correct_abstained),
    selective_risk: (_selective_risk, _prep_correct_abstained),
    aurc: (_aurc, _prep_correct_score),
    crag_score: (_crag, _prep_correct_abstained),
    in_accuracy: (_in_accuracy, _prep_in_accuracy),
    retrieval_calls: (_mean, lambda calls: (_counts(calls, "calls"),)),
    retrieval_auroc: (_auroc, _prep_retrieval),
}


def _kernel(metric: Callable[..., float], cols: list[np.ndarray]) -> tuple[Callable[..., float], list]:
    fast = _KERNELS.get(metric)
    if fast is None:
        return metric, cols
    kernel, prep = fast
    return kernel, list(prep(*cols))


# -------------------------------------------------------------------------- question-level intervals

class Estimate(NamedTuple):
    """A metric with its question-bootstrap percentile interval.

    Attributes:
      value: the metric on all records.
      lo: the interval's lower end; NaN with fewer than 2 questions or no finite resample.
      hi: its upper end.
      n: records.
      n_groups: questions (the resampled units).
    """

    value: float
    lo: float
    hi: float
    n: int
    n_groups: int


class Difference(NamedTuple):
    """The difference of one metric between two gates on the same records.

    Attributes:
      value: metric(gate a) − metric(gate b) on all records.
      lo: the lower end of its question-bootstrap percentile interval.
      hi: the upper end.
      n: records.
      n_groups: questions.
      se: the bootstrap standard error of the difference (the resamples' standard deviation).
      mde: the minimum detectable difference at 80% power, two-sided α = 0.05 (``mde_for``).
    """

    value: float
    lo: float
    hi: float
    n: int
    n_groups: int
    se: float
    mde: float


_CHUNK = 256  # resamples drawn per call of the generator


class _Layout(NamedTuple):
    order: np.ndarray   # records sorted by question
    starts: np.ndarray  # (G,) first position of each question in ``order``
    sizes: np.ndarray   # (G,) records per question


def _layout(groups, n: int) -> _Layout:
    if groups is None:
        inv = np.arange(n)
    else:
        g = _column(groups, "groups", n)
        if g.dtype.kind == "f" and np.isnan(g).any():
            raise ValueError("groups: expected a question id per record, got NaN")
        _, inv = np.unique(g, return_inverse=True)
        inv = inv.reshape(-1)
    sizes = np.bincount(inv, minlength=int(inv.max()) + 1 if n else 0)
    return _Layout(np.argsort(inv, kind="stable"), np.cumsum(sizes) - sizes, sizes)


def _resamples(lay: _Layout, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """Record indices of ``n_boot`` resamples, each G questions drawn with replacement (all their records)."""
    G = len(lay.sizes)
    rng = np.random.default_rng(seed)
    for b0 in range(0, n_boot, _CHUNK):
        d = rng.integers(0, G, size=(min(_CHUNK, n_boot - b0), G))
        lens = lay.sizes[d].ravel()
        end = np.cumsum(lens)
        # each drawn question's records, at their places in the concatenation of the chunk's resamples
        pos = np.repeat(lay.starts[d].ravel() - (end - lens), lens) + np.arange(end[-1])
        yield from np.split(lay.order[pos], end[G - 1::G][:-1])


def _interval(est: np.ndarray, level: float) -> tuple[float, float]:
    est = est[np.isfinite(est)]
    if not len(est):
        return NAN, NAN
    q = round(50 * (1 - level), 10)
    lo, hi = np.percentile(est, [q, 100 - q])
    return float(lo), float(hi)


def _check_boot(n_boot: int, level: float) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int | np.integer) or n_boot < 1:
        raise ValueError(f"n_boot: expected a positive integer, got {n_boot!r}")
    if not 0 < level < 1:
        raise ValueError(f"level: expected a confidence level in (0, 1), got {level!r}")


def _columns(columns: Sequence, name: str, n: int | None = None) -> list[np.ndarray]:
    if isinstance(columns, np.ndarray) and columns.ndim == 1:
        columns = (columns,)
    cols = list(columns)
    if not cols:
        raise ValueError(f"{name}: expected at least one column")
    n = len(np.asarray(cols[0])) if n is None else n
    return [_column(c, f"{name}[{i}]", n) for i, c in enumerate(cols)]


def mde(se: float) -> float:
    """Minimum detectable difference at 80% power, two-sided α = 0.05: (z_0.975 + z_0.80) · SE."""
    return float((Z_A + Z_B) * se)


def mde_for(se: float, n_groups: int) -> float:
    """Minimum detectable difference at 80% power, two-sided α = 0.05, for ``n_groups`` questions.

    Args:
      se: the standard error of the difference.
      n_groups: the questions behind it.

    Returns:
      (t_{0.975, G−1} + t_{0.80, G−1}) · SE for G < 30 questions (the SE is itself estimated from few
      units, so z would understate it), ``mde(se)`` from 30 on; NaN for G < 2.
    """
    if n_groups < 2:
        return NAN
    if n_groups < MIN_GROUPS_Z:
        return float((_T_975[n_groups - 2] + _T_80[n_groups - 2]) * se)
    return mde(se)


def bootstrap(metric: Callable[..., float], *columns, groups=None, n_boot: int = N_BOOT, seed: int = 0,
              level: float = 0.95) -> Estimate:
    """Any metric of record columns with a percentile interval from a bootstrap over questions.

    Each resample draws G questions with replacement from the G in ``groups`` and recomputes
    ``metric`` on all records of the drawn questions (a question drawn twice brings its records twice).
    Resamples where the metric is undefined (NaN: e.g. one class only) are left out of the interval.

    Args:
      metric: a function of the columns returning a float, e.g. ``auroc`` or ``lambda c, a: ...``.
      *columns: (N,) arrays passed to ``metric`` in this order.
      groups: (N,) question ids; None: every record its own question.
      n_boot: resamples.
      seed: the resampling seed (the same seed draws the same questions for every metric).
      level: the interval's confidence level.

    Returns:
      ``Estimate(value, lo, hi, n, n_groups)``; lo, hi NaN with fewer than 2 questions.

    Raises:
      ValueError: no column, columns of different lengths or not 1-D, a NaN group, a bad ``n_boot`` or
        ``level``; and whatever ``metric`` raises on its columns.
    """
    _check_boot(n_boot, level)
    cols = _columns(columns, "columns")
    n = len(cols[0])
    lay = _layout(groups, n)
    G = len(lay.sizes)
    fn, cols = _kernel(metric, cols)
    value = float(fn(*cols))
    if G < 2:
        return Estimate(value, NAN, NAN, n, G)
    est = np.array([fn(*(c[i] for c in cols)) for i in _resamples(lay, n_boot, seed)], np.float64)
    return Estimate(value, *_interval(est, level), n, G)


def paired_difference(metric: Callable[..., float], cols_a, cols_b, groups=None, *, n_boot: int = N_BOOT,
                      seed: int = 0, level: float = 0.95) -> Difference:
    """metric(gate a) − metric(gate b) on the same records, with its interval, SE and MDE.

    Both gates are scored on the same resampled questions, so what the questions share cancels out.

    Args:
      metric: a function of columns returning a float.
      cols_a: gate a's columns for ``metric`` (a sequence of (N,) arrays, or one array).
      cols_b: gate b's columns, the same records in the same order.
      groups: (N,) question ids; None: every record its own question.
      n_boot: resamples.
      seed: the resampling seed.
      level: the interval's confidence level.

    Returns:
      ``Difference(value, lo, hi, n, n_groups, se, mde)``: se is the standard deviation of the
      resampled differences; mde is ``mde_for(se, n_groups)`` (t below 30 questions, z from 30). A gate
      against itself gives 0 with lo = hi = se = mde = 0.

    Raises:
      ValueError: as ``bootstrap``, for either gate's columns.
    """
    _check_boot(n_boot, level)
    a = _columns(cols_a, "cols_a")
    n = len(a[0])
    b = _columns(cols_b, "cols_b", n)
    lay = _layout(groups, n)
    G = len(lay.sizes)
    fn, a = _kernel(metric, a)
    _, b = _kernel(metric, b)
    value = float(fn(*a)) - float(fn(*b))
    if G < 2:
        return Difference(value, NAN, NAN, n, G, NAN, NAN)
    d = np.array([float(fn(*(c[i] for c in a))) - float(fn(*(c[i] for c in b)))
                  for i in _resamples(lay, n_boot, seed)], np.float64)
    d = d[np.isfinite(d)]
    se = float(d.std(ddof=1)) if len(d) > 1 else NAN
    return Difference(value, *_interval(d, level), n, G, se, mde_for(se, G))


# --------------------------------------------------------------------------------------- evaluate

def _get(table, key, what: str, n: int | None) -> np.ndarray:
    if isinstance(key, str):
        if key not in table:
            raise ValueError(f"{what}: no column {key!r} in the table (columns: {sorted(map(str, table))})")
        key = table[key]
    return _column(key, what, n)


def _take(table, key, what: str, n: int) -> np.ndarray | None:
    return None if key is None else _get(table, key, what, n)


def evaluate(table, *, gates: Mapping[str, Any] | Sequence[str], label=None, groups=None, correct=None,
             correct_with=None, correct_without=None, thresholds: float | Mapping[str, float] | None = None,
             higher_is: str | Mapping[str, str] = "positive", rule: str = "adarague", n_boot: int = N_BOOT,
             seed: int = 0, level: float = 0.95, as_frame: bool | None = None):
    """Every metric that the given columns allow, for every gate, with question-bootstrap intervals.

    A gate is one score per record: MDL's, a baseline's, or the user's own column, side by side. A
    higher score means "do not adopt" / "abstain" (``higher_is`` per gate flips a confidence). The gate's
    decision is ``score ≥ threshold`` (``score ≤ threshold`` for ``higher_is="negative"``); a binary gate
    column (bool or 0/1) without a threshold is its own decision, and a continuous one without a
    threshold gets only the metrics of its ranking. Read as the adaptive-retrieval metrics read it, the
    decision "do not adopt" means "answer without retrieval", so retrieve = not decision and the gate's
    "retrieve" score is −score.

    Rows, by what is given (each metric as the function of the same name computes it):

      label                          auroc, auprc; with a decision: abstention_precision,
                                     abstention_recall, abstention_f1, over_refusal_rate
      a decision                     coverage
      correct                        aurc; with a decision: selective_accuracy, selective_risk, crag_score
      correct_with, correct_without  retrieval_auroc; with a decision: in_accuracy, retrieval_calls

    Every metric and every gate is recomputed on the same resampled questions (one ``seed``), so two
    gates' intervals come from the same draws.

    Args:
      table: a mapping of column name → (N,) array, or a pandas DataFrame.
      gates: {gate name: column name or (N,) array}, or a sequence of column names (named after them).
      label: column name or (N,) binary array: 1 = should not adopt / should abstain.
      groups: column name or (N,) question ids; None: every record its own question.
      correct: column name or (N,) binary: the answer given when answering is right.
      correct_with: column name or (N,) binary: the answer with retrieval (the memories) is right;
        give it with ``correct_without`` or not at all.
      correct_without: column name or (N,) binary: the answer without retrieval is right.
      thresholds: one threshold for every gate, or {gate name: threshold}; None: binary gates only.
      higher_is: "positive" or "negative", for every gate or as {gate name: ...} (default "positive").
      rule: the retrieval oracle's rule ("adarague" or "helps"; ``retrieval_oracle``).
      n_boot: resamples.
      seed: the resampling seed (shared by every gate and metric).
      level: the intervals' confidence level.
      as_frame: return a pandas DataFrame (True), or a dict of lists (False); None: a DataFrame when
        ``table`` is one.

    Returns:
      A tidy table with one row per (gate, metric) and the columns gate, metric, value, lo, hi, n
      (records), n_groups (questions).

    Raises:
      ValueError: no gate; no label, correct or correct_with/correct_without to score against; a column
        name not in the table; lengths that differ; a non-binary label or correctness column; a NaN or
        infinite score; an unknown ``higher_is`` or ``rule``; a bad ``n_boot`` or ``level`` — each naming
        the argument.
    """
    _check_boot(n_boot, level)
    _rule(rule)
    if not isinstance(gates, Mapping):
        if isinstance(gates, str):
            gates = [gates]
        gates = {str(g): g for g in gates}
    if not gates:
        raise ValueError("gates: expected at least one gate column")
    for what, per_gate in (("thresholds", thresholds), ("higher_is", higher_is)):
        if isinstance(per_gate, Mapping) and set(per_gate) - set(gates):
            raise ValueError(f"{what}: names no gate in gates: {sorted(set(per_gate) - set(gates))}")
    if (correct_with is None) != (correct_without is None):
        raise ValueError("correct_with, correct_without: give both (the answers with and without retrieval) "
                         "or neither")
    if label is None and correct is None and correct_with is None:
        raise ValueError("label, correct, correct_with/correct_without: give at least one to score the gates "
                         "against")
    raw = {name: _get(table, col, f"gates[{name!r}]", None) for name, col in gates.items()}
    n = len(next(iter(raw.values())))
    y = None if label is None else _binary(_take(table, label, "label", n), "label")
    c = None if correct is None else _binary(_take(table, correct, "correct", n), "correct")
    cw = None if correct_with is None else _binary(_take(table, correct_with, "correct_with", n), "correct_with")
    cwo = (None if correct_without is None else
           _binary(_take(table, correct_without, "correct_without", n), "correct_without"))
    retrieval = None if cw is None or cwo is None else (cw, cwo, _oracle(cwo, cw, rule))
    g = _take(table, groups, "groups", n)

    jobs: list[tuple[str, str, Callable[..., float], tuple[np.ndarray, ...]]] = []
    for name, col in raw.items():
        what = f"gates[{name!r}]"
        hi = higher_is.get(name, "positive") if isinstance(higher_is, Mapping) else higher_is
        sign = _sign(hi, f"higher_is[{name!r}]" if isinstance(higher_is, Mapping) else "higher_is")
        s = _score(col, what, n, hi)
        thr = thresholds.get(name) if isinstance(thresholds, Mapping) else thresholds
        if thr is not None:
            dec = s >= sign * float(thr)
        elif np.isin(s * sign, (0.0, 1.0)).all():  # a binary column: its own decision (1 = positive)
            dec = (s * sign == 1.0) if sign > 0 else (s * sign == 0.0)
        else:
            dec = None
        if y is not None:
            jobs += [(name, "auroc", _auroc, (s, y)), (name, "auprc", _auprc, (s, y))]
            if dec is not None:
                jobs += [(name, "abstention_precision", _precision, (dec, y)),
                         (name, "abstention_recall", _recall, (dec, y)),
                         (name, "abstention_f1", _f1, (dec, y)),
                         (name, "over_refusal_rate", _over_refusal, (dec, y))]
        if dec is not None:
            jobs.append((name, "coverage", _coverage, (dec,)))
        if c is not None:
            jobs.append((name, "aurc", _aurc, (c, s)))
            if dec is not None:
                jobs += [(name, "selective_accuracy", _selective_accuracy, (c, dec)),
                         (name, "selective_risk", _selective_risk, (c, dec)),
                         (name, "crag_score", _crag, (c, dec))]
        if retrieval is not None:
            with_, without, oracle = retrieval
            jobs.append((name, "retrieval_auroc", _auroc, (-s, oracle)))
            if dec is not None:
                jobs += [(name, "in_accuracy", _in_accuracy, (~dec, with_, without)),
                         (name, "retrieval_calls", _mean, ((~dec).astype(np.float64),))]

    lay = _layout(g, n)
    G = len(lay.sizes)
    values = [float(fn(*cols)) for _, _, fn, cols in jobs]
    est = np.full((n_boot if G >= 2 else 0, len(jobs)), np.nan)
    if G >= 2:
        for b, idx in enumerate(_resamples(lay, n_boot, seed)):
            est[b] = [fn(*(col[idx] for col in cols)) for _, _, fn, cols in jobs]
    out: dict[str, list] = {k: [] for k in ("gate", "metric", "value", "lo", "hi", "n", "n_groups")}
    for j, (name, metric, _, _) in enumerate(jobs):
        lo, hi_ = _interval(est[:, j], level) if G >= 2 else (NAN, NAN)
        for k, v in zip(out, (name, metric, values[j], lo, hi_, n, G)):
            out[k].append(v)
    frame = as_frame if as_frame is not None else type(table).__name__ == "DataFrame"
    if frame:
        import pandas as pd

        return pd.DataFrame(out)
    return out


# ---------------------------------------------------- record-level helpers of the analyses of records

def cluster_se(d, groups) -> float:
    """SE of mean(d) over records clustered by question: the linearised (ratio-estimator) variance.

    Args:
      d: (N,) per-record values (a paired difference).
      groups: (N,) question ids.

    Returns:
      sqrt(Σ_g (s_g − d̄ n_g)² / N² · G / (G − 1)), s_g the question's sum, n_g its records; with equal
      records per question, sd(question means) / √G. NaN for fewer than 2 questions.
    """
    d = np.asarray(d, np.float64)
    _, g = np.unique(np.asarray(groups), return_inverse=True)
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
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    g_ids, g = np.unique(np.asarray(groups), return_inverse=True)
    G = len(g_ids)
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
    """
    g_ids, g = np.unique(np.asarray(groups), return_inverse=True)
    G = len(g_ids)
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
    """
    x = np.asarray(x, float)
    if groups is not None:
        return cluster_bootstrap_diff(x, np.zeros_like(x), groups, n_boot, seed)
    if len(x) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    est = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    lo, hi = np.percentile(est, [2.5, 97.5])
    return float(lo), float(hi)
