"""The native CPU engine (mdl_jax/engines/native.py, _native/decide_cpu.cc), called by name
(``decide(..., engine="native")``): parity with the pure-JAX definition, batch-size invariance, every
ablation, the ISA variants (AVX-512 / AVX2), what "auto" does with it, the one-line error when it
cannot run, and a kernel cache cut short that is rebuilt, never loaded."""

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mdl_jax import MDLConfig, decide
from mdl_jax.controller.decision import Decision
from mdl_jax.engines import cpu as engine_cpu
from mdl_jax.engines import kernel as engine_kernel
from mdl_jax.engines import native, toolchain
from tests.reference import NumpyMDL, decide_definition

FIELDS = Decision._fields
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def kernel():
    if toolchain.compiler() is None:
        pytest.skip("no C++ compiler on this machine: the native engine cannot run here")
    assert native.load(), native.status()  # a machine with a compiler must build it


def _pure(M, R, A, cfg):
    return decide_definition(*(jnp.asarray(x, jnp.float32) for x in (M, R, A)), cfg)


def _native(M, R, A, cfg):
    return native._native_jit(*(jnp.asarray(x, jnp.float32) for x in (M, R, A)), native.params(cfg),
                              flags=native.flags(cfg), dims=cfg.dims)


def _engine(*args, **kw):
    return decide(*args, engine="native", **kw)


def assert_parity(a: Decision, b: Decision, cfg: MDLConfig, atol=2e-6):
    """Every float field within float32 rounding; actions equal wherever C_final is not within 1e-5
    of a threshold (there, a one-ulp difference may legitimately pick the neighbouring action)."""
    for f in ("C", "alpha", "C_final", "v_meta", "norm", "g_A"):
        np.testing.assert_allclose(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), atol=atol,
                                   err_msg=f)
    # energies are up to ‖v_meta‖² ≈ 10: compare relative to their size
    np.testing.assert_allclose(np.asarray(a.energies), np.asarray(b.energies), rtol=2e-6, atol=atol)
    cf = np.asarray(b.C_final)
    near = np.any(np.abs(cf[..., None] - np.asarray(cfg.thresholds, np.float32)) < 1e-5, axis=-1)
    assert np.array_equal(np.asarray(a.action)[~near], np.asarray(b.action)[~near])


def test_the_native_engine_runs_the_kernel_and_the_default_runs_pure_jax(rng, monkeypatch):
    for n in (100, 5000):   # the inline (ctypes) call and the FFI call through XLA's pool
        x = rng.uniform(size=(3, n)).astype(np.float32)
        out = _engine(*x)
        for f in FIELDS:  # bit-identical to the kernel, so it is the kernel that ran; NumPy out
            assert isinstance(getattr(out, f), np.ndarray), f
            assert np.array_equal(getattr(out, f), np.asarray(getattr(_native(*x, MDLConfig()), f))), f
        for got in (decide(*x), decide(*x, engine="jax")):   # the default never asks for an engine
            for f in FIELDS:
                assert np.array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(_pure(*x, MDLConfig()), f)))
        auto = decide(*x, engine="auto")   # on the CPU, "auto" is the kernel
        for f in FIELDS:
            assert np.array_equal(np.asarray(getattr(auto, f)), getattr(out, f)), f
    monkeypatch.setenv(native.ENV_SWITCH, "0")   # the deprecated switch: the engine cannot run
    with pytest.raises(ValueError, match=r"^engine='native' cannot run here: MDL_JAX_NATIVE=0"):
        _engine(*x)
    off = decide(*x, engine="auto")   # "auto" then runs pure JAX
    for f in FIELDS:
        assert np.array_equal(np.asarray(getattr(off, f)), np.asarray(getattr(_pure(*x, MDLConfig()), f)))


@pytest.mark.parametrize("n", [1, 15, 16, 17, 2048, 2049, 100_003])
def test_kernel_matches_pure_jax_for_every_size(n):
    # 1..17: inline blocks and tails; 2049 and 100_003: the thread-pool path with a ragged last chunk.
    x = np.random.default_rng(n).uniform(size=(3, n)).astype(np.float32)
    cfg = MDLConfig()
    assert_parity(_native(*x, cfg), _pure(*x, cfg), cfg)


@pytest.mark.parametrize("switch", ["alpha_gating", "risk_modulation", "risk_inversion",
                                    "value_encoding", "subspaces"])
def test_kernel_matches_pure_jax_under_every_ablation(switch, rng):
    cfg = MDLConfig(**{switch: "identity" if switch == "subspaces" else False})
    x = rng.uniform(size=(3, 5000)).astype(np.float32)
    assert_parity(_native(*x, cfg), _pure(*x, cfg), cfg)
    assert_parity(_engine(*x, cfg), _pure(*x, cfg), cfg)


def test_kernel_matches_pure_jax_for_non_default_numbers(rng):
    cfg = MDLConfig(sigma=0.07, eps_c=0.05, gains=(0.9, 0.8, 0.6), g_A_coeffs=(0.4, 0.7),
                    gate_coeffs=(0.2, 0.9), thresholds=(0.7, 0.45, 0.1), n_min=1.0, n_max=3.6,
                    bias=np.linspace(-0.2, 0.2, 16), dims=(4, 7, 5), qr_seed=7)
    assert native.supports(cfg)
    x = rng.uniform(size=(3, 5000)).astype(np.float32)
    assert_parity(_engine(*x, cfg), _pure(*x, cfg), cfg)


@pytest.mark.parametrize("sigma", [1e-4, 1e-3, 0.05, 1.0, 5.0])
def test_kernel_matches_pure_jax_at_any_sigma(sigma, rng):
    # The documented 2e-6 holds whatever σ: the kernel uses the pure-JAX path's float32 centres
    # (np.linspace's differed by an ulp, which a Gaussian of width 1e-4 amplified to 4e-5 in C).
    cfg = MDLConfig(sigma=sigma)
    x = rng.uniform(size=(3, 20000)).astype(np.float32)
    x[:, :16] = np.linspace(0, 1, 16, dtype=np.float32)  # exactly on the centres too
    assert_parity(_engine(*x, cfg), _pure(*x, cfg), cfg)


def test_one_record_from_python_decides_what_the_batch_decides_on_both_engines(rng, tmp_path, monkeypatch):
    # One record from Python floats, for numbers and ablations and a config file: what the batch on
    # the same engine decides (on the kernel, the same bits), and errors as before.
    from mdl_jax import save_config

    cfgs = [MDLConfig(thresholds=(0.7, 0.5, 0.3)), MDLConfig(sigma=0.07, bias=np.linspace(-0.2, 0.2, 16)),
            MDLConfig(alpha_gating=False, dims=(4, 7, 5), eps_c=0.0, gains=(1.0, 0.0, 0.5))]
    x = rng.uniform(size=(3, 12)).astype(np.float32)
    for engine in ("native", "jax"):
        for cfg in cfgs + [save_config(cfgs[0], tmp_path / "c.json")]:
            batch = decide(*x, cfg, engine=engine)
            for i in range(12):
                one = decide(*(float(v) for v in x[:, i]), cfg, engine=engine)
                assert one.C_final.shape == () and one.v_meta.shape == (16,)
                if engine == "jax":   # XLA compiles one record and a batch apart: float32 rounding apart
                    ref_cfg = cfg if isinstance(cfg, MDLConfig) else cfgs[0]   # (the file holds cfgs[0])
                    assert_parity(one, Decision(*(np.asarray(v)[i] for v in batch)), ref_cfg)
                    continue
                for f in FIELDS:  # the kernel: lanes never mix, the same bits
                    assert np.array_equal(np.asarray(getattr(one, f)), np.asarray(getattr(batch, f))[i]), f
        with pytest.raises(ValueError, match=r"^R: expected values in \[0, 1\]; got 1\.5|^R: expected a value in \[0, 1\], got 1\.5"):
            decide(0.5, 1.5, 0.5, cfgs[0], engine=engine)
    monkeypatch.setenv(native.ENV_SWITCH, "0")  # the switch: "auto" runs pure JAX
    off = decide(0.3, 0.6, 0.2, cfgs[0], engine="auto")
    ref = _pure(np.float32(0.3), np.float32(0.6), np.float32(0.2), cfgs[0])
    assert np.array_equal(np.asarray(off.v_meta), np.asarray(ref.v_meta))


def test_kernel_matches_the_float64_numpy_reference(rng):
    x = rng.uniform(size=(3, 300))
    out = _engine(*x.astype(np.float32))
    ref = NumpyMDL()
    for i in range(300):
        r = ref.decide(*(float(v) for v in x.astype(np.float32)[:, i]))
        for f in ("C", "alpha", "C_final"):
            assert abs(float(getattr(out, f)[i]) - r[f]) < 1e-5, (f, i)


def test_same_record_same_bits_at_any_batch_size(rng):
    # Auditability: lanes never mix, so a record's decision does not depend on what it is batched with
    # (scalar call, short batch, thread-pool batch).
    x = rng.uniform(size=(3, 5003)).astype(np.float32)
    full = _engine(*x)
    for lo, hi in [(0, 1), (3, 40), (1000, 5003)]:
        part = _engine(*x[:, lo:hi])
        for f in FIELDS:
            assert np.array_equal(np.asarray(getattr(part, f)), np.asarray(getattr(full, f))[lo:hi]), f
    one = _engine(*(float(v) for v in x[:, 7]))
    for f in FIELDS:
        assert np.array_equal(np.asarray(getattr(one, f)), np.asarray(getattr(full, f))[7]), f


def test_corners_and_empty_input_give_finite_output():
    g = np.array([0.0, 1.0, 0.5, np.nextafter(np.float32(0), np.float32(1))], np.float32)
    M, R, A = (a.ravel() for a in np.meshgrid(g, g, g, indexing="ij"))
    out = _engine(M, R, A)
    for f in FIELDS:
        assert np.all(np.isfinite(np.asarray(getattr(out, f)))), f
    assert_parity(out, _pure(M, R, A, MDLConfig()), MDLConfig())
    empty = _engine(np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert empty.v_meta.shape == (0, 16) and empty.energies.shape == (0, 3)
    # NumPy fields as with records: code that writes into the answer works for an empty batch too
    assert all(type(getattr(empty, f)) is np.ndarray for f in FIELDS)
    assert empty.action.dtype == np.int32 and _engine(np.zeros((2, 0), np.float32), 0.5, 0.5).C.shape == (2, 0)
    wide = MDLConfig(D=32, dims=(16, 8, 8))   # what the kernel cannot run is an error with or without records
    for n in (3, 0):
        with pytest.raises(ValueError, match=r"^engine='native' cannot run here: .*D = 32"):
            _engine(*np.full((3, n), 0.5, np.float32), wide)
    nan = np.array([np.nan, 0.5], np.float32)
    assert np.array_equal(_engine(nan, nan[::-1], 0.5, validate=False).action, [3, 3])  # Opt-Out


def test_a_config_swept_by_vmap_is_refused_by_name_as_traced_not_as_a_wrong_d(rng):
    # the reason read "D = 16 (this one has D = 16)": the config's leaves were traced, its D was fine
    x = rng.uniform(size=(3, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^engine='native' cannot run here: a config with traced leaves "
                                         r"\(a caller's vmap or grad over the config\)"):
        jax.vmap(lambda s: decide(*x, MDLConfig(sigma=s), engine="native").C_final)(jnp.array([0.15, 0.2]))
    with pytest.raises(ValueError, match=r"^engine='native' cannot run here: a config with traced leaves"):
        jax.grad(lambda c: decide(*x, c, engine="native").C_final.sum())(MDLConfig())


def test_what_the_kernel_cannot_run_is_a_one_line_error_by_name_and_pure_jax_under_auto(rng):
    x = rng.uniform(size=(3, 64)).astype(np.float32)
    # a config swept by vmap has tracer leaves: not for the kernel, and still correct under "auto"
    sig = jnp.array([0.15, 0.2])
    swept = jax.vmap(lambda s: decide(*x, MDLConfig(sigma=s), validate=False, engine="auto").C_final)(sig)
    np.testing.assert_allclose(np.asarray(swept[1]), np.asarray(_pure(*x, MDLConfig()).C_final), atol=2e-6)
    wide = MDLConfig(D=20, dims=(6, 7, 7))
    assert not native.supports(wide)
    with pytest.raises(ValueError, match=r"^engine='native' cannot run here: .*D = 16 \(this one has D = 20\)$"):
        _engine(*x, wide)
    inside = jax.jit(lambda m, r, a: decide(m, r, a, engine="auto").C_final)(*x)
    np.testing.assert_allclose(np.asarray(inside), np.asarray(_pure(*x, MDLConfig()).C_final), atol=1e-6)
    with pytest.raises(ValueError, match=r"^engine='native' cannot run here: traced input"):
        jax.jit(lambda m, r, a: _engine(m, r, a).C_final)(*x)
    with jax.enable_x64(True):  # float64 keeps its precision: the kernel is float32-only
        out64 = decide(*x.astype(np.float64), engine="auto")
        assert out64.C_final.dtype == jnp.float64 and out64.v_meta.dtype == jnp.float64
        one64 = decide(0.3, 0.4, 0.5, engine="auto")
        assert one64.C_final.dtype == jnp.float64
        with pytest.raises(ValueError, match=r"^engine='native' cannot run here: .*float32.*float64$"):
            _engine(*x.astype(np.float64))


def test_missing_compiler_falls_back_with_one_warning(rng, monkeypatch, tmp_path):
    # Failure path: no compiler and an empty cache. decide must warn once and still answer.
    monkeypatch.setattr(engine_kernel, "_STATE", {})
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(native.NativeBuildError, match="no C\\+\\+ compiler"):
        native.build(native.library_path())
    x = rng.uniform(size=(3, 40)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named first: the error alone, no word of a fallback that does not run
        for args in (x, (0.3, 0.4, 0.5)):
            with pytest.raises(ValueError, match=r"^engine='native' cannot run here: the kernel could not be built"):
                _engine(*args)
    with pytest.warns(RuntimeWarning, match="native CPU kernel unavailable"):
        out = decide(*x, engine="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decide(*x, engine="auto")  # warned once, not per call
        with pytest.raises(ValueError, match=r"^engine='native' cannot run here: the kernel could not be built"):
            _engine(*x)
    assert native.status()["ok"] is False
    assert_parity(out, _pure(*x, MDLConfig()), MDLConfig(), atol=0)


def test_kernel_rejects_a_malformed_params_buffer():
    x = jnp.full(4, 0.5, jnp.float32)
    with pytest.raises(Exception, match="params has the wrong size"):
        native._native_jit(x, x, x, jnp.zeros(10, jnp.float32), flags=31, dims=(5, 5, 6))
    # the structured fusion reads the subspace dims from the packed params too: they must agree
    with pytest.raises(Exception, match="packed for other subspace dims"):
        native._native_jit(x, x, x, native.params(MDLConfig()), flags=31, dims=(4, 6, 6))
    assert native.load()
    p, _, _ = native._small_plan(MDLConfig())
    one = np.zeros(1, np.float32).ctypes.data
    assert native.loaded_library().MdlDecideSmallF32(one, one, one, p.ctypes.data, 1, 31, 4, 6, *([0] * 8)) == 1


def test_zero_norm_v_meta_gives_no_nan_in_the_kernel():
    cfg = MDLConfig(gains=(0.0, 0.0, 0.0), eps_c=0.0, bias=0.0)
    out = _engine(np.full(20, 0.5, np.float32), np.full(20, 0.5, np.float32), np.full(20, 0.5, np.float32), cfg)
    assert np.all(np.asarray(out.norm) == 0.0) and np.all(np.asarray(out.alpha) == 0.0)
    for f in FIELDS:
        assert np.all(np.isfinite(np.asarray(getattr(out, f)))), f


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu():
    # experiments/bench_gpu.py is what a session with a GPU runs in one call; keep it working here.
    from experiments import bench_gpu

    # standard promotion for this one: the script tunes through optax's Adam, whose bias correction
    # raises a float to an int32 count (optax is not written for strict promotion; the controller is)
    with jax.numpy_dtype_promotion("standard"):
        res = bench_gpu.main(["--allow-cpu", "--n", "50000", "--parity-n", "5000", "--reps", "2",
                              "--sweep-configs", "5", "--tune-steps", "3"])
    assert res["parity"]["cpu_native_vs_device_highest"]["C_final"] < 1e-5
    assert res["parity_max_abs_diff"] == 0.0  # CPU vs itself: the pure-JAX graph is deterministic
    assert res["throughput"]["decide"] > 0
    assert res["sweep_sigma"]["decisions_per_s"] > 0 and res["tune_all"]["warm_s"] > 0


@pytest.mark.slow
def test_a_corrupt_cached_library_is_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setattr(engine_kernel, "_STATE", {})
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(tmp_path))
    path = native.library_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: it must recover
        assert native.load()
    assert path.stat().st_size > 10_000


def test_concurrent_calls_from_python_threads_are_independent(rng):
    # Each call owns its work queue; calls from several threads share only XLA's pool.
    from concurrent.futures import ThreadPoolExecutor

    xs = [rng.uniform(size=(3, 30_000 + 7 * i)).astype(np.float32) for i in range(6)]
    serial = [np.asarray(_engine(*x).C_final) for x in xs]
    with ThreadPoolExecutor(3) as pool:
        parallel = list(pool.map(lambda x: np.asarray(_engine(*x).C_final), xs))
    for a, b in zip(serial, parallel):
        assert np.array_equal(a, b)


# --- ISA variants ---------------------------------------------------------------------------------
# Every variant this CPU runs besides the process's own (the one the tests above check). On an
# AVX-512 CPU that is the AVX2 build (8 records per ymm register), what an AVX2-only CPU (Zen 3)
# runs: it must decide what decide_one decides, and computes the same float operations in the same
# order per record as the process's variant, so its outputs are the same bits (ties included).
_OTHER_ISAS = [v for v in native.available_isas() if v != "native" and v != native.isa()]


@pytest.mark.parametrize("variant", _OTHER_ISAS or [pytest.param(None, marks=pytest.mark.skip(
    reason="this CPU runs one ISA variant only: the tests above cover it"))])
@pytest.mark.slow
def test_every_isa_variant_matches_pure_jax_and_the_default_variant_bit_for_bit(variant):
    rng = np.random.default_rng(11)
    g = np.array([0.0, 1.0, 0.5, np.nextafter(np.float32(0), np.float32(1))], np.float32)
    corners = np.stack([a.ravel() for a in np.meshgrid(g, g, g, indexing="ij")])
    x = np.concatenate([corners, np.linspace(0, 1, 16, dtype=np.float32)[None].repeat(3, 0),
                        rng.uniform(size=(3, 20_011)).astype(np.float32)], 1)
    cfgs = [MDLConfig(), MDLConfig(sigma=1e-4), MDLConfig(sigma=5.0),
            MDLConfig(sigma=0.07, eps_c=0.05, gains=(0.9, 0.8, 0.6), g_A_coeffs=(0.4, 0.7),
                      gate_coeffs=(0.2, 0.9), thresholds=(0.7, 0.45, 0.1), n_min=1.0, n_max=3.6,
                      bias=np.linspace(-0.2, 0.2, 16), dims=(4, 7, 5), qr_seed=7)]
    cfgs += [MDLConfig(**{s: "identity" if s == "subspaces" else False}) for s in
             ("alpha_gating", "risk_modulation", "risk_inversion", "value_encoding", "subspaces")]
    for i, cfg in enumerate(cfgs):
        got = native.decide_variant(variant, *x, cfg)
        if i == 3:  # the contract (5000 records: the program compiled for the test above is reused);
            # for the other configs it follows from the bits and the tests above
            assert_parity(native.decide_variant(variant, *x[:, :5000], cfg), _pure(*x[:, :5000], cfg), cfg)
        ref = _native(*x, cfg)
        for f in FIELDS:
            assert np.array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f))), (cfg, f)
    # every tail width (8-lane and 16-lane blocks) and the thread-pool path with a ragged last chunk
    for n in (1, 7, 9, 17, 2049):
        got, ref = native.decide_variant(variant, *x[:, :n]), _native(*x[:, :n], MDLConfig())
        for f in FIELDS:
            assert np.array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f))), (n, f)
    nan = np.array([[np.nan, 0.5], [0.5, 0.5], [0.5, np.nan]], np.float32)
    assert np.array_equal(np.asarray(native.decide_variant(variant, *nan).action), [3, 3])  # Opt-Out


def test_isa_choice_follows_the_cpu_flags_and_the_override(monkeypatch):
    zen3 = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi1 bmi2 f16c".split())
    monkeypatch.delenv(native.ENV_ISA, raising=False)
    monkeypatch.setattr(engine_cpu, "is_x86", lambda: True)
    monkeypatch.setattr(engine_cpu, "cpu_flags", lambda: zen3)
    assert native.available_isas() == ("avx2", "native") and native.isa() == "avx2"
    monkeypatch.setenv(native.ENV_ISA, "avx512")
    with pytest.raises(native.NativeBuildError, match="cannot run it .no avx512f"):
        native.isa()
    monkeypatch.setenv(native.ENV_ISA, "sse9")
    with pytest.raises(native.NativeBuildError, match="expected auto or one of"):
        native.isa()
    monkeypatch.setattr(engine_cpu, "cpu_flags", lambda: zen3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl"})
    monkeypatch.setenv(native.ENV_ISA, "auto")
    assert native.isa() == "avx512"
    monkeypatch.setenv(native.ENV_ISA, "AVX2")
    assert native.isa() == "avx2"
    # the cache key follows the flags: each variant has its own library
    assert "-mno-avx512f" in native.build_flags("avx2") and "-mno-avx512f" not in native.build_flags("avx512")
    paths = {native.library_path(variant=v) for v in native.ISAS}
    assert len(paths) == 3 and native.library_path().name.startswith("decide_cpu-avx2-")


def test_a_cpuinfo_that_is_not_utf8_is_read_for_its_flags(monkeypatch, tmp_path):
    """A /proc/cpuinfo with bytes that are not UTF-8 (a brand string a hypervisor set) is read for its
    flags: the bfloat16 kind the embedder's cache key holds was read so before it shared cpu_flags'
    reading, which raised UnicodeDecodeError there."""
    from pathlib import Path

    from mdl_jax.signals import onnx_runtimes

    fake = tmp_path / "cpuinfo"
    fake.write_bytes(b"processor\t: 0\nmodel name\t: Caf\xe9 CPU\nflags\t\t: fpu avx512_bf16 sse2\n")
    monkeypatch.setattr(engine_cpu, "Path", lambda p: fake if str(p) == "/proc/cpuinfo" else Path(p))
    engine_cpu.cpu_flags.cache_clear()
    try:
        assert {"fpu", "avx512_bf16", "sse2"} <= engine_cpu.cpu_flags()
        assert onnx_runtimes.cpu_bf16_kind() == "avx512_bf16"
        assert "|flags\t\t: fpu avx512_bf16 sse2" in engine_cpu.cpu_signature()
    finally:
        engine_cpu.cpu_flags.cache_clear()


def test_a_flag_cpuinfo_lists_but_the_process_cannot_run_is_not_built_for(monkeypatch):
    """Where /proc/cpuinfo says more than CPUID does (QEMU's user mode passes the host's file through:
    an AVX2-only guest on an AVX-512 host), NumPy's runtime check decides: no AVX-512 variant (its first
    call would die of SIGILL), and a cache key apart from the host's build."""
    monkeypatch.delenv(native.ENV_ISA, raising=False)
    listed = native.cpu_flags()
    monkeypatch.setattr(engine_cpu, "numpy_features", lambda: {"AVX2": True, "FMA3": True, "AVX512F": False,
                                                            "AVX512BW": False, "AVX512DQ": False, "AVX512VL": False})
    native.cpu_flags.cache_clear()
    try:
        assert not {"avx512f", "avx512bw", "avx512dq", "avx512vl"} & native.cpu_flags()
        assert {"avx2", "fma"} & listed <= native.cpu_flags()
        if engine_cpu.is_x86() and {"avx2", "fma"} <= listed:
            assert native.isa() == "avx2"
        if "avx512f" in listed:  # an AVX-512 host: the key says what was left out
            assert "|not avx512bw avx512dq avx512f avx512vl" in engine_cpu.cpu_signature()
    finally:
        native.cpu_flags.cache_clear()
    monkeypatch.setattr(engine_cpu, "numpy_features", lambda: {})  # a NumPy that does not say: cpuinfo alone
    native.cpu_flags.cache_clear()
    try:
        assert native.cpu_flags() == listed
    finally:
        native.cpu_flags.cache_clear()


@pytest.mark.parametrize("n", [1, 5, 16, 17, 100, native.SMALL_CALL])
def test_small_numpy_call_gives_the_ffi_calls_bits_without_dispatch(n, rng):
    # decide_small (ctypes, NumPy in and out: the engine's path for a small call, the memory gate's per
    # query) runs the blocks an FFI call of that size runs inline, so every field must be bit-identical,
    # for any config the kernel takes; over SMALL_CALL records (the kernel's threaded path) it declines.
    M, R, A = (rng.uniform(0, 1, n).astype(np.float32) for _ in range(3))
    for cfg in (MDLConfig(), MDLConfig(thresholds=(0.7, 0.5, 0.3), sigma=0.2, gate_coeffs=(0.2, 0.8)),
                MDLConfig(subspaces="identity", risk_inversion=False, alpha_gating=False)):
        got, want = native.decide_small(M, R, A, cfg), _native(M, R, A, cfg)
        assert got is not None and set(got) == set(Decision._fields)
        for f in Decision._fields:
            w = np.asarray(getattr(want, f))
            assert got[f].dtype == w.dtype and got[f].shape == w.shape and np.array_equal(got[f], w), f
    big = np.full(native.SMALL_CALL + 1, 0.5, np.float32)
    assert native.decide_small(big, big, big, MDLConfig()) is None


def test_bench_controller_compare_rev_exports_a_commit_and_names_a_bad_one(tmp_path):
    # bench_controller --compare-rev measures an earlier commit's own kernel: its mdl_jax is taken
    # from git; a name that is no commit, an option-like name, a tree, or a commit from before the
    # controller's native.py (which the measuring child imports) is an error naming it, before any work
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    from experiments import bench_controller as b

    sha = b._export_rev("HEAD", tmp_path / "head")
    assert len(sha) == 40
    assert (tmp_path / "head" / "mdl_jax" / "engines" / "_native" / "decide_cpu.cc").is_file()
    for rev, says in (("no-such-rev", "not a commit"), ("--all", "expected a commit"), ("", "expected a commit"),
                      ("HEAD^{tree}", "not a commit")):
        with pytest.raises(b.CompareRevError, match=f"--compare-rev {re.escape(repr(rev))}.*{says}"):
            b._resolve_rev(rev)
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()[0]
    with pytest.raises(b.CompareRevError, match="predates mdl_jax/controller/native.py"):
        b._export_rev(first, tmp_path / "first")
    assert not (tmp_path / "first").exists()  # refused before anything is written
    # the CLI says it in one line, before measuring anything
    r = subprocess.run([sys.executable, "-m", "experiments.bench_controller", "--compare-rev", "no-such-rev"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--compare-rev 'no-such-rev': not a commit" in r.stderr, r.stderr[-500:]
    r = subprocess.run([sys.executable, "-m", "experiments.bench_controller", "--compare-rev", "HEAD"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "MDL_JAX_NATIVE": "0"})
    assert r.returncode == 2 and "MDL_JAX_NATIVE=0" in r.stderr, r.stderr[-500:]


def test_bench_controller_no_slower_verdict_allows_for_noise():
    from experiments import bench_controller as b

    assert b._verdict([1.01, 1.2], 1.1) == "met in every round"
    assert b._verdict([0.9, 1.2], 1.02) == "met at the median"
    assert b._verdict([0.9, 1.0], 0.97).startswith("level")
    assert b._verdict([0.8, 0.9], 0.9) == "NOT met"


@pytest.mark.slow
def test_bench_controller_compare_rev_measures_the_named_tree_in_its_own_process():
    # the child must import the checkout it was sent to (not the installed mdl_jax) and run its kernel
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    from experiments import bench_controller

    out = bench_controller._against_revs(["HEAD"], [4096], rounds=1, min_time=0.01)
    row = out["revs"]["HEAD"]
    assert set(row["ratio_rounds"]) == {"4096", "one_core"}
    assert all(np.isfinite(r) and r > 0 for rs in row["ratio_rounds"].values() for r in rs)
    assert out["isa"]["HEAD"] == out["isa"]["this tree"] == native.isa()


def test_bench_gate_reports_every_engine_beside_the_default_or_why_it_cannot_run():
    # bench_gate times the decision stage on each engine in one process, as ratios to the default; an
    # engine that cannot run here (the fused kernel without a GPU) is named with its reason, not dropped.
    from experiments import bench_gate

    r = bench_gate.child_engines(2048, 512, rounds=2)
    assert r["engines"][0] == "jax" and r["engines"][-1] == "auto" and "native" in r["engines"]
    assert set(r["engines"]) | set(r["unavailable"]) == {"jax", "native", "pallas", "auto"}
    if jax.default_backend() == "cpu":
        assert "GPU" in r["unavailable"]["pallas"]
    assert r["speed_vs_default"]["jax"] == 1.0
    assert all(np.isfinite(v) and v > 0 for v in r["speed_vs_default"].values())
    line = bench_gate.engines_line(r)
    for e in r["engines"][1:]:
        assert f"{e!r} " in line
    for e, why in r["unavailable"].items():
        assert f"{e!r}: not available: {why}" in line


# --- the kernel cache: a truncated or half-written library is rebuilt, never loaded -------------------------


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
    monkeypatch.setattr(engine_kernel, "_STATE", {})
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

    real_load = engine_kernel.ctypes.cdll.LoadLibrary

    def spy_load(name):  # refuse (instead of crashing pytest) if a short library reaches dlopen
        loaded.append(Path(name).stat().st_size)
        assert Path(name).stat().st_size == len(lib_bytes), "a truncated library was loaded"
        return real_load(name)

    monkeypatch.setattr(engine_kernel, "build", fake_build)
    monkeypatch.setattr(engine_kernel.ctypes.cdll, "LoadLibrary", spy_load)
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


# --- the library cache: only this user's folder, only regular files, only complete libraries ------------


_TINY = 'extern "C" int MdlTiny() { return 7; }\n'


@pytest.fixture
def tiny_source(tmp_path):
    """A one-function C++ source: builds in well under a second (skipped without a compiler)."""
    if toolchain.compiler() is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "tiny.cc"
    src.write_text(_TINY)
    return src


def _tiny_flags():
    return ["-O1", "-shared", "-fPIC"]


def _fake_compiler(tmp_path, body: str) -> str:
    script = tmp_path / "fake-cxx"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_a_linked_cache_folder_is_judged_by_the_folder_it_leads_to(tiny_source, tmp_path):
    # A cache shared through a link works when the folder it leads to is this user's alone (made so);
    # a link to a folder someone else owns is refused before anything is read or built there.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o777)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "native").symlink_to(elsewhere)
    out = tmp_path / "cache" / "native" / "tiny.so"
    lib = toolchain.load_library(out, lambda p: toolchain.compile_library(tiny_source, _tiny_flags(), p))
    assert lib.MdlTiny() == 7 and elsewhere.stat().st_mode & 0o022 == 0 and (elsewhere / "tiny.so").is_file()
    (tmp_path / "cache3").mkdir()
    (tmp_path / "cache3" / "native").symlink_to(tmp_path / "nowhere" / "deeper")
    with pytest.raises(native.NativeBuildError, match=r"is a link to nothing"):
        toolchain.load_library(tmp_path / "cache3" / "native" / "tiny.so",
                               lambda p: toolchain.compile_library(tiny_source, _tiny_flags(), p))
    assert not (tmp_path / "nowhere").exists()   # never made wherever a dangling link points
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return   # handing a folder to another user takes root
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    (tmp_path / "cache2").mkdir()
    (tmp_path / "cache2" / "native").symlink_to(theirs)
    with pytest.raises(native.NativeBuildError, match=r"native library cache .*belongs to another user"):
        toolchain.load_library(tmp_path / "cache2" / "native" / "tiny.so",
                               lambda p: toolchain.compile_library(tiny_source, _tiny_flags(), p))
    assert list(theirs.iterdir()) == []


def test_a_group_writable_cache_folder_is_made_private_before_use(tiny_source, tmp_path):
    folder = tmp_path / "native"
    folder.mkdir()
    folder.chmod(0o777)
    lib = toolchain.load_library(folder / "tiny.so", lambda p: toolchain.compile_library(tiny_source, _tiny_flags(), p))
    assert lib.MdlTiny() == 7 and folder.stat().st_mode & 0o022 == 0


def test_a_record_that_is_not_text_or_not_a_file_is_not_verified_and_never_waited_on(tiny_source, tmp_path):
    out = toolchain.compile_library(tiny_source, _tiny_flags(), tmp_path / "native" / "tiny.so")
    assert toolchain.verified(out)
    record = toolchain.record_path(out)
    record.write_bytes(b"\xff\xfe garbage\n")     # not UTF-8: "not verified", no UnicodeDecodeError
    assert not toolchain.verified(out)
    record.unlink()
    os.mkfifo(record)                               # a FIFO: read it and the process waits forever
    proc = subprocess.run([sys.executable, "-c", "import sys, pathlib; from mdl_jax.engines import toolchain; "
                           "print(toolchain.verified(pathlib.Path(sys.argv[1])))", str(out)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]
    record.unlink()
    record.symlink_to(tmp_path / "elsewhere.sha256")   # a link is not followed, even to the right text
    (tmp_path / "elsewhere.sha256").write_bytes(toolchain._record(out.read_bytes()))
    assert not toolchain.verified(out)
    # and the library is rebuilt over them: the link replaced, its target untouched
    toolchain.load_library(out, lambda p: toolchain.compile_library(tiny_source, _tiny_flags(), p))
    assert toolchain.verified(out) and not record.is_symlink()
    assert (tmp_path / "elsewhere.sha256").read_bytes() == toolchain._record(out.read_bytes())


def test_a_cut_short_library_under_a_matching_record_is_not_verified(tiny_source, tmp_path):
    # A record rewritten to match a truncated library (a cache "repaired" by hand): loading it would be
    # SIGBUS on the first call into a missing page, so the ELF check runs at load time too.
    out = toolchain.compile_library(tiny_source, _tiny_flags(), tmp_path / "native" / "tiny.so")
    short = out.read_bytes()[:2000]
    out.write_bytes(short)
    toolchain.record_path(out).write_bytes(toolchain._record(short))
    assert not toolchain.verified(out)


def test_a_compiler_that_leaves_no_library_is_a_one_line_error(tiny_source, tmp_path, monkeypatch):
    garbage = _fake_compiler(tmp_path, 'while [ "$1" != "-o" ]; do shift; done; printf garbage > "$2"\n')
    monkeypatch.setenv("CXX", garbage)
    with pytest.raises(native.NativeBuildError, match=r"^the C\+\+ compiler \(fake-cxx\) left no complete library"):
        toolchain.compile_library(tiny_source, _tiny_flags(), tmp_path / "native" / "tiny.so")
    failing = _fake_compiler(tmp_path, 'echo "tiny.cc:1:1: note: in this file" >&2\n'
                             'echo "tiny.cc:2:5: error: expected something" >&2\necho "1 error" >&2\nexit 1\n')
    monkeypatch.setenv("CXX", failing)
    with pytest.raises(native.NativeBuildError) as e:
        toolchain.compile_library(tiny_source, _tiny_flags(), tmp_path / "native" / "tiny.so")
    assert str(e.value) == ("the C++ compiler failed (fake-cxx tiny.cc, exit 1): tiny.cc:2:5: error: "
                            "expected something")
    assert sorted(p.name for p in (tmp_path / "native").iterdir()) == []   # nothing left behind


def test_cxx_is_the_compiler_command_as_a_shell_splits_it(tiny_source, tmp_path, monkeypatch):
    log = tmp_path / "wrapper.log"
    real = toolchain.compiler()
    wrapper = _fake_compiler(tmp_path, f'echo "$@" >> {log}\nexec "$@"\n')   # as ccache: CXX="ccache g++"
    monkeypatch.setenv("CXX", f"{wrapper} {real}")
    assert toolchain.compiler() == f"{wrapper} {real}"
    out = toolchain.compile_library(tiny_source, _tiny_flags(), tmp_path / "native" / "tiny.so")
    assert toolchain.verified(out) and real in log.read_text()
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert toolchain.compiler() is None   # never another compiler behind the user's back
    with pytest.raises(native.NativeBuildError, match=r"\$CXX is '.*no-such-compiler', which names no program"):
        toolchain.compile_library(tiny_source, _tiny_flags(), tmp_path / "native" / "tiny2.so")


def test_a_killed_builds_temporaries_are_removed_by_the_next_build(tiny_source, tmp_path):
    import time

    folder = tmp_path / "native"
    folder.mkdir()
    old_dir, old_file, fresh = folder / ".tiny.so.x1.tmp", folder / "tmpab12.so", folder / ".tiny.so.x2.tmp"
    old_dir.mkdir()
    (old_dir / "tiny.so").write_bytes(b"half")
    old_file.write_bytes(b"half")
    fresh.mkdir()   # a build running now, in another process: not touched
    hour_ago = time.time() - 2 * 3600
    for p in (old_dir, old_file):
        os.utime(p, (hour_ago, hour_ago))
    toolchain.compile_library(tiny_source, _tiny_flags(), folder / "tiny.so")
    assert sorted(p.name for p in folder.iterdir()) == [".tiny.so.x2.tmp", "tiny.so", "tiny.so.sha256"]
