"""Reader-free scoring of MDL and the gates it is compared with, on a benchmark's memory sets.

No model answers here: each memory set of a benchmark (``mdl_jax.evaluation.datasets``) carries labels
(should the memories be adopted; should the system abstain), and every gate is scored on whether it
adopts the sets it should and withholds the ones it should not, on the same rows.

The gates, each one score per memory set (higher = "do not adopt") and one decision:

  always adopt / never adopt     constant
  similarity (top-1)             the best memory's cosine to the query, M in MDL's terms: LangChain's
                                 ``EmbeddingsFilter`` and LlamaIndex's ``SimilarityPostprocessor`` turned
                                 into a memory-set decision (adopt iff M ≥ τ)
  lexical conflict (φ > 0)       the paper's detector alone: withhold iff any relevant pair is flagged
  either detector (φ > 0)        the same with the paper's flags OR disagreeing answers
                                 (``signals.answer_conflict.either_pair_flags``)
  R alone                        adopt iff R ≥ τ
  memory count                   adopt iff the set holds ≥ τ memories: a gate that reads no text, to show
                                 where a data set's set sizes go with its labels
  MDL (paper defaults)           Active adopts; Supp, Silent and Opt-Out do not; ranked by C_final
  MDL + answer detector          the same controller, φ from both detectors (``either_pair_flags``)
  MDL calibrated                 ``mdl_jax.calibrate`` (Section 3.4) on the calibration split
  MDL tuned                      ``mdl_jax.tune`` of the gates (``gate_coeffs``, ``thresholds``) on it
  MDL learned                    ``mdl_jax.tune`` of every numeric field on it
  oracle                         the label itself
  a user's column                any score the caller passes (``extra``), with a τ fitted the same way

Protocol. The rows of each data set are split by question (``group``) into a calibration share and an
evaluation share (``calibration_split``: a hash of the question id, so the split is the same in every run
and for every gate); every τ, the calibrated and the tuned configs are fitted on the calibration rows only
and every metric is computed on the evaluation rows only. τ maximises the agreement of "adopt iff the
gate's adopt-score ≥ τ" with the labels (``fit_threshold``). The task risk A is the gate's constant 0.5
for every benchmark: none of them carries a domain risk, and a constant keeps A out of the comparison.

Labels. A memory set's "do not adopt" label is ``not should_adopt`` where the data set's rule defines
``should_adopt``, else ``should_abstain`` (no memory worth adopting) where the set holds memories; rows
with neither, and empty memory sets (nothing to adopt), are left out of the adoption metrics. The abstention metrics (AbstentionBench's, ``metrics``) are computed for the gates
that can abstain (MDL's Opt-Out) where the rule defines ``should_abstain``.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mdl_jax.controller.api import decide
from mdl_jax.controller.calibration import calibrate
from mdl_jax.controller.config import MDLConfig
from mdl_jax.controller.decision import Action
from mdl_jax.controller.tuning import FIELD_SETS, tune
from mdl_jax.evaluation import metrics
from mdl_jax.evaluation.datasets.items import BenchmarkItem

CALIBRATION_SHARE = 0.3  # of each data set's questions; the rest are evaluated
RISK = 0.5  # A for every memory set (see the module docstring)
MIN_CALIBRATION = 5  # rows, and both labels present, for a fitted τ or config; else the gate is not fitted
ACTIVE = int(Action.ACTIVE)
OPT_OUT = int(Action.OPT_OUT)


def calibration_split(groups: Sequence[str] | np.ndarray, share: float = CALIBRATION_SHARE, salt: str = "") -> np.ndarray:
    """(N,) bool: True for the rows whose question falls in the calibration share.

    A question's side is a hash of its id (and ``salt``), so every row of one question is on one side, the
    split is the same in every run and on every machine, and adding a data set moves no question.

    Args:
      groups: (N,) question ids (strings).
      share: the calibration share, in (0, 1).
      salt: mixed into the hash (the data set's name keeps two data sets' splits independent).

    Raises:
      ValueError: ``share`` outside (0, 1).
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"share: expected a number in (0, 1), got {share!r}")
    cut = int(share * 2**32)
    return np.array([int.from_bytes(hashlib.sha256(f"{salt}\0{g}".encode()).digest()[:4], "big") < cut
                     for g in groups], bool)


def fit_threshold(adopt_score, adopt) -> float | None:
    """τ maximising the agreement of "adopt iff adopt_score ≥ τ" with ``adopt`` (the calibration rule of
    the practitioners' gates: every distinct score and +inf are candidates; ties between equally good cuts
    go to the median tied candidate). None when fewer than ``MIN_CALIBRATION`` rows or one label only:
    the gate then has no decision (``Gate.withhold`` None), not a constant one.

    Args:
      adopt_score: (N,) finite numbers, higher = adopt.
      adopt: (N,) binary labels, 1 = the memories should be adopted.

    Raises:
      ValueError: a NaN or infinite score (naming its index).
    """
    y = np.asarray(adopt).astype(bool)  # (labels that cannot be read fail before a score that is not finite)
    s = _finite_scores("adopt_score", adopt_score)
    if len(s) < MIN_CALIBRATION or y.all() or not y.any():
        return None
    cand = np.r_[np.unique(s), np.inf]
    order = np.sort(s)
    ys = y[np.argsort(s, kind="stable")]
    # right(t) = #{adopt, s ≥ t} + #{reject, s < t}, for every cut at once from counts
    below = np.searchsorted(order, cand, side="left")
    rej_cum = np.r_[0, np.cumsum(~ys)]
    adopt_cum = np.r_[0, np.cumsum(ys)]
    right = (adopt_cum[-1] - adopt_cum[below]) + rej_cum[below]
    best = np.flatnonzero(right == right.max())
    return float(cand[best[(len(best) - 1) // 2]])


def _finite_scores(name: str, scores) -> np.ndarray:
    s = np.asarray(scores, np.float64)
    if not np.isfinite(s).all():
        raise ValueError(f"{name}: expected finite scores, got a NaN or infinity at index "
                         f"{int(np.flatnonzero(~np.isfinite(s))[0])}")
    return s


@dataclass(frozen=True)
class Gate:
    """One gate's result on every row: ``score`` (higher = do not adopt) and ``withhold`` (its decision;
    None for a fitted gate whose τ could not be fitted, so that only its ranking is scored), ``abstain``
    where the gate can abstain (None otherwise), and what was fitted (``fitted``)."""

    name: str
    score: np.ndarray
    withhold: np.ndarray | None
    abstain: np.ndarray | None = None
    fitted: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scored:
    """One data set's rows: the signals (``columns``), the labels, the split and every gate."""

    dataset: str
    qid: np.ndarray
    group: np.ndarray
    condition: np.ndarray
    dont_adopt: np.ndarray  # float: 1 / 0, NaN where the rule gives no label
    should_abstain: np.ndarray  # float: 1 / 0 / NaN
    calibration: np.ndarray  # bool
    columns: Mapping[str, np.ndarray]
    gates: tuple[Gate, ...]


def _label(values: Sequence[bool | None]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values])


SCORED_COLUMNS = ("M", "R", "R_either", "phi", "phi_either", "C_final", "C_final_either", "action",
                  "action_either")  # the signal columns score_gates and condition_table read
_ACTIONS = tuple(int(a) for a in Action)


def check_inputs(items: Sequence[Any], cols: Mapping[str, Any] | None, keys: Sequence[str],
                 item_type: type[BenchmarkItem] = BenchmarkItem) -> None:
    """Refuse, naming the argument, what would otherwise be scored silently wrong or fail deep inside:
    no items, an item of another type, a qid twice (its question would weigh double), and columns
    that are missing, not one value per item, not finite, or actions that are no MDL action."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise TypeError(f"items: expected a sequence of {item_type.__name__}, got {type(items).__name__}")
    if not items:
        raise ValueError("items: expected at least one item, got none")
    first: dict[str, int] = {}
    for i, it in enumerate(items):
        if not isinstance(it, item_type):
            raise TypeError(f"items[{i}]: expected {item_type.__name__}, got {type(it).__name__}")
        j = first.setdefault(it.qid, i)
        if j != i:
            raise ValueError(f"items[{i}]: qid {it.qid!r} is items[{j}]'s too; expected each item once")
    if cols is None:
        return
    if not isinstance(cols, Mapping):
        raise TypeError(f"cols: expected a mapping of signal columns (signal_columns), got {type(cols).__name__}")
    n = len(items)
    for key in keys:
        if key not in cols:
            raise ValueError(f"cols: no column {key!r}; expected scoring.signal_columns of the items")
        v = np.asarray(cols[key])
        if v.shape != (n,):
            got = v.shape[0] if v.ndim == 1 else f"shape {v.shape}"
            raise ValueError(f"cols[{key!r}]: expected {n} values (one per item), got {got}")
        if key.startswith("action"):
            bad = ~np.isin(v, _ACTIONS) if v.dtype.kind in "biuf" else np.ones(n, bool)
            what = f"MDL's actions {_ACTIONS}"
        else:
            bad = ~np.isfinite(v) if v.dtype.kind in "biuf" else np.ones(n, bool)
            what = "finite numbers"
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"cols[{key!r}]: expected {what}, got {v[i]!r} at index {i}")


def signal_columns(items: Sequence[BenchmarkItem], gate, *, progress: bool = False) -> dict[str, np.ndarray]:
    """The gate's signals and decision for every memory set, with the paper's detector and with both
    detectors: {"M", "R", "phi", "C_final", "action"} and the same with the suffix ``_either``.

    Args:
      items: the data set's memory sets.
      gate: a ``MemoryGate`` (its embedder, relevance threshold and config are used; its conflict
        detector is replaced by the paper's and by ``either_pair_flags`` in turn).
      progress: progress bars while embedding.
    """
    from mdl_jax.gate.core import MemoryGate
    from mdl_jax.signals.answer_conflict import either_pair_flags
    from mdl_jax.signals.conflict import pair_flags

    qs = [it.question for it in items]
    mems = [list(it.memories) for it in items]
    risks = [RISK] * len(items)
    out: dict[str, np.ndarray] = {}
    for suffix, detector in (("", pair_flags), ("_either", either_pair_flags)):
        g = MemoryGate(gate.embedder, risk=RISK, conflict=detector, config=gate.config,
                       relevance_threshold=gate.relevance_threshold)
        cols = g.columns(qs, mems, risks=risks, progress=progress)
        for k in ("M", "R", "phi", "C_final", "action"):
            out[k + suffix] = np.asarray(cols[k])
    return out


def _mdl(name: str, cols: Mapping[str, np.ndarray], action: np.ndarray, fitted: Mapping | None = None,
         c_final: np.ndarray | None = None) -> Gate:
    c = cols["C_final"] if c_final is None else c_final
    return Gate(name, -np.asarray(c, np.float64), action != ACTIVE, action == OPT_OUT, dict(fitted or {}))


def _fitted_config(kind: str, cols, adopt: np.ndarray, cal: np.ndarray, config: MDLConfig):
    M, R, A = (np.asarray(cols[k], np.float32)[cal] for k in ("M", "R", "A"))
    y = adopt[cal]
    if len(y) < MIN_CALIBRATION or y.all() or not y.any():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant classifier's plateau: reported through the table
        if kind == "calibrated":
            return calibrate(M, R, A, y, config).config
        fields = FIELD_SETS["gates"] if kind == "tuned" else FIELD_SETS["all"]
        # Padded to a power of two with weight-0 rows: tune compiles once per length, and data sets of
        # every size then share a handful of programs.
        n = len(y)
        pad = max(64, 1 << (n - 1).bit_length()) - n
        w = np.r_[np.ones(n, np.float32), np.zeros(pad, np.float32)]
        M, R, A = (np.r_[x, np.full(pad, 0.5, np.float32)] for x in (M, R, A))
        y = np.r_[y, np.zeros(pad, bool)]
        return tune(M, R, A, y, fields=fields, config=config, weights=w, steps=300, seed=0).config


def score_gates(dataset: str, items: Sequence[BenchmarkItem], cols: Mapping[str, np.ndarray], *,
                config: MDLConfig | None = None, extra: Mapping[str, np.ndarray] | None = None,
                fit_mdl: bool = True, split_salt: str | None = None) -> Scored:
    """Every gate of the module docstring on one data set's rows.

    Args:
      dataset: the data set's name (it salts the calibration split unless ``split_salt`` is given).
      items: its memory sets (labels, groups, conditions).
      cols: ``signal_columns`` of the same items.
      config: the MDL config the signals were decided with (paper defaults when None).
      extra: {name: (N,) score} of the caller's own gates, higher = do not adopt (a confidence is passed
        negated); each gets a τ fitted on the calibration split like the similarity rule.
      fit_mdl: also fit the calibrated, tuned and learned MDL configs (seconds each).
      split_salt: salts the calibration split in place of ``dataset``: two readings of one data set
        (``rgb_en_fact`` and ``rgb_en_fact_equal``) pass the same, so they evaluate the same questions.

    Raises:
      ValueError: an ``extra`` column of the wrong length or with a non-finite value (naming it), or
        named as a built-in gate (``GATE_NAMES``) or by no string.
      TypeError: ``extra`` is not a mapping; ``items`` not a sequence of ``BenchmarkItem``, ``cols`` not a
        mapping.
      ValueError: no items, a qid twice; a column of ``SCORED_COLUMNS`` missing, not (N,), not finite, or
        an action that is none of MDL's (naming it).
    """
    check_inputs(items, cols, SCORED_COLUMNS)
    cfg = config or MDLConfig()
    n = len(items)
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra: expected a mapping {{gate name: (N,) scores}} or None, got {type(extra).__name__}")
    user: dict[str, np.ndarray] = {}
    for name, col in (extra or {}).items():
        # a column under a built-in gate's name would put two gates' rows under one name in the tables
        # (spaces around it too: a table cell drops them)
        if not isinstance(name, str) or name.strip() in GATE_NAMES:
            raise ValueError(f"extra: {name!r} cannot name a gate: expected a string other than the built-in "
                             f"gates' names ({', '.join(GATE_NAMES)})")
        s = np.asarray(col, np.float64)
        if s.shape != (n,):
            raise ValueError(f"extra[{name!r}]: expected {n} scores (one per memory set), got shape {s.shape}")
        user[name] = _finite_scores(f"extra[{name!r}]", s)
    adopt_lab = _label([it.should_adopt for it in items])
    abstain_lab = _label([it.should_abstain for it in items])
    has_memories = np.array([bool(it.memories) for it in items])
    # an empty memory set has nothing to adopt: only the abstention metrics read it
    dont = np.where(~np.isnan(adopt_lab), 1.0 - adopt_lab, np.where(has_memories, abstain_lab, np.nan))
    groups = np.array([it.group for it in items])
    cal = calibration_split(groups, salt=dataset if split_salt is None else split_salt)
    adopt = dont == 0.0
    labelled = ~np.isnan(dont)
    cols = dict(cols)
    cols["A"] = np.full(n, RISK, np.float32)

    def threshold_gate(name: str, adopt_score: np.ndarray) -> Gate:
        # No τ (too few calibration rows, or one label): no decision to score, as for the fitted MDL
        # configs; substituting a constant rule would report it under this gate's name.
        tau = fit_threshold(adopt_score[cal & labelled], adopt[cal & labelled])
        withhold = None if tau is None else adopt_score < tau
        return Gate(name, -adopt_score.astype(np.float64), withhold, None, {"tau": tau})

    M, R = (np.asarray(cols[k], np.float64) for k in ("M", "R"))
    gates = [
        Gate("always adopt", np.zeros(n), np.zeros(n, bool)),
        Gate("never adopt", np.ones(n), np.ones(n, bool)),
        threshold_gate("similarity (top-1)", M),
        Gate("lexical conflict (φ > 0)", np.asarray(cols["phi"], np.float64), np.asarray(cols["phi"]) > 0),
        Gate("either detector (φ > 0)", np.asarray(cols["phi_either"], np.float64),
             np.asarray(cols["phi_either"]) > 0),
        threshold_gate("R alone", R),
        threshold_gate("memory count", np.array([len(it.memories) for it in items], np.float64)),
        _mdl("MDL (paper defaults)", cols, np.asarray(cols["action"])),
        _mdl("MDL + answer detector", cols, np.asarray(cols["action_either"]), c_final=cols["C_final_either"]),
    ]
    if fit_mdl:
        for kind in ("calibrated", "tuned", "learned"):
            fitted = _fitted_config(kind, cols, adopt & labelled, cal & labelled, cfg)
            if fitted is None:
                continue
            d = decide(np.asarray(M, np.float32), np.asarray(R, np.float32), cols["A"], fitted)
            gates.append(_mdl(f"MDL {kind}", cols, np.asarray(d.action),
                              {"thresholds": np.asarray(fitted.thresholds).tolist()},
                              c_final=np.asarray(d.C_final)))
    for name, score in user.items():
        gates.append(threshold_gate(name, -score))
    gates.append(Gate("oracle", np.nan_to_num(dont), dont == 1.0))
    return Scored(dataset, np.array([it.qid for it in items]), groups,
                  np.array([it.condition for it in items]), dont, abstain_lab, cal, cols, tuple(gates))


def _accuracy(withhold, dont) -> float:
    return float(np.mean(np.asarray(withhold, bool) == np.asarray(dont, bool)))


def _withhold_rate(withhold) -> float:
    return float(np.mean(withhold))


METRICS: dict[str, tuple[str, Callable[..., float]]] = {
    "decision accuracy": ("label", _accuracy),
    "withheld": ("none", _withhold_rate),
    "AUROC": ("score", metrics.auroc),
    "AUPRC": ("score", metrics.auprc),
}
REFERENCE = "MDL (paper defaults)"
# every built-in gate's name: a user's own column may not take one (its rows would mix with the gate's)
GATE_NAMES = ("always adopt", "never adopt", "similarity (top-1)", "lexical conflict (φ > 0)",
              "either detector (φ > 0)", "R alone", "memory count", REFERENCE, "MDL + answer detector", "MDL calibrated",
              "MDL tuned", "MDL learned", "oracle")


def metric_table(s: Scored, *, n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """The evaluation rows' metrics of every gate, with question-bootstrap 95% intervals, and the paired
    difference of each gate's decision accuracy from MDL with the paper's defaults (same rows, same
    resamples), with its minimum detectable difference.

    Returns:
      A list of {"dataset", "gate", "metric", "value", "lo", "hi", "n", "n_groups"} rows; AUROC and AUPRC
      are NaN (no interval) where the evaluation rows hold one label only. A gate without a decision
      (``Gate.withhold`` None: its τ could not be fitted) has its ranking metrics only.
    """
    ev = ~s.calibration & ~np.isnan(s.dont_adopt)
    dont = s.dont_adopt[ev].astype(bool)
    groups = s.group[ev]
    both = dont.any() and not dont.all()
    rows: list[dict] = []
    ref = next(g for g in s.gates if g.name == REFERENCE)

    def put(gate: str, metric: str, est) -> None:
        rows.append({"dataset": s.dataset, "gate": gate, "metric": metric, "value": est.value,
                     "lo": est.lo, "hi": est.hi, "n": int(est.n), "n_groups": int(est.n_groups)})

    ab_rows = ~s.calibration & ~np.isnan(s.should_abstain)
    for g in s.gates:
        if g.abstain is not None and ab_rows.any():
            a, y = g.abstain[ab_rows], s.should_abstain[ab_rows].astype(bool)
            for metric, fn in (("abstention precision", metrics.abstention_precision),
                               ("abstention recall", metrics.abstention_recall),
                               ("abstention F1", metrics.abstention_f1),
                               ("over-refusal", metrics.over_refusal_rate)):
                put(g.name, metric, metrics.bootstrap(fn, a, y, groups=s.group[ab_rows], n_boot=n_boot, seed=seed))
        if not ev.any():
            continue
        w = None if g.withhold is None else g.withhold[ev]
        for metric, (kind, fn) in METRICS.items():
            if (kind == "score" and not both) or (kind != "score" and w is None):
                continue
            cols = {"label": (w, dont), "none": (w,), "score": (g.score[ev], dont)}[kind]
            put(g.name, metric, metrics.bootstrap(fn, *cols, groups=groups, n_boot=n_boot, seed=seed))
        if g is not ref and w is not None and ref.withhold is not None:
            d = metrics.paired_difference(_accuracy, (w, dont), (ref.withhold[ev], dont), groups,
                                          n_boot=n_boot, seed=seed)
            rows.append({"dataset": s.dataset, "gate": g.name, "metric": "accuracy − MDL (paper defaults)",
                         "value": d.value, "lo": d.lo, "hi": d.hi, "n": int(ev.sum()),
                         "n_groups": int(len(set(groups))), "mde": d.mde})
    return rows


def condition_table(s: Scored) -> list[dict]:
    """Per memory-set condition (true, swapped, noise, ...), on the evaluation rows: how many sets, the
    share labelled "do not adopt", mean M, R and C_final with each detector, and MDL's Active share with
    each: does R (and so C_final) tell the conflicting and noise-only sets from the clean ones?"""
    ev = ~s.calibration
    out = []
    for cond in sorted(set(s.condition[ev])):
        m = ev & (s.condition == cond)
        c = s.columns
        out.append({
            "dataset": s.dataset, "condition": cond, "n": int(m.sum()),
            "do not adopt": float(np.nanmean(s.dont_adopt[m])) if (~np.isnan(s.dont_adopt[m])).any() else None,
            "M": float(np.mean(c["M"][m])), "R": float(np.mean(c["R"][m])),
            "R (either)": float(np.mean(c["R_either"][m])),
            "phi>0": float(np.mean(c["phi"][m] > 0)), "phi>0 (either)": float(np.mean(c["phi_either"][m] > 0)),
            "C_final": float(np.mean(c["C_final"][m])), "C_final (either)": float(np.mean(c["C_final_either"][m])),
            "Active": float(np.mean(c["action"][m] == ACTIVE)),
            "Active (either)": float(np.mean(c["action_either"][m] == ACTIVE)),
            "Opt-Out": float(np.mean(c["action"][m] == OPT_OUT)),
        })
    return out
