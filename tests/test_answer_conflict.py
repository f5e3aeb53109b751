"""The disagreeing-answer detector (``mdl_jax.signals.answer_conflict``): what it flags, what it leaves,
and what it changes in a gate beside the paper's lexical detector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mdl_jax.signals.answer_conflict import answer_conflict, answer_pair_flags, either_pair_flags
from mdl_jax.signals.conflict import pair_flags

RGB = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks" / "rgb_en_fact" / "en_fact.json"


@pytest.mark.parametrize("a, b", [
    ("Canberra is the capital of Australia.", "Sydney is the capital of Australia."),
    ("Chicago Fire season 4 has 23 episodes.", "Chicago Fire season 4 has 24 episodes."),
    ("The Super Bowl 2021 was held in Tampa, Florida.", "The Super Bowl 2021 was held in Glendale, Arizona."),
    ("The treaty was signed in May 1919.", "The treaty was signed in June 1919."),
])
def test_a_statement_restated_with_another_answer_is_a_conflict(a, b):
    assert answer_conflict(a, b) and answer_conflict(b, a)
    assert not any(any(r) for r in pair_flags([a, b])), "the paper's lexical detector must not see it"


@pytest.mark.parametrize("a, b", [
    ("Canberra is the capital of Australia.", "Canberra is Australia's capital."),  # same answer
    ("The Eiffel Tower was completed in 1889.", "The Eiffel Tower was completed in March 1889."),  # adds
    ("The population of Broken Bow is 3,559 people.", "Broken Bow has a population of 3559."),
    ("Super Bowl LV was played in Tampa.", "Super Bowl LV featured The Weeknd."),  # different frames
    ("Raw flour is safe to eat.", "Raw flour can carry E. coli."),  # no named answer in common frame
    ("it is big.", "it is small."),  # nothing answer-bearing
])
def test_agreeing_or_unrelated_statements_are_not_a_conflict(a, b):
    assert not answer_conflict(a, b)


def test_flags_are_a_symmetric_matrix_with_a_false_diagonal():
    texts = ["Canberra is the capital of Australia.", "Sydney is the capital of Australia.",
             "Kangaroos live in Australia.", "Canberra is the capital of Australia."]
    f = np.array(answer_pair_flags(texts))
    assert f.shape == (4, 4) and (f == f.T).all() and not f.diagonal().any()
    assert f[0, 1] and f[1, 3] and not f[0, 3] and not f[2].any()
    assert answer_pair_flags([]) == []


def test_either_detector_holds_both_kinds_of_conflict():
    texts = ["Raw cookie dough is safe.", "Raw cookie dough is not safe.",
             "Canberra is the capital of Australia.", "Sydney is the capital of Australia."]
    f = np.array(either_pair_flags(texts))
    assert f[0, 1] and f[2, 3] and not f[0, 2]


def test_a_text_that_is_not_a_string_is_named():
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        answer_pair_flags(["a", 3])


@pytest.mark.skipif(not RGB.is_file(), reason="the shared benchmark data is not beside the checkout")
def test_rgb_answer_swapped_snippets_are_caught_where_the_lexical_detector_sees_nothing():
    rows = [json.loads(line) for line in RGB.read_text(encoding="utf-8").splitlines() if line.strip()]
    caught = lexical = n = 0
    for r in rows:
        for true, swapped in zip(r["positive"], r["positive_wrong"]):
            if true == swapped:
                continue
            n += 1
            caught += answer_conflict(true, swapped)
            lexical += bool(np.array(pair_flags([true, swapped])).any())
    assert n > 100
    assert caught / n > 0.5 > lexical / n, (caught, lexical, n)


def test_the_gate_with_the_detector_lowers_R_on_disagreeing_answers(embedder):
    from mdl_jax.gate.core import MemoryGate

    q = "What is the capital of Australia?"
    mems = ["Canberra is the capital of Australia.", "Sydney is the capital of Australia."]
    paper = MemoryGate(embedder, risk=0.5).decide(q, mems)
    either = MemoryGate(embedder, risk=0.5, conflict=either_pair_flags).decide(q, mems)
    assert paper.scalars["phi"] == 0.0 and either.scalars["phi"] == 1.0
    assert either.scalars["R"] < paper.scalars["R"]


@pytest.mark.parametrize("detector", [pair_flags, answer_pair_flags, either_pair_flags])
def test_a_single_string_given_as_texts_is_refused_not_read_as_one_memory_per_character(detector):
    with pytest.raises(TypeError, match=r"texts: expected a sequence of texts, got a str"):
        detector("Raw dough is safe. No, it is not.")
    with pytest.raises(TypeError, match=r"texts\[1\]: expected a string, got NoneType"):
        detector(["Raw dough is safe.", None])
    store = ["Canberra is the capital of Australia.", "Sydney is the capital of Australia."]
    assert detector(iter(store)) == detector(store)
