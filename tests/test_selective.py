"""RQ1 with abstention explicit (analysis/selective.py) and the practitioners' gates (analysis/gates.py)
on small constructed records with known answers; the teacher-forced log-probs of the real SmolLM2."""

import json

import numpy as np
import pandas as pd
import pytest

from mdl_repro.analysis import gates, selective
from mdl_repro.pipeline.gate_scores import load_scores, summarise


def _ev(rows):
    """Evaluated records (the columns ``oracle.load_records`` gives) from (qid, seed, system, h, action, A)."""
    recs = []
    for qid, seed, system, h, action, A in rows:
        recs.append(dict(dataset="truthfulqa", qid=qid, seed=seed, system=system, hallucinated=bool(h),
                         hallucinated_ref=bool(h), action=action if system == "B3" else None,
                         action_name=action if system == "B3" else None, A=A, M=0.5, R=0.5,
                         C_final=0.5, ok=True, failed=False, latency_s=1.0))
    df = pd.DataFrame(recs)
    df["h"] = df["hallucinated"].astype(float)
    return df


# 4 questions × 1 seed. B2 hallucinates on q0, q1, q2; B1 on q1, q3.
#   q0 ACTIVE  (B3 = B2's answer: hallucinated)     contribution 0
#   q1 SILENT  (B3 = B1's answer: hallucinated)     contribution 0 (both hallucinated)
#   q2 OPT_OUT (abstains: safe; B2 hallucinated)    contribution −1/4
#   q3 SUPP    (cautious answer safe; B2 safe)      contribution 0
#   so B3 − B2 = 1/4 (h: B3 2 of 4) − 3/4 = −1/2? no: B3 hallucinates on q0, q1 → 2/4; B2 3/4 → −1/4
ROWS = [
    (0, 0, "B1", 0, None, 0.2), (0, 0, "B2", 1, None, 0.2), (0, 0, "B3", 1, "ACTIVE", 0.2),
    (1, 0, "B1", 1, None, 0.5), (1, 0, "B2", 1, None, 0.5), (1, 0, "B3", 1, "SILENT", 0.5),
    (2, 0, "B1", 0, None, 0.85), (2, 0, "B2", 1, None, 0.85), (2, 0, "B3", 0, "OPT_OUT", 0.85),
    (3, 0, "B1", 1, None, 0.2), (3, 0, "B2", 0, None, 0.2), (3, 0, "B3", 0, "SUPP", 0.2),
]


def test_decomposition_sums_to_the_difference_and_each_part_is_known():
    p, dropped = selective.paired(_ev(ROWS))
    assert dropped == 0 and len(p) == 4
    d = selective.decompose(p["h_B2"], p["h_B3"], p["action"])
    assert d["total"] == pytest.approx(2 / 4 - 3 / 4)
    assert d["ACTIVE"] == 0 and d["SILENT"] == 0 and d["SUPP"] == 0
    assert d["OPT_OUT"] == pytest.approx(-1 / 4)
    assert sum(d[a] for a in selective.ACTIONS) == pytest.approx(d["total"])


def test_decomposition_random_parts_sum_to_total(rng):
    n = 300
    h2, h3 = rng.integers(0, 2, n), rng.integers(0, 2, n)
    act = rng.choice(selective.ACTIONS, n)
    d = selective.decompose(h2, h3, act)
    assert sum(d[a] for a in selective.ACTIONS) == pytest.approx(h3.mean() - h2.mean())


def test_coverage_and_selective_risk_count_opt_out_as_abstention():
    s = selective.dataset_summary(selective.paired(_ev(ROWS))[0], n_draws=200)
    b3 = s["systems"]["B3"]
    assert b3["coverage"] == 0.75 and b3["overall"] == 0.5
    assert b3["selective_risk"] == pytest.approx(2 / 3)  # q0, q1 hallucinated among 3 answered


def test_random_abstention_mean_equals_the_analytic_expectation():
    # 10 questions × 3 seeds; question g has g/10 of... simply: h per record, abstain 4 of 10 questions.
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(10), 3)
    h = rng.integers(0, 2, 30).astype(float)
    r = selective.random_abstention(h, groups, 4, n_draws=20000, seed=0)
    analytic = h.sum() * (1 - 4 / 10) / 30
    assert r["expected"] == pytest.approx(analytic)
    assert r["mean"] == pytest.approx(analytic, abs=3e-3)
    assert r["lo"] <= r["mean"] <= r["hi"]
    # abstaining on nothing or on everything has no spread
    assert selective.random_abstention(h, groups, 0)["lo"] == pytest.approx(h.mean())
    assert selective.random_abstention(h, groups, 10)["hi"] == 0.0
    with pytest.raises(ValueError, match="n_abstain"):
        selective.random_abstention(h, groups, 11)


def test_aurc_of_known_curves():
    # perfect ranking of 2 safe then 2 hallucinated: risks 0, 0, 1/3, 1/2
    c = selective.risk_coverage([0, 0, 1, 1], [4, 3, 2, 1])
    np.testing.assert_allclose(c.risk, [0, 0, 1 / 3, 1 / 2])
    assert c.aurc == pytest.approx((1 / 3 + 1 / 2) / 4)
    np.testing.assert_allclose(c.coverage, [0.25, 0.5, 0.75, 1.0])
    # the reverse ranking: 1, 1, 2/3, 1/2
    assert selective.risk_coverage([0, 0, 1, 1], [1, 2, 3, 4]).aurc == pytest.approx((1 + 1 + 2 / 3 + 1 / 2) / 4)
    # a constant score is a flat curve at the rate, whatever the record order
    flat = selective.risk_coverage([1, 0, 0, 1, 0], np.zeros(5))
    np.testing.assert_allclose(flat.risk, 0.4)


def test_risk_only_rule_abstains_exactly_at_high_risk():
    s = selective.dataset_summary(selective.paired(_ev(ROWS))[0], tau=0.75, n_draws=100)
    r = s["systems"]["risk-only (A ≥ 0.75)"]
    # q2 (A = 0.85) abstains; B2 elsewhere hallucinates on q0, q1
    assert r["coverage"] == 0.75 and r["overall"] == 0.5 and r["high_risk"] == 0.0


def test_calibrated_gate_picks_the_known_threshold():
    score = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.9])
    adopt = np.array([0, 0, 0, 1, 1, 1])
    c = gates.calibrate_threshold(score, adopt)
    assert c["tau"] == 0.6 and c["agreement"] == 1.0 and c["n_tied"] == 1
    # an all-reject split: the best cut is "never adopt" (+inf), a constant classifier
    assert gates.calibrate_threshold(score, np.zeros(6))["tau"] == np.inf
    # ties go to the median tied cut: one error wherever the cut falls between 0.3 and 0.6 ... here
    # labels 0 1 0 1: cuts 0.2 (→ 1 1 1 wrong at 0.1? ) are enumerated and the median tied one is taken
    t = gates.calibrate_threshold([1.0, 2.0, 3.0, 4.0], [0, 1, 0, 1])
    assert t["n_tied"] >= 1 and t["tau"] in (2.0, 4.0, np.inf, 1.0, 3.0)


def test_binary_gate_outcome_is_read_off_the_paired_records(tmp_path):
    # calibration: similarity (M here, no scores file) separates adopt at 0.6
    ev = _ev(ROWS)
    ev.loc[ev["qid"].isin([3]), "M"] = 0.9   # q3: inject (B2 safe) ; the others stay at 0.5 → B1
    cal = pd.DataFrame([dict(dataset="truthfulqa", qid=100 + i, seed=0, system="calibration", M=m, R=0.5,
                             A=0.2, hallucinated=h, hallucinated_ref=h, ok=True, failed=False)
                        for i, (m, h) in enumerate([(0.2, True), (0.4, True), (0.8, False), (0.95, False)])])
    res = gates.gates(ev, cal, tmp_path, judge="paper", scores={})
    row = res["rows"]["truthfulqa"]["similarity (best cosine)"]
    assert res["calibration"]["similarity (best cosine)"]["truthfulqa"]["tau"] == pytest.approx(0.8)
    # q3 → B2 (safe); q0, q1, q2 → B1 (0, 1, 0): 1 of 4 hallucinated, full coverage
    assert row["overall"] == 0.25 and row["coverage"] == 1.0 and row["inject"] == 0.25
    assert res["rows"]["truthfulqa"]["never inject (B1)"]["overall"] == 0.5
    assert res["rows"]["truthfulqa"]["always inject (B2)"]["overall"] == 0.75
    md = gates.gates_md({"paper": res})
    assert "similarity (best cosine)" in md and "gate_scores.jsonl" in md  # says what is missing


def test_gates_say_so_when_records_are_unpaired(tmp_path):
    ev = _ev([r for r in ROWS if r[2] != "B1"])  # an older run without B1: nothing is paired
    res = gates.gates(ev, ev.iloc[:0], tmp_path, judge="paper", scores={})
    assert not res["rows"] and "not paired" in " ".join(res["notes"])


def test_uncertainty_summary_and_scores_file(tmp_path):
    s = summarise([np.log(0.5), np.log(0.25)], [1.0, 2.0])
    assert s["n_tokens"] == 2 and s["min_prob"] == pytest.approx(0.25) and s["max_entropy"] == 2.0
    assert s["perplexity"] == pytest.approx(np.exp(-(np.log(0.5) + np.log(0.25)) / 2))
    p = tmp_path / "gate_scores.jsonl"
    p.write_text(json.dumps({"dataset": "d", "qid": 1, "seed": 0, "system": "B1", "mean_logprob": -1.0})
                 + "\n" + '{"dataset": "d", "qid": 2, "se')  # a torn last line is skipped
    assert list(load_scores(p)) == [("d", 1, 0, "B1")]


@pytest.mark.slow
def test_teacher_forced_logprobs_equal_a_one_sequence_forward_pass(local_backend):
    import torch

    from mdl_repro.pipeline.generation import _head_fp32
    from mdl_repro.pipeline.systems import chat

    prompts = [chat("What is the capital of France?"), chat("Who wrote Hamlet?")]
    answers = ["Paris.", "William Shakespeare wrote it."]
    got = local_backend.token_logprobs(prompts, answers)
    tok, lm = local_backend._lm()
    for p, a, g in zip(prompts, answers, got):
        text = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        pid = tok(text, add_special_tokens=False)["input_ids"]
        aid = tok(a, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            hidden = lm.model(input_ids=torch.tensor([pid + aid])).last_hidden_state[0]
            logp = torch.log_softmax(_head_fp32(lm, hidden[len(pid) - 1:len(pid) + len(aid) - 1]), -1)
        want = logp[torch.arange(len(aid)), torch.tensor(aid)].numpy()
        ent = -(logp.exp() * logp).sum(-1).numpy()
        assert len(g["logprobs"]) == len(aid) and "".join(g["tokens"]) == a
        # batched with a neighbour of another length (padding) vs alone: bf16 hidden states round
        # differently, so equal to a small tolerance; both are log-probabilities (≤ 0)
        np.testing.assert_allclose(g["logprobs"], want, atol=0.1)
        np.testing.assert_allclose(g["entropy"], ent, atol=0.15)
        assert all(x <= 0 for x in g["logprobs"])
    alone = local_backend.token_logprobs(prompts[:1], answers[:1])[0]
    assert alone["tokens"] == got[0]["tokens"]
    assert local_backend.token_logprobs(prompts[:1], [""])[0]["logprobs"] == []
    with pytest.raises(ValueError, match="answers"):
        local_backend.token_logprobs(prompts, answers[:1])


@pytest.fixture
def legacy_server(model_server):
    """The project's own OpenAI-compatible server (``python -m mdl_repro.serve``) on 127.0.0.1."""
    return model_server


@pytest.mark.slow
def test_openai_backend_token_logprobs_through_legacy_completions_equal_the_local_ones(legacy_server,
                                                                                        local_backend):
    from mdl_repro.pipeline.generation import OpenAIBackend
    from mdl_repro.pipeline.systems import chat

    prompts = [chat("What is the capital of France?"), chat("Who wrote Hamlet?")]
    answers = ["Paris is the capital.", "William Shakespeare wrote it."]
    tok, _ = local_backend._lm()
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    b = OpenAIBackend("bundled:smollm2", base_url=legacy_server, api_key="sk-test", call_timeout=120)
    got = b.token_logprobs(texts, answers)
    want = local_backend.token_logprobs(prompts, answers)
    for g, w, a in zip(got, want, answers):
        assert not g["failed"], g["error"]
        assert "".join(g["tokens"]) == a and g["tokens"] == w["tokens"]
        np.testing.assert_allclose(g["logprobs"], w["logprobs"], atol=0.1)
        assert all(np.isnan(g["entropy"]))  # logprobs: 0 carries no distribution
    with pytest.raises(ValueError, match="prompts"):
        b.token_logprobs([prompts[0]], ["x"])  # a chat, not rendered text
    down = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key="k", call_timeout=1.0, backoff=0.05)
    r = down.token_logprobs(["Q: 1+1?\nA:"], [" 2"])[0]
    assert r["failed"] and "127.0.0.1:9" in r["error"]


def test_score_gates_cli_refuses_a_folder_without_records(tmp_path, capsys):
    from mdl_jax.cli import main

    assert main(["score-gates", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdl-jax: error: run_dir:") and "records.jsonl" in err and "\n" not in err
    assert not (tmp_path / "gate_scores.jsonl").exists()
    assert main(["score-gates", str(tmp_path), "--batch-size", "0"]) == 2
    assert "--batch-size" in capsys.readouterr().err


def test_report_reads_table_4_with_where_each_difference_comes_from(tmp_path):
    """REPORT.md puts the decomposition under Table 4, so a reader of the table sees that B3's gain on
    the constructed records is all Opt-Out counted as safe, with the † warning for 4 questions."""
    from mdl_repro.analysis.analyze import _jsonable
    from mdl_repro.analysis.report import _where_from

    assert _where_from(tmp_path) == []  # before the analyses ran: nothing, no crash
    (tmp_path / "analysis").mkdir()
    res = selective.selective(_ev(ROWS), n_draws=200)
    (tmp_path / "analysis" / "analysis.json").write_text(json.dumps(_jsonable({"selective": res})))
    lines = _where_from(tmp_path)
    row = next(ln for ln in lines if ln.startswith("- truthfulqa (`paper` judge)"))
    assert "B3 − B2 = -0.250" in row and "Opt-Out -0.250" in row and "accounts for 100% of it" in row
    assert row.endswith("† 4 questions: too few for a claim.")


def test_every_committed_reports_direction_against_random_abstention_carries_the_familys_reading():
    """Each committed run's sentences on B3 − random abstention are the generator's, and one that states
    a direction for a statistic of the declared primary family says the family's Holm reading beside it
    (a report must not state a direction its own family table does not resolve)."""
    from pathlib import Path

    from mdl_repro.analysis.stats import family_note

    runs = Path(__file__).resolve().parents[1] / "experiments" / "results"
    noted = 0
    for aj in sorted(runs.glob("*/analysis/analysis.json")):
        a = json.loads(aj.read_text())
        fam = (a.get("rigour") or {}).get("primary") or {}
        report = (aj.parents[1] / "REPORT.md").read_text(encoding="utf-8")
        for judge, per in ((a.get("selective") or {}).get("by") or {}).items():
            for ds, s in (per or {}).items():
                note = family_note(fam, f"{ds}: B3 - random abstention", judge)
                line = selective.where_from(s, note)
                assert line in report, (aj, judge, ds)
                if note and ("B3 below" in line or "B3 above" in line):
                    assert ", unadjusted" not in line and note in line
                    noted += 1
    assert noted >= 2  # the runs whose family does not resolve a direction the paired test states
