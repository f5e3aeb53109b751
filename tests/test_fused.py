"""The fused GPU kernel (mdl_jax/engines/fused.py, the "pallas" engine), checked without a GPU.

The kernel's logic runs in Pallas interpret mode on the CPU against ``decide_one`` (every field), the
sweep kernel against engine="jax" (by name, engine="pallas", with MDL_JAX_FUSED=interpret), and both
kernels are lowered for CUDA to Triton IR and verified (the stage at which Pallas rejects operations
Triton cannot take). When the engine runs (by name: concrete input, supported config, else a one-line
error; under "auto": a GPU backend, never under a caller's jit or grad) is checked with the backend
query faked: only the query, the kernel itself always runs.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdl_jax import MDLConfig, bootstrap_weights, config_grid, decide, decide_one, stack_configs, sweep
from mdl_jax.controller import api
from mdl_jax.controller import sweep as _sweep
from mdl_jax.engines import fused

FLOATS = ("C", "alpha", "C_final", "v_meta", "energies", "norm", "g_A")
CUDA = {"lowering_platforms": ("cuda",)}  # cross-platform lowering: no GPU needed
_plain = jax.jit(jax.vmap(decide_one, in_axes=(0, 0, 0, None)))

CONFIGS = {
    "default": MDLConfig(),
    "non-default numbers, vector bias": MDLConfig(sigma=0.07, eps_c=0.05, gains=(0.9, 0.6, 0.3),
                                                  g_A_coeffs=(0.4, 0.6), gate_coeffs=(0.2, 0.8),
                                                  thresholds=(0.7, 0.5, 0.1),
                                                  bias=tuple(np.linspace(-0.2, 0.2, 16)),
                                                  n_min=1.5, n_max=3.5),
    "identity subspaces": MDLConfig(subspaces="identity"),
    "four ablations, other dims": MDLConfig(value_encoding=False, risk_inversion=False, risk_modulation=False,
                                            alpha_gating=False, dims=(6, 4, 6)),
}


def _signals(n, seed=0):
    x = np.random.default_rng(seed).uniform(size=(3, n)).astype(np.float32)
    x[:, :6] = [[0, 1, 0, 1, 0.5, 1], [0, 1, 1, 0, 0.5, 0], [0, 1, 0, 0, 0.5, 1]]  # the cube's corners
    return x


def _assert_parity(out, ref, cfg):
    for f in FLOATS:
        a, b = np.asarray(getattr(out, f), np.float64), np.asarray(getattr(ref, f), np.float64)
        assert a.shape == b.shape and np.all(np.isfinite(a)), f
        assert np.max(np.abs(a - b)) <= 1e-5, (f, np.max(np.abs(a - b)))
    act, ref_act = np.asarray(out.action), np.asarray(ref.action)
    assert act.dtype == np.int32
    # an action may only differ where C_final sits within 1e-5 of a threshold
    th = np.asarray(cfg.thresholds, np.float32)
    near = np.min(np.abs(np.asarray(ref.C_final)[..., None] - th), -1) < 1e-5
    assert np.all((act == ref_act) | near)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_kernel_computes_what_decide_one_computes(name):
    # 300 records in blocks of 128: two full blocks and a masked partial one
    cfg = CONFIGS[name]
    x = _signals(300)
    _assert_parity(fused.decide(*x, cfg, interpret=True, block=128), _plain(*x, cfg), cfg)


@settings(max_examples=5)
@given(sigma=st.floats(1e-4, 5.0), eps=st.floats(0.0, 0.2), gains=st.tuples(*[st.floats(0.25, 1.5)] * 3),
       gate=st.tuples(st.floats(0, 1), st.floats(0, 1)), th=st.lists(st.floats(0, 1), min_size=3, max_size=3),
       bias=st.floats(-0.5, 0.5), seed=st.integers(0, 2**16))
def test_fused_kernel_matches_decide_one_for_drawn_configs(sigma, eps, gains, gate, th, bias, seed):
    # one compiled program for every draw: the numbers are kernel inputs, not constants
    cfg = MDLConfig(sigma=sigma, eps_c=eps, gains=gains, gate_coeffs=gate,
                    thresholds=tuple(sorted(th, reverse=True)), bias=bias)
    x = _signals(128, seed)
    _assert_parity(fused.decide(*x, cfg, interpret=True, block=128), _plain(*x, cfg), cfg)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_a_nan_or_infinite_signal_is_opt_out_on_the_fused_kernel(bad):
    x = _signals(128)
    x[0, 7], x[1, 8], x[2, 9] = bad, bad, bad
    for theta2 in (0.2, 0.0):   # C_final 0 on θ2 = 0 is Opt-Out too (decide_one's rule)
        act = np.asarray(fused.decide(*x, MDLConfig(thresholds=(0.6, 0.4, theta2)), interpret=True,
                                      block=128).action)
        assert np.all(act[7:10] == 3)


def test_packed_config_rows_are_the_weight_matrices_of_eq1():
    cfg = CONFIGS["non-default numbers, vector bias"]
    mats, vecs, scal = fused.pack(cfg)
    from mdl_jax.controller import decision

    W = np.asarray(decision.weight_matrices(cfg))
    np.testing.assert_allclose(np.swapaxes(mats[:3], 1, 2), W, atol=1e-7)
    np.testing.assert_allclose(mats[3], cfg.basis, atol=1e-7)
    np.testing.assert_array_equal(vecs[0], np.asarray(decision.centres(cfg)))
    want = [-1 / (2 * 0.07**2), 0.4, 0.6, 0.2, 0.8, 0.7, 0.5, 0.1, 1.5, 3.5]  # -1/2σ², g_A, gate, θ, n_*
    np.testing.assert_allclose(scal[:10], want, rtol=1e-6)


def test_packing_a_config_at_float32s_ends_warns_nothing_and_gives_the_native_kernels_numbers():
    # σ = 3e30 is a valid config: σ² overflows float32 to inf and 1/(2σ²) is 0, as on the pure-JAX path,
    # without a RuntimeWarning (a warnings-as-errors caller would see a crash on valid input), and the
    # numbers are the native kernel's own packing of the config, bit for bit
    from mdl_jax.engines import packing

    cfg = CONFIGS["non-default numbers, vector bias"].replace(sigma=3e30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mats, vecs, scal = fused.pack(cfg)
    row = packing.pack(cfg)
    assert scal[0] == 0.0 and np.array_equal(scal[1:10], row[packing.G_A_AT:packing.N_MAX_AT + 1])
    assert np.array_equal(vecs[1], row[packing.BIAS_AT:packing.BIAS_AT + 16])


# ------------------------------------------------------------------------------------ the sweep engine

def _sweep_data(n=300, seed=2):
    rng = np.random.default_rng(seed)
    M, R, A = rng.uniform(size=(3, n)).astype(np.float32)
    return M, R, A, rng.integers(0, 2, n)


@pytest.fixture
def interpret(monkeypatch):
    """The pallas engine in Pallas interpret mode: how it runs by name on a machine without a GPU."""
    monkeypatch.setenv(fused.ENV_SWITCH, "interpret")


@pytest.mark.parametrize("weights", ["bootstrap", "real"])
def test_fused_sweep_engine_equals_the_jax_engine(weights, interpret):
    # (no weights at all: test_fused_sweep_engine_takes_ablations_and_big_integer_weights)
    M, R, A, y = _sweep_data()
    w = {"bootstrap": bootstrap_weights(300, 3, 0),
         "real": np.random.default_rng(3).uniform(0.1, 2.0, (3, 300))}[weights]
    grid = config_grid(MDLConfig(), g_a=[0.1, 0.3, 0.5], g_b=[0.5, 0.9])
    # record_chunk 128: three passes, the last padded by sweep and each padded again by the kernel
    got = sweep(M, R, A, grid, adopt=y, weights=w, engine="pallas", record_chunk=128)
    ref = sweep(M, R, A, grid, adopt=y, weights=w, engine="jax", record_chunk=128)
    if weights == "real":
        np.testing.assert_allclose(got.counts, ref.counts, rtol=1e-6)
        np.testing.assert_allclose(got.accuracy, ref.accuracy, rtol=1e-6)
    else:  # integer weights: exact sums
        np.testing.assert_array_equal(got.counts, ref.counts)
        np.testing.assert_array_equal(got.accuracy, ref.accuracy)
    np.testing.assert_allclose(got.mean_C_final, ref.mean_C_final, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got.total, ref.total)


def test_fused_sweep_engine_takes_ablations_and_big_integer_weights(interpret):
    M, R, A, y = _sweep_data(200)
    batch = stack_configs([MDLConfig(subspaces="identity", alpha_gating=False, sigma=s) for s in (0.1, 0.2)])
    got = sweep(M, R, A, batch, adopt=y, engine="pallas")
    ref = sweep(M, R, A, batch, adopt=y, engine="jax")
    np.testing.assert_array_equal(got.counts, ref.counts)
    np.testing.assert_allclose(got.mean_C_final, ref.mean_C_final, rtol=1e-6)
    # integer sums that reach 2^24 travel as int32, which this engine hands to the pure-JAX one
    big = np.full((1, 200), 100_000, np.int64)
    got = sweep(M, R, A, batch, weights=big, engine="fused")   # the engine's earlier name
    ref = sweep(M, R, A, batch, weights=big, engine="jax")
    np.testing.assert_array_equal(got.counts, ref.counts)


# ------------------------------------------------------------------------------------ lowering

def test_both_kernels_lower_to_verified_triton_ir_for_cuda():
    # Cross-platform lowering runs Pallas' Triton lowering on this CPU machine: every primitive must
    # have a Triton rule, every tile a power-of-two size, and the module must pass MLIR verification.
    lowering = pytest.importorskip("jax._src.pallas.triton.lowering")
    if not hasattr(lowering, "lower_jaxpr_to_triton_module"):
        pytest.skip("this jax's Pallas Triton lowering has another entry point")
    with fused.captured_triton_ir() as modules:
        for cfg in (MDLConfig(), CONFIGS["identity subspaces"], CONFIGS["four ablations, other dims"]):
            mats, vecs, scal = fused.pack(cfg)
            for n in (1000, 1024):  # a partial last block (masked) and whole blocks
                x = jax.ShapeDtypeStruct((n,), jnp.float32)
                fused.decide_jit.trace(x, x, x, mats, vecs, scal, st=fused.structure(cfg), interpret=False,
                                       block=fused.BLOCK, num_warps=fused.NUM_WARPS).lower(**CUDA)
        grid = config_grid(MDLConfig(), sigma=[0.1, 0.2, 0.3])
        packed = fused.pack_batch(grid, 3)
        x = jax.ShapeDtypeStruct((8000,), jnp.float32)
        labels, weights = jax.ShapeDtypeStruct((8000,), bool), jax.ShapeDtypeStruct((10, 8000), jnp.float32)
        fused.sweep_jit.trace(x, x, x, labels, weights, *packed, st=fused.structure(grid), interpret=False,
                              block=fused.BLOCK, rec_block=fused.SWEEP_BLOCK,
                              num_warps=fused.NUM_WARPS).lower(**CUDA)
        # the opt-in TF32x3 products (three tensor-core passes), for bench_gpu to measure
        x = jax.ShapeDtypeStruct((1024,), jnp.float32)
        fused.decide_jit.trace(x, x, x, *fused.pack(MDLConfig()), st=fused.structure(MDLConfig()),
                               interpret=False, block=fused.BLOCK, num_warps=fused.NUM_WARPS,
                               precision="tf32x3").lower(**CUDA)
    assert len(modules) == 8
    for i, m in enumerate(modules):
        assert m.operation.verify()
        text = m.operation.get_asm(print_generic_op_form=True)
        dots = [line for line in text.splitlines() if '"tt.dot"' in line]
        # float32 products in IEEE mode (inputPrecision 2), never TF32 (0), as decision.PRECISION asks;
        # TF32x3 (1) only where asked for
        assert dots and all(f"inputPrecision = {1 if i == 7 else 2}" in line for line in dots)


# ------------------------------------------------------------------------------------ selection

@pytest.fixture
def calls(monkeypatch):
    """Counts the real fused kernel's calls (it still runs)."""
    seen = {"decide": 0, "sweep": 0}
    real_decide, real_sweep = fused.decide, fused.sweep_engine

    def counting_decide(*a, **k):
        seen["decide"] += 1
        return real_decide(*a, **k)

    def counting_sweep(*a, **k):
        seen["sweep"] += 1
        return real_sweep(*a, **k)

    monkeypatch.setattr(fused, "decide", counting_decide)
    monkeypatch.setattr(fused, "sweep_engine", counting_sweep)
    monkeypatch.setattr(fused, "_STATE", {})
    return seen


def test_decide_on_the_cpu_never_takes_the_fused_kernel(calls, monkeypatch):
    monkeypatch.delenv(fused.ENV_SWITCH, raising=False)
    x = _signals(64)
    for engine in ("jax", "auto"):
        decide(*x, engine=engine)
        sweep(*x, config_grid(MDLConfig(), sigma=[0.1, 0.2]), engine=engine)
    assert calls == {"decide": 0, "sweep": 0}
    assert fused.usable(MDLConfig()) is False and not fused.sweep_usable(MDLConfig())
    # by name, on a machine without a GPU: one line that says why
    for run in (lambda: decide(*x, engine="pallas"),
                lambda: sweep(*x, config_grid(MDLConfig(), sigma=[0.1, 0.2]), engine="pallas")):
        with pytest.raises(ValueError, match=r"^engine='pallas' cannot run here: it runs on a GPU, and JAX's "
                                             r"default backend here is cpu$"):
            run()
    # sweep's earlier name for the engine: the error names the engine as the caller wrote it
    with pytest.raises(ValueError, match=r"^engine='fused' cannot run here: it runs on a GPU"):
        sweep(*x, config_grid(MDLConfig(), sigma=[0.1, 0.2]), engine="fused")
    assert calls == {"decide": 0, "sweep": 0}


def test_a_config_swept_by_vmap_is_refused_by_the_pallas_engine_as_traced_not_as_a_wrong_d(interpret):
    # the reason read "D = 16 (this one has D = 16)": the config's leaves were traced, its D was fine
    x = _signals(8)
    with pytest.raises(ValueError, match=r"^engine='pallas' cannot run here: a config with traced leaves"):
        jax.vmap(lambda s: decide(*x, MDLConfig(sigma=s), engine="pallas").C_final)(jnp.array([0.15, 0.2]))


def test_the_pallas_engine_by_name_runs_the_kernel_for_concrete_input_only(calls, interpret, monkeypatch):
    monkeypatch.setattr(fused, "BLOCK", 128)
    x = _signals(256).reshape(3, 16, 16)  # whole blocks, and the caller's shape kept
    out = decide(*x, engine="pallas")
    assert calls["decide"] == 1
    assert out.v_meta.shape == (16, 16, 16) and out.energies.shape == (16, 16, 3)
    assert out.action.shape == (16, 16)
    ref = jax.tree.map(lambda t: t.reshape((16, 16) + t.shape[1:]), _plain(*x.reshape(3, -1), MDLConfig()))
    _assert_parity(out, ref, MDLConfig())
    # under a caller's jit the signals are traced: by name, a one-line error; under "auto", pure JAX
    with pytest.raises(ValueError, match=r"^engine='pallas' cannot run here: traced input"):
        jax.jit(lambda m, r, a: decide(m, r, a, engine="pallas"))(*x)
    jitted = jax.jit(lambda m, r, a: decide(m, r, a, engine="auto"))(*x)
    assert calls["decide"] == 1
    _assert_parity(jitted, out, MDLConfig())
    # a gradient through decide traces the signals: never the kernel (soft_decide and tune build on
    # the one-record functions and never reach an engine at all)
    g = jax.grad(lambda m: decide(m, x[1], x[2], engine="auto").C_final.sum())(x[0])
    assert calls["decide"] == 1 and np.all(np.isfinite(g))
    with pytest.raises(ValueError, match=r"^engine='pallas' cannot run here: .*D = 16 \(this one has D = 8\)$"):
        decide(*x, MDLConfig(D=8, dims=(3, 3, 2)), engine="pallas")
    # sweep by name and under "auto" take the fused engine in this mode (the grid and passes of
    # test_fused_sweep_engine_equals_the_jax_engine: one compiled program)
    M, R, A, y = _sweep_data()
    for engine in ("pallas", "auto"):
        sweep(M, R, A, config_grid(MDLConfig(), g_a=[0.1, 0.3, 0.5], g_b=[0.5, 0.9]), adopt=y,
              weights=bootstrap_weights(300, 3, 0), record_chunk=128, engine=engine)
    assert calls["sweep"] == 2
    monkeypatch.setenv(fused.ENV_SWITCH, "0")
    assert not fused.usable(MDLConfig()) and not fused.sweep_usable(MDLConfig())
    with pytest.raises(ValueError, match=r"^engine='pallas' cannot run here: MDL_JAX_FUSED=0"):
        decide(*x, engine="pallas")


def test_fused_kernel_is_chosen_on_a_gpu_backend_for_supported_configs_and_placement(calls, monkeypatch):
    monkeypatch.delenv(fused.ENV_SWITCH, raising=False)
    monkeypatch.setattr(fused, "on_gpu_backend", lambda: True)  # the backend query only
    assert fused.usable(MDLConfig(), (np.zeros(3, np.float32),)) is True
    assert fused.why_not(MDLConfig(), (np.zeros(3, np.float32),)) is None
    grid = config_grid(MDLConfig(), sigma=[0.1, 0.2])
    assert fused.sweep_usable(grid)
    # several devices: "auto" keeps the jax engine's mesh over all of them
    real_local_devices = jax.local_devices
    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: real_local_devices(*a, **k) * 2)
    assert not fused.sweep_usable(grid)
    monkeypatch.setattr(jax, "local_devices", real_local_devices)
    # a CPU-committed array stays off the kernel; so do D ≠ 16 and a traced config
    on_cpu = jax.device_put(np.zeros(3, np.float32), jax.devices("cpu")[0])
    assert fused.usable(MDLConfig(), (on_cpu,)) is False
    assert "committed to a device" in fused.why_not(MDLConfig(), (on_cpu,))
    assert fused.usable(MDLConfig(D=8, dims=(3, 3, 2))) is False
    seen = []
    jax.vmap(lambda s: seen.append(fused.usable(MDLConfig(sigma=s))) or s)(jnp.array([0.1, 0.2]))
    assert seen == [False]
    monkeypatch.setenv(fused.ENV_SWITCH, "0")
    assert fused.usable(MDLConfig()) is False


def test_a_kernel_that_fails_to_compile_is_an_error_by_name_and_a_warned_fallback_under_auto(calls, monkeypatch):
    # A fake failure (the kernel cannot fail here), with the backend faked as a GPU for "auto": by
    # name the error itself; under "auto" decide answers from the pure-JAX engine, warning once.
    monkeypatch.delenv(fused.ENV_SWITCH, raising=False)
    monkeypatch.setattr(fused, "on_gpu_backend", lambda: True)
    monkeypatch.setattr(api, "default_backend", lambda: "gpu")

    def broken(*a, **k):
        raise RuntimeError("Triton compilation failed (fake)")

    monkeypatch.setattr(fused, "decide", broken)
    x = _signals(50)
    with pytest.raises(RuntimeError, match="fake"):
        decide(*x, engine="pallas")
    assert fused.failed() is None   # a named call's failure is the caller's to see, not given up
    with pytest.warns(RuntimeWarning, match="fused GPU kernel unavailable"):
        out = decide(*x, engine="auto")
    assert "fake" in fused.failed()
    _assert_parity(out, _plain(*x, MDLConfig()), MDLConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only, and the kernel is not tried again
        decide(*x, engine="auto")
    assert fused.usable(MDLConfig()) is False
    with pytest.raises(ValueError, match=r"^engine='pallas' cannot run here: the kernel failed to lower"):
        decide(*x, engine="pallas")


def test_explicit_block_sizes_and_precisions_are_checked():
    with pytest.raises(ValueError, match="block"):
        fused.decide(*_signals(16), MDLConfig(), interpret=True, block=100)
    with pytest.raises(ValueError, match="precision"):
        fused.decide(*_signals(16), MDLConfig(), interpret=True, precision="tf32")
    with pytest.raises(ValueError, match="only on a GPU"):
        fused.decide(*_signals(16), MDLConfig(), interpret=True, precision="tf32x3")


def test_sweep_engine_names_include_pallas_and_its_earlier_name():
    assert {"pallas", "fused"} <= set(_sweep.ENGINES)
    with pytest.raises(ValueError, match="engine"):
        sweep(*_signals(16), MDLConfig(), engine="triton")
