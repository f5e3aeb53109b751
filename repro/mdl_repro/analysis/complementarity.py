"""RQ2, three-signal complementarity (paper Section 5.3): Table 6, the low-relevance analysis, Table 10.

Table 6 (signal subsets). A subset is scored by the *same* controller (the run's calibrated config of
each dataset) with every left-out signal neutralised: set to its pooled median over the analysed
records. Why the median and not 0 or 0.5: the controller is not linear in its signals (value encoding
puts a Gaussian peak at the value), so any constant is 'information-free' only in that it is the same
for every record; the median keeps the fused vector where the records actually lie, inside the norm
range n_min..n_max that calibration fitted, whereas 0.5 is far from every real M (median ≈ 0.8 here)
and would push every decision toward abstention for a reason that is not in the data. The same rule is
applied to every subset. A second column recalibrates θ and n_min/n_max on the calibration split with
the same neutralisation, which removes the confound that the run's thresholds were fitted to M+R+A.
Significance: paired t-test over the per-record correctness indicators of each subset vs M+R+A on the
same records (scipy.stats.ttest_rel), Cohen's d_z = mean(diff)/sd(diff).

Low relevance (Section 5.3, point 3): among records with M < 0.4, the abstention rate (memory withheld:
Silent or Opt-Out) with M+R+A vs with R+A (M neutralised), and the records M flips from adoption (the
memory reaches the prompt: Active or Supp) to abstention; the reject rate (not Active) beside it.

Table 10 (mutual information with the oracle action, bits). Discretisation: each signal is cut into 5
equal-frequency bins at its pooled quantiles (edges 20/40/60/80%; tied edges merge); a signal with at
most 5 distinct values (A: its 3-4 risk levels) gets one bin per value. A subset is the joint bin of its
signals. I is the plug-in estimate; because the plug-in estimate is biased upward by about
(cells - 1)/(2N ln 2), the Miller-Madow corrected value and a permutation null are reported beside it.
The null moves whole questions: the records of a question share its (M, R, A), so the signal cell of
every question is reassigned to another question at random (1,000 permutations, seed 0) while each
question keeps its own labels. Shuffling single records instead (the older null, kept as a labelled
column) breaks that clustering and understates chance I by about half. Reported: the null's mean, its
95th percentile and p = (1 + #{null ≥ observed}) / (1 + 1,000), for I and for the synergy. Synergy as
the paper computes it (its Table 10 numbers satisfy exactly this): for a pair, I(XY) - I(X) - I(Y); for the triple, I(MRA) - max pair.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np

from mdl_jax.evaluation.metrics import cluster_bootstrap_diff
from mdl_repro.analysis.oracle import recalibrate, score
from mdl_repro.analysis.stats import ci_md as _ci
from mdl_repro.analysis.stats import paired_t, question_ids

SIGNALS = ("M", "R", "A")
SUBSETS = (("M",), ("R",), ("A",), ("M", "R"), ("M", "A"), ("R", "A"), ("M", "R", "A"))
PAPER_TABLE6 = {  # accuracy, ΔAcc, d_z, p as printed
    "M": (0.581, -0.031, -0.10, "<.001"), "R": (0.581, -0.031, -0.10, "<.001"),
    "A": (0.581, -0.031, -0.10, "<.001"), "M+R": (0.581, -0.031, -0.10, "<.001"),
    "M+A": (0.583, -0.030, -0.10, "<.001"), "R+A": (0.627, 0.014, 0.05, "0.001"),
    "M+R+A": (0.612, None, None, None),
}
PAPER_LOW_REL = {"n": 45, "abstain_RA": 0.200, "abstain_MRA": 0.400, "flipped": 9}
PAPER_TABLE10 = {"M": (0.002, None), "R": (0.012, None), "A": (0.037, None), "M+R": (0.015, 0.001),
                 "M+A": (0.042, 0.003), "R+A": (0.050, 0.001), "M+R+A": (0.057, 0.007)}
LOW_RELEVANCE = 0.4
ABSTAIN = (2, 3)  # Action.SILENT, Action.OPT_OUT: the memory is withheld
N_PERM = 1000


def name(subset) -> str:
    return "+".join(subset)


def neutral_values(df) -> dict[str, float]:
    """Pooled median of every signal over the analysed records (the neutralising constants)."""
    return {s: float(np.median(df[s].to_numpy(np.float64))) for s in SIGNALS}


def table6(df, y, configs, cal=None) -> dict:
    """Accuracy of every subset, paired t vs M+R+A; optional recalibrated accuracy per subset.

    Returns {"rows": {name: {...}}, "neutral": {...}, "correct": {name: (N,) bool}}.
    """
    med = neutral_values(df)
    rows, correct = {}, {}
    for sub in SUBSETS:
        neutral = {s: med[s] for s in SIGNALS if s not in sub}
        sc = score(df, configs, neutral)
        correct[name(sub)] = sc.adopt == y
        row: dict[str, Any] = {"accuracy": float(correct[name(sub)].mean()), "adopt_rate": float(sc.adopt.mean())}
        if cal is not None and len(cal):
            re = {ds: recalibrate(cal, ds, configs[ds], neutral) or configs[ds] for ds in configs}
            row["accuracy_recal"] = float((score(df, re, neutral).adopt == y).mean())
        rows[name(sub)] = row
    full = correct["M+R+A"].astype(float)
    qid = question_ids(df)
    for k, row in rows.items():
        if k != "M+R+A":
            row.update({f"t_{a}": b for a, b in paired_t(correct[k].astype(float), full).items()})
            row["ci"] = cluster_bootstrap_diff(correct[k].astype(float), full, qid)
    y = np.asarray(y)
    return {"rows": rows, "neutral": med, "correct": correct, "majority": float(max(y.mean(), 1 - y.mean()))}


def low_relevance(df, configs) -> dict:
    """Abstention among records with M < 0.4, with and without M (M neutralised to its median)."""
    med = neutral_values(df)
    low = df["M"].to_numpy() < LOW_RELEVANCE
    full = score(df, configs)
    ra = score(df, configs, {"M": med["M"]})
    n = int(low.sum())
    if n == 0:
        return {"n": 0, "n_questions": 0}
    ab_full = np.isin(full.action[low], ABSTAIN)
    ab_ra = np.isin(ra.action[low], ABSTAIN)
    return {
        "n": n, "n_questions": int(df.loc[low, ["dataset", "qid"]].drop_duplicates().shape[0]),
        "abstain_MRA": float(ab_full.mean()), "abstain_RA": float(ab_ra.mean()),
        "reject_MRA": float((full.action[low] != 0).mean()), "reject_RA": float((ra.action[low] != 0).mean()),
        # 'adoption' here is the memory reaching the prompt (Active or Supp), the complement of abstention
        "flipped_inject_to_abstain": int(np.sum(~ab_ra & ab_full)),
        "flipped_abstain_to_inject": int(np.sum(ab_ra & ~ab_full)),
    }


# -------------------------------------------------------------------------------- Table 10: MI

def quantile_bins(x, n_bins: int = 5) -> np.ndarray:
    """Equal-frequency bin index per value (edges at pooled quantiles; tied edges merge)."""
    x = np.asarray(x, np.float64)
    levels = np.unique(x)
    if len(levels) <= n_bins:  # a few distinct values (A's risk levels): one bin per value
        return np.searchsorted(levels, x)
    edges = np.unique(np.quantile(x, np.linspace(0, 1, n_bins + 1)[1:-1]))
    return np.searchsorted(edges, x, side="right")


def joint_codes(cols: list[np.ndarray]) -> np.ndarray:
    code = np.zeros(len(cols[0]), np.int64)
    for c in cols:
        code = code * (int(c.max()) + 1) + c
    return np.unique(code, return_inverse=True)[1]


def mutual_information(x_code, y) -> float:
    """Plug-in I(X; Y) in bits for discrete codes."""
    x_code, y = np.asarray(x_code), np.asarray(y).astype(np.int64)
    n = len(y)
    nx, ny = int(x_code.max()) + 1, int(y.max()) + 1
    joint = np.bincount(x_code * ny + y, minlength=nx * ny).reshape(nx, ny) / n
    px, py = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float(np.sum(joint[nz] * np.log2(joint[nz] / (px @ py)[nz])))


def miller_madow(x_code, y) -> float:
    """I with the Miller-Madow correction of each entropy: I_MM = I - (Kx + Ky - Kxy - 1)/(2N ln 2),
    K = occupied cells."""
    x_code, y = np.asarray(x_code), np.asarray(y).astype(np.int64)
    kx, ky = len(np.unique(x_code)), len(np.unique(y))
    kxy = len(np.unique(x_code * (int(y.max()) + 1) + y))
    return mutual_information(x_code, y) + (kxy - kx - ky + 1) / (2 * len(y) * np.log(2))


def question_permutations(groups, n_perm: int, seed: int = 0) -> np.ndarray:
    """(n_perm, N) record indices: permutation p gives record i the signals of a record of question
    π_p(question of i), so whole questions move and each keeps its own labels. Valid for signals that
    are constant within a question (they are: a question's records share (M, R, A))."""
    g_ids, first, g = np.unique(np.asarray(groups), return_index=True, return_inverse=True)
    rng = np.random.default_rng(seed)
    return np.stack([first[rng.permutation(len(g_ids))][g] for _ in range(n_perm)])


def stratified_question_permutations(groups, strata, n_perm: int, seed: int = 0) -> np.ndarray:
    """As ``question_permutations``, but a question's signals go only to another question of the same
    stratum (dataset): the null then keeps each dataset's signal distribution, so a signal that only
    separates the datasets (A, with its per-dataset tiers) is not credited with the dataset difference."""
    g_ids, first, g = np.unique(np.asarray(groups), return_index=True, return_inverse=True)
    st = np.asarray(strata)[first]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_perm):
        tgt = np.arange(len(g_ids))
        for s in np.unique(st):
            idx = np.flatnonzero(st == s)
            tgt[idx] = idx[rng.permutation(len(idx))]
        out.append(first[tgt][g])
    return np.stack(out)


def _synergies(mi: dict) -> dict:
    out = {f"{a}+{b}": mi[f"{a}+{b}"] - mi[a] - mi[b] for a, b in combinations(SIGNALS, 2)}
    out["M+R+A"] = mi["M+R+A"] - max(mi[k] for k in ("M+R", "M+A", "R+A"))
    return out


def table10(df, y, n_bins: int = 5, n_perm: int = N_PERM, seed: int = 0) -> dict:
    from mdl_repro.analysis.stats import question_ids

    y = np.asarray(y)
    bins = {s: quantile_bins(df[s].to_numpy(), n_bins) for s in SIGNALS}
    rng = np.random.default_rng(seed)
    rec_perms = [rng.permutation(y) for _ in range(n_perm)]
    q_perms = question_permutations(question_ids(df), n_perm, seed)
    codes = {name(sub): joint_codes([bins[s] for s in sub]) for sub in SUBSETS}
    mi = {k: mutual_information(c, y) for k, c in codes.items()}
    null = {k: np.array([mutual_information(c[p], y) for p in q_perms]) for k, c in codes.items()}
    syn = _synergies(mi)
    syn_null = {k: np.array([_synergies({j: null[j][i] for j in null})[k] for i in range(n_perm)])
                for k in syn}
    # the within-dataset null (questions move only within their dataset)
    s_perms = stratified_question_permutations(
        question_ids(df), df["dataset"].to_numpy() if "dataset" in df else np.zeros(len(df)), n_perm, seed)
    snull = {k: np.array([mutual_information(c[p], y) for p in s_perms]) for k, c in codes.items()}
    ssyn_null = {k: np.array([_synergies({j: snull[j][i] for j in snull})[k] for i in range(n_perm)])
                 for k in syn}
    rows = {}
    for sub in SUBSETS:
        k = name(sub)
        rows[k] = {"I": mi[k], "I_mm": miller_madow(codes[k], y),
                   "I_null": float(null[k].mean()), "I_null_p95": float(np.percentile(null[k], 95)),
                   "p": float((1 + np.sum(null[k] >= mi[k] - 1e-12)) / (1 + n_perm)),
                   "I_null_records": float(np.mean([mutual_information(codes[k], p) for p in rec_perms])),
                   "cells": int(codes[k].max()) + 1,
                   "I_null_within": float(snull[k].mean()), "I_null_within_p95": float(np.percentile(snull[k], 95)),
                   "p_within": float((1 + np.sum(snull[k] >= mi[k] - 1e-12)) / (1 + n_perm))}
        if k in syn:
            rows[k].update(synergy=syn[k], synergy_null_p95=float(np.percentile(syn_null[k], 95)),
                           synergy_p=float((1 + np.sum(syn_null[k] >= syn[k] - 1e-12)) / (1 + n_perm)),
                           synergy_p_within=float((1 + np.sum(ssyn_null[k] >= syn[k] - 1e-12)) / (1 + n_perm)))
    return {"rows": rows, "n_bins": n_bins, "n_perm": n_perm,
            "levels": {s: int(bins[s].max()) + 1 for s in SIGNALS}}


# ----------------------------------------------------------------------------------- Markdown

def _p(p) -> str:
    if p is None or not np.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def table6_md(t6: dict) -> str:
    rows = t6["rows"]
    full = rows["M+R+A"]["accuracy"]
    recal = "accuracy_recal" in rows["M+R+A"]
    head = "| Configuration | Accuracy | ΔAcc [95% CI, question bootstrap] | d_z | t | p |"
    head += " Accuracy, θ recalibrated |" if recal else ""
    head += " Adopt rate | Paper: Acc / ΔAcc / d_z / p |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for sub in SUBSETS:
        k = name(sub)
        r = rows[k]
        pa = PAPER_TABLE6[k]
        paper = f"{pa[0]:.3f}" + ("" if pa[1] is None else f" / {pa[1]:+.3f} / {pa[2]:+.2f} / {pa[3]}")
        if k == "M+R+A":
            cells = [f"{r['accuracy']:.3f}", "—", "—", "—", "—"]
        else:
            t = r["t_t"]
            cells = [f"{r['accuracy']:.3f}", f"{r['accuracy'] - full:+.3f} {_ci(r['ci'])}",
                     f"{r['t_dz']:+.2f}",
                     "–" if not np.isfinite(t) else f"{t:.2f}", _p(r["t_p"])]
        if recal:
            cells.append(f"{r['accuracy_recal']:.3f}")
        cells += [f"{r['adopt_rate']:.3f}", paper]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append(f"| Majority class (no signal) | {t6['majority']:.3f} | {t6['majority'] - full:+.3f} | – | – | – |"
                 + (" – |" if recal else "") + " – | (paper: single signals 'degenerate to the majority-class "
                 "baseline', 0.581) |")
    med = ", ".join(f"{s} = {v:.3f}" for s, v in t6["neutral"].items())
    lines.append("")
    lines.append(f"Left-out signals are set to their pooled median ({med}). Paired t over per-record "
                 f"correctness vs M+R+A on the same {len(next(iter(t6['correct'].values())))} records "
                 "(the paper's test; it treats the records "
                 "of a question as independent, so the CI, which resamples questions, is the safer guide).")
    return "\n".join(lines)


def low_relevance_md(lr: dict) -> str:
    if not lr.get("n"):
        return f"No records with M < {LOW_RELEVANCE}: the low-relevance analysis is empty."
    p = PAPER_LOW_REL
    lines = ["| M < 0.4 | n records (questions) | Abstention (Silent/Opt-Out) | Reject (not Active) | "
             "Flipped by M: injected (Active/Supp) → withheld | Paper |", "|---|---|---|---|---|---|",
             f"| R+A (M neutralised) | {lr['n']} ({lr['n_questions']}) | {lr['abstain_RA']:.3f} | "
             f"{lr['reject_RA']:.3f} | – | {p['abstain_RA']:.3f} of {p['n']} |",
             f"| M+R+A | {lr['n']} ({lr['n_questions']}) | {lr['abstain_MRA']:.3f} | {lr['reject_MRA']:.3f} | "
             f"{lr['flipped_inject_to_abstain']} (and {lr['flipped_abstain_to_inject']} the other way) | "
             f"{p['abstain_MRA']:.3f}, {p['flipped']} flipped |"]
    if lr["n_questions"] < 30:
        lines.append(f"\n**Warning:** only {lr['n_questions']} distinct questions have M < {LOW_RELEVANCE} "
                     "(each appears once per system and seed): too few for a claim.")
    return "\n".join(lines)


def table10_md(t10: dict) -> str:
    lines = ["| Signal configuration | I (bits, plug-in) | Question-shuffled null: mean / 95th pct (p) | "
             "Within-dataset null: mean / 95th pct (p) | Synergy (null 95th pct, p; p within dataset) | "
             "I, Miller-Madow | Record-shuffled null (mean; ignores questions) | "
             "cells | Paper: I / synergy |", "|---|---|---|---|---|---|---|---|---|"]
    for sub in SUBSETS:
        k = name(sub)
        r = t10["rows"][k]
        syn = (f"{r['synergy']:+.3f} ({r['synergy_null_p95']:+.3f}, p = {r['synergy_p']:.3f}; "
               f"{_p(r.get('synergy_p_within'))})" if "synergy" in r else "—")
        within = (f"{r['I_null_within']:.3f} / {r['I_null_within_p95']:.3f} (p = {r['p_within']:.3f})"
                  if "p_within" in r else "–")
        pi, ps = PAPER_TABLE10[k]
        lines.append(f"| I({k}) | {r['I']:.3f} | {r['I_null']:.3f} / {r['I_null_p95']:.3f} (p = {r['p']:.3f}) | "
                     f"{within} | {syn} | "
                     f"{r['I_mm']:.3f} | {r['I_null_records']:.3f} | {r['cells']} | "
                     f"{pi:.3f} / {'—' if ps is None else f'{ps:+.3f}'} |")
    lev = ", ".join(f"{s}: {v}" for s, v in t10["levels"].items())
    lines.append("")
    lines.append(f"Discretisation: {t10['n_bins']} equal-frequency bins per signal at pooled quantiles, tied edges "
                 f"merged; a signal with ≤ {t10['n_bins']} distinct values keeps one bin per value (levels used: {lev}); "
                 "a subset is the joint bin. Synergy: pair I(XY) − I(X) − I(Y); "
                 f"triple I(MRA) − max pair. Null: {t10.get('n_perm', N_PERM)} permutations that move whole "
                 "questions (each question's signal cell goes to another question; labels stay); the within-dataset "
                 "null moves a question only within its dataset, so a signal that merely separates the datasets "
                 "(A's per-dataset tiers) is not credited with the datasets' difference in labels: read that one; p = (1 + #null ≥ observed) / (1 + permutations). An I or synergy below the null's "
                 "95th percentile is at chance level.")
    r = t10["rows"]["M+R+A"]

    def verdict(p):
        return ("at chance level" if p > 0.05 else "at the edge of chance (one of seven tests in this table, "
                "uncorrected)" if p > 0.01 else "above chance")

    lines.append("")
    pw = r.get("p_within", r["p"])
    lines.append(f"**Reading:** I(M+R+A) = {r['I']:.3f} bits against a within-dataset question-shuffled null "
                 f"(p = {pw:.3f}): {verdict(pw)}; against the pooled question-shuffled null of {r['I_null']:.3f} "
                 f"(95th percentile {r['I_null_p95']:.3f}, p = {r['p']:.3f}): {verdict(r['p'])}; its synergy "
                 f"{r['synergy']:+.3f} (null 95th percentile {r['synergy_null_p95']:+.3f}, p = {r['synergy_p']:.3f}) "
                 f"is {verdict(r['synergy_p'])}. The record-shuffled null ({r['I_null_records']:.3f}) treats the "
                 "repeated records of a question as independent and is too low to judge against.")
    return "\n".join(lines)
