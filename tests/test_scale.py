"""Past one device and one machine: the 2-D (batch, records) mesh, Parquet streams,
and multi-process sweeps through jax.distributed, each against the one-device, in-memory result."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdl_jax import MDLConfig, config_grid, sweep
from mdl_jax.controller.mesh import check_mesh_shape, mesh_shape
from mdl_jax.controller.stream import poisson_weights, sweep_parquet
from tests.devices import ROOT, run_on_forced_devices

N = 1001
# (1, 1) first: one device, the reference. None: the default, (2, 2) for K = 6 on 4 devices.
SWEEP_SHAPES = [(1, 1), None, (1, 4), (4, 1), (1, 2)]
TUNE_SHAPES = [(1, 1), (2, 2)]

# The same records, grid and runs in this process (one device) and in the forced-device subprocess.
SETUP = (
    "import numpy as np\n"
    "from mdl_jax import MDLConfig, config_grid, decide, sweep, bootstrap_weights\n"
    "from mdl_jax.controller.tuning import tune_many, FIELD_SETS, TuneSettings\n"
    f"N = {N}\n"
    "rng = np.random.default_rng(5); M, R, A = rng.uniform(size=(3, N)).astype(np.float32)\n"
    "adopt = rng.integers(0, 2, N)\n"
    "grid = config_grid(MDLConfig(), g_a=np.linspace(0, 1, 3), g_b=[0.2, 0.9])\n"
    "W = bootstrap_weights(N, 3, 1)\n"
    "y = (np.asarray(decide(M, R, A, MDLConfig(gate_coeffs=(0.1, 0.9))).action) == 0).astype(int)\n"
    "wt = np.stack([(np.arange(N) % 3 != f).astype(np.float32) for f in range(3)])\n"
    "def sweep_row(shape):\n"
    "    r = sweep(M, R, A, grid, adopt=adopt, weights=W, engine='jax', mesh_shape=shape, record_chunk=300)\n"
    "    return np.concatenate([r.accuracy.ravel(), r.counts.ravel(), r.mean_C_final.ravel()])\n"
    "def tune_row(shape):\n"
    "    cfgs, h = tune_many(M, R, A, y, train_weights=wt, val_weights=np.zeros_like(wt), seeds=[0, 1, 2],\n"
    "                        settings=TuneSettings(steps=30), field_sets=[FIELD_SETS['gates']] * 3, mesh_shape=shape)\n"
    "    return np.concatenate([np.ravel([c.gate_coeffs + c.thresholds + (c.sigma,) for c in cfgs]),\n"
    "                           h['train_accuracy'][:, -1]])\n"
)


def test_mesh_shape_shards_configs_first_and_records_when_the_batch_is_small():
    assert mesh_shape(4, 441, 2**18) == (4, 1)
    assert mesh_shape(4, 1, 2**18) == (1, 4)
    assert mesh_shape(4, 6, 2**18) == (2, 2)          # 3 configs × N/2 beats 2 × N (padded to 8)
    assert mesh_shape(4, [2, 1], 401) == (1, 4)       # tuning groups, each padded to whole shards
    assert mesh_shape(1, 7, 10) == (1, 1)
    with pytest.raises(ValueError, match=r"mesh_shape: 2 × 2 = 4 devices, but only 1 local device is"):
        check_mesh_shape((2, 2), 1)
    with pytest.raises(ValueError, match="mesh_shape: expected two positive ints"):
        check_mesh_shape((0, 1), 4)
    with pytest.raises(ValueError, match="mesh_shape: expected two positive ints"):
        sweep(np.full(3, 0.5), np.full(3, 0.5), np.full(3, 0.5), MDLConfig(), mesh_shape="2x2")
    from mdl_jax.controller.sweep import engine_for_mesh  # a mesh asks for the jax engine

    assert engine_for_mesh("auto", (1, 2)) == "jax" and engine_for_mesh("auto", None) == "auto"
    with pytest.raises(ValueError, match="mesh_shape: only the jax engine runs on a device mesh"):
        engine_for_mesh("native", (1, 1))


@pytest.mark.slow
def test_sweep_and_tune_many_on_2d_meshes_of_four_and_two_devices_equal_one_device(tmp_path):
    """Configs, records or both sharded over 4 forced CPU devices (and over 2 of them) give the
    one-device numbers (a (1, 1) mesh in the same process): counts and accuracies exactly, C_final
    means and tuned configs to float32 rounding. One subprocess: each tuning mesh compiles for ~4 s."""
    code = (SETUP + "import sys, jax\n"
            f"rows = [sweep_row(s) for s in {SWEEP_SHAPES}] + [tune_row(s) for s in {TUNE_SHAPES}]\n"
            "np.save(sys.argv[1], np.concatenate(rows))\n"
            "print(jax.device_count())\n")
    flat = run_on_forced_devices(code, 4, tmp_path)
    n_s, n_t = len(SWEEP_SHAPES), len(TUNE_SHAPES)
    K, W, runs = 6, 3, 3
    sweep_size, tune_size = K * W * 6, runs * 6 + runs   # (acc, 4 counts, C_final); (g, θ, σ), val acc
    assert flat.size == n_s * sweep_size + n_t * tune_size
    sweeps = flat[:n_s * sweep_size].reshape(n_s, -1)
    tunes = flat[n_s * sweep_size:].reshape(n_t, -1)
    exact = K * W * 5                             # accuracy and counts: integer sums
    for row in sweeps[1:]:
        np.testing.assert_array_equal(row[:exact], sweeps[0, :exact])
        np.testing.assert_allclose(row[exact:], sweeps[0, exact:], rtol=0, atol=1e-6)
    for row in tunes[1:]:
        np.testing.assert_allclose(row, tunes[0], rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(flat)) and np.all(sweeps[0, :K * W] > 0.3)
    assert np.abs(tunes[0, :2] - (0.3, 0.7)).max() > 1e-3   # the runs trained: the gates moved


def _write(path, M, R, A, adopt, weight=None, row_group_size=3000):
    cols = {"M": M, "R": R, "A": A, "adopt": adopt}
    if weight is not None:
        cols["w"] = weight
    pq.write_table(pa.table(cols), path, row_group_size=row_group_size)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    rng = np.random.default_rng(3)
    n = 20_011
    M, R, A = rng.uniform(size=(3, n)).astype(np.float32)
    adopt = rng.integers(0, 2, n).astype(bool)
    weight = rng.integers(0, 4, n).astype(np.int64)
    path = tmp_path_factory.mktemp("stream") / "records.parquet"
    _write(path, M, R, A, adopt, weight)
    return path, M, R, A, adopt, weight


@pytest.mark.slow
def test_sweep_parquet_equals_sweep_on_the_same_records_and_weights(records):
    """Streamed in passes that cut across row groups: the in-memory sweep's integer sums exactly,
    unweighted, and with a weight column times Poisson resamples keyed by row (any batch size)."""
    path, M, R, A, adopt, weight = records
    grid = config_grid(MDLConfig(), g_a=[0.1, 0.5, 0.9], g_b=[0.3, 0.9])
    n = len(M)
    pw = poisson_weights(0, n, 4, seed=11)
    np.testing.assert_array_equal(pw[:, 5000:7000], poisson_weights(5000, 7000, 4, seed=11))
    cases = [({}, 0, None), ({"weight": "w"}, 4, pw * weight)]
    for cols, boot, w in cases:
        got = sweep_parquet(path, grid, columns=cols, bootstrap=boot, seed=11, record_chunk=4096, engine="jax")
        ref = sweep(M, R, A, grid, adopt=adopt, weights=w, engine="jax", record_chunk=4096)
        np.testing.assert_array_equal(got.counts, ref.counts)
        np.testing.assert_array_equal(got.accuracy, ref.accuracy)
        np.testing.assert_array_equal(got.total, ref.total)
        np.testing.assert_allclose(got.mean_C_final, ref.mean_C_final, rtol=0, atol=1e-6)
        assert got.counts.shape == ((6, 4, 4) if boot else (6, 4))
    # no labels: no accuracy; a single config: no K axis (as sweep)
    one = sweep_parquet(path, MDLConfig(), columns={"adopt": None}, engine="jax", record_chunk=4096)
    assert one.accuracy is None and one.counts.shape == (4,) and one.counts.sum() == n


def test_sweep_parquet_rejects_bad_input_naming_the_column_and_row(records, tmp_path):
    path, M, R, A, adopt, weight = records
    g = MDLConfig()
    with pytest.raises(ValueError, match="path: no such file"):
        sweep_parquet(tmp_path / "nope.parquet", g)
    # a folder is there: said so, not called missing
    with pytest.raises(ValueError, match=r"^path: '.*' is not a regular file; expected a Parquet file$"):
        sweep_parquet(tmp_path, g)
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="is not a readable Parquet file"):
        sweep_parquet(tmp_path / "text.parquet", g)
    with pytest.raises(ValueError, match=r"has no column 'risk' \(for A\)"):
        sweep_parquet(path, g, columns={"A": "risk"})
    with pytest.raises(ValueError, match="columns: expected a dict from roles"):
        sweep_parquet(path, g, columns={"colour": "M"})
    with pytest.raises(ValueError, match="bootstrap: expected an int ≥ 0"):
        sweep_parquet(path, g, bootstrap=-1)
    bad = M.copy()
    bad[7003] = 1.5
    _write(tmp_path / "bad_m.parquet", bad, R, A, adopt)
    with pytest.raises(ValueError, match=r"M: expected values in \[0, 1\]; row 7003 has 1.5"):
        sweep_parquet(tmp_path / "bad_m.parquet", g, record_chunk=1000)
    lab = adopt.astype(np.int64)
    lab[12] = 2
    _write(tmp_path / "bad_adopt.parquet", M, R, A, lab)
    with pytest.raises(ValueError, match=r"adopt: expected binary labels \(0/1 or bool\); row 12 has 2"):
        sweep_parquet(tmp_path / "bad_adopt.parquet", g)
    nulls = pa.array(list(R[:40]) + [None] + list(R[41:]), pa.float32())
    pq.write_table(pa.table({"M": M, "R": nulls, "A": A}), tmp_path / "null.parquet")
    with pytest.raises(ValueError, match="R: expected a value in every row; row 40 is null"):
        sweep_parquet(tmp_path / "null.parquet", g)
    _write(tmp_path / "zero_w.parquet", M, R, A, adopt, np.zeros(len(M)))
    with pytest.raises(ValueError, match="weight: every weight vector needs a positive total"):
        sweep_parquet(tmp_path / "zero_w.parquet", g, columns={"weight": "w"})


WORKER = (
    "import sys, numpy as np\n"
    "from mdl_jax.controller import distributed\n"
    "pid, port, path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]\n"
    "distributed.initialize(f'127.0.0.1:{port}', num_processes=2, process_id=pid, initialization_timeout=60)\n"
    "import jax, pyarrow.parquet as pq\n"
    "from mdl_jax import MDLConfig, config_grid\n"
    "from mdl_jax.controller.stream import poisson_weights\n"
    "grid = config_grid(MDLConfig(), g_a=[0.1, 0.5, 0.9], g_b=[0.3, 0.9])\n"
    "t = pq.read_table(path); n = t.num_rows; half = slice(pid * (n // 2), n if pid else n // 2)\n"
    "M, R, A, adopt = (t.column(c).to_numpy()[half] for c in ('M', 'R', 'A', 'adopt'))\n"
    "w = poisson_weights(half.start, half.stop or n, 4, 5)\n"
    "a = distributed.sweep(M, R, A, grid, adopt=adopt, weights=w, engine='jax', record_chunk=4096)\n"
    "s = distributed.sweep_parquet(path, grid, bootstrap=4, seed=5, engine='jax', record_chunk=4096)\n"
    + SETUP +   # tuning: runs on this process's device alone, then records split over both processes
    "one = tune_row((1, 1))\n"
    "from mdl_jax.controller.distributed import tune_many\n"
    "np.save(out, np.concatenate([np.ravel(x) for r in (a, s) for x in r] + [tune_row((1, 2)), one]))\n"
    "print(jax.process_count(), jax.device_count(), jax.local_device_count())\n"
)


@pytest.mark.slow
def test_two_processes_through_jax_distributed_equal_one_process(records, tmp_path):
    """Two CPU processes (one device each) on 127.0.0.1, each sweeping half the rows (arrays) and
    half the row groups (Parquet): both return one process's sweep, integer sums exactly; and
    tune_many with the records split over the two processes (a (1, 2) mesh: loss and gradient sums
    cross processes) equals one device's to float32 rounding."""
    path, M, R, A, adopt, _ = records
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    outs = [tmp_path / f"p{i}.npy" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), str(port), str(path), str(outs[i])],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        res = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:  # a hung process fails the test, not CI
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, res):
        assert p.returncode == 0, err[-2000:]
        assert out.strip().splitlines()[-1] == "2 2 1"
    grid = config_grid(MDLConfig(), g_a=[0.1, 0.5, 0.9], g_b=[0.3, 0.9])
    # W = 4 and record_chunk = 4096 as in the test above: these programs are already compiled
    a = sweep(M, R, A, grid, adopt=adopt, weights=poisson_weights(0, len(M), 4, 5), engine="jax",
              record_chunk=4096)
    s = sweep_parquet(path, grid, bootstrap=4, seed=5, engine="jax", record_chunk=4096)
    want = np.concatenate([np.ravel(x) for r in (a, s) for x in r])
    got = [np.load(o) for o in outs]
    np.testing.assert_array_equal(got[0], got[1])            # every process the same result
    across, one = got[0][want.size:].reshape(2, -1)
    np.testing.assert_allclose(across, one, rtol=1e-5, atol=1e-6)
    assert np.abs(one[:2] - (0.3, 0.7)).max() > 1e-3          # the runs trained: the gates moved
    K, W = 6, 4
    sizes = [K * W, K * W * 4, K * W, W]                      # accuracy, counts, mean_C_final, total
    at = 0
    for _ in range(2):
        for name, n in zip(("accuracy", "counts", "mean_C_final", "total"), sizes):
            if name == "mean_C_final":
                np.testing.assert_allclose(got[0][at:at + n], want[at:at + n], rtol=0, atol=1e-6)
            else:
                np.testing.assert_array_equal(got[0][at:at + n], want[at:at + n], err_msg=name)
            at += n


BAD_SHARE_WORKER = (
    "import sys\n"
    "from mdl_jax.controller import distributed\n"
    "pid, port, path, case = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]\n"
    "distributed.initialize(f'127.0.0.1:{port}', num_processes=2, process_id=pid, initialization_timeout=60)\n"
    "from mdl_jax import config_grid\n"
    "grid = config_grid(g_a=[0.1, 0.5, 0.9][:3 - pid] if case == 'configs' else [0.1, 0.5])\n"
    "try:\n"
    "    distributed.sweep_parquet(path, grid, engine='jax')\n"
    "except ValueError as e:\n"
    "    print('ValueError:', e); sys.exit(3)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["bad row", "configs"])
def test_a_process_failing_on_its_share_fails_every_process_in_one_line(records, tmp_path, case):
    """A value out of range in the second process's row groups (or processes given different configs):
    the failing process raised and the other waited in the sums' collective until a timeout killed
    it (or gloo aborted the job in C++); now every process raises a ValueError that says why."""
    _, M, R, A, adopt, _ = records
    path = tmp_path / "bad.parquet"
    M = M.copy()
    if case == "bad row":
        M[-5] = 2.0   # in the last row group: the second process's share
    _write(path, M, R, A, adopt)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, "-c", BAD_SHARE_WORKER, str(i), str(port), str(path), case],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        res = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    said = [out.strip().splitlines()[-1] if out.strip() else err[-2000:] for out, err in res]
    assert [p.returncode for p in procs] == [3, 3], said
    if case == "bad row":
        assert said[1] == f"ValueError: M: expected values in [0, 1]; row {len(M) - 5} has 2.0"
        assert said[0].startswith("ValueError: process 1 of 2 failed on its share") and "row" in said[0]
    else:
        assert all("the processes' sums differ in size" in x for x in said), said


def test_sweep_command_writes_one_csv_row_per_config_equal_to_sweep_parquet(records, tmp_path, capsys):
    from mdl_jax.cli import main

    path = records[0]
    out = tmp_path / "grid.csv"
    assert main(["sweep", str(path), "--grid", "g_a=0.1,0.9", "--grid", "sigma=0.1:0.2:2", "--out", str(out)]) == 0
    rows = [ln.split(",") for ln in out.read_text().splitlines()]
    assert rows[0][:3] == ["g_a", "sigma", "accuracy"] and len(rows) == 5
    want = sweep_parquet(path, config_grid(MDLConfig(), g_a=[0.1, 0.9], sigma=[0.1, 0.2]))
    np.testing.assert_allclose([float(r[2]) for r in rows[1:]], want.accuracy, atol=1e-6)
    np.testing.assert_allclose([float(r[3]) for r in rows[1:]], want.counts[:, 0] / want.total, atol=1e-6)
    assert "wrote" in capsys.readouterr().err


@pytest.mark.strict_dtype_promotion
@pytest.mark.parametrize("address", ["notahost", "host:", ":1234", "host:port", 1234])
def test_initialize_rejects_an_address_without_host_and_port_naming_the_argument(address):
    # jax.distributed.initialize("notahost", ...) died in an IndexError inside JAX. The check runs
    # before any JAX state is touched, so this process stays usable.
    from mdl_jax.controller import distributed

    with pytest.raises(ValueError, match=r"^coordinator_address: expected 'HOST:PORT'"):
        distributed.initialize(address, num_processes=1, process_id=0)


# --- a streamed sweep's checkpoint: resumed to the same bits, never onto other inputs ---------------------


def _interrupted(monkeypatch, after: int):
    """Reducer.add raising after ``after`` passes (a process killed part-way), checkpointing every pass."""
    from mdl_jax.controller import checkpoint, passes

    monkeypatch.setattr(checkpoint, "EVERY_S", 0.0)
    real, calls = passes.Reducer.add, {"n": 0}

    def add(self, *a):
        calls["n"] += 1
        if calls["n"] > after:
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(passes.Reducer, "add", add)
    return lambda: monkeypatch.setattr(passes.Reducer, "add", real)


@pytest.mark.parametrize("engine", ["jax", "native"])
def test_a_sweep_stopped_part_way_resumes_from_its_checkpoint_to_the_same_bits(records, tmp_path, monkeypatch, engine):
    from mdl_jax.controller import passes

    path = records[0]
    grid = config_grid(MDLConfig(), g_a=[0.2, 0.6], sigma=[0.15, 0.2])
    want = sweep_parquet(path, grid, bootstrap=3, seed=2, record_chunk=2048, engine=engine)
    ckpt = tmp_path / "progress.npz"
    restore = _interrupted(monkeypatch, after=4)
    with pytest.raises(KeyboardInterrupt):
        sweep_parquet(path, grid, bootstrap=3, seed=2, record_chunk=2048, engine=engine, checkpoint=ckpt)
    restore()
    assert ckpt.is_file()
    real, seen = passes.Reducer.add, []
    monkeypatch.setattr(passes.Reducer, "add", lambda self, *a: (seen.append(len(a[0])), real(self, *a))[1])
    got = sweep_parquet(path, grid, bootstrap=3, seed=2, record_chunk=2048, engine=engine, checkpoint=ckpt)
    for f in want._fields:
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    assert len(seen) == -(-len(records[1]) // 2048) - 4    # the four passes kept were not run again
    assert not ckpt.exists()                                # done: the progress is removed


def test_a_resumed_sweep_with_huge_integer_weights_gives_the_same_bits(records, tmp_path, monkeypatch):
    # int64 weights near 2^62 were multiplied in float64 or int64 per batch, and a resumed sweep's
    # batches are cut at the checkpoint: the total differed in its last bits
    _, M, R, A, adopt, weight = records
    path = tmp_path / "big.parquet"
    _write(path, M, R, A, adopt, weight.astype(np.int64) * (1 << 58) + np.arange(len(M)) % 7)
    grid = config_grid(MDLConfig(), g_a=[0.2, 0.6])
    opts = dict(columns={"weight": "w"}, bootstrap=3, record_chunk=3000)
    want = sweep_parquet(path, grid, **opts)
    ckpt = tmp_path / "progress.npz"
    restore = _interrupted(monkeypatch, after=3)
    with pytest.raises(KeyboardInterrupt):
        sweep_parquet(path, grid, checkpoint=ckpt, **opts)
    restore()
    got = sweep_parquet(path, grid, checkpoint=ckpt, **opts)
    for f in want._fields:
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)


def test_a_checkpoint_made_on_another_engine_is_refused(records, tmp_path, monkeypatch):
    # "auto" took the native kernel, then (MDL_JAX_NATIVE=0, another machine) the pure-JAX program: the
    # resumed sums would match neither engine's
    from mdl_jax.engines import kernel, toolchain

    if toolchain.compiler() is None or not kernel.load():
        pytest.skip("no native kernel here")
    grid = config_grid(MDLConfig(), g_a=[0.2, 0.6])
    ckpt = tmp_path / "progress.npz"
    restore = _interrupted(monkeypatch, after=2)
    with pytest.raises(KeyboardInterrupt):
        sweep_parquet(records[0], grid, record_chunk=2048, engine="auto", checkpoint=ckpt)
    restore()
    monkeypatch.setenv("MDL_JAX_NATIVE", "0")
    with pytest.raises(ValueError, match=r"engine \('native-\w+' then, 'jax' now\) changed"):
        sweep_parquet(records[0], grid, record_chunk=2048, engine="auto", checkpoint=ckpt)


def test_a_checkpoint_of_other_inputs_is_refused_saying_what_changed(records, tmp_path, monkeypatch):
    import shutil

    src = tmp_path / "r.parquet"
    shutil.copy(records[0], src)
    grid = config_grid(MDLConfig(), g_a=[0.2, 0.6])
    ckpt = tmp_path / "progress.npz"
    restore = _interrupted(monkeypatch, after=2)
    with pytest.raises(KeyboardInterrupt):
        sweep_parquet(src, grid, bootstrap=3, record_chunk=2048, checkpoint=ckpt)
    restore()
    kept = ckpt.read_bytes()
    for call, what in (
            (lambda: sweep_parquet(src, grid, bootstrap=4, record_chunk=2048, checkpoint=ckpt),
             "bootstrap (3 then, 4 now)"),
            (lambda: sweep_parquet(src, config_grid(MDLConfig(), g_a=[0.2, 0.7]), bootstrap=3, record_chunk=2048,
                                   checkpoint=ckpt), "the configs"),
            (lambda: sweep_parquet(src, grid, bootstrap=3, record_chunk=1024, checkpoint=ckpt), "pass (2048 then, 1024 now)")):
        with pytest.raises(ValueError, match=rf"^checkpoint: .* is the progress of a sweep of other inputs: .*{re.escape(what)}"):
            call()
    _, M, R, A, adopt, weight = records
    M = M.copy()
    M[7] = 0.5 if M[7] != 0.5 else 0.25   # one record changed, the file rewritten in place
    _write(src, M, R, A, adopt, weight)
    with pytest.raises(ValueError, match=r"the Parquet file's content changed"):
        sweep_parquet(src, grid, bootstrap=3, record_chunk=2048, checkpoint=ckpt)
    assert ckpt.read_bytes() == kept   # a refusal changes nothing
    ckpt.write_bytes(b"PK\x03\x04 damaged")
    with pytest.raises(ValueError, match=r"^checkpoint: .* is not a readable sweep checkpoint"):
        sweep_parquet(src, grid, bootstrap=3, record_chunk=2048, checkpoint=ckpt)
    import io
    import json

    for meta in ([1, 2], {"format": 1, "row": "3"}):   # made by hand: a ValueError, never a KeyError
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        ckpt.write_bytes(buf.getvalue())
        with pytest.raises(ValueError, match=r"^checkpoint: .* is not a readable sweep checkpoint"):
            sweep_parquet(src, grid, bootstrap=3, record_chunk=2048, checkpoint=ckpt)
    ckpt.unlink()
    os.mkfifo(ckpt)
    with pytest.raises(ValueError, match=r"^checkpoint: .* is not a regular file"):
        sweep_parquet(src, grid, bootstrap=3, record_chunk=2048, checkpoint=ckpt)


def test_a_checkpoint_edited_off_a_pass_boundary_or_to_other_dtypes_is_refused(records, tmp_path, monkeypatch):
    # its inputs match, so it was read: a row inside a pass (or past the file) resumed there, and float
    # sums were cast into the integer counts, each a silently wrong result
    import io
    import json

    grid = config_grid(MDLConfig(), g_a=[0.2, 0.6])
    ckpt = tmp_path / "progress.npz"
    restore = _interrupted(monkeypatch, after=2)
    with pytest.raises(KeyboardInterrupt):
        sweep_parquet(records[0], grid, record_chunk=2048, checkpoint=ckpt)
    restore()
    with np.load(ckpt) as z:
        kept = {k: z[k] for k in z.files}
    meta = json.loads(bytes(kept["meta"]).decode())
    assert meta["row"] == 2 * 2048

    def edited(row=meta["row"], **sums):
        buf = io.BytesIO()
        np.savez(buf, **{**kept, **sums, "meta": np.frombuffer(json.dumps({**meta, "row": row}).encode(), np.uint8)})
        ckpt.write_bytes(buf.getvalue())

    for row in (2 * 2048 + 100, 10**9):
        edited(row)
        with pytest.raises(ValueError, match=rf"^checkpoint: .* records progress to row {row:,}, not a boundary"):
            sweep_parquet(records[0], grid, record_chunk=2048, checkpoint=ckpt)
    edited(s_int_counts=kept["s_int_counts"] + 0.5)
    with pytest.raises(ValueError, match=r"^checkpoint: .* holds sums of other dtypes"):
        sweep_parquet(records[0], grid, record_chunk=2048, checkpoint=ckpt)
    edited()   # as it was saved: resumed
    want = sweep_parquet(records[0], grid, record_chunk=2048)
    got = sweep_parquet(records[0], grid, record_chunk=2048, checkpoint=ckpt)
    np.testing.assert_array_equal(got.counts, want.counts)


def test_a_checkpoint_naming_the_parquet_file_itself_is_refused_without_telling_to_remove_it(records, tmp_path):
    # read as a checkpoint, the records failed as "not a readable sweep checkpoint ...; remove it to
    # start over": advice to delete the data being swept
    link = tmp_path / "progress.npz"
    link.symlink_to(records[0])
    for ckpt in (records[0], link):
        with pytest.raises(ValueError, match=r"^checkpoint: .* is the Parquet file being swept \(path\)") as e:
            sweep_parquet(records[0], MDLConfig(), record_chunk=2048, checkpoint=ckpt)
        assert "remove" not in str(e.value)
    assert records[0].is_file()


KILLED_SWEEP = (
    "import sys, time\n"
    "from mdl_jax.controller import checkpoint, passes\n"
    "checkpoint.EVERY_S = 0.0\n"
    "real = passes.Reducer.add\n"
    "def slow(self, *a):\n"
    "    time.sleep(0.2)   # slow enough to be killed part-way\n"
    "    return real(self, *a)\n"
    "passes.Reducer.add = slow\n"
    "from mdl_jax.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.slow
def test_the_sweep_command_killed_resumes_from_its_checkpoint(records, tmp_path, cli):
    import signal
    import time

    path, out = records[0], tmp_path / "grid.csv"
    argv = ["sweep", str(path), "--grid", "g_a=0.2,0.6", "--bootstrap", "2", "--record-chunk", "2048", "--out", str(out)]
    progress = Path(f"{out}.progress.npz")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SWEEP, *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not progress.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert proc.poll() is None, proc.stderr.read()[-2000:] if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert progress.is_file() and not out.exists()
    rc, _, err = cli(argv)
    assert rc == 0, err
    assert not progress.exists()
    uninterrupted = tmp_path / "again.csv"
    assert cli([*argv[:-1], str(uninterrupted)])[0] == 0
    assert out.read_text() == uninterrupted.read_text()


def test_the_sweep_command_keeps_its_progress_until_the_csv_is_written(records, tmp_path, cli, monkeypatch):
    # the progress was removed before the CSV was written: a full disk then lost the whole sweep
    from mdl_jax import _io
    from mdl_jax.controller import checkpoint

    monkeypatch.setattr(checkpoint, "EVERY_S", 0.0)
    out = tmp_path / "grid.csv"
    argv = ["sweep", records[0], "--grid", "g_a=0.2,0.6", "--record-chunk", "4096", "--out", out]
    real = _io.write_text

    def full(path, text, **kw):
        raise _io.OutputError(path, OSError(28, "No space left on device"))

    monkeypatch.setattr(_io, "write_text", full)
    rc, _, err = cli(argv)
    assert rc == 2 and "No space left on device" in err
    assert Path(f"{out}.progress.npz").is_file() and not out.exists()
    monkeypatch.setattr(_io, "write_text", real)
    assert cli(argv)[0] == 0 and out.is_file() and not Path(f"{out}.progress.npz").exists()
    rc, _, err = cli([*argv, "--checkpoint", out])
    assert rc == 2 and "--checkpoint and --out name one file" in err


def test_the_sweep_command_refuses_an_out_that_leads_into_dev_or_proc(records, tmp_path, cli):
    # /dev/stdout redirected to a file passed as a regular file, and the CSV replaced the link
    link = tmp_path / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    for out in (link, "/dev/stdout"):
        rc, _, err = cli(["sweep", records[0], "--grid", "g_a=0.5", "--out", out])
        assert rc == 2 and "names a device or a process's file descriptor" in err, err
    assert link.is_symlink()
