"""What this CPU and this process can run: the ISA flags, the kernel's variant, the usable CPUs.

Its own module because the kernel's build (``engines.kernel``), its cache key and the benchmarks all
read the same facts, and because the facts must be the process's, not only the file's: where
/proc/cpuinfo says more than the process can run (an emulator passes the host's file through), an
AVX-512 build would die of SIGILL on its first call instead of the AVX2 one running.

ISA variants: on x86-64 the kernel is built for one of two instruction sets (``isa()``): "avx512"
(AVX-512 F/BW/DQ/VL: 16 records per zmm register) or "avx2" (AVX2 + FMA, no AVX-512: 8 records per
ymm register, the Zen 3 / most laptops case); other CPUs get "native" (``-march=native`` /
``-mcpu=native``, the source's portable 16-lane form). ``MDL_JAX_NATIVE_ISA=avx2`` (or avx512, native)
forces one, e.g. the AVX2 build on an AVX-512 CPU to benchmark or test it; a variant the CPU cannot
run is refused.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from mdl_jax.engines.toolchain import NativeBuildError

ENV_ISA = "MDL_JAX_NATIVE_ISA"
ISAS = ("avx512", "avx2", "native")
# What each x86-64 variant needs from the CPU (/proc/cpuinfo flag names).
_NEEDS = {"avx512": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"), "avx2": ("avx2", "fma")}
# /proc/cpuinfo names → NumPy's runtime CPU dispatch names (CPUID and the OS's saved-state support)
_NUMPY_NAMES = {"avx2": "AVX2", "fma": "FMA3", "avx512f": "AVX512F", "avx512bw": "AVX512BW",
                "avx512dq": "AVX512DQ", "avx512vl": "AVX512VL"}


def is_x86() -> bool:
    """True on x86-64, where the kernel has its AVX-512 and AVX2 variants."""
    return platform.machine() in ("x86_64", "AMD64")


def numpy_features() -> dict:
    """NumPy's runtime CPU features, e.g. {"AVX2": True, ...} ({} where this NumPy does not expose them)."""
    for mod in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            return dict(getattr(__import__(mod, fromlist=["__cpu_features__"]), "__cpu_features__", {}))
        except ImportError:
            continue
    return {}


def _cpuinfo_line(prefixes: tuple[str, ...]) -> str:
    """The first line of /proc/cpuinfo that starts with one of ``prefixes``; "" where there is none."""
    try:  # bytes that are not UTF-8 (a brand string a hypervisor set) are no reason to lose the flags line
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        return next((ln for ln in text.splitlines() if ln.startswith(prefixes)), "")
    except OSError:
        return ""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where there is none), less those
    that NumPy's own runtime check (CPUID, and whether the OS saves the registers) finds missing (see
    the module's docstring; tried with QEMU's user mode as an AVX2-only EPYC)."""
    flags = frozenset(_cpuinfo_line(("flags", "Features")).partition(":")[2].split())
    seen = numpy_features()
    return flags - {f for f, n in _NUMPY_NAMES.items() if seen.get(n) is False}


def available_isas() -> tuple[str, ...]:
    """The variants this CPU can run, widest first ("native" always)."""
    if not is_x86():
        return ("native",)
    have = cpu_flags()
    return tuple(v for v in ("avx512", "avx2") if all(f in have for f in _NEEDS[v])) + ("native",)


def isa() -> str:
    """The variant the kernel is built for: ``$MDL_JAX_NATIVE_ISA`` if set (and not "auto"), else the
    widest this CPU runs.

    Raises:
      NativeBuildError: an unknown name, or one this CPU cannot run.
    """
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


def cpu_signature() -> str:
    """The machine, the processor and its flags line, as a build's cache key reads them: a library
    built with ``-march=native`` for one CPU must not be loaded on another (shared home folders)."""
    flags = _cpuinfo_line(("flags",))
    # (flags the process cannot run, though /proc/cpuinfo lists them: a build for what it can run)
    hidden = sorted(set(flags.split(":", 1)[-1].split()) & set(_NUMPY_NAMES) - cpu_flags())
    return f"{platform.machine()}|{platform.processor()}|{flags}" + (f"|not {' '.join(hidden)}" if hidden else "")


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
