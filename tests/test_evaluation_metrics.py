"""mdl_jax.evaluation.metrics: every metric on a case worked by hand, AUROC / AUPRC against scikit-learn,
the intervals against simulations with a known truth, evaluate() over a table's gate columns, and the
errors bad input gets."""

import math

import numpy as np
import pandas as pd
import pytest

from mdl_jax.evaluation import metrics as m

# ----------------------------------------------------------------------------------- hand-worked cases

def test_auroc_counts_pairs_and_ties_score_half():
    # positives 0.35, 0.8 against negatives 0.1, 0.4: (0.35 > 0.1) + (0.8 > 0.1) + (0.8 > 0.4) = 3 of 4
    assert m.auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(3 / 4)
    # ranks 1, 2.5, 2.5, 4 (the two 2s share 2.5): R+ = 2.5 + 4 = 6.5; (6.5 − 2·3/2) / (2·2) = 3.5 / 4
    assert m.auroc([1, 2, 2, 3], [0, 1, 0, 1]) == pytest.approx(0.875)
    # a confidence (higher = the negative class) read with higher_is="negative": 1 − 0.875
    assert m.auroc([1, 2, 2, 3], [0, 1, 0, 1], higher_is="negative") == pytest.approx(0.125)
    assert m.auroc([1, 2, 2, 3], np.array([False, True, False, True])) == pytest.approx(3.5 / 4)


def test_auroc_and_auprc_are_nan_where_undefined():
    assert math.isnan(m.auroc([0.1, 0.2, 0.3], [1, 1, 1]))  # no negative
    assert math.isnan(m.auroc([0.1, 0.2, 0.3], [0, 0, 0]))  # no positive
    assert math.isnan(m.auroc([], []))
    assert math.isnan(m.auprc([0.1, 0.2, 0.3], [0, 0, 0]))  # recall undefined
    assert m.auprc([0.1, 0.2, 0.3], [1, 1, 1]) == 1.0       # precision 1 at every threshold


def test_auprc_is_average_precision_with_ties_at_one_threshold():
    # sorted by score: 0.8 (+), 0.4 (−), 0.35 (+), 0.1 (−): (P, R) = (1, ½), (½, ½), (⅔, 1), (½, 1)
    # AP = ½·1 + 0·½ + ½·⅔ + 0·½ = 5/6
    assert m.auprc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(5 / 6)
    # 3 (+), then the tie at 2 {−, +} enters at once, then 1 (−): (1, ½), (⅔, 1), (½, 1): AP = ½ + ½·⅔
    assert m.auprc([1, 2, 2, 3], [0, 0, 1, 1]) == pytest.approx(5 / 6)


def test_abstention_scores_follow_abstentionbench():
    # abstained 1 1 0 0 1 0, should 1 0 1 0 1 0: TP = 2 (0, 4), FP = 1 (1), FN = 1 (2), TN = 2 (3, 5)
    a, y = [1, 1, 0, 0, 1, 0], [1, 0, 1, 0, 1, 0]
    assert m.abstention_precision(a, y) == pytest.approx(2 / 3)   # 2 / (2 + 1)
    assert m.abstention_recall(a, y) == pytest.approx(2 / 3)      # 2 / (2 + 1)
    assert m.abstention_f1(a, y) == pytest.approx(2 / 3)          # 4 / (4 + 1 + 1)
    assert m.over_refusal_rate(a, y) == pytest.approx(1 / 3)      # FP / answerable = 1 / 3
    # never abstaining: precision undefined, recall 0, F1 2·0 / (0 + 0 + 1) = 0, no over-refusal
    never = [0, 0]
    assert math.isnan(m.abstention_precision(never, [1, 0]))
    assert m.abstention_recall(never, [1, 0]) == 0 and m.abstention_f1(never, [1, 0]) == 0
    assert m.over_refusal_rate(never, [1, 0]) == 0
    assert math.isnan(m.abstention_recall([1, 0], [0, 0])) and math.isnan(m.over_refusal_rate([1, 0], [1, 1]))
    assert math.isnan(m.abstention_f1([0, 0], [0, 0]))


def test_coverage_selective_accuracy_and_crag_score_by_hand():
    # correct 1 0 1 1 0, abstained 0 0 1 0 1: answered 0, 1, 3 with correct 1, 0, 1
    c, a = [1, 0, 1, 1, 0], [0, 0, 1, 0, 1]
    assert m.coverage(a) == pytest.approx(3 / 5)
    assert m.selective_accuracy(c, a) == pytest.approx(2 / 3)
    assert m.selective_risk(c, a) == pytest.approx(1 / 3)
    # CRAG: +1, −1, 0, +1, 0 → 1/5
    assert m.crag_score(c, a) == pytest.approx(1 / 5)
    assert math.isnan(m.selective_accuracy([1, 0], [1, 1]))  # nothing answered


def test_aurc_answers_the_least_abstaining_first():
    # abstain scores 0.1 (right), 0.2 (right), 0.5 (wrong), 0.9 (wrong): answered in that order, the
    # errors 0, 0, 1, 1 give risks 0, 0, 1/3, 2/4 and AURC (1/3 + 1/2) / 4 = 5/24
    c, s = [1, 0, 1, 0], [0.1, 0.9, 0.2, 0.5]
    assert m.aurc(c, s) == pytest.approx(5 / 24)
    # the same ranking as a confidence (higher = answer) with higher_is="negative"
    assert m.aurc(c, [-x for x in s], higher_is="negative") == pytest.approx(5 / 24)
    # a constant score ranks nothing: the curve is flat at the error rate, 2 of 4
    assert m.aurc([1, 0, 0, 1], [0.3] * 4) == pytest.approx(0.5)
    # the library's risk_coverage (h = 1 − correct, confidence = −score) is the same curve
    assert m.risk_coverage([0, 1, 0, 1], [-x for x in s]).aurc == pytest.approx(5 / 24)


def test_adaptive_retrieval_metrics_by_hand():
    # retrieve 1 0 1 0 picks correct_with[0] = 1, correct_without[1] = 1, correct_with[2] = 0,
    # correct_without[3] = 1: In-Accuracy 3/4
    assert m.in_accuracy([1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 1]) == pytest.approx(3 / 4)
    assert m.retrieval_calls([1, 0, 1, 0]) == pytest.approx(0.5)
    assert m.retrieval_calls([2, 0, 1, 1]) == pytest.approx(1.0)  # multi-round: calls per question
    # correct_without 0 0 1 1, correct_with 1 0 1 0: AdaRAGUE's oracle "wrong without retrieval" is
    # 1 1 0 0; "helps" (wrong without, right with) is 1 0 0 0
    cwo, cw = [0, 0, 1, 1], [1, 0, 1, 0]
    assert m.retrieval_oracle(cwo).tolist() == [True, True, False, False]
    assert m.retrieval_oracle(cwo, cw, rule="helps").tolist() == [True, False, False, False]
    # retrieve scores 0.9, 0.2 (needed) vs 0.5, 0.1: 0.9 > both, 0.2 > 0.1 only → 3/4; under "helps"
    # 0.9 alone is needed and beats all three → 1
    s = [0.9, 0.2, 0.5, 0.1]
    assert m.retrieval_auroc(s, cwo) == pytest.approx(3 / 4)
    assert m.retrieval_auroc(s, cwo, cw, rule="helps") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="correct_with"):
        m.retrieval_oracle(cwo, rule="helps")


# ------------------------------------------------------------------------------ against scikit-learn

def test_auroc_and_auprc_equal_scikit_learn_on_random_data_with_ties(rng):
    sk = pytest.importorskip("sklearn.metrics")
    for _ in range(30):
        n = int(rng.integers(2, 300))
        y = rng.integers(0, 2, n)
        if y.min() == y.max():
            continue
        for s in (rng.normal(size=n) + y, rng.integers(0, 6, n) / 5.0):  # continuous, and heavily tied
            assert m.auroc(s, y) == pytest.approx(sk.roc_auc_score(y, s), abs=1e-12)
            assert m.auprc(s, y) == pytest.approx(sk.average_precision_score(y, s), abs=1e-12)


# ------------------------------------------------------------------------------------ the intervals

def test_bootstrap_moves_whole_questions():
    g = np.repeat(np.arange(10), 3)
    # a resample holds each drawn question's 3 records together, so every count is a multiple of 3
    whole = m.bootstrap(lambda q: float(np.all(np.bincount(q)[np.unique(q)] % 3 == 0)), g, groups=g, n_boot=200)
    assert whole.value == whole.lo == whole.hi == 1.0
    assert (whole.n, whole.n_groups) == (30, 10)
    one = m.bootstrap(np.mean, np.arange(5.0), groups=np.zeros(5))
    assert one.value == 2.0 and math.isnan(one.lo) and math.isnan(one.hi) and one.n_groups == 1


def test_bootstrap_of_a_library_metric_equals_the_same_metric_called_as_any_function(rng):
    # the library's metrics are validated once and recomputed through their kernels: the same numbers
    n = 60
    s, y, c, a, g = rng.normal(size=n), rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 2, n), \
        np.repeat(np.arange(20), 3)
    for metric, cols in ((m.auroc, (s, y)), (m.auprc, (s, y)), (m.aurc, (c, s)), (m.crag_score, (c, a)),
                         (m.abstention_f1, (a, y)), (m.coverage, (a,)), (m.in_accuracy, (a, c, y)),
                         (m.retrieval_calls, (a,)), (m.retrieval_auroc, (s, c)), (m.selective_risk, (c, a))):
        fast = m.bootstrap(metric, *cols, groups=g, n_boot=50)
        plain = m.bootstrap(lambda *x, f=metric: f(*x), *cols, groups=g, n_boot=50)
        assert fast == plain, metric.__name__


def _clustered(rng, T, G, k, mu, su, se):
    """T data sets of G questions × k records: label per question, score = mu·label + u_question + e."""
    y = np.repeat(rng.integers(0, 2, (T, G)), k, axis=1)
    u = np.repeat(rng.normal(0, su, (T, G)), k, axis=1)
    return y, u + rng.normal(0, se, (T, G * k)) + mu * y


def test_bootstrap_interval_covers_a_known_auroc_in_about_95_percent():
    # Pairs of records from different questions differ by mu + N(0, 2(su² + se²)) in score, so the true
    # AUROC is Φ(mu / √(2(su² + se²))) = Φ(2 / √10). 200 data sets: a 95% interval's coverage has a
    # binomial SD of 1.5 points there, and a percentile interval on 50 questions runs a little short
    # (0.905-0.945 over three seeds of this design): accepted in [0.88, 0.99]. Resampling records instead
    # of questions ignores that a question's 3 records share u (intraclass correlation 0.8) and covers
    # far less (0.67-0.78).
    rng = np.random.default_rng(7)
    T, G, k = 200, 50, 3
    truth = 0.5 * math.erfc(-(2 / math.sqrt(10)) / math.sqrt(2))
    y, s = _clustered(rng, T, G, k, mu=2.0, su=2.0, se=1.0)
    g = np.repeat(np.arange(G), k)
    by_q = [m.bootstrap(m.auroc, s[t], y[t], groups=g, n_boot=200, seed=t) for t in range(T)]
    by_r = [m.bootstrap(m.auroc, s[t], y[t], n_boot=200, seed=t) for t in range(T)]
    cover_q = np.mean([e.lo <= truth <= e.hi for e in by_q])
    cover_r = np.mean([e.lo <= truth <= e.hi for e in by_r])
    assert 0.88 <= cover_q <= 0.99, cover_q
    assert cover_r < cover_q - 0.1, (cover_r, cover_q)
    assert abs(np.mean([e.value for e in by_q]) - truth) < 0.01  # the estimate itself is unbiased


def test_paired_difference_interval_covers_a_known_auroc_difference():
    # Two gates on the same records and questions: gate a's score mu_a·label + u + e_a, gate b's
    # mu_b·label + u + e_b; truth Φ(mu_a / 2) − Φ(mu_b / 2) (su = se = 1). 200 data sets, accepted in
    # [0.88, 0.99] as above.
    rng = np.random.default_rng(11)
    T, G, k = 200, 40, 2
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    truth = phi(1.6 / 2) - phi(0.8 / 2)
    y = np.repeat(rng.integers(0, 2, (T, G)), k, axis=1)
    u = np.repeat(rng.normal(0, 1, (T, G)), k, axis=1)
    sa = 1.6 * y + u + rng.normal(0, 1, (T, G * k))
    sb = 0.8 * y + u + rng.normal(0, 1, (T, G * k))
    g = np.repeat(np.arange(G), k)
    d = [m.paired_difference(m.auroc, (sa[t], y[t]), (sb[t], y[t]), g, n_boot=200, seed=t) for t in range(T)]
    cover = np.mean([e.lo <= truth <= e.hi for e in d])
    assert 0.88 <= cover <= 0.99, cover


def test_paired_difference_of_a_gate_with_itself_is_exactly_zero(rng):
    n = 90
    y, s, g = rng.integers(0, 2, n), rng.normal(size=n), np.repeat(np.arange(30), 3)
    for metric, cols in ((m.auroc, (s, y)), (m.auprc, (s, y)), (m.crag_score, (y, s > 0))):
        d = m.paired_difference(metric, cols, cols, g, n_boot=300)
        assert (d.value, d.lo, d.hi, d.se, d.mde) == (0.0, 0.0, 0.0, 0.0, 0.0)


def test_a_percentile_interval_at_level_l_leaves_half_of_1_minus_l_in_each_tail():
    # The mean of 400 standard-normal values: its resampled means are close to normal with SD s/√G (s the
    # values' SD), so the level-l interval's half-width is z_{(1+l)/2}·s/√G (1.96, 1.28, 0.67 standard
    # errors at 95%, 80%, 50%); 4,000 resamples put each end within ~1.5% of it.
    x = np.random.default_rng(5).normal(size=400)
    se = x.std() / math.sqrt(len(x))
    for level, z in ((0.95, 1.959964), (0.80, 1.281552), (0.50, 0.674490)):
        e = m.bootstrap(np.mean, x, n_boot=4000, level=level)
        assert (e.hi - e.lo) / (2 * se) == pytest.approx(z, rel=0.04), level
        assert e.lo < e.value < e.hi


def test_one_seed_draws_the_same_questions_for_bootstrap_and_paired_difference():
    # "the same seed draws the same questions for every metric": a gate against a gate of zeros resamples
    # mean(x) exactly as the bootstrap of mean(x) does, seed by seed; another seed draws other questions
    rng = np.random.default_rng(2)
    x, g = rng.normal(size=60), np.repeat(np.arange(20), 3)
    got = {}
    for seed in (0, 1, 7):
        e = m.bootstrap(np.mean, x, groups=g, n_boot=300, seed=seed)
        d = m.paired_difference(np.mean, x, np.zeros(60), g, n_boot=300, seed=seed)
        assert (e.value, e.lo, e.hi) == (d.value, d.lo, d.hi), seed
        got[seed] = (e.lo, e.hi)
    assert len(set(got.values())) == 3


def test_paired_difference_is_gate_a_minus_gate_b():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 2, 200)
    good, poor = y + rng.normal(0, 0.5, 200), y + rng.normal(0, 3.0, 200)
    d = m.paired_difference(m.auroc, (good, y), (poor, y), n_boot=500)
    assert d.value == m.auroc(good, y) - m.auroc(poor, y) and d.value > 0.2
    assert 0 < d.lo < d.value < d.hi
    flipped = m.paired_difference(m.auroc, (poor, y), (good, y), n_boot=500)
    assert (flipped.value, flipped.lo, flipped.hi) == pytest.approx((-d.value, -d.hi, -d.lo), abs=1e-12)


def test_every_question_is_drawn_with_equal_chance():
    # 5 questions of 2 records: each resample draws 5 questions (10 records), each question a fifth of the time
    from mdl_jax.evaluation.metrics.intervals import question_layout, resamples

    g = np.repeat(np.array([3, 1, 4, 0, 2]), 2)
    draws = list(resamples(question_layout(g, 10), 2000, seed=0))
    assert all(len(r) == 10 for r in draws)
    share = np.bincount(g[np.concatenate(draws)], minlength=5) / (10 * 2000)
    np.testing.assert_allclose(share, 0.2, atol=0.01)


def test_paired_difference_se_is_the_sample_sd_of_the_resampled_differences():
    # the bootstrap standard error: the resampled differences' SD with B − 1 in the denominator
    from mdl_jax.evaluation.metrics.intervals import question_layout, resamples

    rng = np.random.default_rng(6)
    a, b, g = rng.normal(size=40), rng.normal(size=40), np.repeat(np.arange(20), 2)
    d = m.paired_difference(np.mean, a, b, g, n_boot=5, seed=3)
    diffs = [np.mean(a[i]) - np.mean(b[i]) for i in resamples(question_layout(g, 40), 5, 3)]
    assert d.se == pytest.approx(np.std(diffs, ddof=1), rel=1e-12)


def test_mde_has_80_percent_power_at_its_size():
    # Per-record differences with question effects: d = δ + v_question + e, 60 questions × 2 records.
    # The true SE of mean(d) is √((1 + ½·1) / 60); at δ = (z_0.975 + z_0.80)·SE a two-sided 5% test
    # resolves the difference 80% of the time: the share of 200 intervals that exclude 0 is accepted
    # in [0.70, 0.90] (binomial SD 2.8 points at 0.8), and the bootstrap MDE averages within 10% of
    # the true one.
    rng = np.random.default_rng(3)
    T, G, k = 200, 60, 2
    se_true = math.sqrt((1 + 0.5) / G)
    delta = (m.Z_A + m.Z_B) * se_true
    d = delta + np.repeat(rng.normal(0, 1, (T, G)), k, axis=1) + rng.normal(0, 1, (T, G * k))
    g = np.repeat(np.arange(G), k)
    zeros = np.zeros(G * k)
    res = [m.paired_difference(np.mean, d[t], zeros, g, n_boot=300, seed=t) for t in range(T)]
    power = np.mean([e.lo > 0 or e.hi < 0 for e in res])
    assert 0.70 <= power <= 0.90, power
    assert np.mean([e.mde for e in res]) == pytest.approx(delta, rel=0.1)


def test_mde_uses_t_below_30_questions_and_z_from_30():
    stats = pytest.importorskip("scipy.stats")
    for G in range(2, 30):
        want = stats.t.ppf(0.975, G - 1) + stats.t.ppf(0.80, G - 1)
        assert m.mde_for(1.0, G) == pytest.approx(want, abs=2e-6)
    assert m.mde_for(1.0, 30) == m.mde(1.0) == pytest.approx(stats.norm.ppf(0.975) + stats.norm.ppf(0.8), abs=2e-6)
    assert math.isnan(m.mde_for(1.0, 1))


# --------------------------------------------------------------------------------------- evaluate

def _table(rng, G=60, k=2):
    n = G * k
    y = rng.integers(0, 2, n)
    return {"qid": np.repeat(np.arange(G), k), "label": y, "mdl": y + rng.normal(0, 1, n),
            "correct": rng.integers(0, 2, n), "with": rng.integers(0, 2, n), "without": rng.integers(0, 2, n),
            "mine_conf": -(0.5 * y + rng.normal(0, 1, n)), "refuses": rng.integers(0, 2, n)}


def test_evaluate_puts_a_users_column_beside_mdls(rng):
    t = _table(rng)
    out = pd.DataFrame(m.evaluate(t, gates={"MDL": "mdl", "mine": "mine_conf", "refuses": "refuses"},
                                  label="label", groups="qid", correct="correct", correct_with="with",
                                  correct_without="without", thresholds={"MDL": 0.5, "mine": -0.2},
                                  higher_is={"mine": "negative"}, n_boot=100))
    assert set(out["gate"]) == {"MDL", "mine", "refuses"}
    assert list(out.columns) == ["gate", "metric", "value", "lo", "hi", "n", "n_groups"]
    row = out.set_index(["gate", "metric"])
    # the user's confidence, read with higher_is="negative", scored exactly as the functions score it
    assert row.loc[("mine", "auroc"), "value"] == m.auroc(t["mine_conf"], t["label"], higher_is="negative")
    abst = t["mine_conf"] <= -0.2
    assert row.loc[("mine", "abstention_recall"), "value"] == m.abstention_recall(abst, t["label"])
    assert row.loc[("mine", "crag_score"), "value"] == m.crag_score(t["correct"], abst)
    assert row.loc[("mine", "in_accuracy"), "value"] == m.in_accuracy(~abst, t["with"], t["without"])
    assert row.loc[("MDL", "retrieval_auroc"), "value"] == pytest.approx(
        m.retrieval_auroc(t["mdl"], t["without"], higher_is="negative"))
    # a binary column is its own decision without a threshold
    assert row.loc[("refuses", "coverage"), "value"] == m.coverage(t["refuses"])
    assert (out["n"] == 120).all() and (out["n_groups"] == 60).all()
    assert (out["lo"] <= out["value"] + 1e-12).all() and (out["value"] <= out["hi"] + 1e-12).all()
    # every gate's rows come from the same resampled questions as bootstrap() with the same seed
    e = m.bootstrap(m.auroc, t["mdl"], t["label"], groups=t["qid"], n_boot=100)
    assert row.loc[("MDL", "auroc"), "lo"] == e.lo
    assert row.loc[("MDL", "auroc"), "hi"] == e.hi


def test_evaluate_gives_a_continuous_gate_without_threshold_only_its_ranking(rng):
    t = pd.DataFrame(_table(rng))
    out = m.evaluate(t, gates=["mdl"], label="label", correct="correct", n_boot=20)
    assert isinstance(out, pd.DataFrame)
    assert sorted(out["metric"]) == ["auprc", "aurc", "auroc"]
    # a user's scores as an array beside a column of the table
    mine = rng.normal(size=len(t))
    both = m.evaluate(t, gates={"MDL": "mdl", "mine": mine}, label="label", n_boot=20, as_frame=False)
    assert both["gate"] == ["MDL", "MDL", "mine", "mine"]
    assert both["value"][2] == m.auroc(mine, t["label"])
    assert out["n_groups"].iloc[0] == len(t)  # no groups: every record its own question


# ------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, arg", [
    (lambda: m.auroc([0.1, 0.2, 0.3], [0, 1, 0, 1]), "label"),
    (lambda: m.auroc([0.1, 0.2, 0.3], [0, 2, 1]), "label"),
    (lambda: m.auroc([0.1, np.nan, 0.3], [0, 1, 1]), "score"),
    (lambda: m.auprc([0.1, 0.2], [0.5, 1]), "label"),
    (lambda: m.auroc([0.1, 0.2], [0, 1], higher_is="up"), "higher_is"),
    (lambda: m.abstention_f1([1, 0, 1], [1, 0]), "should_abstain"),
    (lambda: m.selective_risk([1, 0], ["a", "b"]), "abstained"),
    (lambda: m.in_accuracy([1, 0], [1, 1], [1, 0, 1]), "correct_without"),
    (lambda: m.retrieval_calls([1, -1]), "calls"),
    (lambda: m.aurc([1, 0], [[0.1], [0.2]]), "score"),
    (lambda: m.bootstrap(m.auroc, [0.1, 0.2], [0, 1, 1]), "columns"),
    (lambda: m.bootstrap(m.auroc, [0.1, 0.2], [0, 1], n_boot=0), "n_boot"),
    (lambda: m.paired_difference(m.auroc, ([0.1, 0.2], [0, 1]), ([0.1], [0]), None), "cols_b"),
    (lambda: m.evaluate({"s": [0.1, np.nan], "y": [0, 1]}, gates=["s"], label="y"), "gates\\['s'\\]"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="nope"), "label"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", groups=[1, 2, 3]), "groups"),
    (lambda: m.evaluate({"s": [0.1, 0.2]}, gates=["s"]), "label"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", thresholds={"t": 0.5}), "thresholds"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", higher_is="up"), "higher_is"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], correct_with="y"), "correct_without"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", thresholds=np.nan), "thresholds"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", thresholds="abc"),  # type: ignore[arg-type]
     "thresholds"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", thresholds={"s": [0.5]}),  # type: ignore[dict-item]
     "thresholds\\['s'\\]"),
    (lambda: m.evaluate({0: [0.1, 0.2], 1: [0, 1]}, gates=[0], label=2), "label: no column 2"),
    # a column named with no table to hold it; as_frame that is no bool ("no" read as True)
    (lambda: m.evaluate(None, gates=["s"], label="y"), r"^gates\['s'\]: 's' names a column, but table is a NoneType"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", as_frame="no"),  # type: ignore[arg-type]
     r"^as_frame: expected True, False or None, got 'no'$"),
    # a short gate column is named with the lengths; a label that differs from the gates is named
    (lambda: m.evaluate({"s": [0.1, 0.2], "t": [0.3], "y": [0, 1]}, gates=["s", "t"], label="y"),
     r"^gates: expected columns of one length \(one value per record\), got 's': 2, 't': 1$"),
    (lambda: m.evaluate({"s": [0.1], "y": [0, 1]}, gates=["s"], label="y"),
     r"^label: expected 1 values \(one per record, as many as the gates' columns\), got 2$"),
    (lambda: m.risk_coverage([1, 0, 1], [0.1, 0.2]), "score"),
    (lambda: m.risk_coverage([1, 0, 1], [0.1, np.nan, 0.3]), "score"),
    (lambda: m.rates([1, 0, 1], [True, False]), "answered"),
    (lambda: m.bootstrap(m.auroc, [1, 2, 3], [0, 1, 1], groups=pd.Series(["a", np.nan, "b"])), "groups.*index 1"),
    (lambda: m.bootstrap(m.auroc, [1, 2, 3], [0, 1, 1], groups=np.array(["a", None, "b"], object)), "groups"),
    (lambda: m.bootstrap(m.auroc, [1, 2, 3], [0, 1, 1], groups=np.array(["a", 1, "b"], object)), "groups.*ordered"),
    (lambda: m.bootstrap(m.auroc, [1, 2, 3], [0, 1, 1], level="0.9"),  # type: ignore[arg-type]
     "level"),
    (lambda: m.bootstrap(m.auroc, [1, 2, 3], [0, 1, 1], seed=-1), "seed"),
    (lambda: m.evaluate({"s": [0.1, 0.2], "y": [0, 1]}, gates=["s"], label="y", seed=-1), "seed"),
    (lambda: m.mde_for(1.0, 10.0), "n_groups"),  # type: ignore[arg-type]
    (lambda: m.mde_for(-1.0, 50), "se"),
    (lambda: m.auroc([1, 2, 3], pd.array([True, None, False], dtype="boolean")), "label.*index 1"),
    (lambda: m.bootstrap_mean_ci([1.0, 2.0], n_boot=0), "n_boot"),
    (lambda: m.cluster_bootstrap_diff([1, 0, 1], [0, 1], [1, 2, 3]), "b"),
    (lambda: m.question_bootstrap_weights([], 3), "groups"),
])
def test_bad_input_is_a_value_error_naming_the_argument(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_evaluate_reads_a_frames_integer_column_labels_and_a_paired_difference_takes_series():
    s, y = np.r_[0.1, 0.9, 0.4, 0.7], np.r_[0, 1, 0, 1]
    frame = m.evaluate(pd.DataFrame({0: s, 1: y}), gates=[0], label=1, n_boot=20)
    by_name = m.evaluate({"s": s, "y": y}, gates={0: "s"}, label="y", n_boot=20, as_frame=True)
    assert frame["value"].tolist() == by_name["value"].tolist()
    series = m.paired_difference(m.coverage, pd.Series([1, 0, 1, 0]), [1, 1, 0, 0], n_boot=50)
    arrays = m.paired_difference(m.coverage, (np.r_[1, 0, 1, 0],), (np.r_[1, 1, 0, 0],), n_boot=50)
    assert series == arrays


def test_integer_gate_keys_name_their_gate_everywhere_and_two_keys_of_one_name_are_refused():
    df = pd.DataFrame({0: np.r_[0.1, 0.9, 0.4, 0.7], 1: [0, 1, 0, 1], "0": [0.2, 0.3, 0.4, 0.5]})
    out = m.evaluate(df, gates=[0], label=1, thresholds={0: 0.5}, higher_is={0: "positive"}, n_boot=10)
    assert set(out["gate"]) == {"0"} and "coverage" in set(out["metric"])
    with pytest.raises(ValueError, match="gates: two gates named '0'"):
        m.evaluate(df, gates=[0, "0"], label=1, n_boot=10)
    with pytest.raises(ValueError, match="thresholds: names no gate"):
        m.evaluate(df, gates=[0], label=1, thresholds={0: 0.5, "x": 0.5, 3: 0.2}, n_boot=10)


def test_columns_given_as_an_iterator_are_all_read_and_any_orderable_question_ids_work():
    w, y, v = np.r_[1, 0, 1, 0], np.r_[1, 1, 0, 0], np.r_[0, 0, 1, 1]
    acc = lambda a, b: float(np.mean(a == b))  # noqa: E731
    assert (m.paired_difference(acc, (c for c in (w, y)), iter((v, y)), n_boot=20)
            == m.paired_difference(acc, (w, y), (v, y), n_boot=20))
    s, lab = np.r_[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], np.r_[0, 1, 0, 1, 0, 1]
    tuples = pd.Series([("d", 1), ("d", 1), ("d", 2), ("d", 2), ("e", 1), ("e", 1)])
    assert m.bootstrap(m.auroc, s, lab, groups=tuples, n_boot=20) == m.bootstrap(
        m.auroc, s, lab, groups=[0, 0, 1, 1, 2, 2], n_boot=20)
    with pytest.raises(ValueError, match="groups: expected question ids that can be ordered"):
        m.bootstrap(m.auroc, s, lab, groups=np.array(["a", "a", b"b", b"b", "c", "c"], object))
    with pytest.raises(ValueError, match="n_resamples"):
        m.question_bootstrap_weights(["a", "b"], 0)


def test_analysis_keeps_the_moved_names():
    from mdl_repro.analysis import rigour, selective, stats

    assert stats.cluster_se is m.cluster_se and stats.mde is m.mde and stats.N_BOOT == m.N_BOOT
    assert stats.cluster_bootstrap_diff is m.cluster_bootstrap_diff
    assert stats.question_bootstrap_weights is m.question_bootstrap_weights
    assert stats.bootstrap_mean_ci is m.bootstrap_mean_ci
    assert selective.rates is m.rates and selective.risk_coverage is m.risk_coverage and selective.Curve is m.Curve
    assert rigour.auroc_weighted is m.auroc_weighted and rigour.cluster_se is m.cluster_se


# The public names of the single module the package replaced; callers import every one of them from
# ``mdl_jax.evaluation.metrics``.
PUBLIC_NAMES = (
    "Curve", "Difference", "Estimate", "MIN_GROUPS_Z", "NAN", "N_BOOT", "RULES", "SIGNS", "Z_A", "Z_B",
    "abstention_f1", "abstention_precision", "abstention_recall", "aurc", "auprc", "auroc", "auroc_weighted",
    "bootstrap", "bootstrap_mean_ci", "cluster_bootstrap_diff", "cluster_se", "coverage", "crag_score",
    "evaluate", "in_accuracy", "mde", "mde_for", "over_refusal_rate", "paired_difference",
    "question_bootstrap_weights", "rates", "retrieval_auroc", "retrieval_calls", "retrieval_oracle",
    "risk_coverage", "selective_accuracy", "selective_risk",
)


def test_every_public_name_of_the_metrics_module_is_still_importable_from_it():
    missing = [n for n in PUBLIC_NAMES if not hasattr(m, n)]
    assert not missing, missing
    assert set(m.__all__) == set(PUBLIC_NAMES)


def test_no_metrics_module_imports_a_private_name_from_another():
    import ast
    from pathlib import Path

    bad = []
    for p in sorted(Path(m.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mdl_jax"):
                bad += [f"{p.name}: {a.name} from {node.module}" for a in node.names if a.name.startswith("_")]
    assert not bad, bad


def test_every_metrics_module_has_one_job_under_the_size_limit():
    from pathlib import Path

    for p in sorted(Path(m.__file__).parent.glob("*.py")):
        text = p.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 600, p.name
        assert text.startswith('"""'), f"{p.name}: no module docstring saying why it exists"


def test_the_bootstrap_recomputes_a_library_metric_through_its_kernel_with_the_same_result():
    # the kernel path (checks once, then the kernel per resample) and the plain callable path agree
    rng = np.random.default_rng(3)
    s, y, g = rng.normal(size=60), rng.integers(0, 2, 60), np.repeat(np.arange(20), 3)
    fast = m.bootstrap(m.auroc, s, y, groups=g, n_boot=200, seed=1)
    slow = m.bootstrap(lambda a, b: m.auroc(a, b), s, y, groups=g, n_boot=200, seed=1)
    assert fast == slow


@pytest.mark.parametrize("metric, match", [
    (lambda s, y: s, r"^metric: expected one number from the metric, got ndarray"),
    (lambda s, y: None, r"^metric: expected one number from the metric, got NoneType"),
    (lambda s, y: "x", r"^metric: expected one number from the metric, got str"),
    (5, r"^metric: expected a function of the columns returning a float, got int"),
])
def test_a_metric_that_is_not_a_function_of_one_number_is_an_error_naming_it(metric, match):
    # before: a TypeError from float() (an array, None), NumPy's words (a string), "'int' object is not callable"
    from mdl_jax.evaluation.metrics import bootstrap, paired_difference

    s, y = np.array([0.1, 0.9, 0.4, 0.6]), np.array([0, 1, 0, 1])
    with pytest.raises(ValueError, match=match):
        bootstrap(metric, s, y, n_boot=5)
    with pytest.raises(ValueError, match=match):
        paired_difference(metric, (s, y), (s, y), n_boot=5)


@pytest.mark.parametrize("se", [-1.0, "x", None, True])
def test_mde_refuses_a_standard_error_that_is_negative_or_not_a_number_as_mde_for_does(se):
    # before: mde(-1) was a negative MDE, mde("x") a TypeError
    from mdl_jax.evaluation.metrics import mde, mde_for

    with pytest.raises(ValueError, match=r"^se: expected a non-negative standard error"):
        mde(se)
    with pytest.raises(ValueError, match=r"^se: expected a non-negative standard error"):
        mde_for(se, 40)


# --------------------------------------------------------------- the record-level helpers' bad input

@pytest.mark.parametrize("call, arg", [
    # a missing question id was a bare TypeError from np.unique's sort (None), or NaNs pooled into one
    # question (NumPy 2's unique treats every NaN as one value)
    (lambda: m.cluster_se([1.0, 2.0, 3.0], [0, None, 2]), "groups.*index 1"),
    (lambda: m.cluster_se([1.0, 2.0, 3.0], [0.0, np.nan, np.nan]), "groups.*NaN at index 1"),
    (lambda: m.cluster_bootstrap_diff([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0, None, 2], n_boot=10), "groups.*index 1"),
    (lambda: m.cluster_bootstrap_diff([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0.0, np.nan, np.nan], n_boot=10),
     "groups.*NaN"),
    (lambda: m.bootstrap_mean_ci([1.0, 2.0, 3.0], n_boot=10, groups=np.array(["a", None, "b"], object)), "groups"),
    (lambda: m.question_bootstrap_weights([0, None], 3), "groups.*index 1"),
    (lambda: m.question_bootstrap_weights([0.0, np.nan, np.nan], 3), "groups.*NaN"),
    (lambda: m.cluster_se([1.0, 2.0], np.array(["a", 1], object)), "groups.*ordered"),
    # lengths and values: NumPy's "The weights and list don't have the same length", "could not convert"
    (lambda: m.cluster_se([1.0, 2.0, 3.0], [0, 1]), "groups: expected 3 values"),
    (lambda: m.cluster_se(["a", 2.0, 3.0], [0, 1, 2]), "^d: expected numbers"),
    (lambda: m.cluster_se(np.ones((3, 2)), [0, 1, 2]), "^d: expected a 1-D column"),
    (lambda: m.cluster_bootstrap_diff(["a", "b"], [0.0, 0.0], [0, 1], n_boot=10), "^a: expected numbers"),
    (lambda: m.bootstrap_mean_ci(["a", "b"], n_boot=10), "^x: expected numbers"),
])
def test_the_record_level_helpers_name_a_bad_column_or_a_missing_question_id(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_the_record_level_helpers_give_the_same_numbers_on_good_input(rng):
    g = np.repeat(np.arange(12), 3).astype(str)
    d = rng.normal(size=36)
    _, inv = np.unique(g, return_inverse=True)
    s, n = np.bincount(inv, weights=d), np.bincount(inv).astype(float)
    ref = np.sqrt(np.sum((s - d.mean() * n) ** 2) / 36 ** 2 * 12 / 11)
    assert m.cluster_se(d, g) == pytest.approx(ref, rel=1e-12)
    assert m.cluster_se(list(d), list(g)) == m.cluster_se(d, g)
    assert math.isnan(m.cluster_se([1.0, np.nan], [0, 1]))  # a NaN value still gives NaN, as before
    assert m.question_bootstrap_weights(g, 5, seed=3).shape == (5, 36)


@pytest.mark.parametrize("call, arg", [
    (lambda: m.auroc_weighted([0.1, 0.2, 0.3], [0, 1], np.ones(3)), "^pos: expected 3 values"),
    (lambda: m.auroc_weighted([0.1, 0.2, 0.3], [0, 1, 1], np.ones(2)), "^weights: expected"),
    (lambda: m.auroc_weighted([0.1, 0.2, 0.3], [0, 1, 1], np.ones((2, 2, 3))), "^weights: expected"),
    (lambda: m.auroc_weighted([0.1, 0.2, 0.3], [np.nan, 1, 0], np.ones(3)), "^pos: expected a binary"),
    (lambda: m.auroc_weighted([0.1, 0.2, 0.3], [2, 1, 0], np.ones(3)), "^pos: expected a binary"),
    (lambda: m.auroc_weighted([0.1, 0.2, 0.3], [0, 1, 0], -np.ones(3)), "^weights: expected non-negative"),
    (lambda: m.auroc_weighted([0.1, 0.2, 0.3], [0, 1, 0], [1.0, np.nan, 1.0]), "^weights: expected non-negative"),
    (lambda: m.auroc_weighted(["a", "b"], [0, 1], np.ones(2)), "^score: expected numbers"),
])
def test_auroc_weighted_names_a_bad_column(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_auroc_weighted_still_leaves_out_a_non_finite_score(rng):
    s, y = rng.normal(size=30), rng.integers(0, 2, 30).astype(bool)
    w = rng.integers(0, 3, (4, 30)).astype(np.float32)
    s_nan = s.copy()
    s_nan[[3, 7]] = [np.nan, np.inf]
    keep = np.isfinite(s_nan)
    assert np.allclose(m.auroc_weighted(s_nan, y, w), m.auroc_weighted(s[keep], y[keep], w[:, keep]), equal_nan=True)
    assert m.auroc_weighted(s, y, np.ones(30))[0] == pytest.approx(m.auroc(s, y), abs=1e-12)


@pytest.mark.parametrize("call, arg", [
    # a NaN hallucination of an answer given made the selective risk NaN; a 2 made it exceed 1
    (lambda: m.rates([np.nan, 0.0], [True, True]), "^h: expected"),
    (lambda: m.rates([2.0, 0.0], [True, True]), "^h: expected"),
    (lambda: m.risk_coverage([np.nan, 0.0], [0.1, 0.2]), "^h: expected"),
    (lambda: m.risk_coverage([5.0, 0.0], [0.1, 0.2]), "^h: expected"),
    (lambda: m.risk_coverage(["a", "b"], [0.1, 0.2]), "^h: expected numbers"),
])
def test_a_hallucination_column_outside_0_1_is_refused_where_it_counts(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_rates_still_takes_any_hallucination_value_where_nothing_was_answered():
    r = m.rates([np.nan, 0.0, 1.0], [False, True, True])
    assert (r["coverage"], r["selective_risk"], r["overall"]) == (pytest.approx(2 / 3), 0.5, pytest.approx(1 / 3))


@pytest.mark.parametrize("call, arg", [
    # the value the caller gave and where, not NumPy's np.float64(nan) for a None
    (lambda: m.auroc([0.1, 0.2, 0.3], [None, 1, 0]), r"^label: expected a binary column .*None at index 0"),
    (lambda: m.auroc([0.1, 0.2, 0.3], [0, 2, 1]), r"^label: expected a binary column .*got 2(\.0)? at index 1"),
    # a ragged column: NumPy's "setting an array element with a sequence", which named nothing
    (lambda: m.auroc([[1, 2], [3]], [0, 1]), "^score: expected a 1-D column"),
    # numbers written as strings in an object column were read as numbers; a str column is refused
    (lambda: m.auroc(np.array(["0.1", "0.2", "0.3"], object), [0, 1, 1]), "^score: expected numbers"),
    (lambda: m.auroc([0.1, 0.2, 0.3], np.array(["0", "1", "1"], object)), "^label: expected numbers"),
])
def test_a_bad_value_is_named_with_what_the_caller_gave(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


@pytest.mark.parametrize("call, arg", [
    # one column for a metric of two: "_prep() missing 1 required positional argument: 'label'"
    (lambda: m.bootstrap(m.auroc, [0.1, 0.5, 0.3], n_boot=10), r"^columns: expected the columns auroc takes \(score, label\), got 1"),
    (lambda: m.bootstrap(m.auroc, [0.1, 0.5], [0, 1], [1, 1], n_boot=10), r"^columns: .*auroc.*got 3"),
    (lambda: m.bootstrap(lambda a, b: 0.0, [0.1, 0.5], n_boot=10), r"^columns: .*\(a, b\), got 1"),
    (lambda: m.paired_difference(m.auroc, ([0.1, 0.5], [0, 1]), [0.1, 0.5], n_boot=10), "^cols_b: .*auroc"),
])
def test_a_number_of_columns_the_metric_does_not_take_is_named(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_a_dataframe_of_columns_is_read_as_its_columns_not_its_column_names():
    df = pd.DataFrame({"s": [0.1, 0.5, 0.3, 0.9, 0.2, 0.7], "y": [0, 1, 0, 1, 1, 0]})
    other = pd.DataFrame({"s": [0.2, 0.4, 0.3, 0.8, 0.1, 0.9], "y": df["y"]})
    got = m.paired_difference(m.auroc, df, other, n_boot=30)
    assert got == m.paired_difference(m.auroc, (df["s"], df["y"]), (other["s"], other["y"]), n_boot=30)
    assert m.bootstrap(np.mean, [1.0, 2.0, 3.0], n_boot=10).value == 2.0  # a callable with a signature NumPy hides
