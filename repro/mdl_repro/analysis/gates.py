"""The gates practitioners use, on MDL's own records.

Every gate decides per (dataset, question, seed) whether to inject the retrieved memories:
  binary gates (inject → B2's answer, else B1's; sampling is paired, so both answers are recorded for the
  same (question, seed) and a gate's end-to-end outcome is read off them, no new generation):
    always / never             B2 / B1
    similarity                 inject iff the best memory's cosine ≥ τ (LangChain ``EmbeddingsFilter``,
                               LlamaIndex ``SimilarityPostprocessor`` turned into a store-level decision)
    uncertainty (4 variants)   inject iff the model is unsure of its NO-memory answer: −mean token log-prob,
                               −min token probability, max token entropy, perplexity ≥ τ (teacher-forced
                               scores of the recorded B1 answer, ``mdl-jax score-gates``); perplexity is a
                               monotone function of the mean log-prob, so it makes the same decisions
    self-evaluation            inject iff P("Yes" | "do you need external information?") ≥ τ (label
                               likelihood, normalised over Yes / No)
    XGBoost on (M, R, A)       trained on the evaluated records' oracle labels, out-of-fold predictions over
                               5 folds grouped by question (``oracle.question_folds``, Table 7(b)'s folds)
  gates with an abstain option (scored with the risk-coverage metrics of ``selective``):
    risk-only                  abstain iff A ≥ τ, B2 elsewhere
    MDL                        B3's actions: Active → B2's answer, Silent → B1's, Opt-Out abstains, Supp →
                               the recorded B3 Supp answer where the run's B3 chose Supp for that record,
                               else B2's answer (the count of such stand-ins is reported)

Calibration, the same protocol as MDL's (``mdl_jax.calibrate``, Section 3.4): on the run's calibration
split (records of system "calibration": B2 answers to held-out questions), a record's label is adopt ⇔
its answer is safe under the judge in use, and τ maximises the agreement of "inject iff score ≥ τ" with
those labels over every distinct cut of the calibration scores (ties: the median of the tied cuts). MDL
calibrated = the run's config (paper judge) or ``mdl_jax.calibrate`` on the same split with the `ref`
labels. The uncertainty of a calibration question is that of its recorded (with-memory) answer scored
after the no-memory prompt: the split holds no no-memory answer, and no new generation is made.

The grouped-folds protocol (``out_of_fold_threshold``), computed for every run beside the
one above: every one-dimensional score (similarity, the uncertainty gates, self-evaluation, −A, MDL's
C_final) gets its per-dataset τ the way XGBoost is fitted: on the evaluation records' own oracle labels,
with XGBoost's 5 question-grouped folds (same seed), fitted on four folds and applied to the fifth. Not
in the paper, which calibrates on a held-out split (Section 3.4) and fits XGBoost on its folds (Table 7(b));
the two protocols side by side show how much of a gate's gap to XGBoost is the protocol, not the score.

Decision accuracy is Section 5.3's: a gate's adopt (inject; MDL: Active) against the oracle label of each
pooled B1/B2/B3 record of the same (question, seed), with a question-bootstrap 95% CI.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from mdl_repro.analysis import rigour, selective
from mdl_repro.analysis.figures import save_figure

K_FOLDS = 5  # XGBoost's folds and the grouped-folds protocol's, grouped by question (Table 7(b)'s k)
N_FOLD_DRAWS = 20  # fold draws behind a one-dimensional gate's grouped-folds "− constant" interval
XGB = "XGBoost (M, R, A), grouped 5-fold"
PROTOCOLS = ("calibration split", "grouped folds")

UNCERTAINTY = {  # name: (field of gate_scores.jsonl, sign so that a larger score = more unsure)
    "uncertainty: mean log-prob": ("mean_logprob", -1.0),
    "uncertainty: min token prob": ("min_prob", -1.0),
    "uncertainty: max entropy": ("max_entropy", 1.0),
    "uncertainty: perplexity": ("perplexity", 1.0),
}


def calibrate_threshold(score, adopt) -> dict:
    """τ maximising agreement of 'adopt iff score ≥ τ' with ``adopt`` (N,) on a calibration split.

    Candidates: every distinct score (the cut just below it) and +inf (never adopt). Ties between equally
    good cuts: the median tied candidate (lower median). Returns {"tau", "agreement", "n_tied"}.
    """
    s = np.asarray(score, np.float64)
    y = np.asarray(adopt).astype(bool)
    ok = np.isfinite(s)
    s, y = s[ok], y[ok]
    if len(s) < 2:
        raise ValueError(f"score: a calibration split needs ≥ 2 finite scores, got {len(s)}")
    cand = np.r_[np.unique(s), np.inf]
    # counts, not means, for every cut at once (the grouped-folds protocol calls this 5 × per gate on
    # thousands of records): right(t) = #{adopt, s ≥ t} + #{reject, s < t}; integer counts also make
    # the tie test exact
    order = np.argsort(s, kind="stable")
    below = np.searchsorted(s[order], cand, side="left")  # records with s < t
    pos = np.r_[0, np.cumsum(y[order])]
    neg = np.r_[0, np.cumsum(~y[order])]
    right = (pos[-1] - pos[below]) + neg[below]
    best = np.flatnonzero(right == right.max())
    j = best[(len(best) - 1) // 2]
    return {"tau": float(cand[j]), "agreement": float(right[j] / len(s)), "n_tied": int(len(best))}


def out_of_fold_threshold(score, adopt, groups, folds, strata=None) -> dict:
    """'adopt iff score ≥ τ' with τ fitted out of fold: the grouped-folds protocol.

    For each (fit, scored) index pair of ``folds`` and each stratum (dataset) of the scored part, τ is
    ``calibrate_threshold`` on the fit part's finite scores of that stratum, and the scored records are
    decided with it; every record is decided by the one fold that scores it.

    Args:
      score: (N,) float, larger = adopt; nan = no score (never adopted, never fitted on).
      adopt: (N,) 0/1 labels the threshold is fitted to (the oracle labels).
      groups: (N,) question ids; no group may sit on both sides of a fold.
      folds: list of (fit indices, scored indices), e.g. ``oracle.question_folds``.
      strata: (N,) labels given a threshold each (default: one for all).
    Returns:
      {"adopt": (N,) bool decisions, "fitted": (N,) bool (a threshold was fitted for the record),
       "folds": [{stratum: calibrate_threshold's dict + "n_fit"}] one per fold}.
    Raises:
      ValueError: a fold puts a group on both sides, or scores a record twice.
    """
    s = np.asarray(score, np.float64)
    y = np.asarray(adopt).astype(bool)
    g = np.asarray(groups)
    st = np.zeros(len(s), np.int64) if strata is None else np.asarray(strata)
    if not (len(y) == len(g) == len(st) == len(s)):
        raise ValueError(f"score, adopt, groups, strata: lengths {len(s)}, {len(y)}, {len(g)}, {len(st)} differ")
    scored = np.bincount(np.concatenate([np.asarray(te, np.int64) for _, te in folds] or [np.zeros(0, np.int64)]),
                         minlength=len(s))
    if (scored > 1).any():
        raise ValueError(f"folds: {int((scored > 1).sum())} records are scored by more than one fold")
    dec = np.zeros(len(s), bool)
    fitted = np.zeros(len(s), bool)
    per_fold: list[dict] = []
    for f, (tr, te) in enumerate(folds):
        tr, te = np.asarray(tr, np.int64), np.asarray(te, np.int64)
        leak = np.intersect1d(g[tr], g[te])
        if leak.size:
            # a question's records share its signals: fitting on them scores the question in sample
            raise ValueError(f"folds: fold {f} fits on and scores the same questions ({leak[:3].tolist()}, ...); "
                             "use folds grouped by question (oracle.question_folds)")
        taus = {}
        for d in np.unique(st[te]):
            fit = tr[(st[tr] == d) & np.isfinite(s[tr])]
            if len(fit) < 2 or not np.isfinite(s[te[st[te] == d]]).any():
                continue
            c = calibrate_threshold(s[fit], y[fit])
            c["n_fit"] = int(len(fit))
            taus[d.item() if hasattr(d, "item") else d] = c
            sc = te[st[te] == d]
            dec[sc] = s[sc] >= c["tau"]
            fitted[sc] = True
        per_fold.append(taus)
    return {"adopt": dec, "fitted": fitted, "folds": per_fold}


def _load_tuned(run_dir: Path) -> dict:
    from mdl_jax import load_config

    out = {}
    for name, f in (("MDL tuned (gates)", "tuned-gates.json"), ("MDL tuned (all)", "tuned-all.json")):
        p = run_dir / "tuned" / f
        if p.is_file():
            try:
                out[name] = load_config(p)
            except Exception:  # noqa: BLE001 - a broken file is reported as missing, not fatal here
                continue
    return out


def _features(P, cal, scores: dict, judge: str):
    """Per (question, seed) of P and per calibration record: every gate's score (higher = inject)."""
    ev_f, cal_f, notes = {}, {}, []
    qrow = {(k[0], k[1]): v for k, v in scores.items() if k[3] == "question"}
    ds, qid, seed = P["dataset"].to_numpy(), P["qid"].to_numpy(), P["seed"].to_numpy()
    cds = cal["dataset"].to_numpy() if len(cal) else np.zeros(0)
    cq = cal["qid"].to_numpy() if len(cal) else np.zeros(0)
    cseed = cal["seed"].to_numpy() if len(cal) else np.zeros(0)

    def q_field(f, dss, qs):
        return np.array([np.nan if qrow.get((d, q), {}).get(f) is None else qrow[(d, q)][f]
                         for d, q in zip(dss, qs)], np.float64)

    if qrow:
        ev_f["similarity"] = q_field("best_cosine", ds, qid)
        cal_f["similarity"] = q_field("best_cosine", cds, cq)
    else:
        # M is the best memory cosine clipped at 0 (signals.py): the same decisions for any τ > 0
        ev_f["similarity"] = P["M"].to_numpy(np.float64)
        cal_f["similarity"] = cal["M"].to_numpy(np.float64) if len(cal) else np.zeros(0)
        notes.append("similarity from the records' M (the best cosine clipped at 0): no gate_scores.jsonl")
    if qrow:
        def p_yes(dss, qs):
            y, n = q_field("selfeval_yes", dss, qs), q_field("selfeval_no", dss, qs)
            return 1.0 / (1.0 + np.exp(n - y))
        ev_f["self-evaluation"] = p_yes(ds, qid)
        cal_f["self-evaluation"] = p_yes(cds, cq)
    for name, (f, sign) in UNCERTAINTY.items():
        ev_f[name] = sign * np.array([np.nan if scores.get((d, q, s, "B1"), {}).get(f) is None
                                      else scores[(d, q, s, "B1")][f] for d, q, s in zip(ds, qid, seed)])
        cal_f[name] = sign * np.array([np.nan if scores.get((d, q, s, "calibration"), {}).get(f) is None
                                       else scores[(d, q, s, "calibration")][f]
                                       for d, q, s in zip(cds, cq, cseed)])
    return ev_f, cal_f, notes


def _decision_accuracy(adopt_q, P, pooled, y, qids, corr_out: list | None = None) -> tuple[float, tuple[float, float]]:
    """Accuracy of a per-(question, seed) adopt over the pooled records of those (question, seed).
    ``corr_out``: a list that receives (correct (n,), mask (N pooled,)) for further comparison."""
    from mdl_jax.evaluation.metrics import cluster_bootstrap_diff

    idx = {k: i for i, k in enumerate(zip(P["dataset"], P["qid"], P["seed"]))}
    pos = np.array([idx.get(k, -1) for k in zip(pooled["dataset"], pooled["qid"], pooled["seed"])])
    m = pos >= 0
    corr = (np.asarray(adopt_q)[pos[m]] == y[m]).astype(float)
    if corr_out is not None:
        corr_out.append((corr, m))
    if not len(corr):
        return float("nan"), (float("nan"), float("nan"))
    return float(corr.mean()), cluster_bootstrap_diff(corr, np.zeros_like(corr), qids[m])


def gates(ev, cal, run_dir, *, judge: str = "paper", scores: dict | None = None, run_configs=None,
          xgb_seed: int = 0) -> dict:
    """Every gate on the paired records of ``ev`` under ``judge``. Returns {"rows": {dataset: {gate:
    row}}, "curves": {dataset: {gate: (coverage, risk)}}, "notes": [...]} (see ``gates_md``)."""
    import mdl_jax
    from mdl_jax import Action, MDLConfig
    from mdl_jax.signals.risk import HIGH_RISK
    from mdl_repro.analysis import oracle
    from mdl_repro.analysis.oracle import question_folds
    from mdl_repro.analysis.stats import question_ids

    run_dir = Path(run_dir)
    scores = scores or {}
    col = selective.JUDGES[judge]
    P, dropped = selective.paired(ev, judge)
    res: dict = {"rows": {}, "curves": {}, "notes": [], "judge": judge, "n_dropped_unpaired": dropped,
                 "calibration": {}}
    if not len(P):
        res["notes"].append("no (question, seed) has B1, B2 and B3 all answered: the records are not "
                            "paired, so no gate can be read off them")
        return res
    cal = cal[cal["ok"]].reset_index(drop=True) if len(cal) else cal
    has_cal = len(cal) > 0 and col in cal and cal[col].notna().any()
    ev_f, cal_f, notes = _features(P, cal, scores, judge)
    res["notes"] += notes
    un = selective.unpaired_note(ev)
    if un:
        res["notes"].append(un.replace("**", ""))
    if not scores:
        res["notes"].append("no gate_scores.jsonl beside the records: the uncertainty and self-evaluation "
                            "gates need `mdl-jax score-gates RUN_DIR` first")
    if not has_cal:
        res["notes"].append("the run has no calibration split (system 'calibration'): the thresholded "
                            "gates cannot be calibrated by MDL's protocol and are left out")
    # pooled records and their oracle labels under this judge (Section 5.3)
    pooled = oracle.pooled(ev)
    pooled = pooled[pooled[col].notna()].reset_index(drop=True)
    pooled["h"] = pooled[col].astype(float)
    y = oracle.oracle_labels(pooled)
    qids = question_ids(pooled)
    res["majority"] = float(max(y.mean(), 1 - y.mean())) if len(y) else float("nan")
    rc = run_configs or {}
    lat = _latencies(ev, scores)
    # one set of question-grouped folds for every out-of-fold fit below: XGBoost's and the grouped-folds
    # protocol's thresholds are fitted on the same questions and score the same held-out ones
    folds = question_folds(y, qids, K_FOLDS, xgb_seed) if len(np.unique(qids)) >= K_FOLDS else None
    one_d: dict[str, np.ndarray] = {}  # every one-dimensional gate score per (question, seed), for the folds

    # per-(q, seed) decisions: gate → (mode, adopt (N,), answer source (N,) in {"B1","B2","B3","abstain"},
    # confidence for the curve, the curve's base answers)
    N = len(P)
    h1, h2, h3 = (P[f"h_{s}"].to_numpy(np.float64) for s in ("B1", "B2", "B3"))
    act = P["action"].to_numpy()
    A = P["A"].to_numpy(np.float64)
    dsv = P["dataset"].to_numpy()
    dec: dict[str, dict] = {}
    dec["always inject (B2)"] = dict(adopt=np.ones(N, bool), src=np.full(N, "B2"), conf=np.zeros(N), base=h2,
                                     calls=np.ones(N), lat=0.0)
    dec["never inject (B1)"] = dict(adopt=np.zeros(N, bool), src=np.full(N, "B1"), conf=np.zeros(N), base=h1,
                                    calls=np.ones(N), lat=0.0)
    cal_y = (1 - cal[col].astype(float).to_numpy()).astype(int) if has_cal else None
    cal_ds = cal["dataset"].to_numpy() if has_cal else None

    def thresholded(name, s_ev, s_cal, conf, base, calls_fn, latency):
        if np.isfinite(s_ev).any():
            one_d[name] = s_ev  # the grouped-folds protocol needs no calibration split
        if not has_cal or not np.isfinite(s_ev).any():
            return
        adopt = np.zeros(N, bool)
        taus, skip = {}, []
        for d in np.unique(dsv):
            m, mc = dsv == d, cal_ds == d
            if np.isfinite(s_cal[mc]).sum() < 2 or not np.isfinite(s_ev[m]).any():
                skip.append(d)
                continue
            c = calibrate_threshold(s_cal[mc], cal_y[mc])
            taus[d] = c
            adopt[m] = s_ev[m] >= c["tau"]
        if skip:
            res["notes"].append(f"{name}: no scores for {' / '.join(skip)} (its calibration split or its "
                                "B1 answers are not scored yet): left out there")
        if not taus:
            return
        res["calibration"].setdefault(name, {}).update(taus)
        missing = ~np.isfinite(s_ev) & np.isin(dsv, list(taus))
        if missing.any():
            res["notes"].append(f"{name}: {int(missing.sum())} records without a score count as not injected")
        dec[name] = dict(adopt=adopt, src=np.where(adopt, "B2", "B1"), conf=conf, base=base,
                         calls=calls_fn(adopt), lat=latency, only=set(taus), inj=s_ev)

    one = lambda a: np.ones(N)  # noqa: E731
    thresholded("similarity (best cosine)", ev_f["similarity"], cal_f["similarity"], ev_f["similarity"], h2,
                one, lat["similarity"])
    for name in UNCERTAINTY:
        s = ev_f[name]
        # the B1 answer is generated first (its log-probs come with it); injecting means a second call
        thresholded(name, s, cal_f[name], -np.nan_to_num(s, nan=np.inf), h1, lambda a: 1.0 + a, lat["B1 generation"])
    if "self-evaluation" in ev_f:
        thresholded("self-evaluation", ev_f["self-evaluation"], cal_f["self-evaluation"],
                    -ev_f["self-evaluation"], h1, lambda a: 2.0 * np.ones(N), lat["self-evaluation"])
    # risk-only: adopt (B2) iff A < τ, abstain elsewhere; calibrated like the others on score −A
    one_d["risk-only (calibrated τ)"] = -A
    if has_cal:
        adopt = np.zeros(N, bool)
        for d in np.unique(dsv):
            m, mc = dsv == d, cal_ds == d
            if mc.sum() >= 2 and cal_y is not None:
                c = calibrate_threshold(-cal["A"].to_numpy(np.float64)[mc], cal_y[mc])
                res["calibration"].setdefault("risk-only (calibrated τ)", {})[d] = c
                adopt[m] = -A[m] >= c["tau"]
        dec["risk-only (calibrated τ)"] = dict(adopt=adopt, src=np.where(adopt, "B2", "abstain"), conf=-A,
                                                base=h2, calls=adopt.astype(float), lat=lat["table lookup"], inj=-A)
    adopt = A < selective.RISK_ONLY_TAU
    dec[f"risk-only (A ≥ {selective.RISK_ONLY_TAU:g} abstains)"] = dict(
        adopt=adopt, src=np.where(adopt, "B2", "abstain"), conf=-A, base=h2, calls=adopt.astype(float),
        lat=lat["table lookup"], inj=-A)

    # MDL variants; Supp answers exist only where the run's B3 chose Supp
    supp_h = np.where(act == "SUPP", h3, np.nan)
    mdl_cfgs = {"MDL default (paper Table 2)": {d: MDLConfig() for d in np.unique(dsv)}}
    if rc:
        cfgs = {d: v.config for d, v in rc.items()}
        if judge != "paper" and has_cal:
            # the run calibrated on the paper judge's labels; under another judge, the same protocol
            for d in list(cfgs):
                mc = cal_ds == d
                if mc.sum() >= 2 and cal_y is not None:
                    cM, cR, cA = (cal[c].to_numpy(np.float32)[mc] for c in ("M", "R", "A"))
                    cfgs[d] = mdl_jax.calibrate(cM, cR, cA, cal_y[mc]).config
        mdl_cfgs[f"MDL calibrated ({'run config' if judge == 'paper' else judge + ' labels'})"] = cfgs
    for name, c in _load_tuned(run_dir).items():
        mdl_cfgs[name + ", in-sample"] = {d: c for d in np.unique(dsv)}
    n_stand_in = {}
    for name, cfgs in mdl_cfgs.items():
        missing = [d for d in np.unique(dsv) if d not in cfgs]
        if missing:
            continue
        sc = oracle.score(P, cfgs)
        a = np.array([Action(int(x)).name for x in sc.action])
        src = np.select([a == "ACTIVE", a == "SILENT", a == "OPT_OUT"], ["B2", "B1", "abstain"], "SUPP")
        n_stand_in[name] = int(np.sum((a == "SUPP") & ~np.isfinite(supp_h)))
        dec[name] = dict(adopt=a == "ACTIVE", src=src, conf=np.asarray(sc.C_final, np.float64),
                         base=np.where(a == "OPT_OUT", h1, np.where(a == "SUPP", np.where(np.isfinite(supp_h), supp_h, h2),
                                                                    np.select([a == "ACTIVE", a == "SILENT"], [h2, h1], h2))),
                         calls=(a != "OPT_OUT").astype(float), lat=lat["MDL decide"],
                         inj=np.asarray(sc.C_final, np.float64))
        # under the grouped folds MDL is its C_final with one fitted threshold (adopt ⇔ Active needs
        # C_final ≥ θ1, the one cut that decision accuracy reads), Supp / Silent / Opt-Out all reject
        one_d[name] = np.asarray(sc.C_final, np.float64)
    res["mdl_supp_stand_ins"] = n_stand_in

    # XGBoost on (M, R, A), folds grouped by question, per dataset pooled as Table 7(b)
    try:
        from xgboost import XGBClassifier

        if folds is None:
            raise ValueError(f"fewer than {K_FOLDS} questions")

        X = pooled[["M", "R", "A"]].to_numpy(np.float64)
        p_rec = np.full(len(pooled), np.nan)
        n_pred = 0
        for tr, te in folds:
            m = XGBClassifier(n_estimators=100, max_depth=4, random_state=xgb_seed, n_jobs=1,
                              tree_method="hist", eval_metric="logloss")
            m.fit(X[tr], y[tr])
            t1 = time.perf_counter()
            p_rec[te] = m.predict_proba(X[te])[:, 1]
            n_pred += len(te)
            t_pred = time.perf_counter() - t1
        # a question's records share (M, R, A) and sit in one fold: one prediction per (question, seed)
        idx = {k: i for i, k in enumerate(zip(pooled["dataset"], pooled["qid"], pooled["seed"]))}
        pq = np.array([p_rec[idx[k]] if k in idx else np.nan for k in zip(P["dataset"], P["qid"], P["seed"])])
        adopt = pq >= 0.5
        dec[XGB] = dict(adopt=adopt, src=np.where(adopt, "B2", "B1"), conf=pq, base=h2, calls=np.ones(N),
                        lat=t_pred / max(len(te), 1), inj=pq)
    except ImportError:
        res["notes"].append("XGBoost is not installed (the experiments extra): its row is left out")
    except ValueError as e:
        res["notes"].append(f"XGBoost with 5 question-grouped folds needs ≥ 5 questions ({e}): left out")

    res["grouped_folds"] = _grouped_folds(one_d, dec.get(XGB), P, pooled, y, qids, folds, xgb_seed)

    hi = A >= HIGH_RISK
    for name, d in dec.items():
        if "only" not in d or set(d["only"]) >= set(np.unique(dsv)):
            acc, ci = _decision_accuracy(d["adopt"], P, pooled, y, qids)
            res.setdefault("pooled", {})[name] = {"accuracy": acc, "accuracy_ci": ci}
        src = d["src"]
        h = np.select([src == "B1", src == "B2", src == "abstain"], [h1, h2, np.zeros(N)],
                      np.where(np.isfinite(supp_h), supp_h, h2))
        answered = src != "abstain"
        for ds in np.unique(dsv):
            if "only" in d and ds not in d["only"]:
                continue
            m = dsv == ds
            r = selective.rates(h[m], answered[m])
            r["high_risk"] = float(np.mean(np.where(answered, h, 0)[m & hi])) if (m & hi).any() else float("nan")
            pm = pooled["dataset"].to_numpy() == ds
            Pm = P[m]
            got: list = []
            acc, ci = _decision_accuracy(d["adopt"][m], Pm, pooled[pm], y[pm], qids[pm], got)
            curve = selective.risk_coverage(d["base"][m], d["conf"][m])
            # against the per-dataset constant (what a per-dataset calibrated gate must beat), paired
            if got and len(got[0][0]):
                corr, mm = got[0]
                yd = y[pm][mm]
                const = (yd == int(yd.mean() > 0.5)).astype(float)
                r["vs_constant"] = rigour.design(corr, const, qids[pm][mm], pooled["seed"].to_numpy()[pm][mm])
                r["constant"] = float(const.mean())  # (overwritten below by "the gate is constant"; kept as before)
                r["constant_accuracy"] = float(const.mean())
            # ranking quality on the same answers for every gate: AUROC of the inject score for
            # "B2's answer safe" and for "B1's answer hallucinated" (question bootstrap)
            if "inj" in d and np.isfinite(d["inj"][m]).sum() >= 2:
                qd = P["qid"].to_numpy()[m]
                r["auroc_b2_safe"] = rigour.auroc_ci(d["inj"][m], h2[m] < 0.5, qd, n_boot=200)
                r["auroc_b1_halluc"] = rigour.auroc_ci(d["inj"][m], h1[m] > 0.5, qd, n_boot=200)
            r.update(accuracy=acc, accuracy_ci=ci, aurc=curve.aurc, calls=float(np.mean(d["calls"][m])),
                     latency_s=d["lat"], inject=float(np.mean(d["adopt"][m])),
                     # a gate that injects everywhere or nowhere (or abstains everywhere) is a constant
                     constant=bool(np.all(src[m] == src[m][0])))
            res["rows"].setdefault(ds, {})[name] = r
            res["curves"].setdefault(ds, {})[name] = (curve.coverage, curve.risk, (r["coverage"], r["selective_risk"]))
    return res


def _accuracy_row(adopt_q, pos, y, qids, seeds, with_constant: bool = True) -> dict:
    """Decision accuracy of a per-(question, seed) ``adopt_q`` (len(P),) over the pooled records ``pos``
    (index into ``adopt_q`` per pooled record, −1 = not paired) with labels ``y``, question bootstrap CI,
    and its paired difference from the records' majority label (``rigour.design``)."""
    from mdl_jax.evaluation.metrics import cluster_bootstrap_diff

    m = pos >= 0
    corr = (np.asarray(adopt_q)[pos[m]] == y[m]).astype(float)
    row: dict = {"inject": float(np.mean(adopt_q)) if len(adopt_q) else float("nan"),
                 "is_constant": bool(len(adopt_q) and np.all(adopt_q == adopt_q[0]))}
    if not len(corr):
        return {**row, "accuracy": float("nan"), "accuracy_ci": (float("nan"), float("nan"))}
    row["accuracy"] = float(corr.mean())
    row["accuracy_ci"] = cluster_bootstrap_diff(corr, np.zeros_like(corr), qids[m])
    if with_constant:
        yd = y[m]
        const = (yd == int(yd.mean() > 0.5)).astype(float)
        row["vs_constant"] = rigour.design(corr, const, qids[m], seeds[m])
        row["constant_accuracy"] = float(const.mean())
    return row


def _grouped_folds(one_d: dict, xgb: dict | None, P, pooled, y, qids, folds, seed: int) -> dict:
    """The grouped-folds protocol: every one-dimensional score of ``one_d`` ({gate: (len(P),) score per
    (question, seed)}) gets its per-dataset τ fitted on the evaluation records' oracle labels ``y`` out of
    fold (``out_of_fold_threshold`` on ``folds``, XGBoost's), and is scored by those out-of-fold decisions.
    XGBoost's out-of-fold row (``xgb``, already fitted so) is added for the side-by-side reading."""
    out: dict = {"k": K_FOLDS, "seed": seed, "rows": {}, "pooled": {}, "thresholds": {}, "notes": []}
    if folds is None:
        out["notes"].append(f"fewer than {K_FOLDS} questions: no question-grouped {K_FOLDS}-fold fit")
        return out
    idx = {k: i for i, k in enumerate(zip(P["dataset"], P["qid"], P["seed"]))}
    pos = np.array([idx.get(k, -1) for k in zip(pooled["dataset"], pooled["qid"], pooled["seed"])], np.int64)
    on = pos >= 0  # pooled records of a paired (question, seed): the only ones a gate score exists for
    pds = pooled["dataset"].to_numpy()
    dsv = P["dataset"].to_numpy()
    decided: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, s_q in one_d.items():
        s_rec = np.full(len(pooled), np.nan)
        s_rec[on] = np.asarray(s_q, np.float64)[pos[on]]
        o = out_of_fold_threshold(s_rec, y, qids, folds, strata=pds)
        adopt_q, fit_q = np.zeros(len(P), bool), np.zeros(len(P), bool)
        # a (question, seed)'s records share its score and its fold, so they share one decision
        adopt_q[pos[on]] = o["adopt"][on]
        fit_q[pos[on]] = o["fitted"][on]
        decided[name] = (adopt_q, fit_q)
        out["thresholds"][name] = {str(d): [f[d] for f in o["folds"] if d in f] for d in np.unique(pds)
                                   if any(d in f for f in o["folds"])}
    if xgb is not None:
        decided[XGB] = (np.asarray(xgb["adopt"], bool), np.isfinite(np.asarray(xgb["inj"], np.float64)))
    seeds = pooled["seed"].to_numpy()
    for name, (adopt_q, fit_q) in decided.items():
        fitted_ds = [d for d in np.unique(dsv) if fit_q[dsv == d].any()]
        if not fitted_ds:
            out["notes"].append(f"{name}: no dataset with ≥ 2 scored records in every fit: left out")
            continue
        if len(fitted_ds) == len(np.unique(dsv)):
            r = _accuracy_row(adopt_q, pos, y, qids, seeds, with_constant=False)
            out["pooled"][name] = {"accuracy": r["accuracy"], "accuracy_ci": r["accuracy_ci"]}
        for d in fitted_ds:
            # a dataset's pooled records point into P's rows of that dataset only, so the whole-P ``pos``
            # serves: the row is read from adopt_q[P's rows of d]
            m, pm = dsv == d, pds == d
            r = _accuracy_row(adopt_q, pos[pm], y[pm], qids[pm], seeds[pm])
            r["inject"] = float(np.mean(adopt_q[m]))
            r["is_constant"] = bool(np.all(adopt_q[m] == adopt_q[m][0]))
            th = out["thresholds"].get(name, {}).get(d, [])
            r["tau"] = [c["tau"] for c in th]
            r["fit_agreement"] = [c["agreement"] for c in th]
            r["n_tied"] = [c["n_tied"] for c in th]
            out["rows"].setdefault(str(d), {})[name] = r
    for name, byds in _fold_draws(one_d, P, pooled, y, qids, pos, seed).items():
        for d, fd in byds.items():
            if name in out["rows"].get(str(d), {}):
                out["rows"][str(d)][name]["vs_constant_fold_draws"] = fd
    out["n_fold_draws"] = N_FOLD_DRAWS
    return out


def _fold_draws(one_d: dict, P, pooled, y, qids, pos, seed: int, n_draws: int = N_FOLD_DRAWS,
                n_boot: int = 1000) -> dict:
    """Each one-dimensional gate's grouped-folds difference from its dataset's constant over
    ``n_draws`` draws of the question-grouped folds (seeds seed, seed + 1, ...; the first is the folds
    of the table), with an interval that carries the fold draw and the sampling of questions together:
    bootstrap resample b of the questions is scored with the decisions of fold draw b mod n_draws.

    Returns:
      {gate: {dataset: {"n_draws", "diff" (mean over draws), "draw_min", "draw_max", "draw_sd", "ci",
      "mde" (the first draw's), "verdict"}}}.
    """
    from mdl_jax.evaluation.metrics import question_bootstrap_weights
    from mdl_repro.analysis.oracle import question_folds
    from mdl_repro.analysis.stats import verdict

    if len(np.unique(qids)) < K_FOLDS or not one_d:
        return {}
    on = pos >= 0
    pds = pooled["dataset"].to_numpy()
    seeds = pooled["seed"].to_numpy()
    corr: dict = {name: [] for name in one_d}
    for k in range(n_draws):
        folds = question_folds(y, qids, K_FOLDS, seed + k)
        for name, s_q in one_d.items():
            s_rec = np.full(len(pooled), np.nan)
            s_rec[on] = np.asarray(s_q, np.float64)[pos[on]]
            o = out_of_fold_threshold(s_rec, y, qids, folds, strata=pds)
            corr[name].append(np.where(on, o["adopt"] == y, np.nan))
    out: dict = {}
    for name, cs in corr.items():
        C = np.asarray(cs, np.float64)  # (n_draws, N) correct decisions, nan where unscored
        for d in np.unique(pds):
            m = (pds == d) & on & np.all(np.isfinite(C), 0)
            if m.sum() < 2:
                continue
            yd = y[m]
            const = (yd == int(yd.mean() > 0.5)).astype(np.float64)
            D = C[:, m] - const[None, :]
            per_draw = D.mean(1)
            W = question_bootstrap_weights(qids[m], n_boot, seed).astype(np.float64)
            Db = D[np.arange(n_boot) % n_draws]
            bs = (W * Db).sum(1) / np.maximum(W.sum(1), 1e-12)
            ci = [float(x) for x in np.percentile(bs, [2.5, 97.5])]
            first = rigour.design(C[0, m], const, qids[m], seeds[m])
            n_q, n_s = len(np.unique(qids[m])), len(np.unique(seeds[m]))
            diff = float(per_draw.mean())
            out.setdefault(name, {})[str(d)] = {
                "n_draws": n_draws, "diff": diff, "draw_min": float(per_draw.min()),
                "draw_max": float(per_draw.max()), "draw_sd": float(per_draw.std(ddof=1)) if n_draws > 1 else 0.0,
                "ci": ci, "mde": first["mde"], "verdict": verdict(diff, ci, first["mde"], n_q, n_s)}
    return out


def _latencies(ev, scores: dict) -> dict:
    """Seconds each gate adds per decision on the machine that runs the analysis (a shared machine is noisy, so compare ratios)."""
    import mdl_jax

    out = {}
    rng = np.random.default_rng(0)
    mem, q = rng.standard_normal((6, 384)).astype(np.float32), rng.standard_normal(384).astype(np.float32)
    t0 = time.perf_counter()
    for _ in range(1000):
        float(np.max(mem @ q))
    out["similarity"] = (time.perf_counter() - t0) / 1000
    out["table lookup"] = 0.0  # A is computed for every gate's record anyway (the risk table)
    mdl_jax.decide(0.5, 0.5, 0.5)  # one record, Python floats: the deployed path (Table 8)
    ts = []
    for _ in range(200):
        t0 = time.perf_counter()
        mdl_jax.decide(0.5, 0.5, 0.5)
        ts.append(time.perf_counter() - t0)
    out["MDL decide"] = float(np.median(ts))
    b1 = ev[(ev["system"] == "B1") & ev["ok"]]
    out["B1 generation"] = float(b1["latency_s"].mean()) if "latency_s" in b1 and len(b1) else float("nan")
    se = [v["seconds"] for k, v in scores.items() if k[3] == "question" and v.get("seconds") is not None]
    out["self-evaluation"] = float(np.mean(se)) if se else float("nan")
    return out


def _f(x, fmt="{:.3f}") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _lat(s) -> str:
    if s is None or not math.isfinite(s):
        return "–"
    return f"{s * 1e6:.0f} µs" if s < 1e-2 else f"{s:.2f} s"


def _auc(a) -> str:
    if not a or not math.isfinite(a.get("auroc", float("nan"))):
        return "–"
    return f"{a['auroc']:.2f} [{_f(a['ci'][0], '{:.2f}')}, {_f(a['ci'][1], '{:.2f}')}]"


def _aurc_set(name: str) -> str:
    """Whose answers a gate's AURC ranks: the AURCs of gates over different answer sets mix base rates with
    ranking ability and are not comparable across those sets (the AUROC columns are)."""
    if name.startswith(("uncertainty", "self-evaluation")):
        return "B1's"
    if name.startswith("MDL"):
        return "own"
    if name.startswith(("always", "never")):
        return "flat"
    return "B2's"


def gates_md(res_by_judge: dict) -> str:
    """The gates table, one block per judge."""
    lines = ["Rows: each gate per dataset on the paired (question, seed) records. Decision accuracy: "
             "adopt ⇔ inject (MDL: Active) against Section 5.3's oracle labels of the pooled B1/B2/B3 "
             "records, 95% CI by question bootstrap. Overall / high-risk: the end-to-end hallucination "
             "rate (an abstention counted safe) over all records / those with A ≥ 0.70. Coverage and "
             "selective risk: as in §1. AURC: the gate's score used to abstain on its least confident "
             "records first, over the answers it is a confidence for (similarity, risk-only, XGBoost: "
             "B2's; uncertainty, self-evaluation: B1's; MDL: its own, Opt-Out answered as Silent past "
             "its coverage; always/never: flat). LLM calls per question: generations and scoring passes "
             "the gate needs. Added latency per decision: measured here on a loaded 2-core machine (B1 "
             "generation: the run's recorded per-question time; it is what an uncertainty gate waits "
             "for before deciding). (constant): the gate makes the same choice for every record of the "
             "dataset (a degenerate calibration, e.g. the optimum on the calibration split is "
             "always-reject). − per-dataset constant: the gate's decision accuracy minus that of its dataset's "
             "majority label on the same records (the constant a per-dataset calibrated gate must beat), paired, "
             "question-bootstrap CI, MDE at 80% power. AUROC: how well the gate's inject score ranks the SAME "
             "answers for every gate (B2's answer safe; B1's answer hallucinated), 0.5 = no ranking; compare "
             "gates on these, not on the AURC, whose answer set differs by gate (in brackets). Protocols differ "
             "in this table: XGBoost is fitted on the evaluation labels (out of fold, folds grouped by "
             "question), the thresholded gates are calibrated on the calibration split, and the uncertainty "
             "gates are calibrated on the with-memory answer scored after the no-memory prompt but applied to "
             "the B1 answer's score: a different feature. The second table of each judge reads every "
             "one-dimensional gate under both protocols (see there).", ""]
    for judge, res in res_by_judge.items():
        lines += [f"**Judge `{judge}`**", ""]
        for n in res.get("notes", []):
            lines.append(f"- note: {n}")
        if res.get("notes"):
            lines.append("")
        if not res["rows"]:
            continue
        lines += ["| dataset | gate | decision accuracy [95% CI] | − per-dataset constant [95% CI]; MDE; reads | "
                  "AUROC, B2's answer safe [95% CI] | AUROC, B1's answer hallucinated [95% CI] | inject | overall | "
                  "high-risk | coverage | selective risk | AURC (over whose answers) | LLM calls / q | added latency |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for ds, rows in res["rows"].items():
            for name, r in rows.items():
                name = name + (" (constant)" if r.get("constant") and not name.startswith(("always", "never"))
                               else "")
                vc = r.get("vs_constant")
                vcs = (f"{vc['diff']:+.3f} [{_f(vc['ci'][0], '{:+.3f}')}, {_f(vc['ci'][1], '{:+.3f}')}]; "
                       f"{vc['mde'] * 100:.1f} pp; {vc['verdict']}" if vc else "–")
                lines.append(f"| {ds} | {name} | {_f(r['accuracy'])} [{_f(r['accuracy_ci'][0])}–"
                             f"{_f(r['accuracy_ci'][1])}] | {vcs} | {_auc(r.get('auroc_b2_safe'))} | "
                             f"{_auc(r.get('auroc_b1_halluc'))} | {_f(r['inject'], '{:.2f}')} | {_f(r['overall'])} | "
                             f"{_f(r['high_risk'])} | {_f(r['coverage'])} | {_f(r['selective_risk'])} | "
                             f"{_f(r['aurc'])} ({_aurc_set(name)}) | {_f(r['calls'], '{:.2f}')} | {_lat(r['latency_s'])} |")
        pooled = res.get("pooled", {})
        if pooled:
            lines += ["", "Decision accuracy pooled over the datasets (as Table 7; the constant to beat is each "
                      "dataset's majority, per dataset in the table above; the pooled majority class "
                      f"{res.get('majority', float('nan')):.3f} is not it): " + "; ".join(
                          f"{k} {_f(v['accuracy'])} [{_f(v['accuracy_ci'][0])}–{_f(v['accuracy_ci'][1])}]"
                          for k, v in pooled.items()) + "."]
        cal = res.get("calibration", {})
        if cal:
            lines += ["", "Calibrated thresholds (τ, calibration agreement, number of tied cuts): " + "; ".join(
                f"{g}: " + ", ".join(f"{d} τ = {c['tau']:.4g} ({c['agreement']:.3f}, {c['n_tied']} tied)"
                                     for d, c in v.items()) for g, v in cal.items()) + "."]
        lines += _protocols_md(res)
        si = {k: v for k, v in res.get("mdl_supp_stand_ins", {}).items() if v}
        if si:
            lines += ["", "MDL Supp records without a recorded Supp answer (B2's answer stands in): "
                      + ", ".join(f"{k} {v}" for k, v in si.items()) + "."]
        lines.append("")
    return "\n".join(lines)


PROTOCOLS_MD = (
    "Two protocols, side by side. **Calibration split** (the table above, and MDL's own Section 3.4 "
    "protocol): a gate's τ is fitted per dataset on the run's held-out calibration questions, labelled "
    "adopt ⇔ the with-memory answer is safe, then applied to the evaluation records. **Grouped folds** (the "
    "way XGBoost is fitted): the same score's τ is fitted per dataset on the evaluation records' own oracle "
    "labels (Section 5.3), {k} folds grouped by question (`oracle.question_folds`, seed {seed}: XGBoost's "
    "folds), τ fitted on four folds and applied to the fifth, so every decision is out of fold and no "
    "question is both fitted on and scored; MDL enters as its C_final with one fitted cut (the adopt ⇔ "
    "Active that decision accuracy reads). Why they differ: the grouped folds fit on more records, to the "
    "very label rule and answers that decision accuracy scores (B1, B2 and B3 records pooled, the "
    "uncertainty gates on the B1 answer's own score), while the calibration split is small, labelled by the "
    "with-memory answer alone and, for the uncertainty gates, scored on a different answer; where a gate "
    "does better under the folds, the difference (within the intervals shown) is what the transfer from the "
    "split cost it, not its score's ranking. Under the folds every gate, XGBoost included, is fitted the "
    "same way, so that column compares the scores themselves. Constants (always / never inject) need no "
    "fit and read the same under both. τ over the folds: the range of the {k} fitted cuts, and how many "
    "folds' best cut was 'never adopt' (τ = +∞).")


def _protocols_md(res: dict) -> list[str]:
    """The calibration-split and grouped-folds decision accuracies of every 1-D gate, one row each."""
    gf = res.get("grouped_folds") or {}
    rows = gf.get("rows") or {}
    out = ["", "*Both protocols.* " + PROTOCOLS_MD.format(k=gf.get("k", K_FOLDS), seed=gf.get("seed", 0)), ""]
    for n in gf.get("notes", []):
        out.append(f"- note (grouped folds): {n}")
    if not rows:
        return out + ([""] if gf.get("notes") else [])

    def acc(r):
        return f"{_f(r['accuracy'])} [{_f(r['accuracy_ci'][0])}–{_f(r['accuracy_ci'][1])}]" if r else "–"

    def vs(r):
        vc = (r or {}).get("vs_constant")
        if not vc:
            return "–"
        return (f"{vc['diff']:+.3f} [{_f(vc['ci'][0], '{:+.3f}')}, {_f(vc['ci'][1], '{:+.3f}')}]; "
                f"{vc['mde'] * 100:.1f} pp; {vc['verdict']}")

    def taus(r):
        t = [x for x in (r or {}).get("tau", []) if x is not None and math.isfinite(x)]
        n_inf = len((r or {}).get("tau", [])) - len(t)
        if not (r or {}).get("tau"):
            return "–"
        s = (f"{t[0]:.4g}" if min(t) == max(t) else f"{min(t):.4g} to {max(t):.4g}") if t else ""
        return s + (f"{'; ' if s else ''}{n_inf} never adopt" if n_inf else "")

    def draws(r):
        fd = (r or {}).get("vs_constant_fold_draws")
        if not fd:
            return "– (one fold draw)" if r else "–"
        return (f"{fd['diff']:+.3f} [{_f(fd['ci'][0], '{:+.3f}')}, {_f(fd['ci'][1], '{:+.3f}')}] (draws "
                f"{fd['draw_min']:+.3f} to {fd['draw_max']:+.3f}); {fd['verdict']}")

    out += [f"The grouped-folds − constant of a one-dimensional gate is also given over {gf.get('n_fold_draws', N_FOLD_DRAWS)} "
            "draws of the question-grouped folds (fold seeds from the table's on): the mean over draws, an "
            "interval whose bootstrap resample b of the questions is scored with fold draw b mod the draws (fold "
            "choice and question sampling together), and the range of the draws' differences; that column, not "
            "the one-draw column, is the one to read a direction from. XGBoost has the one draw (its refit per "
            "draw is not run here).", "",
            "| dataset | gate | calibration split: accuracy [95% CI] | calibration split: − constant [95% CI]; "
            "MDE; reads | grouped folds: accuracy [95% CI] | grouped folds: − constant [95% CI]; MDE; reads (one "
            "fold draw) | grouped folds: − constant over fold draws [95% CI] (range); reads | "
            "inject (split / folds) | τ over the folds |", "|---|---|---|---|---|---|---|---|---|"]
    for ds, by in rows.items():
        for name, r in by.items():
            c = res.get("rows", {}).get(ds, {}).get(name)
            if name == XGB:
                c = None  # it has no calibration-split fit: its row above is the grouped-folds one
            inj = (f"{_f(c['inject'], '{:.2f}') if c else '–'} / {_f(r['inject'], '{:.2f}')}"
                   + (" (constant)" if r.get("is_constant") else ""))
            out.append(f"| {ds} | {name} | {acc(c)} | {vs(c)} | {acc(r)} | {vs(r)} | {draws(r)} | {inj} | "
                       f"{'p ≥ 0.5' if name == XGB else taus(r)} |")
    pooled = gf.get("pooled", {})
    if pooled:
        out += ["", "Grouped folds, decision accuracy pooled over the datasets: " + "; ".join(
            f"{k} {_f(v['accuracy'])} [{_f(v['accuracy_ci'][0])}–{_f(v['accuracy_ci'][1])}]"
            for k, v in pooled.items()) + "."]
    return out


def figure(res_by_judge: dict, path) -> Path | None:
    """Risk-coverage curves of every gate, one panel per dataset × judge (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(j, ds) for j, r in res_by_judge.items() for ds in r.get("curves", {})]
    if not panels:
        return None
    show = ("always inject (B2)", "never inject (B1)", "similarity (best cosine)", "uncertainty: mean log-prob",
            "uncertainty: max entropy", "self-evaluation", "XGBoost (M, R, A), grouped 5-fold")
    judges = list(dict.fromkeys(j for j, _ in panels))
    dss = list(dict.fromkeys(d for _, d in panels))
    fig, axes = plt.subplots(len(judges), len(dss), figsize=(7.0 * len(dss), 5.4 * len(judges)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for j, ds in panels:
        ax = axes[judges.index(j), dss.index(ds)]
        ax.set_visible(True)
        cur = res_by_judge[j]["curves"][ds]
        for name in cur:
            if not (name in show or name.startswith("MDL calibrated") or name.startswith("risk-only (A")):
                continue
            cov, risk, (c0, r0) = cur[name]
            aurc = res_by_judge[j]["rows"][ds][name]["aurc"]
            ln, = ax.plot(cov, risk, lw=1.3, label=f"{name} (AURC {aurc:.3f})")
            ax.plot([c0], [r0], "o", color=ln.get_color(), ms=5)
        ax.set_title(f"{ds}, judge {j}", fontsize=11)
        ax.set_xlabel("coverage (share answered)", fontsize=9)
        ax.set_ylabel("selective risk (hallucination among answered)", fontsize=9)
        ax.set_xlim(0, 1.02)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right", framealpha=0.85)
    fig.suptitle("Risk-coverage: abstain on the least confident records first (dots: each gate's own "
                 "operating point)", fontsize=10)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=130)
    finally:
        plt.close(fig)
    return Path(path)


def run_all(ev, cal, run_dir, run_configs=None) -> dict:
    """``gates`` under both judges, reading ``gate_scores.jsonl`` beside the records when present."""
    from mdl_repro.pipeline.gate_scores import SCORES_FILE, load_scores

    scores = load_scores(Path(run_dir) / SCORES_FILE)
    out = {}
    for judge, col in selective.JUDGES.items():
        if col not in ev or ev[col].isna().all():
            continue
        out[judge] = gates(ev, cal, run_dir, judge=judge, scores=scores, run_configs=run_configs)
    return out


def jsonable(res_by_judge: dict) -> dict:
    """The rows and calibration of every judge (curves left out: they are in the figure)."""
    return {j: {k: v for k, v in r.items() if k != "curves"} for j, r in res_by_judge.items()}


__all__ = ["calibrate_threshold", "out_of_fold_threshold", "gates", "gates_md", "figure", "run_all", "jsonable"]
_ = json  # (json used by callers through analysis.json)
