"""The gates' second protocol: every one-dimensional score fitted the way XGBoost is fitted,
τ per dataset on the evaluation records' oracle labels, out of fold on question-grouped folds
(``gates.out_of_fold_threshold``, ``gates.gates(...)["grouped_folds"]``), on records with known answers."""

import json

import numpy as np
import pandas as pd
import pytest

from mdl_repro.analysis import gates
from mdl_repro.analysis.analyze import _jsonable
from mdl_repro.analysis.oracle import question_folds, stratified_folds


def _records(n_q: int, rng, n_seeds: int = 2, label_noise: float = 0.0):
    """Paired B1/B2/B3 records of one dataset. Half the questions are 'memory helps' (B1 hallucinates,
    B2 and B3 Active safe: every record's oracle label adopt), half 'memory hurts' (B1 and B3 Silent
    safe, B2 hallucinates: every label reject). M = 0.9 on the first, 0.1 on the second, so the
    similarity gate (M without gate_scores.jsonl) separates the labels exactly. ``label_noise``: the
    share of (question, seed) whose three answers are judged the other way (labels flip, M does not)."""
    recs = []
    for q in range(n_q):
        helps = q % 2 == 0
        for s in range(n_seeds):
            flip = rng.random() < label_noise
            h1, h2, act = (1, 0, "ACTIVE") if helps else (0, 1, "SILENT")
            h3 = 0
            if flip:
                h1, h2, h3 = 1 - h1, 1 - h2, 1
            for system, h in (("B1", h1), ("B2", h2), ("B3", h3)):
                recs.append(dict(dataset="truthfulqa", qid=q, seed=s, system=system, hallucinated=bool(h),
                                 hallucinated_ref=bool(h), action=act if system == "B3" else None,
                                 action_name=act if system == "B3" else None, A=0.2,
                                 M=0.9 if helps else 0.1, R=0.5, C_final=0.5, ok=True, failed=False,
                                 latency_s=1.0))
    df = pd.DataFrame(recs)
    df["h"] = df["hallucinated"].astype(float)
    return df


def test_a_separating_score_reaches_accuracy_one_out_of_fold():
    q = np.arange(60)
    groups = np.repeat(q, 3)  # 60 questions × 3 records, one label per question
    y = np.repeat(q % 2, 3)
    # three score levels per class, each on many questions (the cut is a distinct fitted score, the
    # lowest adopted one: a held-out score below every fitted one would not be reached)
    score = np.repeat((q % 2) + 0.1 * ((q // 2) % 3), 3)
    o = gates.out_of_fold_threshold(score, y, groups, question_folds(y, groups, 5, 0))
    assert o["fitted"].all() and np.mean(o["adopt"] == y) == 1.0
    # every fold's cut is the lowest adopt score, above every reject score
    assert all(f[0]["tau"] == 1.0 and f[0]["agreement"] == 1.0 for f in o["folds"])


def test_a_noise_score_sits_at_the_majority_rate(rng):
    n_q = 400
    groups = np.repeat(np.arange(n_q), 3)
    y = (rng.random(len(groups)) < 0.7).astype(int)
    score = np.repeat(rng.random(n_q), 3)  # shared by a question's records, unrelated to the labels
    o = gates.out_of_fold_threshold(score, y, groups, question_folds(y, groups, 5, 0))
    acc, majority = np.mean(o["adopt"] == y), max(y.mean(), 1 - y.mean())
    # out of fold, a cut fitted to noise cannot beat the constant; it loses at most what overfitting costs
    assert majority - 0.06 <= acc <= majority + 0.02


def test_the_folds_are_grouped_no_question_is_both_fitted_and_scored(rng):
    groups = np.repeat(np.arange(30), 4)
    y = rng.integers(0, 2, len(groups))
    folds = question_folds(y, groups, 5, 0)
    scored = np.concatenate([te for _, te in folds])
    assert sorted(scored) == list(range(len(y)))  # each record scored exactly once
    for tr, te in folds:
        assert not set(groups[tr]) & set(groups[te])
    # the property itself: a question's decision does not move when its own labels do
    score = rng.random(len(y))
    base = gates.out_of_fold_threshold(score, y, groups, folds)["adopt"]
    tr0, te0 = folds[0]
    y2 = y.copy()
    y2[te0] = 1 - y2[te0]
    moved = gates.out_of_fold_threshold(score, y2, groups, folds)["adopt"]
    assert np.array_equal(base[te0], moved[te0])
    # record-level folds put a question on both sides: refused
    with pytest.raises(ValueError, match="same questions"):
        gates.out_of_fold_threshold(score, y, groups, stratified_folds(y, 5, 0))
    with pytest.raises(ValueError, match="more than one fold"):
        gates.out_of_fold_threshold(score, y, groups, [folds[0], folds[0]])


def test_each_dataset_gets_its_own_threshold():
    # the same score means adopt in one dataset above 0.5 and in the other above 0.8
    groups = np.arange(200)
    strata = np.repeat(["a", "b"], 100)
    score = np.tile(np.linspace(0, 1, 100), 2)
    y = np.where(strata == "a", score >= 0.5, score >= 0.8).astype(int)
    folds = question_folds(y, groups, 5, 0)
    o = gates.out_of_fold_threshold(score, y, groups, folds, strata=strata)
    assert np.mean(o["adopt"] == y) >= 0.97
    taus = {d: [f[d]["tau"] for f in o["folds"]] for d in ("a", "b")}
    assert all(0.45 <= t <= 0.55 for t in taus["a"]) and all(0.75 <= t <= 0.85 for t in taus["b"])


def test_the_vectorised_calibration_equals_the_brute_force_one(rng):
    for _ in range(20):
        s = rng.integers(0, 6, 40).astype(float)  # many ties
        y = rng.integers(0, 2, 40)
        cand = np.r_[np.unique(s), np.inf]
        agree = np.array([np.mean((s >= t) == y) for t in cand])
        best = np.flatnonzero(agree == agree.max())
        c = gates.calibrate_threshold(s, y)
        assert c["tau"] == cand[best[(len(best) - 1) // 2]] and c["n_tied"] == len(best)
        assert c["agreement"] == pytest.approx(agree.max())


def test_gates_report_both_protocols_side_by_side(tmp_path, rng):
    ev = _records(20, rng)
    # a calibration split on which M separates too: both protocols find the cut
    cal = pd.DataFrame([dict(dataset="truthfulqa", qid=100 + i, seed=0, system="calibration", M=m, R=0.5, A=0.2,
                             hallucinated=m < 0.5, hallucinated_ref=m < 0.5, ok=True, failed=False)
                        for i, m in enumerate([0.1, 0.15, 0.2, 0.85, 0.9, 0.95])])
    res = gates.gates(ev, cal, tmp_path, judge="paper", scores={})
    gf = res["grouped_folds"]
    assert gf["k"] == gates.K_FOLDS and gf["seed"] == 0
    sim = "similarity (best cosine)"
    row = gf["rows"]["truthfulqa"][sim]
    assert row["accuracy"] == 1.0 and row["inject"] == 0.5 and len(row["tau"]) == gates.K_FOLDS
    assert row["vs_constant"]["diff"] == pytest.approx(1.0 - row["constant_accuracy"])
    assert gf["pooled"][sim]["accuracy"] == 1.0
    # the calibration-split protocol's row is unchanged in place, and agrees here
    assert res["rows"]["truthfulqa"][sim]["accuracy"] == 1.0
    # risk-only's −A is constant on these records: out of fold it is the majority constant
    assert gf["rows"]["truthfulqa"]["risk-only (calibrated τ)"]["is_constant"]
    assert any(k.startswith("MDL") for k in gf["rows"]["truthfulqa"])
    try:
        import xgboost  # noqa: F401
    except ImportError:
        pass
    else:
        assert gates.XGB in gf["rows"]["truthfulqa"]
    md = gates.gates_md({"paper": res})
    assert "Both protocols" in md and "grouped folds: accuracy" in md and "calibration split: accuracy" in md
    json.dumps(_jsonable(gates.jsonable({"paper": res})), allow_nan=False)  # analysis.json carries it


def test_grouped_folds_need_no_calibration_split(tmp_path, rng):
    ev = _records(20, rng, label_noise=0.1)
    res = gates.gates(ev, ev.iloc[:0], tmp_path, judge="paper", scores={})
    sim = "similarity (best cosine)"
    assert sim not in res["rows"]["truthfulqa"]  # no split: the calibration-split protocol leaves it out
    row = res["grouped_folds"]["rows"]["truthfulqa"][sim]
    # M still separates the un-flipped (question, seed)s: accuracy 1 − the flipped share, out of fold
    P = ev[ev["system"] == "B3"]
    flipped = np.mean(P["hallucinated"].to_numpy())
    assert row["accuracy"] == pytest.approx(1 - flipped, abs=1e-9)
    assert "Both protocols" in gates.gates_md({"paper": res})


def test_grouped_folds_difference_from_the_constant_carries_the_fold_draws(tmp_path, rng):
    ev = _records(40, rng, label_noise=0.2)
    res = gates.gates(ev, ev.iloc[:0], tmp_path, judge="paper", scores={})
    gf = res["grouped_folds"]
    assert gf["n_fold_draws"] == gates.N_FOLD_DRAWS >= 20
    sim = gf["rows"]["truthfulqa"]["similarity (best cosine)"]
    fd = sim["vs_constant_fold_draws"]
    # the table's folds are the first draw; the interval holds the draws' mean and carries their spread
    assert fd["n_draws"] == gates.N_FOLD_DRAWS
    assert fd["draw_min"] - 1e-12 <= sim["vs_constant"]["diff"] <= fd["draw_max"] + 1e-12
    assert fd["ci"][0] <= fd["diff"] <= fd["ci"][1] and fd["ci"][1] - fd["ci"][0] > 0
    # a score constant on every record decides alike under every fold draw: no spread
    const = gf["rows"]["truthfulqa"]["risk-only (calibrated τ)"]["vs_constant_fold_draws"]
    assert const["draw_min"] == const["draw_max"] and const["draw_sd"] == pytest.approx(0.0, abs=1e-12)
    md = gates.gates_md({"paper": res})
    assert f"over {gates.N_FOLD_DRAWS} draws of the question-grouped folds" in md and "(draws " in md
