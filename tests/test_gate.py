"""The memory gate (``mdl_jax.gate``): one implementation with the pipeline, every action reachable,
batch = loop, the messages of each action, and clear errors on bad input."""

import contextlib
import json
import subprocess
import sys

import numpy as np
import pytest

from mdl_jax import Action, MDLConfig, decide, save_config
from mdl_jax.gate import SCALARS, GateDecision, MemoryGate
from mdl_jax.prompts import ABSTENTION, CAUTION, chat
from mdl_jax.signals.aggregation import MAX_MEMORIES, memory_signals
from mdl_repro.pipeline import data
from mdl_repro.pipeline.store_signals import compute_signals, signal_arrays
from mdl_repro.pipeline.stores import build_stores
from tests import gate_rows
from tests.gate_embedders import hashed


def _vec(m, sign=1.0):
    return [m, sign * np.sqrt(1.0 - m * m), 0.0]


# Constructed vectors: the query is e1, a memory "fact m a/b" has cosine m with it; a/b mirror each
# other, so two of them have pairwise cosine 2m² - 1 (R when they are the relevant pair).
VECS = {"q": [1.0, 0.0, 0.0]}
for _m in (0.95, 0.8, 0.35, 0.1):
    VECS[f"fact {_m} a"], VECS[f"fact {_m} b"] = _vec(_m), _vec(_m, -1.0)
CASES = {  # action: (memories, A)
    Action.ACTIVE: (["fact 0.95 a", "fact 0.95 b"], 0.2),    # M 0.95, R 0.805
    Action.SUPP: (["fact 0.35 a"], 0.5),                      # M 0.35, one relevant memory: R 0.5
    Action.SILENT: (["fact 0.8 a", "fact 0.8 b"], 0.85),      # M 0.8, R 0.28, high risk
    Action.OPT_OUT: (["fact 0.1 a", "fact 0.1 b"], 0.85),     # irrelevant, high risk
}


def _lookup(texts):
    return np.array([VECS[t] for t in texts])


@pytest.fixture(scope="module")
def gate():
    return MemoryGate(embedder=_lookup)


@pytest.mark.slow
def test_gate_equals_decide_on_the_pipelines_signals_for_the_same_stores(embedder):
    """One implementation: for the pipeline's own stores, the gate's M, R, φ, A and action are those
    ``compute_signals`` + ``mdl_jax.decide`` give (same embedder, same conflict detector, same risk)."""
    for ds, preset in (("truthfulqa", "truthfulqa"), ("halueval", "halueval")):
        stores = build_stores(data.load(ds, limit=8))
        table = compute_signals(stores, embedder)
        ref = decide(*signal_arrays(table), MDLConfig())
        g = MemoryGate(embedder=embedder, risk=preset)
        got = g.decide_batch([s.item.question for s in stores], [s.texts for s in stores],
                             categories=[s.item.category for s in stores])
        assert [int(d.action) for d in got] == np.asarray(ref.action).tolist()
        for k, col in (("M", "M"), ("R", "R"), ("A", "A"), ("phi", "phi")):
            np.testing.assert_allclose([d.scalars[k] for d in got], table[col], atol=1e-6)
        np.testing.assert_allclose([d.scalars["C_final"] for d in got], np.asarray(ref.C_final), atol=1e-6)
        np.testing.assert_allclose([[d.scalars[k] for k in ("E_wm", "E_r", "E_a")] for d in got],
                                   np.asarray(ref.energies), atol=1e-5)


@pytest.mark.parametrize("action", list(CASES))
def test_every_action_is_reachable_and_applied(gate, action):
    mems, A = CASES[action]
    d = gate.decide("q", mems, risk=A)
    assert d.action == action and isinstance(d.action, Action)
    assert d.action_name == {0: "Active", 1: "Supp", 2: "Silent", 3: "Opt-Out"}[int(action)]
    assert set(d.scalars) == set(SCALARS) and all(type(v) is float for v in d.scalars.values())
    assert all(np.isfinite(list(d.scalars.values())))
    assert d.scalars["A"] == pytest.approx(A)
    caller = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "q"}]
    built = d.build_messages(caller)
    assert caller[-1]["content"] == "q"  # the caller's chat is not modified
    if action in (Action.ACTIVE, Action.SUPP):
        assert d.memories == mems
        assert d.messages == chat("q", mems, caution=action == Action.SUPP)
        assert built[:3] == caller[:3] and built[-1]["content"].endswith("q")
        assert all(f"- {m}" in built[-1]["content"] for m in mems)
        assert (CAUTION in built[-1]["content"]) == (action == Action.SUPP)
    elif action == Action.SILENT:
        assert d.memories == [] and d.messages == chat("q") and built == caller
    else:
        assert d.memories == [] and d.messages is None and built is None
        assert d.abstention == ABSTENTION
    js = json.loads(json.dumps(d.to_dict()))
    assert js["action"] == d.action_name and js["scalars"] == d.scalars and js["memories"] == d.memories


def test_memory_dicts_are_carried_through_and_only_their_text_is_scored(gate):
    mems = [{"text": "fact 0.95 a", "source": "wiki", "trust": 0.9, "time": "2024-01-01"},
            {"text": "fact 0.95 b", "source": "blog"}]
    d = gate.decide("q", mems, risk=0.2)
    assert d.action == Action.ACTIVE and d.memories == mems
    assert d.scalars == gate.decide("q", ["fact 0.95 a", "fact 0.95 b"], risk=0.2).scalars
    multi = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    assert d.build_messages(multi)[0]["content"][0]["text"].startswith("Memories:\n- fact 0.95 a")


@pytest.mark.slow
def test_the_lexical_detector_is_the_default_and_replaceable(embedder):
    mems = ["Raw cookie dough is safe to eat.", "Raw cookie dough is not safe to eat."]
    d = MemoryGate(embedder=embedder).decide("Is raw cookie dough safe to eat?", mems)
    assert d.scalars["phi"] == 1.0 and d.scalars["R"] == 0.0
    quiet = MemoryGate(embedder=embedder, conflict=lambda t: np.zeros((len(t), len(t)), bool))
    e = quiet.decide("Is raw cookie dough safe to eat?", mems)
    assert e.scalars["phi"] == 0.0 and e.scalars["R"] > 0.5 and e.scalars["M"] == d.scalars["M"]


def test_batch_equals_loop(gate):
    qs, ms, rs = [], [], []
    for mems, A in CASES.values():
        qs.append("q")
        ms.append(mems)
        rs.append(A)
    qs.append("q")  # an empty memory list is valid: M = 0
    ms.append([])
    rs.append(0.2)
    batch = gate.decide_batch(qs, ms, risks=rs)
    loop = [gate.decide(q, m, risk=r) for q, m, r in zip(qs, ms, rs)]
    assert [b.to_dict() for b in batch] == [x.to_dict() for x in loop]
    assert [b.action for b in batch[:4]] == list(CASES)
    cols = gate.columns(qs, ms, risks=rs)
    assert cols["action"].tolist() == [int(b.action) for b in batch]
    np.testing.assert_array_equal(cols["C_final"], np.float32([b.scalars["C_final"] for b in batch]))


def test_risk_assessors(gate):
    mems = CASES[Action.ACTIVE][0]
    assert MemoryGate(_lookup, risk=0.3).decide("q", mems).scalars["A"] == pytest.approx(0.3)
    table = MemoryGate(_lookup, risk={"medical": 0.85, "trivia": 0.2})
    assert table.decide("q", mems, category="medical").scalars["A"] == pytest.approx(0.85)
    with pytest.raises(ValueError, match=r"^category: 'sports' is not in the risk table"):
        table.decide("q", mems, category="sports")
    # categories are read as text: two keys of one text would silently be one category, the last value kept
    with pytest.raises(ValueError, match=r"^risk: the keys 1 and '1' name one category \('1'\)$"):
        MemoryGate(_lookup, risk={1: 0.2, "1": 0.9})
    assert MemoryGate(_lookup, risk={1: 0.2}).decide("q", mems, category="1").scalars["A"] == pytest.approx(0.2)
    assert MemoryGate(_lookup, risk=lambda q, c: 0.7).decide("q", mems).scalars["A"] == pytest.approx(0.7)
    tqa = MemoryGate(_lookup, risk="truthfulqa")
    assert tqa.decide("q", mems, category="Health").scalars["A"] == pytest.approx(0.85)
    assert tqa.decide("q", mems).scalars["A"] == pytest.approx(0.5)  # no category: the table default
    halu = MemoryGate(_lookup, risk="halueval")
    VECS.setdefault("Which drug treats the disease?", [1.0, 0.0, 0.0])
    assert halu.decide("Which drug treats the disease?", mems).scalars["A"] == pytest.approx(0.85)
    with pytest.raises(ValueError, match=r"^risk: the risk callable's value .* expected a number in \[0, 1\]"):
        MemoryGate(_lookup, risk=lambda q, c: 1.5).decide("q", mems)


def test_a_category_that_cannot_be_one_is_named_and_a_missing_one_is_none():
    """A pandas table's empty category cell (NaN) is "no category" for the preset; an int is an error
    naming the category (it crashed in str.strip); a batch's bad category names its row."""
    mems = CASES[Action.ACTIVE][0]
    import pandas as pd

    tqa = MemoryGate(_lookup, risk="truthfulqa")
    for missing in (None, float("nan"), np.float32("nan"), pd.NA, pd.NaT):
        assert tqa.decide("q", mems, category=missing).scalars["A"] == pytest.approx(0.5)
    assert tqa.decide("q", mems, category=np.str_("Health")).scalars["A"] == pytest.approx(0.85)
    for bad in (5, 0, False):
        with pytest.raises(ValueError, match=rf"^category: expected a string or None for the 'truthfulqa' risk preset, got {bad}"):
            tqa.decide("q", mems, category=bad)
    with pytest.raises(ValueError, match=r"^categories\[1\]: expected a string or None .* got 5"):
        tqa.decide_batch(["q", "q"], [mems, mems], ["Health", 5])
    table = MemoryGate(_lookup, risk={"medical": 0.85})
    with pytest.raises(ValueError, match=r"^categories\[2\]: 'sports' is not in the risk table"):
        table.columns(["q"] * 3, [mems] * 3, ["medical", "medical", "sports"])
    with pytest.raises(ValueError, match=r"^categories: expected None or 2 values \(one per query\), got generator"):
        table.decide_batch(["q", "q"], [mems, mems], (c for c in ("medical", "medical")))


def test_a_risk_past_a_doubles_range_is_a_value_error_and_to_dict_is_json():
    import datetime
    import uuid
    from decimal import Decimal

    mems = CASES[Action.ACTIVE][0]
    gate = MemoryGate(_lookup)
    with pytest.raises(ValueError, match=r"^risk: expected a number in \[0, 1\], got 1000"):
        gate.decide("q", mems, risk=10**400)
    meta = {"text": mems[0], "vec": np.array([0.1, 0.2]), "id": uuid.UUID(int=7), "price": Decimal("1.5"),
            "tags": {"a"}, "raw": b"xy", "at": datetime.date(2026, 1, 2), "n": np.int64(3)}
    meta |= {"f": np.float64(0.25), "s": np.str_("x"), "when": np.array(["2026-01-02"], "datetime64[D]")}
    d = gate.decide("q", [meta, *mems[1:]]).to_dict()
    back = json.loads(json.dumps(d))["memories"][0]
    assert back == {"text": mems[0], "vec": [0.1, 0.2], "id": str(uuid.UUID(int=7)), "price": "1.5", "tags": ["a"],
                    "raw": "b'xy'", "at": "2026-01-02", "n": 3, "f": 0.25, "s": "x", "when": ["2026-01-02"]}
    assert all(type(v) in (str, int, float, list) for v in d["memories"][0].values())   # built-in kinds only


def test_config_object_and_file(tmp_path, gate):
    mems, A = CASES[Action.SUPP]
    strict = MDLConfig(thresholds=(0.99, 0.98, 0.97))
    path = save_config(strict, tmp_path / "strict.json")
    for cfg in (strict, str(path), path):
        assert MemoryGate(_lookup, config=cfg).decide("q", mems, risk=A).action == Action.OPT_OUT
    assert gate.decide("q", mems, risk=A).action == Action.SUPP


@pytest.mark.parametrize("call, match", [
    (lambda g: g.decide("", ["fact 0.95 a"]), r"^query: expected a non-empty string"),
    (lambda g: g.decide("   ", ["fact 0.95 a"]), r"^query: expected a non-empty string"),
    (lambda g: g.decide(None, ["fact 0.95 a"]), r"^query: expected a non-empty string"),
    (lambda g: g.decide("q", "fact 0.95 a"), r"^memories: expected a list of memory texts"),
    (lambda g: g.decide("q", {"text": "x"}), r"^memories: expected a list of memory texts"),
    (lambda g: g.decide("q", [{"source": "wiki"}]), r"^memories\[0\]: a memory dict needs a 'text' field"),
    (lambda g: g.decide("q", ["fact 0.95 a", ""]), r"^memories\[1\]: expected a non-empty memory text"),
    (lambda g: g.decide("q", ["fact 0.95 a", 3]), r"^memories\[1\]: expected a non-empty memory text"),
    (lambda g: g.decide("q", ["fact 0.95 a"], risk=1.5), r"^risk: expected a number in \[0, 1\]"),
    (lambda g: g.decide("q", ["fact 0.95 a"], risk=float("nan")), r"^risk: expected a number in \[0, 1\]"),
    (lambda g: g.decide_batch(["q", "q"], [["fact 0.95 a"]]), r"^memories_lists: expected 2 lists"),
    (lambda g: g.decide_batch(["q", ""], [[], []]), r"^queries\[1\]: expected a non-empty string"),
    (lambda g: g.decide_batch(["q"], [[{"x": 1}]]), r"^memories_lists\[0\]\[0\]: a memory dict needs"),
    (lambda g: g.decide("q", ["fact 0.95 a"]).build_messages("hi"), r"^messages: expected a list"),
    (lambda g: g.decide("q", ["fact 0.95 a"]).build_messages([{"role": "system", "content": "x"}]),
     r"^messages: expected at least one message with role 'user'"),
])
def test_bad_input_is_a_value_error_naming_the_argument(gate, call, match):
    with pytest.raises(ValueError, match=match):
        call(gate)


@pytest.mark.parametrize("call, match", [
    (lambda g: g.decide("is \ud800 safe?", ["a memory"]), r"^query: holds a lone surrogate \('\\ud800' at character 3\)"),
    (lambda g: g.decide("q?", ["fine", "a \udfff memory"]), r"^memories\[1\]: holds a lone surrogate"),
    (lambda g: g.decide("q?", [{"text": "\udc80", "source": "wiki"}]), r"^memories\[0\]: holds a lone surrogate"),
    (lambda g: g.decide_batch(["q", "é \udc80"], [[], []]), r"^queries\[1\]: holds a lone surrogate \('\\udc80'"),
    (lambda g: g.columns(["q", "q"], [["ok"], ["ü", "ok \ud83d"]]), r"^memories_lists\[1\]\[1\]: holds a lone surrogate"),
])
def test_a_lone_surrogate_is_a_value_error_naming_the_text_whatever_the_embedder(embedder, call, match):
    """The real MiniLM's tokenizer (and any UTF-8 writer) cannot take a lone surrogate, and a callable
    embedder would take it and decide the row: both gates refuse it before embedding, naming it."""
    for g in (MemoryGate(embedder=embedder), MemoryGate(embedder=hashed)):
        with pytest.raises(ValueError, match=match):
            call(g)
    assert MemoryGate(embedder=hashed).decide("é?", ["ü ok"]).action_name  # other non-ASCII text is fine


def test_bad_construction_names_the_argument(tmp_path):
    with pytest.raises(ValueError, match=r"^config: .*missing\.json: cannot read"):
        MemoryGate(_lookup, config=tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"^config: .*bad\.json: not valid JSON"):
        MemoryGate(_lookup, config=str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=r"^config: expected an MDLConfig"):
        MemoryGate(_lookup, config=3)
    with pytest.raises(ValueError, match=r"^risk: expected a number in \[0, 1\], one of"):
        MemoryGate(_lookup, risk="medical")
    with pytest.raises(ValueError, match=r"^risk\['a'\]: expected a number in \[0, 1\]"):
        MemoryGate(_lookup, risk={"a": 2})
    with pytest.raises(ValueError, match=r"^embedder: expected a sentence-transformers model"):
        MemoryGate(embedder=3)
    with pytest.raises(ValueError, match=r"^embedder: expected an \(N, d\) array for N = 2 texts"):
        MemoryGate(lambda t: np.ones(3)).decide("q", ["a"])
    with pytest.raises(ValueError, match=r"^conflict: expected an 2×2 matrix"):
        MemoryGate(_lookup, conflict=lambda t: [[False]]).decide("q", ["fact 0.95 a", "fact 0.95 b"])


def test_importing_the_gate_loads_no_torch_until_a_text_is_embedded():
    code = ("import sys; from mdl_jax.gate import MemoryGate; g = MemoryGate(); "
            "assert 'torch' not in sys.modules and 'mdl_repro.pipeline' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert isinstance(GateDecision, type)


def test_wings_import_only_downward():
    """controller ← signals ← gate ← integrations; the pipeline imports the controller, the signals, the
    gate and the prompts, never the integrations; nothing below imports the pipeline."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "mdl_jax"
    forbidden = {
        "controller": ("mdl_jax.signals", "mdl_jax.gate", "mdl_jax.integrations", "mdl_repro.pipeline"),
        "signals": ("mdl_jax.gate", "mdl_jax.integrations", "mdl_repro.pipeline", "mdl_repro.analysis"),
        "gate": ("mdl_jax.integrations", "mdl_repro.pipeline", "mdl_repro.analysis"),
        "integrations": ("mdl_repro.analysis",),
        "pipeline": ("mdl_jax.integrations",),  # the gate is a floor below: its runs decide through it
    }
    bad = []
    for wing, banned in forbidden.items():
        for f in (root / wing).glob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                bad += [f"{wing}/{f.name} imports {n}" for n in names if n.startswith(banned)]
    assert bad == []
    # pipeline/ holds no copy of the moved signal modules (one implementation, no shims)
    assert not {"embeddings.py", "conflict.py", "risk.py", "signals.py"} & {
        f.name for f in (root / "pipeline").glob("*.py")}


def test_one_row_decision_has_the_batch_bits(gate):
    """decide_signals on one row (on the native kernel: ``decide``'s scalar path) gives the bits of the
    same row inside a padded batch, and the batch path's error for a bad signal. (16 rows: on pure
    JAX, where one row is padded to 16 too, programs of other widths may round differently.)"""
    rng = np.random.default_rng(7)
    M, R, A = (rng.random(16, dtype=np.float32) for _ in range(3))
    cols = gate.decide_signals(M, R, A)
    for i in range(16):
        one = gate.decide_signals(M[i:i + 1], R[i:i + 1], A[i:i + 1])
        assert set(one) == set(cols)
        for k in cols:
            assert one[k].shape == (1,) and one[k].dtype == cols[k].dtype
            assert one[k][0] == cols[k][i] or (np.isnan(one[k][0]) and np.isnan(cols[k][i])), (k, i)
    with pytest.raises(ValueError, match=r"^M: expected values in \[0, 1\]; M\[0\] = 1.5"):
        gate.decide_signals([1.5], [0.5], [0.5])


def test_a_bulk_decide_batch_leaves_the_collector_as_it_found_it():
    """``decide_batch`` pauses the garbage collector while it builds many decisions (core.
    _collector_paused): afterwards it is on again if it was on, and still off if the caller had turned
    it off; the decisions equal those of calls too small to pause it."""
    import gc

    from mdl_jax.gate import core

    gate = MemoryGate(embedder=lambda ts: np.array([[len(t), t.count("s") + 1.0, 2.0] for t in ts]))
    n = core.PAUSE_COLLECTOR_ROWS
    qs = [f"Is item {i} safe?" for i in range(n)]
    ms = [["Item is safe.", "Item is not safe.", "Water is wet."]] * n
    assert gc.isenabled()
    big = gate.decide_batch(qs, ms)
    assert gc.isenabled()
    gc.disable()
    try:
        assert gate.decide_batch(qs, ms) == big
        assert not gc.isenabled()
    finally:
        gc.enable()
    small = [d for i in range(0, n, 64) for d in gate.decide_batch(qs[i:i + 64], ms[i:i + 64])]
    assert small == big


def test_the_library_refuses_a_store_over_MAX_MEMORIES_before_any_work():
    gate = MemoryGate(embedder=hashed)
    wide = gate_rows.wide(MAX_MEMORIES + 1)
    with pytest.raises(ValueError, match=r"^memories_lists\[0\]: expected at most 1,000 memories"):
        gate.decide_batch([wide["query"]], [wide["memories"]])
    with pytest.raises(ValueError, match=r"^memories: expected at most"):
        gate.decide(wide["query"], wide["memories"])
    with pytest.raises(ValueError, match=r"^stores\[1\]: expected at most"):
        memory_signals(["a", "b"], [["x"], wide["memories"]], gate.embedder)


def test_an_object_embedder_with_embed_of_texts_alone_is_taken_as_documented():
    # the gate documents "an object with embed(texts)"; memory_signals calls embed(texts, desc=...)
    class TextsOnly:
        backend = "mine"

        def embed(self, texts):
            return _lookup(texts)

    obj = TextsOnly()
    gate = MemoryGate(embedder=obj)
    memories, a = CASES[Action.ACTIVE]
    assert gate.decide("q", memories, risk=a) == MemoryGate(embedder=_lookup).decide("q", memories, risk=a)
    assert gate.embedder.backend == "mine"

    class WithDesc:
        def embed(self, texts, desc=""):
            return _lookup(texts)

    with_desc = WithDesc()
    assert MemoryGate(embedder=with_desc).embedder is with_desc  # taken as it is


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e300])
def test_an_object_embedders_non_finite_vectors_are_an_error_naming_the_embedder(bad):
    # before: NaN surfaced as "M: expected finite values", and a vector past float32's range as
    # M = R = 1, Active, silently
    class Overflowing:
        def embed(self, texts, desc=""):
            v = np.asarray(_lookup(texts), np.float64)
            v[1:, 0] = bad
            return v

    gate = MemoryGate(embedder=Overflowing(), risk=0.2)
    with pytest.warns(RuntimeWarning) if bad == 1e300 else contextlib.nullcontext():
        with pytest.raises(ValueError, match=r"^embedder: returned values that are NaN or infinite"):
            gate.decide("q", ["fact 0.95 a", "fact 0.95 b"])


def test_a_callable_embedders_own_error_is_raised_as_it_is_and_its_result_is_still_checked():
    """A ValueError or TypeError raised inside the callable was re-labelled "the callable's result is
    not an array of numbers", naming a result it never returned."""
    def own(texts):
        raise TypeError("my tokenizer takes a tuple")

    with pytest.raises(TypeError, match=r"^my tokenizer takes a tuple$"):
        MemoryGate(embedder=own).decide("q", ["m"])
    with pytest.raises(ValueError, match=r"^embedder: the callable's result is not an array of numbers"):
        MemoryGate(embedder=lambda ts: [["a"] * 4 for _ in ts]).decide("q", ["m"])


@pytest.mark.parametrize("flags, match", [
    (lambda ts: [[0], [0, 1]], r"^conflict: expected an 2×2 matrix of flags for 2 memories, got a list"),
    (lambda ts: np.full((len(ts), len(ts)), 0.4), r"^conflict: expected booleans \(or 0/1\) .* got 0\.4"),
    (lambda ts: np.full((len(ts), len(ts)), np.nan), r"^conflict: expected booleans \(or 0/1\) .* got nan"),
    (lambda ts: np.full((len(ts), len(ts)), "no"), r"^conflict: expected booleans \(or 0/1\) .* got 'no'"),
])
def test_a_conflict_detectors_values_that_are_not_flags_are_an_error_naming_it(flags, match):
    # before: a probability, NaN or a string was read as True (a flagged pair); a ragged list leaked
    # NumPy's words
    gate = MemoryGate(embedder=_lookup, conflict=flags)
    with pytest.raises(ValueError, match=match):
        gate.decide("q", ["fact 0.95 a", "fact 0.95 b"])


def test_a_conflict_detectors_zero_one_numbers_are_flags():
    ones = MemoryGate(embedder=_lookup, conflict=lambda ts: 1 - np.eye(len(ts), dtype=int))
    trues = MemoryGate(embedder=_lookup, conflict=lambda ts: ~np.eye(len(ts), dtype=bool))
    memories = ["fact 0.95 a", "fact 0.95 b"]
    assert ones.decide("q", memories).scalars["phi"] == trues.decide("q", memories).scalars["phi"] == 1.0


def test_a_risk_callable_that_cannot_take_query_and_category_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"^risk: expected a callable \(query, category\)"):
        MemoryGate(embedder=_lookup, risk=lambda q: 0.3)
    assert MemoryGate(embedder=_lookup, risk=lambda q, c=None: 0.3).decide("q", []).scalars["A"] == \
        pytest.approx(0.3)


def test_the_default_detector_named_explicitly_is_the_default_not_a_wrapped_one():
    from mdl_jax.signals.conflict import pair_flags

    assert MemoryGate(embedder=_lookup, conflict=pair_flags).conflict is pair_flags
    assert MemoryGate(embedder=_lookup).conflict is pair_flags


def test_a_detector_whose_equality_is_elementwise_is_taken_as_any_other():
    """The check for the default detector compared a user's detector with ==, and one whose __eq__
    answers elementwise (an array, as NumPy-like objects do) failed the constructor with NumPy's
    "truth value of an array is ambiguous"; it is wrapped and used as any user detector is."""

    class Detector:
        def __call__(self, texts):
            return np.zeros((len(texts), len(texts)), bool)

        def __eq__(self, other):
            return np.array([True, False])

        __hash__ = object.__hash__

    from mdl_jax.signals.conflict import pair_flags

    gate = MemoryGate(embedder=_lookup, conflict=Detector())
    assert gate.conflict is not pair_flags and gate.conflict(["a", "b"]).shape == (2, 2)


def test_a_risk_at_either_end_of_the_unit_interval_is_taken_in_any_numeric_type():
    from mdl_jax.gate.checks import unit_float

    for x in (0, 1, 0.0, 1.0, np.float32(0.0), np.float64(1.0), np.int64(0)):
        assert unit_float("risk", x) == float(x)


def test_a_risk_given_as_a_bool_is_refused_naming_it():
    from mdl_jax.gate.checks import risk_table

    with pytest.raises(ValueError, match=r"^risk\['a'\]: expected a number in \[0, 1\], got True$"):
        risk_table({"a": True})


def test_a_missing_category_is_not_the_risk_tables_category_named_none():
    from mdl_jax.gate.checks import risk_table

    lookup = risk_table({"None": 0.9, "medical": 0.85})
    assert lookup("q", "None") == 0.9
    with pytest.raises(ValueError, match=r"^category: None is not in the risk table"):
        lookup("q", None)


def test_an_empty_risk_table_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"^risk: the \{category: risk\} table is empty"):
        MemoryGate(_lookup, risk={})
