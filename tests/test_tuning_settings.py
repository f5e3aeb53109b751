"""tune's settings as one value: TuneSettings (steps, an optax optimiser, an optax temperature schedule,
patience, init_noise); the keyword shorthands and the deprecated learning_rate / (start, end)
temperature train exactly as the settings they stand for."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mdl_jax.controller.tuning import (
    FIELD_SETS,
    GeometricTemperature,
    TuneSettings,
    default_optimizer,
    tune,
    tune_many,
)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    N = 120
    M, R, A = rng.uniform(size=(3, N))
    y = (0.6 * M + 0.4 * R - 0.3 * A + rng.normal(0, 0.1, N)) > 0.35
    val = (np.arange(N) % 4 == 0).astype(np.float64)
    return M, R, A, y, val


def _same(a, b):
    assert a.config == b.config
    assert a.history.keys() == b.history.keys()
    for k in a.history:
        np.testing.assert_array_equal(a.history[k], b.history[k], err_msg=k)


def test_settings_and_their_keyword_shorthands_train_alike_without_warnings(data):
    M, R, A, y, val = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_keywords = tune(M, R, A, y, val=val, steps=12, patience=4)
        by_value = tune(M, R, A, y, val=val, settings=TuneSettings(steps=12, patience=4))
        spelled_out = tune(M, R, A, y, val=val, settings=TuneSettings(
            steps=12, patience=4, optimizer=default_optimizer(12), temperature=GeometricTemperature(0.05, 0.002, 12)))
    _same(by_keywords, by_value)
    _same(by_keywords, spelled_out)


def test_learning_rate_and_a_temperature_pair_still_work_with_a_deprecation_warning(data):
    M, R, A, y, val = data
    with pytest.warns(DeprecationWarning, match="learning_rate is deprecated"):
        with pytest.warns(DeprecationWarning, match=r"temperature=\(start, end\) is deprecated"):
            old = tune(M, R, A, y, val=val, steps=10, learning_rate=0.1, temperature=(0.1, 0.01))
    new = tune(M, R, A, y, val=val, settings=TuneSettings(
        steps=10, optimizer=default_optimizer(10, 0.1), temperature=GeometricTemperature(0.1, 0.01, 10)))
    _same(old, new)


def test_a_given_optimizer_and_temperature_schedule_are_the_ones_used(data):
    M, R, A, y, _ = data
    schedule = optax.linear_schedule(0.08, 0.01, 7)
    frozen = tune(M, R, A, y, steps=8, optimizer=optax.sgd(0.0), temperature=schedule)
    # τ per step is the schedule's; a zero step never moves the trained fields
    np.testing.assert_allclose(frozen.history["temperature"], [float(schedule(k)) for k in range(8)], rtol=1e-6)
    assert np.all(frozen.history["thresholds"] == frozen.history["thresholds"][0])
    moved = tune(M, R, A, y, steps=8, optimizer=optax.sgd(0.05), temperature=schedule)
    assert np.any(moved.history["thresholds"] != moved.history["thresholds"][0])


def test_tune_many_takes_the_settings_value_and_its_old_keywords_train_alike_with_a_deprecation_warning(data):
    M, R, A, y, _ = data
    wt = np.ones((2, len(M)))
    kw = dict(train_weights=wt, val_weights=np.zeros_like(wt), field_sets=[FIELD_SETS["gates"]] * 2, seeds=[0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = tune_many(M, R, A, y, settings=TuneSettings(steps=6, init_noise=0.2), **kw)
    with pytest.warns(DeprecationWarning, match=r"^tune_many: setting keywords \(init_noise=\.\.\., steps=\.\.\.\) "
                      r"are deprecated; pass settings=TuneSettings\("):
        b = tune_many(M, R, A, y, steps=6, init_noise=0.2, **kw)
    assert a[0] == b[0]
    for k in a[1]:
        np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=k)


def test_tune_many_and_the_runs_value_below_it_train_alike(data):
    """``train_runs`` (the runs as one ``TuneRuns`` value) is what ``tune_many`` and ``tune`` call."""
    from mdl_jax.controller.tuning import TuneRuns, train_runs

    M, R, A, y, val = data
    settings = TuneSettings(steps=5)
    w_train = np.where(val > 0, 0.0, 1.0)
    one = tune(M, R, A, y, val=val, settings=settings)
    runs = train_runs(M, R, A, y, TuneRuns(w_train[None], val[None], [FIELD_SETS["gates"]], [0]), settings=settings)
    assert runs[0][0] == one.config
    with pytest.raises(TypeError, match=r"^settings: expected TuneSettings"):
        train_runs(M, R, A, y, TuneRuns(w_train[None], val[None], [FIELD_SETS["gates"]], [0]), settings={"steps": 5})


def test_a_warning_about_the_step_size_names_the_given_optimizer(data):
    """A learning rate is the default optimiser's; a run on another optimiser is told to lower its step."""
    M, R, A, y, _ = data
    with pytest.warns(RuntimeWarning, match=r"adopts (every|no) training record.*the optimizer's step size is too large"):
        tune(M, R, A, y, steps=8, optimizer=optax.sgd(1e4))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(settings={"steps": 3}), TypeError, r"^settings: expected TuneSettings"),
    (dict(step=3), TypeError, r"unexpected keyword argument 'step'"),
    (dict(optimizer="adam"), TypeError, r"^optimizer: expected an optax\.GradientTransformation"),
    (dict(temperature=0.1), ValueError, r"^temperature: expected two positive numbers"),
    (dict(patience=-1), ValueError, r"^patience: expected an int ≥ 0"),
    (dict(steps=0), ValueError, r"^steps: expected a positive int"),
    (dict(learning_rate=0.1, optimizer=optax.sgd(0.1)), ValueError, r"^learning_rate: expected either"),
    (dict(steps=2**40), ValueError, r"^steps: expected a positive int \(at most 2\*\*31 - 1\), got 1099511627776$"),
    (dict(init_noise=True), ValueError, r"^init_noise: expected a finite number ≥ 0, got True$"),
])
def test_bad_settings_are_named(data, kwargs, error, match):
    M, R, A, y, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(error, match=match):
            tune(M, R, A, y, **kwargs)


def test_settings_are_one_hashable_value():
    assert hash(TuneSettings(steps=5)) == hash(TuneSettings(steps=5)) and TuneSettings(steps=5) == TuneSettings(steps=5)
    assert default_optimizer(5) is default_optimizer(5)
    assert TuneSettings(steps=5).resolved_temperature == GeometricTemperature(0.05, 0.002, 5)
    assert TuneSettings(steps=5).final_temperature() == 0.002


@pytest.mark.parametrize("schedule, match", [
    (lambda k: 0.0 * k, r"got τ = 0\.0 at step 0$"),
    (lambda k: 1.0 - 2.0 * k, r"got τ = -1\.0 at step 1$"),
    (lambda k: np.nan + 0.0 * k, r"got τ = nan at step 0$"),
])
def test_a_temperature_schedule_of_a_value_that_is_not_finite_and_positive_is_named(data, schedule, match):
    # τ divides the soft decision: 0 or NaN stopped the run as a "divergence" blamed on the step size,
    # and τ < 0 trained toward the opposite decisions without a sign
    M, R, A, y, _ = data
    with pytest.raises(ValueError, match=r"^temperature: expected a schedule of finite values > 0, " + match):
        tune(M, R, A, y, steps=8, temperature=schedule)


def test_a_temperature_schedule_of_one_value_a_step_in_any_shape_trains_and_more_is_named(data):
    M, R, A, y, _ = data
    one = tune(M, R, A, y, steps=8, temperature=lambda k: jnp.full((1,), 0.05) + 0.0 * k)
    flat = tune(M, R, A, y, steps=8, temperature=lambda k: 0.05 + 0.0 * k)
    for f in ("thresholds", "gate_coeffs", "n_min", "n_max"):  # a (1,) τ a step is that τ (to rounding)
        np.testing.assert_allclose(getattr(one.config, f), getattr(flat.config, f), rtol=1e-5)
    with pytest.raises(ValueError, match=r"^temperature: expected a schedule giving one τ per step, got shape \(8, 2\)"):
        tune(M, R, A, y, steps=8, temperature=lambda k: jnp.full((2,), 0.05) + 0.0 * k)
