"""The small-store path's native dot products (``mdl_jax.signals.dots_native``): each product sums in the
order the source states (checked bit for bit against that order written in NumPy), bad arrays are
refused before any read, the signals match NumPy's products to ≤ 1e-6 with every gate action of the
bundled TruthfulQA stores unchanged, and a failed build falls back to NumPy's with one warning."""

import contextlib

import numpy as np
import pytest

from mdl_jax.signals import aggregation as ag
from mdl_jax.signals import dots_native as dn
from tests.reference import relevant_flags

needs_native = pytest.mark.skipif(not dn.available(), reason=f"native dot products: {dn.status()}")


@contextlib.contextmanager
def numpy_products():
    """NumPy's products for the block (the library stays loaded)."""
    saved = dict(dn._STATE)
    dn._STATE["ok"] = False
    try:
        yield
    finally:
        dn._STATE.clear()
        dn._STATE.update(saved)


def _stated_order(x: np.ndarray, y: np.ndarray) -> np.float64:
    """The source's order: term k into partial sum k mod 8, in order of k; then the fixed tree."""
    t = x.astype(np.float64) * y.astype(np.float64)  # exact: float32 products fit in float64
    s = np.zeros(8)
    for k in range(len(t)):  # one add at a time: NumPy's own reductions may sum pairwise
        s[k % 8] = s[k % 8] + t[k]
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


@needs_native
@pytest.mark.parametrize("d", [1, 7, 8, 9, 64, 383, 384])
def test_each_product_sums_in_the_stated_order_bit_for_bit(d):
    rng = np.random.default_rng(d)
    U = rng.normal(size=(9, d)).astype(np.float32) * np.float32(1e3)  # magnitudes that round visibly
    Q = rng.normal(size=(2, d)).astype(np.float32)
    idx = np.array([[3, 0, 8, 5], [1, 1, 7, 2]])
    cos, upper = dn.step_dots(U, idx, Q)
    iu, ju = np.triu_indices(4, 1)
    for r in range(2):
        assert cos[r].tolist() == [_stated_order(U[i], Q[r]) for i in idx[r]]
        assert upper[r].tolist() == [_stated_order(U[idx[r, i]], U[idx[r, j]]) for i, j in zip(iu, ju)]


@needs_native
@pytest.mark.parametrize("bad, why", [
    (dict(idx=np.array([[0, 9]])), "outside"),
    (dict(idx=np.array([[-1, 0]])), "outside"),
    (dict(U=np.zeros((9, 4), np.float64)), "float32"),
    (dict(Q=np.zeros((2, 4), np.float32)), r"Q \(m, d\)"),
])
def test_bad_arrays_are_refused_naming_what_was_expected(bad, why):
    args = dict(U=np.zeros((9, 4), np.float32), idx=np.array([[0, 1]]), Q=np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match=why):
        dn.step_dots(**{**args, **bad})


@pytest.mark.slow
@needs_native
def test_signals_match_numpys_products_and_no_bundled_gate_action_changes(embedder):
    """TruthfulQA's 817 stores, the real MiniLM: M, R within 1e-6 of the NumPy products' and every
    action of the gate (Table 2's defaults, each category's A) the same."""
    from mdl_jax.gate import MemoryGate
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.stores import build_stores

    stores = build_stores(load("truthfulqa"))
    qs = [s.item.question for s in stores]
    ms = [list(s.texts) for s in stores]
    cats = [s.item.category for s in stores]
    gate = MemoryGate(embedder=embedder, risk="truthfulqa")
    native = gate.columns(qs, ms, cats)
    with numpy_products():
        numpy = gate.columns(qs, ms, cats)
    for k in ("M", "R", "phi", "C_final"):
        np.testing.assert_allclose(native[k], numpy[k], atol=1e-6, rtol=0, err_msg=k)
    assert native["action"].tolist() == numpy["action"].tolist()


def test_every_small_path_gives_the_same_bits_with_either_products():
    """The bulk steps, a call of a few rows and ``aggregate_small`` agree bit for bit with the native
    products and with NumPy's (each process takes one of them for all three)."""
    import functools

    rng = np.random.default_rng(3)
    adj = ("safe", "not safe", "dangerous", "true", "false")
    stores = [[f"item {rng.integers(4)} is {adj[rng.integers(5)]} for group {rng.integers(3)}"
               for _ in range(int(rng.integers(0, 8)))] for _ in range(ag.RECENT_CALL + 30)]
    texts = list(dict.fromkeys(t for s in stores for t in s))
    index = {t: i for i, t in enumerate(texts)}
    base = rng.normal(size=48)
    U = base + rng.normal(size=(len(texts), 48))
    U = (U / np.linalg.norm(U, axis=1, keepdims=True)).astype(np.float32)
    q = base + rng.normal(size=(len(stores), 48)) * 0.6
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    for products in (contextlib.nullcontext, numpy_products):
        with products():
            bulk = ag.small_signals(q, stores, U, index)
            assert bulk["R"][bulk["n_relevant"] >= 2].size  # rows with pairs: R's products are read
            for b, s in enumerate(stores):
                few = ag.small_signals(q[b:b + 1], [s], U, index)
                ref = ag.aggregate_small(q[b], U[[index[t] for t in s]],
                                         functools.partial(relevant_flags, s))
                for k, r in zip(("M", "R", "phi", "n_relevant"), ref):
                    want = np.asarray(r, bulk[k].dtype).tobytes()
                    assert bulk[k][b].tobytes() == few[k][0].tobytes() == want, (products, k, b)


def test_a_failed_build_falls_back_to_numpys_products_with_one_warning(tmp_path, monkeypatch):
    import shutil
    import warnings

    false = shutil.which("false")
    if false is None:
        pytest.skip("no false(1) to stand in for a broken compiler")
    saved = dict(dn._STATE)
    monkeypatch.setenv("CXX", false)
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path))
    dn._STATE.clear()
    try:
        with pytest.warns(RuntimeWarning, match="native dot products unavailable, using NumPy's"):
            assert not dn.available()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: the state remembers the failure
            assert not dn.available()
            U = np.eye(3, dtype=np.float32)
            got = ag.small_signals(U[:1], [["a", "b"]], U, {"a": 0, "b": 1})
            assert got["M"].tolist() == [1.0]
        assert "failed" in dn.status()["error"]
    finally:
        dn._STATE.clear()
        dn._STATE.update(saved)
