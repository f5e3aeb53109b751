"""The sweep engine: equal to a Python loop over ``decide`` for every numeric field and ablation,
bootstrap weights equal explicit resampling, clear errors, and the same result sharded; the memory
bound, huge integer weights, corrupt Parquet pages and the ``sweep`` command under hostile input."""


import re
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdl_jax import MDLConfig, bootstrap_weights, config_grid, decide, stack_configs, sweep
from mdl_jax.controller.config import NUMERIC_FIELDS
from mdl_jax.controller.stream import sweep_parquet
from tests.peak_rss import PEAK_RSS_FUNCS, peak_growth_mb

N = 300


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    M, R, A = rng.uniform(size=(3, N)).astype(np.float32)
    adopt = rng.integers(0, 2, N)
    return M, R, A, adopt


def _config_at(batch: MDLConfig, k: int) -> MDLConfig:
    leaves = {f: np.asarray(getattr(batch, f))[k] for f in NUMERIC_FIELDS}
    return batch.replace(**{f: (tuple(float(x) for x in v) if v.ndim else float(v))
                            for f, v in leaves.items()})


def _loop_reference(M, R, A, adopt, cfg: MDLConfig, weights=None):
    """What sweep must equal: decide on every record, reduced by hand; plus how many records sit
    within 1e-5 of a threshold (where float rounding between two programs may flip the action)."""
    d = decide(M, R, A, cfg)
    act, cf = np.asarray(d.action), np.asarray(d.C_final, np.float64)
    th = np.asarray(cfg.thresholds, np.float64)
    near = int(np.sum(np.min(np.abs(cf[:, None] - th[None, :]), axis=1) < 1e-5))
    w = np.ones((1, len(M))) if weights is None else np.atleast_2d(weights)
    counts = np.stack([w @ (act == a) for a in range(4)], -1)
    acc = (w @ ((act == 0) == adopt)) / w.sum(1)
    mean_cf = (w @ cf) / w.sum(1)
    return acc, counts, mean_cf, near


def _at(res, k):
    return res._replace(accuracy=res.accuracy[k], counts=res.counts[k], mean_C_final=res.mean_C_final[k])


def _assert_matches_loop(res_k, ref, atol_cf=1e-5):
    acc, counts, mean_cf, near = ref
    np.testing.assert_allclose(np.asarray(res_k.counts).reshape(counts.shape), counts, atol=near + 1e-3)
    np.testing.assert_allclose(np.asarray(res_k.accuracy).reshape(acc.shape), acc,
                               atol=near / N + 1e-6)
    np.testing.assert_allclose(np.asarray(res_k.mean_C_final).reshape(mean_cf.shape), mean_cf,
                               atol=atol_cf)


GRIDS = {
    "sigma": dict(sigma=[0.08, 0.2, 0.45]),
    "eps_c": dict(eps_c=[0.0, 0.1, 0.3]),
    "gains": dict(s_wm=[0.6, 1.0], s_r=[0.7, 1.4], s_a=[0.5, 0.9]),
    "gains_tuples": dict(gains=[(1.0, 0.7, 0.5), (0.8, 0.8, 0.8)]),
    "g_A_coeffs": dict(g_A_a=[0.2, 0.5], g_A_b=[0.5, 1.0]),
    "gate_coeffs": dict(g_a=[0.0, 0.3, 1.0], g_b=[0.2, 0.7]),
    "thresholds": dict(thresholds=[(0.6, 0.4, 0.2), (0.9, 0.5, 0.1), (0.3, 0.3, 0.3)]),
    "theta0": dict(theta0=[0.6, 0.7, 0.95]),
    "bias_scalar": dict(bias=[-0.2, 0.0, 0.3]),
    "bias_vector": dict(bias=[np.linspace(-0.2, 0.2, 16), np.zeros(16)]),
    "n_range": dict(n_min=[1.0, 2.0], n_max=[3.0, 3.5]),
}


@pytest.mark.parametrize("name", list(GRIDS))
def test_sweep_equals_a_python_loop_over_decide_for_every_numeric_field(name, data):
    M, R, A, adopt = data
    batch = config_grid(MDLConfig(), **GRIDS[name])
    res = sweep(M, R, A, batch, adopt=adopt)
    K = int(np.prod([len(v) for v in GRIDS[name].values()]))
    assert res.accuracy.shape == (K,) and res.counts.shape == (K, 4) and res.mean_C_final.shape == (K,)
    for k in range(K):
        ref = _loop_reference(M, R, A, adopt, _config_at(batch, k))
        _assert_matches_loop(_at(res, k), ref)


ABLATIONS = [dict(alpha_gating=False), dict(risk_modulation=False), dict(subspaces="identity"),
             dict(risk_inversion=False), dict(value_encoding=False), dict(dims=(4, 7, 5), qr_seed=3)]


def test_sweep_equals_the_loop_for_each_ablation(data):
    M, R, A, adopt = data
    batches = [config_grid(MDLConfig(**ab), sigma=[0.1, 0.3], g_b=[0.5, 0.7]) for ab in ABLATIONS]
    results = sweep(M, R, A, batches, adopt=adopt)
    assert len(results) == len(ABLATIONS)
    for batch, res in zip(batches, results):
        for k in range(4):
            ref = _loop_reference(M, R, A, adopt, _config_at(batch, k))
            _assert_matches_loop(_at(res, k), ref)


def test_a_grid_of_one_config_equals_decide(data):
    M, R, A, adopt = data
    cfg = MDLConfig(sigma=0.25, thresholds=(0.7, 0.5, 0.3))
    single = sweep(M, R, A, cfg, adopt=adopt)
    assert single.accuracy.shape == () and single.counts.shape == (4,)
    _assert_matches_loop(single, _loop_reference(M, R, A, adopt, cfg))
    batch_of_one = sweep(M, R, A, stack_configs([cfg]), adopt=adopt)
    assert batch_of_one.counts.shape == (1, 4)
    np.testing.assert_array_equal(np.asarray(batch_of_one.counts[0]), np.asarray(single.counts))


def test_bootstrap_weights_equal_explicit_resampling(data):
    M, R, A, adopt = data
    batch = config_grid(MDLConfig(), g_a=[0.1, 0.3], g_b=[0.6, 0.9])
    w = bootstrap_weights(N, 5, seed=4)
    assert w.shape == (5, N) and np.all(w.sum(1) == N)
    res = sweep(M, R, A, batch, adopt=adopt, weights=w)
    assert res.accuracy.shape == (4, 5) and res.counts.shape == (4, 5, 4)
    for b in range(5):
        idx = np.repeat(np.arange(N), w[b].astype(int))  # the explicit resample
        explicit = sweep(M[idx], R[idx], A[idx], batch, adopt=adopt[idx])
        np.testing.assert_allclose(np.asarray(res.accuracy[:, b]), np.asarray(explicit.accuracy), atol=1e-6)
        np.testing.assert_array_equal(np.asarray(res.counts[:, b]), np.asarray(explicit.counts))
        np.testing.assert_allclose(np.asarray(res.mean_C_final[:, b]),
                                   np.asarray(explicit.mean_C_final), atol=1e-5)


def test_sweep_under_x64_decides_in_float32_exactly_as_without_it(data):
    """Float64 signals under x64 are swept as float32 (the page's promise): the same sums, bit for bit."""
    M, R, A, adopt = data
    grid = config_grid(sigma=[0.05, 0.2, 0.5], thresholds=[(0.6, 0.4, 0.2), (0.55, 0.35, 0.15)])
    ref = sweep(M, R, A, grid, adopt=adopt)
    with jax.enable_x64(True):
        for signals in ((M, R, A), tuple(x.astype(np.float64) for x in (M, R, A))):
            got = sweep(*signals, grid, adopt=adopt)
            for f in ("accuracy", "counts", "mean_C_final", "total"):
                np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)), err_msg=f)


@pytest.mark.parametrize("seed", [-1, 1.5, "x", [-3]])
def test_bootstrap_weights_refuses_a_seed_default_rng_refuses_naming_seed(seed):
    """NumPy's own words ("expected non-negative integer") did not say which argument was wrong."""
    with pytest.raises(ValueError, match=r"^seed: expected a seed numpy\.random\.default_rng takes"):
        bootstrap_weights(5, 2, seed=seed)


def test_grouped_bootstrap_weights_draw_whole_groups():
    """With ``groups``, a resample draws G groups with replacement: records of one group always weigh
    alike, the group multiplicities sum to G, the same seed gives the same draws, and groups=None keeps
    the record bootstrap's draws. Bad labels are an error naming ``groups``."""
    rng = np.random.default_rng(2)
    groups = rng.choice([f"q{i}" for i in range(13)], size=60)  # 13 questions, uneven sizes
    w = bootstrap_weights(60, 200, seed=7, groups=groups)
    assert w.shape == (200, 60) and w.dtype == np.float32
    labels, first = np.unique(groups, return_index=True)
    per_group = w[:, first]                                   # one record of each group
    assert np.all(per_group.sum(1) == len(labels))
    for g in labels:
        members = np.flatnonzero(groups == g)
        assert np.all(w[:, members] == w[:, members[:1]]), g
    assert np.array_equal(w, bootstrap_weights(60, 200, seed=7, groups=list(groups)))
    assert np.array_equal(bootstrap_weights(60, 3, seed=7), bootstrap_weights(60, 3, seed=7, groups=None))
    # a group's multiplicity is Binomial(G, 1/G): mean 1
    assert abs(per_group.mean() - 1.0) < 0.05
    with pytest.raises(ValueError, match=r"^groups: expected 60 labels \(one per record\), got shape \(59,\)$"):
        bootstrap_weights(60, 3, groups=groups[:-1])
    with pytest.raises(ValueError, match=r"^groups: expected labels of one type, got NoneType, int, str$"):
        bootstrap_weights(3, 3, groups=np.array(["a", None, 1], dtype=object))
    with pytest.raises(ValueError, match=r"^groups: expected labels of one type, got int, str$"):
        bootstrap_weights(2, 3, groups=[1, "1"])   # not merged into one group "1"
    with pytest.raises(ValueError, match=r"^groups: expected a label for every record, got NaN at index 1$"):
        bootstrap_weights(3, 3, groups=[0.0, np.nan, 1.0])


def test_grid_is_the_cartesian_product_in_c_order():
    batch = config_grid(MDLConfig(), g_a=[0.1, 0.2, 0.3], sigma=[0.15, 0.25])
    ga = np.asarray(batch.gate_coeffs)[:, 0].reshape(3, 2)
    sg = np.asarray(batch.sigma).reshape(3, 2)
    np.testing.assert_allclose(ga, [[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]], atol=1e-7)
    np.testing.assert_allclose(sg, [[0.15, 0.25]] * 3, atol=1e-7)
    np.testing.assert_allclose(np.asarray(batch.gate_coeffs)[:, 1], 0.7, atol=1e-7)  # from the base


def test_sweep_runs_the_same_with_jit_disabled(data):
    M, R, A, adopt = data
    batch = config_grid(MDLConfig(), sigma=[0.1, 0.2, 0.3])
    jitted = sweep(M[:50], R[:50], A[:50], batch, adopt=adopt[:50])
    with jax.disable_jit():
        eager = sweep(M[:50], R[:50], A[:50], batch, adopt=adopt[:50])
    np.testing.assert_allclose(np.asarray(eager.mean_C_final), np.asarray(jitted.mean_C_final), atol=1e-6)
    np.testing.assert_allclose(np.asarray(eager.counts), np.asarray(jitted.counts), atol=1)


@pytest.mark.parametrize("make, match", [
    (lambda: MDLConfig().replace(sigma=np.array([0.1, 0.2]), eps_c=np.array([0.1, 0.1, 0.1])),
     "eps_c: expected a leading config axis of size 2"),
    (lambda: MDLConfig().replace(sigma=np.array([0.1, 0.2])), "eps_c: expected a leading config axis"),
])
def test_a_config_batch_with_mismatched_leading_axes_is_an_error_naming_the_field(make, match, data):
    M, R, A, adopt = data
    with pytest.raises(ValueError, match=match):
        sweep(M, R, A, make(), adopt=adopt)


@pytest.mark.parametrize("axes, match", [
    (dict(sigma=[0.1, np.nan]), r"sigma: expected finite values; sigma\[1\]"),
    (dict(g_b=[0.5, np.inf]), r"g_b: expected finite values"),
    (dict(sigma=[0.1, -0.2]), "sigma: expected a finite width > 0 .*; config 1"),
    (dict(eps_c=[0.1, 0.6]), "eps_c: expected 0 ≤ eps_c < min"),
    (dict(theta1=[0.5, 0.7]), "thresholds: expected θ0 ≥ θ1 ≥ θ2"),
    (dict(n_max=[3.0, 0.5]), "n_max: expected n_max > n_min; config 1"),
    (dict(gains=[(1.0, 0.7)]), "gains: expected tuples of 3 values"),
    (dict(colour=[1, 2]), "colour: not a numeric config field"),
])
def test_a_bad_grid_is_a_value_error_naming_the_field(axes, match):
    with pytest.raises(ValueError, match=match):
        config_grid(MDLConfig(), **axes)


def test_bad_labels_weights_and_signals_are_errors_naming_the_argument(data):
    M, R, A, adopt = data
    batch = config_grid(MDLConfig(), sigma=[0.1, 0.2])
    with pytest.raises(ValueError, match=r"adopt: expected shape \(300,\)"):
        sweep(M, R, A, batch, adopt=adopt[:-1])
    with pytest.raises(ValueError, match="adopt: expected binary"):
        sweep(M, R, A, batch, adopt=adopt * 2)
    with pytest.raises(ValueError, match=r"weights: expected shape \(W, 300\)"):
        sweep(M, R, A, batch, weights=np.ones((2, 7)))
    with pytest.raises(ValueError, match=r"^weights: expected finite, non-negative weights; weights\[0\] = -1\.0$"):
        sweep(M, R, A, batch, weights=-np.ones(N))
    # the first bad entry is named where it stands, by row and record in a (W, N) batch
    w = np.ones((2, N))
    w[1, 7] = np.nan
    with pytest.raises(ValueError, match=r"^weights: expected finite, non-negative weights; weights\[1, 7\] = nan$"):
        sweep(M, R, A, batch, weights=w)
    bad = M.copy()
    bad[7] = 1.5
    with pytest.raises(ValueError, match=r"M: expected values in \[0, 1\]; M\[7\]"):
        sweep(bad, R, A, batch)
    with pytest.raises(TypeError, match="configs: expected an MDLConfig"):
        sweep(M, R, A, {"sigma": 0.2})


# --- sweep agrees with MDLConfig, its sums are exact, and N is not bounded by memory ----

def test_sweep_and_config_grid_accept_every_config_mdlconfig_and_decide_accept(data):
    # A zero gain with ε_c = 0 (a pathway switched off) is valid for MDLConfig and decide.
    M, R, A, adopt = data
    base = MDLConfig(eps_c=0.0, gains=(1.0, 0.0, 0.5))
    grid = config_grid(base, s_r=[0.0, 0.3])
    res = sweep(M, R, A, grid, adopt=adopt)
    for k in range(2):
        acc, counts, _, _ = _loop_reference(M, R, A, adopt, _config_at(grid, k))
        np.testing.assert_allclose(res.counts[k], counts[0], atol=2)
    with pytest.raises(ValueError, match=r"eps_c: expected 0 ≤ eps_c < min\(gains\), or eps_c = 0 .*config 1 .* = 0\.2$"):
        config_grid(MDLConfig(eps_c=0.0, gains=(1.0, 0.1, 0.5)), eps_c=[0.0, 0.2])


def test_accuracy_is_a_share_at_most_one_when_every_record_agrees_under_float_weights(data):
    # Labels equal to the decisions: every record is correct, so the accuracy is 1 for any weights. With
    # non-integer weights the number correct is a float32 sum on the device, which can round above the
    # weights' total; a share of records is still never above 1.
    M, R, A, _ = data
    adopt = np.asarray(decide(M, R, A).action) == 0
    w = np.random.default_rng(0).uniform(0.5, 1.5, (8, N))
    res = sweep(M, R, A, MDLConfig(), adopt=adopt, weights=w)
    assert np.all(res.accuracy <= 1.0)
    np.testing.assert_allclose(res.accuracy, 1.0, rtol=1e-6)


def test_a_weight_vector_whose_total_is_zero_is_refused_naming_weights(data):
    M, R, A, adopt = data
    w = np.ones((3, N))
    w[1] = 0.0
    for weights in (np.zeros(N), w):
        with pytest.raises(ValueError, match="^weights: every weight vector needs a positive total"):
            sweep(M, R, A, MDLConfig(), adopt=adopt, weights=weights)


def test_integer_weights_give_exact_counts_past_float32s_2_to_the_24(data):
    M, R, A, adopt = data
    batch = config_grid(MDLConfig(), sigma=[0.1, 0.2])
    ones = sweep(M, R, A, batch, adopt=adopt)
    big = sweep(M, R, A, batch, adopt=adopt, weights=np.full(N, 100_003, np.int64))  # total 3.0e7 > 2^24
    assert big.counts.dtype == np.float64 and big.total == 100_003 * N
    np.testing.assert_array_equal(big.counts, 100_003 * ones.counts)   # float32 sums were off here
    np.testing.assert_array_equal(big.counts.sum(-1), [100_003 * N] * 2)
    np.testing.assert_array_equal(big.accuracy, ones.accuracy)


def test_finite_weights_whose_float32_total_overflows_give_the_scaled_result(data):
    M, R, A, adopt = data
    batch = config_grid(MDLConfig(), sigma=[0.1, 0.2])
    w = np.random.default_rng(2).uniform(0.5, 1.5, N)
    ref = sweep(M, R, A, batch, adopt=adopt, weights=w)
    for s in (1e36, 1e300):  # finite; float32 totals of these were inf (NaN accuracy), or inf weights
        big = sweep(M, R, A, batch, adopt=adopt, weights=w * s)
        # the weights themselves round differently once scaled by s: float32 sums agree to ~1e-7
        np.testing.assert_allclose(big.accuracy, ref.accuracy, rtol=1e-6)
        np.testing.assert_allclose(big.mean_C_final, ref.mean_C_final, rtol=1e-6)
        np.testing.assert_allclose(big.counts, ref.counts * s, rtol=1e-6)
        assert np.isfinite(big.total) and big.total == pytest.approx(w.sum() * s, rel=1e-12)


@pytest.mark.parametrize("weights", [None, "bootstrap", "float"])
def test_chunking_the_records_gives_the_unchunked_result(data, weights):
    # sweep walks the records in passes of record_chunk (memory bounded by it, not by N); the
    # integer sums are identical, mean C_final equal up to float32 partial sums.
    M, R, A, adopt = data
    w = {None: None, "bootstrap": bootstrap_weights(N, 3, seed=1),
         "float": np.random.default_rng(3).uniform(0, 2, (3, N))}[weights]
    batch = config_grid(MDLConfig(), g_a=[0.1, 0.3, 0.5])
    whole = sweep(M, R, A, batch, adopt=adopt, weights=w)
    for chunk in (7, 128):  # 43 passes with a padded last one; 3 passes
        part = sweep(M, R, A, batch, adopt=adopt, weights=w, record_chunk=chunk)
        if weights == "float":
            np.testing.assert_allclose(part.counts, whole.counts, rtol=1e-6)
            np.testing.assert_allclose(part.accuracy, whole.accuracy, rtol=1e-6)
        else:
            np.testing.assert_array_equal(part.counts, whole.counts)
            np.testing.assert_array_equal(part.accuracy, whole.accuracy)
        np.testing.assert_array_equal(part.total, whole.total)
        np.testing.assert_allclose(part.mean_C_final, whole.mean_C_final, rtol=1e-6)
    with pytest.raises(ValueError, match=r"^record_chunk: expected a positive int"):
        sweep(M, R, A, batch, record_chunk=0)


# --- memory bound, huge integer weights, corrupt pages ------------------------------------------------------


_SWEEP_MEMORY = PEAK_RSS_FUNCS + """
    import sys
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    from mdl_jax.cli import main
    from mdl_jax.controller import sweep as sw
    N, W, bound, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(3, N)).astype(np.float32)
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2], "adopt": rng.uniform(size=N) < 0.5}), path)
    sw.MEMORY_BOUND = bound
    args = ["sweep", path, "--grid", "g_a=0.2,0.4", "--out", path + ".csv", "--bootstrap"]
    assert main(args + ["2"]) == 0
    base = reset_peak()
    assert main(args + [str(W)]) == 0
    print(hwm() - base)
"""


def test_bootstrap_sweep_memory_stays_under_the_bound(tmp_path):
    """`mdl-jax sweep --bootstrap W` held W × 2^18 records' weights per pass, in several copies (7 GB at
    W = 1000). Passes are now cut to MEMORY_BOUND: at 64 MiB, 2^16 records and W = 64 grow the peak by
    ~50 MB (137 MB before)."""
    bound = 64 << 20
    grew = peak_growth_mb(_SWEEP_MEMORY, 1 << 16, 64, bound, tmp_path / "r.parquet")
    assert grew < 1.3 * bound / 2**20 + 8, f"peak RSS grew by {grew:.0f} MB under a {bound >> 20} MiB bound"


def test_bounded_passes_give_the_same_bootstrap_sweep(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mdl_jax import config_grid
    from mdl_jax.controller import sweep as sw
    from mdl_jax.controller.stream import sweep_parquet

    rng = np.random.default_rng(3)
    N = 70_000   # two Poisson blocks: passes cross a block boundary
    x = rng.uniform(size=(3, N)).astype(np.float32)
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2], "adopt": rng.uniform(size=N) < 0.5}), path,
                   row_group_size=30_000)
    grid = config_grid(g_a=[0.2, 0.4])
    ref = sweep_parquet(path, grid, bootstrap=16, seed=5, engine="native")
    monkeypatch.setattr(sw, "MEMORY_BOUND", 8 << 20)   # passes of ~6,000 records, the block kept
    assert sw.bounded_chunk(sw.RECORD_CHUNK, 2, 16) < 10_000
    got = sweep_parquet(path, grid, bootstrap=16, seed=5, engine="native")
    assert np.array_equal(got.accuracy, ref.accuracy) and np.array_equal(got.counts, ref.counts)
    np.testing.assert_allclose(got.mean_C_final, ref.mean_C_final, rtol=1e-6)


def test_a_sweep_too_big_for_the_bound_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mdl_jax.cli import main
    from mdl_jax.controller import sweep as sw

    x = np.random.default_rng(0).uniform(size=(3, 50)).astype(np.float32)
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2]}), path)
    monkeypatch.setattr(sw, "MEMORY_BOUND", 1 << 20)
    assert main(["sweep", str(path), "--grid", "g_a=0:1:50", "--bootstrap", "200"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdl-jax: error: sweep: bootstrap:") and "MEMORY_BOUND" in err and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="weights: .*memory bound"):
        sweep(*x, stack_configs([MDLConfig()] * 50), weights=np.ones((200, 50), np.float32))


@pytest.mark.parametrize("engine", ["jax", "native"])
def test_weights_of_2_to_the_62_and_uint64_2_to_the_63_sum_exactly(engine):
    x = np.random.default_rng(0).uniform(size=(3, 12)).astype(np.float32)
    adopt = np.arange(12) % 2
    one = sweep(*x, MDLConfig(), adopt=adopt, engine=engine)
    for w in (np.full(12, 2**62, np.int64), np.full((2, 12), 2**63 + 1, np.uint64)):
        res = sweep(*x, MDLConfig(), adopt=adopt, weights=w, engine=engine)
        acc = np.asarray(res.accuracy).reshape(-1)
        assert np.all(np.isfinite(acc)) and np.allclose(acc, one.accuracy)
        np.testing.assert_allclose(np.asarray(res.counts).reshape(-1, 4) / float(w.flat[0]),
                                   np.broadcast_to(one.counts, (acc.size, 4)), rtol=1e-12)


@pytest.mark.parametrize("offset", [20, 30, 50, 100])
def test_a_corrupt_parquet_page_is_one_error_line(tmp_path, offset, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mdl_jax.cli import main
    from mdl_jax.controller.stream import sweep_parquet

    x = np.random.default_rng(0).uniform(size=(3, 5000)).astype(np.float32)
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2]}), path, compression="snappy")
    start = pq.ParquetFile(path).metadata.row_group(0).column(1).data_page_offset
    data = bytearray(path.read_bytes())
    for i in range(start + offset, start + offset + 16):   # the page header or the snappy stream of R
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="row group 0 cannot be read"):
        sweep_parquet(path, MDLConfig())
    assert main(["sweep", str(path), "--grid", "g_a=0.3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdl-jax: error: sweep: path:") and len(err.splitlines()) == 1


# --- the sweep command, Poisson resamples, Parquet columns and grids ----------------------------------------


def _parquet(path, n, seed=0):
    r = np.random.default_rng(seed)
    pq.write_table(pa.table({"M": r.random(n), "R": r.random(n), "A": r.random(n), "adopt": r.random(n) < 0.5}),
                   path)
    return path


def test_sweep_command_reports_the_files_records_under_bootstrap_too(tmp_path, capsys):
    # with --bootstrap it printed a resample's mean weight total (4,997 for 5,000 rows) as the record count
    from mdl_jax.cli import main

    path = _parquet(tmp_path / "r.parquet", 500)
    for extra, configs in (([], "2 configs"), (["--bootstrap", "3"], "2 configs"), (["--grid", "sigma=0.2"], "2 configs")):
        assert main(["sweep", str(path), "--grid", "g_a=0.2,0.4", "--out", str(tmp_path / "o.csv"), *extra]) == 0
        assert f"({configs} × 500 records)" in capsys.readouterr().err
    assert main(["sweep", str(path), "--grid", "g_a=0.2", "--out", str(tmp_path / "o.csv"), "--bootstrap", "3"]) == 0
    assert "(1 config × 500 records)" in capsys.readouterr().err


def test_sweep_command_creates_the_missing_folders_of_out(tmp_path, capsys):
    # --out passes ``out_file`` (a creatable path) but the command used to open() it directly: a
    # FileNotFoundError traceback, exit 1, after the whole sweep had run.
    from mdl_jax.cli import main

    out = tmp_path / "new" / "deeper" / "grid.csv"
    assert main(["sweep", str(_parquet(tmp_path / "r.parquet", 20)), "--grid", "sigma=0.1,0.2",
                 "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_sweep_command_failing_leaves_no_output_folder_behind(tmp_path, capsys):
    from mdl_jax.cli import main

    out = tmp_path / "new" / "grid.csv"
    assert main(["sweep", str(_parquet(tmp_path / "r.parquet", 20)), "--grid", "sigma=0,0.2",
                 "--out", str(out)]) == 2
    assert not (tmp_path / "new").exists()


def test_sweep_command_never_writes_over_its_own_input(tmp_path, cli):
    # --out naming RECORDS (or a link to it) renamed the CSV over the Parquet file, then read it again
    # for the row count: the data gone and a pyarrow traceback
    import shutil

    path = _parquet(tmp_path / "r.parquet", 50)
    keep = path.read_bytes()
    (tmp_path / "link.parquet").symlink_to(path)
    cfg = tmp_path / "base.json"
    from mdl_jax import MDLConfig, save_config

    save_config(MDLConfig(), cfg)
    for out, what in ((path, "RECORDS"), (tmp_path / "link.parquet", "RECORDS"), (cfg, "--config")):
        rc, _, err = cli(["sweep", path, "--grid", "g_a=0.5", "--config", cfg, "--out", out])
        assert rc == 2 and err.strip().splitlines() == [
            f"mdl-jax: error: --out {str(out)!r} is the {what} file; it would be replaced by the output"]
    assert path.read_bytes() == keep and (tmp_path / "link.parquet").is_symlink()
    shutil.copy(path, tmp_path / "copy.parquet")   # a copy is another file: written as asked
    assert cli(["sweep", path, "--grid", "g_a=0.5", "--out", tmp_path / "copy.parquet"])[0] == 0


def test_sweep_command_refuses_a_device_or_fifo_as_out(tmp_path, cli):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path = _parquet(tmp_path / "r.parquet", 20)
    for out, said in ((fifo, "is not a regular file"), ("/dev/null", "names a device")):
        rc, _, err = cli(["sweep", path, "--grid", "g_a=0.5", "--out", out])
        assert rc == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert fifo.is_fifo() and Path("/dev/null").is_char_device()


def test_sweep_without_pyarrow_says_what_to_install_and_the_command_in_one_line(tmp_path, capsys, monkeypatch):
    # the core install has no pyarrow: the command printed a traceback, and both named the whole signals extra
    import sys

    from mdl_jax.cli import main

    path = _parquet(tmp_path / "r.parquet", 20)
    for name in ("pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)   # import pyarrow.parquet raises ImportError
    with pytest.raises(ImportError, match=r"pip install pyarrow"):
        sweep_parquet(path, MDLConfig())
    assert main(["sweep", str(path), "--grid", "g_a=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mdl-jax: error: sweep: reading Parquet needs pyarrow: pip install pyarrow (the signals extra "
                   "has it too)"], err


def test_sweep_command_printing_to_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    import errno
    import sys

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    path = _parquet(tmp_path / "r.parquet", 20)
    monkeypatch.setattr(sys, "stdout", Full())
    from mdl_jax.cli import main

    assert main(["sweep", str(path), "--grid", "g_a=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mdl-jax: error: cannot write <standard output>: No space left on device (the disk is full); "
                   "nothing was replaced"], err


def test_sweep_command_refuses_a_grid_too_large_for_memory_in_one_line(tmp_path, capsys):
    # --grid g_a=0:1:100000 --grid g_b=0:1:100000 (10^10 configs) died in a 74.5 GiB MemoryError
    # traceback; a COUNT of 10^9 allocated 8 GB at parse time.
    from mdl_jax.cli import main

    path = str(_parquet(tmp_path / "r.parquet", 10))
    for grid in (["g_a=0:1:100000", "g_b=0:1:100000"], ["sigma=0.1:1:1000000000"]):
        argv = ["sweep", path] + [x for g in grid for x in ("--grid", g)]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mdl-jax: error: sweep:") and "10,000,000" in err[0], err


def test_an_empty_poisson_resample_is_an_error_naming_bootstrap_not_weight(tmp_path, capsys):
    # One record, 10 Poisson(1) resamples: some draw nothing (seed 0: 3 of them). The error named the
    # "weight" column, which the caller never gave.
    path = _parquet(tmp_path / "one.parquet", 1)
    with pytest.raises(ValueError, match=r"^bootstrap: 3 of 10 Poisson resamples drew no record"):
        sweep_parquet(path, MDLConfig(), bootstrap=10, seed=0)
    from mdl_jax.cli import main

    assert main(["sweep", str(path), "--grid", "sigma=0.1", "--bootstrap", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mdl-jax: error: sweep: bootstrap:")
    # a weight column of zeros is still the weight column's error
    pq.write_table(pa.table({"M": [0.5], "R": [0.5], "A": [0.5], "w": [0.0]}), tmp_path / "w.parquet")
    with pytest.raises(ValueError, match=r"^weight:"):
        sweep_parquet(tmp_path / "w.parquet", MDLConfig(), columns={"weight": "w"}, bootstrap=2)


def test_poisson_weights_for_few_rows_hold_no_full_block_of_every_resample():
    # --bootstrap W drew a (W, 2^16) int64 block per 2^16 rows even for a 1-row file: 5 GB at W = 10^4.
    # Row by row the same generator gives the same numbers (the weights are unchanged) in O(2^16) memory.
    import tracemalloc

    from mdl_jax.controller.stream import POISSON_BLOCK, poisson_weights

    want = np.random.default_rng([5, 1]).poisson(1.0, (4, POISSON_BLOCK))[:, 10:20]
    np.testing.assert_array_equal(poisson_weights(POISSON_BLOCK + 10, POISSON_BLOCK + 20, 4, seed=5), want)
    tracemalloc.start()
    try:
        poisson_weights(0, 1, 200, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak   # the (200, 2^16) int64 block alone was 105 MB


def test_a_group_column_draws_whole_groups_the_same_wherever_their_records_stand(tmp_path):
    """Records that share a question move together in every resample (one Poisson(1) draw per
    question), whatever the rows' order, the passes or the ids' kind; the streamed sums equal ``sweep``
    on arrays with ``group_weights``' weights."""
    from mdl_jax.controller.stream import group_weights

    r = np.random.default_rng(4)
    n, W = 3000, 6
    qid = r.integers(0, 400, n)
    # a question's records alike (its signals near one point, one label): what makes them dependent
    M, R, A = np.clip(r.random((3, 400))[:, qid] + 0.05 * r.standard_normal((3, n)), 0, 1)
    adopt = (r.random(400) < 0.5)[qid]
    grid = config_grid(MDLConfig(), g_a=[0.2, 0.8])
    w = group_weights(qid, W, seed=9)
    for q in np.unique(qid)[:50]:
        rows = w[:, qid == q]
        assert np.all(rows == rows[:, :1])           # one draw per question and resample
    assert abs(w.mean() - 1.0) < 0.05 and abs(w.var() - 1.0) < 0.15   # Poisson(1)
    want = sweep(M, R, A, grid, adopt=adopt, weights=w, engine="jax")
    order = r.permutation(n)   # the same records, shuffled, in small row groups
    pq.write_table(pa.table({"M": M[order], "R": R[order], "A": A[order], "adopt": adopt[order],
                             "q": qid[order], "qs": [f"question {q}" for q in qid[order]]}),
                   tmp_path / "r.parquet", row_group_size=700)
    for col in ("q",):
        got = sweep_parquet(tmp_path / "r.parquet", grid, columns={"group": col}, bootstrap=W, seed=9,
                            record_chunk=1024)
        np.testing.assert_array_equal(got.counts, want.counts)
        np.testing.assert_array_equal(got.total, want.total)
        np.testing.assert_array_equal(got.accuracy, want.accuracy)
    strings = sweep_parquet(tmp_path / "r.parquet", grid, columns={"group": "qs"}, bootstrap=W, seed=9)
    ws = group_weights([f"question {q}" for q in qid], W, seed=9)
    np.testing.assert_array_equal(strings.total, sweep(M, R, A, grid, adopt=adopt, weights=ws).total)
    # a group's resample weights vary more than records' do: the interval is wider than record by record
    per_record = sweep_parquet(tmp_path / "r.parquet", grid, bootstrap=200, seed=1)
    per_group = sweep_parquet(tmp_path / "r.parquet", grid, columns={"group": "q"}, bootstrap=200, seed=1)
    assert per_group.accuracy[0].std() > per_record.accuracy[0].std()


def test_a_group_column_reserves_no_memory_for_the_record_bootstraps_draws(tmp_path, monkeypatch):
    """The record bootstrap keeps a block of (W, 2^16) draws, and the passes are cut to leave room for it;
    group draws use no such block, so their passes are cut for the weights alone."""
    from mdl_jax.controller import stream

    seen = []
    real = stream._sw.bounded_chunk
    monkeypatch.setattr(stream._sw, "bounded_chunk", lambda *a, **k: seen.append(k["reserved"]) or real(*a, **k))
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"M": [0.5] * 40, "R": [0.5] * 40, "A": [0.2] * 40, "q": np.arange(40) // 4}), path)
    sweep_parquet(path, MDLConfig(), columns={"group": "q"}, bootstrap=50, seed=0)
    sweep_parquet(path, MDLConfig(), bootstrap=50, seed=0)
    assert seen == [0, 50 * stream.POISSON_BLOCK * 4]


def test_a_group_column_that_cannot_group_is_an_error_naming_it(tmp_path, capsys):
    from mdl_jax.cli import main
    from mdl_jax.controller.stream import group_weights

    base = {"M": [0.5, 0.6], "R": [0.5, 0.5], "A": [0.2, 0.2]}
    for name, col, match in (("f", [1.0, 2.0], r"^f: expected integer or string ids .*got float64"),
                             ("b", [True, False], r"^b: expected integer or string ids"),
                             ("n", pa.array(["x", None]), r"^n: expected an id in every row; row 1 is null")):
        pq.write_table(pa.table({**base, name: col}), tmp_path / f"{name}.parquet")
        with pytest.raises(ValueError, match=match):
            sweep_parquet(tmp_path / f"{name}.parquet", MDLConfig(), columns={"group": name}, bootstrap=2)
    pq.write_table(pa.table({"M": [0.5] * 9, "R": [0.5] * 9, "A": [0.2] * 9, "q": ["a"] * 7 + [None, "b"]}),
                   tmp_path / "late.parquet", row_group_size=4)   # the null in the second row group
    with pytest.raises(ValueError, match=r"^q: expected an id in every row; row 7 is null"):
        sweep_parquet(tmp_path / "late.parquet", MDLConfig(), columns={"group": "q"}, bootstrap=2)
    with pytest.raises(ValueError, match=r"^columns: a \"group\" column \('f'\) groups the bootstrap"):
        sweep_parquet(tmp_path / "f.parquet", MDLConfig(), columns={"group": "f"})
    assert main(["sweep", str(tmp_path / "f.parquet"), "--grid", "sigma=0.1", "--column", "group=f",
                 "--bootstrap", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mdl-jax: error: sweep: f: expected integer or string ids"), err
    for ids, match in (([1, "a"], r"^ids: expected integer or string ids of one kind"),
                       (["q1", None], r"^ids: expected an id for every record; index 1 is None"),
                       (np.zeros((2, 2), int), r"^ids: expected a 1-d sequence")):
        with pytest.raises(ValueError, match=match):
            group_weights(ids, 2)
    with pytest.raises(ValueError, match=r"^n_resamples: expected an int ≥ 1"):
        group_weights([1, 2], 0)


def test_group_weights_of_uint64_ids_as_python_ints_are_the_streamed_ones(tmp_path):
    # a uint64 column's ids past 2^63 as Python ints (its to_pylist, a DataFrame's tolist) were refused
    # as "not within 64 bits", though the stream takes the same column
    from mdl_jax.controller.stream import group_weights

    ids = [2 ** 63 + 5, 2 ** 64 - 1, 7, 2 ** 63 + 5]
    want = group_weights(np.array(ids, np.uint64), 4, seed=3)
    np.testing.assert_array_equal(group_weights(ids, 4, seed=3), want)
    np.testing.assert_array_equal(group_weights(pa.array(ids, pa.uint64()).to_pylist(), 4, seed=3), want)
    base = {"M": [0.5] * 4, "R": [0.5] * 4, "A": [0.2] * 4}
    pq.write_table(pa.table({**base, "q": pa.array(ids, pa.uint64())}), tmp_path / "u.parquet")
    got = sweep_parquet(tmp_path / "u.parquet", MDLConfig(), columns={"group": "q"}, bootstrap=4, seed=3)
    np.testing.assert_array_equal(got.total, want.sum(1))
    for bad in ([-1, 2 ** 63], [2 ** 64]):   # -1 and 2^64 - 1 would share a key; 2^64 has none
        with pytest.raises(ValueError, match=r"^ids: expected integer ids that int64 or uint64 holds"):
            group_weights(bad, 2)


def test_a_group_bootstrap_with_empty_resamples_asks_for_more_groups_not_records(tmp_path):
    # it said "use more records": more records of the same few questions leave every resample as likely
    # to be empty (e^-G for G groups)
    n = 500
    base = {"M": np.full(n, 0.5), "R": np.full(n, 0.5), "A": np.full(n, 0.2)}
    pq.write_table(pa.table({**base, "q": np.zeros(n, np.int64)}), tmp_path / "one.parquet")
    with pytest.raises(ValueError, match=r"^bootstrap: \d+ of 20 Poisson resamples drew no record .*for N groups "
                                         r"\(distinct ids of 'q'\)\): use more groups or fewer resamples"):
        sweep_parquet(tmp_path / "one.parquet", MDLConfig(), columns={"group": "q"}, bootstrap=20)


def test_group_weights_take_any_python_string_as_an_id():
    # a lone surrogate ("\\ud800", from a decoded file name, say) was a UnicodeEncodeError naming no argument
    from mdl_jax.controller.stream import group_weights

    w = group_weights(["\ud800", "q", "\ud800", "é"], 50, seed=1)
    np.testing.assert_array_equal(w[:, 0], w[:, 2])
    np.testing.assert_array_equal(w[:, 1:], group_weights(["q", "\ud800", "é"], 50, seed=1)[:, [0, 1, 2]])
    assert not np.array_equal(w[:, 0], w[:, 1])


def test_group_weights_take_every_seed_the_record_bootstrap_takes(tmp_path):
    # a seed of 2^64 or more was an OverflowError traceback; poisson_weights (default_rng) takes any int ≥ 0
    from mdl_jax.controller.stream import group_weights

    ids = np.arange(2000)
    seeds = (0, 2 ** 64 - 1, 2 ** 64, 2 ** 64 + 1, 2 ** 200)
    draws = {s: group_weights(ids, 2, seed=s) for s in seeds}
    assert len({d.tobytes() for d in draws.values()}) == len(seeds)         # each seed its own draws
    assert all(abs(d.mean() - 1) < 0.1 for d in draws.values())
    np.testing.assert_array_equal(group_weights(ids, 2, seed=2 ** 64), draws[2 ** 64])
    base = {"M": np.full(2000, 0.5), "R": np.full(2000, 0.5), "A": np.full(2000, 0.2)}
    pq.write_table(pa.table({**base, "q": ids}), tmp_path / "r.parquet")
    got = sweep_parquet(tmp_path / "r.parquet", MDLConfig(), columns={"group": "q"}, bootstrap=2, seed=2 ** 70)
    np.testing.assert_array_equal(got.total, group_weights(ids, 2, seed=2 ** 70).sum(1))


def test_sweep_parquet_dropping_a_signal_role_or_huge_integer_weights_with_bootstrap(tmp_path):
    # columns={"M": None} was a KeyError 'M'; an int64 weight column of 2^62 times a Poisson
    # multiplicity ≥ 2 wrapped to negative weights ("every weight vector needs a positive total").
    r = np.random.default_rng(0)
    n = 50
    M, R, A = r.random(n), r.random(n), r.random(n)
    path = tmp_path / "w.parquet"
    pq.write_table(pa.table({"M": M, "R": R, "A": A, "w": np.full(n, 2 ** 62, np.int64)}), path)
    with pytest.raises(ValueError, match=r"^columns: role 'M' cannot be dropped"):
        sweep_parquet(path, MDLConfig(), columns={"M": None})
    res = sweep_parquet(path, MDLConfig(), columns={"weight": "w"}, bootstrap=3, seed=0)
    from mdl_jax.controller.stream import poisson_weights

    w = poisson_weights(0, n, 3, seed=0).astype(np.float64) * 2.0 ** 62
    want = sweep(M, R, A, MDLConfig(), weights=w)
    np.testing.assert_allclose(res.total, want.total, rtol=1e-12)
    np.testing.assert_allclose(res.counts, want.counts, rtol=1e-6)
    assert np.all(res.total > 0)


def test_a_grid_of_bias_vectors_of_the_wrong_length_names_bias_and_d():
    # config_grid(bias=[np.zeros(5)]) failed inside NumPy: "could not broadcast input array from shape
    # (1,5) into shape (1,16)", naming neither the field nor D.
    with pytest.raises(ValueError, match=r"^bias: expected scalars or vectors of D = 16 values, got shape \(1, 5\)"):
        config_grid(MDLConfig(), bias=[np.zeros(5)])
    assert config_grid(MDLConfig(), bias=[np.zeros(16), np.ones(16)]).bias.shape == (2, 16)


# --- weights at float64's edges, batches of the wrong shape, grids that contradict themselves -------------


def test_subnormal_and_tiny_weights_give_the_results_of_the_same_weights_scaled_up():
    # 1e-310: the per-vector scale 2^1030 was inf, and every result NaN
    rng = np.random.default_rng(4)
    M, R, A = rng.uniform(size=(3, 500)).astype(np.float32)
    adopt = rng.uniform(size=500) < 0.5
    grid = config_grid(g_a=[0.3, 0.8])
    for w in (np.full(500, 1e-310), rng.uniform(size=500) * 1e-300):
        got = sweep(M, R, A, grid, adopt=adopt, weights=w)
        want = sweep(M, R, A, grid, adopt=adopt, weights=w / w.max())
        np.testing.assert_allclose(got.accuracy, want.accuracy, rtol=1e-6)
        np.testing.assert_allclose(got.mean_C_final, want.mean_C_final, rtol=1e-6)
        np.testing.assert_allclose(got.counts / got.total, want.counts / want.total, rtol=1e-5)


def test_a_weight_column_whose_total_overflows_is_an_error_naming_it(tmp_path):
    # sweep refused such weights; sweep_parquet answered NaN and inf (and the command exited 0)
    r = np.random.default_rng(0)
    path = tmp_path / "w.parquet"
    pq.write_table(pa.table({"M": r.random(100), "R": r.random(100), "A": r.random(100),
                             "w": np.full(100, 1e307)}), path)
    with pytest.raises(ValueError, match=r"^weight: the weights' total overflows float64"):
        sweep_parquet(path, config_grid(g_a=[0.5]), columns={"weight": "w"})


def test_a_damaged_page_with_a_checksum_is_an_error_not_other_counts(tmp_path):
    r = np.random.default_rng(1)
    path = tmp_path / "crc.parquet"
    pq.write_table(pa.table({"M": r.random(4000), "R": r.random(4000), "A": r.random(4000)}), path,
                   write_page_checksum=True, compression="NONE")
    data = bytearray(path.read_bytes())
    at = data.find(np.float64(pq.read_table(path).column("M")[2000].as_py()).tobytes())
    assert at > 0
    data[at + 3] ^= 0x10   # one bit of one value inside M's page: still a number in [0, 1]
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"row group 0 cannot be read; the file is damaged .*(CRC|checksum)"):
        sweep_parquet(path, config_grid(g_a=[0.5]))


@pytest.mark.parametrize("field, value, said", [
    ("thresholds", np.tile([0.6, 0.4], (3, 1)), "thresholds: expected 3 values per config of the batch, got shape (3, 2)"),
    ("gains", np.ones((3, 4)), "gains: expected 3 values per config of the batch, got shape (3, 4)"),
])
@pytest.mark.parametrize("engine", ["jax", "native"])
def test_a_batch_leaf_of_the_wrong_length_is_named(field, value, said, engine):
    # a (K, 2) thresholds ran silently with wrong actions; a (K, 4) gains failed deep in the program
    from mdl_jax.controller.batches import with_leaves
    from mdl_jax.controller.config import NUMERIC_FIELDS

    grid = config_grid(g_a=[0.3, 0.5, 0.7])
    batch = with_leaves(grid, {**{f: getattr(grid, f) for f in NUMERIC_FIELDS}, field: value})
    x = np.full((3, 10), 0.5, np.float32)
    with pytest.raises(ValueError, match=re.escape(said)):
        sweep(*x, batch, engine=engine)


@pytest.mark.parametrize("engine", ["jax", "native"])
def test_a_batch_with_python_list_leaves_sweeps_as_with_arrays(engine):
    from mdl_jax.controller.batches import with_leaves
    from mdl_jax.controller.config import NUMERIC_FIELDS

    grid = config_grid(g_a=[0.3, 0.5, 0.7])
    leaves = {f: getattr(grid, f) for f in NUMERIC_FIELDS}
    listed = with_leaves(grid, {**leaves, "sigma": [0.2, 0.3, 0.4]})
    arrays = with_leaves(grid, {**leaves, "sigma": np.array([0.2, 0.3, 0.4], np.float32)})
    x = np.random.default_rng(2).uniform(size=(3, 300)).astype(np.float32)
    np.testing.assert_array_equal(sweep(*x, listed, engine=engine).counts, sweep(*x, arrays, engine=engine).counts)


def test_a_grid_with_a_component_and_its_whole_field_is_refused():
    # one axis silently overrode the other: configs labelled g_a = 0.5 that were not
    for kw in (dict(gate_coeffs=[(0.3, 0.7), (0.1, 0.9)], g_a=[0.5]), dict(theta0=[0.6], thresholds=[(0.7, 0.4, 0.2)])):
        with pytest.raises(ValueError, match="a component and its whole field in one grid"):
            config_grid(**kw)
    assert config_grid(g_a=[0.5], g_b=[0.2, 0.3]).sigma.shape == (2,)   # two components of one field: fine


def test_a_grid_past_the_machines_memory_is_refused_before_allocating(monkeypatch):
    from mdl_jax.controller import batches

    monkeypatch.setattr(batches, "_physical_memory", lambda: 1 << 30)
    with pytest.raises(ValueError, match=r"^axes: 10,000,000 configs .* need about 3\.7 GiB to build, over this "
                                         r"machine's 1\.0 GiB"):
        config_grid(sigma=np.linspace(0.1, 1, 10_000), g_a=np.linspace(0, 1, 1_000))


def test_no_weight_vectors_and_stacked_batches_are_errors_naming_the_argument():
    x = np.full((3, 8), 0.5, np.float32)
    with pytest.raises(ValueError, match=r"^weights: expected shape \(W, 8\) with W ≥ 1"):
        sweep(*x, config_grid(g_a=[0.5]), weights=np.zeros((0, 8)))
    grid = config_grid(g_a=[0.3, 0.5])
    with pytest.raises(ValueError, match=r"^configs\[0\]: expected a single config, got a batch of 2"):
        stack_configs([grid, grid])


def test_sweep_command_labels_each_config_by_the_float32_it_swept(tmp_path, cli):
    # .6g printed 0.1000001, 0.1000002 and 0.10000031 all as 0.1, and 1e-300 (swept as 0) as 1e-300
    path = _parquet(tmp_path / "r.parquet", 20)
    rc, out, err = cli(["sweep", path, "--grid", "g_a=0.1000001,0.1000002,0.10000031,1e-300,0.5", "--grid", "sigma=0.2"])
    assert rc == 0, err
    assert [ln.split(",")[0] for ln in out.splitlines()[1:]] == ["0.1000001", "0.1000002", "0.10000031", "0", "0.5"]


def test_sweep_command_takes_each_column_role_once(tmp_path, cli):
    path = _parquet(tmp_path / "r.parquet", 20)
    rc, _, err = cli(["sweep", path, "--grid", "g_a=0.5", "--column", "M=R", "--column", "M=A"])
    assert rc == 2 and err.strip() == "mdl-jax: error: sweep: --column: each role once, got M=R, M=A"


def test_grid_values_past_float32_and_bool_signal_columns_are_named(tmp_path):
    # 1e39 became inf in the float32 batch and the error spoke of gate_coeffs = (inf, 0.7)
    with pytest.raises(ValueError, match=r"^g_a: expected values a float32 holds .*g_a\[1\] = 1e\+39"):
        config_grid(g_a=[0.5, 1e39])
    path = tmp_path / "b.parquet"   # sweep and decide refuse bool signals; the stream took them as 0/1
    pq.write_table(pa.table({"M": np.array([True, False]), "R": [0.5, 0.5], "A": [0.5, 0.5]}), path)
    with pytest.raises(ValueError, match=r"^M: expected numbers, got bool"):
        sweep_parquet(path, config_grid(g_a=[0.5]))


def test_bfloat16_weights_are_taken_as_bfloat16_signals_are():
    import jax.numpy as jnp

    x = np.random.default_rng(5).uniform(size=(3, 64)).astype(np.float32)
    w = np.arange(64) % 3
    got = sweep(*x, config_grid(g_a=[0.4, 0.8]), weights=w.astype(jnp.bfloat16))
    want = sweep(*x, config_grid(g_a=[0.4, 0.8]), weights=w.astype(np.float32))
    np.testing.assert_array_equal(got.counts, want.counts)
