"""What the design can detect: power, judge error, the right constants and the validity of each claim.

  cluster SE        the standard error of a paired difference of rates, clustered by question: the
                    linearised (ratio-estimator) variance Σ_g (s_g − d̄ n_g)² / N² · G / (G − 1) over the
                    G questions (s_g: the question's summed record differences, n_g its records); with
                    equal records per question it is sd(question means) / √G
  MDE               the minimum detectable difference at 80% power, two-sided α = 0.05, for the run's
                    own design: (z_0.975 + z_0.80) · SE = 2.80 · SE from 30 questions on, and
                    (t_0.975 + t_0.80) · SE with G − 1 degrees of freedom below (``metrics.mde_for``)
  power(δ)          Φ(|δ|/SE − z_0.975) + Φ(−|δ|/SE − z_0.975): the chance this design resolves a true
                    difference δ (the paper's reported one, where the paper gives it)
  verdict           an interval excluding 0 states a direction; one including 0 with |difference| < MDE
                    reads "not resolvable with n = G questions × S seeds" (neither direction); one
                    including 0 with |difference| ≥ MDE reads "no difference of the detectable size"
  judge error       the judged gold set (``judges.load_gold_verdicts``) gives, per judge × dataset ×
                    condition (the answer written with / without the memories in its prompt),
                    sensitivity Se = P(judge says hallucinated | gold hallucinated) and specificity Sp.
                    The matrix method (Rogan–Gladen) corrects a cell's judged rate q to
                    p = (q + Sp − 1) / (Se + Sp − 1), per cell (system × B3 action × condition), with
                    the Se, Sp of the cell's condition (B1 answers and B3's Silent ones: without
                    memory; B2 answers and B3's Active / Supp ones: with memory; an Opt-Out
                    abstention is safe and not corrected). p is linear in the verdicts, so any rate
                    of any subset or mixture (B3, the high-risk tier, the oracle's accuracy) is the
                    same weighted mean of per-answer corrected labels (h + Sp − 1) / (Se + Sp − 1):
                    each subset is corrected with its own judged rate, never pulled to the
                    condition's mean. Corrected value: that estimate at the gold set's Se, Sp (a rate
                    clipped to [0, 1] and a difference to [−1, 1] only when reported). Interval:
                    ``N_DRAWS`` draws, each with one (Se, Sp) per condition from Beta(tp + 1, fn + 1),
                    Beta(tn + 1, fp + 1) (Se + Sp > 1), shared by all of that condition's answers,
                    and one question-bootstrap resample that re-estimates every cell's q; the
                    percentiles 2.5 / 97.5 of the draws. Sign holds: the share of those draws (gold
                    uncertainty and sampling together) whose difference has the raw difference's
                    sign. Not identified: a condition whose Youden J = Se + Sp − 1 has its
                    ``J_QUANTILE`` posterior quantile ≤ ``J_FLOOR`` carries too little information
                    to invert; a statistic that uses answers of such a condition (its value moves
                    with that condition's Se or Sp) gets no corrected value, no interval and no
                    sign share.
  run's own gold    where the run folder holds ``gold/gold_labels.jsonl`` (a sample of the run's answers
                    stratified by dataset × system × B3 action, equal answers per cell), the correction
                    is computed a second time with Se, Sp from it (``run_gold_verdicts``): each gold
                    answer weighted by its cell's share of the run's answers in its condition over the
                    cell's gold answers, the weighted counts rescaled to the effective sample size
                    (Kish) for the Beta posteriors; for `ref` also once from the shipped gold set's
                    fresh split alone (``judges.FRESH_RUN``, labelled after its rules froze)
  primary family    run.json's ``primary`` names the confirmatory statistics (``PRIMARY_STATISTICS``)
                    and judges; each gets the cluster-t p (difference / cluster SE, G − 1 d.f.), Holm's
                    step-down adjustment within the family, and TOST equivalence within the declared
                    bound; every other comparison of the report is exploratory
  validity          an RQ2–RQ3 claim is testable with a reader and judge when (i) the judge agrees
                    with the gold set ≥ ``MIN_AGREEMENT`` on answers with and without memory, (ii) the
                    reader answers correctly without memory on ≥ ``MIN_READER`` of the gold set's
                    no-memory answers (kind 'correct'), so that both oracle labels occur for a reason other than the
                    judge's error, and (iii) the judge's verdict on no-memory answers is not coupled to
                    the memory's similarity M: |AUROC(M → B1 judged safe) − 0.5| ≤ ``MAX_COUPLING`` (a
                    no-memory answer never saw the memories; a judge whose verdict tracks M makes the
                    oracle a function of the signal being tested).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from mdl_jax.evaluation.metrics import (  # noqa: F401  (re-exported)
    Z_A,
    Z_B,
    auroc_weighted,
    cluster_se,
    mde,
    mde_for,
)
from mdl_repro.analysis.stats import family_note, p3, power, verdict

N_DRAWS = 1000
N_J_DRAWS = 20_000  # posterior draws behind J's quantile: enough for its second decimal
J_QUANTILE = 0.05
J_FLOOR = 0.05  # a condition is identified when J's 5% posterior quantile exceeds this
CONDITIONS = ("memory", "no memory")
METHOD = ("matrix method (Rogan–Gladen) per cell, one Se/Sp draw per condition, question bootstrap; "
          f"not identified where J = Se + Sp − 1 has its {J_QUANTILE:.0%} posterior quantile ≤ {J_FLOOR:.2f}")
MIN_AGREEMENT = 0.80
MIN_READER = 0.20
MAX_COUPLING = 0.15
NEAR_DEGENERATE = 0.05  # an adopt share ≤ 5% or ≥ 95% is always-reject / always-adopt in all but name


# ------------------------------------------------------------------------------------- power

def design(a, b, groups, seeds=None, paper_effect: float | None = None) -> dict:
    """Paired difference mean(a − b) with its cluster bootstrap CI, cluster SE, MDE, the power for the
    paper's effect and the verdict. a, b: (N,) per-record values; groups: (N,) question ids."""
    from mdl_jax.evaluation.metrics import cluster_bootstrap_diff

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = a - b
    se = cluster_se(d, groups)
    ci = cluster_bootstrap_diff(a, b, groups)
    n_q = int(len(np.unique(groups)))
    n_s = int(len(np.unique(seeds))) if seeds is not None else 1
    out: dict[str, Any] = {"diff": float(d.mean()) if len(d) else float("nan"), "ci": list(ci), "se": se,
                           "mde": mde_for(se, n_q), "n_questions": n_q, "n_seeds": n_s, "n": int(len(d))}
    out["p"] = cluster_t_p(out["diff"], se, n_q)
    out["verdict"] = verdict(out["diff"], ci, out["mde"], n_q, n_s)
    out["resolvable"] = not out["verdict"].startswith(("not resolvable", "no difference"))
    if paper_effect is not None:
        out["paper_effect"] = float(paper_effect)
        out["power_paper"] = power(paper_effect, se)
    return out


def cluster_t_p(diff: float, se: float, n_groups: int) -> float:
    """Two-sided p of a paired difference from its cluster t: diff / SE against Student's t with
    G − 1 degrees of freedom (G questions: the SE is estimated from G clusters).

    Args:
      diff: the difference.
      se: its cluster standard error.
      n_groups: G.

    Returns:
      The p-value; nan for G < 2 or a SE that is not positive (1.0 where diff and SE are both 0).
    """
    from scipy.stats import t as student

    if n_groups < 2 or not (np.isfinite(diff) and np.isfinite(se)):
        return float("nan")
    if se <= 0:
        return 1.0 if diff == 0 else float("nan")
    return float(2 * student.sf(abs(diff) / se, n_groups - 1))


def tost(diff: float, se: float, n_groups: int, bound: float) -> dict:
    """Two one-sided tests (TOST) of equivalence within ±``bound`` for a paired difference, on the
    cluster t with G − 1 degrees of freedom: equivalent at the 5% level when both one-sided p are
    below 0.05 (the 90% t interval lies inside ±bound).

    Args:
      diff: the difference.
      se: its cluster standard error.
      n_groups: G questions.
      bound: the equivalence margin (> 0), on the difference's scale.

    Returns:
      {"bound", "p" (the larger one-sided p), "ci90" ([lo, hi]), "equivalent" (bool)}.

    Raises:
      ValueError: ``bound`` is not positive.
    """
    from scipy.stats import t as student

    if not bound > 0:
        raise ValueError(f"bound: expected an equivalence margin > 0, got {bound!r}")
    if n_groups < 2 or not (np.isfinite(diff) and np.isfinite(se)) or se <= 0:
        return {"bound": float(bound), "p": float("nan"), "ci90": [float("nan")] * 2, "equivalent": False}
    df_ = n_groups - 1
    p_lo = float(student.sf((diff + bound) / se, df_))    # H0: diff ≤ −bound
    p_hi = float(student.cdf((diff - bound) / se, df_))   # H0: diff ≥ +bound
    q = float(student.ppf(0.95, df_))
    p = max(p_lo, p_hi)
    return {"bound": float(bound), "p": p, "ci90": [diff - q * se, diff + q * se], "equivalent": bool(p < 0.05)}


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values of a family (nan entries stay nan and do not count).

    Args:
      p: (K,) unadjusted p-values.

    Returns:
      (K,) adjusted p-values, each min(1, max over the steps so far of (K' − rank) · p), K' the
      finite ones.
    """
    p = np.asarray(p, np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    k = len(ok)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (k - rank) * p[i]))
        out[i] = running
    return out


# ------------------------------------------------------------------------------------- AUROC

def auroc(score, pos) -> float:
    """AUROC of ``score`` (N,) for the binary ``pos`` (N,): P(score of a positive > a negative's), ties ½."""
    return float(auroc_weighted(score, pos, np.ones((1, len(np.asarray(score))))).item())


def auroc_ci(score, pos, groups, n_boot: int = 400, seed: int = 0) -> dict:
    """AUROC with a 95% question-bootstrap interval and its n."""
    from mdl_jax.evaluation.metrics import question_bootstrap_weights

    a = auroc(score, pos)
    w = question_bootstrap_weights(groups, n_boot, seed)
    bs = auroc_weighted(score, pos, w)
    bs = bs[np.isfinite(bs)]
    lo, hi = (np.percentile(bs, [2.5, 97.5]) if len(bs) else (np.nan, np.nan))
    return {"auroc": a, "ci": [float(lo), float(hi)], "n": int(np.isfinite(np.asarray(score, float)).sum()),
            "n_positive": int(np.asarray(pos, bool).sum())}


# ------------------------------------------------------------------------------------- judge error

def confusion(gv, judge: str) -> dict:
    """{dataset: {condition: {tp, fp, fn, tn, n, se, sp, agreement}}} of one judge on the judged gold set
    ``gv`` (``judges.load_gold_verdicts``, or ``run_gold_verdicts``); conditions 'memory' and 'no memory'
    (abstentions are safe by construction and left out).

    Where ``gv`` has a ``weight`` column (a stratified gold sample, ``run_gold_verdicts``), the counts
    are weighted sums rescaled to the condition's effective sample size (Kish: (Σw)² / Σw²), so that
    Se, Sp are the weighted estimates and their Beta posteriors are no narrower than the sample
    supports; "n" stays the answers behind them and "n_eff" is added."""
    out: dict = {}
    for (ds, cond), d in gv.groupby(["dataset", "condition"]):
        if cond not in ("memory", "no memory"):
            continue
        j, g = d[f"judge_{judge}"].astype(bool).to_numpy(), d["gold"].astype(bool).to_numpy()
        w = d["weight"].to_numpy(np.float64) if "weight" in d else np.ones(len(d))
        n_eff = float(w.sum() ** 2 / (w ** 2).sum()) if (w ** 2).sum() > 0 else 0.0
        k = n_eff / w.sum() if w.sum() > 0 else 0.0
        tp, fp = k * float(w[j & g].sum()), k * float(w[j & ~g].sum())
        fn, tn = k * float(w[~j & g].sum()), k * float(w[~j & ~g].sum())
        if "weight" not in d:
            tp, fp, fn, tn = int(round(tp)), int(round(fp)), int(round(fn)), int(round(tn))
        c = {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "n": int(len(d)),
             "se": tp / (tp + fn) if tp + fn else float("nan"), "sp": tn / (tn + fp) if tn + fp else float("nan"),
             "agreement": float((tp + tn) / (tp + fp + fn + tn)) if len(d) and n_eff > 0 else float("nan")}
        if "weight" in d:
            c["n_eff"] = n_eff
        out.setdefault(ds, {})[cond] = c
    return out


def run_gold_verdicts(gold, ev) -> tuple[Any, dict]:
    """A run's own gold labels (``<run>/gold/gold_labels.jsonl``: a sample stratified by dataset × system
    × B3 action, equal answers per cell) as a judged gold set for ``confusion``, each answer weighted
    so that a condition's Se / Sp estimate the run's answers in that condition.

    Each gold answer's condition is its answer's (B1, and B3 under Silent: no memory; B2, and B3 under
    Active / Supp: with memory); its weight is its cell's share of the run's paired answers in that
    condition divided by the cell's gold answers. Cells of the run with no gold answer cannot be
    represented; the covered cells' shares are renormalised and the covered share is returned.

    Args:
      gold: the gold labels (DataFrame with dataset, qid, seed, system, b3_action, label and
        judge_<name> columns).
      ev: the run's records (``oracle.load_records``).

    Returns:
      (frame with dataset, condition, gold, weight, cell and the judge columns; {dataset: {condition:
      covered share of the run's answers}}).

    Raises:
      ValueError: ``gold`` lacks a needed column.
    """
    import pandas as pd

    need = {"dataset", "system", "b3_action", "label"}
    if not need <= set(gold.columns):
        raise ValueError(f"gold: expected columns {sorted(need)}, missing {sorted(need - set(gold.columns))}")
    P = paired_frame(ev, "hallucinated")
    cells = []
    for s in ("B1", "B2", "B3"):
        a = P["action"].to_numpy()
        keep = a != "OPT_OUT" if s == "B3" else np.ones(len(P), bool)
        cells.append(pd.DataFrame({"dataset": P["dataset"].to_numpy()[keep], "system": s, "b3_action": a[keep]}))
    run = pd.concat(cells, ignore_index=True)
    run["condition"] = [_condition(s, a) for s, a in zip(run["system"], run["b3_action"])]
    n_run = run.groupby(["dataset", "condition", "system", "b3_action"]).size()
    g = gold[gold["system"].isin(("B1", "B2", "B3"))
             & ~((gold["system"] == "B3") & (gold["b3_action"] == "OPT_OUT"))].copy()
    g["condition"] = [_condition(s, a) for s, a in zip(g["system"], g["b3_action"])]
    g["gold"] = g["label"].eq("hallucinated")
    n_gold = g.groupby(["dataset", "condition", "system", "b3_action"]).size()
    covered: dict = {}
    w = np.zeros(len(g))
    for (ds, cond), tot in run.groupby(["dataset", "condition"]).size().items():
        cells_run = n_run.loc[(ds, cond)]
        have = [c for c in cells_run.index if (ds, cond, *c) in n_gold.index]
        cov = float(cells_run.loc[have].sum() / tot) if have else 0.0
        covered.setdefault(ds, {})[cond] = cov
        for c in have:
            m = ((g["dataset"] == ds) & (g["condition"] == cond) & (g["system"] == c[0])
                 & (g["b3_action"] == c[1])).to_numpy()
            w[m] = (cells_run.loc[c] / tot / max(cov, 1e-12)) / n_gold.loc[(ds, cond, *c)]
    g["weight"] = w
    g["cell"] = g["system"] + " / " + g["b3_action"]
    return g[g["weight"] > 0].reset_index(drop=True), covered


def _condition(system: str, b3_action) -> str:
    if system == "B2" or (system == "B3" and b3_action in ("ACTIVE", "SUPP")):
        return "memory"
    return "no memory"


def rogan_gladen(q: float, se: float, sp: float) -> float:
    """The prevalence corrected for a judge of sensitivity ``se`` and specificity ``sp``, clipped to
    [0, 1] (nan where Se + Sp ≤ 1: the judge carries no information)."""
    j = se + sp - 1
    if not np.isfinite(j) or j <= 0:
        return float("nan")
    return float(min(max((q + sp - 1) / j, 0.0), 1.0))


def youden_draws(c: dict, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(n,) draws of Se ~ Beta(tp + 1, fn + 1) and Sp ~ Beta(tn + 1, fp + 1) for one condition's gold
    counts ``c`` (``confusion``): the posterior under uniform priors."""
    return rng.beta(c["tp"] + 1, c["fn"] + 1, size=n), rng.beta(c["tn"] + 1, c["fp"] + 1, size=n)


def identification(c: dict, *, n: int = N_J_DRAWS, seed: int = 0) -> dict:
    """Whether a judge's error is correctable in one condition (module docstring): Youden's
    J = Se + Sp − 1 at the gold counts ``c``, its lower ``J_QUANTILE`` posterior quantile, and
    ``identified`` = that quantile > ``J_FLOOR``.

    Args:
      c: one condition's gold counts ({tp, fp, fn, tn}, ``confusion``).
      n: posterior draws for the quantile.
      seed: their seed (fixed, so a report is reproducible).

    Returns:
      {"j", "j_q05", "identified"}.
    """
    se, sp = youden_draws(c, n, np.random.default_rng(seed))
    j = (c["tp"] / max(c["tp"] + c["fn"], 1)) + (c["tn"] / max(c["tn"] + c["fp"], 1)) - 1
    q = float(np.quantile(se + sp - 1, J_QUANTILE))
    return {"j": float(j), "j_q05": q, "identified": bool(q > J_FLOOR)}


def paired_frame(ev, judge_col: str):
    """One row per (dataset, qid, seed) with B1, B2 and B3 all answered: h1, h2, h3 (the judge's 0/1),
    action, A, M, C_final, and whether B3's answer is B2's (Active) / B1's (Silent) answer verbatim."""
    import pandas as pd

    ok = ev[ev["ok"] & ev["system"].isin(("B1", "B2", "B3"))]
    keys = ["dataset", "qid", "seed"]
    parts = []
    for s in ("B1", "B2", "B3"):
        sub = ok[ok["system"] == s].set_index(keys)
        cols = {judge_col: f"h{s[1]}", "answer": f"ans{s[1]}"}
        if s == "B3":
            cols.update(action="action", C_final="C_final")
        if s == "B2":
            cols.update(A="A", M="M", R="R")
        parts.append(sub[[c for c in cols if c in sub]].rename(columns=cols))
    P = pd.concat(parts, axis=1, join="inner").reset_index()
    P = P.dropna(subset=["h1", "h2", "h3", "action"])
    for c in ("h1", "h2", "h3"):
        P[c] = P[c].astype(float)
    if "ans3" in P:
        P["same2"] = (P["action"] == "ACTIVE") & (P["ans3"] == P["ans2"])
        P["same1"] = (P["action"] == "SILENT") & (P["ans3"] == P["ans1"])
    else:
        P["same2"] = P["same1"] = False
    return P.reset_index(drop=True)


def _labels(P, se_sp: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, N) corrected labels (h + Sp − 1) / (Se + Sp − 1) of B1, B2 and B3 under ``se_sp``
    ({condition: (Se (T, 1), Sp (T, 1))}): B1 answers are 'no memory', B2 answers 'memory', a B3
    answer takes the condition of its action (Active / Supp: memory; Opt-Out: an abstention, safe
    and uncorrected; else no memory), and a B3 answer that is B1's or B2's verbatim takes its label."""
    def fix(h, cond):
        se, sp = se_sp[cond]
        return (h[None, :] + sp - 1) / (se + sp - 1)

    h1, h2, h3 = (P[c].to_numpy(np.float64) for c in ("h1", "h2", "h3"))
    act = P["action"].to_numpy()
    H1, H2 = fix(h1, "no memory"), fix(h2, "memory")
    H3 = np.where(np.isin(act, ("ACTIVE", "SUPP"))[None, :], fix(h3, "memory"), fix(h3, "no memory"))
    same2, same1 = P["same2"].to_numpy(bool), P["same1"].to_numpy(bool)
    H3 = np.where(same2[None, :], H2, np.where(same1[None, :], H1, H3))
    H3 = np.where((act == "OPT_OUT")[None, :], 0.0, H3)
    return H1, H2, H3


def relabel(P, conf: dict, *, n_draws: int = N_DRAWS, seed: int = 0,
            bootstrap: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Draws of every answer's corrected label for one dataset's paired frame (module docstring).

    Each draw takes one (Se, Sp) per condition from its Beta posterior, conditioned on Se + Sp > 1
    (a judge worse than chance is not a judge), and shares it among all of that condition's answers
    (B2's and B3's with-memory answers one draw, B1's and B3's without-memory answers the other). A
    weighted mean of the labels is the matrix-method (Rogan–Gladen) rate of that subset at that draw,
    so under the bootstrap multiplicities every rate is re-estimated in every resample.

    Args:
      P: ``paired_frame`` rows of one dataset, N of them.
      conf: {condition: counts} of the judge on that dataset (``confusion``).
      n_draws: T.
      seed: the draws' seed (the bootstrap uses seed + 1).
      bootstrap: also resample questions.

    Returns:
      H1, H2, H3: (T, N) corrected labels (real-valued; a mean over records is a corrected rate);
      W: (T, N) question-bootstrap multiplicities (ones without ``bootstrap``).

    Raises:
      ValueError: ``conf`` lacks a condition, or ``n_draws`` < 1.
    """
    from mdl_jax.evaluation.metrics import question_bootstrap_weights

    missing = [k for k in CONDITIONS if k not in conf]
    if missing:
        raise ValueError(f"conf: expected gold counts for conditions {CONDITIONS}, missing {missing}")
    if n_draws < 1:
        raise ValueError(f"n_draws: expected ≥ 1, got {n_draws}")
    rng = np.random.default_rng(seed)
    T = n_draws
    se_sp = {}
    for cond in CONDITIONS:
        se, sp = np.empty(0), np.empty(0)
        for _ in range(100):  # rejection: keep draws with Se + Sp > 1
            a, b = youden_draws(conf[cond], 2 * T, rng)
            keep = a + b > 1
            se, sp = np.r_[se, a[keep]], np.r_[sp, b[keep]]
            if len(se) >= T:
                break
        if len(se) < T:  # a judge the gold set places below chance throughout: no draw is a judge
            se, sp = np.full(T, np.nan), np.full(T, np.nan)
        se_sp[cond] = (se[:T, None], sp[:T, None])
    H1, H2, H3 = _labels(P, se_sp)
    W = (question_bootstrap_weights(P["qid"].to_numpy(), T, seed + 1).astype(np.float64) if bootstrap
         else np.ones((T, len(P))))
    return H1, H2, H3, W


def _stats(H1, H2, H3, W, P) -> dict:
    """Every judged statistic of a dataset's paired records, per draw: (T,) arrays. The labels may be
    0/1 verdicts or real-valued corrected labels: every statistic is linear in them but the constant's
    max(adopt rate, reject rate)."""
    from mdl_jax.signals.risk import HIGH_RISK

    act = P["action"].to_numpy()
    opt = (act == "OPT_OUT")[None, :]
    adopt = (act == "ACTIVE")[None, :].astype(np.float64)
    hi = (P["A"].to_numpy(np.float64) >= HIGH_RISK)[None, :]
    qid = P["qid"].to_numpy()
    G = len(np.unique(qid))
    k = len(np.unique(qid[act == "OPT_OUT"]))

    def rate(H, m=None):
        w = W if m is None else W * m
        return np.sum(w * H, 1) / np.maximum(np.sum(w, 1), 1e-12)

    def correct(y):  # P(decision == label), exact for 0/1 labels, the expectation for corrected ones
        return adopt * y + (1 - adopt) * (1 - y)

    out = {}
    for s, H in (("B1", H1), ("B2", H2), ("B3", H3)):
        out[f"rate_{s}"] = rate(H)
        out[f"high_risk_{s}"] = rate(H, hi)
    out["B3-B2"] = out["rate_B3"] - out["rate_B2"]
    out["B3-B1"] = out["rate_B3"] - out["rate_B1"]
    out["B2-B1"] = out["rate_B2"] - out["rate_B1"]
    out["B3-B2 high-risk"] = out["high_risk_B3"] - out["high_risk_B2"]
    out["B3-random abstention"] = out["rate_B3"] - rate(H2) * (1 - k / max(G, 1))
    out["selective risk B3-B2"] = rate(H3, ~opt) - out["rate_B2"]
    # Section 5.3 oracle on the three records of each (question, seed); MDL adopts iff Active
    y1, y2 = H1, 1 - H2
    y3 = np.where(np.isin(act, ("ACTIVE", "SUPP"))[None, :], 1 - H3, H3)
    c12 = correct(y1) + correct(y2)
    c3 = correct(y3)
    n = np.sum(W, 1)
    acc = (np.sum(W * (c12 + c3), 1)) / (3 * n)
    yr = np.sum(W * (y1 + y2 + y3), 1) / (3 * n)
    out["MDL accuracy"] = acc
    out["MDL-constant"] = acc - np.maximum(yr, 1 - yr)
    acc12 = np.sum(W * c12, 1) / (2 * n)
    y12 = np.sum(W * (y1 + y2), 1) / (2 * n)
    out["MDL-constant (B1+B2 records)"] = acc12 - np.maximum(y12, 1 - y12)
    return out


COMPARED = ("B3-B2", "B3-B2 high-risk", "B3-B1", "B2-B1", "B3-random abstention", "selective risk B3-B2",
            "MDL-constant", "MDL-constant (B1+B2 records)")


def _is_rate(k: str) -> bool:
    return k.startswith(("rate_", "high_risk_")) or k == "MDL accuracy"


def _uses(P) -> dict:
    """{statistic: the conditions whose Se / Sp it depends on}: a condition counts where moving its
    Se or Sp moves the statistic (a difference of two answers that are one answer uses neither)."""
    base = {k: (np.full((1, 1), 0.8), np.full((1, 1), 0.8)) for k in CONDITIONS}
    one = np.ones((1, len(P)))
    ref = _stats(*_labels(P, base), one, P)
    out: dict[str, list] = {k: [] for k in ref}
    for cond in CONDITIONS:
        for shift in ((0.05, 0.0), (0.0, 0.05)):
            moved = dict(base, **{cond: (base[cond][0] + shift[0], base[cond][1] + shift[1])})
            s = _stats(*_labels(P, moved), one, P)
            for k in ref:
                if abs(float(s[k][0]) - float(ref[k][0])) > 1e-9 and cond not in out[k]:
                    out[k].append(cond)
    return out


def judge_error(ev, gv, judge: str, judge_col: str, *, n_draws: int = N_DRAWS, seed: int = 0) -> dict:
    """Per dataset: raw and judge-error-corrected rates and every compared difference (module docstring).

    Args:
      ev: the run's records with the judge's verdicts in ``judge_col``.
      gv: the judged gold set (``judges.load_gold_verdicts``).
      judge: the judge's name in ``gv`` (column ``judge_<name>``).
      judge_col: the verdict column of ``ev``.
      n_draws: draws (each one Se / Sp per condition and one question-bootstrap resample).
      seed: their seed.

    Returns:
      {dataset: {"confusion", "identification" ({condition: ``identification``}), "n", "n_questions",
      "rogan_gladen" ({B1, B2}: the clipped Rogan–Gladen rate, nan where not identified), "method",
      "stats": {statistic: {"raw", "corrected", "ci", "identified", "uses", "clipped", ["sign_holds"],
      ["not_identified"]}}}}; "corrected" is the matrix-method estimate at the gold set's Se / Sp (rates
      clipped to [0, 1], differences to [−1, 1]), "ci" the 2.5 / 97.5 percentiles of the draws, and
      "sign_holds" (compared differences) the share of draws with the raw difference's sign; all three
      nan where a condition the statistic uses is not identified. A dataset without gold answers in both
      conditions gets {"note"} only.
    """
    conf = confusion(gv, judge)
    out: dict = {}
    if judge_col not in ev or ev[judge_col].isna().all():
        return out
    P_all = paired_frame(ev, judge_col)
    for ds in sorted(P_all["dataset"].unique()):
        c = conf.get(ds, {})
        if not all(k in c for k in CONDITIONS):
            out[ds] = {"note": "no gold answers of this dataset in both conditions"}
            continue
        P = P_all[P_all["dataset"] == ds].reset_index(drop=True)
        one = np.ones((1, len(P)))
        r1, r2, r3 = (P[x].to_numpy(np.float64)[None, :] for x in ("h1", "h2", "h3"))
        raw = _stats(r1, r2, r3, one, P)
        ident = {k: identification(c[k], seed=seed) for k in CONDITIONS}
        point_se_sp = {k: (np.full((1, 1), c[k]["se"]), np.full((1, 1), c[k]["sp"])) for k in CONDITIONS}
        with np.errstate(divide="ignore", invalid="ignore"):
            point = _stats(*_labels(P, point_se_sp), one, P)
        boot = _stats(*relabel(P, c, n_draws=n_draws, seed=seed + 7, bootstrap=True), P)
        uses = _uses(P)
        rg = {}
        for system, cond in (("B1", "no memory"), ("B2", "memory")):
            q = float(P[f"h{system[1]}"].mean())
            rg[system] = rogan_gladen(q, c[cond]["se"], c[cond]["sp"]) if ident[cond]["identified"] else float("nan")
        d: dict = {"confusion": c, "identification": ident, "n": int(len(P)),
                   "n_questions": int(P["qid"].nunique()), "rogan_gladen": rg, "method": METHOD}
        for k in raw:
            r = float(raw[k][0])
            lo_, hi_ = (0.0, 1.0) if _is_rate(k) else (-1.0, 1.0)
            bad = [cond for cond in uses[k] if not ident[cond]["identified"]]
            s: dict = {"raw": r, "identified": not bad, "uses": uses[k]}
            if bad:
                s.update(corrected=float("nan"), ci=[float("nan")] * 2, clipped=False,
                         not_identified=" and ".join(
                             f"Se + Sp − 1 {'with' if cond == 'memory' else 'without'} memory "
                             f"({J_QUANTILE:.0%} quantile {ident[cond]['j_q05']:+.2f} ≤ {J_FLOOR:.2f})" for cond in bad))
                if k in COMPARED:
                    s["sign_holds"] = float("nan")
            else:
                p = float(point[k][0])
                b = boot[k][np.isfinite(boot[k])]
                ci = np.percentile(b, [2.5, 97.5]) if len(b) else np.full(2, np.nan)
                s.update(corrected=float(np.clip(p, lo_, hi_)), ci=[float(x) for x in np.clip(ci, lo_, hi_)],
                         clipped=bool(p < lo_ or p > hi_))
                if k in COMPARED:
                    s["sign_holds"] = float(np.mean(np.sign(b) == np.sign(r))) if r != 0 and len(b) else float("nan")
            d.setdefault("stats", {})[k] = s
        out[ds] = d
    return out


# ------------------------------------------------------------------------------------- validity

def validity(ev, gv, judge: str, judge_col: str, corrected: dict | None = None) -> dict:
    """Per dataset: the three conditions of the module docstring under one judge, and 'testable'."""
    conf = confusion(gv, judge) if gv is not None else {}
    out: dict = {}
    if judge_col not in ev or ev[judge_col].isna().all():
        return out
    P_all = paired_frame(ev, judge_col)
    for ds in sorted(P_all["dataset"].unique()):
        P = P_all[P_all["dataset"] == ds]
        safe1 = P["h1"].to_numpy() < 0.5
        M = P["M"].to_numpy(np.float64)
        med = np.median(M)
        above, below = M > med, M <= med
        cp = auroc_ci(M, safe1, P["qid"].to_numpy(), n_boot=200)
        # the reader's accuracy without memory: the gold labellers' share of no-memory answers that are
        # correct (kind 'correct'; a non-answer is safe but not correct), with its Wilson interval
        from mdl_repro.analysis.judges import wilson

        gn = gv[(gv["dataset"] == ds) & (gv["condition"] == "no memory")] if gv is not None else None
        if gn is not None and len(gn) and "kind" in gn:
            k_ok = int((gn["kind"] == "correct").sum())
            reader, reader_ci, reader_n = k_ok / len(gn), list(wilson(k_ok, len(gn))), int(len(gn))
        else:
            reader, reader_ci, reader_n = float("nan"), [float("nan")] * 2, 0
        reader_raw = float(safe1.mean())
        c = conf.get(ds, {})
        ag = {k: c[k]["agreement"] for k in ("memory", "no memory") if k in c}
        d = {"reader_accuracy_no_memory": reader, "reader_accuracy_no_memory_ci": reader_ci,
             "reader_accuracy_n_gold": reader_n, "b1_judged_safe": reader_raw,
             "agreement": ag, "n_gold": {k: c[k]["n"] for k in ag},
             "b1_hallucinated_above_median_M": float(1 - safe1[above].mean()) if above.any() else float("nan"),
             "b1_hallucinated_below_median_M": float(1 - safe1[below].mean()) if below.any() else float("nan"),
             "auroc_M_b1_safe": cp}
        reasons = []
        if not ag or min(ag.values()) < MIN_AGREEMENT:
            reasons.append("the judge agrees with the gold set on " + (" / ".join(
                f"{v:.2f} ({k})" for k, v in ag.items()) or "no gold answers") + f" (< {MIN_AGREEMENT:.2f})")
        if not np.isfinite(reader) or reader < MIN_READER:
            reasons.append(f"the reader answers correctly without memory {reader:.0%} of the time "
                           f"(< {MIN_READER:.0%})")
        if np.isfinite(cp["auroc"]) and abs(cp["auroc"] - 0.5) > MAX_COUPLING:
            reasons.append(f"the judge's verdict on no-memory answers tracks M (AUROC of M for 'B1 safe' "
                           f"{cp['auroc']:.2f})")
        d["testable"] = not reasons
        d["reasons"] = reasons
        out[ds] = d
    return out


# ------------------------------------------------------------------------------------- the lot

def per_dataset_constant(df, y) -> dict:
    """The constant each per-dataset calibrated controller must beat: each dataset's majority label
    (its accuracy there), and pooled: the record-weighted mean of those (not the pooled majority)."""
    ds = df["dataset"].to_numpy()
    y = np.asarray(y)
    out = {}
    corr = np.zeros(len(y))
    for d in np.unique(ds):
        m = ds == d
        lab = int(y[m].mean() > 0.5)
        corr[m] = y[m] == lab
        out[d] = {"label": "adopt" if lab else "reject", "accuracy": float(corr[m].mean()), "n": int(m.sum())}
    return {"by_dataset": out, "pooled": float(corr.mean()) if len(y) else float("nan"), "correct": corr}


def rigour(ev, df, labels: dict, sc, qid, gv=None, comparisons=None, *, n_draws: int = N_DRAWS,
           run_gold=None, primary: dict | None = None) -> dict:
    """Every statistic of this module for a run: per judge the decision accuracy against the per-dataset
    constant (with its MDE), the free Opt-Out records, the accuracy on B1+B2 records, the judge-error
    correction (from the shipped gold set; for `ref` also from its fresh split; and from the run's own
    gold labels ``run_gold`` where given) and the validity of each RQ2–RQ3 claim; the power of every
    system comparison; the declared primary family (``primary``, run.json's) Holm-adjusted."""
    from mdl_repro.analysis import stats
    from mdl_repro.analysis.judges import FRESH_RUN
    from mdl_repro.analysis.selective import JUDGES

    res: dict = {"gold_available": gv is not None, "by_judge": {}}
    gv_run = None
    if run_gold is not None:
        gv_run, covered = run_gold_verdicts(run_gold, ev)
        res["run_gold"] = {"n": int(len(gv_run)), "covered": covered,
                           "cells": {ds: {c: int(n) for c, n in d.groupby("cell").size().items()}
                                     for ds, d in gv_run.groupby("dataset")}}
    sys_ = df["system"].to_numpy()
    act = (df["action_name"] if "action_name" in df else df["action"]).to_numpy()
    seeds = df["seed"].to_numpy()
    for j, y in labels.items():
        y = np.asarray(y)
        corr = (sc.adopt == y).astype(float)
        const = per_dataset_constant(df, y)
        r: dict = {"constant": {k: v for k, v in const.items() if k != "correct"}}
        r["vs_constant"] = design(corr, const["correct"], qid, seeds)
        for ds in sorted(df["dataset"].unique()):
            m = df["dataset"].to_numpy() == ds
            r.setdefault("vs_constant_by_dataset", {})[ds] = design(corr[m], const["correct"][m], qid[m], seeds[m])
        opt = (sys_ == "B3") & (act == "OPT_OUT")
        r["opt_out_free"] = {"n": int(opt.sum()), "correct": int(corr[opt].sum())}
        b12 = np.isin(sys_, ("B1", "B2"))
        const12 = per_dataset_constant(df[b12], y[b12])
        r["b1b2_only"] = {"accuracy": float(corr[b12].mean()), "constant": const12["pooled"],
                          **design(corr[b12], const12["correct"], qid[b12], seeds[b12])}
        col = JUDGES.get(j)
        if col is not None and col in ev and not ev[col].isna().all():
            # B3 against random abstention on as many questions, with its MDE (per dataset)
            P_all = paired_frame(ev, col)
            for ds in sorted(P_all["dataset"].unique()):
                p = P_all[P_all["dataset"] == ds]
                q = p["qid"].to_numpy()
                k = len(np.unique(q[p["action"].to_numpy() == "OPT_OUT"]))
                G = len(np.unique(q))
                r.setdefault("b3_vs_random", {})[ds] = design(
                    p["h3"].to_numpy(), p["h2"].to_numpy() * (1 - k / max(G, 1)), q, p["seed"].to_numpy())
        if gv is not None and col is not None:
            r["judge_error"] = judge_error(ev, gv, j, col, n_draws=n_draws)
            r["validity"] = validity(ev, gv, j, col, r["judge_error"])
            if j == "ref" and "run" in gv:
                fresh = gv[gv["run"] == FRESH_RUN]
                if len(fresh):
                    r["judge_error_fresh"] = judge_error(ev, fresh, j, col, n_draws=n_draws)
        if gv_run is not None and col is not None and f"judge_{j}" in gv_run:
            r["judge_error_run_gold"] = judge_error(ev, gv_run, j, col, n_draws=n_draws)
        if col is not None and col in ev and not ev[col].isna().all():
            P_all = paired_frame(ev, col)
            for ds in sorted(P_all["dataset"].unique()):
                p = P_all[P_all["dataset"] == ds]
                r.setdefault("b3_minus_b2", {})[ds] = design(p["h3"].to_numpy(), p["h2"].to_numpy(),
                                                             p["qid"].to_numpy(), p["seed"].to_numpy())
        res["by_judge"][j] = r
    if comparisons is not None:
        res["comparisons"] = [{k: c[k] for k in ("a", "b", "dataset", "high_risk", "diff", "ci_lo", "ci_hi", "se", "n_questions", "n_seeds",
                                                  "mde", "power_paper", "paper_effect", "verdict")
                               if k in c} for c in comparisons]
    _ = stats
    res["primary"] = primary_family(res, primary)
    return res


# ------------------------------------------------------------------------------------- the primary family

# what each name of a declared family reads: (the per-judge result's key, dataset or None for pooled)
PRIMARY_STATISTICS = {
    "truthfulqa: B3 - B2": ("b3_minus_b2", "truthfulqa"),
    "truthfulqa: B3 - random abstention": ("b3_vs_random", "truthfulqa"),
    "pooled: MDL - per-dataset constant": ("vs_constant", None),
}


def check_primary(declared) -> None:
    """Check a primary-family declaration (run.json's ``primary``, written by hand after a run) before
    any analysis runs; None or empty declares none.

    Raises:
      ValueError: naming the first field that is not what ``primary_family`` reads: an object whose
        ``family`` is a non-empty list of names of ``PRIMARY_STATISTICS``, ``judges`` a non-empty list
        of strings, ``alpha`` a number in (0, 1) and ``equivalence_bound`` a number > 0 (both
        optional), ``declared`` and ``note`` strings (optional).
    """
    import math

    if not declared:
        return
    if not isinstance(declared, dict):
        raise ValueError(f"primary: expected an object, got {json.dumps(declared)[:80]}")
    fam, judges = declared.get("family"), declared.get("judges")
    for name, v in (("family", fam), ("judges", judges)):
        if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
            raise ValueError(f"primary: {name}: expected a non-empty list of names, got {json.dumps(v)[:80]}")
    bad = [f for f in declared["family"] if f not in PRIMARY_STATISTICS]
    if bad:
        raise ValueError(f"primary: unknown statistics {bad}; expected names from {sorted(PRIMARY_STATISTICS)}")
    for name, lo, hi in (("alpha", 0.0, 1.0), ("equivalence_bound", 0.0, math.inf)):
        v = declared.get(name, 0.05)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo < v < hi:
            raise ValueError(f"primary: {name}: expected a number in ({lo:g}, {hi:g}), got {json.dumps(v)[:80]}")
    for name in ("declared", "note"):
        if declared.get(name) is not None and not isinstance(declared[name], str):
            raise ValueError(f"primary: {name}: expected a string, got {json.dumps(declared[name])[:80]}")


def primary_family(res: dict, declared: dict | None) -> dict:
    """The declared primary family (run.json's ``primary``): each named statistic under each named
    judge, with its cluster-t p, Holm's adjusted p within the family, and TOST equivalence within
    ±``equivalence_bound``.

    Args:
      res: ``rigour``'s result so far (its ``by_judge``).
      declared: {"family": [names of ``PRIMARY_STATISTICS``], "judges": [...], "alpha",
        "equivalence_bound", "declared"}; None: no family was declared (every comparison exploratory).

    Returns:
      {"declared": the declaration (or None), "rows": [{"name", "judge", "diff", "ci", "se",
      "n_questions", "mde", "verdict", "p", "p_holm", "rejected", "tost"}], "alpha",
      "equivalence_bound", "method"}.

    Raises:
      ValueError: a name that is not a known statistic, or an empty family or judge list.
    """
    if not declared:
        return {"declared": None, "rows": []}
    check_primary(declared)
    fam, judges = list(declared["family"]), list(declared["judges"])
    alpha = float(declared.get("alpha", 0.05))
    bound = float(declared.get("equivalence_bound", 0.05))
    rows = []
    for j in judges:
        for name in fam:
            key, ds = PRIMARY_STATISTICS[name]
            d = res["by_judge"].get(j, {}).get(key)  # a judge the records lack: its rows read missing
            d = d.get(ds) if (d is not None and ds is not None) else d
            if d is None:
                rows.append({"name": name, "judge": j, "p": float("nan"), "missing": True})
                continue
            rows.append({"name": name, "judge": j, **{k: d[k] for k in ("diff", "ci", "se", "n_questions", "mde",
                                                                          "verdict", "p")}})
    adj = holm([r["p"] for r in rows])
    for r, a in zip(rows, adj):
        r["p_holm"] = float(a)
        r["rejected"] = bool(np.isfinite(a) and a < alpha)
        if not r.get("missing"):
            r["tost"] = tost(r["diff"], r["se"], r["n_questions"], bound)
    return {"declared": declared, "rows": rows, "alpha": alpha, "equivalence_bound": bound,
            "method": ("p from the cluster t (difference / cluster SE, G − 1 d.f.), Holm step-down within the "
                       f"family of {len(rows)}; TOST equivalence within ±{bound * 100:.0f} pp on the same t")}


def primary_md(pf: dict) -> list[str]:
    """The Markdown lines of the declared primary family (``primary_family``): a table, and the rule that
    every other comparison of the report is exploratory."""
    if not pf.get("rows"):
        return ["**Primary family:** none declared in run.json; every comparison below is exploratory "
                "(unadjusted intervals, read as description).", ""]
    dec = pf["declared"]
    L = [f"**Primary family** (declared in run.json{' on ' + dec['declared'] if dec.get('declared') else ''}"
         f"{': ' + dec['note'] if dec.get('note') else ''}; {pf['method']}). Every other interval and test in this report is **exploratory**: unadjusted, "
         "read as description, not as a confirmed finding.", "",
         "| statistic | judge | difference [95% CI] | MDE | p (cluster t) | p Holm | at α = "
         f"{pf['alpha']:.2f} | equivalence within ±{pf['equivalence_bound'] * 100:.0f} pp (TOST p; 90% CI) |",
         "|---|---|---|---|---|---|---|---|"]
    for r in pf["rows"]:
        if r.get("missing"):
            L.append(f"| {r['name']} | `{r['judge']}` | not in these records | – | – | – | – | – |")
            continue
        t = r["tost"]
        reads = "direction resolved" if r["rejected"] else "not resolved"
        eq = ("– (interval excludes 0)" if r["ci"][0] > 0 or r["ci"][1] < 0 else
              f"{'equivalent' if t['equivalent'] else 'not shown'} (p = {p3(t['p'])}; {_ci(t['ci90'])})")
        L.append(f"| {r['name']} | `{r['judge']}` | {r['diff']:+.3f} {_ci(r['ci'])} | {_mde(r['mde'])} | "
                 f"{p3(r['p'])} | {p3(r['p_holm'])} | {reads} | {eq} |")
    L += ["", "A difference whose interval includes 0 claims no direction; it reads \"equivalent\" only where "
          "TOST puts it inside the declared bound, and otherwise \"not shown\" (neither a difference nor its "
          "absence is shown).", ""]
    return L


def headline(res: dict) -> dict:
    """The numbers a README may quote, one key each (``analysis.json["headline"]``)."""
    rg = res.get("rigour", {})
    h: dict = {"n_questions": res.get("n_questions"), "by_judge": {}}
    for j, r in rg.get("by_judge", {}).items():
        hj = {"mdl_accuracy": res["by_judge"][j]["accuracy"],
              "constant_per_dataset": r["constant"]["pooled"],
              "mdl_minus_constant": r["vs_constant"]["diff"], "mdl_minus_constant_ci": r["vs_constant"]["ci"],
              "mdl_minus_constant_mde": r["vs_constant"]["mde"], "mdl_minus_constant_verdict": r["vs_constant"]["verdict"],
              "opt_out_free_records": r["opt_out_free"]["n"]}
        for ds, v in r.get("validity", {}).items():
            hj.setdefault("testable", {})[ds] = v["testable"]
        for src, key in (("judge_error", "corrected"), ("judge_error_run_gold", "corrected_run_gold")):
            for ds, e in (r.get(src) or {}).items():
                if "stats" in e:
                    s = e["stats"]
                    hj.setdefault(key, {})[ds] = {k: {kk: s[k][kk] for kk in ("raw", "corrected", "ci", "sign_holds",
                                                                            "identified") if kk in s[k]} for k in COMPARED}
        h["by_judge"][j] = hj
    h["primary"] = [{k: r.get(k) for k in ("name", "judge", "diff", "ci", "p", "p_holm", "rejected", "tost")}
                    for r in rg.get("primary", {}).get("rows", [])]
    for c in rg.get("comparisons", []):
        if (c["a"], c["b"]) == ("B3", "B2"):
            h.setdefault("b3_minus_b2", {})[f"{c['dataset']}{' high-risk' if c['high_risk'] else ''}"] = {
                k: c.get(k) for k in ("diff", "ci_lo", "ci_hi", "mde", "power_paper", "paper_effect", "verdict")}
    return h


# ------------------------------------------------------------------------------------- Markdown

def _pp(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x * 100:+.1f} pp"


def _mde(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x * 100:.1f} pp"


def _pct(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.0%}"


def _ci01(ci) -> str:
    lo, hi = ci
    return "[–]" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{lo:.2f}, {hi:.2f}]"


def _ci(ci) -> str:
    lo, hi = ci
    return "[–]" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{lo:+.3f}, {hi:+.3f}]"


def power_md(comparisons: list[dict], primary: set | None = None) -> str:
    """The power table of the paper judge's system comparisons; ``primary``: the (dataset, a, b) of
    the declared primary family (all records), the other rows read "exploratory"."""
    primary = primary or set()
    lines = ["| dataset | subset | A − B | difference [95% CI] | n q × seeds | MDE (80% power) | paper's effect | "
             "power for it | reads | family |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        fam = "primary" if (not c["high_risk"] and (c["dataset"], c["a"], c["b"]) in primary) else "exploratory"
        lines.append(f"| {c['dataset']} | {'high-risk' if c['high_risk'] else 'all'} | {c['a']} − {c['b']} | "
                     f"{c['diff']:+.3f} {_ci((c['ci_lo'], c['ci_hi']))} | {c['n_questions']} × {c['n_seeds']} | "
                     f"{_mde(c['mde'])} | {_pp(c.get('paper_effect'))} | "
                     f"{_pct(c.get('power_paper'))} | {c['verdict']} | {fam} |")
    return "\n".join(lines)


JUDGE_ERROR_INTRO = (
    "Sensitivity (Se) and specificity (Sp) of each judge per dataset and condition come from the shipped "
    "gold set (`repro/mdl_repro/analysis/resources/gold_verdicts.jsonl`: the 482 gold answers judged by the "
    "current judges; all splits; the `ref` judge's rules were written reading the dev half, so its "
    "error is if anything understated). Corrected = the matrix method (Rogan–Gladen) per cell (system × "
    "B3 action × condition): a judged rate q becomes (q + Sp − 1) / (Se + Sp − 1) with the Se, Sp of the "
    "answers' condition, so every subset and mixture (B3, the high-risk tier, the oracle's accuracy) is "
    "corrected from its own judged rates; rates are clipped to [0, 1] when printed. The interval: "
    f"{N_DRAWS:,} draws, each one Se/Sp pair per condition from the Beta posteriors (B2's and B3's "
    "with-memory answers share one, B1's and B3's without-memory answers the other) and one question-"
    "bootstrap resample; 'sign holds' = share of those draws (gold uncertainty and sampling together) "
    f"whose difference has the raw sign. Where Se + Sp − 1 of a condition has its {J_QUANTILE:.0%} posterior quantile "
    f"≤ {J_FLOOR:.2f} the judge carries too little information there to invert: every quantity that "
    "uses those answers reads **not identified** (no corrected value, no sign share).")


RUN_GOLD_INTRO = (
    "Se and Sp per judge, dataset and condition from the run's own gold labels (`gold/gold_labels.jsonl`: "
    "{n} answers of this run labelled blind, stratified by dataset × system × B3 action with equal answers "
    "per cell; {cells}). Because the sample is stratified, not proportional, each gold answer is weighted "
    "by its cell's share of the run's answers in that condition divided by the cell's gold answers (without "
    "memory: B1 answers and B3's Silent ones; with memory: B2 answers and B3's Active / Supp ones), so Se, "
    "Sp estimate the judge on the run's answers; the Beta posteriors use the weighted counts rescaled to "
    "the effective sample size (Kish), which the table's n = shows as answers. Share of the run's answers "
    "in cells the gold sample covers: {covered}. Everything else as above.")


def run_gold_comparison_md(rg: dict) -> list[str]:
    """Side by side, per judge and dataset, each compared difference corrected with Se / Sp from the
    shipped gold set and from the run's own gold labels."""
    L = ["**The two corrections side by side** (corrected difference [95%: gold + questions]; the raw "
         "difference is the same in both):", "",
         "| judge | dataset | quantity | raw | shipped gold set | this run's gold |", "|---|---|---|---|---|---|"]
    for j, r in rg["by_judge"].items():
        a, b = r.get("judge_error") or {}, r.get("judge_error_run_gold") or {}
        for ds in sorted(set(a) | set(b)):
            sa, sb = a.get(ds, {}).get("stats", {}), b.get(ds, {}).get("stats", {})
            for k in COMPARED:
                if k not in sa and k not in sb:
                    continue
                raw = (sa.get(k) or sb.get(k))["raw"]
                L.append(f"| `{j}` | {ds} | {k} | {raw:+.3f} | {_corr_md(sa.get(k))} | {_corr_md(sb.get(k))} |")
    return L + [""]


def _corr_md(s: dict | None) -> str:
    if not s:
        return "–"
    if not s.get("identified", True):
        return "not identified"
    return f"{s['corrected']:+.3f} {_ci(s['ci'])}"


def _cond(cond: str) -> str:
    return "with memory" if cond == "memory" else "without memory"


def _youden_md(cf: dict, idf: dict, cond: str) -> str:
    j = cf[cond]["se"] + cf[cond]["sp"] - 1
    i = idf.get(cond)
    if i is None:
        return f"{j:.2f}"
    return (f"{j:.2f} ({J_QUANTILE:.0%} quantile {i['j_q05']:+.2f}"
            + ("" if i["identified"] else f", **not identified** {_cond(cond)}") + ")")


def _n(c: dict) -> str:
    return f"{c['n']}" if "n_eff" not in c else f"{c['n']} (effective {c['n_eff']:.0f})"


def _rg_md(x) -> str:
    return "not identified" if x is None or not np.isfinite(x) else f"{x:.3f}"


def judge_error_md(judge: str, je: dict | None) -> list[str]:
    """The Markdown lines of one judge's judge-error correction (``judge_error``'s output), a table per
    dataset; a quantity that is not identified reads so instead of a number.

    Args:
      judge: the judge's name.
      je: ``judge_error(...)`` for that judge, or None / {} where no gold set was available.

    Returns:
      The lines, each table followed by an empty line.
    """
    if not je:
        return [f"`{judge}` judge: no judged gold set available, no correction.", ""]
    L: list[str] = []
    for ds, d in je.items():
        if "stats" not in d:
            L += [f"`{judge}` judge, {ds}: {d.get('note')}", ""]
            continue
        cf, idf = d["confusion"], d.get("identification", {})
        rg = d["rogan_gladen"]
        L += [f"**`{judge}` judge, {ds}** (gold: with memory n = {_n(cf['memory'])}, Se {cf['memory']['se']:.2f}, "
              f"Sp {cf['memory']['sp']:.2f}, agreement {cf['memory']['agreement']:.2f}; without memory n = "
              f"{_n(cf['no memory'])}, Se {cf['no memory']['se']:.2f}, Sp {cf['no memory']['sp']:.2f}, "
              f"agreement {cf['no memory']['agreement']:.2f}; Se + Sp − 1 = {_youden_md(cf, idf, 'memory')} / "
              f"{_youden_md(cf, idf, 'no memory')}, 0 = no information; Rogan–Gladen B1 {_rg_md(rg['B1'])}, "
              f"B2 {_rg_md(rg['B2'])})", "",
              "| quantity | raw | corrected [95%: gold + questions] | sign holds in |", "|---|---|---|---|"]
        for k, s in d["stats"].items():
            if not s.get("identified", True):
                why = " and ".join(_cond(c) for c in s.get("uses", [])
                                   if not idf.get(c, {}).get("identified", True))
                L.append(f"| {k} | {s['raw']:+.3f} | not identified ({why}) | "
                         f"{'not identified' if k in COMPARED else '–'} |")
                continue
            clip = " (clipped)" if s.get("clipped") else ""
            L.append(f"| {k} | {s['raw']:+.3f} | {s['corrected']:+.3f}{clip} {_ci(s['ci'])} | "
                     f"{_pct(s.get('sign_holds'))} |")
        L.append("")
    return L


def rigour_md(rg: dict, by_judge_head: dict) -> str:
    """The 'What this design can detect' section (ANALYSIS.md, and REPORT.md after Table 4)."""
    L = ["The minimum detectable difference (MDE) is the smallest true difference this run's design "
         "(paired, clustered by question, from the run's own variances) resolves with 80% power at the 5% "
         "level (2.80 × the cluster standard error); the power column is the chance it would resolve the "
         "paper's reported difference. A comparison whose interval includes 0 and whose difference is "
         "below the MDE reads **not resolvable**: neither its direction nor its size can be taken from "
         "these records, and the paper's direction is not comparable there either. † marks fewer than 30 "
         "questions (the unit of the design, not records). Below 30 questions the MDE uses Student's t "
         "with G − 1 degrees of freedom instead of z.", ""]
    pf = rg.get("primary", {})
    L += primary_md(pf)
    prim = {("truthfulqa", "B3", "B2") for r in pf.get("rows", []) if r["name"] == "truthfulqa: B3 - B2"
            and r["judge"] == "paper"}
    if rg.get("comparisons"):
        L += [power_md(rg["comparisons"], prim), ""]
    for j, r in rg["by_judge"].items():
        c, v = r["constant"], r["vs_constant"]
        L += [f"**Decision accuracy against the right constant (`{j}` judge).** MDL and every gate are "
              "calibrated per dataset, so the constant they must beat is each dataset's majority: "
              + ", ".join(f"{ds} always {d['label']} {d['accuracy']:.3f} (n = {d['n']})" for ds, d in
                          c["by_dataset"].items())
              + f"; pooled {c['pooled']:.3f}"
              + (f" (not the pooled majority {by_judge_head[j]['majority_class']:.3f}: no per-dataset controller "
                 "competes with that one)" if abs(c["pooled"] - by_judge_head[j]["majority_class"]) > 5e-4 else "")
              + ". MDL − per-dataset constant = "
              f"{v['diff']:+.3f} {_ci(v['ci'])}, MDE {v['mde'] * 100:.1f} pp: **{v['verdict']}**"
              f"{family_note(pf, 'pooled: MDL - per-dataset constant', j)}. Per dataset: "
              + "; ".join(f"{ds} {d['diff']:+.3f} {_ci(d['ci'])} (MDE {d['mde'] * 100:.1f} pp, {d['verdict']})"
                          for ds, d in r["vs_constant_by_dataset"].items())
              + f". An Opt-Out record is 'reject' in the oracle by construction: {r['opt_out_free']['n']} B3 "
              f"Opt-Out records, {r['opt_out_free']['correct']} of them correct for free. On B1 + B2 records only "
              f"(no B3 record): MDL {r['b1b2_only']['accuracy']:.3f} vs per-dataset constant "
              f"{r['b1b2_only']['constant']:.3f}, difference {r['b1b2_only']['diff']:+.3f} "
              f"{_ci(r['b1b2_only']['ci'])} ({r['b1b2_only']['verdict']}).", ""]
        if r.get("b3_vs_random"):
            L += ["B3 − random abstention on as many questions (paired; the random rule's expected rate per record, "
                  "B2's answer × (1 − abstained questions / questions)): " + "; ".join(
                      f"{ds} {d['diff']:+.3f} {_ci(d['ci'])}, MDE {_mde(d['mde'])}: **{d['verdict']}**"
                      + family_note(pf, f"{ds}: B3 - random abstention", j)
                      for ds, d in r["b3_vs_random"].items()) + ".", ""]
    L += ["### Judge error: corrected rates and how often each sign survives", "", JUDGE_ERROR_INTRO, ""]
    for j, r in rg["by_judge"].items():
        L += judge_error_md(j, r.get("judge_error"))
    if any(r.get("judge_error_fresh") for r in rg["by_judge"].values()):
        L += ["#### The `ref` judge's error from the fresh split only", "",
              "The same correction with Se, Sp from the shipped gold set's fresh answers alone (the "
              "`paired-30x2` answers, labelled after the `ref` rules were frozen: the one split none of its "
              "rules was written from).", ""]
        for j, r in rg["by_judge"].items():
            if r.get("judge_error_fresh"):
                L += judge_error_md(j, r["judge_error_fresh"])
    if rg.get("run_gold"):
        rgd = rg["run_gold"]
        L += ["#### Judge error from this run's own gold labels", "", RUN_GOLD_INTRO.format(
                  n=rgd["n"], cells="; ".join(f"{ds}: {len(c)} cells ({', '.join(sorted(c))})"
                                              for ds, c in rgd["cells"].items()),
                  covered="; ".join(f"{ds} {cond} {v:.0%}" for ds, d in rgd["covered"].items()
                                    for cond, v in d.items())), ""]
        for j, r in rg["by_judge"].items():
            L += judge_error_md(j, r.get("judge_error_run_gold"))
        L += run_gold_comparison_md(rg)
    L += ["### Can the design test RQ2–RQ3 with this reader and judge?", "",
          f"Testable needs (i) judge–gold agreement ≥ {MIN_AGREEMENT:.2f} with and without memory, (ii) the "
          f"reader correct without memory on ≥ {MIN_READER:.0%} of the gold set's no-memory answers (correct, not "
          f"merely safe: a non-answer is safe), (iii) no "
          f"coupling of the judge's no-memory verdict to M (|AUROC(M → B1 safe) − 0.5| ≤ {MAX_COUPLING:.2f}).", ""]
    for j, r in rg["by_judge"].items():
        for ds, v in r.get("validity", {}).items():
            cp = v["auroc_M_b1_safe"]
            L.append(f"- `{j}` judge, {ds}: reader correct without memory {_pct(v['reader_accuracy_no_memory'])} "
                     f"of {v['reader_accuracy_n_gold']} gold no-memory answers {_ci01(v['reader_accuracy_no_memory_ci'])} "
                     f"(judged safe by this judge: {v['b1_judged_safe']:.0%} of B1 answers); gold agreement "
                     + " / ".join(f"{a:.2f} ({k})" for k, a in v["agreement"].items())
                     + f"; B1 answers judged hallucinated {v['b1_hallucinated_above_median_M']:.0%} above vs "
                     f"{v['b1_hallucinated_below_median_M']:.0%} below M's median; AUROC of M for 'B1 safe' "
                     f"{cp['auroc']:.2f} {_ci(cp['ci'])}. **"
                     + ("testable" if v["testable"] else "not testable with this reader and judge") + "**"
                     + ("" if v["testable"] else ": " + "; ".join(v["reasons"])) + ".")
    L += ["", "Where a cell reads *not testable*, every RQ2–RQ3 conclusion of this report on that dataset "
          "under that judge (MDL against the constant, Table 6's best subset, Table 10's synergy, Table 7's "
          "learned controllers) reads \"does not reproduce, and is not testable with this reader and judge\": "
          "the oracle labels there measure the reader's weakness or the judge's coupling to M, not the value "
          "of the memory. It would become testable with a reader that answers a fair share of questions "
          "correctly without memory, and a judge that agrees with the gold set ≥ "
          f"{MIN_AGREEMENT:.2f} in both conditions and whose verdict does not track M.", ""]
    return "\n".join(L)
