"""What the design can detect: power, judge-error correction, the right constants, validity,
and the smaller fixes (within-dataset null, near-degenerate sweep optima, † by questions). Small records
with known answers; fast."""

import numpy as np
import pandas as pd
import pytest

from mdl_repro.analysis import rigour


def _design(G=100, S=3, c=0.2, seed=0):
    """G questions × S seeds; question g's record difference is +c or −c (alternating) on every seed."""
    g = np.repeat(np.arange(G), S)
    d = np.where(g % 2 == 0, c, -c)
    return d, g


def test_cluster_se_and_mde_closed_form():
    d, g = _design(G=100, S=3, c=0.2)
    # question means are ±0.2 (mean 0), sd (ddof 1) = 0.2·sqrt(G/(G−1)); SE = sd / √G
    se = 0.2 * np.sqrt(100 / 99) / np.sqrt(100)
    assert rigour.cluster_se(d, g) == pytest.approx(se, rel=1e-9)
    assert rigour.mde(se) == pytest.approx((1.959964 + 0.841621) * se)
    # power at the MDE is 80% (the far tail adds ~0); at 0 it is the 5% size
    assert rigour.power(rigour.mde(se), se) == pytest.approx(0.80, abs=0.002)
    assert rigour.power(0.0, se) == pytest.approx(0.05, abs=1e-6)


def test_cluster_se_counts_questions_not_records():
    d, g = _design(G=50, S=1, c=0.3)
    se1 = rigour.cluster_se(d, g)
    d3, g3 = _design(G=50, S=6, c=0.3)  # the same questions repeated on more seeds: no new information
    assert rigour.cluster_se(d3, g3) == pytest.approx(se1)


def test_verdict_never_claims_an_unresolvable_direction():
    assert rigour.verdict(-0.01, (-0.05, 0.03), 0.08, 200, 3).startswith("not resolvable with n = 200")
    assert rigour.verdict(-0.10, (-0.15, -0.05), 0.08, 200, 3, lower="B3 lower") == "B3 lower"
    assert rigour.verdict(0.09, (-0.01, 0.19), 0.08, 200, 3).startswith("no difference of the detectable")
    d = rigour.design(np.r_[np.ones(30), np.zeros(30)], np.r_[np.zeros(30), np.ones(30)] * 0 + 0.5,
                      np.arange(60))
    assert {"diff", "ci", "mde", "verdict", "resolvable"} <= set(d)


def test_auroc_matches_sklearn_and_weights_are_multiplicities():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 200).astype(float)  # ties on purpose
    y = rng.random(200) < 0.3 + 0.1 * s
    assert rigour.auroc(s, y) == pytest.approx(roc_auc_score(y, s))
    w = rng.integers(0, 3, 200).astype(float)
    rep = np.repeat(np.arange(200), w.astype(int))
    assert rigour.auroc_weighted(s, y, w[None, :])[0] == pytest.approx(roc_auc_score(y[rep], s[rep]))
    ci = rigour.auroc_ci(s, y, np.arange(200) // 2, n_boot=50)
    assert ci["ci"][0] <= ci["auroc"] <= ci["ci"][1]


def test_rogan_gladen_recovers_the_truth():
    # a judge of Se 0.8, Sp 0.9 on a true rate 0.3: observed q = 0.8·0.3 + 0.1·0.7 = 0.31
    assert rigour.rogan_gladen(0.31, 0.8, 0.9) == pytest.approx(0.3)
    assert np.isnan(rigour.rogan_gladen(0.5, 0.5, 0.5))  # no information


def _paired_world(n_q=300, seeds=2, p1=0.6, p2=0.3, se=0.8, sp=0.9, seed=0):
    """Paired B1/B2/B3 records (B3 = B2's answer when Active, B1's when Silent) with known true rates,
    judged by a judge of known Se / Sp, and a gold set drawn from the same judge."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n_q):
        act = "ACTIVE" if q % 2 else "SILENT"
        for s in range(seeds):
            t1, t2 = rng.random() < p1, rng.random() < p2
            j1 = rng.random() < (se if t1 else 1 - sp)
            j2 = rng.random() < (se if t2 else 1 - sp)
            base = dict(dataset="d", qid=q, seed=s, ok=True, A=0.5, M=rng.random(), R=0.5, C_final=0.5)
            rows.append(dict(base, system="B1", hallucinated=j1, answer=f"a1-{q}-{s}", action=None))
            rows.append(dict(base, system="B2", hallucinated=j2, answer=f"a2-{q}-{s}", action=None))
            same = act == "ACTIVE"
            rows.append(dict(base, system="B3", hallucinated=j2 if same else j1,
                             answer=f"a2-{q}-{s}" if same else f"a1-{q}-{s}", action=act))
    ev = pd.DataFrame(rows)
    gold = []
    for cond, p in (("memory", p2), ("no memory", p1)):
        t = rng.random(4000) < p
        j = np.where(t, rng.random(4000) < se, rng.random(4000) < 1 - sp)
        gold.append(pd.DataFrame({"dataset": "d", "condition": cond, "gold": t, "judge_paper": j,
                                  "kind": np.where(t, "wrong", "correct")}))
    return ev, pd.concat(gold, ignore_index=True)


def test_judge_error_correction_comes_back_to_the_truth():
    ev, gv = _paired_world()
    je = rigour.judge_error(ev, gv, "paper", "hallucinated", n_draws=300)["d"]
    st = je["stats"]
    assert all(s["identified"] for s in st.values())
    # raw rates are biased towards 0.5 by the judge (0.3 → 0.31, 0.6 → 0.52); corrected ones come back
    for k, truth in (("rate_B1", 0.6), ("rate_B2", 0.3)):
        lo, hi = st[k]["ci"]
        assert lo <= truth <= hi, (k, st[k])
        assert abs(st[k]["corrected"] - truth) < abs(st[k]["raw"] - truth) + 0.01
    assert st["B2-B1"]["sign_holds"] > 0.95  # a −0.3 difference survives the judge's error
    assert je["rogan_gladen"]["B1"] == pytest.approx(0.6, abs=0.05)


def _halves_world(n_q=1000, seeds=2, p_lo=0.30, p_hi=0.70, p1=0.5, se=0.80, sp=0.85, n_gold=4000, seed=1):
    """Two halves of the with-memory answers with true rates ``p_lo`` / ``p_hi`` (the high-risk half,
    A = 0.9, is ``p_hi``), judged by a judge of known Se / Sp in both conditions; B3 is Active with
    B2's answer on the high-risk half and Opt-Out on the other, so B3 is a mixture and its selective
    risk a subset. The gold set holds ``n_gold`` answers per condition judged by the same judge."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n_q):
        hi = q % 2 == 1
        for s in range(seeds):
            t1, t2 = rng.random() < p1, rng.random() < (p_hi if hi else p_lo)
            j1 = rng.random() < (se if t1 else 1 - sp)
            j2 = rng.random() < (se if t2 else 1 - sp)
            base = dict(dataset="d", qid=q, seed=s, ok=True, A=0.9 if hi else 0.3, M=rng.random(), R=0.5,
                        C_final=0.5)
            rows.append(dict(base, system="B1", hallucinated=j1, answer=f"a1-{q}-{s}", action=None))
            rows.append(dict(base, system="B2", hallucinated=j2, answer=f"a2-{q}-{s}", action=None))
            rows.append(dict(base, system="B3", hallucinated=j2 if hi else False,
                             answer=f"a2-{q}-{s}" if hi else "", action="ACTIVE" if hi else "OPT_OUT"))
    gold = []
    for cond, p in (("memory", 0.5), ("no memory", p1)):
        t = rng.random(n_gold) < p
        j = np.where(t, rng.random(n_gold) < se, rng.random(n_gold) < 1 - sp)
        gold.append(pd.DataFrame({"dataset": "d", "condition": cond, "gold": t, "judge_paper": j,
                                  "kind": np.where(t, "wrong", "correct")}))
    return pd.DataFrame(rows), pd.concat(gold, ignore_index=True)


def _pulled_to_the_mean(q_sub, q_all, se, sp):
    """What re-drawing every answer's label from PPV / FOR at the whole condition's prevalence gives
    for a subset of judged rate ``q_sub``: the subset pulled towards the condition's mean."""
    pi = (q_all + sp - 1) / (se + sp - 1)
    ppv = se * pi / (se * pi + (1 - sp) * (1 - pi))
    fomr = (1 - se) * pi / ((1 - se) * pi + sp * (1 - pi))
    return ppv * q_sub + fomr * (1 - q_sub)


def test_matrix_method_recovers_a_difference_between_halves_of_one_condition():
    # true 0.30 vs 0.70 (difference +0.400); the judge (Se 0.80, Sp 0.85) shows 0.345 vs 0.605 (+0.260);
    # fixing the condition's prevalence and re-drawing labels gives J·π(1−π)/(q(1−q)) × 0.260 ≈ +0.170
    ev, gv = _halves_world()
    P = rigour.paired_frame(ev, "hallucinated")
    c = rigour.confusion(gv, "paper")["d"]
    H1, H2, H3, W = rigour.relabel(P, c, n_draws=1000, seed=3, bootstrap=True)
    hi = P["A"].to_numpy() >= 0.7
    diff = (W * H2 * hi).sum(1) / (W * hi).sum(1) - (W * H2 * ~hi).sum(1) / (W * ~hi).sum(1)
    lo, up = np.percentile(diff, [2.5, 97.5])
    h2 = P["h2"].to_numpy()
    judged = h2[hi].mean() - h2[~hi].mean()
    se, sp = c["memory"]["se"], c["memory"]["sp"]
    old = _pulled_to_the_mean(h2[hi].mean(), h2.mean(), se, sp) - _pulled_to_the_mean(h2[~hi].mean(), h2.mean(), se, sp)
    assert lo <= 0.400 <= up, (lo, up)
    assert not lo <= old <= up and not lo <= 0.170 <= up and not lo <= judged <= up, (old, judged, lo, up)

    st = rigour.judge_error(ev, gv, "paper", "hallucinated", n_draws=1000)["d"]["stats"]
    # the high-risk half alone (a subset) and B3's selective risk (B3 = that half, B2 = both halves)
    for k, truth in (("high_risk_B2", 0.70), ("selective risk B3-B2", 0.20), ("rate_B3", 0.35), ("B3-B2", -0.15)):
        assert st[k]["identified"] and st[k]["ci"][0] <= truth <= st[k]["ci"][1], (k, st[k])
    pulled = _pulled_to_the_mean(h2[hi].mean(), h2.mean(), se, sp)
    assert not st["high_risk_B2"]["ci"][0] <= pulled <= st["high_risk_B2"]["ci"][1]
    assert not st["selective risk B3-B2"]["ci"][0] <= pulled - 0.5 <= st["selective risk B3-B2"]["ci"][1]


def test_a_placebo_judge_is_not_identified():
    ev, gv = _halves_world(se=0.5, sp=0.5)
    c = rigour.confusion(gv, "paper")["d"]
    assert not rigour.identification(c["memory"])["identified"]
    assert not rigour.identification(c["no memory"])["identified"]
    je = rigour.judge_error(ev, gv, "paper", "hallucinated", n_draws=200)
    d = je["d"]
    for k, s in d["stats"].items():
        if s["uses"]:  # every statistic whose value moves with the judge's error
            assert not s["identified"] and np.isnan(s["corrected"]) and all(np.isnan(s["ci"])), (k, s)
            assert k not in rigour.COMPARED or np.isnan(s["sign_holds"])
    assert not d["stats"]["MDL-constant"]["identified"]
    assert np.isnan(d["rogan_gladen"]["B1"]) and np.isnan(d["rogan_gladen"]["B2"])
    md = "\n".join(rigour.judge_error_md("paper", je))
    row = next(r for r in md.split("\n") if r.startswith("| MDL-constant |"))
    assert row.endswith("| not identified (with memory and without memory) | not identified |"), row
    assert "Rogan–Gladen B1 not identified, B2 not identified" in md


def test_identification_needs_j_clearly_above_zero():
    good = {"tp": 400, "fn": 100, "tn": 425, "fp": 75}   # Se 0.80, Sp 0.85: J 0.65
    weak = {"tp": 18, "fn": 12, "tn": 17, "fp": 12}      # J ≈ 0.19 on 59 answers: its 5% quantile is below 0.05
    assert rigour.identification(good)["identified"]
    w = rigour.identification(weak)
    assert w["j"] > 0.05 and w["j_q05"] <= rigour.J_FLOOR and not w["identified"]


def test_with_memory_answers_of_b2_and_b3_share_one_draw():
    ev, gv = _paired_world(n_q=40)
    P = rigour.paired_frame(ev, "hallucinated")
    # B3's own answers (not B2's verbatim): Supp answers are with memory, Silent ones without
    P = P.assign(same1=False, same2=False, action=np.where(P["action"] == "ACTIVE", "SUPP", "SILENT"))
    H1, H2, H3, _ = rigour.relabel(P, rigour.confusion(gv, "paper")["d"], n_draws=50)
    mem = (P["action"] == "SUPP").to_numpy()
    h = P["h3"].to_numpy()
    for H, hx, m in ((H2, P["h2"].to_numpy(), mem), (H1, P["h1"].to_numpy(), ~mem)):
        for v in (0.0, 1.0):  # one verdict, one condition, one draw: one corrected label per draw
            a, b = H3[:, m & (h == v)], H[:, m & (hx == v)]
            assert a.size and b.size and np.allclose(a, a[:, :1]) and np.allclose(a[:, 0], b[:, 0])


def test_corrected_interval_carries_the_sampling_variance():
    # gold set so large that Se / Sp are known: the interval is the sampling one, sd(q) / J
    ev, gv = _paired_world(n_q=300, seeds=1, p1=0.5, p2=0.5, seed=3)
    gv = pd.concat([gv] * 25, ignore_index=True)
    st = rigour.judge_error(ev, gv, "paper", "hallucinated", n_draws=1000)["d"]["stats"]
    conf = rigour.confusion(gv, "paper")["d"]
    for k, cond in (("rate_B2", "memory"), ("rate_B1", "no memory")):
        q, c = st[k]["raw"], conf[cond]
        expected = 2 * 1.96 * np.sqrt(q * (1 - q) / 300) / (c["se"] + c["sp"] - 1)
        # a prevalence held fixed across resamples would give an interval ~15% too narrow
        assert st[k]["ci"][1] - st[k]["ci"][0] == pytest.approx(expected, rel=0.10), k
    # no true difference: the sign share sees the sampling noise, and agrees with the interval
    b = st["B2-B1"]
    assert b["raw"] != 0 and b["ci"][0] < 0 < b["ci"][1] and 0.5 <= b["sign_holds"] < 0.975, b


def test_relabel_names_a_missing_condition():
    ev, gv = _paired_world(n_q=10)
    P = rigour.paired_frame(ev, "hallucinated")
    c = rigour.confusion(gv, "paper")["d"]
    with pytest.raises(ValueError, match="conf"):
        rigour.relabel(P, {"memory": c["memory"]})
    with pytest.raises(ValueError, match="n_draws"):
        rigour.relabel(P, c, n_draws=0)


def test_confusion_and_validity_by_condition():
    ev, gv = _paired_world()
    c = rigour.confusion(gv, "paper")["d"]
    assert c["memory"]["se"] == pytest.approx(0.8, abs=0.03) and c["no memory"]["sp"] == pytest.approx(0.9, abs=0.03)
    v = rigour.validity(ev, gv, "paper", "hallucinated")["d"]
    # the judge agrees ~0.86 and M is unrelated to the verdicts; the reader is correct 40% without memory
    assert v["reader_accuracy_no_memory"] == pytest.approx(0.4, abs=0.03)
    assert v["testable"], v["reasons"]
    gv_bad = gv.assign(judge_paper=np.random.default_rng(1).random(len(gv)) < 0.5)
    v2 = rigour.validity(ev, gv_bad, "paper", "hallucinated")["d"]
    assert not v2["testable"] and "agrees with the gold set" in v2["reasons"][0]


def test_per_dataset_constant_is_not_the_pooled_majority():
    df = pd.DataFrame({"dataset": ["a"] * 10 + ["b"] * 10})
    y = np.r_[np.ones(8), np.zeros(2), np.zeros(7), np.ones(3)]  # a: adopt 80%; b: reject 70%
    c = rigour.per_dataset_constant(df, y)
    assert c["by_dataset"]["a"]["label"] == "adopt" and c["by_dataset"]["b"]["label"] == "reject"
    assert c["pooled"] == pytest.approx(0.75)  # the pooled majority would be 0.55


def test_stratified_null_keeps_questions_in_their_dataset():
    from mdl_repro.analysis.complementarity import stratified_question_permutations

    groups = np.repeat(np.arange(20), 3)
    strata = np.where(groups < 8, "a", "b")
    P = stratified_question_permutations(groups, strata, 50, 0)
    assert (strata[P] == strata[None, :]).all()
    # whole questions move: a question's records all get the signals of one question
    assert all(len(set(groups[P[0][groups == g]])) == 1 for g in range(20))


def test_near_degenerate_sweep_optimum_is_flagged():
    from mdl_repro.analysis.sensitivity import degenerate

    msg = degenerate(np.array([0.02, 0.21, 0.30, 0.47]))  # σ = 0.05 in the paired run
    assert msg is not None and "always-reject" in msg and "47% Opt-Out" in msg
    assert degenerate(np.array([0.3, 0.3, 0.2, 0.2])) is None


def test_dagger_follows_questions_not_records():
    from mdl_repro.analysis.report import _cell

    assert "†" in _cell(0.5, 69, 23)      # HaluEval's high-risk cells: 69 records, 23 questions
    assert "†" not in _cell(0.5, 600, 200)


def test_compare_systems_reports_power():
    from mdl_repro.analysis.stats import compare_systems

    rng = np.random.default_rng(0)
    rows = [dict(dataset="truthfulqa", qid=q, seed=s, system=sy, ok=True, A=0.5, h=float(rng.random() < 0.4))
            for q in range(60) for s in range(3) for sy in ("B2", "B3")]
    r = compare_systems(pd.DataFrame(rows), "B3", "B2", "truthfulqa")
    assert r["mde"] > 0 and r["paper_effect"] == pytest.approx(0.004)
    assert 0.0 < r["power_paper"] < 0.2
    if r["ci_lo"] <= 0 <= r["ci_hi"] and abs(r["diff"]) < r["mde"]:
        assert r["verdict"].startswith("not resolvable")


# ------------------------------------------------------------------ the declared family, the run's own gold

def test_holm_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = np.array([0.01, 0.04, 0.03, 0.20, 0.002, 0.5])
    assert rigour.holm(p) == pytest.approx(multipletests(p, method="holm")[1])
    q = rigour.holm(np.array([0.01, np.nan, 0.04]))  # nan does not count towards the family's size
    assert np.isnan(q[1]) and q[[0, 2]] == pytest.approx(multipletests([0.01, 0.04], method="holm")[1])


def test_cluster_t_p_and_tost_use_student_t_on_questions():
    from scipy.stats import t as student

    assert rigour.cluster_t_p(0.02, 0.01, 10) == pytest.approx(2 * student.sf(2.0, 9))
    # equivalent: the 90% t interval inside ±bound; a wide one is not shown equivalent
    e = rigour.tost(0.005, 0.01, 200, 0.05)
    assert e["equivalent"] and -0.05 < e["ci90"][0] < e["ci90"][1] < 0.05
    w = rigour.tost(0.005, 0.04, 200, 0.05)
    assert not w["equivalent"] and w["p"] > 0.05
    with pytest.raises(ValueError, match="bound"):
        rigour.tost(0.0, 0.01, 100, 0.0)


def test_mde_uses_t_below_30_questions():
    from mdl_jax.evaluation.metrics import mde_for

    d, g = _design(G=10, S=2, c=0.2)
    r = rigour.design(d, np.zeros_like(d), g)
    assert r["mde"] == pytest.approx(mde_for(r["se"], 10)) and r["mde"] > rigour.mde(r["se"]) * 1.05
    d, g = _design(G=100, S=2, c=0.2)
    r = rigour.design(d, np.zeros_like(d), g)
    assert r["mde"] == pytest.approx(rigour.mde(r["se"]))


def _family_res(diffs):
    """A rigour result with the three primary statistics per judge, each a design of known difference."""
    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(200), 3)
    res = {"by_judge": {}}
    for j, d in diffs.items():
        des = [rigour.design(d_ + rng.normal(0, 0.3, len(g)), np.zeros(len(g)), g) for d_ in d]
        res["by_judge"][j] = {"b3_minus_b2": {"truthfulqa": des[0]}, "b3_vs_random": {"truthfulqa": des[1]},
                              "vs_constant": des[2]}
    return res


def test_primary_family_is_holm_adjusted_and_reads_equivalence():
    from mdl_repro.pipeline.experiment import primary_family as declared

    dec = declared("2026-01-01")
    assert set(dec["family"]) <= set(rigour.PRIMARY_STATISTICS)
    res = _family_res({"paper": (-0.12, 0.0, 0.002), "ref": (-0.10, 0.03, -0.02)})
    pf = rigour.primary_family(res, dec)
    assert len(pf["rows"]) == 6
    p = np.array([r["p"] for r in pf["rows"]])
    assert np.array([r["p_holm"] for r in pf["rows"]]) == pytest.approx(rigour.holm(p))
    first = pf["rows"][0]
    assert first["name"] == "truthfulqa: B3 - B2" and first["rejected"]
    assert first["p"] == pytest.approx(rigour.cluster_t_p(first["diff"], first["se"], 200))
    null = pf["rows"][1]
    assert not null["rejected"] and null["tost"]["equivalent"]  # ±5 pp with 200 questions: shown equivalent
    md = "\n".join(rigour.primary_md(pf))
    assert "exploratory" in md and "| truthfulqa: B3 - B2 | `paper` |" in md and "equivalent (p =" in md
    # a judge the records lack reads missing; an unknown statistic is refused by name
    res2 = _family_res({"paper": (-0.12, 0.0, 0.002)})
    assert sum(r.get("missing", False) for r in rigour.primary_family(res2, dec)["rows"]) == 3
    with pytest.raises(ValueError, match="unknown statistics.*nonsense"):
        rigour.primary_family(res, dict(dec, family=["nonsense"]))
    assert rigour.primary_family(res, None)["rows"] == []


def test_an_unadjusted_verdict_of_a_family_statistic_carries_the_familys_reading():
    from mdl_repro.pipeline.experiment import primary_family as declared

    res = _family_res({"paper": (-0.12, 0.0, 0.002), "ref": (-0.10, 0.03, -0.02)})
    pf = rigour.primary_family(res, declared("2026-01-01"))
    rows = {(r["name"], r["judge"]): r for r in pf["rows"]}
    for (name, judge), r in rows.items():
        note = rigour.family_note(pf, name, judge)
        assert note.startswith(" (unadjusted; in the declared primary family, Holm p = ")
        assert note.endswith("not resolved at α = 0.05)" if not r["rejected"] else ": resolved at α = 0.05)")
    assert "not resolved" not in rigour.family_note(pf, "truthfulqa: B3 - B2", "paper")  # rejected
    assert rigour.family_note(pf, "halueval: B3 - random abstention", "paper") == ""  # not in the family
    missing = rigour.primary_family(_family_res({"paper": (-0.12, 0.0, 0.002)}), declared("2026-01-01"))
    assert rigour.family_note(missing, "truthfulqa: B3 - B2", "ref") == ""  # a judge the records lack
    assert rigour.family_note({}, "truthfulqa: B3 - B2", "paper") == ""  # no family declared


def test_run_gold_weights_recover_the_judge_on_the_runs_answers():
    """A run where the judge is good on Active questions (most of them) and poor on Silent ones: a gold
    sample with equal answers per cell over-represents the poor cell; weighting each cell by its share
    of the run's answers recovers the judge's Se / Sp on the run's answers, the plain count does not."""
    rng = np.random.default_rng(5)
    rows, gold = [], []
    acc = {"ACTIVE": 0.95, "SILENT": 0.55}  # P(judge right) per cell
    for q in range(1000):
        act = "ACTIVE" if q % 10 else "SILENT"  # 90% Active
        for sy in ("B1", "B2", "B3"):
            rows.append(dict(dataset="d", qid=q, seed=0, system=sy, ok=True, A=0.5, M=0.5, R=0.5, C_final=0.5,
                             hallucinated=False, answer=f"{sy}{q}", action=act if sy == "B3" else None))
    ev = pd.DataFrame(rows)
    truth = {}
    for act in ("ACTIVE", "SILENT"):
        for sy in ("B1", "B2", "B3"):
            for _ in range(400):  # equal cells, large enough to leave little noise
                g = rng.random() < 0.5
                right = rng.random() < acc[act]
                gold.append(dict(dataset="d", qid=0, seed=0, system=sy, b3_action=act,
                                 label="hallucinated" if g else "safe", judge_paper=g if right else not g))
    gv, covered = rigour.run_gold_verdicts(pd.DataFrame(gold), ev)
    assert covered == {"d": {"memory": 1.0, "no memory": 1.0}}
    c = rigour.confusion(gv, "paper")["d"]["no memory"]
    # without memory: B1 on every question (900 Active, 100 Silent) and B3's 100 Silent answers
    truth = (900 * acc["ACTIVE"] + 200 * acc["SILENT"]) / 1100
    assert c["se"] == pytest.approx(truth, abs=0.03) and c["sp"] == pytest.approx(truth, abs=0.03)
    plain = rigour.confusion(gv.drop(columns="weight"), "paper")["d"]["no memory"]
    assert abs(plain["se"] - truth) > 0.1  # the equal-cell count sits halfway between the cells
    assert c["n"] == 1200 and c["n_eff"] < 1200  # unequal weights: fewer effective answers
    with pytest.raises(ValueError, match="gold"):
        rigour.run_gold_verdicts(pd.DataFrame(gold).drop(columns="b3_action"), ev)


def test_views_per_action_sums_to_the_whole_and_reliability_bins_cover_the_records():
    from mdl_repro.analysis import views

    ev, _ = _halves_world(n_q=200)
    P = rigour.paired_frame(ev, "hallucinated")
    pa = views.per_action(P)
    assert set(pa) == {"Active", "Opt-Out"}
    whole = (P["h3"] - P["h2"]).mean()
    assert sum(r["contribution"] for r in pa.values()) == pytest.approx(whole)
    assert pa["Opt-Out"]["diff"] < 0 and pa["Active"]["diff"] == pytest.approx(0.0)
    P = P.assign(C_final=np.linspace(0, 1, len(P)))
    rb = views.reliability(P, n_bins=4)["bins"]
    assert len(rb) == 4 and sum(b["n"] for b in rb) == len(P)
    assert all(b["ci"][0] <= b["safe"] <= b["ci"][1] for b in rb)
    cats = {q: ("big" if q < 180 else f"small{q % 3}") for q in P["qid"].unique()}
    pc = views.per_category(P, cats)
    assert [r["category"] for r in pc] == ["big", "other (3 categories)"]
    assert sum(r["contribution"] for r in pc) == pytest.approx(whole)
    with pytest.raises(ValueError, match="n_bins"):
        views.reliability(P, n_bins=0)
