"""Regression tests for the adversarial audit: each test is one reproducer, named after the
property it keeps. The property-based suite over the same surface is tests/test_properties.py."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mdl_jax import Action, MDLConfig, calibrate, checked_decide, decide, soft_decide
from mdl_jax.controller.config import NUMERIC_FIELDS
from mdl_jax.engines import kernel, native, toolchain
from mdl_repro.pipeline import data, records

ROOT = Path(__file__).resolve().parents[1]


# --- 1. Native kernel cache ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_library():
    """A complete kernel library and its record, built once (skipped without a compiler)."""
    if toolchain.compiler() is None:
        pytest.skip("no C++ compiler: the kernel cache is not used")
    assert native.load(), native.status()
    # Start XLA's CPU backend with this library's handler now: handlers registered before the
    # backend starts are only applied then, and the reloads below (other paths, other addresses)
    # must meet an already registered handler, as they would in any process that ran decide.
    decide(np.full(20, 0.5, np.float32), 0.5, 0.5)
    path = native.library_path()
    assert native.verified(path)
    return path.read_bytes(), toolchain.record_path(path).read_text()


@pytest.mark.parametrize("size", [4_000, 20_000, 60_000])
def test_truncated_kernel_library_is_rebuilt_not_loaded(size, good_library, monkeypatch, tmp_path):
    # A cache cut short by a full disk: the library keeps its record (written by the build that
    # finished) but not its bytes. Loading it would be SIGBUS on the first decide; it must be rebuilt.
    lib_bytes, record = good_library
    monkeypatch.setattr(kernel, "_STATE", {})
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path))
    path = native.library_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(lib_bytes[:size])
    toolchain.record_path(path).write_text(record)
    assert not native.verified(path)

    built, loaded = [], []

    def fake_build(out):  # the real compiler is tested below; here: what a finished build leaves
        built.append(out)
        out.write_bytes(lib_bytes)
        toolchain.record_path(out).write_text(record)
        return out

    real_load = kernel.ctypes.cdll.LoadLibrary

    def spy_load(name):  # refuse (instead of crashing pytest) if a short library reaches dlopen
        loaded.append(Path(name).stat().st_size)
        assert Path(name).stat().st_size == len(lib_bytes), "a truncated library was loaded"
        return real_load(name)

    monkeypatch.setattr(kernel, "build", fake_build)
    monkeypatch.setattr(kernel.ctypes.cdll, "LoadLibrary", spy_load)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it recovers: no fallback warning
        assert native.load()
    assert built == [path] and loaded == [len(lib_bytes)]


@pytest.mark.slow
def test_truncated_kernel_library_does_not_kill_a_fresh_process(good_library, tmp_path):
    # The reproducer end to end, with the real compiler: before the fix this process died of SIGBUS.
    lib_bytes, record = good_library
    env = {**os.environ, "MDL_JAX_CACHE_DIR": str(tmp_path)}
    code = ("from mdl_jax.engines import native, toolchain; import pathlib, sys; "
            "p = native.library_path(); p.parent.mkdir(parents=True); "
            f"p.write_bytes(pathlib.Path(sys.argv[1]).read_bytes()[:60_000]); "
            f"toolchain.record_path(p).write_text({record!r}); "
            "import numpy as np; from mdl_jax import decide; "
            "d = decide(np.full(40, 0.5, np.float32), 0.5, 0.5, engine='native'); "
            "assert native.status()['ok'], native.status(); "
            "assert native.verified(p) and p.stat().st_size > 60_000; print(int(d.action[0]))")
    src = tmp_path / "good.so"
    src.write_bytes(lib_bytes)
    proc = subprocess.run([sys.executable, "-c", code, str(src)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.slow
def test_kernel_build_writes_library_and_record_atomically(good_library, tmp_path):
    lib_bytes, _ = good_library
    out = tmp_path / "k.so"
    native.build(out)
    assert native.verified(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.so", "k.so.sha256"]  # no temporaries left
    assert toolchain.elf_complete(out.read_bytes())
    assert not any(toolchain.elf_complete(lib_bytes[:n]) for n in (64, 4_000, len(lib_bytes) - 1))


# --- 2. Records ----------------------------------------------------------------------------------

def _rec(qid, **kw):
    return {"dataset": "truthfulqa", "qid": qid, "seed": 0, "system": "B3", "answer": "Ça va — oui", **kw}


def test_torn_multibyte_last_line_and_foreign_lines_are_skipped_with_a_warning(tmp_path):
    p = tmp_path / "records.jsonl"
    records.RecordWriter(p).append([_rec(0), _rec(1)])
    torn = json.dumps(_rec(2), ensure_ascii=False).encode()
    cut = torn.index("Ç".encode()) + 1  # inside the two-byte character
    with open(p, "ab") as f:
        f.write(b"null\n[1, 2]\n3\n\"text\"\n{\"dataset\": \"x\"}\n"
                b"{\"dataset\": [1], \"qid\": 1, \"seed\": 0, \"system\": \"B3\"}\n\xff\xfe\n")
        f.write(torn[:cut])
    with pytest.warns(RuntimeWarning, match=r"skipped 8 line\(s\)"):
        got = records.load(p)
    assert set(got) == {records.key(_rec(0)), records.key(_rec(1))}
    # resume: the writer ends the torn line and the redone record is read back
    records.RecordWriter(p).append([_rec(2)])
    with pytest.warns(RuntimeWarning):
        assert records.key(_rec(2)) in records.load(p)


# --- 3. MDLConfig --------------------------------------------------------------------------------

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


# --- 5. calibrate --------------------------------------------------------------------------------

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


# --- 6. First offending index --------------------------------------------------------------------

def test_first_offending_index_is_named_whatever_is_wrong_with_it():
    M = np.full(10_000_000, 0.5, np.float32)
    M[5] = 1.5
    M[9_000_000] = np.nan
    with pytest.raises(ValueError, match=r"^M: expected values in \[0, 1\]; M\[5\] = "):
        decide(M, 0.5, 0.5)
    small = np.array([0.5, np.inf, -1.0])
    with pytest.raises(ValueError, match=r"^R: expected finite values in \[0, 1\]; R\[1\] = "):
        decide(0.5, small, 0.5)
    err, _ = checked_decide(0.5, 0.5, np.array([0.5, -1.0, np.nan]))
    assert err.get().startswith("A: expected") and "flat index 1" in err.get()


# --- 7. One shape rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["eager", "jit"])
@pytest.mark.parametrize("fn", [decide, checked_decide, soft_decide], ids=lambda f: f.__name__)
def test_shape_mismatch_raises_everywhere_naming_the_argument(fn, where):
    col, row = np.full((4, 1), 0.5, np.float32), np.full(4, 0.5, np.float32)
    call = (lambda m, r: fn(m, r, 0.5)) if where == "eager" else jax.jit(lambda m, r: fn(m, r, 0.5))
    with pytest.raises(ValueError, match=r"^R: expected shape \(4, 1\)"):
        call(col, row)
    # 0-d values broadcast on every path
    out = call(col, np.float32(0.5))
    leaf = out[1].C_final if fn is checked_decide else (out if fn is soft_decide else out.C_final)
    assert leaf.shape[:2] == (4, 1)


# --- 8. Empty, complex, temperature --------------------------------------------------------------

def test_checked_decide_on_empty_arrays_gives_an_empty_decision():
    e = np.zeros(0, np.float32)
    err, out = checked_decide(e, e, e)
    assert err.get() is None
    assert out.action.shape == (0,) and out.v_meta.shape == (0, 16) and out.energies.shape == (0, 3)
    err, out = checked_decide(np.zeros((2, 0)), 0.5, 0.5)
    assert err.get() is None and out.C_final.shape == (2, 0)


@pytest.mark.parametrize("fn", [decide, checked_decide, soft_decide], ids=lambda f: f.__name__)
@pytest.mark.parametrize("arg", ["M", "R", "A"])
def test_complex_signals_are_rejected_naming_the_argument(fn, arg):
    vals = {"M": 0.5, "R": 0.5, "A": 0.5, arg: np.array([0.5 + 0.5j, 0.2])}
    with pytest.raises((TypeError, ValueError), match=rf"^{arg}: .*complex"):
        fn(**vals)
    if fn is decide:
        with pytest.raises(ValueError, match=rf"^{arg}: .*complex"):
            decide(**vals, validate=False)  # never silently dropped, even unvalidated


@pytest.mark.parametrize("t", [0.0, -0.02, np.nan, np.inf, "0.02"])
def test_soft_decide_rejects_a_temperature_outside_its_domain(t):
    with pytest.raises(ValueError, match=r"^temperature:"):
        soft_decide(0.8, 0.7, 0.2, temperature=t)


def test_soft_decide_temperature_that_underflows_in_the_compute_dtype_is_rejected():
    h = np.float16(0.5)
    with pytest.raises(ValueError, match=r"^temperature: .*float32"):
        soft_decide(h, h, h, temperature=1e-46)  # 0 in float32: (C_final - θ) / 0 is NaN
    for x in (h, np.float32(0.5)):  # float16 signals are computed in float32, where 1e-9 is > 0
        p = soft_decide(x, 0.5, 0.5, temperature=1e-9)
        assert p.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(p)))


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16])
def test_half_precision_signals_decide_exactly_as_float32_on_the_same_values(dtype, rng):
    # Computed in their own dtype, 0.14% (float16) / 2.31% (bfloat16) of decisions differed from
    # float32 on the same values. Widening is exact, so every field is now identical.
    x = np.asarray(rng.uniform(size=(3, 4000)), dtype)
    wide = [jnp.asarray(v.astype(np.float32)) for v in x]
    for path in ("native", "pure_jax"):
        half = decide(*x) if path == "native" else jax.jit(decide)(*x)
        ref = decide(*wide) if path == "native" else jax.jit(decide)(*wide)
        assert half.C_final.dtype == jnp.float32
        for f in half._fields:
            np.testing.assert_array_equal(np.asarray(getattr(half, f)), np.asarray(getattr(ref, f)), err_msg=f)
    checked = checked_decide(*x)[1]
    assert checked.C_final.dtype == jnp.float32


# --- 9. validate=False ---------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", ["native", "pure_jax"])
def test_nan_signal_is_opt_out_on_every_path_when_unvalidated(kernel, monkeypatch):
    if kernel == "pure_jax":
        monkeypatch.setenv(native.ENV_SWITCH, "0")
    elif toolchain.compiler() is None or not native.load():
        pytest.skip("no native kernel on this machine")
    x = np.array([np.nan, 0.5, 0.9, 0.1, 0.5] * 7, np.float32)  # 35: two full blocks and a tail
    M, R, A = x, np.roll(x, 1), np.roll(x, 2)
    out = decide(M, R, A, validate=False, engine="native" if kernel == "native" else "jax")
    nan_any = np.isnan(M) | np.isnan(R) | np.isnan(A)
    assert np.all(np.asarray(out.action)[nan_any] == Action.OPT_OUT)
    ref = decide(np.where(nan_any, 0.5, M), np.where(nan_any, 0.5, R), np.where(nan_any, 0.5, A))
    np.testing.assert_array_equal(np.asarray(out.action)[~nan_any], np.asarray(ref.action)[~nan_any])
    assert int(decide(np.nan, 0.5, 0.5, validate=False).action) == Action.OPT_OUT
    assert int(decide(float("nan"), 0.5, 0.5, MDLConfig(), validate=False).action) == Action.OPT_OUT


# --- 10. Data loaders ----------------------------------------------------------------------------

HALU = {"knowledge": "k", "question": "q?", "right_answer": "r", "hallucinated_answer": "h"}
TQA_HEADER = "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source"
TQA_ROW = "Adversarial,Misconceptions,Q?,B,C1; C2,I1; I2,S"


@pytest.mark.parametrize("name, content, match", [
    ("halueval_qa.jsonl", b"", r"halueval_qa\.jsonl: no records; expected one JSON object per line"),
    ("halueval_qa.jsonl", b"\n  \n\n", r"halueval_qa\.jsonl: no records"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n\xff\xfe\n",
     r"halueval_qa\.jsonl, line 2: bytes that are not UTF-8 .*expected a UTF-8 text file"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "question": None}).encode(),
     r"line 1: question: expected a non-empty string, got None"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "knowledge": 3}).encode(), r"line 1: knowledge: expected .*got 3"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "right_answer": ["r"]}).encode(), r"line 1: right_answer: .*\['r'\]"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n[1, 2]\n", r"line 2: expected a JSON object, got an array"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\nnull\n", r"line 2: expected a JSON object, got null"),
    ("TruthfulQA.csv", b"", r"TruthfulQA\.csv: empty file; expected a CSV header"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n").encode(), r"TruthfulQA\.csv: a header and no data rows"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW.replace("Misconceptions", "") + "\n").encode(),
     r"line 2: category: expected a non-empty string, got ''"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW + "\n" + TQA_HEADER + "\n" + TQA_ROW + "\n").encode(),
     r"line 3: a repeated header row; expected a question"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW + "\n").encode() + b"A,Cat,Q\xe9?,B,C,I,S\n",
     r"line 3: bytes that are not UTF-8"),
])
def test_malformed_data_file_is_a_data_error_naming_file_line_and_expectation(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    ds = "halueval" if name.startswith("halu") else "truthfulqa"
    with pytest.raises(data.DataError, match=match):
        data.load(ds, tmp_path)


def test_valid_small_files_load_with_blank_lines_and_a_byte_order_mark(tmp_path):
    (tmp_path / "TruthfulQA.csv").write_bytes(("\ufeff" + TQA_HEADER + "\n\n" + TQA_ROW + "\n\n").encode())
    (tmp_path / "halueval_qa.jsonl").write_text("\n" + json.dumps(HALU) + "\n\n" + json.dumps(HALU) + "\n")
    tqa = data.load("truthfulqa", tmp_path)
    assert len(tqa) == 1 and tqa[0].correct == ("B", "C1", "C2") and tqa[0].incorrect == ("I1", "I2")
    assert len(data.load("halueval", tmp_path)) == 2 and len(data.load("halueval", tmp_path, limit=1)) == 1


def test_cli_prints_a_data_error_as_one_line_and_exits_2(tmp_path, capsys):
    from mdl_jax.cli import main

    (tmp_path / "halueval_qa.jsonl").write_bytes(b"")
    rc = main(["signals", "--data-dir", str(tmp_path), "--datasets", "halueval",
               "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "s.parquet")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("mdl-jax: error: ") and "halueval_qa.jsonl: no records" in err
    assert "Traceback" not in err
