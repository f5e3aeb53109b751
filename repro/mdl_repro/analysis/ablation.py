"""RQ3, module ablation and supervised baselines (paper Section 5.4, Table 7).

Table 7(a): each of MDLConfig's five ablation switches, on the same records, with the run's calibrated
config of each dataset (θ, n_min, n_max from run.json) and only the switch changed. An ablation moves
the range of ‖v_meta‖ (without value encoding it shrinks to a fraction of the calibrated one), so the
run's n_min/n_max and θ can be meaningless for it; the second column recalibrates each ablated
controller on the calibration split exactly as the run calibrated the full one (``mdl_jax.calibrate``).
Paired t vs the full controller over per-record correctness, as in Table 6.

Table 7(b): scikit-learn LogisticRegression(C=1.0), MLPClassifier((64, 32), relu, max_iter=500,
early_stopping=True) and xgboost XGBClassifier(n_estimators=100, max_depth=4) on the features (M, R, A)
against the oracle labels, 5-fold cross-validated on folds grouped by question and stratified by label
(``oracle.question_folds(y, question_ids, 5, seed=0)``); MDL (no training) is scored on the same test
folds. Accuracy is the mean over folds (± std). Parameter counts: LR weights + intercept; MLP all
weights and biases; XGBoost all tree nodes (splits and leaves), averaged over folds. Every record of a
question shares its (M, R, A) (a question appears once per system and seed), so record-level folds put
copies of a test question's features in training: that column (``oracle.stratified_folds``) is kept,
labelled "record-level (leaks)", only to show how much leakage flatters the learned models.

Degenerate rows. An ablated controller that takes one action on ≥ 99% of the records, or adopts on ≤ 1%
(= always-reject), is constant: its accuracy is a class share, not a property of the module it removes.
Such rows carry the flag ``degenerate`` (``oracle.degenerate``) in the table and the text.
"""

from __future__ import annotations

import numpy as np

from mdl_jax.evaluation.metrics import cluster_bootstrap_diff
from mdl_repro.analysis.oracle import degenerate, question_folds, recalibrate, score, stratified_folds
from mdl_repro.analysis.stats import ci_md as _ci
from mdl_repro.analysis.stats import paired_t, question_ids

ABLATIONS = (
    ("w/o α gating", {"alpha_gating": False}),
    ("w/o risk modulation", {"risk_modulation": False}),
    ("w/o orthogonal subspaces (identity projection)", {"subspaces": "identity"}),
    ("w/o risk inversion (s_A = 1 − A)", {"risk_inversion": False}),
    ("w/o value encoding", {"value_encoding": False}),
)
PAPER_TABLE7A = {"Full MDL controller": 0.612, "w/o α gating": 0.596, "w/o risk modulation": 0.595,
                 "w/o orthogonal subspaces (identity projection)": 0.640,
                 "w/o risk inversion (s_A = 1 − A)": 0.557, "w/o value encoding": 0.434}
PAPER_TABLE7B = {"LR": (0.633, "~16"), "MLP": (0.630, "~3K"), "XGBoost": (0.646, "~500"), "MDL": (0.612, "0")}


def _shares(action) -> list[float]:
    return (np.bincount(np.asarray(action, int), minlength=4) / max(len(action), 1)).tolist()


def table7a(df, y, configs, cal=None) -> dict:
    full_sc = score(df, configs)
    full = full_sc.adopt == y
    rows = {"Full MDL controller": {"accuracy": float(full.mean()), "shares": _shares(full_sc.action),
                                    "degenerate": degenerate(full_sc.action)}}
    if cal is not None and len(cal):
        re = {ds: recalibrate(cal, ds, c) or c for ds, c in configs.items()}
        sc = score(df, re)
        rows["Full MDL controller"]["accuracy_recal"] = float((sc.adopt == y).mean())
        rows["Full MDL controller"]["degenerate_recal"] = degenerate(sc.action)
    for label, change in ABLATIONS:
        abl = {ds: c.replace(**change) for ds, c in configs.items()}
        sc = score(df, abl)
        corr = sc.adopt == y
        row = {"accuracy": float(corr.mean()), "shares": _shares(sc.action), "degenerate": degenerate(sc.action)}
        row.update({f"t_{k}": v for k, v in paired_t(corr.astype(float), full.astype(float)).items()})
        row["ci"] = cluster_bootstrap_diff(corr.astype(float), full.astype(float), question_ids(df))
        if cal is not None and len(cal):
            re = {ds: recalibrate(cal, ds, c) or c for ds, c in abl.items()}
            rsc = score(df, re)
            row["accuracy_recal"] = float((rsc.adopt == y).mean())
            row["degenerate_recal"] = degenerate(rsc.action)
        rows[label] = row
    return {"rows": rows}


def candidate_models(seed: int = 0):
    """{name: unfitted classifier}: the majority floor, LR, MLP and XGBoost the ablations compare."""
    from sklearn.dummy import DummyClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from xgboost import XGBClassifier

    return {
        "Majority class": DummyClassifier(strategy="most_frequent"),  # the floor every row must beat
        "LR": LogisticRegression(C=1.0),
        "MLP": MLPClassifier(hidden_layer_sizes=(64, 32), activation="relu", max_iter=500,
                             early_stopping=True, random_state=seed),
        # n_jobs=1: the analyses must not take every core of a shared machine
        "XGBoost": XGBClassifier(n_estimators=100, max_depth=4, random_state=seed, n_jobs=1,
                                 tree_method="hist", eval_metric="logloss"),
    }


def n_params(name: str, model) -> int:
    if name == "Majority class":
        return 0
    if name == "LR":
        return int(model.coef_.size + model.intercept_.size)
    if name == "MLP":
        return int(sum(w.size for w in model.coefs_) + sum(b.size for b in model.intercepts_))
    dump = model.get_booster().get_dump()
    return int(sum(len([ln for ln in tree.splitlines() if ln.strip()]) for tree in dump))


def _cv(X, y, folds, mdl_correct) -> dict:
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    out = {}
    for nm in ("Majority class", "LR", "MLP", "XGBoost"):
        accs, params = [], []
        for tr, te in folds:
            m = candidate_models()[nm]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                m.fit(X[tr], y[tr])
            accs.append(float((m.predict(X[te]) == y[te]).mean()))
            params.append(n_params(nm, m))
        out[nm] = {"accuracy": float(np.mean(accs)), "std": float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0,
                   "folds": accs, "params": float(np.mean(params))}
    accs = [float(mdl_correct[te].mean()) for _, te in folds]
    out["MDL"] = {"accuracy": float(np.mean(accs)), "std": float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0,
                  "folds": accs, "params": 0.0}
    return out


def table7b(df, y, configs, k: int = 5, seed: int = 0) -> dict:
    """Table 7(b): {"grouped": folds grouped by question (the result), "record_level": record-level
    folds (leaky, labelled so)}; each {method: {accuracy, std, folds, params}}."""
    X = df[["M", "R", "A"]].to_numpy(np.float64)
    mdl_correct = score(df, configs).adopt == y
    groups = question_ids(df)
    n_q, n_min_class = len(np.unique(groups)), int(min(np.sum(y == 0), np.sum(y == 1)))
    if n_q < k or n_min_class < k:
        # too few questions (or records of a class) for k folds: say so instead of failing the analyses
        return {"skipped": f"{k}-fold cross-validation needs at least {k} questions and {k} records of each "
                           f"oracle label; these records have {n_q} questions and {n_min_class} of the rarer label"}
    res = {"grouped": _cv(X, y, question_folds(y, groups, k, seed), mdl_correct)}
    res["record_level"] = _cv(X, y, stratified_folds(y, k, seed), mdl_correct)
    return res


def _p(p) -> str:
    if p is None or not np.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def table7_md(t7a: dict, t7b: dict) -> str:
    rows = t7a["rows"]
    full = rows["Full MDL controller"]["accuracy"]
    recal = "accuracy_recal" in rows["Full MDL controller"]
    full_re = rows["Full MDL controller"].get("accuracy_recal")
    lines = ["**(a) Module ablation** (run's calibrated config per dataset; only the switch changed)", "",
             "| Configuration | Accuracy | ΔAcc [95% CI, question bootstrap] | d_z | p (paired t over records) |"
             + (" Accuracy, recalibrated (Δ) |" if recal else "")
             + " Paper: Acc (ΔAcc) |",
             "|---|---|---|---|---|" + ("---|" if recal else "") + "---|"]
    pf = PAPER_TABLE7A["Full MDL controller"]
    for label, r in rows.items():
        pa = PAPER_TABLE7A[label]
        paper = f"{pa:.1%}" + ("" if label.startswith("Full") else f" ({(pa - pf) * 100:+.1f}pp)")
        flag = f" **({r['degenerate']})**" if r.get("degenerate") else ""
        if label.startswith("Full"):
            cells = [f"{r['accuracy']:.1%}{flag}", "—", "—", "—"]
        else:
            cells = [f"{r['accuracy']:.1%}{flag}", f"{(r['accuracy'] - full) * 100:+.1f}pp {_ci(r['ci'], 100)}",
                     f"{r['t_dz']:+.2f}",
                     _p(r["t_p"])]
        if recal:
            d = "" if label.startswith("Full") else f" ({(r['accuracy_recal'] - full_re) * 100:+.1f}pp)"
            dg = f" **({r['degenerate_recal']})**" if r.get("degenerate_recal") else ""
            cells.append(f"{r['accuracy_recal']:.1%}{d}{dg}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {paper} |")
    degen = [lb for lb, r in rows.items() if r.get("degenerate")]
    if degen:
        lines += ["", "**Degenerate rows** (one action on ≥ 99% of the records, or Active on ≤ 1% = always-reject): "
                  + "; ".join(f"{lb}: {rows[lb]['degenerate'].removeprefix('degenerate: ')}" for lb in degen)
                  + ". Their accuracy is a class share, not evidence about the module they remove."]
    if "skipped" in t7b:
        return "\n".join(lines + ["", f"**(b) Supervised baselines: not run:** {t7b['skipped']}."])
    lines += ["", "**(b) Supervised baselines** (5-fold CV, folds grouped by question and stratified; "
              "mean ± std over folds)", ""]
    rec = "record_level" in t7b
    lines.append("| Method | Accuracy (folds grouped by question) | #Params |" +
                 (" Record-level folds (leak: a test question's copies are in training) |" if rec else "")
                 + " Paper: Acc / #Params |")
    lines.append("|---|---|---|" + ("---|" if rec else "") + "---|")
    for nm in ("Majority class", "LR", "MLP", "XGBoost", "MDL"):
        r = t7b["grouped"][nm]
        cells = [f"{r['accuracy']:.1%} ± {r['std']:.1%}", f"{r['params']:.0f}"]
        if rec:
            g = t7b["record_level"][nm]
            cells.append(f"{g['accuracy']:.1%} ± {g['std']:.1%}")
        pb = PAPER_TABLE7B.get(nm)
        lines.append(f"| {nm} | " + " | ".join(cells) + (f" | {pb[0]:.1%} / {pb[1]} |" if pb else " | – |"))
    lines += ["", "MDL is not trained: its row is the run's calibrated controller scored on the same test folds. "
              "#Params: LR weights + intercept; MLP weights + biases; XGBoost tree nodes (splits + leaves)."]
    return "\n".join(lines)
