"""Three views of a run a reviewer asks for: where B3 − B2 sits by B3's action and by TruthfulQA
category, and whether C_final ranks the with-memory answers by their safety.

  per action        B3 − B2 on the paired (question, seed) records of each B3 action (Active, Supp,
                    Silent, Opt-Out), with its question-bootstrap interval, MDE and verdict
                    (``rigour.design``), and its share of the records: a within-action effect times its
                    share sums to the whole B3 − B2
  reliability       P(B2's answer safe) by C_final bin (bins of equal records, quantiles of C_final per
                    dataset), each with a question-bootstrap interval: a C_final that ranks the
                    with-memory answers by safety rises from left to right; the diagonal is C_final read as
                    a probability
  per category      TruthfulQA's B3 − B2 by the dataset's question category (categories with fewer than
                    ``MIN_CATEGORY`` questions pooled as "other"), with intervals and each category's
                    contribution (its share of the records × its difference) to the whole

Every interval here is exploratory (none is in a declared primary family).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mdl_repro.analysis.rigour import design, paired_frame

ACTIONS = ("ACTIVE", "SUPP", "SILENT", "OPT_OUT")
ACTION_NAMES = {"ACTIVE": "Active", "SUPP": "Supp", "SILENT": "Silent", "OPT_OUT": "Opt-Out"}
N_BINS = 5
MIN_CATEGORY = 10  # questions: a category with fewer is pooled into "other"


def per_action(P) -> dict:
    """B3 − B2 within each B3 action of one dataset's paired records.

    Args:
      P: ``rigour.paired_frame`` rows of one dataset (h2, h3, action, qid, seed).

    Returns:
      {action name: ``design`` dict + "share" (the action's share of the records) and "contribution"
      (share × difference)}; an action with no record is left out.
    """
    out = {}
    act = P["action"].to_numpy()
    for a in ACTIONS:
        m = act == a
        if not m.any():
            continue
        d = design(P["h3"].to_numpy()[m], P["h2"].to_numpy()[m], P["qid"].to_numpy()[m], P["seed"].to_numpy()[m])
        d["share"] = float(m.mean())
        d["contribution"] = d["share"] * d["diff"]
        out[ACTION_NAMES[a]] = d
    return out


def reliability(P, n_bins: int = N_BINS) -> dict:
    """P(B2's answer safe) by C_final bin for one dataset's paired records.

    Args:
      P: ``rigour.paired_frame`` rows of one dataset (h2, C_final, qid).
      n_bins: bins of equal records (fewer where C_final ties).

    Returns:
      {"edges": bin edges, "bins": [{"lo", "hi", "c_mean", "n", "n_questions", "safe", "ci"}]};
      {"edges": [], "bins": []} without C_final.

    Raises:
      ValueError: ``n_bins`` < 1.
    """
    from mdl_jax.evaluation.metrics import cluster_bootstrap_diff

    if n_bins < 1:
        raise ValueError(f"n_bins: expected ≥ 1, got {n_bins}")
    if "C_final" not in P:
        return {"edges": [], "bins": []}
    c = P["C_final"].to_numpy(np.float64)
    ok = np.isfinite(c)
    c, safe, q = c[ok], 1.0 - P["h2"].to_numpy(np.float64)[ok], P["qid"].to_numpy()[ok]
    if not len(c):
        return {"edges": [], "bins": []}
    edges = np.unique(np.quantile(c, np.linspace(0, 1, n_bins + 1)))
    if len(edges) < 2:
        edges = np.repeat(edges, 2)
    idx = np.clip(np.searchsorted(edges, c, side="right") - 1, 0, len(edges) - 2)
    bins = []
    for b in range(len(edges) - 1):
        m = idx == b
        if not m.any():
            continue
        ci = cluster_bootstrap_diff(safe[m], np.zeros(int(m.sum())), q[m])
        bins.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "c_mean": float(c[m].mean()),
                     "n": int(m.sum()), "n_questions": int(len(np.unique(q[m]))), "safe": float(safe[m].mean()),
                     "ci": [float(ci[0]), float(ci[1])]})
    return {"edges": [float(e) for e in edges], "bins": bins}


def per_category(P, categories: dict) -> list[dict]:
    """B3 − B2 by question category for one dataset's paired records.

    Args:
      P: ``rigour.paired_frame`` rows of one dataset (h2, h3, qid, seed).
      categories: {qid: category}; a qid without one counts as "unknown".

    Returns:
      One row per category (largest first; those with fewer than ``MIN_CATEGORY`` questions pooled
      into "other (k categories)"): ``design`` dict + "category", "share", "contribution".
    """
    qid = P["qid"].to_numpy()
    cat = np.array([categories.get(int(x), "unknown") or "unknown" for x in qid], dtype=object)
    nq = {k: len(np.unique(qid[cat == k])) for k in np.unique(cat)}
    small = sorted(k for k, n in nq.items() if n < MIN_CATEGORY)
    if len(small) > 1:
        cat = np.where(np.isin(cat, small), f"other ({len(small)} categories)", cat)
    rows = []
    for k in sorted(np.unique(cat), key=lambda k: (-int((cat == k).sum()), str(k))):
        m = cat == k
        d = design(P["h3"].to_numpy()[m], P["h2"].to_numpy()[m], qid[m], P["seed"].to_numpy()[m])
        d.update(category=str(k), share=float(m.mean()), contribution=float(m.mean()) * d["diff"])
        rows.append(d)
    return rows


def views(ev, categories: dict | None = None) -> dict:
    """The three views for every dataset × judge of a run's records.

    Args:
      ev: the run's records (``oracle.load_records``).
      categories: {(dataset, qid): category} (from the dataset files); None or {}: no category view.

    Returns:
      {judge: {dataset: {"per_action", "reliability", ["per_category"]}}}.
    """
    from mdl_repro.analysis.selective import JUDGES

    out: dict = {}
    for j, col in JUDGES.items():
        if col not in ev or ev[col].isna().all():
            continue
        P_all = paired_frame(ev, col)
        for ds in sorted(P_all["dataset"].unique()):
            P = P_all[P_all["dataset"] == ds].reset_index(drop=True)
            v: dict = {"per_action": per_action(P), "reliability": reliability(P)}
            cats = {q: c for (d, q), c in (categories or {}).items() if d == ds}
            if ds == "truthfulqa" and cats:
                v["per_category"] = per_category(P, cats)
            out.setdefault(j, {})[ds] = v
    return out


def _ci(ci) -> str:
    lo, hi = ci
    return "[–]" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{lo:+.3f}, {hi:+.3f}]"


def _mde(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x * 100:.1f} pp"


def views_md(v: dict, figures: dict | None = None) -> str:
    """The Markdown of ``views``: per judge and dataset the per-action table, the reliability table
    (and its figure, ``figures`` {judge: file name}) and TruthfulQA's per-category table."""
    L = ["Every interval in this section is exploratory (95% question bootstrap, unadjusted).", ""]
    for j, byds in v.items():
        for ds, d in byds.items():
            L += [f"**B3 − B2 within each B3 action (`{j}` judge, {ds}).** Share × difference sums to the whole "
                  "B3 − B2.", "", "| B3 action | share of records | B3 − B2 [95% CI] | MDE | reads | contribution |",
                  "|---|---|---|---|---|---|"]
            for a, r in d["per_action"].items():
                L.append(f"| {a} | {r['share']:.0%} | {r['diff']:+.3f} {_ci(r['ci'])} | {_mde(r['mde'])} | "
                         f"{r['verdict']} | {r['contribution']:+.3f} |")
            L.append("")
            rb = d["reliability"]["bins"]
            if rb:
                L += [f"**C_final reliability (`{j}` judge, {ds}):** P(B2's with-memory answer safe) by C_final bin "
                      "(equal-record bins).", "", "| C_final bin | mean C_final | records (questions) | P(safe) [95% CI] |",
                      "|---|---|---|---|"]
                for b in rb:
                    L.append(f"| {b['lo']:.3f}–{b['hi']:.3f} | {b['c_mean']:.3f} | {b['n']} ({b['n_questions']}) | "
                             f"{b['safe']:.3f} [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}] |")
                L.append("")
            if d.get("per_category"):
                L += [f"**TruthfulQA B3 − B2 by category (`{j}` judge).** Categories with fewer than "
                      f"{MIN_CATEGORY} questions are pooled.", "",
                      "| category | questions | share of records | B3 − B2 [95% CI] | MDE | reads | contribution |",
                      "|---|---|---|---|---|---|---|"]
                for r in d["per_category"]:
                    L.append(f"| {r['category']} | {r['n_questions']} | {r['share']:.0%} | {r['diff']:+.3f} "
                             f"{_ci(r['ci'])} | {_mde(r['mde'])} | {r['verdict']} | {r['contribution']:+.3f} |")
                L.append("")
        if figures and j in figures:
            L += [f"![C_final reliability, {j} judge]({figures[j]})", ""]
    return "\n".join(L)


def figure_reliability(v: dict, judge: str, path: Path) -> Path | None:
    """P(B2's answer safe) against mean C_final per bin, one panel per dataset, with the bins' 95%
    intervals and the diagonal (C_final read as a probability). None where no dataset has bins."""
    from mdl_repro.analysis.figures import load_pyplot, save_fig

    byds = {ds: d["reliability"]["bins"] for ds, d in v.get(judge, {}).items() if d["reliability"]["bins"]}
    if not byds:
        return None
    plt = load_pyplot()
    fig, axes = plt.subplots(1, len(byds), figsize=(4.2 * len(byds), 3.8), squeeze=False)
    for ax, (ds, bins) in zip(axes[0], byds.items()):
        x = np.array([b["c_mean"] for b in bins])
        y = np.array([b["safe"] for b in bins])
        lo = np.array([b["ci"][0] for b in bins])
        hi = np.array([b["ci"][1] for b in bins])
        ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt="o-", capsize=3, label="P(B2 answer safe)")
        ax.plot([0, 1], [0, 1], ls=":", color="grey", lw=1, label="C_final as a probability")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("C_final (bin mean)")
        ax.set_ylabel("P(safe) [95% CI]")
        ax.set_title(f"{ds} [{judge} judge]")
        ax.legend(fontsize=7, loc="upper left")
    return save_fig(fig, Path(path))
