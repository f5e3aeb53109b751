"""The public edge: shapes, batching, bad input, checked mode and the soft decision (calibration:
tests/test_calibration.py)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mdl_jax
from mdl_jax import Action, MDLConfig, calibrate, checked_decide, decide, decide_one, soft_decide, stack_configs, sweep
from mdl_jax.controller import api
from mdl_jax.controller.config import NUMERIC_FIELDS
from mdl_jax.engines import fused, native, toolchain
from tests.reference import NumpyMDL, decide_definition
from tests.ties import tie_records

CFG = MDLConfig()


def test_scalar_call_returns_scalar_fields():
    out = decide(0.8, 0.7, 0.2)
    assert out.C.shape == () and out.v_meta.shape == (16,) and out.energies.shape == (3,)
    assert Action(int(out.action)) in set(Action)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_any_leading_shape(shape, rng):
    M, R, A = rng.uniform(size=(3,) + shape)
    out = decide(M, R, A)
    assert out.C_final.shape == shape and out.v_meta.shape == shape + (16,)
    assert out.energies.shape == shape + (3,)
    flat = decide(M.ravel(), R.ravel(), A.ravel())
    # different N compile to differently vectorised loops: equal up to float32 rounding
    np.testing.assert_allclose(np.asarray(out.C_final).ravel(), np.asarray(flat.C_final), atol=1e-6)


def test_scalar_broadcasts_against_array(rng):
    M = rng.uniform(size=10)
    out = decide(M, 0.5, 0.85)
    ref = decide(M, np.full(10, 0.5), np.full(10, 0.85))
    np.testing.assert_allclose(np.asarray(out.C_final), np.asarray(ref.C_final), atol=1e-6)


def test_vmap_equals_python_loop(maybe_jit, rng):
    x = rng.uniform(size=(3, 50)).astype(np.float32)
    batch = maybe_jit(lambda m, r, a: decide(m, r, a))(*x)
    for i in range(50):
        one = decide(*(float(v) for v in x[:, i]))
        for f in ("C", "alpha", "C_final", "norm"):
            assert abs(float(getattr(batch, f)[i]) - float(getattr(one, f))) < 1e-6
        assert int(batch.action[i]) == int(one.action)


@pytest.mark.parametrize("path", ["decide", "pure_jax"])
def test_chunked_batch_path_matches_reference(path):
    # Large enough to go through the chunked loop (pure JAX) / the thread pool (native kernel, what
    # decide runs on the CPU), with a ragged last chunk.
    n = mdl_jax.controller.api.CHUNK * 2 + 123
    x = np.random.default_rng(3).uniform(size=(3, n)).astype(np.float32)
    out = decide(*x) if path == "decide" else decide_definition(*map(jnp.asarray, x), CFG)
    ref = NumpyMDL()
    for i in [0, 1, mdl_jax.controller.api.CHUNK - 1, mdl_jax.controller.api.CHUNK, n - 124, n - 1]:
        r = ref.decide(*(float(v) for v in x[:, i]))
        assert abs(float(out.C_final[i]) - r["C_final"]) < 1e-5


def test_decide_under_user_jit_vmap_and_grad():
    f = jax.jit(jax.vmap(lambda m: decide(m, 0.5, 0.5).C_final))
    assert f(jnp.linspace(0, 1, 5)).shape == (5,)
    g = jax.grad(lambda m: decide(m, jnp.float32(0.5), jnp.float32(0.5)).C_final)(jnp.float32(0.7))
    assert np.isfinite(float(g))


def test_vmap_over_config_fields_is_a_sweep():
    sigmas = jnp.linspace(0.1, 0.4, 4)
    sweep = jax.vmap(lambda s: decide(0.8, 0.3, 0.5, CFG.replace(sigma=s), validate=False).C_final)
    out = sweep(sigmas)
    for s, c in zip(sigmas, out):
        assert abs(float(decide(0.8, 0.3, 0.5, CFG.replace(sigma=float(s))).C_final) - float(c)) < 1e-6


# --- Bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("arg", ["M", "R", "A"])
@pytest.mark.parametrize("bad, what", [(np.nan, "finite"), (np.inf, "finite"), (-0.1, r"\[0, 1\]"),
                                       (1.5, r"\[0, 1\]")])
def test_bad_values_name_argument_and_index(arg, bad, what):
    vals = {"M": np.full((2, 3), 0.5), "R": np.full((2, 3), 0.5), "A": np.full((2, 3), 0.5)}
    vals[arg][1, 2] = bad
    with pytest.raises(ValueError, match=rf"^{arg}: expected .*{what}.*{arg}\[1, 2\]"):
        decide(**vals)
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        decide(**{**{"M": 0.5, "R": 0.5, "A": 0.5}, arg: float(bad)})


def test_mismatched_shapes_raise():
    with pytest.raises(ValueError, match=r"^R: expected shape \(3,\)"):
        decide(np.zeros(3), np.zeros(4), np.zeros(3))


@pytest.mark.parametrize("bad", [True, "0.5", np.array(["a"])])
def test_non_numeric_input_raises(bad):
    with pytest.raises(ValueError, match="^A:"):
        decide(0.5, 0.5, bad)


def test_bad_config_raises():
    with pytest.raises(TypeError, match="config"):
        decide(0.5, 0.5, 0.5, {"sigma": 0.2})
    with pytest.raises(ValueError, match="thresholds"):
        MDLConfig(thresholds=(0.2, 0.4, 0.6))
    with pytest.raises(ValueError, match="dims"):
        MDLConfig(dims=(5, 5, 5))
    with pytest.raises(ValueError, match="n_max"):
        MDLConfig(n_min=2.0, n_max=1.0)
    with pytest.raises(ValueError, match="sigma"):
        MDLConfig(sigma=0.0)


def test_checked_mode_reports_inside_compiled_code():
    err, out = checked_decide(np.array([0.1, 0.2, np.nan]), 0.5, 0.5)
    assert "M" in err.get() and "flat index 2" in err.get()
    err, out = checked_decide(0.5, np.array([0.5, 1.2]), 0.5)
    assert "R" in err.get() and "flat index 1" in err.get()
    err, out = checked_decide(np.array([0.1, 0.9]), 0.5, 0.5)
    assert err.get() is None and np.all(np.isfinite(np.asarray(out.C_final)))
    with pytest.raises(Exception, match="A"):
        checked_decide(0.5, 0.5, -1.0)[0].throw()


def test_no_nan_for_valid_input_on_edges():
    g = np.array([0.0, 1e-7, 0.5, 1 - 1e-7, 1.0], np.float32)
    M, R, A = (x.ravel() for x in np.meshgrid(g, g, g, indexing="ij"))
    out = decide(M, R, A)
    for f in out:
        assert np.all(np.isfinite(np.asarray(f)))


# --- Soft decision and gradients -----------------------------------------------------------------

def test_soft_decision_is_a_distribution_and_tends_to_hard(rng):
    x = rng.uniform(size=(3, 200)).astype(np.float32)
    p = soft_decide(*x, temperature=1e-4)
    np.testing.assert_allclose(np.asarray(p).sum(-1), 1.0, atol=1e-5)
    assert np.all(np.asarray(p) >= -1e-6)
    hard = np.asarray(decide(*x).action)
    c = np.asarray(decide(*x).C_final)
    far = np.abs(c[:, None] - np.array(CFG.thresholds)[None]).min(1) > 1e-2
    np.testing.assert_array_equal(np.asarray(p).argmax(-1)[far], hard[far])


@pytest.mark.slow
def test_finite_gradients_for_every_numeric_config_field(maybe_jit, rng):
    x = jnp.asarray(rng.uniform(size=(3, 64)).astype(np.float32))
    target = jnp.asarray(rng.integers(0, 4, 64))

    def loss(cfg):
        p = soft_decide(*x, cfg, temperature=0.1)
        return -jnp.mean(jnp.log(p[jnp.arange(64), target] + 1e-6))

    g = maybe_jit(jax.grad(loss))(CFG)
    for f in NUMERIC_FIELDS:
        leaves = jax.tree_util.tree_leaves(getattr(g, f))
        assert leaves and all(np.all(np.isfinite(np.asarray(v))) for v in leaves), f
    assert any(float(jnp.abs(v)) > 0 for v in jax.tree_util.tree_leaves(g))


def test_import_is_light():
    import subprocess
    import sys
    code = "import sys, mdl_jax; print('torch' in sys.modules, 'sentence_transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_controller_never_imports_the_pipeline_or_the_analyses():
    """The layering the folders show: controller ← pipeline ← analysis, never the other way round."""
    import ast
    from pathlib import Path

    import mdl_jax.controller

    for path in Path(mdl_jax.controller.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert not n.startswith(("mdl_repro.pipeline", "mdl_repro.analysis", "torch")), (path, n)


def test_demo_cli_prints_the_table():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mdl_jax", "demo"], capture_output=True, text=True,
                         check=True).stdout
    assert "C_final" in out and "E_wm" in out and len(out.splitlines()) == 12
    assert all(a in out for a in ("Active", "Supp", "Silent", "Opt-Out"))  # the deployed defaults act


# ------------------------------------------------------------------------------------ the default engine

def test_the_default_never_loads_an_engine():
    # Every kind of input through the default: the engines' modules stay unimported (a fresh process).
    import subprocess
    import sys
    code = ("import sys, numpy as np, jax, jax.numpy as jnp, mdl_jax\n"
            "from mdl_jax import MDLConfig, decide, sweep, calibrate, config_grid\n"
            "x = np.random.default_rng(0).uniform(size=(3, 40)).astype(np.float32)\n"
            "decide(0.5, 0.5, 0.5); decide(*x); decide(*map(jnp.asarray, x), MDLConfig(sigma=0.3))\n"
            "decide(1, 0.5, [0.2] * 40); jax.jit(lambda m: decide(m, 0.5, 0.5).C)(x[0])\n"
            "sweep(*x, config_grid(MDLConfig(), sigma=[0.1, 0.2]))\n"
            "calibrate(*x, x[0] > 0.5)\n"
            "print(sorted(m for m in sys.modules if m.startswith('mdl_jax.engines')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_an_unknown_engine_is_a_value_error_naming_the_choices():
    x = np.full(4, 0.5, np.float32)
    for call in (lambda e: decide(x, x, x, engine=e), lambda e: calibrate(x, x, x, [0, 1, 0, 1], engine=e),
                 lambda e: mdl_jax.sweep(x, x, x, MDLConfig(), engine=e)):
        for bad in ("numpy", "JAX", None, 3):
            with pytest.raises(ValueError, match=r"^engine: expected one of \("):
                call(bad)


def test_configs_of_one_structure_share_one_compiled_program(rng):

    x = rng.uniform(size=(3, 37)).astype(np.float32)
    cfgs = [MDLConfig(sigma=s, thresholds=(t, 0.4, 0.2), qr_seed=4321)
            for s, t in ((0.11, 0.6), (0.23, 0.7), (0.37, 0.5))]
    plans = {api._plan(c, False).structure for c in cfgs}
    assert len(plans) == 1
    prog = api._program(plans.pop(), "float32", False)
    assert prog._cache_size() == 0
    for c in cfgs:
        got = decide(*x, c)
        want = decide_definition(*map(jnp.asarray, x), c)
        for f in got._fields:
            np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)), err_msg=f)
    assert prog._cache_size() == 1   # three configs, one executable (their numbers are an argument)
    one = [decide(*(float(v) for v in x[:, 0]), c) for c in cfgs]
    assert api._program(api._plan(cfgs[0], False).structure, "float32", True)._cache_size() == 1
    assert len({float(d.C_final) for d in one}) == 3
    # a different ablation is a different structure
    assert api._plan(MDLConfig(alpha_gating=False), False).structure != api._plan(cfgs[0], False).structure


def test_a_config_first_seen_inside_a_callers_jit_is_cached_as_a_concrete_buffer():
    # The packed config is cached on first use; a first use inside jit must not cache a tracer.
    cfg = MDLConfig(sigma=0.2718)
    inside = jax.jit(lambda m: decide(m, 0.5, 0.5, cfg).C_final)(jnp.array([0.2, 0.9], jnp.float32))
    outside = decide(np.array([0.2, 0.9], np.float32), 0.5, 0.5, cfg).C_final
    np.testing.assert_allclose(np.asarray(inside), np.asarray(outside), atol=1e-6)
    assert isinstance(decide(0.2, 0.5, 0.5, cfg).C_final, jax.Array)


def test_one_python_record_takes_the_signals_dtype_rules(rng):
    # Three Python floats are one buffer: float32, or float64 under x64, as three scalars would be.
    d = decide(0.3, 0.6, 0.2)
    assert d.C_final.dtype == jnp.float32 and d.action.dtype == jnp.int32
    want = decide(np.float32(0.3), np.float32(0.6), np.float32(0.2))
    np.testing.assert_allclose(float(d.C_final), float(want.C_final), atol=1e-6)
    with jax.enable_x64(True):
        d64 = decide(0.3, 0.6, 0.2, MDLConfig(sigma=0.25))
        assert d64.C_final.dtype == jnp.float64
        ref = decide(np.float64(0.3), np.float64(0.6), np.float64(0.2), MDLConfig(sigma=0.25))
        np.testing.assert_allclose(float(d64.C_final), float(ref.C_final), rtol=1e-12)
    assert int(decide(float("nan"), 0.5, 0.5, validate=False).action) == Action.OPT_OUT


def test_the_kernels_old_module_names_are_deprecated_aliases_of_the_engines():
    import importlib

    import mdl_jax.controller

    for old, new in (("native", "mdl_jax.engines.native"), ("fused", "mdl_jax.engines.fused")):
        with pytest.warns(DeprecationWarning, match=f"mdl_jax.controller.{old} moved to {new}"):
            mod = getattr(mdl_jax.controller, old)
        assert mod is importlib.import_module(new)
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        mdl_jax.controller.nonesuch  # noqa: B018


# --- bad input: labels, shapes, dtypes, temperatures, NaN unvalidated ---------------------------------------


def test_first_offending_index_is_named_whatever_is_wrong_with_it():
    M = np.full(10_000_000, 0.5, np.float32)
    M[5] = 1.5
    M[9_000_000] = np.nan
    with pytest.raises(ValueError, match=r"^M: expected values in \[0, 1\]; M\[5\] = "):
        decide(M, 0.5, 0.5)
    small = np.array([0.5, np.inf, -1.0])
    with pytest.raises(ValueError, match=r"^R: expected finite values in \[0, 1\]; R\[1\] = "):
        decide(0.5, small, 0.5)
    err, _ = checked_decide(0.5, 0.5, np.array([0.5, -1.0, np.nan]))
    assert err.get().startswith("A: expected") and "flat index 1" in err.get()
    # a 0-d value has no index to name: the argument itself
    for zero_d in (np.float32(1.5), np.array(1.5, np.float32)):
        with pytest.raises(ValueError, match=r"^M: expected values in \[0, 1\]; M = 1\.5$"):
            decide(zero_d, 0.5, 0.5)


@pytest.mark.parametrize("where", ["eager", "jit"])
@pytest.mark.parametrize("fn", [decide, checked_decide, soft_decide], ids=lambda f: f.__name__)
def test_shape_mismatch_raises_everywhere_naming_the_argument(fn, where):
    col, row = np.full((4, 1), 0.5, np.float32), np.full(4, 0.5, np.float32)
    call = (lambda m, r: fn(m, r, 0.5)) if where == "eager" else jax.jit(lambda m, r: fn(m, r, 0.5))
    with pytest.raises(ValueError, match=r"^R: expected shape \(4, 1\)"):
        call(col, row)
    # 0-d values broadcast on every path
    out = call(col, np.float32(0.5))
    leaf = out[1].C_final if fn is checked_decide else (out if fn is soft_decide else out.C_final)
    assert leaf.shape[:2] == (4, 1)


def test_checked_decide_on_empty_arrays_gives_an_empty_decision():
    e = np.zeros(0, np.float32)
    err, out = checked_decide(e, e, e)
    assert err.get() is None
    assert out.action.shape == (0,) and out.v_meta.shape == (0, 16) and out.energies.shape == (0, 3)
    err, out = checked_decide(np.zeros((2, 0)), 0.5, 0.5)
    assert err.get() is None and out.C_final.shape == (2, 0)


@pytest.mark.parametrize("fn", [decide, checked_decide, soft_decide], ids=lambda f: f.__name__)
@pytest.mark.parametrize("arg", ["M", "R", "A"])
def test_complex_signals_are_rejected_naming_the_argument(fn, arg):
    vals = {"M": 0.5, "R": 0.5, "A": 0.5, arg: np.array([0.5 + 0.5j, 0.2])}
    with pytest.raises((TypeError, ValueError), match=rf"^{arg}: .*complex"):
        fn(**vals)
    if fn is decide:
        with pytest.raises(ValueError, match=rf"^{arg}: .*complex"):
            decide(**vals, validate=False)  # never silently dropped, even unvalidated


@pytest.mark.parametrize("t", [0.0, -0.02, np.nan, np.inf, "0.02", [[1], [1, 2]], None])
def test_soft_decide_rejects_a_temperature_outside_its_domain(t):
    with pytest.raises(ValueError, match=r"^temperature:"):
        soft_decide(0.8, 0.7, 0.2, temperature=t)


@pytest.mark.parametrize("t", [[0.02, 0.03], np.full(5, 0.02), np.array([1e-3, 0.5, 5.0]), np.array([0.02])])
def test_soft_decide_takes_one_temperature_not_one_per_record_or_threshold(t):
    M = np.array([0.1, 0.5, 0.9, 0.3, 0.7], np.float32)
    with pytest.raises(ValueError, match=r"^temperature: expected one finite number > 0, got shape"):
        soft_decide(M, M, M, temperature=t)
    with pytest.raises(ValueError, match=r"^temperature: expected one finite number > 0"):  # at trace time too
        jax.jit(lambda tau: soft_decide(M, M, M, temperature=tau))(jnp.asarray(t))


def test_soft_decide_temperature_that_underflows_or_overflows_in_the_compute_dtype_is_rejected():
    h = np.float16(0.5)
    with pytest.raises(ValueError, match=r"^temperature: .*float32"):
        soft_decide(h, h, h, temperature=1e-46)  # 0 in float32: (C_final - θ) / 0 is NaN
    with pytest.raises(ValueError, match=r"^temperature: .*float32"):
        soft_decide(h, h, h, temperature=1e39)  # inf in float32: every sigmoid a flat 0.5
    for x in (h, np.float32(0.5)):  # float16 signals are computed in float32, where 1e-9 is > 0
        p = soft_decide(x, 0.5, 0.5, temperature=1e-9)
        assert p.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(p)))


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16])
def test_half_precision_signals_decide_exactly_as_float32_on_the_same_values(dtype, rng):
    # Computed in their own dtype, 0.14% (float16) / 2.31% (bfloat16) of decisions differed from
    # float32 on the same values. Widening is exact, so every field is now identical.
    x = np.asarray(rng.uniform(size=(3, 4000)), dtype)
    wide = [jnp.asarray(v.astype(np.float32)) for v in x]
    for path in ("native", "pure_jax"):
        half = decide(*x) if path == "native" else jax.jit(decide)(*x)
        ref = decide(*wide) if path == "native" else jax.jit(decide)(*wide)
        assert half.C_final.dtype == jnp.float32
        for f in half._fields:
            np.testing.assert_array_equal(np.asarray(getattr(half, f)), np.asarray(getattr(ref, f)), err_msg=f)
    checked = checked_decide(*x)[1]
    assert checked.C_final.dtype == jnp.float32


@pytest.mark.parametrize("kernel", ["native", "pure_jax"])
@pytest.mark.parametrize("theta2", [0.2, 0.0], ids=["default-thresholds", "theta2-zero"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_nan_or_infinite_signal_is_opt_out_on_every_path_when_unvalidated(kernel, theta2, bad, monkeypatch):
    # θ2 = 0: the pure-JAX path reads a NaN v_meta's norm as 0, so C_final = 0 ≥ θ2 said Silent before
    # the rule; an infinite signal reached the most trusting action on the native kernel.
    if kernel == "pure_jax":
        monkeypatch.setenv(native.ENV_SWITCH, "0")
    elif toolchain.compiler() is None or not native.load():
        pytest.skip("no native kernel on this machine")
    cfg = MDLConfig(thresholds=(0.6, 0.4, theta2))
    engine = "native" if kernel == "native" else "jax"
    x = np.array([bad, 0.5, 0.9, 0.1, 0.5] * 7, np.float32)  # 35: two full blocks and a tail
    M, R, A = x, np.roll(x, 1), np.roll(x, 2)
    out = decide(M, R, A, cfg, validate=False, engine=engine)
    bad_any = ~(np.isfinite(M) & np.isfinite(R) & np.isfinite(A))
    assert np.all(np.asarray(out.action)[bad_any] == Action.OPT_OUT)
    ref = decide(np.where(bad_any, 0.5, M), np.where(bad_any, 0.5, R), np.where(bad_any, 0.5, A), cfg)
    np.testing.assert_array_equal(np.asarray(out.action)[~bad_any], np.asarray(ref.action)[~bad_any])
    # the read-out of such a record is the pure-JAX path's on every engine: C = α = C_final = ‖v_meta‖ = 0
    for f in ("C", "alpha", "C_final", "norm"):
        assert np.all(np.asarray(getattr(out, f))[bad_any] == 0.0), f
    for i in range(3):
        one = [0.5, 0.5, 0.5]
        one[i] = float(bad)
        assert int(decide(*one, cfg, validate=False, engine=engine).action) == Action.OPT_OUT
        assert int(decide(*map(np.float32, one), cfg, validate=False, engine=engine).action) == Action.OPT_OUT
        assert int(decide_one(*map(jnp.float32, one), cfg).action) == Action.OPT_OUT


def test_64_bit_integer_signals_are_not_wrapped_to_int32():
    """Without x64 JAX wrapped int64 2^62 to int32 0, a valid signal: checked_decide passed it."""
    from mdl_jax import checked_decide

    half = np.full(2, 0.5, np.float32)
    for M in (np.array([2**62, 0], np.int64), np.array([2**63 + 1, 0], np.uint64)):
        err, _ = checked_decide(M, half, half)
        assert err.get() is not None and "M[flat index 0]" in err.get()
        with pytest.raises(ValueError, match=r"M\[0\]"):
            decide(M, half, half)


def test_decide_takes_big_endian_arrays_and_equals_native_byte_order():
    # A '>f4' array (a binary file, FITS, the network) was refused as "expected a number or an array
    # of real numbers" because JAX does not take a non-native byte order.
    r = np.random.default_rng(0)
    M, R, A = (r.random(37).astype(np.float32) for _ in range(3))
    got = decide(M.astype(">f4"), R.astype(">f8"), A, MDLConfig())
    want = decide(M, R.astype(np.float64), A, MDLConfig())
    for f in got._fields:
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)), err_msg=f)


# --- ties at a threshold: the same action on every path -----------------------------------------------------

@pytest.mark.slow
def test_ties_on_a_threshold_take_the_same_action_on_every_path(monkeypatch):
    """C_final exactly on θ0 = θ1 = θ2 is Active on eager decide_one, jitted decide_one, decide (every
    engine: the pure-JAX default, native, pallas in interpret mode) and the three sweep engines."""
    monkeypatch.setenv(fused.ENV_SWITCH, "interpret")   # the pallas engine by name on this CPU
    x, cfgs = tie_records()
    n = len(cfgs)
    paths = {"eager decide_one": [], "jit decide_one": [], "decide (native)": [], "decide (pure JAX)": [],
             "decide (default)": [], "fused (interpret)": []}
    jit_one = jax.jit(decide_one)
    for i, cfg in enumerate(cfgs):
        m, r, a = (jnp.float32(v) for v in x[:, i])
        one = decide_one(m, r, a, cfg)
        assert float(one.C) == 1.0 and float(one.C_final) == cfg.thresholds[0]   # the construction holds
        paths["eager decide_one"].append(int(one.action))
        paths["jit decide_one"].append(int(jit_one(m, r, a, cfg).action))
        col = [x[k, i:i + 1] for k in range(3)]
        paths["decide (native)"].append(int(decide(*col, cfg, engine="native").action[0]))
        paths["decide (default)"].append(int(decide(*col, cfg).action[0]))
        paths["decide (pure JAX)"].append(int(decide_definition(*map(jnp.asarray, col), cfg).action[0]))
        paths["fused (interpret)"].append(int(decide(*col, cfg, engine="pallas").action[0]))
    # one sweep per engine: config k against record k alone (weight vector k selects record k)
    batch, eye = stack_configs(cfgs), np.eye(n, dtype=np.float32)
    for engine in ("jax", "native", "pallas"):
        res = sweep(*x, batch, weights=eye, engine=engine)
        paths[f"sweep {engine}"] = [int(np.argmax(res.counts[k, k])) for k in range(n)]
    wrong = {p: int(np.sum(np.asarray(acts) != 0)) for p, acts in paths.items()}
    assert all(v == 0 for v in wrong.values()), f"records off Active (of {n}) per path: {wrong}"


def test_a_float64_threshold_is_compared_in_float32_on_every_path():
    """θ0 = 0.7 (a float64 in the config) with C_final = float32(0.7) < 0.7: a tie in float32, the
    dtype every path computes in, so Active (a float64 comparison would say Supp)."""
    cfg = MDLConfig(alpha_gating=False, n_min=0.0, n_max=1e-3, thresholds=(0.7, 0.4, 0.2), gains=(1.0, 0.7, 0.5))
    cfg = cfg.replace(alpha_gating=True, gate_coeffs=(0.7, 0.0))
    x = np.full((3, 4), 0.5, np.float32)
    for out in (decide(*x, cfg), decide(*x, cfg, engine="native"), decide_definition(*map(jnp.asarray, x), cfg),
                fused.decide(*map(jnp.asarray, x), cfg, interpret=True)):
        assert np.all(np.asarray(out.C_final) == np.float32(0.7)) and np.all(np.asarray(out.action) == 0)


def test_a_traced_signal_given_to_sweep_calibrate_or_tune_is_refused_as_traced_in_one_line():
    # NumPy's conversion error was wrapped as "expected a number or an array of real numbers in [0, 1]"
    # over several lines, for a valid array that was only traced
    from mdl_jax import tune

    x = np.linspace(0.1, 0.9, 8, dtype=np.float32)
    y = np.arange(8) % 2 == 0
    for call in (lambda m: calibrate(m, x, x, y), lambda m: sweep(m, x, x, MDLConfig()),
                 lambda m: tune(m, x, x, y)):
        for transform in (jax.jit, jax.vmap, jax.grad):
            with pytest.raises(ValueError, match=r"^M: expected concrete values, got a traced array of shape "
                                                 r"\(8,\) \(a caller's jit, vmap or grad\)") as e:
                transform(call)(x if transform is not jax.vmap else x[None])
            assert "\n" not in str(e.value)
