"""The signal aggregation (``mdl_jax.signals.aggregation``): M, R and φ against hand computation and a
per-store reference, the small path against the JAX pass bit for bit, engines named or refused, bounded
steps for wide stores, and bad input named by argument."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

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
from mdl_jax.signals.conflict import pair_flags
from mdl_repro.pipeline.stores import Store, build_stores
from tests import gate_rows
from tests.gate_embedders import hashed
from tests.xla_cache import without_cache

ROOT = Path(__file__).resolve().parents[1]


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
