"""Sweeps, config files and the API under hostile input.

Each test is a regression test for one finding of the issue (checked to fail on the code before the
fix): ties at a threshold on every path, calibration and bootstrap-sweep memory, weights past int64's
reach, corrupt Parquet pages, and config files with duplicate keys, a huge D, huge numbers or new
content under an old size and mtime.
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mdl_jax import MDLConfig, decide, decide_one, stack_configs, sweep
from mdl_jax.controller import api
from mdl_jax.controller import decision as _d
from mdl_jax.engines import fused
from tests.xla_cache import without_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------ ties
# Records whose C and α every path computes exactly: no value encoding (v = s·1, no exp), fusion gains
# so large that every |z_i| > 20 and tanh saturates to ±1 (‖v_meta‖ = 4, C = (4 - 0)/(4 - 0) = 1),
# M = 0.5 (‖v_wm‖ = 2), so α = Σ sign(z_i)/16 exactly. The only rounding left is the gate's
# g_a + g_b·α, which a compiler may contract into one FMA (one rounding instead of two) in some
# paths and not others: XLA:CPU does inside a jitted fusion, never between eager ops, and g++ did in
# the native kernel. θ0 = θ1 = θ2 = that C_final with two roundings (what eager decide_one and NumPy
# compute), so every path must say Active (ties take the higher action).
_TIE_BIAS = tuple(float(x) for x in -np.linspace(5, 455, 16))
_TIE_BASE = MDLConfig(value_encoding=False, eps_c=0.0, gains=(300.0, 300.0, 300.0), n_min=0.0, n_max=4.0,
                      bias=_TIE_BIAS)


def _tie_records(n=12, seed=0):
    W = np.asarray(_d.weight_matrices(_TIE_BASE, jnp.float32), np.float64)
    recs = []
    for R in np.linspace(0.0, 1.0, 41, dtype=np.float32):
        for A in np.linspace(0.0, 1.0, 41, dtype=np.float32):
            sa = 1.0 - float(A)
            z = (0.5 + 0.5 * sa) * W[0].sum(1) * 0.5 + W[1].sum(1) * float(R) + W[2].sum(1) * sa + _TIE_BIAS
            # α = Σ sign/16 whose numerator is not a power of two (3/4, 5/8, 3/8: g_b·α is inexact)
            if np.min(np.abs(z)) > 20 and abs(int(np.sign(z).sum())) // 2 not in (0, 1, 2, 4, 8):
                recs.append((np.float32(0.5), R, A, np.float32(np.sign(z).sum() / 16)))
    rng = np.random.default_rng(seed)
    pick = [recs[i] for i in rng.choice(len(recs), n, replace=False)]
    cfgs, x = [], []
    for m, r, a, alpha in pick:
        for _ in range(10_000):   # gates where one FMA rounds below the two roundings: a contracting path says Supp
            g_a, g_b = np.float32(rng.uniform(0.8, 1.0)), np.float32(rng.uniform(0.3, 1.0))   # C_final > 0
            c_final = np.float32(g_a + np.float32(g_b * alpha))   # two roundings (NumPy never contracts)
            fma = np.float32(np.float64(g_b) * np.float64(alpha) + np.float64(g_a))   # (exact product)
            if fma < c_final:
                break
        else:
            raise AssertionError(f"no gate found for α = {alpha}")
        th = float(c_final)
        cfgs.append(_TIE_BASE.replace(gate_coeffs=(float(g_a), float(g_b)), thresholds=(th, th, th)))
        x.append((m, r, a))
    return np.array(x, np.float32).T, cfgs


@pytest.mark.slow
def test_ties_on_a_threshold_take_the_same_action_on_every_path(monkeypatch):
    """C_final exactly on θ0 = θ1 = θ2 is Active on eager decide_one, jitted decide_one, decide (every
    engine: the pure-JAX default, native, pallas in interpret mode) and the three sweep engines."""
    monkeypatch.setenv(fused.ENV_SWITCH, "interpret")   # the pallas engine by name on this CPU
    x, cfgs = _tie_records()
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
        paths["decide (pure JAX)"].append(int(api._decide_jit(*map(jnp.asarray, col), cfg).action[0]))
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
    for out in (decide(*x, cfg), decide(*x, cfg, engine="native"), api._decide_jit(*map(jnp.asarray, x), cfg),
                fused.decide(*map(jnp.asarray, x), cfg, interpret=True)):
        assert np.all(np.asarray(out.C_final) == np.float32(0.7)) and np.all(np.asarray(out.action) == 0)


# ------------------------------------------------------------------------------------ memory
def _peak_growth_mb(script: str, *args) -> float:
    """Run ``script`` in a fresh interpreter; it prints the growth of its peak RSS (MB) on the last
    line, measured around the call under test after a warm-up (compilation) call."""
    env = dict(without_cache(os.environ), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


_PEAK = """
    def reset_peak():
        # the peak RSS (VmHWM) reset to the current RSS (Linux: clear_refs 5), so the growth measured
        # is the call's own, not a peak left by the set-up
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return hwm()

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
"""


_CALIBRATE_MEMORY = _PEAK + """
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
    sort: under 80 MB at N = 10^5 (~400 MB before)."""
    grew = _peak_growth_mb(_CALIBRATE_MEMORY, 100_000)
    assert grew < 80, f"calibrate at N = 1e5 grew the peak RSS by {grew:.0f} MB"


def _old_grid_agreement(C_final, adopt, grid):
    pred = C_final[None, :] >= grid[:, None]
    return jnp.mean(pred == adopt[None, :].astype(bool), axis=1)


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
    if kind != "uniform":
        return
    # the whole calibration, plateau and tie outputs included, on real signals
    x = rng.uniform(size=(3, 400)).astype(np.float32)
    y = rng.uniform(size=400) < 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a random split may warn of a constant optimum
        a = cal.calibrate(*x, y)
        monkeypatch.setattr(cal, "grid_agreement", jax.jit(_old_grid_agreement))
        b = cal.calibrate(*x, y)
    assert np.array_equal(a.agreement, b.agreement)
    assert a[3:] == b[3:] and a.config == b.config



_SWEEP_MEMORY = _PEAK + """
    import sys
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    from mdl_jax.cli import main
    from mdl_jax.controller import sweep as sw
    N, W, bound, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(3, N)).astype(np.float32)
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2], "adopt": rng.uniform(size=N) < 0.5}), path)
    sw.MEMORY_BOUND = bound
    args = ["sweep", path, "--grid", "g_a=0.2,0.4", "--out", path + ".csv", "--bootstrap"]
    assert main(args + ["2"]) == 0
    base = reset_peak()
    assert main(args + [str(W)]) == 0
    print(hwm() - base)
"""


def test_bootstrap_sweep_memory_stays_under_the_bound(tmp_path):
    """`mdl-jax sweep --bootstrap W` held W × 2^18 records' weights per pass, in several copies (7 GB at
    W = 1000). Passes are now cut to MEMORY_BOUND: at 64 MiB, 2^16 records and W = 64 grow the peak by
    ~50 MB (137 MB before)."""
    bound = 64 << 20
    grew = _peak_growth_mb(_SWEEP_MEMORY, 1 << 16, 64, bound, tmp_path / "r.parquet")
    assert grew < 1.3 * bound / 2**20 + 8, f"peak RSS grew by {grew:.0f} MB under a {bound >> 20} MiB bound"


def test_bounded_passes_give_the_same_bootstrap_sweep(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mdl_jax import config_grid
    from mdl_jax.controller import sweep as sw
    from mdl_jax.controller.stream import sweep_parquet

    rng = np.random.default_rng(3)
    N = 70_000   # two Poisson blocks: passes cross a block boundary
    x = rng.uniform(size=(3, N)).astype(np.float32)
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2], "adopt": rng.uniform(size=N) < 0.5}), path,
                   row_group_size=30_000)
    grid = config_grid(g_a=[0.2, 0.4])
    ref = sweep_parquet(path, grid, bootstrap=16, seed=5, engine="native")
    monkeypatch.setattr(sw, "MEMORY_BOUND", 8 << 20)   # passes of ~6,000 records, the block kept
    assert sw.bounded_chunk(sw.RECORD_CHUNK, 2, 16) < 10_000
    got = sweep_parquet(path, grid, bootstrap=16, seed=5, engine="native")
    assert np.array_equal(got.accuracy, ref.accuracy) and np.array_equal(got.counts, ref.counts)
    np.testing.assert_allclose(got.mean_C_final, ref.mean_C_final, rtol=1e-6)


def test_a_sweep_too_big_for_the_bound_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mdl_jax.cli import main
    from mdl_jax.controller import sweep as sw

    x = np.random.default_rng(0).uniform(size=(3, 50)).astype(np.float32)
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2]}), path)
    monkeypatch.setattr(sw, "MEMORY_BOUND", 1 << 20)
    assert main(["sweep", str(path), "--grid", "g_a=0:1:50", "--bootstrap", "200"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdl-jax: error: sweep: bootstrap:") and "MEMORY_BOUND" in err and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="weights: .*memory bound"):
        sweep(*x, stack_configs([MDLConfig()] * 50), weights=np.ones((200, 50), np.float32))


# ------------------------------------------------------------------------------------ weights and signals
def test_64_bit_integer_signals_are_not_wrapped_to_int32():
    """Without x64 JAX wrapped int64 2^62 to int32 0, a valid signal: checked_decide passed it."""
    from mdl_jax import checked_decide

    half = np.full(2, 0.5, np.float32)
    for M in (np.array([2**62, 0], np.int64), np.array([2**63 + 1, 0], np.uint64)):
        err, _ = checked_decide(M, half, half)
        assert err.get() is not None and "M[flat index 0]" in err.get()
        with pytest.raises(ValueError, match=r"M\[0\]"):
            decide(M, half, half)


@pytest.mark.parametrize("engine", ["jax", "native"])
def test_weights_of_2_to_the_62_and_uint64_2_to_the_63_sum_exactly(engine):
    x = np.random.default_rng(0).uniform(size=(3, 12)).astype(np.float32)
    adopt = np.arange(12) % 2
    one = sweep(*x, MDLConfig(), adopt=adopt, engine=engine)
    for w in (np.full(12, 2**62, np.int64), np.full((2, 12), 2**63 + 1, np.uint64)):
        res = sweep(*x, MDLConfig(), adopt=adopt, weights=w, engine=engine)
        acc = np.asarray(res.accuracy).reshape(-1)
        assert np.all(np.isfinite(acc)) and np.allclose(acc, one.accuracy)
        np.testing.assert_allclose(np.asarray(res.counts).reshape(-1, 4) / float(w.flat[0]),
                                   np.broadcast_to(one.counts, (acc.size, 4)), rtol=1e-12)


# ------------------------------------------------------------------------------------ Parquet
@pytest.mark.parametrize("offset", [20, 30, 50, 100])
def test_a_corrupt_parquet_page_is_one_error_line(tmp_path, offset, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mdl_jax.cli import main
    from mdl_jax.controller.stream import sweep_parquet

    x = np.random.default_rng(0).uniform(size=(3, 5000)).astype(np.float32)
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"M": x[0], "R": x[1], "A": x[2]}), path, compression="snappy")
    start = pq.ParquetFile(path).metadata.row_group(0).column(1).data_page_offset
    data = bytearray(path.read_bytes())
    for i in range(start + offset, start + offset + 16):   # the page header or the snappy stream of R
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="row group 0 cannot be read"):
        sweep_parquet(path, MDLConfig())
    assert main(["sweep", str(path), "--grid", "g_a=0.3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdl-jax: error: sweep: path:") and len(err.splitlines()) == 1


# ------------------------------------------------------------------------------------ config files
def _config_text(**static) -> str:
    from mdl_jax.controller.config_file import config_to_dict

    d = config_to_dict(MDLConfig())
    d["static"].update(static)
    return json.dumps(d, indent=1)


def _refused(tmp_path, text: str, match: str, capsys):
    from mdl_jax import load_config
    from mdl_jax.cli import main
    from mdl_jax.controller.config_file import ConfigFileError

    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigFileError, match=match):
        load_config(path)
    with pytest.raises(ConfigFileError, match=match):
        decide(0.5, 0.5, 0.5, str(path))
    records = tmp_path / "r.parquet"
    if not records.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"M": [0.5], "R": [0.5], "A": [0.5]}), records)
    assert main(["sweep", str(records), "--grid", "g_a=0.3", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdl-jax: error: sweep:") and len(err.splitlines()) == 1 and str(path) in err


def test_a_duplicate_key_in_a_config_file_is_refused(tmp_path, capsys):
    text = _config_text().replace('"numeric": {', '"numeric": {\n  "thresholds": [0.9, 0.8, 0.7],', 1)
    assert json.loads(text)["numeric"]["thresholds"] == [0.6, 0.4, 0.2]   # JSON alone: the last wins
    _refused(tmp_path, text, r"thresholds: stated twice", capsys)


def test_a_config_file_d_over_max_d_is_refused(tmp_path, capsys):
    from mdl_jax.controller.config_file import MAX_D, config_from_bytes

    text = _config_text(D=4096, dims=[1000, 1000, 2096])
    assert len(text) < 2000
    _refused(tmp_path, text, rf"static\.D: 4096 is over .* {MAX_D}", capsys)
    # D = MAX_D itself loads
    assert config_from_bytes(_config_text(D=MAX_D, dims=[100, 100, MAX_D - 200]).encode()).D == MAX_D


def test_a_5000_digit_number_in_a_config_file_is_refused_naming_the_bound(tmp_path, capsys):
    text = _config_text().replace('"qr_seed": 42', '"qr_seed": ' + "4" * 5000)
    _refused(tmp_path, text, r"a number of 5,000 characters .* at most 800", capsys)
    text = _config_text().replace('"n_min": 2.179652452468872', '"n_min": 2.' + "1" * 5000)
    _refused(tmp_path, text, r"a number of 5,002 characters", capsys)


def test_a_config_file_replaced_with_its_size_and_mtime_kept_is_read_anew(tmp_path):
    from mdl_jax import save_config

    path = tmp_path / "c.json"
    hi, lo = MDLConfig(thresholds=(0.9, 0.8, 0.7)), MDLConfig(thresholds=(0.1, 0.0, 0.0))
    save_config(lo, path)
    text_lo = path.read_text()
    save_config(hi, path)
    st = os.stat(path)
    assert len(path.read_text()) == len(text_lo)
    x = np.full(3, 0.5, np.float32)
    assert int(decide(0.5, 0.5, 0.5, str(path)).action) == 3 and int(decide(x, x, x, str(path)).action[0]) == 3
    path.write_text(text_lo)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))   # cp -p / rsync -t / tar x
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert int(decide(0.5, 0.5, 0.5, str(path)).action) == 0 and int(decide(x, x, x, str(path)).action[0]) == 0
