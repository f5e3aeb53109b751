"""An AVX2-only CPU's code paths, run at full speed on an AVX-512 host: a proxy for timings on a CPU this
machine does not have (``scripts/hold_avx2.sh`` runs a command so; emulation, ``scripts/emulate_avx2.sh``,
is for parity only).

What each runtime runs under the proxy, and how it is held there:
  torch          ATen's kernels: ``ATEN_CPU_CAPABILITY=avx2``; MKL's: ``MKL_ENABLE_INSTRUCTIONS=AVX2``;
                 oneDNN's: ``ONEDNN_MAX_CPU_ISA=AVX2`` (the libraries' own switches).
  XLA, the native kernel   ``XLA_FLAGS=--xla_cpu_max_isa=AVX2``, ``MDL_JAX_NATIVE_ISA=avx2``.
  ONNX Runtime   has no switch: its kernels (MLAS) pick AVX-512 wherever CPUID and XCR0 allow. ``patch``
                 copies the installed package and makes each ``xgetbv`` (which reads XCR0, the register
                 state the OS saves) report x87 | SSE | AVX state only, as on a CPU without AVX-512, so
                 MLAS and cpuinfo choose their AVX2 / FMA3 kernels (and no AVX512-VNNI int8 kernel).
  OpenVINO bf16  refuses the CPU (its /proc/cpuinfo copy, mounted by the shell script, has no bfloat16),
                 as on a real AVX2 CPU; "auto" picks ``onnx``.

    python -m experiments.avx2_proxy patch DEST         # DEST/onnxruntime, patched (idempotent)
    python -m experiments.avx2_proxy verify [DEST]      # perf: share of ORT's samples at zmm / ymm code

The proxy's limits: the host's cores, caches and clock, not a Zen 3's. On Zen 4 (256-bit FMA pipes,
AVX-512 run as two halves) the AVX2 code path has the same FMA peak as AVX-512's, and Zen 3's is the
same width, so ratios between backends carry over better than absolute speeds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

XGETBV = b"\x0f\x01\xd0"
# lea eax, [rcx+7]: ECX is 0 at every xgetbv (it names XCR0), so EAX = 7: x87, SSE and AVX state enabled,
# the AVX-512 (opmask, ZMM) and AMX bits clear. Three bytes, like xgetbv, and no stack use (a push/pop
# would overwrite the red zone some of these functions keep data in). EDX keeps whatever it held: the
# callers read XCR0's high half only for bits no CPU sets.
REPLACEMENT = b"\x8d\x41\x07"


def _load_segments(so: Path) -> list[tuple[int, int, int]]:
    """(file offset, virtual address, file size) of each LOAD segment (``readelf -lW``)."""
    out = subprocess.run(["readelf", "-lW", str(so)], capture_output=True, text=True, check=True).stdout
    segs = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            segs.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
    return segs


def patch_library(so: Path) -> int:
    """Patch every ``xgetbv`` instruction in ``so`` (found by disassembly, so no stray byte run is touched;
    each preceded by an instruction that zeroes ECX or copies a zeroed register to it). Returns how many."""
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True,
                         check=True).stdout
    lines = asm.splitlines()
    sites = [i for i, line in enumerate(lines) if re.match(r"^\s*[0-9a-f]+:\s+xgetbv\b", line)]
    data = bytearray(so.read_bytes())
    segs = _load_segments(so)
    n = 0
    for i in sites:
        va = int(lines[i].split(":")[0], 16)
        before = " ".join(lines[max(0, i - 3):i])
        if "%ecx" not in before:  # the index register is set just before; anything else: not the pattern we know
            raise ValueError(f"{so.name}: xgetbv at {va:#x} without ECX set just before it: not patched")
        off = next((o + va - v for o, v, size in segs if v <= va < v + size), None)
        if off is None or data[off:off + 3] not in (XGETBV, REPLACEMENT):
            raise ValueError(f"{so.name}: no xgetbv at file offset of {va:#x}")
        n += data[off:off + 3] == XGETBV
        data[off:off + 3] = REPLACEMENT
    tmp = so.with_name(so.name + ".tmp")
    tmp.write_bytes(bytes(data))
    tmp.chmod(so.stat().st_mode)
    tmp.replace(so)
    return n


def patch(dest: Path) -> Path:
    """Copy the installed onnxruntime package to ``dest/onnxruntime`` (once) and patch its libraries.
    Put ``dest`` first on PYTHONPATH to import it."""
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise SystemExit("avx2_proxy: onnxruntime is not installed (pip install 'mdl-jax[onnx]')")
    src = Path(spec.origin).parent
    target = dest / "onnxruntime"
    if src.resolve() == target.resolve():
        raise SystemExit(f"avx2_proxy: {target} is the installed package itself; give another DEST")
    # the copy is made again when the installed package changed (another version, or reinstalled)
    stamp = f"{src}\n" + "\n".join(f"{so.name} {so.stat().st_size} {so.stat().st_mtime_ns}"
                                    for so in sorted((src / "capi").glob("*.so*"))) + "\n"
    marker = target / ".avx2-proxy"
    if not (marker.exists() and marker.read_text().startswith(stamp)):
        dest.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest, prefix=".onnxruntime-"))
        shutil.copytree(src, tmp / "onnxruntime", ignore=shutil.ignore_patterns("__pycache__"))
        counts = {so.name: patch_library(so) for so in sorted((tmp / "onnxruntime" / "capi").glob("*.so*"))}
        if not any(counts.values()):
            raise SystemExit(f"avx2_proxy: no xgetbv found in {src}/capi: this onnxruntime is not one the proxy knows")
        (tmp / "onnxruntime" / ".avx2-proxy").write_text(f"{stamp}patched: {counts}\n")
        shutil.rmtree(target, ignore_errors=True)
        (tmp / "onnxruntime").rename(target)
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"patched {counts} in {target}", file=sys.stderr)
    return target


_WORK = """
import sys, time
from mdl_jax.signals.embeddings import Embedder
enc = Embedder(cache_dir=sys.argv[1], backend="onnx").model
texts = [f"a sentence about topic {i} with some more words in it {i * 7}" for i in range(600)]
for _ in range(3):
    enc.encode(texts, batch_size=64)
"""


def verify(dest: Path | None) -> dict[str, float]:
    """Run ONNX Runtime's encoder under ``perf record`` (natively, or from ``dest``'s patched copy) and
    return the shares of its library's samples at instructions on zmm and on ymm registers (the hottest
    addresses, about half the samples)."""
    env = dict(os.environ)
    if dest is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(dest), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "perf.data"
        subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-o", str(data),
                        sys.executable, "-c", _WORK, work], env=env, check=True, capture_output=True)
        lib = "onnxruntime_pybind11_state"
        rep = subprocess.run(["perf", "report", "-i", str(data), "--sort", "dso,sym", "--stdio"],
                             capture_output=True, text=True, check=True).stdout
        so = subprocess.run([sys.executable, "-c", "import onnxruntime, pathlib; print(next(pathlib.Path("
                             "onnxruntime.__file__).parent.glob('capi/onnxruntime_pybind11_state*.so')))"],
                            env=env, capture_output=True, text=True, check=True).stdout.strip()
        shares = {"zmm": 0.0, "ymm": 0.0, "top": 0.0}
        hot = [(float(m.group(1)), int(m.group(2), 16)) for m in
               re.finditer(r"^\s*([\d.]+)%\s+" + lib + r"\S*\s+\[\.\]\s+0x([0-9a-f]+)", rep, re.M)][:60]
        for pct, addr in hot:
            ins = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={addr:#x}",
                                  f"--stop-address={addr + 16:#x}", so], capture_output=True, text=True).stdout
            first = next((x for x in ins.splitlines() if re.match(r"^\s*[0-9a-f]+:", x)), "")
            shares["top"] += pct
            for reg in ("zmm", "ymm"):
                if reg in first:
                    shares[reg] += pct
                    break
    return shares


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["patch"] and len(argv) == 2:
        print(patch(Path(argv[1])).parent)
        return 0
    if argv[:1] == ["verify"] and len(argv) in (1, 2):
        s = verify(Path(argv[1]) if len(argv) == 2 else None)
        print(f"ONNX Runtime ({'patched' if len(argv) == 2 else 'as installed'}): the hottest addresses hold "
              f"{s['top']:.1f}% of all samples; {s['zmm']:.1f}% at zmm (AVX-512) instructions, "
              f"{s['ymm']:.1f}% at ymm (AVX/AVX2)")
        return 0
    print("usage: python -m experiments.avx2_proxy patch DEST | verify [DEST]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
