"""Oracle labels and decision scoring for the RQ2-RQ4 analyses (paper Section 5.3).

The oracle action is derived from the realised outcome, never annotated:
  memory injected (B2; B3 under Active or Supp):  hallucinated → reject, safe → adopt
  no memory injected (B1; B3 under Silent/Opt-Out): hallucinated → adopt, safe → reject
(the model without memory hallucinated, so the memory would have been worth a try; it was safe without
memory, so the memory was not needed). Labels are pooled over B1/B2/B3 × seeds × datasets.

Binary decision accuracy: a config predicts 'adopt' iff its action is Active; Supp, Silent and Opt-Out
count as reject (Section 5.3). Every analysis scores records with the *calibrated config of the run*:
run.json beside the records holds per-dataset θ, n_min and n_max, and each record is decided with the
config of its own dataset. Without run.json the config is recalibrated exactly as the run did it (B2
answers on the calibration split as labels, ``mdl_jax.calibrate``); without calibration records the
defaults of ``MDLConfig()`` are used, and the source is reported either way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

import mdl_jax
from mdl_jax import Action, MDLConfig
from mdl_repro.pipeline import ENGINE

EVALUATED = ("B1", "B2", "B3")
INJECTED_ACTIONS = ("ACTIVE", "SUPP")

# The checked reader of the records format lives with the format (the pipeline writes it, the gate
# scorer and every analysis read it); re-exported here, where the analyses have always found it.
from mdl_repro.pipeline.records import REQUIRED, SYSTEMS, RecordsError, load_records  # noqa: E402,F401


def pooled(df):
    """The Section 5.3 record set: successful B1/B2/B3 records (all seeds, all datasets)."""
    return df[df["system"].isin(EVALUATED) & df["ok"]].reset_index(drop=True)


def oracle_labels(df) -> np.ndarray:
    """Section 5.3 oracle: (N,) int 0/1, 1 = adopt the memory.

    ``df`` needs columns system (B1/B2/B3), h (1 = hallucinated) and, for B3, action_name (or action).
    """
    sys_ = df["system"].to_numpy()
    unknown = sorted(set(sys_) - set(EVALUATED))
    if unknown:
        raise ValueError(f"system: oracle labels are defined for B1/B2/B3 only, got {unknown}")
    act = (df["action_name"] if "action_name" in df else df["action"]).to_numpy()
    injected = (sys_ == "B2") | ((sys_ == "B3") & np.isin(act, INJECTED_ACTIONS))
    h = df["h"].to_numpy().astype(bool)
    return np.where(injected, ~h, h).astype(np.int32)


def stratified_folds(y, k: int = 5, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """RECORD-level folds: k (train, test) index pairs of ``sklearn.model_selection.StratifiedKFold``
    (shuffled, ``seed``). The records of a question share its (M, R, A), so these folds put copies of a
    test question's features into training: use ``question_folds``; these remain only for a column
    labelled "record-level" that shows how much leakage flatters a learned model."""
    from sklearn.model_selection import StratifiedKFold

    y = np.asarray(y)
    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return [(tr, te) for tr, te in skf.split(np.zeros((len(y), 1)), y)]


def question_folds(y, groups, k: int = 5, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """k (train, test) index pairs grouped by question and stratified by label
    (``sklearn.model_selection.StratifiedGroupKFold``, shuffled, ``seed``): every record of a question
    (``groups``, e.g. ``stats.question_ids(df)``) falls in one test fold, so no test question is seen in
    training, and each fold's adopt share stays close to the whole set's. The folds of every
    cross-validation of the analyses (Table 7(b), the learned MDL)."""
    from sklearn.model_selection import StratifiedGroupKFold

    y, groups = np.asarray(y), np.asarray(groups)
    if len(np.unique(groups)) < k:
        raise ValueError(f"groups: {k} folds need at least {k} questions, got {len(np.unique(groups))}")
    sgk = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    return [(tr, te) for tr, te in sgk.split(np.zeros((len(y), 1)), y, groups)]


def question_ceiling(df, y) -> dict:
    """What any rule that decides per question can reach on these labels (in sample).

    Every record of a question shares (M, R, A), so a rule on the signals gives all of them the same
    decision; the best it can do on a question is its majority label. Returns ``ceiling`` (Σ_q max(#adopt,
    #reject) / N), ``opposite_pairs`` (share of (dataset, question, seed) with both B1 and B2 whose
    oracle labels differ, i.e. B1 and B2 both hallucinated or both safe) and ``n_pairs``."""
    from mdl_repro.analysis.stats import question_ids

    y = np.asarray(y)
    g = np.unique(question_ids(df), return_inverse=True)[1]
    ones = np.bincount(g, weights=y)
    n = np.bincount(g).astype(float)
    out = {"ceiling": float(np.maximum(ones, n - ones).sum() / len(y)) if len(y) else float("nan")}
    key = df["dataset"].astype(str) + ":" + df["qid"].astype(str) + ":" + df["seed"].astype(str)
    lab: dict[str, dict[str, int]] = {}
    for k, s, v in zip(key.to_numpy(), df["system"].to_numpy(), y):
        if s in ("B1", "B2"):
            lab.setdefault(k, {})[s] = v
    pairs = [d for d in lab.values() if len(d) == 2]
    out["n_pairs"] = len(pairs)
    out["opposite_pairs"] = float(np.mean([d["B1"] != d["B2"] for d in pairs])) if pairs else float("nan")
    return out


ACTION_LABELS = ("Active", "Supp", "Silent", "Opt-Out")
DEGENERATE_SHARE = 0.99  # a controller that takes one action (or one binary decision) this often is constant


def degenerate(action) -> str | None:
    """Why a controller is constant on these records, or None: one of the four actions on ≥ 99% of
    them, or 'adopt' (Active) on ≥ 99% or ≤ 1% (then it equals always-adopt / always-reject).
    ``action``: (N,) int action codes, or a (4,) vector of action counts / shares."""
    a = np.asarray(action)
    share = (a / a.sum()) if a.shape == (4,) and a.dtype.kind == "f" else \
        np.bincount(a.astype(int).ravel(), minlength=4) / max(a.size, 1)
    if share.sum() == 0:
        return None
    top = int(np.argmax(share))
    if share[top] >= DEGENERATE_SHARE:
        return f"degenerate: {share[top]:.0%} {ACTION_LABELS[top]}"
    if share[Action.ACTIVE] <= 1 - DEGENERATE_SHARE:
        return f"degenerate: {share[Action.ACTIVE]:.1%} Active, = always-reject"
    return None


# ------------------------------------------------------------------------------- configs and scoring

class RunConfig(NamedTuple):
    config: MDLConfig
    source: str  # where it came from: "run.json", "recalibrated", "MDLConfig() defaults"
    whole: bool = False  # run.json held the whole config (not only θ, n_min, n_max over Table 2)


def calibration_split(cal, dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(M, R, A, adopt) float32/int32 arrays of a dataset's calibration records (B2 answers: a
    hallucination under injected memory means reject, as ``pipeline.experiment`` labels them)."""
    c = cal[(cal["dataset"] == dataset) & cal["ok"]] if len(cal) else cal
    if len(c) == 0:
        return None
    M, R, A = (c[x].to_numpy(np.float32) for x in ("M", "R", "A"))
    return M, R, A, (1 - c["h"].to_numpy()).astype(np.int32)


def run_configs(records_path, df, cal) -> dict[str, RunConfig]:
    """The calibrated config of each dataset of the run (see the module docstring)."""
    rp = Path(records_path).with_name("run.json")
    recorded = recorded_configs(rp)
    if not os.path.lexists(rp):
        import warnings

        warnings.warn(f"analyze: no run.json beside {records_path}: B3 is scored with a config recalibrated "
                      "on the records' calibration split, or the paper's defaults, which may not be the one "
                      "the run decided with (see the agreement with the recorded actions)", RuntimeWarning,
                      stacklevel=2)
    out = {}
    for ds in sorted(df["dataset"].unique()):
        if ds in recorded:
            out[ds] = recorded[ds]
            continue
        split = calibration_split(cal, ds)
        if split is not None and len(split[0]) >= 2:
            out[ds] = RunConfig(mdl_jax.calibrate(*split).config, "recalibrated")
        else:
            out[ds] = RunConfig(MDLConfig(), "MDLConfig() defaults")
    return out


def recorded_configs(rp: Path) -> dict[str, RunConfig]:
    """The config a run's run.json (``rp``; none: {}) records for each of its datasets: the whole config
    B3 decided with, else its θ, n_min and n_max; a dataset that records neither is left out.

    Raises:
      RecordsError: run.json is damaged (``pipeline.records.read_run_json``) or a dataset's entry is not
        a config, naming the file and the entry.
    """
    from mdl_repro.pipeline.records import read_run_json

    out = {}
    for ds, d in (read_run_json(rp).get("datasets") or {}).items():
        d = d or {}
        if not isinstance(d, dict):
            raise RecordsError(f"{rp}: datasets.{ds} = {json.dumps(d)[:80]} (expected an object)")
        if isinstance(d.get("mdl_config"), dict):   # the whole config B3 decided with
            from mdl_jax.controller.config_file import config_from_dict

            out[ds] = RunConfig(config_from_dict(d["mdl_config"], f"{rp}: datasets.{ds}.mdl_config"),
                                "run.json", True)
        elif all(d.get(k) is not None for k in ("thresholds", "n_min", "n_max")):
            out[ds] = RunConfig(_calibrated(rp, ds, d), "run.json")
    return out


def _calibrated(rp: Path, ds: str, d: dict) -> MDLConfig:
    """The config run.json's ``datasets.<ds>`` calibrated (θ, n_min, n_max; the rest Table 2's)."""
    th, lo, hi = d["thresholds"], d["n_min"], d["n_max"]
    nums = [lo, hi, *th] if isinstance(th, list) else [th]
    if len(nums) != 5 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in nums):
        raise RecordsError(f"{rp}: datasets.{ds}: thresholds = {json.dumps(th)[:80]}, n_min = {json.dumps(lo)}, "
                           f"n_max = {json.dumps(hi)} (expected three numbers and two numbers)")
    try:
        return MDLConfig(thresholds=tuple(float(t) for t in th), n_min=float(lo), n_max=float(hi))
    except ValueError as e:
        raise RecordsError(f"{rp}: datasets.{ds}: {e}") from None


def recalibrate(cal, dataset: str, config: MDLConfig, neutral: dict | None = None) -> MDLConfig | None:
    """``config`` recalibrated (n_min, n_max, θ) on a dataset's calibration split, with the signals in
    ``neutral`` replaced by their constants (as the scored records are); None without a split. Uses
    ``calibrate``'s default tie-break; its constant-classifier warning is silenced here (the analyses
    flag degenerate controllers themselves)."""
    import warnings

    split = calibration_split(cal, dataset)
    if split is None or len(split[0]) < 2:
        return None
    M, R, A, adopt = split
    sig = {"M": M, "R": R, "A": A}
    for k, v in (neutral or {}).items():
        sig[k] = np.full_like(sig[k], v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return mdl_jax.calibrate(sig["M"], sig["R"], sig["A"], adopt, config).config


class Scored(NamedTuple):
    """Per-record controller outputs (N,) for one analysis variant."""

    action: np.ndarray
    C: np.ndarray
    alpha: np.ndarray
    C_final: np.ndarray

    @property
    def adopt(self) -> np.ndarray:
        return (self.action == Action.ACTIVE).astype(np.int32)


def score(df, configs: dict[str, MDLConfig], neutral: dict | None = None) -> Scored:
    """Decide every record with the config of its dataset.

    Args:
      df: records with dataset, M, R, A.
      configs: dataset → MDLConfig.
      neutral: optional {signal name: constant} replacing a signal for every record (Table 6).
    """
    n = len(df)
    out = [np.zeros(n, np.int32)] + [np.zeros(n, np.float32) for _ in range(3)]
    ds = df["dataset"].to_numpy()
    for d in np.unique(ds):
        idx = np.flatnonzero(ds == d)
        sig = {k: df[k].to_numpy(np.float32)[idx] for k in ("M", "R", "A")}
        for k, v in (neutral or {}).items():
            sig[k] = np.full(len(idx), v, np.float32)
        r = mdl_jax.decide(sig["M"], sig["R"], sig["A"], configs[d], validate=False, engine=ENGINE)
        for o, v in zip(out, (r.action, r.C, r.alpha, r.C_final)):
            o[idx] = np.asarray(v)
    return Scored(*out)
