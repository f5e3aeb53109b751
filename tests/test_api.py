"""The public edge: shapes, batching, bad input, checked mode, the soft decision and calibration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mdl_jax
from mdl_jax import Action, MDLConfig, calibrate, checked_decide, decide, soft_decide
from mdl_jax.controller.config import NUMERIC_FIELDS
from tests.reference import NumpyMDL

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
    out = decide(*x) if path == "decide" else mdl_jax.controller.api._decide_jit(*map(jnp.asarray, x), CFG)
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


# --- Calibration ---------------------------------------------------------------------------------

def test_calibration_norm_range_and_grid_search(rng):
    M, R, A = rng.uniform(size=(3, 80)).astype(np.float32)
    adopt = ((M > 0.5) & (A < 0.6)).astype(np.int32)
    cal = calibrate(M, R, A, adopt, grid_size=201, offset=0.15)
    raw = np.asarray(decide(M, R, A).norm)
    assert cal.config.n_min == pytest.approx(raw.min()) and cal.config.n_max == pytest.approx(raw.max())
    c = np.asarray(decide(M, R, A, cal.config).C_final)
    brute = [np.mean((c >= t) == adopt.astype(bool)) for t in np.linspace(0, 1, 201)]
    assert cal.best_agreement == pytest.approx(max(brute))
    # the chosen θ0 is one of the tied best values; the old rule ("lowest") takes the first of them
    tied = np.linspace(0, 1, 201)[np.flatnonzero(np.isclose(brute, max(brute)))]
    assert np.isclose(tied, cal.config.thresholds[0]).any()
    low = calibrate(M, R, A, adopt, grid_size=201, offset=0.15, tie_break="lowest")
    assert low.config.thresholds[0] == pytest.approx(np.linspace(0, 1, 201)[int(np.argmax(brute))])
    t0 = cal.config.thresholds[0]
    assert cal.config.thresholds[1] == pytest.approx(max(t0 - 0.15, 0))
    assert cal.config.thresholds[2] == pytest.approx(max(t0 - 0.30, 0))
    np.testing.assert_allclose(np.asarray(c).min(), 0.0, atol=1e-6)


def test_calibration_rejects_bad_labels(rng):
    M, R, A = rng.uniform(size=(3, 10))
    with pytest.raises(ValueError, match="adopt"):
        calibrate(M, R, A, np.full(10, 0.5))
    with pytest.raises(ValueError, match="adopt: expected shape"):
        calibrate(M, R, A, np.ones(9))


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
    from mdl_jax.controller import api

    x = rng.uniform(size=(3, 37)).astype(np.float32)
    cfgs = [MDLConfig(sigma=s, thresholds=(t, 0.4, 0.2), qr_seed=4321)
            for s, t in ((0.11, 0.6), (0.23, 0.7), (0.37, 0.5))]
    plans = {api._plan(c, False).structure for c in cfgs}
    assert len(plans) == 1
    prog = api._program(plans.pop(), "float32", False)
    assert prog._cache_size() == 0
    for c in cfgs:
        got = decide(*x, c)
        want = api._decide_jit(*map(jnp.asarray, x), c)
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
