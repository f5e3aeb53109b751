"""The native CPU engine: ``decide`` and ``sweep`` on the C++ kernel, the module the controller loads
by name (``decide(..., engine="native")``, ``sweep(..., engine="native")``, or ``engine="auto"`` on
the CPU); the controller never imports it itself.

This module is the engine's front: the decide engine (``why_not``, ``decide_engine``, the inline
paths ``decide_record`` and ``decide_small``, ``decide_variant`` for tests and benchmarks) and the
names callers use, re-exported from the modules that do one job each:

  toolchain.py     build machinery: compile, verify, cache and load a C++ library (shared with the
                   signals' C++ helpers)
  cpu.py           what this CPU and process can run: flags, the ISA variant, usable CPUs
  packing.py       a config as the kernel's float32 params buffer (one config, or a batch)
  kernel.py        the kernel's library in this process: built, loaded, registered with XLA's FFI
  native_sweep.py  the sweep engine: configs × records in one kernel call per pass

The kernel computes what ``decision.decide_one`` computes (tests/test_native.py: every float within
2e-6 of the pure-JAX engine, NaN and ±inf → Opt-Out alike); the engine answers with NumPy arrays. It runs
concrete float32 signals with a config of D = 16 on JAX's CPU backend; anything else (traced input,
float64, D ≠ 16, a GPU backend) is the pure-JAX engine's (``why_not`` says which). A call of at most
``SMALL_CALL`` records runs inline on the caller's thread through ctypes, NumPy to NumPy, without
XLA's dispatch; a larger one is one FFI call on every thread of XLA's pool.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller import config as _config
from mdl_jax.controller import decision as _decision
from mdl_jax.controller.config import MDLConfig
from mdl_jax.engines.cpu import ENV_ISA, ISAS, available_isas, cpu_flags, isa, numpy_features, usable_cpus
from mdl_jax.engines.kernel import (
    SMALL_CALL,
    SOURCE,
    SWEEP_TARGET,
    TARGET,
    build,
    build_flags,
    library_path,
    load,
    load_variant,
    loaded_library,
    status,
    threads_used,
    unavailable,
    variant_library,
)
from mdl_jax.engines.native_sweep import sweep_available, sweep_engine, sweep_why_not
from mdl_jax.engines.packing import (
    PARAMS,
    flags,
    pack,
    pack_batch,
    params,
    supports,
    sweep_supports,
    why_unsupported,
)
from mdl_jax.engines.toolchain import (
    ENV_SWITCH,
    NativeBuildError,
    address,
    compile_library,
    compiler,
    enabled,
    load_once,
    load_source_library,
    source_library_path,
    verified,
)

__all__ = [
    "ENV_ISA", "ENV_SWITCH", "ISAS", "PARAMS", "SMALL_CALL", "SOURCE", "SWEEP_TARGET", "TARGET",
    "NativeBuildError", "address", "available_isas", "build", "build_flags", "compile_library", "compiler",
    "cpu_flags",
    "decide_engine", "decide_ffi", "decide_record", "decide_small", "decide_variant", "enabled", "flags", "isa",
    "library_path", "load", "load_once", "load_source_library", "load_variant", "loaded_library",
    "numpy_features", "pack", "pack_batch", "params", "source_library_path", "status", "supports",
    "sweep_available", "sweep_engine", "sweep_supports", "sweep_why_not", "threads_used", "unavailable",
    "usable_cpus", "variant_library", "verified", "why_not",
]

_F32 = jnp.float32


def _output_types(n: int) -> list[jax.ShapeDtypeStruct]:
    # The kernel's eight outputs for n records, in ``Decision``'s order.
    return [jax.ShapeDtypeStruct((n,), jnp.int32)] + [jax.ShapeDtypeStruct((n,), _F32)] * 3 + [
        jax.ShapeDtypeStruct((n, 16), _F32), jax.ShapeDtypeStruct((n, 3), _F32),
        jax.ShapeDtypeStruct((n,), _F32), jax.ShapeDtypeStruct((n,), _F32)]


def _native_shaped(M, R, A, params, flags: int, dims: tuple[int, int, int],
                   target: str = TARGET) -> _decision.Decision:
    # The same contract as the pure-JAX program, computed by the FFI kernel.
    shape = jnp.broadcast_shapes(M.shape, R.shape, A.shape)
    flat = [jnp.broadcast_to(x, shape).reshape(-1).astype(_F32) for x in (M, R, A)]
    out = jax.ffi.ffi_call(target, _output_types(flat[0].shape[0]))(
        *flat, params, flags=np.int64(flags), d_wm=np.int64(dims[0]), d_r=np.int64(dims[1]))
    return _decision.Decision(*(o.reshape(shape + o.shape[1:]) for o in out))


_native_jit = jax.jit(_native_shaped, static_argnames=("flags", "dims", "target"))

def why_not(cfg: MDLConfig, signals=(), *, warn: bool = True) -> str | None:
    """Why ``decide`` cannot run this call on the engine (the process, then the config), else None.

    Args:
      cfg: one config.
      signals: the call's signals (unused here: any concrete float32 array is read on the host).
      warn: warn (once per process) when the kernel cannot be built: for "auto", which goes on with
        the pure-JAX engine; a caller that named the engine raises the reason instead.

    Returns:
      A short reason, or None when the engine can run it.
    """
    why = unavailable(warn)
    if why is not None:
        return why
    return None if supports(cfg) else why_unsupported(cfg)


def decide_engine(M, R, A, cfg: MDLConfig, *, strict: bool = True) -> _decision.Decision:
    """``decide`` on the kernel: checked float32 signals of one broadcast shape S → a ``Decision`` of
    NumPy arrays (fields S, v_meta S + (16,), energies S + (3,)).

    Args:
      M: relevance, concrete float32 values (NumPy or JAX arrays, Python floats), checked already.
      R: reliability, as ``M``.
      A: task risk, as ``M``.
      cfg: a config ``why_not`` accepts.
      strict: unused (the kernel has no failure to fall back from once loaded).

    Returns:
      The ``Decision``, as ``decide`` defines it, with NumPy fields.
    """
    shape = np.broadcast_shapes(*(np.shape(x) for x in (M, R, A)))
    flat = [np.ascontiguousarray(np.broadcast_to(np.asarray(x, np.float32), shape)).reshape(-1)
            for x in (M, R, A)]
    n = flat[0].shape[0]
    if n == 0:
        f = np.zeros((0,), np.float32)
        return _decision.Decision(np.zeros(shape, np.int32), *(f.reshape(shape),) * 3,
                                  np.zeros(shape + (16,), np.float32), np.zeros(shape + (3,), np.float32),
                                  f.reshape(shape), f.reshape(shape))
    small = decide_small(flat[0], flat[1], flat[2], cfg) if n <= SMALL_CALL else None
    if small is not None:
        out = [small[k] for k in ("action", "C", "alpha", "C_final", "v_meta", "energies", "norm", "g_A")]
    else:
        with jax.ensure_compile_time_eval():   # run now, also when called inside a caller's jit
            out = [np.asarray(x) for x in _native_jit(*flat, params(cfg), flags=flags(cfg), dims=cfg.dims)]
    return _decision.Decision(*(o.reshape(shape + o.shape[1:]) for o in out))


# Where each output starts in decide_small's buffer, in records: action, C, alpha, C_final, v_meta
# (16 a record), energies (3), norm, g_A, the order of MdlDecideSmallF32's arguments.
_SMALL_OFFSETS = (0, 1, 2, 3, 4, 20, 23, 24)


@_config.per_config_cache
def _small_plan(cfg: MDLConfig) -> tuple[np.ndarray, int, int] | None:
    # What depends only on the config (its limits; the packed numbers and their address: the array is
    # kept alive by the plan), once per hashable config, every call for one with array leaves.
    if not supports(cfg):
        return None
    p = pack(cfg)
    return p, flags(cfg), p.ctypes.data


def decide_record(M: float, R: float, A: float, cfg: MDLConfig) -> _decision.Decision | None:
    """One record from Python floats on the kernel's inline path: the ``Decision`` of 0-d NumPy arrays
    (v_meta (16,), energies (3,)), the same bits as that record in any batch; None where the kernel
    cannot take the config or the library predates the inline entry point. For ``decide``, after its
    checks and ``why_not``."""
    fn = getattr(loaded_library(), "MdlDecideSmallF32", None)
    plan = _small_plan(cfg)
    if fn is None or plan is None:
        return None
    x = np.array((M, R, A), np.float32)
    base = address(x)
    buf = np.empty(25, np.float32)
    out = address(buf)
    if fn(base, base + 4, base + 8, plan[2], 1, plan[1], cfg.dims[0], cfg.dims[1],
          *(out + 4 * k for k in _SMALL_OFFSETS)) != 0:
        return None
    return _decision.Decision(buf[0:1].view(np.int32).reshape(()), buf[1:2].reshape(()), buf[2:3].reshape(()),
                              buf[3:4].reshape(()), buf[4:20], buf[20:23], buf[23:24].reshape(()),
                              buf[24:25].reshape(()))


def decide_small(M: np.ndarray, R: np.ndarray, A: np.ndarray, cfg: MDLConfig) -> dict[str, np.ndarray] | None:
    """``decide`` on the native kernel for a small call, from and to NumPy, without XLA's dispatch.

    For callers that hold float32 NumPy signals and want NumPy back (the memory gate, per query): the
    kernel's own inline path (``MdlDecideSmallF32``, the same blocks as a ``decide`` call of that size,
    so the same bits), called through ctypes.

    Args:
      M: (n,) relevance, a C-contiguous float32 array, values already checked to lie in [0, 1]
        (nothing is checked here).
      R: (n,) reliability, as ``M``.
      A: (n,) task risk, as ``M``.
      cfg: a concrete ``MDLConfig``.

    Returns:
      The ``Decision`` fields as NumPy arrays: action (n,) int32; C, alpha, C_final, norm, g_A (n,),
        v_meta (n, 16) and energies (n, 3), float32. None when the kernel is off or not loaded, n
        exceeds ``SMALL_CALL``, the config is outside the kernel's limits, or the library predates
        this entry point: the caller then takes ``decide``. Raises nothing of its own."""
    if not (enabled() and load()):
        return None
    fn = getattr(loaded_library(), "MdlDecideSmallF32", None)
    n = M.shape[0]
    if fn is None or n > SMALL_CALL:
        return None
    plan = _small_plan(cfg)
    if plan is None:
        return None
    _, fl, p_addr = plan
    # One buffer for the eight outputs (25 floats a record), each a contiguous slice of it: one
    # allocation and one address instead of eight.
    buf = np.empty(25 * n, np.float32)
    base = address(buf)
    rc = fn(address(M), address(R), address(A), p_addr, n, fl, cfg.dims[0], cfg.dims[1],
            *(base + 4 * n * k for k in _SMALL_OFFSETS))
    if rc != 0:
        return None
    return {"action": buf[:n].view(np.int32), "C": buf[n:2 * n], "alpha": buf[2 * n:3 * n],
            "C_final": buf[3 * n:4 * n], "v_meta": buf[4 * n:20 * n].reshape(n, 16),
            "energies": buf[20 * n:23 * n].reshape(n, 3), "norm": buf[23 * n:24 * n], "g_A": buf[24 * n:]}


def decide_variant(variant: str, M, R, A, cfg: MDLConfig | None = None) -> _decision.Decision:
    """``decide`` on float32 records through one ISA variant's kernel (no validation; tests and
    benchmarks compare the variants with it).

    Args:
      variant: one of ``available_isas()`` (loaded with ``load_variant`` on first use).
      M, R, A, cfg: as ``decide_ffi``.

    Returns:
      As ``decide_ffi``.

    Raises:
      NativeBuildError: the variant cannot run on this CPU or does not build.
    """
    return decide_ffi(load_variant(variant)["decide"], M, R, A, cfg)


def decide_ffi(target: str, M, R, A, cfg: MDLConfig | None = None) -> _decision.Decision:
    """``decide`` through any XLA FFI target registered with the kernel's signature: the process's
    (``TARGET``), a variant's (``load_variant(v)["decide"]``), or another build's that a benchmark
    registered itself (it must read this tree's params layout). No validation, no inline path.

    Args:
      target: the FFI target's name.
      M: relevance, an array of shape S (float32 JAX arrays pass without a copy).
      R: reliability, as ``M``.
      A: task risk, as ``M``.
      cfg: a config ``supports`` accepts; the defaults when None.

    Returns:
      The ``Decision`` as JAX arrays (fields S, v_meta S + (16,), energies S + (3,)).
    """
    cfg = cfg or MDLConfig()
    return _native_jit(*(jnp.asarray(x, _F32) for x in (M, R, A)), params(cfg), flags=flags(cfg),
                       dims=cfg.dims, target=target)
