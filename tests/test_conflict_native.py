"""The native lexical conflict detector (``mdl_jax.signals.conflict_native``) gives the Python detector's
flags, pair by pair: on generated sentences and raw characters (case, Unicode lowering, curly quotes,
contractions, ignored phrases a replacement joins, NULs, lone surrogates), on every store of both bundled
datasets, and inside the gate's bulk path; without the library the same functions fall back to Python."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mdl_jax.signals import conflict as py
from mdl_jax.signals import conflict_native as cn

pytestmark = pytest.mark.skipif(not cn.available(), reason=f"native conflict detector: {cn.status()}")


def _python_pairs(texts):
    an = [py.analyse(t) for t in texts]
    return [py.analyses_conflict(an[i], an[j]) for i, j in itertools.combinations(range(len(texts)), 2)]


def _native_pairs(texts):
    n = len(texts)
    flags = cn._call(texts, np.array([n], np.int64), True)[1]
    return flags.astype(bool).tolist()


_VOCAB = ["Yes,", "No,", "yes", "no", "not", "NOT", "Never", "don't", "isn’t", "needn't", "ain’t", "can'tx",
          "n't", "nothing", "not only", "no doubt", "no matter", "nothing but", "not to mention", "nonot only",
          "matter", "safe", "dangerous", "harmful", "legal", "illegal", "true", "false", "more", "less",
          "always", "cause", "prevents", "real", "fake", "fictional", "the", "is", "it", "of", "vaccines",
          "water", "children", "7", "Item", "item", "cats", "dogs", "fish", "SAFE.", "(true)", "rock'n'roll",
          "K", "\u212a", "İtem", "café", "naïve", "x\x00y", "\ud800", "’s", "it's", "o'", "'"]


def _sentence():
    return st.lists(st.sampled_from(_VOCAB), max_size=10).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(_sentence(), min_size=2, max_size=6))
@example(["nonot onlymatter cats safe", "cats safe"])  # a replacement joins "no matter": then ignored
@example(["\u212aelvin is safe", "kelvin is not safe"])  # the Kelvin sign lowers to an ASCII k
@example(["water needn't ain’t n't", "water"])  # contractions are negators, not topic words
def test_native_flags_equal_python_flags_on_generated_sentences(texts):
    assert _native_pairs(texts) == _python_pairs(texts)


_CHARS = st.sampled_from(list("abnotyesfAlNOTY '’-.,0\u212aİé\x00") + ["\ud800"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_CHARS, max_size=40).map("".join), min_size=2, max_size=5))
def test_native_flags_equal_python_flags_on_raw_characters(texts):
    assert _native_pairs(texts) == _python_pairs(texts)


@given(st.lists(st.lists(_sentence(), max_size=5), min_size=1, max_size=8))
def test_group_counts_are_the_sums_of_each_groups_pair_flags(groups):
    flat = [t for g in groups for t in g]
    got = cn.group_counts(flat, [len(g) for g in groups])
    assert got.tolist() == [sum(_python_pairs(g)) for g in groups]


@pytest.mark.parametrize("dataset", ["truthfulqa", "halueval"])
def test_native_flags_equal_python_flags_on_every_bundled_store(dataset):
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.stores import build_stores

    stores = [list(s.texts) for s in build_stores(load(dataset))]
    flat = [t for s in stores for t in s]
    sizes = np.array([len(s) for s in stores])
    data_native = cn._call(flat, sizes, True)[1].astype(bool).tolist()
    data_python = [f for s in stores for f in _python_pairs(s)]
    assert data_native == data_python
    assert sum(data_python) > 0  # the stores do hold conflicts: the comparison can fail
    assert cn.pair_flags(stores[0]) == py.pair_flags(stores[0])


def test_bad_group_sizes_are_refused_with_the_argument_named():
    with pytest.raises(ValueError, match="sizes: expected group sizes summing to the 3 texts, got 4"):
        cn.group_counts(["a", "b", "c"], [2, 2])


def test_the_gates_bulk_path_gives_the_same_bits_native_and_python(monkeypatch):
    """``small_signals`` on more than RECENT_CALL stores (the bulk path, which calls the native detector)
    gives the same M, R, φ, n_relevant bytes as the Python detector's run of the same call."""
    from mdl_jax.signals import aggregation as ag

    rng = np.random.default_rng(5)
    adj = ("safe", "not safe", "dangerous", "true", "false", "never true")
    stores = [[f"item {rng.integers(4)} is {adj[rng.integers(6)]} for group {rng.integers(3)}"
               for _ in range(int(rng.integers(2, 7)))] for _ in range(ag.RECENT_CALL * 3)]
    texts = list(dict.fromkeys(t for s in stores for t in s))
    index = {t: i for i, t in enumerate(texts)}
    d = 32
    base = rng.normal(size=d)
    U = base + rng.normal(size=(len(texts), d))
    U = (U / np.linalg.norm(U, axis=1, keepdims=True)).astype(np.float32)
    q = base + rng.normal(size=(len(stores), d)) * 0.5
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    native = ag.small_signals(q, stores, U, index)
    assert native["phi"].any()  # conflicts were flagged: the comparison can fail
    monkeypatch.setitem(cn._STATE, "ok", False)
    python = ag.small_signals(q, stores, U, index)
    for k in native:
        assert native[k].tobytes() == python[k].tobytes(), k


def test_without_the_library_the_python_detector_answers(monkeypatch):
    monkeypatch.setitem(cn._STATE, "ok", False)
    texts = ["X is safe", "X is not safe", "Y is blue", "Yes, X", "No, X"]
    assert cn.group_counts(texts, [3, 2]).tolist() == [1, 1]
    assert cn.pair_flags(texts[:3]) == py.pair_flags(texts[:3])


def test_the_overlap_threshold_is_inclusive_as_in_python():
    """17 shared topic words of 50 is an overlap of exactly MIN_SHARED (17 / 50 is the double 0.34):
    "about the same thing", so a negation makes it a conflict; 16 of 50 is not."""
    words = [f"w{i}" for i in range(60)]
    for shared, want in ((17, True), (16, False)):
        a = " ".join(words[:shared] + words[20:20 + (50 - shared) // 2 + (50 - shared) % 2])
        b = " ".join(words[:shared] + words[40:40 + (50 - shared) // 2]) + " not"
        an = py.analyse(a), py.analyse(b)
        assert len(an[0][1] | an[1][1]) == 50 and len(an[0][1] & an[1][1]) == shared
        assert _python_pairs([a, b]) == [want] == _native_pairs([a, b])


def test_str_subclasses_get_the_python_detectors_answer():
    """A subclass may override len() (the native path's offsets) or lower() (which the Python detector
    calls): such texts are answered by the Python detector, never read out of bounds."""
    class Long(str):
        def __len__(self):
            return 1 << 34

    class Lower(str):
        def lower(self):
            return "cats not safe"

    for texts in ([Long("cats safe"), "cats not safe"], [Lower("cats safe"), "cats safe"]):
        assert cn.pair_flags(texts) == py.pair_flags(texts)
        assert cn.group_counts(texts, [2]).tolist() == [sum(_python_pairs(texts))]


def test_negative_group_sizes_are_refused_before_the_library_reads_them():
    with pytest.raises(ValueError, match="sizes: expected group sizes ≥ 0, got -1"):
        cn.group_counts(["a", "b", "c", "d"], [-1, 5])
    with pytest.raises(ValueError, match="sizes: expected group sizes ≥ 0"):
        cn._call(["a", "b"], np.array([-1, 3]), True)


def test_the_library_checks_group_starts_itself():
    """Group starts that run backwards or past the texts make MdlLexFlags return -2, read nothing."""
    data, off = cn._encode(["a", "b"])
    starts = np.array([0, 3], np.int64)  # past the 2 texts
    counts = np.zeros(1, np.int64)
    got = cn._STATE["fn"](cn._STATE["handle"], data, off.ctypes.data, 2, starts.ctypes.data, 1, None,
                          counts.ctypes.data)
    assert got == -2
    starts = np.array([1, 0], np.int64)  # backwards
    assert cn._STATE["fn"](cn._STATE["handle"], data, off.ctypes.data, 2, starts.ctypes.data, 1, None,
                           counts.ctypes.data) == -2


def test_a_failed_build_warns_once_and_leaves_the_python_detector(monkeypatch, tmp_path):
    """A compiler that fails (here /bin/false) into an empty cache: available() is False with one
    RuntimeWarning naming the fallback, and the functions answer with the Python detector's flags."""
    import shutil
    import warnings

    false = shutil.which("false")
    if false is None:
        pytest.skip("no false(1) to stand in for a broken compiler")
    saved = dict(cn._STATE)
    monkeypatch.setenv("CXX", false)
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path))
    cn._STATE.clear()
    try:
        with pytest.warns(RuntimeWarning, match="native conflict detector unavailable, using the Python one"):
            assert not cn.available()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: the state remembers the failure
            assert not cn.available()
            assert cn.group_counts(["X is safe", "X is not safe"], [2]).tolist() == [1]
        assert "failed" in cn.status()["error"]
    finally:
        cn._STATE.clear()
        cn._STATE.update(saved)
