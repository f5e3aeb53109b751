"""``evaluate``: every metric the given columns allow, for every gate of a table, in one call.

This is the harness's front door: a table of records (a mapping of columns or a pandas DataFrame), the
gates as columns of it, MDL's beside a baseline's or a user's, and whatever labels are at hand. It picks
the metrics those columns support, computes each through the kernel its own module defines, and
recomputes them all on the same resampled questions, so two gates' intervals come from the same draws.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mdl_jax.evaluation.metrics.abstention import f1_of, over_refusal_of, precision_of, recall_of
from mdl_jax.evaluation.metrics.columns import NAN, binary, check_rule, column, mean_or_nan, score_column, sign_of
from mdl_jax.evaluation.metrics.intervals import (
    N_BOOT,
    check_boot,
    check_seed,
    percentile_interval,
    question_layout,
    resamples,
)
from mdl_jax.evaluation.metrics.ranking import auprc_of, auroc_of
from mdl_jax.evaluation.metrics.retrieval import crag_of, in_accuracy_of, oracle_of
from mdl_jax.evaluation.metrics.selective import aurc_of, coverage_of, selective_accuracy_of, selective_risk_of


def _get(table, key, what: str, n: int | None) -> np.ndarray:
    # A column name (a string, any other scalar key such as a DataFrame's integer label, or a tuple
    # label the table holds) is looked up; anything else is taken as the column's values.
    if isinstance(key, str) or np.ndim(key) == 0 or (isinstance(key, tuple) and _has(table, key)):
        if not (isinstance(table, Mapping) or hasattr(table, "columns")):
            raise ValueError(f"{what}: {key!r} names a column, but table is a {type(table).__name__}, not a "
                             "mapping of column → values or a DataFrame")
        if not _has(table, key):
            raise ValueError(f"{what}: no column {key!r} in the table (columns: {sorted(map(str, table))})")
        key = table[key]
    return column(key, what, n)


def _has(table, key) -> bool:
    try:
        return key in table
    except TypeError:  # an unhashable key
        return False


def _by_name(per_gate: Mapping, what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys: dict[str, Any] = {}
    for k, v in per_gate.items():
        if str(k) in out:
            raise ValueError(f"{what}: two gates named {str(k)!r} (the keys {keys[str(k)]!r} and {k!r})")
        out[str(k)], keys[str(k)] = v, k
    return out


def _threshold(thr, what: str) -> float:
    if isinstance(thr, bool) or not isinstance(thr, numbers.Real) or not math.isfinite(thr):
        raise ValueError(f"{what}: expected a finite number, got {thr!r}")
    return float(thr)


def _take(table, key, what: str, n: int) -> np.ndarray | None:
    # n is the gates' length: a column of another length is named, with the length it must match
    a = None if key is None else _get(table, key, what, None)
    if a is not None and len(a) != n:
        raise ValueError(f"{what}: expected {n} values (one per record, as many as the gates' columns), "
                         f"got {len(a)}")
    return a


def evaluate(table, *, gates: Mapping[Any, Any] | Sequence[Any], label=None, groups=None, correct=None,
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
      gates: {gate name: column name or (N,) array}, or a sequence of column names (named after them); a
        name is any key of the table (a DataFrame's integer or tuple labels too).
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
        infinite score; a threshold that is not a finite number; two gate keys of one name; an unknown
        ``higher_is`` or ``rule``; a bad ``n_boot``, ``seed``, ``level`` or ``as_frame``; a column named
        when ``table`` is no mapping or DataFrame — each naming the argument.
    """
    check_boot(n_boot, level)
    check_seed(seed)
    check_rule(rule)
    if as_frame is not None and not isinstance(as_frame, bool):  # "no" would read as True
        raise ValueError(f"as_frame: expected True, False or None, got {as_frame!r}")
    if not isinstance(gates, Mapping):
        gates = {g: g for g in ([gates] if isinstance(gates, str) else gates)}
    # A gate's name is the string of its key (a DataFrame's integer label 0 names gate "0"), in gates and
    # in the per-gate mappings alike; two keys with one string would be two gates of one name.
    gates = _by_name(gates, "gates")
    if not gates:
        raise ValueError("gates: expected at least one gate column")
    if isinstance(thresholds, Mapping):
        thresholds = _by_name(thresholds, "thresholds")
    if isinstance(higher_is, Mapping):
        higher_is = _by_name(higher_is, "higher_is")
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
    lengths = {name: len(v) for name, v in raw.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError("gates: expected columns of one length (one value per record), got "
                         + ", ".join(f"{k!r}: {v}" for k, v in lengths.items()))
    n = len(next(iter(raw.values())))
    y = None if label is None else binary(_take(table, label, "label", n), "label")
    c = None if correct is None else binary(_take(table, correct, "correct", n), "correct")
    cw = None if correct_with is None else binary(_take(table, correct_with, "correct_with", n), "correct_with")
    cwo = (None if correct_without is None else
           binary(_take(table, correct_without, "correct_without", n), "correct_without"))
    retrieval = None if cw is None or cwo is None else (cw, cwo, oracle_of(cwo, cw, rule))
    g = _take(table, groups, "groups", n)

    jobs: list[tuple[str, str, Callable[..., float], tuple[np.ndarray, ...]]] = []
    for name, col in raw.items():
        what = f"gates[{name!r}]"
        hi = higher_is.get(name, "positive") if isinstance(higher_is, Mapping) else higher_is
        sign = sign_of(hi, f"higher_is[{name!r}]" if isinstance(higher_is, Mapping) else "higher_is")
        s = score_column(col, what, n, hi)
        thr = thresholds.get(name) if isinstance(thresholds, Mapping) else thresholds
        if thr is not None:
            dec = s >= sign * _threshold(thr, f"thresholds[{name!r}]" if isinstance(thresholds, Mapping)
                                         else "thresholds")
        elif np.isin(s * sign, (0.0, 1.0)).all():  # a binary column: its own decision (1 = positive)
            dec = (s * sign == 1.0) if sign > 0 else (s * sign == 0.0)
        else:
            dec = None
        if y is not None:
            jobs += [(name, "auroc", auroc_of, (s, y)), (name, "auprc", auprc_of, (s, y))]
            if dec is not None:
                jobs += [(name, "abstention_precision", precision_of, (dec, y)),
                         (name, "abstention_recall", recall_of, (dec, y)),
                         (name, "abstention_f1", f1_of, (dec, y)),
                         (name, "over_refusal_rate", over_refusal_of, (dec, y))]
        if dec is not None:
            jobs.append((name, "coverage", coverage_of, (dec,)))
        if c is not None:
            jobs.append((name, "aurc", aurc_of, (c, s)))
            if dec is not None:
                jobs += [(name, "selective_accuracy", selective_accuracy_of, (c, dec)),
                         (name, "selective_risk", selective_risk_of, (c, dec)),
                         (name, "crag_score", crag_of, (c, dec))]
        if retrieval is not None:
            with_, without, oracle = retrieval
            jobs.append((name, "retrieval_auroc", auroc_of, (-s, oracle)))
            if dec is not None:
                jobs += [(name, "in_accuracy", in_accuracy_of, (~dec, with_, without)),
                         (name, "retrieval_calls", mean_or_nan, ((~dec).astype(np.float64),))]

    lay = question_layout(g, n)
    G = len(lay.sizes)
    values = [float(fn(*cols)) for _, _, fn, cols in jobs]
    est = np.full((n_boot if G >= 2 else 0, len(jobs)), np.nan)
    if G >= 2:
        for b, idx in enumerate(resamples(lay, n_boot, seed)):
            est[b] = [fn(*(col[idx] for col in cols)) for _, _, fn, cols in jobs]
    out: dict[str, list] = {k: [] for k in ("gate", "metric", "value", "lo", "hi", "n", "n_groups")}
    for j, (name, metric, _, _) in enumerate(jobs):
        lo, hi_ = percentile_interval(est[:, j], level) if G >= 2 else (NAN, NAN)
        for k, v in zip(out, (name, metric, values[j], lo, hi_, n, G)):
            out[k].append(v)
    frame = as_frame if as_frame is not None else type(table).__name__ == "DataFrame"
    if frame:
        import pandas as pd

        return pd.DataFrame(out)
    return out

