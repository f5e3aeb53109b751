"""The native CPU engine: the C++ kernel for ``decide`` and ``sweep``, built on first use, registered
with XLA's FFI, and the config packed for it.

Loaded only when a caller asks for it (``decide(..., engine="native")``, ``sweep(..., engine="native")``,
or ``engine="auto"`` on the CPU); the controller never imports this module itself.

The kernel (``_native/decide_cpu.cc``) makes a single pass per block of 16 records (8 on AVX2), all
outputs written once, on every thread of XLA's intra-op pool; a call of at most ``SMALL_CALL``
records runs inline on the caller's thread through ctypes, NumPy to NumPy, without XLA's dispatch.
It computes what ``decision.decide_one`` computes (tests/test_native.py: every float within 2e-6 of
the pure-JAX engine, NaN → Opt-Out alike); the engine answers with NumPy arrays.

It runs concrete float32 signals with a config of D = 16 on JAX's CPU backend; anything else
(traced input, float64, D ≠ 16, a GPU backend) is the pure-JAX engine's (``why_not`` says which).
The kernel is compiled with the system C++ compiler on the first call that asks for it (a few seconds),
cached under ``$MDL_JAX_CACHE_DIR/native`` keyed by source, compiler flags, jaxlib and CPU, and
reused; a cached library is loaded only when its bytes match the size and sha256 recorded by the
build that wrote it (a truncated one would crash the process), else it is rebuilt. When no compiler
is found or the build fails, the engine cannot run here: named, that is a ValueError; under "auto",
one warning and the pure-JAX engine. ``MDL_JAX_NATIVE=0`` (deprecated: name the engine instead)
keeps it from running.

ISA variants: on x86-64 the kernel is built for one of two instruction sets, chosen at load time from
the CPU's flags (``isa()``): "avx512" (AVX-512 F/BW/DQ/VL: 16 records per zmm register) or "avx2"
(AVX2 + FMA, no AVX-512: 8 records per ymm register, the Zen 3 / most laptops case); other CPUs get
"native" (``-march=native`` / ``-mcpu=native``, the source's portable 16-lane form). Set
``MDL_JAX_NATIVE_ISA=avx2`` (or avx512, native) to force one, e.g. the AVX2 build on an AVX-512 CPU
to benchmark or test it; a variant the CPU cannot run is refused (the engine cannot run).
``load_variant(isa)`` loads another variant beside the process's one under its own FFI target
names (tests and benchmarks: ``decide_variant``, ``sweep_engine(..., variant=...)``).

Threads: a call splits its records into one contiguous part per thread of XLA's intra-op pool (the
caller included; idle threads steal from the back of the others' parts), and each thread faults in
its part of the fresh output pages with one ``MADV_POPULATE_WRITE`` before writing them: with one
shared counter all threads wrote inside the same 2 MiB huge page at once and raced to fault (and
zero) each new one. The pool follows the process's affinity mask; the kernel caps its threads at
``usable_cpus()`` (the mask, capped by a cgroup CPU quota).

The same library holds the sweep's engine: ``mdl_sweep_f32`` scores a batch of configs × records in
one call on every thread and returns the per-config weighted sums (``sweep_engine``). Configs that
share their fusion numbers (σ, ε_c, gains, g_A, bias) share ‖v_meta‖ and α per record, so a grid over
gates, thresholds or n_min/n_max costs one fusion per record.

The build machinery here (``compile_library``, ``verified``, ``source_library_path``,
``load_source_library``, ``load_once``) is shared with the signals' C++ helpers
(``mdl_jax.signals.conflict_native``, ``dots_native``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax._paths import default_cache_dir
from mdl_jax.controller import config as _config
from mdl_jax.controller import decision as _decision
from mdl_jax.controller.config import MDLConfig

TARGET = "mdl_decide_f32"
SWEEP_TARGET = "mdl_sweep_f32"
ENV_SWITCH = "MDL_JAX_NATIVE"
ENV_ISA = "MDL_JAX_NATIVE_ISA"
ISAS = ("avx512", "avx2", "native")
_SOURCE = Path(__file__).with_name("_native") / "decide_cpu.cc"
_LOCK = threading.Lock()
_STATE: dict = {}  # "ok": bool once tried; "error": why not; "path": the library; "isa": its variant
_VARIANTS: dict = {}  # isa -> {"lib", "path", "decide", "sweep"} (load_variant)
# What each x86-64 variant needs from the CPU (/proc/cpuinfo flag names).
_NEEDS = {"avx512": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"), "avx2": ("avx2", "fma")}


class NativeBuildError(RuntimeError):
    """The native kernel could not be built or loaded (the engine cannot run here)."""


def enabled() -> bool:
    """False when ``MDL_JAX_NATIVE`` is 0 / false / no / off (a deprecated switch: name the engine
    instead); the native libraries are then neither built nor loaded."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def _x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


# /proc/cpuinfo names → NumPy's runtime CPU dispatch names (CPUID and the OS's saved-state support)
_NUMPY_NAMES = {"avx2": "AVX2", "fma": "FMA3", "avx512f": "AVX512F", "avx512bw": "AVX512BW",
                "avx512dq": "AVX512DQ", "avx512vl": "AVX512VL"}


def _numpy_features() -> dict:
    """NumPy's runtime CPU features ({} where this NumPy does not expose them)."""
    for mod in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            return dict(getattr(__import__(mod, fromlist=["__cpu_features__"]), "__cpu_features__", {}))
        except ImportError:
            continue
    return {}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where there is none), less those of
    ``_NUMPY_NAMES`` that NumPy's own runtime check (CPUID, and whether the OS saves the registers)
    finds missing: where /proc/cpuinfo says more than the process can run (an emulator passes the
    host's file through; tried with QEMU's user mode as an AVX2-only EPYC), the AVX-512 kernel would
    die of SIGILL on its first call instead of the AVX2 one running."""
    flags: frozenset[str] = frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = frozenset(line.split(":", 1)[1].split())
                break
    except (OSError, IndexError):
        pass
    seen = _numpy_features()
    return flags - {f for f, n in _NUMPY_NAMES.items() if seen.get(n) is False}


def available_isas() -> tuple[str, ...]:
    """The variants this CPU can run, widest first ("native" always)."""
    if not _x86():
        return ("native",)
    have = cpu_flags()
    return tuple(v for v in ("avx512", "avx2") if all(f in have for f in _NEEDS[v])) + ("native",)


def isa() -> str:
    """The variant ``load`` builds: ``$MDL_JAX_NATIVE_ISA`` if set (and not "auto"), else the widest
    this CPU runs. Raises NativeBuildError for an unknown name or one this CPU cannot run."""
    want = os.environ.get(ENV_ISA, "auto").strip().lower() or "auto"
    have = available_isas()
    if want == "auto":
        return have[0]
    if want not in ISAS:
        raise NativeBuildError(f"{ENV_ISA}={want!r}: expected auto or one of {', '.join(ISAS)}")
    if want not in have:
        missing = [f for f in _NEEDS.get(want, ()) if f not in cpu_flags()]
        raise NativeBuildError(f"{ENV_ISA}={want}: this CPU cannot run it (no {', '.join(missing) or 'x86-64'})")
    return want


def build_flags(variant: str | None = None) -> list[str]:
    """The compiler flags of a variant (default: ``isa()``)."""
    variant = variant or isa()
    flags = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno", "-w"]
    if variant == "avx512":
        # 512-bit vectors: one zmm register holds a 16-record block.
        return flags + ["-march=native", "-mprefer-vector-width=512", "-DMDL_LANES=16"]
    if variant == "avx2":
        # The CPU's own tuning with every AVX-512 extension off (a no-op on an AVX2-only CPU; on an
        # AVX-512 one it builds what an AVX2 CPU would run): 8-record blocks in ymm registers.
        return flags + ["-march=native", "-mno-avx512f", "-mprefer-vector-width=256", "-DMDL_LANES=8"]
    if _x86():
        return flags + ["-march=native"]
    return flags + (["-mcpu=native"] if platform.machine() in ("aarch64", "arm64") else [])


def _cpu_signature() -> str:
    # -march=native: a library built for one CPU must not be loaded on another (shared home dirs).
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    # (flags the process cannot run, though /proc/cpuinfo lists them: a build for what it can run)
    hidden = sorted(set(flags.split(":", 1)[-1].split()) & set(_NUMPY_NAMES) - cpu_flags())
    return f"{platform.machine()}|{platform.processor()}|{flags}" + (f"|not {' '.join(hidden)}" if hidden else "")


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def library_path(cache_dir: Path | None = None, variant: str | None = None) -> Path:
    """Where the built kernel lives: keyed by the source, the compiler and its flags (the ISA
    variant), jaxlib (the FFI headers) and the CPU."""
    import jaxlib

    variant = variant or isa()
    parts = [_SOURCE.read_bytes(), jax.__version__, getattr(jaxlib, "__version__", ""), _cpu_signature(),
             _compiler() or "", " ".join(build_flags(variant))]
    key = hashlib.sha256(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))
    return (cache_dir or default_cache_dir()) / "native" / f"decide_cpu-{variant}-{key.hexdigest()[:16]}.so"


def _record_path(lib: Path) -> Path:
    """The sidecar that says what the complete library is: its size and sha256."""
    return lib.with_name(lib.name + ".sha256")


def _record(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


def verified(lib: Path) -> bool:
    """True when ``lib`` is exactly the library its build recorded (size and sha256).

    Loading a library that was cut short (a full disk, a killed copy) maps pages past the end of the
    file, and the first call into them kills the process with SIGBUS: no exception to catch. So a
    library is loaded only after its bytes match the record that its build wrote after finishing.
    Hashing ~100 kB costs well under a millisecond, once per process.
    """
    try:
        want = _record_path(lib).read_text()
        data = lib.read_bytes()
    except OSError:
        return False
    return want == _record(data)


def _elf_complete(data: bytes) -> bool:
    """Do the ELF headers' tables and loadable segments all end inside the file? (A compiler or
    linker that hit a full disk could still leave a short file behind; non-ELF formats pass.)"""
    if data[:4] != b"\x7fELF":
        return True
    if len(data) < 64 or data[4] != 2:  # only ELF64 is built here
        return False
    order = "<" if data[5] == 1 else ">"
    phoff, shoff = struct.unpack_from(order + "QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", data, 0x36)
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return False
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(order + "IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_offset + p_filesz > len(data):  # PT_LOAD
            return False
    return True


def build(out: Path, variant: str | None = None) -> Path:
    """Compile the kernel to ``out``, atomically, with its size/sha256 record beside it (see
    ``compile_library``)."""
    return compile_library(_SOURCE, [*build_flags(variant), f"-I{jax.ffi.include_dir()}"], out)


def compile_library(source: Path, flags: list[str], out: Path) -> Path:
    """Compile the C++ ``source`` with ``flags`` into the shared library ``out``, atomically, with its
    size/sha256 record beside it (the native conflict detector, ``mdl_jax.signals.conflict_native``,
    builds through this too).

    Both files are written under temporary names and renamed into place, so ``out`` is only ever a
    complete library or absent. The record is renamed first: a library whose record is missing or
    stale (a concurrent build, a crash between the renames) fails ``verified`` and is rebuilt,
    never loaded.
    """
    cxx = _compiler()
    if cxx is None:
        raise NativeBuildError("no C++ compiler found (tried $CXX, g++, c++, clang++)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    tmp_record = tmp + ".sha256"
    cmd = [cxx, *flags, "-o", tmp, str(source)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise NativeBuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        data = Path(tmp).read_bytes()
        if not _elf_complete(data):
            raise NativeBuildError(f"{' '.join(cmd)} left an incomplete library ({len(data)} bytes; "
                                   "is the disk full?)")
        with open(tmp_record, "w") as f:
            f.write(_record(data))
            f.flush()
            os.fsync(f.fileno())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the bytes are on disk before either name points at them
        os.replace(tmp_record, _record_path(out))
        os.replace(tmp, out)
    finally:
        for t in (tmp, tmp_record):
            if os.path.exists(t):
                os.unlink(t)
    return out


def source_library_path(source: Path, flags: list[str], stem: str, cache_dir: Path | None = None) -> Path:
    """Where a plain C++ library of the signal wing (``signals/_native``) lives: keyed by its source,
    the compiler, its flags and the machine, so any change rebuilds it."""
    parts: list[bytes | str] = [source.read_bytes(), _compiler() or "", " ".join(flags), platform.machine()]
    key = hashlib.sha256(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))
    return (cache_dir or default_cache_dir()) / "native" / f"{stem}-{key.hexdigest()[:16]}.so"


def load_source_library(source: Path, flags: list[str], path: Path) -> ctypes.CDLL:
    """The library at ``path`` (``source_library_path``), built from ``source`` first unless its bytes
    match the record its build wrote (``verified``): a missing, cut-short or foreign file is never loaded."""
    if not verified(path):
        compile_library(source, flags, path)
    return ctypes.cdll.LoadLibrary(str(path))


def load_once(state: dict, lock: threading.Lock, load, what: str, fallback: str) -> bool:
    """A signal-wing library's ``available()``: ``load()`` (→ the entries to keep in ``state``) runs once
    per process, under ``lock``; ``state["ok"]`` remembers the answer. ``MDL_JAX_NATIVE=0`` skips it; a
    failed build or load warns once, naming ``what`` and the ``fallback`` that runs instead."""
    ok = state.get("ok")
    if ok is not None:
        return ok
    with lock:
        if "ok" in state:
            return state["ok"]
        if not enabled():
            state.update(ok=False, error=f"{ENV_SWITCH}=0")
            return False
        try:
            state.update(ok=True, **load())
        except (NativeBuildError, OSError, subprocess.SubprocessError, AttributeError) as e:
            state.update(ok=False, error=str(e))
            warnings.warn(f"mdl_jax: {what} unavailable, using {fallback} ({e}). Set {ENV_SWITCH}=0 to "
                          "silence this.", RuntimeWarning, stacklevel=4)
        return state["ok"]


def load() -> bool:
    """Build (once per machine) and register the kernel; True when ``decide`` may use it."""
    if "ok" in _STATE:
        return _STATE["ok"]
    with _LOCK:
        if "ok" in _STATE:
            return _STATE["ok"]
        try:
            variant = isa()
            path = library_path()
            if not verified(path):
                # Missing, cut short, foreign, or from before records existed: never load it.
                build(path)
            try:
                lib = ctypes.cdll.LoadLibrary(str(path))
            except OSError:
                # Complete but not loadable here (e.g. copied from another machine): rebuild it once
                # before giving up.
                build(path)
                lib = ctypes.cdll.LoadLibrary(str(path))
            _register(lib, TARGET, SWEEP_TARGET)
            _STATE.update(ok=True, path=path, lib=lib, isa=variant, lanes=int(lib.MdlLanes()))
        except (NativeBuildError, OSError, subprocess.SubprocessError, AttributeError) as e:
            _STATE.update(ok=False, error=str(e))
            warnings.warn(f"mdl_jax: native CPU kernel unavailable, using the pure-JAX engine ({e}).",
                          RuntimeWarning, stacklevel=3)
        return _STATE["ok"]


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
    lib.MdlSetMaxThreads(usable_cpus())


PARAMS = 1085  # floats in one packed config (decide_cpu.cc: Params)
SMALL_CALL = 2048  # decide_cpu.cc: kChunk, the largest call the kernel runs inline on the caller's thread


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
    fn = getattr(_STATE.get("lib"), "MdlDecideSmallF32", None)
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
    base = _address(buf)
    rc = fn(_address(M), _address(R), _address(A), p_addr, n, fl, cfg.dims[0], cfg.dims[1],
            *(base + 4 * n * k for k in _SMALL_OFFSETS))
    if rc != 0:
        return None
    return {"action": buf[:n].view(np.int32), "C": buf[n:2 * n], "alpha": buf[2 * n:3 * n],
            "C_final": buf[3 * n:4 * n], "v_meta": buf[4 * n:20 * n].reshape(n, 16),
            "energies": buf[20 * n:23 * n].reshape(n, 3), "norm": buf[23 * n:24 * n], "g_A": buf[24 * n:]}


# Where each output starts in decide_small's buffer, in records: action, C, alpha, C_final, v_meta
# (16 a record), energies (3), norm, g_A, the order of MdlDecideSmallF32's arguments.
_SMALL_OFFSETS = (0, 1, 2, 3, 4, 20, 23, 24)


@_config.per_config_cache
def _small_plan(cfg: MDLConfig) -> tuple[np.ndarray, int, int] | None:
    # What depends only on the config (its limits; the packed numbers and their address: the array is
    # kept alive by the plan), once per hashable config, every call for one with array leaves.
    if not supports(cfg):
        return None
    p = _pack_uncached(cfg)
    return p, flags(cfg), p.ctypes.data


_CHAR = ctypes.c_char


def _address(a: np.ndarray) -> int:
    # A writable array's address through the buffer protocol, cheaper than ``a.ctypes.data`` (five
    # per gate query, a share of the warm per-query cost). Read-only or empty arrays,
    # which the protocol refuses, take ``.ctypes.data``.
    try:
        return ctypes.addressof(_CHAR.from_buffer(a))  # type: ignore[arg-type]  # ndarray exports a buffer
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def load_variant(variant: str) -> dict:
    """Build (cached) and register one ISA variant beside the process's own, under the FFI targets
    ``mdl_decide_f32_<variant>`` / ``mdl_sweep_f32_<variant>``; returns {"path", "decide", "sweep",
    "lanes"}. Raises NativeBuildError where the CPU cannot run it or the build fails."""
    with _LOCK:
        if variant in _VARIANTS:
            return {k: v for k, v in _VARIANTS[variant].items() if k != "lib"}
        if variant not in available_isas():
            raise NativeBuildError(f"the {variant} variant does not run on this CPU ({platform.machine()})")
        path = library_path(variant=variant)
        if not verified(path):
            build(path, variant)
        lib = ctypes.cdll.LoadLibrary(str(path))
        d, w = f"{TARGET}_{variant}", f"{SWEEP_TARGET}_{variant}"
        _register(lib, d, w)
        _VARIANTS[variant] = {"lib": lib, "path": str(path), "decide": d, "sweep": w,
                              "lanes": int(lib.MdlLanes())}
        return {k: v for k, v in _VARIANTS[variant].items() if k != "lib"}


def _decide_variant_call(M, R, A, params, target: str, flags: int, dims: tuple[int, int, int]):
    n = M.shape[0]
    f32 = jnp.float32
    types = [jax.ShapeDtypeStruct((n,), jnp.int32)] + [jax.ShapeDtypeStruct((n,), f32)] * 3 + [
        jax.ShapeDtypeStruct((n, 16), f32), jax.ShapeDtypeStruct((n, 3), f32),
        jax.ShapeDtypeStruct((n,), f32), jax.ShapeDtypeStruct((n,), f32)]
    out = jax.ffi.ffi_call(target, types)(M, R, A, params, flags=np.int64(flags), d_wm=np.int64(dims[0]),
                                          d_r=np.int64(dims[1]))
    return _decision.Decision(*out)


_decide_variant_jit = jax.jit(_decide_variant_call, static_argnames=("target", "flags", "dims"))


def decide_variant(variant: str, M, R, A, cfg: MDLConfig | None = None) -> _decision.Decision:
    """``decide`` on 1-D float32 records through one ISA variant's kernel (no validation; tests and
    benchmarks compare the variants with it)."""
    cfg = cfg or MDLConfig()
    t = load_variant(variant)["decide"]
    M, R, A = (jnp.asarray(x, jnp.float32).reshape(-1) for x in (M, R, A))
    return _decide_variant_jit(M, R, A, params(cfg), target=t, flags=flags(cfg), dims=cfg.dims)


def _cgroup_cpu_limit() -> float | None:
    """The CPU quota of this process's cgroup in CPUs (v2 ``cpu.max`` or v1 CFS quota), None if none."""
    try:
        rel = ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and (parts[0] == "0" or "cpu" in parts[1].split(",")):
                rel = parts[2].lstrip("/")
                break
        for d in (Path("/sys/fs/cgroup") / rel, Path("/sys/fs/cgroup")):
            f = d / "cpu.max"
            if f.exists():
                quota, period = f.read_text().split()[:2]
                if quota != "max":
                    return int(quota) / int(period)
        for d in (Path("/sys/fs/cgroup/cpu") / rel, Path("/sys/fs/cgroup/cpu")):
            q = d / "cpu.cfs_quota_us"
            if q.exists() and int(q.read_text()) > 0:
                return int(q.read_text()) / int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        pass
    return None


def usable_cpus() -> int:
    """CPUs this process can really run on: its affinity mask, capped by a cgroup CPU quota.

    XLA sizes its CPU thread pool from the affinity mask (``taskset -c 0`` gives one thread), which
    a container's quota can undercut; the kernel uses at most this many threads per call, since more
    running threads than CPUs only add switches and throttling."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, int(limit + 0.5)))
    return max(1, n)


def threads_used() -> tuple[int, int]:
    """(threads the kernel's last parallel call ran on, the size of XLA's pool then); zeros before
    any call (for benchmarks)."""
    if not _STATE.get("ok"):
        return 0, 0
    return int(_STATE["lib"].MdlLastThreads()), int(_STATE["lib"].MdlPoolThreads())


def status() -> dict:
    """What happened on ``load`` (for the benchmark and bug reports)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in _STATE.items() if k != "lib"}


def flags(cfg: MDLConfig) -> int:
    """The ablation switches as the kernel's bit flags (decide_cpu.cc: kValueEncoding ...)."""
    return (1 * cfg.value_encoding + 2 * cfg.risk_inversion + 4 * cfg.risk_modulation
            + 8 * cfg.alpha_gating + 16 * (cfg.subspaces == "qr"))


def supports(cfg: MDLConfig) -> bool:
    """The kernel's structural limits: D = 16 and scalar-per-field numeric leaves (no batched config)."""
    if cfg.D != 16 or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(cfg)):
        return False
    try:
        return all(np.shape(getattr(cfg, f)) in _config.config_shapes(f, cfg.D) for f in _config.NUMERIC_FIELDS)
    except Exception:  # noqa: BLE001 - a leaf np.shape cannot read: not for the kernel
        return False


def _pack_uncached(cfg: MDLConfig) -> np.ndarray:
    # float32 throughout, in the same order of operations as decision.weight_matrices / encode, so
    # the kernel sees the same W, centres and basis as the pure-JAX path.
    f = np.float32
    D = cfg.D
    # The centres exactly as the pure-JAX path makes them: np.linspace differs from jnp.linspace by an
    # ulp at 6 of 16 centres, and a Gaussian of width σ turns a centre's error δ into a relative error
    # ~δ·|s - c|/σ² of its peak, which reached 4e-5 in C at σ = 1e-4.
    centres = np.asarray(_decision.centres(cfg, jnp.float32), f)
    sigma = f(cfg.sigma)
    pi = np.asarray(cfg.projectors, f)
    gains = np.asarray(cfg.gains, f)
    others = pi.sum(0, dtype=f)[None] - pi
    W = gains[:, None, None] * pi + f(cfg.eps_c) * others
    bias = np.broadcast_to(np.asarray(cfg.bias, f), (D,))
    # σ near float32's ends (1e-30, 1e30 are valid) makes 1/(2σ²) inf or 0, as on the pure-JAX path
    # (whose XLA arithmetic does not warn): no RuntimeWarning, which a warnings-as-errors caller would
    # see as a crash on valid input.
    with np.errstate(over="ignore", divide="ignore"):
        inv = f(1.0) / (f(2.0) * sigma * sigma)
    # The kernel's structured fusion (decide_cpu.cc: fuse): W_k = ε_c I + (s_k - ε_c) Π_k, with s_k - ε_c
    # per basis coordinate of subspace k, and the dims (exact small integers in float32).
    coef = np.repeat(gains - f(cfg.eps_c), cfg.dims)
    parts = [centres, [inv], W.ravel(), bias, np.asarray(cfg.g_A_coeffs, f),
             np.asarray(cfg.gate_coeffs, f), np.asarray(cfg.thresholds, f), [f(cfg.n_min), f(cfg.n_max)],
             np.asarray(cfg.basis, f).ravel(), coef, [f(cfg.eps_c), f(cfg.dims[0]), f(cfg.dims[1])]]
    out = np.concatenate([np.asarray(p, f).ravel() for p in parts])
    assert out.size == PARAMS, out.size
    out.setflags(write=False)
    return out


@_config.per_config_cache
def pack(cfg: MDLConfig) -> np.ndarray:
    """The config as the kernel's float32 ``params`` buffer (decide_cpu.cc: struct Params), cached per
    hashable config (one with array leaves is packed every call)."""
    return _pack_uncached(cfg)


def _params_uncached(cfg: MDLConfig) -> jax.Array:
    return jax.device_put(_pack_uncached(cfg))


@_config.per_config_cache(unhashable=_params_uncached)
def params(cfg: MDLConfig) -> jax.Array:
    """``pack(cfg)`` on the device, cached per (hashable) config so a call transfers nothing."""
    with jax.ensure_compile_time_eval():   # a concrete buffer even when first asked inside a caller's jit
        return jax.device_put(pack(cfg))


# ------------------------------------------------------------------------------------ the decide engine

def _native_shaped(M, R, A, params, flags: int, dims: tuple[int, int, int]) -> _decision.Decision:
    # The same contract as the pure-JAX program, computed by the FFI kernel.
    shape = jnp.broadcast_shapes(M.shape, R.shape, A.shape)
    flat = [jnp.broadcast_to(x, shape).reshape(-1).astype(jnp.float32) for x in (M, R, A)]
    n = flat[0].shape[0]
    f32 = jnp.float32
    types = [jax.ShapeDtypeStruct((n,), jnp.int32)] + [jax.ShapeDtypeStruct((n,), f32)] * 3 + [
        jax.ShapeDtypeStruct((n, 16), f32), jax.ShapeDtypeStruct((n, 3), f32),
        jax.ShapeDtypeStruct((n,), f32), jax.ShapeDtypeStruct((n,), f32)]
    out = jax.ffi.ffi_call(TARGET, types)(
        *flat, params, flags=np.int64(flags), d_wm=np.int64(dims[0]), d_r=np.int64(dims[1]))
    return _decision.Decision(*(o.reshape(shape + o.shape[1:]) for o in out))


_native_jit = jax.jit(_native_shaped, static_argnames=("flags", "dims"))


@functools.cache
def _backend() -> str:
    return jax.default_backend()


def unavailable() -> str | None:
    """Why the engine cannot run in this process (switched off, not JAX's CPU backend, the kernel
    not built or loaded), else None. Builds and loads the kernel on first use."""
    if not enabled():
        return f"{ENV_SWITCH}=0 switches it off"
    if _backend() != "cpu":
        return f"it runs on JAX's CPU backend, and the default backend here is {_backend()}"
    if not load():
        return f"the kernel could not be built or loaded ({_STATE.get('error', 'unknown error')})"
    return None


# once per hashable config; a config with array leaves is asked every call
_supports_cached = _config.per_config_cache(supports)


def why_not(cfg: MDLConfig, signals=()) -> str | None:
    """Why ``decide`` cannot run this call on the engine (the process, then the config), else None.

    Args:
      cfg: one config.
      signals: the call's signals (unused here: any concrete float32 array is read on the host).

    Returns:
      A short reason, or None when the engine can run it.
    """
    why = unavailable()
    if why is not None:
        return why
    ok = _supports_cached(cfg)
    return None if ok else f"the kernel takes one concrete config with D = 16 (this one has D = {cfg.D})"


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


def decide_record(M: float, R: float, A: float, cfg: MDLConfig) -> _decision.Decision | None:
    """One record from Python floats on the kernel's inline path: the ``Decision`` of 0-d NumPy arrays
    (v_meta (16,), energies (3,)), the same bits as that record in any batch; None where the kernel
    cannot take the config or the library predates the inline entry point. For ``decide``, after its
    checks and ``why_not``."""
    fn = getattr(_STATE.get("lib"), "MdlDecideSmallF32", None)
    plan = _small_plan(cfg)
    if fn is None or plan is None:
        return None
    x = np.array((M, R, A), np.float32)
    base = _address(x)
    buf = np.empty(25, np.float32)
    out = _address(buf)
    if fn(base, base + 4, base + 8, plan[2], 1, plan[1], cfg.dims[0], cfg.dims[1],
          *(out + 4 * k for k in _SMALL_OFFSETS)) != 0:
        return None
    return _decision.Decision(buf[0:1].view(np.int32).reshape(()), buf[1:2].reshape(()), buf[2:3].reshape(()),
                              buf[3:4].reshape(()), buf[4:20], buf[20:23], buf[23:24].reshape(()),
                              buf[24:25].reshape(()))


# ------------------------------------------------------------------------------------ the sweep engine
# Params layout (decide_cpu.cc: struct Params): what the fusion reads comes first; the read-out
# numbers (g_a, g_b, θ, n_min, n_max) and the basis Q after it.
_FUSION_END = 16 + 1 + 3 * 16 * 16 + 16 + 2   # centres, 1/(2σ²), W, bias, g_A coefficients


def pack_batch(cfg: MDLConfig, K: int) -> np.ndarray:
    """A batch of K configs (leaves with leading axis K) as (K, PARAMS) ``params`` rows: each row the
    same float32 bits ``pack`` gives that config alone (the same element-wise float32 arithmetic)."""
    f = np.float32
    D = cfg.D
    specs = _config.field_specs()

    def col(name, *shape):  # a leaf as (K,) + its declared per-config shape, or the shape given
        return np.asarray(getattr(cfg, name), f).reshape((K,) + (shape or specs[name].shape))
    centres = np.asarray(_decision.centres(cfg, jnp.float32), f)
    sigma = col("sigma")
    pi = np.asarray(cfg.projectors, f)
    others = pi.sum(0, dtype=f)[None] - pi
    W = col("gains")[:, :, None, None] * pi[None] + col("eps_c")[:, None, None, None] * others[None]
    bias = np.broadcast_to(np.asarray(cfg.bias, f).reshape(K, -1), (K, D))
    with np.errstate(over="ignore", divide="ignore"):   # σ near float32's ends: as ``_pack_uncached``
        inv = f(1.0) / (f(2.0) * sigma * sigma)
    coef = np.repeat(col("gains") - col("eps_c", 1), cfg.dims, axis=1)
    parts = [np.broadcast_to(centres, (K, D)), inv[:, None], W.reshape(K, -1),
             bias, col("g_A_coeffs"), col("gate_coeffs"), col("thresholds"), col("n_min", 1),
             col("n_max", 1), np.broadcast_to(np.asarray(cfg.basis, f).ravel(), (K, D * D)), coef,
             col("eps_c", 1), np.broadcast_to(np.asarray(cfg.dims[:2], f), (K, 2))]
    out = np.concatenate([np.asarray(x, f) for x in parts], axis=1)
    assert out.shape == (K, PARAMS), out.shape
    return out


def sweep_supports(cfg: MDLConfig, K: int) -> bool:
    """Can the native sweep run this batch? D = 16, concrete leaves of the batched shapes."""
    if cfg.D != 16 or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(cfg)):
        return False
    try:
        return all(np.shape(getattr(cfg, f)) in [(K,) + s for s in _config.config_shapes(f, cfg.D)]
                   for f in _config.NUMERIC_FIELDS)
    except Exception:  # noqa: BLE001 - a leaf np.shape cannot read
        return False


def sweep_why_not(cfg: MDLConfig, K: int) -> str | None:
    """Why ``sweep`` cannot run this batch of K configs on the engine here, else None."""
    why = unavailable()
    if why is None and not sweep_supports(cfg, K):
        why = "the kernel takes D = 16 and a concrete batch of configs"
    return why


def sweep_available(cfg: MDLConfig, K: int) -> bool:
    """May ``sweep(engine="auto")`` use the native engine? Switch on, CPU backend, batch supported,
    library built and loaded (a failed build warns once and answers False)."""
    return sweep_why_not(cfg, K) is None


def _sweep_call(M, R, A, w2, groups, readout, start, flags: int, mode: int, target: str = SWEEP_TARGET):
    K, W = readout.shape[0], w2.shape[1]
    # (K, W, 6) float64 sums travel as int32 pairs: without x64, JAX has no float64 arrays.
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((K, W, 12), jnp.int32))(
        M, R, A, w2, groups, readout, start, flags=np.int64(flags), mode=np.int64(mode))


_sweep_jit = jax.jit(_sweep_call, static_argnames=("flags", "mode", "target"))

# How the kernel sums the weights (decide_cpu.cc: kIntegral, kInt32, kDouble).
_INTEGRAL, _INT32, _DOUBLE = 0, 1, 2


def _weight_mode(w2: np.ndarray) -> int:
    """int32 weights: int32 lane sums. float32 integers whose (adopt + other) row totals are < 2^24
    (bootstrap multiplicities as sweep passes them): float32 lane sums, exact and fastest. Other
    floats: float64."""
    if w2.dtype == np.int32:
        return _INT32
    if np.all(w2.sum((0, 2), dtype=np.float64) < 2**24) and np.array_equal(w2, np.floor(w2)):
        return _INTEGRAL
    return _DOUBLE


# Fold records with the same (M, R, A) into one (see _split_weights). Off only to measure it.
DEDUP = True


def _split_weights(M, R, A, adopt, w, dedup: bool):
    """The kernel's inputs: records and (2, W, n') weights, [0] on records labelled adopt, [1] on the
    others. A decision depends on (M, R, A) and the config only, so records with the same triple
    (paired designs: the 3,600 pooled B1/B2/B3 records of paper-scale-200x3 hold 400 distinct ones)
    are decided once, carrying the sums of their weights by label: exact for integer weights (sums
    of integers stay below the row totals), float32 rounding of the sums for other weights."""
    lab = np.asarray(adopt, bool)
    if dedup and len(M) > 1:
        trip = np.ascontiguousarray(np.stack([M, R, A], 1), np.float32)
        _, first, inv = np.unique(trip.view(np.dtype((np.void, 12))).ravel(), return_index=True,
                                  return_inverse=True)
        U = len(first)
        if U <= 0.75 * len(M):
            inv = inv.reshape(-1)
            w2 = np.empty((2, w.shape[0], U), w.dtype)
            for j, keep in enumerate((lab, ~lab)):
                for i in range(w.shape[0]):
                    w2[j, i] = np.bincount(inv, weights=np.where(keep, w[i], 0).astype(np.float64), minlength=U)
            return M[first], R[first], A[first], w2
    zero = np.zeros((), w.dtype)
    return M, R, A, np.stack([np.where(lab, w, zero), np.where(lab, zero, w)])


# Configs packed at a time by sweep_engine (memory: this many (1085,) float32 rows and weight matrices).
_PACK_CHUNK = 4096


def sweep_engine(cfg: MDLConfig, K: int, size: int, variant: str | None = None):
    """The "native" pass function of ``sweep`` (see sweep.py's engine contract): one call of the
    kernel per pass on every thread, raw weighted sums as NumPy arrays (n_correct (K, W),
    counts (K, W, 4), Σ w·C_final (K, W)), all float64: integer weights give exact integers.

    Configs whose fusion numbers (σ, ε_c, gains, g_A, bias) are equal form one group, whose ‖v_meta‖
    and α the kernel computes once per record; the rest of each config is its read-out row.
    ``variant``: run that ISA variant's kernel (``load_variant``) instead of the process's own."""
    why = sweep_why_not(cfg, K)
    if why is not None:
        raise ValueError(f"engine='native' cannot run here: {why}")
    target = SWEEP_TARGET if variant is None else load_variant(variant)["sweep"]
    # Packed a chunk of configs at a time: the full (K, 1085) params of a 10^6-config gate grid were
    # 4 GB (and their (K, 3, 16, 16) weight matrices 3 GB more) where the kernel needs one fusion row
    # per group and an 8-float read-out row per config. Group by the fusion numbers' bytes (a dict:
    # np.unique(axis=0) would sort the 803-float rows, a cost that grows with K).
    ids: dict = {}
    group = np.empty(K, np.int64)
    fusion_rows = []
    # read-out rows: n_min, n_max, g_a, g_b, θ0-θ2, padding (decide_cpu.cc: struct Readout)
    ro = np.zeros((K, 8), np.float32)
    for a in range(0, K, _PACK_CHUNK):
        b = min(a + _PACK_CHUNK, K)
        params = pack_batch(jax.tree.map(lambda x, a=a, b=b: np.asarray(x)[a:b], cfg), b - a)
        for i, row in enumerate(np.ascontiguousarray(params[:, :_FUSION_END])):
            n = len(ids)
            group[a + i] = ids.setdefault(row.tobytes(), n)
            if group[a + i] == n:                            # ids count up in order of first appearance
                fusion_rows.append(params[i].copy())
        ro[a:b, 0], ro[a:b, 1], ro[a:b, 2:4], ro[a:b, 4:7] = (params[:, 808], params[:, 809],
                                                              params[:, 803:805], params[:, 805:808])
    order = np.argsort(group, kind="stable")             # configs sorted by group
    inverse = np.empty_like(order)
    inverse[order] = np.arange(K)
    G = len(fusion_rows)
    groups = jax.device_put(np.stack(fusion_rows))
    start = jax.device_put(np.searchsorted(group[order], np.arange(G + 1)).astype(np.int32))
    readout = jax.device_put(ro[order])
    flags_ = flags(cfg)

    def run_pass(M, R, A, adopt, w):
        w = np.asarray(w)
        if w.dtype != np.int32:
            w = w.astype(np.float32)
        sig = [np.asarray(x, np.float32) for x in (M, R, A)]
        # folding duplicates costs a sort of the records: worth it once a few configs share it
        *sig, w2 = _split_weights(*sig, adopt, w, dedup=DEDUP and K >= 4)
        out = _sweep_jit(*sig, w2, groups, readout, start, flags=flags_, mode=_weight_mode(w2), target=target)
        sums = np.asarray(out).view(np.float64)[inverse]   # (K, W, 6), the caller's config order
        return sums[..., 4], sums[..., 0:4], sums[..., 5]

    return run_pass
