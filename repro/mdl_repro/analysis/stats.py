"""Statistics that hold up: paired tests at the seed and at the question level, bootstrap CIs, and
mean ± std over seeds for the RQ1 tables (paper Tables 4-5).

The paper compares systems by a paired t-test over *seeds* (2-3 values: 1-2 degrees of freedom), which
says little. Beside it, for every system-vs-system comparison on the same questions we report:
  - McNemar's exact test on the (question, seed) pairs of the two systems (statsmodels; exact binomial
    on the discordant pairs), which uses every answer;
  - a paired t-test over questions (each question's hallucination averaged over seeds first, so the
    seeds of one question are not counted as independent);
  - a 95% bootstrap CI of the rate difference, resampling *questions* (all seeds of a drawn question
    travel together: the cluster bootstrap), 2000 resamples, seed 0, percentile interval.
Warnings are attached where n is too small for a claim (see ``warnings_for``). The record-level
helpers (``cluster_se``, ``mde``, ``cluster_bootstrap_diff``, ``question_bootstrap_weights``,
``bootstrap_mean_ci``) are the library's (``mdl_jax.evaluation.metrics``), imported here under their names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mdl_jax.evaluation.metrics import (  # noqa: F401  (moved to the library; re-exported)
    N_BOOT,
    Z_A,
    Z_B,
    bootstrap_mean_ci,
    cluster_bootstrap_diff,
    cluster_se,
    mde,
    mde_for,
    question_bootstrap_weights,
)
from mdl_jax.signals.risk import HIGH_RISK

if TYPE_CHECKING:
    import pandas as pd

MIN_QUESTIONS = 30   # below this a rate difference is anecdotal
MIN_DISCORDANT = 10  # McNemar on fewer discordant pairs has almost no power


# -------------------------------------------------- power (see analysis.rigour's docstring)

def power(delta: float, se: float) -> float:
    """Power of the two-sided 5% test to resolve a true difference ``delta`` with standard error ``se``."""
    from scipy.stats import norm

    if not (np.isfinite(se) and se > 0 and np.isfinite(delta)):
        return float("nan")
    z = abs(delta) / se
    return float(norm.cdf(z - Z_A) + norm.cdf(-z - Z_A))


def verdict(diff: float, ci, mde_: float, n_q: int, n_seeds: int, lower: str = "lower",
            higher: str = "higher") -> str:
    """What a difference with its interval and MDE lets a report say (module docstring)."""
    lo, hi = ci
    if lo == hi == 0 and diff == 0:
        return "identical decisions"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"not resolvable with n = {n_q} questions × {n_seeds} seeds (too few questions)"
    if lo > 0:
        return higher
    if hi < 0:
        return lower
    if abs(diff) < mde_:
        return f"not resolvable with n = {n_q} questions × {n_seeds} seeds"
    return f"no difference of the detectable size (≥ {mde_ * 100:.1f} pp)"



def paired_t(a, b) -> dict:
    """Paired t-test of a - b (scipy.stats.ttest_rel) with Cohen's d_z = mean(d) / sd(d)."""
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    d = a - b
    out = {"n": int(len(d)), "diff": float(d.mean()) if len(d) else float("nan"),
           "t": float("nan"), "p": float("nan"), "dz": float("nan")}
    if len(d) < 2:
        return out
    sd = d.std(ddof=1)
    if sd == 0:
        # every pair differs by the same amount (often 0: identical decisions): t is undefined
        out["p"] = 1.0 if d.mean() == 0 else 0.0
        out["dz"] = 0.0 if d.mean() == 0 else float("inf") * np.sign(d.mean())
        return out
    t, p = stats.ttest_rel(a, b)
    out.update(t=float(t), p=float(p), dz=float(d.mean() / sd))
    return out


def mcnemar(a, b) -> dict:
    """McNemar's exact test on paired binary outcomes a, b (statsmodels); n01 = a=0,b=1 etc."""
    from statsmodels.stats.contingency_tables import mcnemar as _mcnemar

    a, b = np.asarray(a, bool), np.asarray(b, bool)
    table = [[int(np.sum(~a & ~b)), int(np.sum(~a & b))], [int(np.sum(a & ~b)), int(np.sum(a & b))]]
    n_disc = table[0][1] + table[1][0]
    p = float(_mcnemar(table, exact=True).pvalue) if n_disc else 1.0
    return {"n_pairs": int(len(a)), "a_only": table[1][0], "b_only": table[0][1], "p": p}


def question_ids(df) -> np.ndarray:
    """One id per (dataset, qid): the cluster of records that share a question's signals."""
    if "qid" not in df:
        return np.arange(len(df))
    return (df["dataset"].astype(str) + ":" + df["qid"].astype(str)).to_numpy()


def warnings_for(n_questions: int, n_seeds: int, n_discordant: int | None = None) -> list[str]:
    """Why a comparison may not carry a claim."""
    w = []
    if n_seeds < 3:
        w.append(f"seed-level t on {n_seeds} seed(s) has {max(n_seeds - 1, 0)} d.o.f.: not evidence")
    if n_questions < MIN_QUESTIONS:
        w.append(f"only {n_questions} questions (< {MIN_QUESTIONS})")
    if n_discordant is not None and n_discordant < MIN_DISCORDANT:
        w.append(f"only {n_discordant} discordant pairs: McNemar has little power")
    return w


def compare_systems(df, sys_a: str, sys_b: str, dataset: str, high_risk: bool = False) -> dict | None:
    """Hallucination rate of sys_a vs sys_b on the same (question, seed) pairs of one dataset.

    Returns None when the two systems share no successful pairs.
    """
    from scipy import stats

    sub = df[(df["dataset"] == dataset) & df["ok"] & df["system"].isin([sys_a, sys_b])]
    if high_risk:
        sub = sub[sub["A"] >= HIGH_RISK]
    wide = sub.pivot_table(index=["qid", "seed"], columns="system", values="h", aggfunc="first")
    if sys_a not in wide or sys_b not in wide:
        return None
    wide = wide.dropna(subset=[sys_a, sys_b])
    if not len(wide):
        return None
    a, b = wide[sys_a].to_numpy(), wide[sys_b].to_numpy()
    qids = wide.index.get_level_values("qid").to_numpy()
    seeds = wide.index.get_level_values("seed").to_numpy()
    out: dict[str, Any] = {"a": sys_a, "b": sys_b, "dataset": dataset, "high_risk": high_risk,
           "rate_a": float(a.mean()), "rate_b": float(b.mean()), "diff": float(a.mean() - b.mean()),
           "n_pairs": int(len(a)), "n_questions": int(len(np.unique(qids))),
           "n_seeds": int(len(np.unique(seeds)))}
    # seed level (the paper's test)
    per_seed = wide.groupby(level="seed")[[sys_a, sys_b]].mean()
    if len(per_seed) >= 2 and not np.allclose(per_seed[sys_a] - per_seed[sys_b],
                                              (per_seed[sys_a] - per_seed[sys_b]).iloc[0]):
        t, p = stats.ttest_rel(per_seed[sys_a], per_seed[sys_b])
        out["seed_t"], out["seed_p"] = float(t), float(p)
    else:
        out["seed_t"] = out["seed_p"] = float("nan")
    # question level
    mc = mcnemar(a, b)
    out["mcnemar_p"], out["a_only"], out["b_only"] = mc["p"], mc["a_only"], mc["b_only"]
    per_q = wide.groupby(level="qid")[[sys_a, sys_b]].mean()
    pt = paired_t(per_q[sys_a], per_q[sys_b])
    out["q_t"], out["q_p"], out["q_dz"] = pt["t"], pt["p"], pt["dz"]
    out["ci_lo"], out["ci_hi"] = cluster_bootstrap_diff(a, b, qids)
    out["warnings"] = warnings_for(out["n_questions"], out["n_seeds"], mc["a_only"] + mc["b_only"])
    # what the design can detect (analysis.rigour): MDE at 80% power, power for the paper's effect
    out["se"] = cluster_se(a - b, qids)
    out["mde"] = mde_for(out["se"], out["n_questions"])  # t below 30 questions
    pe = paper_effect(sys_a, sys_b, dataset, high_risk)
    out["paper_effect"] = pe
    out["power_paper"] = power(pe, out["se"]) if pe is not None else None
    out["verdict"] = verdict(out["diff"], (out["ci_lo"], out["ci_hi"]), out["mde"], out["n_questions"],
                                    out["n_seeds"], lower=f"{sys_a} lower", higher=f"{sys_a} higher")
    return out


def paper_effect(sys_a: str, sys_b: str, dataset: str, high_risk: bool) -> float | None:
    """The paper's reported rate difference A − B (Table 4; CRAG / Self-RAG: Table 5, TruthfulQA), or None."""
    from mdl_repro.analysis.paper import PAPER_TABLE4, PAPER_TABLE5

    col = {"truthfulqa": 0, "halueval": 2}.get(dataset)
    if col is not None and sys_a in PAPER_TABLE4 and sys_b in PAPER_TABLE4:
        return PAPER_TABLE4[sys_a][col + int(high_risk)] - PAPER_TABLE4[sys_b][col + int(high_risk)]
    if dataset == "truthfulqa" and sys_a in PAPER_TABLE5 and sys_b in PAPER_TABLE5:
        return PAPER_TABLE5[sys_a][int(high_risk)] - PAPER_TABLE5[sys_b][int(high_risk)]
    return None


COMPARISONS = (("B3", "B2"), ("B3", "B1"), ("B2", "B1"), ("B3", "CRAG"), ("B3", "SelfRAG"))


def crag_equals_b2(df) -> dict:
    """Per dataset where CRAG ran: on how many (question, seed) pairs CRAG's answer is exactly B2's.

    CRAG sends B2's prompt when it grades every memory Correct; a CRAG that did so everywhere equals B2
    answer for answer and is no separate result (``degenerate``: every shared pair equal). Returns
    {dataset: {"n", "equal", "share", "degenerate"}}."""
    out: dict = {}
    if "answer" not in df:
        return out
    key = ["dataset", "qid", "seed"]
    ok = df[df["ok"]]
    m = ok[ok["system"] == "CRAG"][key + ["answer"]].merge(ok[ok["system"] == "B2"][key + ["answer"]], on=key,
                                                           suffixes=("_crag", "_b2"))
    for ds, g in m.groupby("dataset"):
        eq = int((g["answer_crag"] == g["answer_b2"]).sum())
        out[ds] = {"n": int(len(g)), "equal": eq, "share": eq / len(g) if len(g) else float("nan"),
                   "degenerate": bool(len(g)) and eq == len(g)}
    return out


def all_comparisons(df) -> list[dict]:
    out = []
    for ds in sorted(df["dataset"].unique()):
        for a, b in COMPARISONS:
            for hr in (False, True):
                r = compare_systems(df, a, b, ds, hr)
                if r is not None:
                    out.append(r)
    return out


def _mde(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x * 100:.1f} pp"


def _p(p) -> str:
    if p is None or not np.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def ci_md(ci, scale: float = 1.0) -> str:
    """'[lo, hi]' of a question-bootstrap CI; NaN (fewer than 2 questions) prints as such, not '[+nan, +nan]'."""
    lo, hi = ci
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "[–: too few questions]"
    d = 1 if scale != 1.0 else 3
    return f"[{lo * scale:+.{d}f}, {hi * scale:+.{d}f}]"


def _ci(lo, hi) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "[–: too few questions]"
    return f"[{lo:+.3f}, {hi:+.3f}]"


def comparisons_table(rows: list[dict], crag: dict | None = None) -> str:
    """The comparisons as Markdown; ``crag`` (``crag_equals_b2``) flags CRAG rows where CRAG equals B2
    answer for answer."""
    crag = crag or {}
    lines = ["| dataset | subset | A vs B | rate A | rate B | A − B [95% CI, question bootstrap] | "
             "seed-level t (p) | McNemar p (A-only / B-only) | question-level t (p), d_z | n q × seeds | "
             "MDE (80% power) | reads | warnings |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seed = "–" if not np.isfinite(r["seed_t"]) else f"{r['seed_t']:.2f} ({_p(r['seed_p'])})"
        qt = "–" if not np.isfinite(r["q_t"]) else f"{r['q_t']:.2f} ({_p(r['q_p'])}), {r['q_dz']:+.2f}"
        warn = list(r["warnings"])
        if "CRAG" in (r["a"], r["b"]) and crag.get(r["dataset"], {}).get("degenerate"):
            c = crag[r["dataset"]]
            warn.insert(0, f"**degenerate: CRAG = B2 answer for answer ({c['equal']}/{c['n']})**, so this is B3 vs B2")
        lines.append(
            f"| {r['dataset']} | {'high-risk' if r['high_risk'] else 'all'} | {r['a']} vs {r['b']} | "
            f"{r['rate_a']:.3f} | {r['rate_b']:.3f} | {r['diff']:+.3f} {_ci(r['ci_lo'], r['ci_hi'])} "
            f"| {seed} | {_p(r['mcnemar_p'])} ({r['a_only']} / {r['b_only']}) | {qt} | "
            f"{r['n_questions']}{' †' if r['n_questions'] < MIN_QUESTIONS else ''} × {r['n_seeds']} | "
            f"{_mde(r.get('mde'))} | {r.get('verdict', '–')} | {'; '.join(warn) or '–'} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------- Tables 4-5: mean ± std

def seed_rates(df) -> pd.DataFrame:
    """Per (dataset, system, seed): overall and high-risk hallucination and refusal rates."""
    import pandas as pd

    ok = df[df["ok"]].copy()
    ok["hi"] = ok["A"] >= HIGH_RISK
    ref = ok["refusal"].fillna(False).astype(float) if "refusal" in ok else 0.0
    ok["ref"] = ref
    g = ok.groupby(["dataset", "system", "seed"])
    out = pd.DataFrame({"overall": g["h"].mean(), "refusal": g["ref"].mean()})
    hi = ok[ok["hi"]].groupby(["dataset", "system", "seed"])["h"].mean()
    out["high_risk"] = hi
    return out.reset_index()


def _ms(x) -> str:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if not len(x):
        return "–"
    if len(x) == 1:
        return f"{x[0]:.3f} (1 seed)"
    return f"{x.mean():.3f} ± {x.std(ddof=1):.3f}"


def table4_seeds(df) -> str:
    from mdl_repro.analysis.paper import NAMES, PAPER_TABLE4

    sr = seed_rates(df)
    lines = ["| Baseline | TruthfulQA overall | TruthfulQA high-risk | HaluEval overall | HaluEval high-risk |",
             "|---|---|---|---|---|"]
    for s in ("B1", "B2", "B3"):
        cells = []
        for j, ds in enumerate(("truthfulqa", "halueval")):
            sub = sr[(sr["system"] == s) & (sr["dataset"] == ds)]
            cells += [f"{_ms(sub['overall'])} (paper {PAPER_TABLE4[s][2 * j]:.3f})",
                      f"{_ms(sub['high_risk'])} (paper {PAPER_TABLE4[s][2 * j + 1]:.3f})"]
        lines.append(f"| {NAMES[s]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table5_seeds(df) -> str:
    from mdl_repro.analysis.paper import NAMES, PAPER_TABLE5

    sr = seed_rates(df)
    sub_all = sr[sr["dataset"] == "truthfulqa"]
    base = sub_all[sub_all["system"].isin(["CRAG", "SelfRAG"])]["seed"].unique()
    seeds = sorted(base) if len(base) else sorted(sub_all["seed"].unique())
    crag = crag_equals_b2(df).get("truthfulqa", {})
    lines = ["| System | Overall hallucination | High-risk | Refusal |", "|---|---|---|---|"]
    for s in ("B1", "B2", "CRAG", "SelfRAG", "B3"):
        sub = sub_all[(sub_all["system"] == s) & sub_all["seed"].isin(seeds)]
        if not len(sub):
            continue
        p = PAPER_TABLE5[s]
        flag = (f" **(degenerate: = B2 answer for answer, {crag['equal']}/{crag['n']})**"
                if s == "CRAG" and crag.get("degenerate") else "")
        lines.append(f"| {NAMES[s]}{flag} | {_ms(sub['overall'])} (paper {p[0]:.3f}) | "
                     f"{_ms(sub['high_risk'])} (paper {p[1]:.3f}) | {_ms(sub['refusal'])} (paper {p[2]:.3f}) |")
    return "\n".join(lines)


def p3(p) -> str:
    """A p-value as the reports print it: three decimals, "<0.001", or "–" where there is none."""
    return "–" if p is None or not np.isfinite(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def family_note(pf: dict, name: str, judge: str) -> str:
    """Beside an unadjusted verdict of a statistic that the declared primary family holds (``name`` under
    ``judge``), the family's reading of it: Holm's adjusted p and whether it resolves at the family's α.
    The verdict alone would state a direction the family's own table does not resolve. "" for any other."""
    r = next((r for r in pf.get("rows", []) if r["name"] == name and r["judge"] == judge
              and not r.get("missing")), None)
    if r is None:
        return ""
    return (f" (unadjusted; in the declared primary family, Holm p = {p3(r['p_holm'])}: "
            f"{'resolved' if r['rejected'] else 'not resolved'} at α = {pf.get('alpha', 0.05):g})")
