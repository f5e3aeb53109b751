"""The native sweep engine (decide_cpu.cc: mdl_sweep_f32), called by name (engine="native"): equal to
engine="jax" on every kind of grid, ablation and weight vector, chosen by "auto" on the CPU (never by
the default), a warned fallback under "auto" and a one-line error by name when it cannot be built."""

import warnings

import jax
import numpy as np
import pytest

from mdl_jax import MDLConfig, bootstrap_weights, config_grid, decide, sweep
from mdl_jax.controller import passes
from mdl_jax.controller import sweep as sweep_mod
from mdl_jax.engines import kernel as engine_kernel
from mdl_jax.engines import native, native_sweep, toolchain
from tests.reference import decide_definition


@pytest.fixture(scope="module", autouse=True)
def kernel():
    if toolchain.compiler() is None:
        pytest.skip("no C++ compiler on this machine: sweep runs the jax engine")
    assert native.load(), native.status()


N = 1001  # not a multiple of 16 (a tail block) nor of the kernel's record chunks


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    M, R, A = rng.uniform(size=(3, N)).astype(np.float32)
    return M, R, A, rng.integers(0, 2, N)


_per_record = jax.jit(jax.vmap(passes._over_records, in_axes=(None, None, None, 0)))


def assert_engines_agree(M, R, A, adopt, cfgs, weights=None, record_chunk=sweep_mod.RECORD_CHUNK,
                         jax_engine=True):
    """The native engine against (a) float64 sums of the pure-JAX per-record decisions and (b) the
    jax engine: counts and the number correct equal, exactly for integer weights, except by the weight
    of records whose C_final lies within 1e-5 of one of that config's thresholds (one ulp may flip
    those); mean C_final within float rounding. Most (config, weight) cells must have no such record,
    so the exact part of the claim is really exercised."""
    nat = sweep(M, R, A, cfgs, adopt=adopt, weights=weights, engine="native", record_chunk=record_chunk)
    batch, K, _ = sweep_mod.as_batch(cfgs)
    cf, act = (np.asarray(x) for x in _per_record(*(np.asarray(x, np.float32) for x in (M, R, A)), batch))
    th = np.asarray(batch.thresholds, np.float32).reshape(K, 3)
    near = (np.abs(cf[:, :, None] - th[:, None, :]) < 1e-5).any(-1)                  # (K, N)
    w = np.ones((1, len(M))) if weights is None else np.atleast_2d(np.asarray(weights, np.float64))
    shape = np.shape(nat.mean_C_final)
    tol = (near.astype(np.float64) @ w.T).reshape(shape)                              # (K[, W])
    total = w.sum(1) if np.ndim(nat.total) else w.sum()
    counts64 = np.einsum("wn,kna->kwa", w, (act[:, :, None] == np.arange(4)).astype(np.float64))
    correct64 = np.einsum("wn,kn->kw", w, ((act == 0) == np.asarray(adopt, bool)).astype(np.float64))
    cf64 = np.einsum("wn,kn->kw", w, cf.astype(np.float64))
    integral = np.array_equal(w, np.floor(w))
    slack = 0.0 if integral else 1e-7 * w.sum(1).max()   # sweep hands the engines float32 weights
    dc = np.abs(np.asarray(nat.counts) - counts64.reshape(np.shape(nat.counts))).max(-1)
    assert np.all(dc <= tol + slack), (dc.max(), tol.max())
    dn = np.abs(np.asarray(nat.accuracy) * total - correct64.reshape(shape))
    assert np.all(dn <= tol + slack + 1e-9 * np.max(total))
    np.testing.assert_allclose(nat.mean_C_final, (cf64 / w.sum(1)).reshape(shape), rtol=0, atol=2e-6)
    assert np.mean(tol == 0) > 0.5
    if not jax_engine:
        return nat
    # the jax engine: the same integers; float weights there are summed in float32
    ref = sweep(M, R, A, cfgs, adopt=adopt, weights=weights, engine="jax", record_chunk=record_chunk)
    jslack = 0.0 if integral else 1e-5 * w.sum(1).max()
    dj = np.abs(np.asarray(nat.counts) - np.asarray(ref.counts)).max(-1)
    assert np.all(dj <= tol + jslack), (dj.max(), tol.max())
    if integral:
        assert np.array_equal(np.asarray(nat.counts)[tol == 0], np.asarray(ref.counts)[tol == 0])
    np.testing.assert_allclose(nat.mean_C_final, ref.mean_C_final, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(nat.total, ref.total)
    return nat


GRIDS = {
    "sigma": dict(sigma=np.linspace(0.03, 0.6, 9)),
    "gates": dict(g_a=np.linspace(0, 1, 7), g_b=np.linspace(0, 1, 7)),   # one fusion group of 49
    "sigma_x_gates": dict(sigma=[0.08, 0.3], g_a=np.linspace(0, 1, 6), g_b=np.linspace(0, 1, 6)),
    "thresholds": dict(theta0=[0.5, 0.7, 0.9], theta1=[0.3, 0.45], theta2=[0.05, 0.2]),
    "gains": dict(s_wm=[0.5, 1.0], s_r=[0.7, 1.3], s_a=[0.4, 0.9], eps_c=[0.0, 0.2]),
    "g_A": dict(g_A_a=[0.2, 0.5], g_A_b=[0.5, 1.0]),
    "bias_vector": dict(bias=[np.linspace(-0.2, 0.2, 16), np.zeros(16)]),
    "n_range": dict(n_min=[0.5, 1.0, 2.0], n_max=[3.0, 3.6]),
}


def _concat(batches):
    """One batch from several grids (vector bias everywhere), so one jax program checks them all."""
    leaves = {}
    for f in sweep_mod.NUMERIC_FIELDS:
        parts = [np.asarray(getattr(b, f), np.float32) for b in batches]
        if f == "bias":
            parts = [np.broadcast_to(x.reshape(len(x), -1), (len(x), 16)) for x in parts]
        leaves[f] = np.concatenate(parts)
    return sweep_mod.with_leaves(batches[0], leaves)


def test_native_sweep_equals_the_jax_engine_on_every_kind_of_grid(data):
    # 181 configs in ~25 fusion groups: σ, gates (one group of 49, three config blocks), both, θ,
    # gains and ε_c, g_A, bias vectors, n_min/n_max; scalar bias on its own below.
    M, R, A, adopt = data
    grids = [config_grid(MDLConfig(), **g) for g in GRIDS.values()]
    assert_engines_agree(M, R, A, adopt, _concat(grids), weights=bootstrap_weights(N, 3, seed=1))
    assert_engines_agree(M, R, A, adopt, config_grid(MDLConfig(), bias=[-0.2, 0.0, 0.3], sigma=[0.1, 0.2]),
                         weights=bootstrap_weights(N, 3, seed=1))


@pytest.mark.parametrize("switch", ["alpha_gating", "risk_modulation", "risk_inversion", "value_encoding",
                                    "subspaces"])
def test_native_sweep_equals_the_jax_engine_under_every_ablation(switch, data):
    M, R, A, adopt = data
    base = MDLConfig(**{switch: "identity" if switch == "subspaces" else False}, dims=(4, 7, 5))
    # against the pure-JAX decisions only (the jax engine's program is checked against them in test_sweep)
    assert_engines_agree(M, R, A, adopt, config_grid(base, sigma=[0.1, 0.25], g_a=[0.2, 0.5]), jax_engine=False)


def test_native_sweep_weights_int_float_one_and_many(data, monkeypatch):
    # The kernel's three ways of summing: float32 integers (bootstrap, unweighted), int32 (totals past
    # 2^24, where sweep keeps int32) and general floats (float64); W = 1 (None) and W > 1.
    M, R, A, adopt = data
    cfgs = config_grid(MDLConfig(), sigma=[0.1, 0.3], g_b=[0.3, 0.9])
    rng = np.random.default_rng(2)
    big = np.full((2, N), 30_000, np.int64)   # row totals 3e7 > 2^24: int32 sums
    big[1, ::3] = 7
    modes = []
    real = native_sweep._weight_mode
    monkeypatch.setattr(native_sweep, "_weight_mode", lambda w: modes.append(real(w)) or modes[-1])
    for w in [None, bootstrap_weights(N, 4, seed=3), big, rng.uniform(0, 2.5, (3, N))]:
        assert_engines_agree(M, R, A, adopt, cfgs, weights=w)
    assert set(modes) == {native_sweep._INTEGRAL, native_sweep._INT32, native_sweep._DOUBLE}


def test_native_integer_counts_are_exact_past_float32s_2_to_the_24(data):
    M, R, A, adopt = data
    w = np.full((1, N), 40_000, np.int64)   # total 4.0e7: float32 sums would round
    res = sweep(M, R, A, config_grid(MDLConfig(), sigma=[0.1, 0.2]), adopt=adopt, weights=w, engine="native")
    assert np.all(res.counts.sum(-1) == 40_000 * N)
    assert np.all(res.counts == np.round(res.counts))


def test_native_sweep_across_record_chunks_passes_and_tails():
    # N = 4099 crosses the kernel's 2048-record sub-chunks and 4096-record items; record_chunk = 1500
    # makes three passes (the last padded with weight-0 records).
    rng = np.random.default_rng(9)
    n = 4099
    M, R, A = rng.uniform(size=(3, n)).astype(np.float32)
    adopt = rng.integers(0, 2, n)
    cfgs = config_grid(MDLConfig(), sigma=[0.1, 0.4], g_a=[0.1, 0.6])
    one = assert_engines_agree(M, R, A, adopt, cfgs, weights=bootstrap_weights(n, 2, seed=0))
    chunked = sweep(M, R, A, cfgs, adopt=adopt, weights=bootstrap_weights(n, 2, seed=0), record_chunk=1500,
                    engine="native")
    assert np.array_equal(one.counts, chunked.counts) and np.array_equal(one.accuracy, chunked.accuracy)
    np.testing.assert_allclose(one.mean_C_final, chunked.mean_C_final, rtol=1e-6)  # float32 lane sums


def test_native_sweep_of_a_list_of_ablation_batches_and_a_single_config(data):
    M, R, A, adopt = data
    batches = [config_grid(MDLConfig(), sigma=[0.1, 0.2]), config_grid(MDLConfig(alpha_gating=False), sigma=[0.1])]
    both = sweep(M, R, A, batches, adopt=adopt, engine="native")
    for b, res in zip(batches, both):
        alone = sweep(M, R, A, b, adopt=adopt, engine="native")
        assert np.array_equal(res.counts, alone.counts) and res.counts.shape == (len(b.sigma), 4)
    single = sweep(M, R, A, MDLConfig(sigma=0.2), adopt=adopt, engine="native")
    assert single.counts.shape == (4,) and np.ndim(single.accuracy) == 0
    assert np.array_equal(single.counts, both[0].counts[1])


def test_the_native_sweep_is_deterministic_and_ignores_the_thread_count(data):
    M, R, A, adopt = data
    cfgs = config_grid(MDLConfig(), sigma=np.linspace(0.05, 0.5, 20), g_a=[0.2, 0.7])
    w = np.random.default_rng(4).uniform(0, 1, (2, N))
    a = sweep(M, R, A, cfgs, adopt=adopt, weights=w, engine="native")
    lib = native.loaded_library()
    try:
        lib.MdlSetMaxThreads(1)
        b = sweep(M, R, A, cfgs, adopt=adopt, weights=w, engine="native")
    finally:
        lib.MdlSetMaxThreads(native.usable_cpus())
    for f in ("accuracy", "counts", "mean_C_final"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def test_auto_picks_native_on_the_cpu_and_the_default_is_jax(data, monkeypatch):
    M, R, A, adopt = data
    cfgs = config_grid(MDLConfig(), g_a=[0.2, 0.5])
    calls = []
    real = native.sweep_engine
    monkeypatch.setattr(native, "sweep_engine", lambda *a: calls.append(a) or real(*a))
    auto = sweep(M, R, A, cfgs, adopt=adopt, engine="auto")
    assert len(calls) == 1
    ref = sweep(M, R, A, cfgs, adopt=adopt)
    sweep(M, R, A, cfgs, adopt=adopt, engine="jax")
    assert len(calls) == 1   # the default (engine="jax") never touches the kernel
    np.testing.assert_allclose(auto.counts, ref.counts, atol=2)
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    sweep(M, R, A, cfgs, adopt=adopt, engine="auto")
    assert len(calls) == 1   # switched off: auto takes jax
    with pytest.raises(ValueError, match="^engine='native' cannot run here: MDL_JAX_NATIVE=0"):
        sweep(M, R, A, cfgs, adopt=adopt, engine="native")
    with pytest.raises(ValueError, match="^engine='native' cannot run here: the kernel takes D = 16"):
        monkeypatch.delenv(native.ENV_SWITCH)
        sweep(M, R, A, config_grid(MDLConfig(D=8, dims=(3, 3, 2)), g_a=[0.2, 0.5]), engine="native")


def test_auto_falls_back_to_jax_with_one_warning_when_the_kernel_cannot_be_built(data, monkeypatch, tmp_path):
    M, R, A, adopt = data
    monkeypatch.setattr(engine_kernel, "_STATE", {})
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    cfgs = config_grid(MDLConfig(), sigma=[0.1, 0.2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named first: the error alone, no word of a fallback that does not run
        with pytest.raises(ValueError, match="^engine='native' cannot run here: .*no C\\+\\+ compiler"):
            sweep(M, R, A, cfgs, adopt=adopt, engine="native")
    with pytest.warns(RuntimeWarning, match="native CPU kernel unavailable"):
        out = sweep(M, R, A, cfgs, adopt=adopt, engine="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = sweep(M, R, A, cfgs, adopt=adopt, engine="auto")   # warned once, not per call
    ref = sweep(M, R, A, cfgs, adopt=adopt, engine="jax")
    assert np.array_equal(out.counts, ref.counts) and np.array_equal(again.counts, ref.counts)
    with pytest.raises(ValueError, match="^engine='native' cannot run here: .*no C\\+\\+ compiler"):
        sweep(M, R, A, cfgs, adopt=adopt, engine="native")


def test_pack_batch_rows_are_the_single_config_packing(data):
    cfgs = config_grid(MDLConfig(dims=(4, 7, 5)), sigma=[0.07, 0.3], bias=[np.linspace(-0.1, 0.2, 16), np.zeros(16)],
                       eps_c=[0.0, 0.05])
    rows = native.pack_batch(cfgs, 8)
    for k in range(8):
        one = MDLConfig(dims=(4, 7, 5), sigma=float(cfgs.sigma[k]), bias=np.asarray(cfgs.bias[k]),
                        eps_c=float(cfgs.eps_c[k]))
        assert np.array_equal(rows[k], native.pack(one)), k


def test_records_with_the_same_signals_are_decided_once_with_the_same_result(monkeypatch):
    # Paired designs repeat (M, R, A) across systems with different labels; the engine folds them into
    # one record carrying its weights by label. Integer weights: exactly the unfolded result.
    rng = np.random.default_rng(8)
    M, R, A = np.tile(rng.uniform(size=(3, 250)).astype(np.float32), 3)
    adopt = rng.integers(0, 2, 750)
    w = bootstrap_weights(750, 3, seed=2)
    m, _, _, w2 = native_sweep._split_weights(M, R, A, adopt, w.astype(np.float32), dedup=True)
    assert len(m) == 250 and w2.shape == (2, 3, 250) and w2.sum() == w.sum()
    cfgs = config_grid(MDLConfig(), sigma=[0.1, 0.3], g_a=[0.2, 0.6])
    folded = assert_engines_agree(M, R, A, adopt, cfgs, weights=w)
    monkeypatch.setattr(native_sweep, "DEDUP", False)
    plain = sweep(M, R, A, cfgs, adopt=adopt, weights=w, engine="native")
    for f in ("accuracy", "counts"):
        assert np.array_equal(getattr(folded, f), getattr(plain, f)), f
    np.testing.assert_allclose(folded.mean_C_final, plain.mean_C_final, rtol=1e-6)


# The ISA variants besides the process's own (on an AVX-512 CPU: the AVX2 build, 8 lanes), each
# against the process's variant: the same decisions, so equal integer counts, and the same sums up to
# the lane order of float sums. The process's variant is the one every test above checks.
_OTHER_ISAS = [v for v in native.available_isas() if v != "native" and v != native.isa()]


@pytest.mark.parametrize("variant", _OTHER_ISAS or [pytest.param(None, marks=pytest.mark.skip(
    reason="this CPU runs one ISA variant only: the tests above cover it"))])
def test_every_isa_variant_sweeps_as_the_default_one(variant, data, monkeypatch):
    M, R, A, adopt = data
    grids = _concat([config_grid(MDLConfig(), **g) for g in GRIDS.values()])
    ablation = config_grid(MDLConfig(risk_inversion=False, subspaces="identity", dims=(4, 7, 5)), sigma=[0.1, 0.25])
    rng = np.random.default_rng(3)
    big = np.full((1, N), 30_000, np.int64)
    real = native.sweep_engine
    cases = [(grids, bootstrap_weights(N, 3, seed=1)), (ablation, None), (ablation, big),
             (ablation, rng.uniform(0, 2.5, (2, N)))]
    for cfgs, w in cases:
        ref = sweep(M, R, A, cfgs, adopt=adopt, weights=w, engine="native")
        monkeypatch.setattr(native, "sweep_engine", lambda *a, **k: real(*a, variant=variant))
        got = sweep(M, R, A, cfgs, adopt=adopt, weights=w, engine="native")
        monkeypatch.setattr(native, "sweep_engine", real)
        assert np.array_equal(got.counts, ref.counts) and np.array_equal(got.total, ref.total)
        np.testing.assert_allclose(got.accuracy, ref.accuracy, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got.mean_C_final, ref.mean_C_final, rtol=1e-6, atol=1e-7)
    # a tail-heavy pass: n = 4099 crosses the sub-chunks with a ragged last block of every width
    n = 4099
    M2, R2, A2 = rng.uniform(size=(3, n)).astype(np.float32)
    a2 = rng.integers(0, 2, n)
    cfgs = config_grid(MDLConfig(), sigma=[0.1, 0.4], g_a=[0.1, 0.6])
    ref = sweep(M2, R2, A2, cfgs, adopt=a2, record_chunk=1500, engine="native")
    monkeypatch.setattr(native, "sweep_engine", lambda *a, **k: real(*a, variant=variant))
    got = sweep(M2, R2, A2, cfgs, adopt=a2, record_chunk=1500, engine="native")
    assert np.array_equal(got.counts, ref.counts)


# --- extreme σ and config packing in chunks -----------------------------------------------------------------


@pytest.mark.parametrize("sigma", [2.0 ** -63, 1e30])
def test_decide_and_the_native_sweep_at_extreme_sigma_warn_nothing_and_equal_pure_jax(sigma):
    # Packing the native kernel's params computed 1/(2σ²) in NumPy: a RuntimeWarning (an exception
    # under warnings-as-errors) for a valid σ = 1e30, where the pure-JAX path is silent.
    from mdl_jax.controller import decision

    c = np.asarray(decision.centres(MDLConfig(), np.float32))
    M = np.concatenate([c, [0.2, 0.5]]).astype(np.float32)   # exactly at the centres, and between
    R, A = np.roll(M, 3), np.roll(M, 7)
    cfg = MDLConfig(sigma=sigma)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = decide(M, R, A, cfg, engine="native")
        res = sweep(M, R, A, config_grid(MDLConfig(), sigma=[sigma, 0.1]), engine="native")
    want = decide_definition(M, R, A, cfg)
    for f in got._fields:
        g, w = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
        assert np.all(np.isfinite(g)) and np.all(np.isfinite(w)), f
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=f)
    ref = sweep(M, R, A, config_grid(MDLConfig(), sigma=[sigma, 0.1]), engine="jax")
    np.testing.assert_array_equal(res.counts, ref.counts)
    np.testing.assert_allclose(res.mean_C_final, ref.mean_C_final, atol=1e-6)


def test_the_native_sweep_packs_configs_in_chunks_with_groups_across_chunk_ends(monkeypatch):
    # A 10^5-config gate grid held (K, 1085) packed params and (K, 3, 16, 16) weight matrices at once
    # (750 MB for 10 records); now packed _PACK_CHUNK configs at a time. Chunks of 3 here, so fusion
    # groups (σ) span chunk ends and recur in later chunks: the sums must not change.
    from mdl_jax.engines import native_sweep

    monkeypatch.setattr(native_sweep, "_PACK_CHUNK", 3)
    r = np.random.default_rng(4)
    M, R, A = (r.random(30).astype(np.float32) for _ in range(3))
    adopt = r.random(30) < 0.5
    g = config_grid(MDLConfig(), g_a=[0.1, 0.5, 0.9, 0.3], sigma=[0.05, 0.2], bias=[0.0, 0.3])   # K = 16
    w = r.integers(0, 3, (2, 30))
    got = sweep(M, R, A, g, adopt=adopt, engine="native", weights=w)
    want = sweep(M, R, A, g, adopt=adopt, engine="jax", weights=w)
    np.testing.assert_array_equal(got.counts, want.counts)
    np.testing.assert_array_equal(got.accuracy, want.accuracy)
    np.testing.assert_allclose(got.mean_C_final, want.mean_C_final, atol=1e-6)
