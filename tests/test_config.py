"""MDLConfig's field declarations: each fact about a field is written once, beside the field, and every
consumer (validation, the config file, the sweep's batches, the native kernel's shape checks, tuning's
static set) reads it from there; and a value outside a field's domain is a ValueError naming the field."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mdl_jax import config_grid, decide
from mdl_jax.controller import api, config_file, sweep, tuning
from mdl_jax.controller import config as config_mod
from mdl_jax.controller.config import NUMERIC_FIELDS, MDLConfig, field_specs, per_config_cache
from mdl_jax.engines import native

REPO = Path(__file__).resolve().parents[1]


def test_every_consumer_view_equals_the_declarations():
    specs = field_specs()
    leaves = tuple(f for f, s in specs.items() if s.leaf)
    statics = tuple(f for f, s in specs.items() if not s.leaf)
    assert config_mod.NUMERIC_FIELDS == leaves and config_mod.STATIC_FIELDS == statics
    # the pytree: leaves in declaration order, the static fields as aux data
    cfg = MDLConfig()
    children = jax.tree.leaves(cfg, is_leaf=lambda x: isinstance(x, tuple))  # a tuple field is one child
    assert [np.shape(x) for x in children] == [np.shape(getattr(cfg, f)) for f in leaves]
    assert config_mod.flatten(cfg)[1] == tuple(getattr(cfg, f) for f in statics)
    # the config file: one key per field, in its part
    d = config_file.config_to_dict(cfg)
    assert tuple(d["numeric"]) == leaves and tuple(d["static"]) == statics
    assert config_file.config_from_dict(d) == cfg
    # the sweep: a batch of K holds (K,) + each declared shape; its component names are the declared ones
    batch = sweep.stack_configs([cfg] * 3)
    for f in leaves:
        assert np.shape(getattr(batch, f)) == (3,) + specs[f].shape, f
    assert sweep.COMPONENTS == {c: (f, i) for f, s in specs.items() for i, c in enumerate(s.components)}
    # validation and the kernels' shape checks: one config's allowed shapes, per field
    for f in leaves:
        good = config_mod.config_shapes(f, cfg.D)
        assert good[0] == specs[f].shape and (len(good) == 2) == specs[f].or_d_vector
        wrong = np.zeros((2,) + specs[f].shape)  # a batch of two where one config belongs
        bad = cfg.replace(**{f: wrong + np.asarray(getattr(cfg, f))})
        with pytest.raises(ValueError, match=rf"^config\.{f}: expected one config's value"):
            api._check_single(bad)
        assert not native.supports(bad), f
    assert native.supports(cfg) and native.sweep_supports(batch, 3) and not native.sweep_supports(batch, 2)
    # tuning: every static field of the start survives, and every leaf is a parameter
    start = MDLConfig(alpha_gating=False, subspaces="identity", qr_seed=7)
    kept = tuning._concrete_from(start, {f: np.asarray(getattr(start, f)) for f in leaves}, ("thresholds",))
    assert kept == start
    assert set(tuning.to_unconstrained(cfg)) == set(leaves) == set(tuning.FIELD_SETS["all"])


@pytest.mark.parametrize("field, value", [
    ("sigma", 0.0), ("eps_c", -0.1), ("eps_c", 0.9), ("gains", (1.0, -0.1, 0.5)), ("thresholds", (0.2, 0.4, 0.1)),
    ("thresholds", (1.2, 0.4, 0.1)), ("bias", float("nan")), ("n_min", float("inf")), ("n_max", 1.0),
    ("g_A_coeffs", (0.5, float("nan"))),
])
def test_a_value_outside_its_declared_range_fails_alike_alone_and_in_a_sweep_batch(field, value):
    """One reading of the declared ranges: MDLConfig and the sweep's batch check name the same field,
    with the same rule (the batch check names the config's index too)."""
    with pytest.raises(ValueError, match=rf"^{field}: expected ") as alone:
        MDLConfig(**{field: value})
    batch = sweep.with_leaves(MDLConfig(), {
        f: np.stack([np.asarray(getattr(MDLConfig(), f), np.float32), np.asarray(
            value if f == field else getattr(MDLConfig(), f), np.float32)]) for f in config_mod.NUMERIC_FIELDS})
    with pytest.raises(ValueError, match=rf"^{field}: expected ") as batched:
        sweep.check_batch(batch, 2)
    rule = str(alone.value).split(": expected ")[1].split(", got")[0].split(" (")[0]
    assert rule in str(batched.value) and "config 1 of the batch" in str(batched.value)


@pytest.mark.parametrize("field, value", [
    ("n_min", -1e300), ("gains", (1e39, 1.0, 1.0)), ("gate_coeffs", (0.3, -1e39)), ("sigma", 1e39), ("bias", 4e38),
])
def test_a_value_past_float32s_range_is_refused_naming_the_field_not_decided_as_inf(field, value, tmp_path):
    """Finite in float64 but ±inf in float32, where the engines and the sweep compute: it would have
    given NaN or Opt-Out decisions without a word."""
    kw = {field: value, **({"n_max": 1e300} if field == "n_min" else {})}
    with pytest.raises(ValueError, match=rf"^{field}: expected values a float32 holds \(\|v\| ≤ 3\.4e38"):
        MDLConfig(**kw)
    d = config_file.config_to_dict(MDLConfig())
    d["numeric"][field] = list(value) if isinstance(value, tuple) else value
    path = tmp_path / "big.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=rf"{field}.*a float32 holds"):
        config_file.load_config(path)
    assert MDLConfig(bias=float(np.finfo(np.float32).max)).bias == float(np.finfo(np.float32).max)  # its edge holds


def test_the_first_bad_config_of_a_batch_is_named_whether_its_value_is_out_of_range_or_past_float32():
    """Past float32's range is one more way a field is bad, not a rule read before the others: the
    first bad config is named, with the rule it breaks."""
    with pytest.raises(ValueError, match=r"^sigma: expected a finite width > 0.*first at index \(0,\)"):
        MDLConfig(sigma=np.array([-1.0, 1e39]))
    with pytest.raises(ValueError, match=r"^sigma: expected values a float32 holds.*first at index \(0,\)"):
        MDLConfig(sigma=np.array([1e39, -1.0]))
    with pytest.raises(ValueError, match=r"^eps_c: expected 0 ≤ eps_c < min\(gains\).*first at index \(0,\)"):
        MDLConfig(eps_c=np.array([0.9, 1e39]))
    with pytest.raises(ValueError, match=r"^eps_c: expected 0 ≤ eps_c < min\(gains\)"):  # it is also ≥ min(gains)
        MDLConfig(eps_c=1e39)


_NEW_FIELDS = '''
    extra_gain: Any = _leaf((1.0, 2.0), shape=(2,), components=("e_a", "e_b"), low=0.0,
                            what="finite extra gains ≥ 0")
    extra_switch: bool = _static(True, _check_bool)
'''

_CHECKS = '''
import warnings
import numpy as np, jax, pytest
import mdl_jax
from mdl_jax.controller import api, config_file, sweep, tuning
from mdl_jax.controller.config import MDLConfig, NUMERIC_FIELDS, STATIC_FIELDS
from mdl_jax.engines import native
assert mdl_jax.__file__.startswith(TMP), mdl_jax.__file__
assert "extra_gain" in NUMERIC_FIELDS and "extra_switch" in STATIC_FIELDS
cfg = MDLConfig()
assert len(jax.tree.leaves(cfg, is_leaf=lambda x: isinstance(x, tuple))) == len(NUMERIC_FIELDS)
# validation
with pytest.raises(ValueError, match=r"^extra_gain: expected finite extra gains ≥ 0"):
    MDLConfig(extra_gain=(-1.0, 0.0))
with pytest.raises(ValueError, match=r"^extra_gain: expected 2 values"):
    MDLConfig(extra_gain=(1.0, 2.0, 3.0))
with pytest.raises(ValueError, match=r"^extra_switch: expected a bool"):
    MDLConfig(extra_switch=1)
with pytest.raises(ValueError, match=r"^config\\.extra_gain: expected one config's value"):
    api._check_single(MDLConfig(extra_gain=np.ones((2, 2))))
# the config file
d = config_file.config_to_dict(MDLConfig(extra_gain=(3.0, 4.0), extra_switch=False))
assert d["numeric"]["extra_gain"] == [3.0, 4.0] and d["static"]["extra_switch"] is False
assert config_file.config_from_dict(d) == MDLConfig(extra_gain=(3.0, 4.0), extra_switch=False)
d["numeric"]["extra_gain"] = [1.0, 2.0, 3.0]
with pytest.raises(config_file.ConfigFileError, match=r"numeric\\.extra_gain: expected a list of 2 numbers"):
    config_file.config_from_dict(d)
# the sweep's batches
grid = sweep.config_grid(e_a=[1.0, 2.0, 3.0])
assert np.shape(grid.extra_gain) == (3, 2) and np.asarray(grid.extra_gain)[:, 0].tolist() == [1, 2, 3]
assert sweep.batch_size(grid) == 3
with pytest.raises(ValueError, match=r"^extra_gain: expected finite extra gains ≥ 0; config 1 of the batch"):
    sweep.config_grid(e_b=[1.0, -1.0])
# the kernels' shape checks
assert native.supports(cfg) and native.sweep_supports(grid, 3)
assert not native.supports(MDLConfig(extra_gain=np.ones((2, 2))))
# tuning: the new static field and the untrained new leaf come back as they were
rng = np.random.default_rng(0)
M, R, A = rng.uniform(size=(3, 40))
start = MDLConfig(extra_gain=(3.0, 4.0), extra_switch=False)
res = tuning.tune(M, R, A, M > 0.5, config=start, steps=2)
assert res.config.extra_switch is False and res.config.extra_gain == (3.0, 4.0)
print("ok")
'''


def test_a_field_added_to_the_declarations_reaches_every_consumer(tmp_path):
    """Adding a field is one entry in MDLConfig: a copy of the package with two new fields (a vector
    leaf and a static switch), and nothing else changed, validates, writes and reads them in config
    files, batches and grids them in sweeps, checks their shapes for the kernels and keeps them
    through tuning."""
    shutil.copytree(REPO / "mdl_jax", tmp_path / "mdl_jax",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    path = tmp_path / "mdl_jax" / "controller" / "config.py"
    text = path.read_text()
    anchor = "    value_encoding: bool = _static(True, _check_bool)\n"
    assert text.count(anchor) == 1
    path.write_text(text.replace(anchor, anchor + _NEW_FIELDS.lstrip("\n")))
    code = f"TMP = {str(tmp_path)!r}\n" + textwrap.dedent(_CHECKS)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu",
                              "HOME": str(tmp_path)}, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_per_config_cache_keeps_a_hashable_configs_result_and_recomputes_an_unhashable_one():
    calls = []

    @per_config_cache
    def f(cfg):
        calls.append(cfg)
        return float(np.sum(cfg.thresholds))

    cfg = MDLConfig()
    assert f(cfg) == f(MDLConfig()) and len(calls) == 1  # equal configs share one entry
    arr = MDLConfig(thresholds=np.array([0.6, 0.4, 0.2]))  # array leaves: no key
    assert f(arr) == f(arr) and len(calls) == 3

    @per_config_cache
    def fails(cfg):
        calls.append(cfg)
        raise TypeError("the function's own")

    with pytest.raises(TypeError, match="the function's own"):
        fails(cfg)
    assert len(calls) == 4  # raised once, not retried as if the config were unhashable


# --- values outside a field's domain ------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("eps_c", np.nan), ("bias", np.nan), ("gains", (np.nan, 0.7, 0.5)), ("thresholds", (0.6, np.nan, 0.2)),
    ("n_max", np.inf), ("n_min", -np.inf), ("sigma", np.inf), ("g_A_coeffs", (0.5, np.nan)),
    ("gate_coeffs", (np.inf, 0.7)), ("eps_c", 0.5), ("eps_c", -0.1), ("gains", (1.0, -0.7, 0.5)),
    ("thresholds", (1.2, 0.4, 0.2)), ("thresholds", (0.6, 0.4, -0.1)), ("dims", [5, 5, 6]),
    ("qr_seed", -1), ("qr_seed", 1.5), ("sigma", "0.2"), ("sigma", True), ("sigma", None),
    ("gains", (1.0, 0.7)), ("bias", 1 + 2j), ("D", True),
])
def test_config_fields_outside_their_domain_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        MDLConfig(**{field: value})


def test_a_D_that_dims_do_not_sum_to_is_refused_naming_both():
    # the caller who set only D reads why dims is named, and that the two are set together
    with pytest.raises(ValueError, match=r"^dims: expected dimensions summing to D=15 \(set D and dims together\), "
                                         r"got \(5, 5, 6\)"):
        MDLConfig(D=15)
    assert MDLConfig(D=15, dims=(5, 5, 5)).dims == (5, 5, 5)


def test_thresholds_may_tie_but_never_rise():
    # θ0 ≥ θ1 ≥ θ2: equal thresholds are valid (calibrate's offset 0 gives θ0 = θ1 = θ2), rising ones are not
    for th in ((0.5, 0.5, 0.5), (0.6, 0.6, 0.2), (0.6, 0.2, 0.2), (1.0, 1.0, 0.0), (0.0, 0.0, 0.0)):
        assert MDLConfig(thresholds=th).thresholds == th
    for th in ((0.4, 0.6, 0.2), (0.6, 0.2, 0.4), (0.6, 0.4, 0.4000001)):
        with pytest.raises(ValueError, match=r"^thresholds: expected θ0 ≥ θ1 ≥ θ2"):
            MDLConfig(thresholds=th)


def test_the_defaults_are_the_papers_table_2():
    # Table 2, and the thresholds 0.6/0.4/0.2 and QR seed 42 of the deployed controller (Fig. 4)
    cfg = MDLConfig()
    assert (cfg.D, cfg.dims, cfg.sigma, cfg.eps_c, cfg.gains) == (16, (5, 5, 6), 0.20, 0.10, (1.0, 0.7, 0.5))
    assert (cfg.g_A_coeffs, cfg.gate_coeffs) == ((0.5, 0.5), (0.3, 0.7))
    assert (cfg.thresholds, cfg.qr_seed) == ((0.6, 0.4, 0.2), 42)
    assert (cfg.alpha_gating, cfg.risk_modulation, cfg.subspaces, cfg.risk_inversion, cfg.value_encoding) == (
        True, True, "qr", True, True)


def test_config_eps_c_must_stay_below_the_smallest_gain():
    # Theorem 1's condition, with eps_c = 0 (no leakage) allowed for any gains ≥ 0
    with pytest.raises(ValueError, match=r"^eps_c: .*min\(gains\)"):
        MDLConfig(gains=(1.0, 0.7, 0.1), eps_c=0.1)
    MDLConfig(gains=(0.0, 0.0, 0.0), eps_c=0.0)


def test_batched_config_is_checked_elementwise_and_names_the_field():
    K = 5
    sig = np.full(K, 0.2)
    sig[3] = np.nan
    with pytest.raises(ValueError, match=r"^sigma: .*finite"):
        MDLConfig(sigma=sig)
    th = np.tile([0.6, 0.4, 0.2], (K, 1))
    th[2] = [0.2, 0.4, 0.6]
    with pytest.raises(ValueError, match=r"^thresholds: .*θ0 ≥ θ1 ≥ θ2.*index \(2,\)"):
        MDLConfig(thresholds=th)
    with pytest.raises(ValueError, match=r"^eps_c: .*index \(1,\)"):
        MDLConfig(eps_c=np.array([0.1, 0.6, 0.1, 0.1, 0.1]))
    with pytest.raises(ValueError, match=r"^n_max: .*index \(4,\)"):
        MDLConfig(n_min=np.ones(K), n_max=np.array([2, 2, 2, 2, 1.0]))
    base = MDLConfig()
    batch = {f: np.broadcast_to(np.asarray(getattr(base, f)), (K,) + np.shape(getattr(base, f)))
             for f in NUMERIC_FIELDS}
    good = MDLConfig(**{**batch, "sigma": np.linspace(0.1, 0.3, K)})  # checked as a batch, and valid
    out = jax.vmap(lambda c: decide(0.8, 0.7, 0.2, c, validate=False).C_final)(good)
    assert out.shape == (K,) and np.all(np.isfinite(np.asarray(out)))


def test_traced_config_leaves_are_not_checked():
    # inside vmap/grad the values are unknown: construction must not try to read them
    f = jax.grad(lambda e: decide(0.8, 0.7, 0.2, MDLConfig(eps_c=e), validate=False).C_final)
    assert np.isfinite(float(f(jnp.float32(0.1))))
    vm = jax.vmap(lambda s: MDLConfig(sigma=s, n_max=s + 3.0).sigma)(jnp.array([-1.0, np.nan]))
    assert vm.shape == (2,)


@pytest.mark.strict_dtype_promotion
def test_a_sigma_whose_square_is_subnormal_is_rejected_naming_sigma():
    # σ = 1e-30 (and anything below 2^-63) was accepted: the pure-JAX path returned NaN v_meta,
    # energies and g_A (XLA flushes the subnormal σ² to 0, so (s - c)²/(2σ²) = 0/0 at a centre) and
    # the native kernel a different, finite decision (action ACTIVE against OPT_OUT).
    with pytest.raises(ValueError, match=r"^sigma: .*2\^-63"):
        MDLConfig(sigma=np.nextafter(2.0 ** -63, 0))
    for sigma in (1e-30, 1e-19):
        with pytest.raises(ValueError, match=r"^sigma: .*2\^-63"):
            MDLConfig(sigma=sigma)
        with pytest.raises(ValueError, match=r"^sigma: .*2\^-63.*config 1 of the batch"):
            config_grid(MDLConfig(), sigma=[0.1, sigma])
    MDLConfig(sigma=2.0 ** -63)
