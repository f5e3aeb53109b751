"""The CPU a benchmark ran on, as every bench prints it beside its figures: the model name and the ISA
flags that decide the timings, from /proc/cpuinfo. Under ``scripts/hold_avx2.sh`` (an AVX-512 host held
to its AVX2 code paths, a proxy) the flags are the proxy's cpuinfo copy's, so the name says so: a
figure taken there never reads as one from a real AVX2-only CPU."""

from __future__ import annotations

import os
import platform
from pathlib import Path

PROXY_NOTE = " held to AVX2 (scripts/hold_avx2.sh: an AVX-512 host's cores, caches and clock)"


def cpu_model() -> str:
    """The CPU's model name (the platform's processor where /proc/cpuinfo has none), with the proxy's
    note under ``scripts/hold_avx2.sh``."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    name = name or platform.processor() or platform.machine() or "unknown"
    return name + (PROXY_NOTE if os.environ.get("MDL_JAX_AVX2_PROXY") else "")


def cpu_flags(wanted: tuple[str, ...]) -> list[str]:
    """Those of ``wanted`` the CPU has, in ``wanted``'s order: the native kernel's own reading
    (``native.cpu_flags``: /proc/cpuinfo, less what NumPy's runtime check finds the process cannot run)."""
    from mdl_jax.engines import native

    have = native.cpu_flags()
    return [f for f in wanted if f in have]
