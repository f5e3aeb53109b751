"""Calibration (``mdl_jax.controller.calibration``): the norm range and the grid search of Section 3.4,
ties broken by the stated rule, a constant optimum warned of, labels and signals checked by argument,
exact counts where float32 shares coincide, and memory linear in N."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mdl_jax
from mdl_jax import calibrate, decide
from mdl_jax.controller.calibration import tied_plateau
from tests.peak_rss import PEAK_RSS_FUNCS, peak_growth_mb


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


def test_calibrate_scalar_labels_or_signals_raise_value_error_naming_the_argument(rng):
    M, R, A = rng.uniform(size=(3, 20))
    y = (M > 0.5).astype(int)
    with pytest.raises(ValueError, match=r"^adopt: expected a 1-d"):
        calibrate(M, R, A, 1)
    with pytest.raises(ValueError, match=r"^M: expected a 1-d"):
        calibrate(0.5, 0.5, 0.5, y)
    with pytest.raises(ValueError, match=r"^adopt: expected binary labels.*adopt\[3\]"):
        calibrate(M, R, A, np.where(np.arange(20) == 3, np.nan, y))
    with pytest.raises(ValueError, match=r"^adopt: .*dtype <U"):
        calibrate(M, R, A, np.array(["yes"] * 20))
    # a grid past its bound is named before anything is allocated (10^12 candidates were 7 TiB)
    with pytest.raises(ValueError, match=r"^grid_size: expected an int in \[2, 10,000,000\], got 1000000000000"):
        calibrate(M, R, A, y, grid_size=10**12)


def test_boolean_labels_and_bfloat16_signals_are_valid(rng):
    M, R, A = rng.uniform(size=(3, 60)).astype(np.float32)
    y = (M > 0.5) & (A < 0.6)
    as_int = calibrate(M, R, A, y.astype(np.int32))
    as_bool = calibrate(M, R, A, y)
    assert as_bool.config.thresholds == as_int.config.thresholds
    bf = [jnp.asarray(x, jnp.bfloat16) for x in (M, R, A)]
    cal = calibrate(*bf, y)
    assert np.isfinite(cal.best_agreement) and cal.config.n_max > cal.config.n_min
    out = decide(*bf)
    assert out.C_final.dtype == jnp.float32  # computed in float32, never in bfloat16
    assert all(np.all(np.isfinite(np.asarray(f, np.float32))) for f in out)


_CALIBRATE_MEMORY = PEAK_RSS_FUNCS + """
    import sys, warnings
    import numpy as np
    from mdl_jax.controller.calibration import calibrate
    warnings.simplefilter("ignore")
    N = int(sys.argv[1])
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(3, N)).astype(np.float32)
    lab = rng.uniform(size=N) < 0.5
    calibrate(*x[:, :100], lab[:100])
    base = reset_peak()
    calibrate(*x, lab)
    print(hwm() - base)
"""


def test_calibrate_memory_is_linear_in_n():
    """The 1,001-point grid was a (1001, N) comparison matrix: +400 MB at N = 10^5 (+3.9 GB at
    10^6). Counted from one sort, the growth is two decide calls' outputs (~112 B a record) and the
    sort: 42-53 MB at N = 10^5 on an idle machine (~400 MB before). The bound is 150 MB: the window
    holds the compilation of the N = 10^5 program too, whose peak varies with how XLA's threads are
    scheduled (83 MB seen beside other test processes on 2 cores); the quadratic matrix stays far past it."""
    grew = peak_growth_mb(_CALIBRATE_MEMORY, 100_000)
    assert grew < 150, f"calibrate at N = 1e5 grew the peak RSS by {grew:.0f} MB"


def _old_grid_agreement(C_final, adopt, grid):
    pred = C_final[None, :] >= grid[:, None]
    return jnp.mean(pred == adopt[None, :].astype(bool), axis=1)


def _old_grid_counts(C_final, adopt, grid):
    pred = C_final[None, :] >= grid[:, None]
    return jnp.sum(pred == adopt[None, :].astype(bool), axis=1, dtype=jnp.int32)


@pytest.mark.parametrize("kind", ["uniform", "ties", "on the grid", "constant"])
def test_calibrate_equals_the_comparison_matrix_bit_for_bit(kind, monkeypatch):
    from mdl_jax.controller import calibration as cal

    rng = np.random.default_rng(7)
    N = 3001
    c = rng.uniform(size=N).astype(np.float32)
    if kind == "ties":
        c = (np.round(c * 7) / 7).astype(np.float32)
    elif kind == "on the grid":   # C_final exactly on grid values: the ≥ at every tie
        c = np.linspace(0, 1, 1001)[rng.integers(0, 1001, N)].astype(np.float32)
    elif kind == "constant":
        c = np.full(N, 0.5, np.float32)
    lab = rng.uniform(size=N) < 0.4
    grid = jnp.asarray(np.linspace(0, 1, 1001), jnp.float32)
    new = np.asarray(cal.grid_agreement(c, lab, grid))
    old = np.asarray(jax.jit(_old_grid_agreement)(c, lab, grid))
    assert new.dtype == old.dtype and np.array_equal(new, old)
    assert np.array_equal(np.asarray(cal.grid_counts(c, lab, grid)), np.asarray(jax.jit(_old_grid_counts)(c, lab, grid)))
    if kind != "uniform":
        return
    # the whole calibration, plateau and tie outputs included, on real signals
    x = rng.uniform(size=(3, 400)).astype(np.float32)
    y = rng.uniform(size=400) < 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a random split may warn of a constant optimum
        a = cal.calibrate(*x, y)
        monkeypatch.setattr(cal, "grid_counts", jax.jit(_old_grid_counts))
        b = cal.calibrate(*x, y)
    assert np.array_equal(a.agreement, b.agreement)
    assert a[3:] == b[3:] and a.config == b.config


def test_calibrate_chooses_on_exact_counts_where_float32_shares_coincide(monkeypatch):
    """Above 2**24 records two agreement counts can round to one float32 share; θ0 and ``constant``
    are decided on the counts. Shown on 3 records with counts that float32 shares of N = 2**25 tie."""
    from mdl_jax.controller import calibration as cal

    n_big = 2 ** 25
    big = jnp.asarray([n_big // 4, 3 * n_big // 4 - 1, 3 * n_big // 4], jnp.int32)   # θ0 = 1.0 has one more
    assert np.asarray(cal._share(big, n_big))[1] == np.asarray(cal._share(big, n_big))[2]
    monkeypatch.setattr(cal, "grid_counts", lambda c, a, g: big)
    monkeypatch.setattr(cal, "_share", lambda counts, n: cal.jnp.asarray(counts, jnp.float32) / n_big)
    x = np.full((3, 4), 0.5, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = cal.calibrate(*x, np.array([1, 0, 1, 0]), grid_size=3)
    assert c.config.thresholds[0] == 1.0 and c.n_tied == 1


def test_tie_break_takes_the_middle_of_the_widest_tied_run():
    agreement = np.full(101, 0.4)
    agreement[20:31] = 0.6   # 11 tied values: the widest run, middle at 25
    agreement[90:96] = 0.6   # 6 tied values
    pick, tied = tied_plateau(agreement, "middle")
    assert pick == 25 and len(tied) == 17 and tied[0] == 20 and tied[-1] == 95
    assert tied_plateau(agreement, "lowest")[0] == 20
    agreement[90:101] = 0.6  # two equally wide runs (11 each): the lower one wins
    assert tied_plateau(agreement, "middle")[0] == 25
    agreement[10:12] = 0.6   # an even-length run picks its lower middle
    agreement[20:31] = 0.4
    agreement[90:101] = 0.4
    assert tied_plateau(agreement, "middle")[0] == 10


def test_calibrate_reports_the_plateau_and_its_rule(rng):
    M, R, A = rng.uniform(size=(3, 60)).astype(np.float32)
    adopt = ((M > 0.5) & (A < 0.6)).astype(np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mid = calibrate(M, R, A, adopt, grid_size=501)
        low = calibrate(M, R, A, adopt, grid_size=501, tie_break="lowest")
    tied = mid.grid[mid.agreement == mid.agreement.max()]
    assert mid.n_tied == len(tied) and mid.plateau == (tied[0], tied[-1])
    assert low.config.thresholds[0] == tied[0] == mid.theta0_lowest == low.theta0_lowest
    assert mid.config.thresholds[0] == mid.theta0_middle and mid.theta0_middle in tied
    assert mid.tie_break == "middle" and low.tie_break == "lowest"
    with pytest.raises(ValueError, match="tie_break"):
        calibrate(M, R, A, adopt, tie_break="highest")


def test_calibrate_warns_when_the_optimum_is_a_constant_classifier(rng):
    M, R, A = rng.uniform(size=(3, 40)).astype(np.float32)
    with pytest.warns(UserWarning, match="constant classifier 'never adopt'"):
        cal = calibrate(M, R, A, np.zeros(40, np.int32))
    assert cal.constant == "never adopt" and cal.best_agreement == 1.0
    with pytest.warns(UserWarning, match="always adopt"):
        assert calibrate(M, R, A, np.ones(40, np.int32)).constant == "always adopt"
    # informative labels: no warning, no constant
    adopt = (M > np.median(M)).astype(np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        cal = calibrate(M, np.full(40, 0.5, np.float32), np.full(40, 0.2, np.float32), adopt)
    assert cal.constant is None and cal.best_agreement > 0.5
    # θ2 = max(θ0 − 0.4, 0) = 0 leaves Opt-Out unreachable, and calibration says so
    assert cal.opt_out_possible == (cal.config.thresholds[2] > 0)


def _all_adopt_calibration(rng):
    # Every label adopt: θ0 = 0 is the best threshold (the least-norm record has C = 0, so C_final = 0)
    M, R, A = rng.uniform(size=(3, 40)).astype(np.float32)
    with pytest.warns(UserWarning, match="always adopt"):
        cal = calibrate(M, R, A, np.ones(40, np.int32))
    return cal, np.asarray(mdl_jax.decide(M, R, A, cal.config).action), np.asarray(
        mdl_jax.decide(M, R, A, cal.config).C_final)


def test_adopt_share_counts_a_record_on_theta0_as_active(rng):
    cal, action, c_final = _all_adopt_calibration(rng)
    assert cal.config.thresholds[0] == 0.0 and c_final.min() == 0.0   # a record exactly on θ0
    assert cal.adopt_share == np.mean(action == 0) == 1.0


def test_a_calibration_whose_theta2_is_zero_says_it_cannot_opt_out(rng):
    cal, action, _ = _all_adopt_calibration(rng)
    assert cal.config.thresholds[2] == 0.0 and cal.opt_out_possible is False
    assert not np.any(action == 3)


def test_a_split_of_identical_records_gets_a_range_of_one_around_its_norm_so_c_is_one_half():
    x = np.full(10, 0.4, np.float32)
    with pytest.warns(UserWarning, match="constant classifier"):   # identical records: no threshold helps
        cal = calibrate(x, x, x, np.arange(10) % 2)
    d = mdl_jax.decide(x, x, x, cal.config)
    norm = float(np.asarray(d.norm)[0])
    assert (cal.config.n_min, cal.config.n_max) == pytest.approx((norm - 0.5, norm + 0.5), abs=1e-6)
    np.testing.assert_allclose(np.asarray(d.C), 0.5, atol=1e-6)
