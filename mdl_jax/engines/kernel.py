"""The controller's C++ kernel as a library of this process: built, loaded once, registered with XLA.

Its own module because the decide engine (``engines.native``), the sweep engine
(``engines.native_sweep``) and the benchmarks all call into the same loaded library, and the state
of that one load (did it work, which ISA variant, where the file is) is kept here and nowhere else.

The library (``_native/decide_cpu.cc``) holds two XLA FFI targets, ``mdl_decide_f32`` (a single pass
per block of 16 records, 8 on AVX2, all outputs written once, on every thread of XLA's intra-op pool)
and ``mdl_sweep_f32`` (a batch of configs × records, per-config weighted sums), and the inline entry
``MdlDecideSmallF32`` that small calls reach through ctypes. It is built for one ISA variant
(``engines.cpu.isa``), cached under ``$MDL_JAX_CACHE_DIR/native`` keyed by source, compiler flags,
jaxlib and CPU, and loaded only when verified (``engines.toolchain``). When no compiler is found or the
build fails, the engine cannot run here: named, that is a ValueError; under "auto", one warning and
the pure-JAX engine. ``load_variant`` loads another variant beside the process's own under its own
FFI target names (tests and benchmarks).

Threads: a call splits its records into one contiguous part per thread of XLA's intra-op pool (the
caller included; idle threads steal from the back of the others' parts), and each thread faults in
its part of the fresh output pages with one ``MADV_POPULATE_WRITE`` before writing them: with one
shared counter all threads wrote inside the same 2 MiB huge page at once and raced to fault (and
zero) each new one. The kernel caps its threads at ``cpu.usable_cpus()``.
"""

from __future__ import annotations

import ctypes
import hashlib
import platform
import threading
from pathlib import Path

import jax

from mdl_jax._paths import default_cache_dir
from mdl_jax.controller.api import default_backend
from mdl_jax.engines import cpu
from mdl_jax.engines.toolchain import (
    ENV_SWITCH,
    NativeBuildError,
    compile_library,
    compiler,
    enabled,
    load_library,
    load_once,
)

TARGET = "mdl_decide_f32"
SWEEP_TARGET = "mdl_sweep_f32"
SOURCE = Path(__file__).with_name("_native") / "decide_cpu.cc"
SMALL_CALL = 2048  # decide_cpu.cc: kChunk, the largest call the kernel runs inline on the caller's thread
_LOCK = threading.Lock()
_STATE: dict = {}  # "ok": bool once tried; "error": why not; "path", "lib", "isa", "lanes" once loaded
_VARIANTS: dict = {}  # isa -> {"lib", "path", "decide", "sweep", "lanes"} (load_variant)


def build_flags(variant: str | None = None) -> list[str]:
    """The compiler flags of a variant (default: ``cpu.isa()``)."""
    variant = variant or cpu.isa()
    flags = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno", "-w"]
    if variant == "avx512":
        # 512-bit vectors: one zmm register holds a 16-record block.
        return flags + ["-march=native", "-mprefer-vector-width=512", "-DMDL_LANES=16"]
    if variant == "avx2":
        # The CPU's own tuning with every AVX-512 extension off (a no-op on an AVX2-only CPU; on an
        # AVX-512 one it builds what an AVX2 CPU would run): 8-record blocks in ymm registers.
        return flags + ["-march=native", "-mno-avx512f", "-mprefer-vector-width=256", "-DMDL_LANES=8"]
    if cpu.is_x86():
        return flags + ["-march=native"]
    return flags + (["-mcpu=native"] if platform.machine() in ("aarch64", "arm64") else [])


def library_path(cache_dir: Path | None = None, variant: str | None = None) -> Path:
    """Where the built kernel lives: keyed by the source, the compiler and its flags (the ISA
    variant), jaxlib (the FFI headers) and the CPU."""
    import jaxlib

    variant = variant or cpu.isa()
    parts = [SOURCE.read_bytes(), jax.__version__, getattr(jaxlib, "__version__", ""), cpu.cpu_signature(),
             compiler() or "", " ".join(build_flags(variant))]
    key = hashlib.sha256(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))
    return (cache_dir or default_cache_dir()) / "native" / f"decide_cpu-{variant}-{key.hexdigest()[:16]}.so"


def build(out: Path, variant: str | None = None) -> Path:
    """Compile the kernel to ``out``, atomically, with its size/sha256 record beside it (see
    ``toolchain.compile_library``)."""
    return compile_library(SOURCE, [*build_flags(variant), f"-I{jax.ffi.include_dir()}"], out)


def load(warn: bool = True) -> bool:
    """Build (once per machine) and register the kernel; True when ``decide`` may use it. A failure is
    remembered (``status()["error"]``) and warned of once, on the first call with ``warn``: a caller
    that named the engine raises the error itself and has no fallback to warn of (``load_once``, the
    machinery every native library of the package loads through)."""
    def load_kernel() -> dict:
        variant = cpu.isa()
        path = library_path()
        lib = load_library(path, lambda out: build(out))
        _register(lib, TARGET, SWEEP_TARGET)
        return {"path": path, "lib": lib, "isa": variant, "lanes": int(lib.MdlLanes())}

    return load_once(_STATE, _LOCK, load_kernel, "native CPU kernel", "the pure-JAX engine", warn)


def _register(lib, decide_target: str, sweep_target: str) -> None:
    for target, fn in ((decide_target, lib.MdlDecideF32), (sweep_target, lib.MdlSweepF32)):
        try:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(fn), platform="cpu")
        except Exception as e:  # noqa: BLE001 - XLA's own error type
            # Registered earlier in this process (the state was reset, e.g. by a test): XLA keeps
            # the first handler, whose library stays loaded, so the kernel is usable.
            if "Duplicate FFI handler" not in str(e):
                raise NativeBuildError(f"registering {target} failed: {e}") from e
    lib.MdlSetMaxThreads.argtypes = [ctypes.c_int64]
    lib.MdlLastThreads.restype = ctypes.c_int64
    lib.MdlPoolThreads.restype = ctypes.c_int64
    lib.MdlLanes.restype = ctypes.c_int64
    small = getattr(lib, "MdlDecideSmallF32", None)
    if small is not None:
        ptr = ctypes.c_void_p
        small.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                          *([ptr] * 8)]
        small.restype = ctypes.c_int64
    lib.MdlSetMaxThreads(cpu.usable_cpus())


def loaded_library() -> ctypes.CDLL | None:
    """The process's loaded kernel library (its ctypes handle), None before ``load`` or after a failed one."""
    return _STATE.get("lib") if _STATE.get("ok") else None


def load_variant(variant: str) -> dict:
    """Build (cached) and register one ISA variant beside the process's own, under the FFI targets
    ``mdl_decide_f32_<variant>`` / ``mdl_sweep_f32_<variant>``.

    Args:
      variant: one of ``cpu.available_isas()``.

    Returns:
      {"path", "decide", "sweep", "lanes"}: the library's path, its two FFI target names, its lanes.

    Raises:
      NativeBuildError: the CPU cannot run it, or the build fails.
    """
    with _LOCK:
        if variant not in _VARIANTS:
            if variant not in cpu.available_isas():
                raise NativeBuildError(f"the {variant} variant does not run on this CPU ({platform.machine()})")
            path = library_path(variant=variant)
            lib = load_library(path, lambda out: build(out, variant))
            d, w = f"{TARGET}_{variant}", f"{SWEEP_TARGET}_{variant}"
            _register(lib, d, w)
            _VARIANTS[variant] = {"lib": lib, "path": str(path), "decide": d, "sweep": w,
                                  "lanes": int(lib.MdlLanes())}
        return {k: v for k, v in _VARIANTS[variant].items() if k != "lib"}


def variant_library(variant: str) -> ctypes.CDLL:
    """The ctypes handle of a variant ``load_variant`` loaded (benchmarks set its threads and read its
    clock). Raises NativeBuildError as ``load_variant`` does."""
    load_variant(variant)
    return _VARIANTS[variant]["lib"]


def unavailable(warn: bool = True) -> str | None:
    """Why the engine cannot run in this process (switched off, not JAX's CPU backend, the kernel
    not built or loaded), else None. Builds and loads the kernel on first use (``load``, which warns of
    a failure once, with ``warn``)."""
    if not enabled():
        return f"{ENV_SWITCH}=0 switches it off"
    if default_backend() != "cpu":
        return f"it runs on JAX's CPU backend, and the default backend here is {default_backend()}"
    if not load(warn):
        return f"the kernel could not be built or loaded ({_STATE.get('error', 'unknown error')})"
    return None


def threads_used() -> tuple[int, int]:
    """(threads the kernel's last parallel call ran on, the size of XLA's pool then); zeros before
    any call (for benchmarks)."""
    if not _STATE.get("ok"):
        return 0, 0
    return int(_STATE["lib"].MdlLastThreads()), int(_STATE["lib"].MdlPoolThreads())


def status() -> dict:
    """What happened on ``load`` (for the benchmark and bug reports): "ok", and "error" or "path",
    "isa" and "lanes"."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in _STATE.items() if k != "lib"}
