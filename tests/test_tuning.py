"""Gradient tuning and config files: gradients against finite differences, recovery of a teacher's gates,
the paper's invariants after every step, frozen fields untouched, save → load → identical decisions,
sharded = unsharded, and config files with a broken invariant rejected naming the field."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mdl_jax import MDLConfig, decide, load_config, save_config, soft_decide, tune
from mdl_jax.controller.config import NUMERIC_FIELDS
from mdl_jax.controller.config_file import ConfigFileError
from mdl_jax.controller.tuning import FIELD_SETS, TuneSettings, from_unconstrained, to_unconstrained, tune_many

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
@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.parametrize("trained", [("gains",), ("eps_c",), ("n_min",), ("n_max",), ("gains", "n_min")])
@pytest.mark.parametrize("base", [MDLConfig(eps_c=0.3, gains=(1.0, 0.7, 0.5)),
                                  MDLConfig(eps_c=0.0, gains=(1.0, 0.0, 0.5), n_min=2.0, n_max=2.0005)])
def test_a_field_set_is_constrained_around_the_frozen_fields_which_never_move(trained, base):
    """Gains trained beside a frozen ε_c stay above it, n_min trained below a frozen n_max, ε_c
    beside a zero gain stays 0: any free parameters give a valid config whose frozen fields are the
    base's float32 values."""
    rng = np.random.default_rng(4)
    for scale in (0.1, 3.0, 30.0):
        for _ in range(10):
            u = {k: v + jnp.asarray(rng.normal(size=np.shape(v)) * scale, jnp.float32)
                 for k, v in to_unconstrained(base, trained).items()}
            assert all(np.all(np.isfinite(np.asarray(v))) for v in u.values())
            c = from_unconstrained(u, base, trained)
            MDLConfig(**{f: np.asarray(getattr(c, f), np.float64) for f in NUMERIC_FIELDS})  # valid
            for f in NUMERIC_FIELDS:
                if f not in trained:
                    assert np.array_equal(np.asarray(getattr(c, f)), np.asarray(getattr(base, f), np.float32)), f


def test_the_default_config_round_trips_through_the_parametrisation():
    c = from_unconstrained(to_unconstrained(MDLConfig()), MDLConfig())
    for f in ("sigma", "eps_c", "gains", "gate_coeffs", "thresholds", "n_min", "n_max"):
        np.testing.assert_allclose(np.asarray(getattr(c, f)), np.asarray(getattr(MDLConfig(), f)),
                                   rtol=1e-5)


@pytest.mark.slow
def test_fields_outside_the_trained_set_come_back_bit_identical(teacher_data):
    """Frozen fields are the starting config's values exactly, even at the domain edges that the
    free parametrisation can only approach (ε_c = 0, θ0 = 1, a zero gain): an audit saw
    ε_c 0 → 5e-5, θ0 1.0 → 0.99995 and a zero gain → 0.001, and NaN when every field trained from
    a zero gain with ε_c = 0. Trained fields are constrained around the frozen ones (gains above a
    frozen ε_c, n_min below a frozen n_max), so the result is a valid config."""
    M, R, A, y = (x[:300] for x in teacher_data)
    sets = [("n_min",), ("gate_coeffs", "thresholds"), NUMERIC_FIELDS]  # one program, one fused group
    for base in (MDLConfig(eps_c=0.0, gains=(1.0, 0.0, 0.5), thresholds=(1.0, 0.4, 0.0)),):
        wt = np.ones((len(sets), 300), np.float32)
        configs, hist = tune_many(M, R, A, y, train_weights=wt, val_weights=np.zeros_like(wt),
                                  field_sets=sets, seeds=[1] * len(sets), config=base,
                                  settings=TuneSettings(steps=8))
        assert np.all(np.isfinite(hist["loss"])) and np.all(hist["diverged_step"] == -1)
        for fields, cfg in zip(sets, configs):
            for f in NUMERIC_FIELDS:
                if f not in fields:
                    assert np.array_equal(np.asarray(getattr(cfg, f), np.float64),
                                          np.asarray(getattr(base, f), np.float64)), (fields, f, getattr(cfg, f))
            assert cfg != base  # something trained
            assert np.all(np.isfinite(np.asarray(decide(M, R, A, cfg).C_final)))


def test_a_diverged_run_is_reported_as_divergence_and_keeps_finite_parameters(teacher_data):
    M, R, A, y = (x[:300] for x in teacher_data)
    with pytest.warns(RuntimeWarning, match=r"tune: run 0 .* diverged at step \d+ .*Lower learning_rate"):
        res = tune(M, R, A, y, steps=30, learning_rate=1e38)
    assert int(res.history["diverged_step"]) >= 0
    assert int(res.history["stopped_step"]) == int(res.history["diverged_step"])
    assert all(np.all(np.isfinite(np.asarray(getattr(res.config, f), np.float64))) for f in NUMERIC_FIELDS)


@pytest.mark.parametrize("scale", [1e-40, 3e38, 1e300])
def test_uniform_weights_of_any_scale_train_exactly_as_unweighted(teacher_data, scale):
    """The loss is a weighted mean: only the weights' ratios count. Weights of 1e-40 (flushed to zero
    in float32) or 3e38 (whose sum overflows float32) once diverged or ended with a loss of 0."""
    import warnings

    M, R, A, y = (x[:300] for x in teacher_data)
    val = (np.arange(300) % 5 == 0).astype(np.float64)
    ref = tune(M, R, A, y, val=val, steps=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = tune(M, R, A, y, weights=np.full(300, scale), val=val * scale, steps=20)
    assert got.config == ref.config
    for k in ("loss", "train_accuracy", "val_accuracy", "best_step", "diverged_step"):
        np.testing.assert_array_equal(got.history[k], ref.history[k], err_msg=k)
    # and the ratios are kept: a record weighted 0 relative to 1e-40 ones is still out of training
    w = np.full(300, 1e-40)
    w[:50] = 0.0
    np.testing.assert_array_equal(tune(M, R, A, y, weights=w, steps=5).history["loss"],
                                  tune(M, R, A, y, weights=(w > 0).astype(float), steps=5).history["loss"])


def test_tune_under_x64_trains_in_float32_exactly_as_without_it(teacher_data):
    """Under x64 the training loop's step counter (int64) did not match its int32 carry: a TypeError
    from lax.scan. The frozen fields' constants would also have trained in float64."""
    M, R, A, y = (x[:200] for x in teacher_data)
    settings = TuneSettings(steps=8)
    ref = tune(M, R, A, y, settings=settings)
    with jax.enable_x64(True):
        for signals in ((M, R, A), tuple(x.astype(np.float64) for x in (M, R, A))):
            got = tune(*signals, y, settings=settings)
            assert got.config == ref.config
            for k in ("loss", "thresholds", "train_accuracy", "best_step"):
                assert got.history[k].dtype == ref.history[k].dtype, k
                np.testing.assert_array_equal(got.history[k], ref.history[k], err_msg=k)


def test_a_learning_rate_that_saturates_the_controller_into_a_constant_is_warned_about(teacher_data):
    """Far too large a step saturates the thresholds (sigmoids at 0 or 1, no gradient) with every value
    finite, so no divergence is seen: the run's controller adopting every record is reported."""
    M, R, A, y = (x[:300] for x in teacher_data)
    with pytest.warns(RuntimeWarning, match=r"tune: run 0 \(fields gate_coeffs, thresholds, seed 0\) adopts "
                                            r"every training record: .*the learning_rate \(1e\+30\) is too large"):
        res = tune(M, R, A, y, steps=30, learning_rate=1e30)
    assert int(res.history["diverged_step"]) == -1 and float(res.history["adopt_share"]) == 1.0
    ok = tune(M, R, A, y, steps=30)
    assert 0 < float(ok.history["adopt_share"]) < 1


@pytest.mark.parametrize("steps", [1, 2, 9])
@pytest.mark.slow
def test_runs_shorter_than_the_warmup_train(teacher_data, steps):
    """A run of fewer than 10 steps has a warmup of at most steps − 1 (optax rejects a schedule whose
    warmup leaves no decay steps): one step already moves the trained fields."""
    M, R, A, y = (x[:200] for x in teacher_data)
    res = tune(M, R, A, y, fields=("gate_coeffs",), steps=steps)
    assert res.history["loss"].shape == (steps,) and np.all(np.isfinite(res.history["loss"]))
    assert res.config.gate_coeffs != MDLConfig().gate_coeffs


def test_every_seed_in_its_domain_has_its_own_start_and_others_are_refused(teacher_data):
    """Seeds are ints in [0, 2**64): each its own key (no aliasing modulo 2**32, which PRNGKey does
    without x64), seed 0 starts at the config itself; negative or ≥ 2**64 is a ValueError naming it."""
    M, R, A, y = (x[:200] for x in teacher_data)
    seeds = (0, 1, 2**31, 2**32 + 1, 2**33 + 5, 2**64 - 1)
    got = {s: tune(M, R, A, y, fields=("gate_coeffs",), steps=3, seed=s).config.gate_coeffs for s in seeds}
    assert len(set(got.values())) == len(got)
    for bad in (-1, 2**64, 10**30, 1.0, True):
        with pytest.raises(ValueError, match=r"^seed: expected an int in \[0, 2\*\*64\), got "):
            tune(M, R, A, y, steps=3, seed=bad)


@pytest.mark.parametrize("edit, match", [
    (lambda M, y: (M, np.ones_like(y)), r"^adopt: expected both labels among the training records, got 300 that are all adopt \(1\)"),
    (lambda M, y: (M, np.zeros_like(y)), r"^adopt: .*all reject \(0\)"),
    (lambda M, y: (M[:4], y[:4]), r"^M: expected 1-d signals of at least 5 records to tune on, got shape \(4,\)"),
    (lambda M, y: (np.where(np.arange(len(M)) == 5, 1.5, M), y), r"^M: expected values in \[0, 1\]; M\[5\] = 1\.5$"),
    (lambda M, y: (np.where(np.arange(len(M)) == 7, np.nan, M).astype(np.float32), y), r"^M: expected finite values in \[0, 1\]; M\[7\] = nan$"),
])
def test_tune_input_it_cannot_train_on_is_a_value_error_naming_the_argument(teacher_data, edit, match):
    M, R, A, y = (x[:300] for x in teacher_data)
    M2, y2 = edit(M, y)
    n = len(M2)
    with pytest.raises(ValueError, match=match):
        tune(M2, R[:n], A[:n], y2, steps=3)
    with pytest.raises(ValueError, match=r"^learning_rate: expected a finite number > 0"):
        tune(M, R, A, y, steps=3, learning_rate=float("inf"))


def test_no_training_record_left_is_a_value_error_naming_the_weights(teacher_data):
    M, R, A, y = (x[:100] for x in teacher_data)
    n = len(M)
    for kw in ({"weights": np.zeros(n)}, {"val": np.ones(n)}, {"weights": np.arange(n) % 2, "val": np.arange(n) % 2}):
        with pytest.raises(ValueError, match=r"^weights, val: expected at least one training record \(weight > 0, not in val\)"):
            tune(M, R, A, y, steps=3, **kw)
    wt = np.stack([np.ones(n), np.zeros(n)]).astype(np.float32)
    with pytest.raises(ValueError, match=r"^train_weights: .* got none in run 1"):
        tune_many(M, R, A, y, train_weights=wt, val_weights=np.zeros_like(wt), field_sets=[("gate_coeffs",)] * 2,
                  seeds=[0, 0], settings=TuneSettings(steps=3))


def test_early_stopping_keeps_the_best_validation_step(teacher_data):
    M, R, A, y = teacher_data
    val = (np.arange(len(M)) % 4 == 0).astype(np.float32)
    res = tune(M, R, A, y, val=val, steps=300, patience=30)
    h = res.history
    assert h["best_val_accuracy"] == pytest.approx(h["val_accuracy"].max())
    assert int(h["best_step"]) == int(np.argmax(h["val_accuracy"]))
    assert int(h["stopped_step"]) <= 300


@pytest.mark.slow
def test_one_program_trains_folds_seeds_and_field_sets_like_separate_runs(teacher_data):
    M, R, A, y = (x[:500] for x in teacher_data)
    n = len(M)
    folds = np.arange(n) % 3
    wt = np.stack([(folds != f).astype(np.float32) for f in range(3)] * 2)
    wv = np.zeros_like(wt)
    sets = [FIELD_SETS["gates"]] * 3 + [("gate_coeffs", "thresholds", "sigma")] * 3
    configs, hist = tune_many(M, R, A, y, train_weights=wt, val_weights=wv, field_sets=sets,
                              seeds=[0, 1, 2, 0, 1, 2], settings=TuneSettings(steps=40))
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
    # one name without its tuple: said so, not reported as the unknown fields 'g', 'a', 't', ...
    with pytest.raises(ValueError, match=r"^fields: expected a sequence of field names, got the str 'gate_coeffs' "
                                         r"\(one field: \('gate_coeffs',\)\)$"):
        tune(M, R, A, y, fields="gate_coeffs")
    w = np.ones((1, len(M)), np.float32)
    with pytest.raises(ValueError, match=r"^field_sets\[0\]: expected a sequence of field names, got the str"):
        tune_many(M, R, A, y, train_weights=w, val_weights=w, field_sets=["gates"], seeds=[0])
    with pytest.raises(ValueError, match=r"adopt: expected shape \(2000,\)"):
        tune(M, R, A, y[:-1])
    with pytest.raises(ValueError, match="temperature"):
        tune(M, R, A, y, temperature=(0.05, 0.0))


def test_a_config_file_path_given_to_tune_says_to_load_it(tmp_path, teacher_data):
    # decide and calibrate take a path; tune refused one as "got str", not saying what to do
    M, R, A, y = (x[:100] for x in teacher_data)
    path = save_config(MDLConfig(), tmp_path / "c.json")
    for p in (path, str(path)):
        with pytest.raises(TypeError, match=r"^config: expected an MDLConfig, got the path '.*c\.json'; tuning "
                                            r"takes no config file: pass load_config\(path\)$"):
            tune(M, R, A, y, config=p, steps=2)
    w = np.ones((1, len(M)), np.float32)
    with pytest.raises(TypeError, match=r"pass load_config\(path\)$"):
        tune_many(M, R, A, y, train_weights=w, val_weights=w, field_sets=[FIELD_SETS["gates"]], seeds=[0],
                  config=str(path), settings=TuneSettings(steps=2))


def test_decide_accepts_a_config_file(tmp_path, teacher_data):
    M, R, A, _ = teacher_data
    cfg = MDLConfig(gate_coeffs=(0.2, 0.8), thresholds=(0.7, 0.5, 0.3))
    path = save_config(cfg, tmp_path / "c.json")
    for p in (path, str(path)):
        np.testing.assert_array_equal(np.asarray(decide(M, R, A, p).action),
                                      np.asarray(decide(M, R, A, cfg).action))
    with pytest.raises(ConfigFileError, match="missing.json: cannot read"):
        decide(M, R, A, tmp_path / "missing.json")


def test_arguments_of_the_wrong_kind_are_value_errors_naming_the_argument(teacher_data):
    # None, a number or text where a sequence of runs, field names or weights belongs: named, not a
    # TypeError or a NumPy message from inside
    M, R, A, y = (x[:100] for x in teacher_data)
    n = len(M)
    s = TuneSettings(steps=2)
    for kw, match in [(dict(fields=None), r"^fields: expected a sequence of field names, got None$"),
                      (dict(fields=3), r"^fields: expected a sequence of field names, got 3$"),
                      (dict(weights=np.array(["a"] * n)), r"^weights: expected finite, non-negative weights \("),
                      (dict(val=[[1.0], [1.0, 2.0]]), r"^val: expected finite, non-negative weights \("),
                      # the first bad entry named by the argument the caller gave, also where val masks it
                      (dict(weights=np.where(np.arange(n) == 4, -2.0, 1.0)),
                       r"^weights: expected finite, non-negative weights; weights\[4\] = -2\.0$"),
                      (dict(weights=np.where(np.arange(n) == 4, np.inf, 1.0), val=np.arange(n) == 4),
                       r"^weights: expected finite, non-negative weights; weights\[4\] = inf$"),
                      (dict(val=np.where(np.arange(n) == 9, np.nan, 0.0)),
                       r"^val: expected finite, non-negative weights; val\[9\] = nan$"),
                      (dict(config=MDLConfig(sigma=np.array([0.1, 0.2]))),
                       r"^config\.sigma: expected one config's value \(shape \(\)\), got shape \(2,\)")]:
        with pytest.raises(ValueError, match=match):
            tune(M, R, A, y, settings=s, **kw)
    w = np.ones((1, n), np.float32)
    ok = dict(train_weights=w, val_weights=np.zeros_like(w), field_sets=[FIELD_SETS["gates"]], seeds=[0], settings=s)
    for kw, match in [(dict(seeds=None), r"^seeds: expected a sequence with one entry per run, got NoneType$"),
                      (dict(field_sets=None), r"^field_sets: expected a sequence with one entry per run, got NoneType$"),
                      (dict(field_sets="gates"), r"^field_sets: expected a sequence with one entry per run, got str$"),
                      (dict(field_sets=[None]), r"^field_sets\[0\]: expected a sequence of field names, got None$"),
                      (dict(train_weights=[["a"] * n]), r"^train_weights: expected finite, non-negative weights \("),
                      (dict(train_weights=np.where(np.arange(n) == 2, -1.0, 1.0)[None]),
                       r"^train_weights: expected finite, non-negative weights; train_weights\[0, 2\] = -1\.0$"),
                      (dict(train_weights=np.zeros((0, n)), val_weights=np.zeros((0, n)), field_sets=[], seeds=[]),
                       r"^field_sets: expected at least one run, got none$")]:
        with pytest.raises(ValueError, match=match):
            tune_many(M, R, A, y, **{**ok, **kw})


def test_fields_may_be_any_collection_of_names_and_field_sets_any_ordered_one(teacher_data):
    # the trained fields are a subset: a set, a NumPy array of names or dict keys name them as a tuple
    # does; the runs of tune_many are ordered, so a generator of them is taken too (a set is not)
    M, R, A, y = (x[:100] for x in teacher_data)
    n = len(M)
    s = TuneSettings(steps=2)
    want = tune(M, R, A, y, settings=s, fields=("sigma", "eps_c")).config
    for fields in ({"sigma", "eps_c"}, np.array(["sigma", "eps_c"]), {"sigma": 1, "eps_c": 1}.keys()):
        assert tune(M, R, A, y, settings=s, fields=fields).config == want
    with pytest.raises(ValueError, match=r"^fields: expected a sequence of field names, got array\('sigma'"):
        tune(M, R, A, y, settings=s, fields=np.array("sigma"))
    w = np.ones((2, n), np.float32)
    ok = dict(train_weights=w, val_weights=np.zeros_like(w), seeds=[0, 1], settings=s)
    want_many = tune_many(M, R, A, y, field_sets=[("sigma",), ("eps_c",)], **ok)[0]
    for field_sets in (np.array([["sigma"], ["eps_c"]]), (f for f in [("sigma",), ("eps_c",)])):
        assert tune_many(M, R, A, y, field_sets=field_sets, **ok)[0] == want_many
    with pytest.raises(ValueError, match=r"^field_sets: expected a sequence with one entry per run, got set$"):
        tune_many(M, R, A, y, field_sets={("sigma",), ("eps_c",)}, **ok)
