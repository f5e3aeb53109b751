"""The reproduction's memory stores and their signals (``mdl_repro.pipeline.stores``,
``store_signals``, ``defaults``): stores seeded and drawn as specified, real MiniLM signals on real rows
of both data sets, the ``signals`` command, and the default norm range recomputed from the data."""


import numpy as np
import pytest

from mdl_jax import decide
from mdl_repro.pipeline import data
from mdl_repro.pipeline.store_signals import compute_signals, signal_arrays
from mdl_repro.pipeline.stores import Item, MemoryRecord, Store, StoreConfig, build_stores, split_calibration


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
