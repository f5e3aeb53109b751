"""Figures of the RQ2-RQ4 analyses (PNG) and the numbers drawn in them.

  figure4              action regions and C_final contours over (M, R) at every risk level of the records
                       (A = 0.2, 0.5, 0.75, 0.85 here), one row per dataset (its calibrated config), B3
                       records at that risk level on top (Opt-Out dots are safe by construction)
  figure5a             four actions × oracle (adopt / reject) on the B3 records
  figure5b             accuracy over the (g_a, g_b) grid (sweep engine, mean of 10 bootstrap resamples)
  figure5c             abstention (Silent or Opt-Out) over M × R quintile bins of the records with A ≥ 0.70
  figure_sigma         accuracy and action shares over σ (sweep engine)
  figure_thresholds    accuracy over θ0 and abstention over θ0 × offset (sweep engine)
  figure_section6      hallucination under each B3 action; accuracy in the A ≥ 0.70, M ≥ 0.70 regime

``c_alpha`` and ``section6`` compute the Section 5.4 and Section 6 numbers the figures show.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import mdl_jax
from mdl_jax._io import atomic_open
from mdl_jax.controller.decision import Action
from mdl_jax.signals.risk import HIGH_RISK
from mdl_repro.pipeline import ENGINE

ACTION_NAMES = [a.name for a in Action]
ACTION_COLOURS = ["#2e7d32", "#9ccc65", "#ffb74d", "#e57373"]
RISK_LEVELS = (0.2, 0.5, 0.75, 0.85)  # every level of signals/risk.py; the records' own levels win
PAPER_SECTION6 = {"halluc_active": 0.080, "regime_acc": 0.556, "regime_n": 117}
PAPER_C_ALPHA = {"alpha_correct": 0.950, "alpha_incorrect": 0.946, "t": 3.70}


def save_figure(fig, path: str | os.PathLike, **savefig_kwargs) -> Path:
    """``fig.savefig`` through ``mdl_jax._io.atomic_open`` (a fresh temporary name, renamed), the format
    from ``path``'s suffix (``.png``, ``.pdf``, ...).

    Args:
        fig: a matplotlib figure.
        path: the image file.
        **savefig_kwargs: passed to ``savefig`` (``dpi``, ...).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OutputError: as ``atomic_open``; ``path`` is untouched.
        ValueError: ``path`` has no suffix to take the format from.
    """
    path = Path(path)
    if not path.suffix:
        raise ValueError(f"path: expected an image file name with a suffix (.png, .pdf), got {str(path)!r}")
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=path.suffix[1:].lower(), **savefig_kwargs)
    return path


def load_pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_fig(fig, path: Path, top: float = 1.0) -> Path:
    """Lay out ``fig``, write it to ``path`` and close it; returns ``path``."""
    fig.tight_layout(rect=(0, 0, 1, top))
    try:
        save_figure(fig, path, dpi=110)
    finally:
        load_pyplot().close(fig)
    return path


def _judged(judge: str | None) -> str:
    return "" if judge is None else f" [{judge} judge]"


def figure4(df, configs, path: Path, n: int = 121, judge: str | None = None) -> Path:
    plt = load_pyplot()
    from matplotlib.colors import ListedColormap

    datasets = sorted(configs)
    levels = sorted({round(float(a), 4) for a in df["A"]})
    levels = levels if 0 < len(levels) <= 6 else list(RISK_LEVELS)  # a continuous A: the standard levels
    fig, axes = plt.subplots(len(datasets), len(levels), figsize=(3.9 * len(levels), 3.8 * len(datasets)),
                             squeeze=False)
    g = np.linspace(0.0, 1.0, n, dtype=np.float32)
    Mg, Rg = np.meshgrid(g, g, indexing="xy")
    b3 = df[(df["system"] == "B3") & df["ok"]]
    for i, ds in enumerate(datasets):
        for j, a in enumerate(levels):
            ax = axes[i, j]
            d = mdl_jax.decide(Mg.ravel(), Rg.ravel(), np.full(Mg.size, a, np.float32), configs[ds],
                               engine=ENGINE)
            act = np.asarray(d.action).reshape(Mg.shape)
            cf = np.asarray(d.C_final).reshape(Mg.shape)
            ax.imshow(act, origin="lower", extent=(0, 1, 0, 1), cmap=ListedColormap(ACTION_COLOURS),
                      vmin=-0.5, vmax=3.5, alpha=0.55, aspect="auto", interpolation="nearest")
            cs = ax.contour(Mg, Rg, cf, levels=np.linspace(0.1, 0.9, 9), colors="k", linewidths=0.5)
            ax.clabel(cs, fontsize=6, fmt="%.1f")
            pts = b3[(b3["dataset"] == ds) & np.isclose(b3["A"], a)]
            safe, hal = pts[pts["h"] == 0], pts[pts["h"] == 1]
            ax.scatter(safe["M"], safe["R"], s=9, c="0.45", label=f"safe ({len(safe)})")
            ax.scatter(hal["M"], hal["R"], s=14, c="red", marker="x", label=f"hallucinated ({len(hal)})")
            th = configs[ds].thresholds
            ax.set_title(f"{ds}, A = {a}  (θ = {th[0]:.2f}/{th[1]:.2f}/{th[2]:.2f}){_judged(judge)}", fontsize=8)
            ax.set_xlabel("relevance M")
            ax.set_ylabel("reliability R")
            ax.legend(fontsize=6, loc="lower left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.55) for c in ACTION_COLOURS]
    fig.legend(handles, ["Active", "Supp", "Silent", "Opt-Out (abstains: its dots are safe by construction)"],
               loc="upper center", ncol=4, fontsize=8)
    return save_fig(fig, path, top=0.95)


def confusion(b3, y_b3) -> np.ndarray:
    """(4, 2) counts: rows actions, columns oracle adopt / reject."""
    act = b3["action_name"].map({a.name: int(a) for a in Action}).to_numpy()
    out = np.zeros((4, 2), int)
    np.add.at(out, (act, 1 - np.asarray(y_b3)), 1)
    return out


def figure5a(cm: np.ndarray, path: Path, judge: str | None = None) -> Path:
    plt = load_pyplot()
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    ax.imshow(cm, cmap="Blues", aspect="auto")
    top = cm.max() if cm.size else 0
    for (i, j), v in np.ndenumerate(cm):
        # dark cells get white text, so no count disappears into its cell
        ax.text(j, i, str(v), ha="center", va="center", fontsize=10, color="w" if v > 0.6 * top else "k")
    ax.set_xticks([0, 1], ["oracle: adopt", "oracle: reject"])
    ax.set_yticks(range(4), ["Active", "Supp", "Silent", "Opt-Out"])
    ax.set_title(f"B3 actions vs oracle (n = {cm.sum()}){_judged(judge)}", fontsize=9)
    return save_fig(fig, path)


def figure5b(gate: dict, path: Path, judge: str | None = None) -> Path:
    plt = load_pyplot()
    ax_ = gate["axis"]
    fig, ax = plt.subplots(figsize=(5, 4.2))
    im = ax.imshow(gate["mean"].T, origin="lower", extent=(ax_[0] - .025, ax_[-1] + .025, ax_[0] - .025,
                                                         ax_[-1] + .025), cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax, label="accuracy (mean of 10 question-bootstrap resamples)")
    b = gate["best"]
    ax.plot([0.3], [0.7], "w*", ms=12, label=f"default (0.3, 0.7): {gate['default'][2]:.1%}")
    deg = gate.get("best_degenerate")
    ax.plot([b[0]], [b[1]], "r^", ms=8, label=f"best ({b[0]:.2f}, {b[1]:.2f}): {b[2]:.1%}"
            + (f"\n= a constant controller ({deg.removeprefix('degenerate: ')})" if deg else ""))
    ax.set_xlabel("g_a")
    ax.set_ylabel("g_b")
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
    ax.set_title(f"C_final = C·(g_a + g_b α){_judged(judge)}", fontsize=9)
    return save_fig(fig, path)


def _edges(x: np.ndarray, n_bins: int) -> np.ndarray:
    e = np.unique(np.quantile(x, np.linspace(0, 1, n_bins + 1)))
    return e if len(e) >= 2 else np.repeat(e, 2)


def abstention_bins(df, scored, n_bins: int = 5) -> dict:
    """Abstention share over M × R quintile bins of the records with A ≥ 0.70 (NaN: empty bin)."""
    hi = df["A"].to_numpy() >= HIGH_RISK
    M, R = df["M"].to_numpy()[hi], df["R"].to_numpy()[hi]
    ab = np.isin(scored.action[hi], (Action.SILENT, Action.OPT_OUT))
    if not hi.any():
        return {"n": 0}
    # Tied quantiles collapse to fewer edges; when every record shares one M (or R), as in a small run,
    # one edge is left: keep it as a single closed bin [v, v] rather than zero bins.
    em = _edges(M, n_bins)
    er = _edges(R, n_bins)
    im = np.clip(np.searchsorted(em, M, side="right") - 1, 0, len(em) - 2)
    ir = np.clip(np.searchsorted(er, R, side="right") - 1, 0, len(er) - 2)
    num = np.zeros((len(em) - 1, len(er) - 1))
    cnt = np.zeros_like(num)
    np.add.at(num, (im, ir), ab)
    np.add.at(cnt, (im, ir), 1)
    with np.errstate(invalid="ignore"):
        rate = num / cnt
    return {"n": int(hi.sum()), "rate": rate, "count": cnt, "m_edges": em, "r_edges": er,
            "overall": float(ab.mean())}


def figure5c(ab: dict, path: Path) -> Path:
    plt = load_pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.2))
    if not ab.get("n"):
        ax.text(0.5, 0.5, "no records with A ≥ 0.70", ha="center")
        return save_fig(fig, path)
    rate = ab["rate"]
    im = ax.imshow(rate.T, origin="lower", cmap="magma", vmin=0, vmax=1, aspect="auto")
    for (i, j), v in np.ndenumerate(rate):
        if np.isfinite(v):
            ax.text(i, j, f"{v:.2f}\n({int(ab['count'][i, j])})", ha="center", va="center", fontsize=6,
                    color="w" if v < 0.5 else "k")
    fig.colorbar(im, ax=ax, label="abstention (Silent or Opt-Out)")
    ax.set_xticks(range(rate.shape[0]), [f"{a:.2f}–{b:.2f}" for a, b in zip(ab["m_edges"][:-1], ab["m_edges"][1:])],
                  fontsize=6, rotation=30)
    ax.set_yticks(range(rate.shape[1]), [f"{a:.2f}–{b:.2f}" for a, b in zip(ab["r_edges"][:-1], ab["r_edges"][1:])],
                  fontsize=6)
    ax.set_xlabel("M (quintile bins)")
    ax.set_ylabel("R (quintile bins)")
    ax.set_title(f"A ≥ 0.70: {ab['n']} records, abstention {ab['overall']:.1%}", fontsize=9)
    return save_fig(fig, path)


def figure_sigma(sig: dict, path: Path, judge: str | None = None) -> Path:
    plt = load_pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.set_title(f"accuracy over σ{_judged(judge)}", fontsize=9)
    a1.errorbar(sig["sigma"], sig["mean"], yerr=sig["std"], fmt="o-", ms=3)
    a1.axvline(0.2, color="0.6", ls="--", label="paper σ = 0.20")
    a1.set_xlabel("σ")
    a1.set_ylabel("accuracy (± std, 10 question resamples)")
    a1.legend(fontsize=7)
    a2.stackplot(sig["sigma"], sig["share"].T, labels=ACTION_NAMES, colors=ACTION_COLOURS)
    a2.set_xlabel("σ")
    a2.set_ylabel("action share")
    a2.legend(fontsize=7, loc="upper right")
    return save_fig(fig, path)


def figure_thresholds(th: dict, path: Path, judge: str | None = None) -> Path:
    plt = load_pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.errorbar(th["theta0"], th["mean"][:, 0], yerr=th["std"][:, 0], fmt="o-", ms=3)
    deg = np.asarray(th.get("degenerate_theta0", []), bool)
    if deg.any():  # θ0 where the controller is constant (one action ≥ 99%, or never Active)
        a1.plot(th["theta0"][deg], th["mean"][deg, 0], "rx", ms=6, label="degenerate (constant controller)")
        a1.legend(fontsize=7)
    a1.set_title(f"accuracy over θ0{_judged(judge)}", fontsize=9)
    a1.set_xlabel("θ0 (both datasets)")
    a1.set_ylabel("accuracy (± std, 10 question resamples)")
    im = a2.imshow(th["abstain"].T, origin="lower", aspect="auto", cmap="magma", vmin=0, vmax=1,
                   extent=(th["theta0"][0], th["theta0"][-1], -0.5, len(th["offsets"]) - 0.5))
    a2.set_yticks(range(len(th["offsets"])), [f"{o:.2f}" for o in th["offsets"]])
    a2.set_xlabel("θ0")
    a2.set_ylabel("offset (θ1 = θ0 − o, θ2 = θ0 − 2o)")
    fig.colorbar(im, ax=a2, label="abstention (Silent or Opt-Out)")
    return save_fig(fig, path)


def c_alpha(df, scored, y) -> dict:
    """Section 5.4: corr(C, α) over the pooled records; α of correct vs incorrect decisions (t-tests)."""
    from scipy import stats

    C, al = scored.C.astype(float), scored.alpha.astype(float)
    corr = scored.adopt == y
    out: dict[str, float] = {"n": int(len(C)), "n_correct": int(corr.sum()), "n_incorrect": int((~corr).sum())}
    if np.std(C) > 0 and np.std(al) > 0:
        out["pearson_r"], out["pearson_p"] = (float(v) for v in stats.pearsonr(C, al))
        out["spearman_r"], out["spearman_p"] = (float(v) for v in stats.spearmanr(C, al))
    a1, a0 = al[corr], al[~corr]
    out["alpha_correct"] = float(a1.mean()) if len(a1) else float("nan")
    out["alpha_incorrect"] = float(a0.mean()) if len(a0) else float("nan")
    if len(a1) >= 2 and len(a0) >= 2:
        t, p = stats.ttest_ind(a1, a0)
        tw, pw = stats.ttest_ind(a1, a0, equal_var=False)
        out.update(t=float(t), p=float(p), t_welch=float(tw), p_welch=float(pw))
    return out


def section6(df, scored, y) -> dict:
    """Hallucination under each B3 action; accuracy in the A ≥ 0.70, M ≥ 0.70 regime vs the rest."""
    b3 = df["system"].to_numpy() == "B3"
    out: dict = {"by_action": {}}
    for ds in sorted(df["dataset"].unique()) + ["all"]:
        m = b3 & ((df["dataset"].to_numpy() == ds) if ds != "all" else True)
        for a in Action:
            k = m & (df["action_name"].to_numpy() == a.name)
            out["by_action"][(ds, a.name)] = (int(k.sum()), float(df["h"].to_numpy()[k].mean()) if k.any() else float("nan"))
    regime = (df["A"].to_numpy() >= HIGH_RISK) & (df["M"].to_numpy() >= 0.70)
    corr = scored.adopt == y
    out["regime"] = {}
    for ds in sorted(df["dataset"].unique()) + ["all"]:
        m = (df["dataset"].to_numpy() == ds) if ds != "all" else np.ones(len(df), bool)
        r, o = m & regime, m & ~regime
        out["regime"][ds] = {"n": int(r.sum()), "acc": float(corr[r].mean()) if r.any() else float("nan"),
                             "n_rest": int(o.sum()), "acc_rest": float(corr[o].mean()) if o.any() else float("nan")}
    return out


def figure_section6(s6: dict, path: Path, judge: str | None = None) -> Path:
    plt = load_pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    dss = sorted({k[0] for k in s6["by_action"]} - {"all"}) + ["all"]
    w = 0.8 / len(dss)
    for i, ds in enumerate(dss):
        vals = [s6["by_action"][(ds, a)][1] for a in ACTION_NAMES]
        ns = [s6["by_action"][(ds, a)][0] for a in ACTION_NAMES]
        xs = np.arange(4) + (i - (len(dss) - 1) / 2) * w
        a1.bar(xs, np.nan_to_num(vals), width=w, label=ds)
        for x, v, nn in zip(xs, vals, ns):
            # the count sits inside the bar's foot (white on a bar tall enough to hold it), clear of its
            # neighbours and of the legend
            tall = np.isfinite(v) and v > 0.15
            a1.text(x, 0.01, f"n={nn}", ha="center", va="bottom", fontsize=6, rotation=90,
                    color="w" if tall else "k")
    a1.axhline(PAPER_SECTION6["halluc_active"], color="k", ls="--", lw=0.8, label="paper: 8.0% under Active")
    a1.set_xticks(range(4), ["Active", "Supp", "Silent", "Opt-Out"])
    a1.set_ylabel("hallucination rate of B3 answers")
    a1.set_ylim(0, 1.3)
    a1.set_title(f"hallucination under each B3 action{_judged(judge)}", fontsize=9)
    a1.legend(fontsize=7, loc="upper center", ncol=2)
    xd = np.arange(len(dss))
    a2.bar(xd - 0.2, [s6["regime"][d]["acc"] for d in dss], width=0.4,
           label="A ≥ 0.70 and M ≥ 0.70")
    a2.bar(xd + 0.2, [s6["regime"][d]["acc_rest"] for d in dss], width=0.4, label="other records")
    for x, d in zip(xd, dss):
        a2.text(x - 0.2, 0.02, f"n={s6['regime'][d]['n']}", ha="center", fontsize=7, rotation=90, color="w")
        a2.text(x + 0.2, 0.02, f"n={s6['regime'][d]['n_rest']}", ha="center", fontsize=7, rotation=90, color="w")
    a2.axhline(PAPER_SECTION6["regime_acc"], color="k", ls="--", lw=0.8, label="paper: 55.6% (117 records)")
    a2.set_xticks(xd, dss)
    a2.set_ylim(0, 1.3)
    a2.set_ylabel("decision accuracy vs oracle")
    a2.set_title(f"accuracy in the high-risk, high-relevance regime{_judged(judge)}", fontsize=9)
    a2.legend(fontsize=7, loc="upper center", ncol=2)
    return save_fig(fig, path)
