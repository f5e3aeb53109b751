"""The small-store path's float64 dot products in C++ (``_native/dots.cc``): per row, the cosines of
its memories with its query and among themselves, read by index from the unique texts' embeddings.

In NumPy a step of ``aggregation.small_signals`` gathered the rows' vectors, cast them to float64 and ran
one BLAS product per row for the query and one for the pairs: most of the cached gate's time
aggregating, mostly the copies and BLAS's per-call packing (experiments.bench_gate). Here each dot
product is one pass over two float32 vectors with a fixed summation order (see the source), with
neither. The bits are the kernel's own, the same on every CPU the library builds for;
NumPy's BLAS sums in another order, so a row's M, R may differ from the NumPy path's in the last
float64 bit before the one rounding to float32 (deviations list). Every path of a process (the bulk
steps, a call of a few rows, ``aggregate_small``) takes the same one, so a row's bits never depend on
its neighbours in a call.

Built like the conflict detector (``conflict_native``): on first use, with the system compiler and
portable flags (the AVX-512 / AVX2 clones are chosen at load time by the CPU), cached under
``$MDL_JAX_CACHE_DIR/native``, loaded only when its bytes match its build record. No compiler, a failed
build or ``MDL_JAX_NATIVE=0`` leave the NumPy products in use; ``available()`` says which runs.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from mdl_jax.engines import native as _native

_SOURCE = Path(__file__).with_name("_native") / "dots.cc"
# -ffp-contract=off: a multiply and an add, never fused, so every clone rounds alike (see the source)
FLAGS = ["-O2", "-ffp-contract=off", "-std=c++17", "-fPIC", "-shared", "-w"]
_STATE: dict = {}
_LOCK = threading.Lock()


def library_path(cache_dir: Path | None = None) -> Path:
    """Where the built library lives: keyed by the source, the compiler, its flags and the machine."""
    return _native.source_library_path(_SOURCE, FLAGS, "dots", cache_dir)


def available(warn: bool = True) -> bool:
    """True when the native products are loaded (built on the first call); False: NumPy's run.
    A failed build warns once, on the first call with ``warn``."""
    def load():
        fn = _native.load_source_library(_SOURCE, FLAGS, library_path()).MdlSmallDots
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        return {"fn": fn}

    return _native.load_once(_STATE, _LOCK, load, "native dot products", "NumPy's", warn)


def step_dots(U: np.ndarray, idx: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cosines of m rows of S memories each (call only when ``available()``).

    Args:
      U: (n, d) float32 C-contiguous embeddings of the unique texts.
      idx: (m, S) rows of ``U``: row r's memories.
      Q: (m, d) float32: row r's query embedding.

    Returns:
      (cos (m, S), upper (m, S(S-1)/2)) float64: cos[r, i] = ⟨U[idx[r, i]], Q[r]⟩, upper[r, p] =
      ⟨U[idx[r, i]], U[idx[r, j]]⟩ for the p-th pair i < j in row-major order.

    Raises:
      ValueError: arrays of other shapes or dtypes, or an index outside U's rows.
    """
    if U.dtype != np.float32 or Q.dtype != np.float32 or U.ndim != 2 or Q.ndim != 2 or idx.ndim != 2 \
            or Q.shape != (idx.shape[0], U.shape[1]):
        raise ValueError(f"step_dots: expected U (n, d) and Q (m, d) float32 and idx (m, S), got U "
                         f"{U.shape} {U.dtype}, Q {Q.shape} {Q.dtype}, idx {idx.shape}")
    U = np.ascontiguousarray(U)
    Q = np.ascontiguousarray(Q)
    idx = np.ascontiguousarray(idx, np.int64)
    m, S = idx.shape
    cos = np.empty((m, S), np.float64)
    upper = np.empty((m, S * (S - 1) // 2), np.float64)
    a = _native.address  # (a third of .ctypes.data's cost per address, and a gate query takes five)
    if m and S and _STATE["fn"](a(U), U.shape[0], U.shape[1], a(idx), a(Q), m, S, a(cos), a(upper)) != 0:
        raise ValueError(f"step_dots: an index outside U's {U.shape[0]} rows")
    return cos, upper


def status() -> dict:
    """{"available": bool, "path" or "error"}: which products run, and why (a
    failure is said here, not warned of)."""
    ok = available(warn=False)
    error = _STATE.get("error", "") if _native.enabled() else f"{_native.ENV_SWITCH}=0"
    return {"available": ok, **({"path": str(library_path())} if ok else {"error": error})}
