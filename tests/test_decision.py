"""Properties of the controller that the paper states (Lemma 1, Corollary 1, Theorem 1, risk
inversion) and that Section 3 implies (thresholds, ablations). Each runs eagerly and jitted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mdl_jax import Action, MDLConfig, decide_one, signal_cube_norm_range
from mdl_jax.controller import api
from mdl_jax.controller import decision as d
from tests.reference import NumpyMDL
from tests.ties import tie_records

CFG = MDLConfig()
CUBE = MDLConfig(n_min=1.2522579431533813, n_max=3.2805850505828857)  # signal-cube range: C never clips
GRID = np.linspace(0.0, 1.0, 21, dtype=np.float32)
M3, R3, A3 = (x.ravel() for x in np.meshgrid(GRID, GRID, GRID, indexing="ij"))
batched = jax.vmap(decide_one, in_axes=(0, 0, 0, None))


def run(maybe_jit, M, R, A, cfg=CFG):
    return maybe_jit(batched)(jnp.asarray(M), jnp.asarray(R), jnp.asarray(A), cfg)


# --- Lemma 1 -------------------------------------------------------------------------------------

def test_lemma1_projectors_orthogonal_idempotent_complete():
    pi = CFG.projectors
    for i in range(3):
        np.testing.assert_allclose(pi[i] @ pi[i], pi[i], atol=1e-6)  # idempotent
        np.testing.assert_allclose(pi[i], pi[i].T, atol=1e-6)         # orthogonal projector
        for j in range(3):
            if i != j:
                np.testing.assert_allclose(pi[i] @ pi[j], 0.0, atol=1e-6)
    np.testing.assert_allclose(pi.sum(0), np.eye(CFG.D), atol=1e-6)   # complete
    assert [round(np.trace(p)) for p in pi] == list(CFG.dims)


def test_lemma1_energy_preservation(maybe_jit, rng):
    v = rng.standard_normal((100, CFG.D)).astype(np.float32)
    e = maybe_jit(jax.vmap(lambda x: d.energies(x, CFG)))(jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(e).sum(-1), (v * v).sum(-1), rtol=1e-6, atol=1e-6)
    out = run(maybe_jit, M3, R3, A3)
    np.testing.assert_allclose(np.asarray(out.energies).sum(-1), np.asarray(out.norm) ** 2, rtol=1e-5)


# --- Corollary 1 ---------------------------------------------------------------------------------

def test_corollary1_alpha_bounded(maybe_jit):
    out = run(maybe_jit, M3, R3, A3)
    a = np.asarray(out.alpha)
    assert np.all(np.isfinite(a)) and np.all(a >= -1.0) and np.all(a <= 1.0)
    # also for a config that drives v_meta far from v_wm (negative bias)
    out = run(maybe_jit, M3, R3, A3, CFG.replace(bias=-3.0))
    a = np.asarray(out.alpha)
    assert a.min() < 0 and np.all(a >= -1.0) and np.all(a <= 1.0)


def test_corollary1_alpha_is_at_most_one_where_v_meta_is_parallel_to_v_wm(maybe_jit):
    # Without value encoding and with identity subspaces every vector is a multiple of 1_D, so v_meta
    # is parallel to v_wm and α = 1 exactly; the float32 cosine rounds above 1 for many records, and
    # Corollary 1 (|α| ≤ 1) must still hold there.
    cfg = CFG.replace(value_encoding=False, subspaces="identity")
    g = np.linspace(0.01, 1.0, 21, dtype=np.float32)
    M, R, A = (x.ravel() for x in np.meshgrid(g, g, g, indexing="ij"))
    a = np.asarray(run(maybe_jit, M, R, A, cfg).alpha)
    assert np.all(a <= 1.0) and np.all(a >= -1.0)
    np.testing.assert_allclose(a, 1.0, atol=1e-6)


# --- Theorem 1 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("scale", [1.0, 0.1])  # paper gains, and deep inside tanh's linear band
def test_theorem1_norm_increases_with_each_principal_gain(maybe_jit, k, scale):
    # ε_c < min_k s_k holds throughout the sweep (Theorem 1's condition).
    base = np.array(CFG.gains) * scale
    norms = []
    for t in np.linspace(0.5, 1.5, 6):
        gains = base.copy()
        gains[k] *= t
        cfg = CFG.replace(gains=tuple(gains), eps_c=0.1 * scale)
        norms.append(np.asarray(run(maybe_jit, M3, R3, A3, cfg).norm))
    assert np.all(np.diff(np.array(norms), axis=0) > 0)


def test_assumption1_encoding_norm_monotone_below_096(maybe_jit):
    # Assumption 1 (‖Enc(s)‖ increasing) holds for s ≤ 0.96 with our evenly spaced centres; above
    # that the peaks behind s fade faster than s·1 grows (documented deviation, tiny: a 0.15% dip).
    s = jnp.linspace(0.0, 0.96, 193)
    n = maybe_jit(jax.vmap(lambda x: jnp.linalg.norm(d.encode(x, CFG))))(s)
    assert np.all(np.diff(np.asarray(n)) > 0)
    s = jnp.linspace(0.96, 1.0, 9)
    n = np.asarray(jax.vmap(lambda x: jnp.linalg.norm(d.encode(x, CFG)))(s))
    assert (n.max() - n.min()) / n.max() < 2e-3


# --- Risk inversion ------------------------------------------------------------------------------

def test_risk_inversion_c_final_falls_as_A_rises(maybe_jit):
    """At fixed M, R the gated confidence does not rise with A, except in a documented corner of
    near-zero reliability (R ≤ 0.05): there C_final can rise by < 1e-3 per 0.025 step of A (at
    M = R = 0 for A ≈ 0.5, and for the first step above A = 0 when M ≥ 0.6), because α (the direction
    of v_meta towards v_wm) improves faster than the norm falls. 37 of 67,240 grid steps."""
    g = np.linspace(0.0, 1.0, 41, dtype=np.float32)
    M, R, A = np.meshgrid(g, g, g, indexing="ij")
    # The signal-cube normalisation, so C is never clipped: with the deployed n_min/n_max (real
    # signals' range) C saturates at 1 for strong signals, and there C_final = g_a + g_b·α only
    # follows α. The property is about the geometry, so it is checked where C carries the norm.
    out = run(maybe_jit, M.ravel(), R.ravel(), A.ravel(), cfg=CUBE)
    cf = np.asarray(out.C_final).reshape(M.shape)
    rise = np.diff(cf, axis=2)
    bad = np.argwhere(rise > 1e-6)
    assert len(bad) / rise.size < 1e-3
    assert rise.max() < 1e-3
    assert all(R[i, j, 0] <= 0.05 for i, j, _ in bad)
    # and the raw norm (what C measures) falls with A nearly everywhere
    nrise = np.diff(np.asarray(out.norm).reshape(M.shape), axis=2)
    assert (nrise > 1e-6).mean() < 1e-3


# --- Threshold boundaries ------------------------------------------------------------------------

def test_exact_threshold_boundaries_take_higher_action(maybe_jit):
    f = maybe_jit(lambda c, cfg: d.act(c, cfg))
    cfg = CFG
    th = cfg.thresholds
    cases = [(th[0], Action.ACTIVE), (np.nextafter(np.float32(th[0]), 0), Action.SUPP),
             (th[1], Action.SUPP), (np.nextafter(np.float32(th[1]), 0), Action.SILENT),
             (th[2], Action.SILENT), (np.nextafter(np.float32(th[2]), 0), Action.OPT_OUT),
             (1.0, Action.ACTIVE), (0.0, Action.OPT_OUT)]
    for c, want in cases:
        assert int(f(jnp.float32(c), cfg)) == want, (c, want)
    # a record whose C_final sits exactly on θ0
    one = jax.jit(decide_one)(jnp.float32(0.8), jnp.float32(0.7), jnp.float32(0.2), cfg)
    cfg2 = cfg.replace(thresholds=(float(one.C_final), 0.4, 0.2))
    assert int(maybe_jit(decide_one)(jnp.float32(0.8), jnp.float32(0.7), jnp.float32(0.2),
                                      cfg2).action) == Action.ACTIVE


def test_a_c_final_exactly_on_theta0_is_active_eagerly_and_jitted(maybe_jit):
    # Records whose C_final = g_a + g_b·α lies exactly on θ0 = θ1 = θ2 when the product and the sum
    # round apart; a compiled path that fused them into one FMA would land an ulp below θ0 (Supp).
    x, cfgs = tie_records()
    f = maybe_jit(decide_one)
    got = [int(f(*(jnp.float32(v) for v in x[:, i]), cfg).action) for i, cfg in enumerate(cfgs)]
    assert got == [Action.ACTIVE] * len(cfgs)


# --- Parity with the paper-style NumPy reference -------------------------------------------------

ABLATIONS = {
    "full": {},
    "no_alpha_gating": {"alpha_gating": False},
    "no_risk_modulation": {"risk_modulation": False},
    "identity_subspaces": {"subspaces": "identity"},
    "no_risk_inversion": {"risk_inversion": False},
    "no_value_encoding": {"value_encoding": False},
}


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_matches_numpy_reference(maybe_jit, rng, name):
    cfg = CFG.replace(**ABLATIONS[name])
    ref = NumpyMDL(cfg)
    x = rng.uniform(size=(3, 200)).astype(np.float32)
    out = run(maybe_jit, *x, cfg)
    for i in range(x.shape[1]):
        r = ref.decide(*(float(v) for v in x[:, i]))
        for f in ("C", "alpha", "C_final", "norm", "g_A"):
            assert abs(float(getattr(out, f)[i]) - r[f]) < 1e-5, (f, i)
        np.testing.assert_allclose(np.asarray(out.v_meta[i]), r["v_meta"], atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.energies[i]), r["energies"], atol=2e-5)
        if abs(r["C_final"] - np.array(cfg.thresholds)).min() > 1e-5:
            assert int(out.action[i]) == r["action"]


# --- Ablations change the output as described ----------------------------------------------------

def test_ablation_no_alpha_gating_gives_c_final_equal_c(maybe_jit):
    out = run(maybe_jit, M3, R3, A3, CFG.replace(alpha_gating=False))
    np.testing.assert_array_equal(np.asarray(out.C_final), np.asarray(out.C))
    full = run(maybe_jit, M3, R3, A3)
    assert not np.allclose(np.asarray(full.C_final), np.asarray(full.C))


def test_ablation_no_risk_modulation_gives_unit_gain(maybe_jit):
    out = run(maybe_jit, M3, R3, A3, CFG.replace(risk_modulation=False))
    np.testing.assert_array_equal(np.asarray(out.g_A), 1.0)
    assert np.ptp(np.asarray(run(maybe_jit, M3, R3, A3).g_A)) > 0.1


def test_ablation_identity_subspaces_loses_lemma1(maybe_jit):
    out = run(maybe_jit, M3, R3, A3, CFG.replace(subspaces="identity"))
    e = np.asarray(out.energies)
    np.testing.assert_allclose(e, np.repeat(np.asarray(out.norm)[:, None] ** 2, 3, 1), rtol=1e-5)


def test_ablation_no_risk_inversion_encodes_A_itself(maybe_jit):
    plain = run(maybe_jit, M3, R3, A3, CFG.replace(risk_inversion=False))
    flipped = run(maybe_jit, M3, R3, (1.0 - A3).astype(np.float32))
    np.testing.assert_allclose(np.asarray(plain.C_final), np.asarray(flipped.C_final), atol=1e-6)
    full = run(maybe_jit, M3, R3, A3)
    assert not np.allclose(np.asarray(plain.C_final), np.asarray(full.C_final))


def test_ablation_no_value_encoding_is_constant_vector(maybe_jit):
    cfg = CFG.replace(value_encoding=False)
    v = maybe_jit(lambda s: d.encode(s, cfg))(jnp.float32(0.3))
    np.testing.assert_allclose(np.asarray(v), 0.3, rtol=1e-7)
    assert np.ptp(np.asarray(d.encode(jnp.float32(0.3), CFG))) > 0.5


# --- Precision, gradients, NaN safety ------------------------------------------------------------

@pytest.mark.slow
def test_float64_agrees_with_float32(maybe_jit):
    x32 = np.random.default_rng(1).uniform(size=(3, 500)).astype(np.float32)
    out32 = run(maybe_jit, *x32)
    with jax.enable_x64(True):
        x64 = x32.astype(np.float64)
        out64 = maybe_jit(batched)(*(jnp.asarray(v) for v in x64), CFG)
        assert out64.C_final.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out32.C_final), np.asarray(out64.C_final), atol=1e-5)
        np.testing.assert_allclose(np.asarray(out32.v_meta), np.asarray(out64.v_meta), atol=1e-5)


def test_zero_norm_v_meta_gives_no_nan(maybe_jit):
    cfg = CFG.replace(gains=(0.0, 0.0, 0.0), eps_c=0.0, bias=0.0)
    out = maybe_jit(decide_one)(jnp.float32(0.5), jnp.float32(0.5), jnp.float32(0.5), cfg)
    assert float(out.norm) == 0.0 and float(out.alpha) == 0.0
    assert all(np.all(np.isfinite(np.asarray(x))) for x in out)
    g = jax.grad(lambda m: decide_one(m, jnp.float32(0.5), jnp.float32(0.5), cfg).C_final)(
        jnp.float32(0.5))
    assert np.isfinite(float(g))


def test_deployed_norm_range_lies_inside_the_signal_cube_range():
    # The defaults come from real calibration signals (tests/test_stores.py recomputes them); every
    # possible input's raw norm still lies in the cube range, which contains the deployed one.
    lo, hi = signal_cube_norm_range(CFG)
    assert abs(lo - 1.2522579) < 1e-5 and abs(hi - 3.2805850) < 1e-5
    assert lo < CFG.n_min < CFG.n_max < hi


def test_every_product_requests_highest_precision():
    # What keeps CPU and GPU within 1e-5: no dot in the pure-JAX program may fall to TF32 on a GPU.
    x = jnp.zeros(20_000, jnp.float32)  # above CHUNK: both the chunked and the plain branch are lowered
    text = jax.jit(api._decide_shaped).lower(x, x, x, CFG).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert dots, "no products found in the lowered program"
    assert all("HIGHEST" in line for line in dots), [line for line in dots if "HIGHEST" not in line]


def test_the_controller_tests_run_with_strict_dtype_promotion():
    # conftest.STRICT_DTYPE_MODULES: here an implicit promotion is an error, not a silent widening
    assert jax.config.jax_numpy_dtype_promotion == "strict"
    with pytest.raises(jax.dtypes.TypePromotionError):
        jnp.ones(2, jnp.int32) + jnp.ones(2, jnp.float32)


@pytest.mark.parametrize("kwargs, err, match", [
    ({"points": 0}, ValueError, r"^points: expected an int ≥ 2"),   # was: NumPy's "zero-size array"
    ({"points": 1}, ValueError, r"^points: "),                        # was: one corner read as the range
    ({"points": 1.5}, ValueError, r"^points: "), ({"points": True}, ValueError, r"^points: "),
    ({"cfg": {"sigma": 0.2}}, TypeError, r"^cfg: expected an MDLConfig or None, got dict"),
])
def test_signal_cube_norm_range_refuses_arguments_outside_their_domain_naming_them(kwargs, err, match):
    with pytest.raises(err, match=match):
        signal_cube_norm_range(**kwargs)
    lo, hi = signal_cube_norm_range(points=2)
    assert 0 < lo < hi
