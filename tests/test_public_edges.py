"""Regressions from an adversarial probe of the sweep, the ``sweep`` command, ``decide``'s native
kernel and ``distributed.initialize``: each test is one input a demanding user hit, and what it must do."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdl_jax import MDLConfig, config_grid, decide, sweep
from mdl_jax.controller import api
from mdl_jax.controller.stream import sweep_parquet


def _parquet(path, n, seed=0):
    r = np.random.default_rng(seed)
    pq.write_table(pa.table({"M": r.random(n), "R": r.random(n), "A": r.random(n), "adopt": r.random(n) < 0.5}),
                   path)
    return path


def test_sweep_command_creates_the_missing_folders_of_out(tmp_path, capsys):
    # --out passes ``out_file`` (a creatable path) but the command used to open() it directly: a
    # FileNotFoundError traceback, exit 1, after the whole sweep had run.
    from mdl_jax.cli import main

    out = tmp_path / "new" / "deeper" / "grid.csv"
    assert main(["sweep", str(_parquet(tmp_path / "r.parquet", 20)), "--grid", "sigma=0.1,0.2",
                 "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_sweep_command_failing_leaves_no_output_folder_behind(tmp_path, capsys):
    from mdl_jax.cli import main

    out = tmp_path / "new" / "grid.csv"
    assert main(["sweep", str(_parquet(tmp_path / "r.parquet", 20)), "--grid", "sigma=0,0.2",
                 "--out", str(out)]) == 2
    assert not (tmp_path / "new").exists()


def test_an_empty_poisson_resample_is_an_error_naming_bootstrap_not_weight(tmp_path, capsys):
    # One record, 10 Poisson(1) resamples: some draw nothing (seed 0: 3 of them). The error named the
    # "weight" column, which the caller never gave.
    path = _parquet(tmp_path / "one.parquet", 1)
    with pytest.raises(ValueError, match=r"^bootstrap: 3 of 10 Poisson resamples drew no record"):
        sweep_parquet(path, MDLConfig(), bootstrap=10, seed=0)
    from mdl_jax.cli import main

    assert main(["sweep", str(path), "--grid", "sigma=0.1", "--bootstrap", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mdl-jax: error: sweep: bootstrap:")
    # a weight column of zeros is still the weight column's error
    pq.write_table(pa.table({"M": [0.5], "R": [0.5], "A": [0.5], "w": [0.0]}), tmp_path / "w.parquet")
    with pytest.raises(ValueError, match=r"^weight:"):
        sweep_parquet(tmp_path / "w.parquet", MDLConfig(), columns={"weight": "w"}, bootstrap=2)


@pytest.mark.parametrize("address", ["notahost", "host:", ":1234", "host:port", 1234])
def test_initialize_rejects_an_address_without_host_and_port_naming_the_argument(address):
    # jax.distributed.initialize("notahost", ...) died in an IndexError inside JAX. The check runs
    # before any JAX state is touched, so this process stays usable.
    from mdl_jax.controller import distributed

    with pytest.raises(ValueError, match=r"^coordinator_address: expected 'HOST:PORT'"):
        distributed.initialize(address, num_processes=1, process_id=0)


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
    want = api._decide_jit(M, R, A, cfg)
    for f in got._fields:
        g, w = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
        assert np.all(np.isfinite(g)) and np.all(np.isfinite(w)), f
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=f)
    ref = sweep(M, R, A, config_grid(MDLConfig(), sigma=[sigma, 0.1]), engine="jax")
    np.testing.assert_array_equal(res.counts, ref.counts)
    np.testing.assert_allclose(res.mean_C_final, ref.mean_C_final, atol=1e-6)


def test_a_grid_of_bias_vectors_of_the_wrong_length_names_bias_and_d():
    # config_grid(bias=[np.zeros(5)]) failed inside NumPy: "could not broadcast input array from shape
    # (1,5) into shape (1,16)", naming neither the field nor D.
    with pytest.raises(ValueError, match=r"^bias: expected scalars or vectors of D = 16 values, got shape \(1, 5\)"):
        config_grid(MDLConfig(), bias=[np.zeros(5)])
    assert config_grid(MDLConfig(), bias=[np.zeros(16), np.ones(16)]).bias.shape == (2, 16)


def test_poisson_weights_for_few_rows_hold_no_full_block_of_every_resample():
    # --bootstrap W drew a (W, 2^16) int64 block per 2^16 rows even for a 1-row file: 5 GB at W = 10^4.
    # Row by row the same generator gives the same numbers (the weights are unchanged) in O(2^16) memory.
    import tracemalloc

    from mdl_jax.controller.stream import POISSON_BLOCK, poisson_weights

    want = np.random.default_rng([5, 1]).poisson(1.0, (4, POISSON_BLOCK))[:, 10:20]
    np.testing.assert_array_equal(poisson_weights(POISSON_BLOCK + 10, POISSON_BLOCK + 20, 4, seed=5), want)
    tracemalloc.start()
    try:
        poisson_weights(0, 1, 200, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak   # the (200, 2^16) int64 block alone was 105 MB


def test_decide_takes_big_endian_arrays_and_equals_native_byte_order():
    # A '>f4' array (a binary file, FITS, the network) was refused as "expected a number or an array
    # of real numbers" because JAX does not take a non-native byte order.
    r = np.random.default_rng(0)
    M, R, A = (r.random(37).astype(np.float32) for _ in range(3))
    got = decide(M.astype(">f4"), R.astype(">f8"), A, MDLConfig())
    want = decide(M, R.astype(np.float64), A, MDLConfig())
    for f in got._fields:
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)), err_msg=f)


def test_sweep_parquet_dropping_a_signal_role_or_huge_integer_weights_with_bootstrap(tmp_path):
    # columns={"M": None} was a KeyError 'M'; an int64 weight column of 2^62 times a Poisson
    # multiplicity ≥ 2 wrapped to negative weights ("every weight vector needs a positive total").
    r = np.random.default_rng(0)
    n = 50
    M, R, A = r.random(n), r.random(n), r.random(n)
    path = tmp_path / "w.parquet"
    pq.write_table(pa.table({"M": M, "R": R, "A": A, "w": np.full(n, 2 ** 62, np.int64)}), path)
    with pytest.raises(ValueError, match=r"^columns: role 'M' cannot be dropped"):
        sweep_parquet(path, MDLConfig(), columns={"M": None})
    res = sweep_parquet(path, MDLConfig(), columns={"weight": "w"}, bootstrap=3, seed=0)
    from mdl_jax.controller.stream import poisson_weights

    w = poisson_weights(0, n, 3, seed=0).astype(np.float64) * 2.0 ** 62
    want = sweep(M, R, A, MDLConfig(), weights=w)
    np.testing.assert_allclose(res.total, want.total, rtol=1e-12)
    np.testing.assert_allclose(res.counts, want.counts, rtol=1e-6)
    assert np.all(res.total > 0)


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


def test_sweep_command_refuses_a_grid_too_large_for_memory_in_one_line(tmp_path, capsys):
    # --grid g_a=0:1:100000 --grid g_b=0:1:100000 (10^10 configs) died in a 74.5 GiB MemoryError
    # traceback; a COUNT of 10^9 allocated 8 GB at parse time.
    from mdl_jax.cli import main

    path = str(_parquet(tmp_path / "r.parquet", 10))
    for grid in (["g_a=0:1:100000", "g_b=0:1:100000"], ["sigma=0.1:1:1000000000"]):
        argv = ["sweep", path] + [x for g in grid for x in ("--grid", g)]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mdl-jax: error: sweep:") and "10,000,000" in err[0], err
