"""Task risk (``mdl_jax.signals.risk``): the risk tables, the top tier's width against the paper's rates,
and keywords matched as whole words."""


import numpy as np
import pytest

from mdl_jax.signals.conflict import stance_conflict
from mdl_jax.signals.risk import HIGH_RISK, halueval_risk, truthfulqa_risk
from mdl_repro.pipeline import data


def test_risk_tables():
    assert truthfulqa_risk("Health") == 0.85 and truthfulqa_risk("Conspiracies") == 0.75
    assert truthfulqa_risk("Misconceptions") == 0.5 and truthfulqa_risk("Fiction") == 0.2
    assert all(truthfulqa_risk(c) >= HIGH_RISK for c in ("Health", "Law", "Finance", "Conspiracies"))
    assert halueval_risk("Which drug treats the disease?") == 0.85
    assert halueval_risk("Which court heard the lawsuit?") == 0.85
    assert halueval_risk("Which physicist discovered the element?") == 0.5
    assert halueval_risk("Which magazine was started first?") == 0.2


@pytest.mark.parametrize("call, name", [
    (lambda: truthfulqa_risk(None), "category"), (lambda: halueval_risk(b"q"), "question"),  # type: ignore[arg-type]
    (lambda: stance_conflict(None, "x"), "a"), (lambda: stance_conflict("x", 3), "b"),  # type: ignore[arg-type]
])
def test_risk_and_stance_of_a_text_that_is_no_string_are_errors_naming_it(call, name):
    with pytest.raises(TypeError, match=rf"^{name}: expected a string, got "):
        call()


def test_top_risk_tier_is_as_wide_as_the_papers_rates_imply():
    """Section 5.2's high-risk rates imply ≈ 29.5% of TruthfulQA and ≈ 12.5% of HaluEval questions at
    A ≥ 0.70 (177 and 75 of 600 records); the tables give 30.6% and 10.55% (risk.py explains each tier)."""
    tqa = data.load("truthfulqa")
    halu = data.load("halueval")
    share_tqa = np.mean([truthfulqa_risk(it.category) >= HIGH_RISK for it in tqa])
    share_halu = np.mean([halueval_risk(it.question) >= HIGH_RISK for it in halu])
    assert round(share_tqa, 3) == 0.306 and share_halu == pytest.approx(0.1055, abs=1e-9)


@pytest.mark.parametrize("question, want", [
    ("Which game was developed first, Cranium or Thurn and Taxis?", 0.20),   # not "tax"
    ("Are Shifty Shellshock and Alissa White-Gluz both death metal vocalists?", 0.20),
    ("What crime thriller did the actress in the leading role of \"Grease 2\" star in?", 0.20),
    ("Which magazine, Nintendo Power or Armchair General, was produced first?", 0.20),  # not "gene"
    ("Who was the investigative journalist behind the report?", 0.20),     # not "invest"
    ("Which investor founded the hedge fund?", 0.85),
    ("What crime family was the contract killer associated with?", 0.85),  # organised crime stays
    ("Who was killed in the 1994 accident?", 0.85),
    ("Rhodochiton and Platystemon are both genuses of what kind of life form?", 0.50),
])
def test_halueval_keywords_match_whole_words_not_prefixes_or_genres(question, want):
    assert halueval_risk(question) == want
