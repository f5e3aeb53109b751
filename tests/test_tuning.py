"""Gradient tuning and config files: gradients against finite differences, recovery of a teacher's gates,
the paper's invariants after every step, frozen fields untouched, save → load → identical decisions,
sharded = unsharded, and config files with a broken invariant rejected naming the field."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mdl_jax import MDLConfig, decide, load_config, save_config, soft_decide, tune
from mdl_jax.controller.config_file import ConfigFileError
from mdl_jax.controller.tuning import FIELD_SETS, from_unconstrained, to_unconstrained, tune_many
from tests.devices import run_on_forced_devices

# The signal-cube normalisation (C never clips), so every record carries information about the gates;
# with the deployed n_min/n_max many uniform records have C clipped to 0 or 1.
CUBE = MDLConfig(n_min=1.2522579431533813, n_max=3.2805850505828857)
TEACHER = CUBE.replace(gate_coeffs=(0.1, 0.9), thresholds=(0.5, 0.3, 0.1))


@pytest.fixture(scope="module")
def teacher_data():
    rng = np.random.default_rng(0)
    M, R, A = rng.uniform(size=(3, 2000)).astype(np.float32)
    y = (np.asarray(decide(M, R, A, TEACHER).action) == 0).astype(int)
    return M, R, A, y


@pytest.mark.parametrize("field, index", [("sigma", None), ("eps_c", None), ("gate_coeffs", 1),
                                          ("thresholds", 0), ("n_max", None)])
def test_soft_decision_gradients_match_finite_differences(field, index, maybe_jit):
    rng = np.random.default_rng(1)
    M, R, A = (jnp.asarray(x) for x in rng.uniform(size=(3, 16)).astype(np.float32))
    w = jnp.asarray([1.0, 0.3, -0.4, -0.9])  # a generic functional of the four probabilities

    def f(cfg):
        return jnp.sum(soft_decide(M, R, A, cfg, temperature=0.1) @ w)

    base = MDLConfig()
    grad = maybe_jit(jax.grad(f))(base)
    g = np.asarray(getattr(grad, field))
    g = float(g if index is None else g[index])
    v = np.asarray(getattr(base, field), np.float64)
    h = 1e-3

    def at(delta):
        x = v.copy() if v.ndim else float(v) + delta
        if v.ndim:
            x[index] += delta
            x = tuple(float(t) for t in x)
        return float(f(base.replace(**{field: x})))

    fd = (at(h) - at(-h)) / (2 * h)
    assert np.isfinite(g)
    assert abs(g - fd) <= 2e-2 * max(1.0, abs(fd)), (g, fd)


def test_tuning_recovers_a_teachers_gates_up_to_their_common_scale(teacher_data):
    """Labels from a controller with known gates (0.1, 0.9) and θ0 = 0.5. Only g_a/θ0 and g_b/θ0 are
    identifiable (C·(g_a + g_b α) ≥ θ0 is unchanged when all three scale together), so the tolerance is
    stated on those ratios: within 5% of the teacher's (0.2, 1.8)."""
    M, R, A, y = teacher_data
    res = tune(M, R, A, y, config=CUBE, steps=400)
    ga, gb = res.config.gate_coeffs
    th0 = res.config.thresholds[0]
    assert abs(ga / th0 - 0.2) <= 0.05 * 1.8 and abs(gb / th0 - 1.8) <= 0.05 * 1.8, (ga, gb, th0)
    acc = np.mean((np.asarray(decide(M, R, A, res.config).action) == 0) == y)
    assert acc >= 0.995
    assert res.history["disagreement"] <= 0.01  # the annealed soft controller is the hard one


def test_invariants_hold_after_every_step_when_every_field_trains(teacher_data):
    M, R, A, y = teacher_data
    res = tune(M[:300], R[:300], A[:300], y[:300], fields=FIELD_SETS["all"], steps=60,
               learning_rate=0.3)
    h = res.history
    th = h["thresholds"]
    assert np.all(h["sigma"] > 0)
    assert np.all(h["eps_c"] >= 0) and np.all(h["eps_c"] < h["min_gain"])
    assert np.all((th >= 0) & (th <= 1)) and np.all(th[:, 0] >= th[:, 1]) and np.all(th[:, 1] >= th[:, 2])
    assert np.all(h["n_max"] > h["n_min"])
    MDLConfig(**{f: getattr(res.config, f) for f in ("sigma", "eps_c", "gains", "thresholds")})


def test_parametrisation_keeps_invariants_for_any_free_parameters():
    rng = np.random.default_rng(2)
    base = MDLConfig()
    for scale in (0.1, 3.0, 30.0):
        for _ in range(50):
            u = {k: jnp.asarray(rng.normal(size=np.shape(v)) * scale, jnp.float32)
                 for k, v in to_unconstrained(base).items()}
            c = from_unconstrained(u, base)
            th = np.asarray(c.thresholds)
            assert float(c.sigma) > 0 and 0 <= float(c.eps_c) < float(np.min(c.gains))
            assert 1 >= th[0] >= th[1] >= th[2] >= 0 and float(c.n_max) > float(c.n_min)


def test_the_default_config_round_trips_through_the_parametrisation():
    c = from_unconstrained(to_unconstrained(MDLConfig()), MDLConfig())
    for f in ("sigma", "eps_c", "gains", "gate_coeffs", "thresholds", "n_min", "n_max"):
        np.testing.assert_allclose(np.asarray(getattr(c, f)), np.asarray(getattr(MDLConfig(), f)),
                                   rtol=1e-5)


def test_fields_outside_the_trained_set_keep_their_values_exactly(teacher_data):
    M, R, A, y = teacher_data
    res = tune(M, R, A, y, fields=("gate_coeffs",), steps=50)
    base = MDLConfig()
    for f in ("sigma", "eps_c", "gains", "g_A_coeffs", "bias", "n_min", "n_max"):
        np.testing.assert_allclose(np.asarray(getattr(res.config, f)), np.asarray(getattr(base, f)),
                                   rtol=1e-6)
    np.testing.assert_allclose(res.config.thresholds, base.thresholds, rtol=1e-4)


@pytest.mark.parametrize("steps", [1, 2, 9])
def test_runs_shorter_than_the_warmup_train(teacher_data, steps):
    """A run of fewer than 10 steps has a warmup of at most steps − 1 (optax rejects a schedule whose
    warmup leaves no decay steps): one step already moves the trained fields."""
    M, R, A, y = (x[:200] for x in teacher_data)
    res = tune(M, R, A, y, fields=("gate_coeffs",), steps=steps)
    assert res.history["loss"].shape == (steps,) and np.all(np.isfinite(res.history["loss"]))
    assert res.config.gate_coeffs != MDLConfig().gate_coeffs


def test_any_python_int_is_a_seed(teacher_data):
    """Seeds go to jax.random.PRNGKey as Python ints, so seeds past int32 (e.g. 2**31, 2**33 + 5) and
    negative ones start from their own jittered point; seed 0 starts at the config itself."""
    M, R, A, y = (x[:200] for x in teacher_data)
    got = {s: tune(M, R, A, y, fields=("gate_coeffs",), steps=3, seed=s).config.gate_coeffs
           for s in (0, 1, -1, 2**31, 2**33 + 5)}
    assert len(set(got.values())) == len(got)


def test_early_stopping_keeps_the_best_validation_step(teacher_data):
    M, R, A, y = teacher_data
    val = (np.arange(len(M)) % 4 == 0).astype(np.float32)
    res = tune(M, R, A, y, val=val, steps=300, patience=30)
    h = res.history
    assert h["best_val_accuracy"] == pytest.approx(h["val_accuracy"].max())
    assert int(h["best_step"]) == int(np.argmax(h["val_accuracy"]))
    assert int(h["stopped_step"]) <= 300


def test_one_program_trains_folds_seeds_and_field_sets_like_separate_runs(teacher_data):
    M, R, A, y = (x[:500] for x in teacher_data)
    n = len(M)
    folds = np.arange(n) % 3
    wt = np.stack([(folds != f).astype(np.float32) for f in range(3)] * 2)
    wv = np.zeros_like(wt)
    sets = [FIELD_SETS["gates"]] * 3 + [("gate_coeffs", "thresholds", "sigma")] * 3
    configs, hist = tune_many(M, R, A, y, train_weights=wt, val_weights=wv, field_sets=sets,
                              seeds=[0, 1, 2, 0, 1, 2], steps=40)
    assert len(configs) == 6 and hist["loss"].shape == (6, 40)
    for b in (0, 4):
        one = tune(M, R, A, y, fields=sets[b], weights=wt[b], steps=40, seed=[0, 1, 2, 0, 1, 2][b])
        np.testing.assert_allclose(one.config.gate_coeffs, configs[b].gate_coeffs, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(one.config.thresholds, configs[b].thresholds, rtol=1e-4, atol=1e-5)


def test_save_then_load_gives_identical_decisions(tmp_path, teacher_data):
    M, R, A, y = teacher_data
    tuned = tune(M, R, A, y, steps=50).config
    path = save_config(tuned, tmp_path / "tuned.json", note="test")
    loaded = load_config(path)
    assert loaded == tuned
    a, b = decide(M, R, A, tuned), decide(M, R, A, loaded)
    np.testing.assert_array_equal(np.asarray(a.action), np.asarray(b.action))
    np.testing.assert_array_equal(np.asarray(a.C_final), np.asarray(b.C_final))
    text = path.read_text()
    assert '"version": 1' in text and '"gate_coeffs": [' in text  # human-readable


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["numeric"].__setitem__("sigma", float("nan")), "sigma"),
    (lambda d: d.__setitem__("version", 99), "version: expected 1, got 99"),
    (lambda d: d["numeric"].__setitem__("thresholds", [0.2, 0.4, 0.6]), "thresholds"),
    (lambda d: d["numeric"].__setitem__("colour", 1), "colour: not a field"),
    (lambda d: d.__setitem__("format", "other"), "not an mdl-jax config"),
])
def test_a_broken_config_file_is_rejected_naming_the_field(tmp_path, edit, match):
    path = save_config(MDLConfig(), tmp_path / "c.json")
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigFileError, match=match) as e:
        load_config(path)
    assert str(path) in str(e.value)


def test_bad_tuning_input_is_an_error_naming_the_argument(teacher_data):
    M, R, A, y = teacher_data
    with pytest.raises(ValueError, match="fields: expected a non-empty subset"):
        tune(M, R, A, y, fields=("colour",))
    with pytest.raises(ValueError, match=r"adopt: expected shape \(2000,\)"):
        tune(M, R, A, y[:-1])
    with pytest.raises(ValueError, match="temperature"):
        tune(M, R, A, y, temperature=(0.05, 0.0))


def test_tuning_sharded_over_four_devices_equals_one_device(tmp_path):
    code = (
        "import numpy as np, sys, jax\n"
        "from mdl_jax import MDLConfig, decide\n"
        "from mdl_jax.controller.tuning import tune_many, FIELD_SETS\n"
        "rng = np.random.default_rng(0); M, R, A = rng.uniform(size=(3, 400)).astype(np.float32)\n"
        "y = (np.asarray(decide(M, R, A, MDLConfig(gate_coeffs=(0.1, 0.9))).action) == 0).astype(int)\n"
        "wt = np.stack([(np.arange(400) % 4 != f).astype(np.float32) for f in range(4)])\n"
        "cfgs, h = tune_many(M, R, A, y, train_weights=wt, val_weights=np.zeros_like(wt),"
        " field_sets=[FIELD_SETS['gates']] * 4, seeds=[0, 1, 2, 3], steps=30)\n"
        "np.save(sys.argv[1], np.array([c.gate_coeffs + c.thresholds for c in cfgs]))\n"
        "print(jax.device_count())\n")
    np.testing.assert_allclose(run_on_forced_devices(code, 4, tmp_path),
                               run_on_forced_devices(code, 1, tmp_path), rtol=1e-5, atol=1e-6)


def test_decide_accepts_a_config_file(tmp_path, teacher_data):
    M, R, A, _ = teacher_data
    cfg = MDLConfig(gate_coeffs=(0.2, 0.8), thresholds=(0.7, 0.5, 0.3))
    path = save_config(cfg, tmp_path / "c.json")
    for p in (path, str(path)):
        np.testing.assert_array_equal(np.asarray(decide(M, R, A, p).action),
                                      np.asarray(decide(M, R, A, cfg).action))
    with pytest.raises(ConfigFileError, match="missing.json: cannot read"):
        decide(M, R, A, tmp_path / "missing.json")
