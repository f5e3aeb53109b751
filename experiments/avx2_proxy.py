"""An AVX2-only CPU's code paths, run at full speed on an AVX-512 host: a proxy for timings on a CPU this
machine does not have (``scripts/hold_avx2.sh`` runs a command so; emulation, ``scripts/emulate_avx2.sh``,
is for parity only).

What each runtime runs under the proxy, and how it is held there:
  torch          ATen's kernels: ``ATEN_CPU_CAPABILITY=avx2``; MKL's: ``MKL_ENABLE_INSTRUCTIONS=AVX2``;
                 oneDNN's: ``ONEDNN_MAX_CPU_ISA=AVX2`` (the libraries' own switches).
  NumPy, OpenBLAS ``NPY_DISABLE_CPU_FEATURES`` (its AVX-512 dispatch targets), ``OPENBLAS_CORETYPE=Haswell``.
  XLA, the native kernel   ``XLA_FLAGS=--xla_cpu_max_isa=AVX2``, ``MDL_JAX_NATIVE_ISA=avx2``.
  ONNX Runtime   has no switch: its kernels (MLAS) pick AVX-512 wherever CPUID and XCR0 allow. ``patch``
                 copies the installed package and makes each ``xgetbv`` (which reads XCR0, the register
                 state the OS saves) report x87 | SSE | AVX state only, as on a CPU without AVX-512, so
                 MLAS and cpuinfo choose their AVX2 / FMA3 kernels (and no AVX512-VNNI int8 kernel).
                 MLAS turns AVX-VNNI kernels on from CPUID alone, so a host with AVX-VNNI (Intel Alder
                 Lake / Sapphire Rapids and later, AMD Zen 5) is refused (``host_refusal``).
  OpenVINO bf16  refuses the CPU (its /proc/cpuinfo copy, mounted by the shell script, has no bfloat16),
                 as on a real AVX2 CPU; "auto" picks ``onnx``.

    python -m experiments.avx2_proxy patch DEST         # DEST/onnxruntime, patched (again only when the package changes)
    python -m experiments.avx2_proxy verify [DEST]      # perf: share of ORT's samples at zmm / ymm code
    python -m experiments.avx2_proxy cpuinfo OUT        # /proc/cpuinfo as an AVX2-only CPU's (the scripts')

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
# lea eax, [rcx+7]: ECX is 0 at every xgetbv patched (it names XCR0; checked below), so EAX = 7: x87,
# SSE and AVX state enabled, the AVX-512 (opmask, ZMM) and AMX bits clear, and RAX's upper half zeroed
# (a 32-bit write). Three bytes, like xgetbv, and no stack use (a push/pop would overwrite the red zone
# some of these functions keep data in). EDX keeps what it held: the callers in ONNX Runtime 1.32 never
# read XCR0's high half (they test the low byte and bits 17-18), or overwrite EDX first.
REPLACEMENT = b"\x8d\x41\x07"
# CPU features that select other kernels from CPUID alone, with no XCR0 check the patch could answer:
# ONNX Runtime's MLAS turns its VNNI int8 kernels on from AVX-VNNI (CPUID leaf 7 subleaf 1), which
# works on ymm registers. On a host with them the proxy would not be an AVX2-only CPU: refused.
CPUID_ONLY = ("avx_vnni", "avx_vnni_int8", "avx_ne_convert")

_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")


def _load_segments(so: Path) -> list[tuple[int, int, int]]:
    """(file offset, virtual address, file size) of each LOAD segment (``readelf -lW``)."""
    out = subprocess.run(["readelf", "-lW", str(so)], capture_output=True, text=True, check=True).stdout
    segs = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            segs.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
    return segs


def _ecx_is_zero(insns: list[tuple[str, str]]) -> bool:
    """Whether the instructions just before an xgetbv (oldest first) leave ECX = 0: the last write of ECX
    is ``xor %ecx,%ecx`` or ``mov $0x0,%ecx``, or ``mov %rXd,%ecx`` with rX zeroed by an ``xor`` before it
    and not written between. Anything else (a helper taking the register as an argument, XCR1) is not a
    pattern the patch's arithmetic (EAX = ECX + 7) is right for."""
    def names(reg: str) -> set[str]:  # a 32-bit register's other widths: a write to any is a write to it
        r = reg[1:]
        if r.startswith("r"):  # r8d .. r15d
            base = r[:-1]
            return {f"%{base}{w}" for w in ("", "d", "w", "b")}
        x = r[1]  # eax, ebx, ecx, edx, esi, edi, ...
        return {f"%r{r[1:]}", f"%e{r[1:]}", f"%{r[1:]}"} | ({f"%{x}l", f"%{x}h"} if x in "abcd" else set())

    def writes(op: str, args: str, reg: str) -> bool:
        last = args.split(",")[-1].strip() if args else ""
        if last in names(reg) and not op.startswith(("cmp", "test", "push", "bt")):
            return True
        if op == "xchg" and names(reg) & {a.strip() for a in args.split(",")}:
            return True
        implicit = {"cpuid": "%eax %ebx %ecx %edx", "rdtsc": "%eax %edx", "rdtscp": "%eax %ecx %edx",
                    "xgetbv": "%eax %edx"}.get(op, "")
        return reg in implicit.split() or (reg == "%ecx" and op.startswith(("rep", "loop")))

    for k in range(len(insns) - 1, -1, -1):
        op, args = insns[k]
        if not writes(op, args, "%ecx"):
            if op.startswith(("j", "call", "ret")):
                return False  # control flow between: the state is not known from these lines
            continue
        if (op, args) in (("xor", "%ecx,%ecx"), ("mov", "$0x0,%ecx")):
            return True
        m = re.fullmatch(r"(%[a-z0-9]+),%ecx", args) if op == "mov" else None
        if m is None:
            return False
        src = m.group(1)
        for op2, args2 in reversed(insns[:k]):
            if writes(op2, args2, src):
                return op2 == "xor" and args2 == f"{src},{src}"
            if op2.startswith(("j", "call", "ret")):
                return False
        return False
    return False


def patch_library(so: Path) -> int:
    """Patch every ``xgetbv`` instruction in ``so``, found by disassembly (so no stray byte run is
    touched), each with ECX = 0 shown by the instructions before it and none a jump's target.
    Returns how many were changed (0 when already patched). Raises ValueError, changing nothing, on a
    site it cannot show is a read of XCR0."""
    run = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True)
    if run.returncode:
        raise ValueError(f"{so.name}: objdump cannot read it ({' '.join(run.stderr.split())[:200]})")
    asm = run.stdout
    insns = [(int(m.group(1), 16), m.group(2), m.group(3).split("#")[0].strip().split(" <")[0].strip())
             for m in map(_INSN.match, asm.splitlines()) if m]
    targets = {int(a.split()[0], 16) for _, op, a in insns
               if op.startswith("j") and re.fullmatch(r"[0-9a-f]+", a.split()[0] if a else "")}
    data = bytearray(so.read_bytes())
    segs = _load_segments(so)
    n = 0
    for i, (va, op, _) in enumerate(insns):
        if op != "xgetbv":
            continue
        before = [(o, a) for _, o, a in insns[max(0, i - 12):i]]
        if va in targets or not _ecx_is_zero(before):
            raise ValueError(f"{so.name}: the xgetbv at {va:#x} is not shown to read XCR0 (ECX = 0 set just "
                             "before it, no jump to it): nothing patched")
        off = next((o + va - v for o, v, size in segs if v <= va < v + size), None)
        if off is None or data[off:off + 3] != XGETBV:
            raise ValueError(f"{so.name}: no xgetbv at the file offset of {va:#x}")
        data[off:off + 3] = REPLACEMENT
        n += 1
    if n:
        tmp = so.with_name(so.name + ".tmp")
        tmp.write_bytes(bytes(data))
        tmp.chmod(so.stat().st_mode)
        tmp.replace(so)
    return n


def _package(dest: Path | None) -> Path:
    """The onnxruntime package folder: ``dest``'s patched copy, or the one this Python imports."""
    if dest is not None:
        return dest / "onnxruntime"
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise SystemExit("avx2_proxy: onnxruntime is not installed (pip install 'mdl-jax[onnx]')")
    return Path(spec.origin).parent


# What an AVX2-only CPU lacks of this host's /proc/cpuinfo flags (its copy for the proxy and the emulator)
_NOT_ON_AVX2 = re.compile(r" (avx512[a-z0-9_]*|amx_[a-z0-9]*|gfni|avx_vnni[a-z0-9_]*|vaes|vpclmulqdq)(?=\s)")


def avx2_cpuinfo(text: str) -> str:
    """``text`` (a /proc/cpuinfo) as an AVX2-only CPU's: its flags lines without ``_NOT_ON_AVX2``."""
    return "".join(_NOT_ON_AVX2.sub("", ln) if ln.startswith("flags") else ln for ln in text.splitlines(True))


def _stamp(src: Path) -> str:
    """What the patched copy was made from: the package's folder, version, and every file's size and
    modification time (a reinstall or another version makes the copy again)."""
    from importlib import metadata

    try:
        version = metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        version = "unknown"
    files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return f"{src}\n{version}\n" + "".join(f"{p.relative_to(src)} {p.stat().st_size} {p.stat().st_mtime_ns}\n"
                                          for p in files)


def patch(dest: Path) -> Path:
    """Copy the installed onnxruntime package to ``dest/onnxruntime`` (again only when the installed one
    changed) and patch its libraries; put ``dest`` first on PYTHONPATH to import it. Runs that share
    ``dest`` take turns (a lock file), and nothing is left behind on failure. ``dest`` must be a folder
    of this user's, not a symlink (a name planted in a shared folder is refused, never followed)."""
    import fcntl

    src = _package(None)
    if dest.exists() and not dest.is_dir():
        raise SystemExit(f"avx2_proxy: DEST {dest} is not a folder")
    if (src / ".avx2-proxy").exists():
        raise SystemExit(f"avx2_proxy: the onnxruntime this Python imports ({src}) is already a patched copy: "
                         "take it off PYTHONPATH, or use its folder as DEST")
    dest.mkdir(parents=True, exist_ok=True)
    for p in (dest, dest / "onnxruntime"):
        if p.is_symlink() or (p.exists() and p.lstat().st_uid != os.geteuid()):
            raise SystemExit(f"avx2_proxy: {p} is a symlink or not this user's: refused (give a DEST of your own)")
    target = dest / "onnxruntime"
    stamp = _stamp(src)
    with open(dest / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (another run may be making the copy: wait, then look again)
        marker = target / ".avx2-proxy"
        if marker.exists() and marker.read_text().startswith(stamp):
            return target
        tmp = Path(tempfile.mkdtemp(dir=dest, prefix=".onnxruntime-"))
        try:
            shutil.copytree(src, tmp / "onnxruntime", ignore=shutil.ignore_patterns("__pycache__"))
            counts = {so.name: patch_library(so) for so in sorted((tmp / "onnxruntime" / "capi").glob("*.so*"))}
            if not any(counts.values()):
                raise SystemExit(f"avx2_proxy: no xgetbv found in {src}/capi: not an onnxruntime the proxy knows")
            (tmp / "onnxruntime" / ".avx2-proxy").write_text(f"{stamp}patched: {counts}\n")
            if target.exists():
                shutil.rmtree(target)
            (tmp / "onnxruntime").rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"patched {counts} in {target}", file=sys.stderr)
    return target


def host_refusal(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """Why this host cannot stand in for an AVX2-only CPU, or None: it must have AVX2 and FMA, and no
    feature that selects other kernels from CPUID alone (``CPUID_ONLY``)."""
    flags: set[str] = set()
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return f"cannot read {cpuinfo}"
    if not {"avx2", "fma"} <= flags:
        return "this CPU has no AVX2 and FMA: nothing to hold it to"
    bad = [f for f in CPUID_ONLY if f in flags]
    if bad:
        return (f"this CPU has {', '.join(bad)}, which ONNX Runtime selects kernels by from CPUID alone "
                "(no patchable XCR0 check): under the proxy it would still run them")
    return None


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
    addresses, about half the samples). Raises ValueError where ``dest`` holds no patched copy."""
    so = next(_package(dest).glob("capi/onnxruntime_pybind11_state*.so"), None)  # the library the run loads
    if so is None or (dest is not None and not (dest / "onnxruntime" / ".avx2-proxy").exists()):
        raise ValueError(f"{dest}: holds no patched onnxruntime (run: python -m experiments.avx2_proxy patch {dest})")
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
    """The command line; a bad argument or a refusal is one line on stderr and exit 2."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # patch's refusals
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        raise
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        print(f"avx2_proxy: {' '.join(str(e).split())[:300] or type(e).__name__}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    if argv[:1] == ["patch"] and len(argv) == 2:
        why = host_refusal()
        if why:
            print(f"avx2_proxy: {why}", file=sys.stderr)
            return 2
        print(patch(Path(argv[1])).parent)
        return 0
    if argv[:1] == ["cpuinfo"] and len(argv) == 2:
        Path(argv[1]).write_text(avx2_cpuinfo(Path("/proc/cpuinfo").read_text()))
        return 0
    if argv[:1] == ["verify"] and len(argv) in (1, 2):
        s = verify(Path(argv[1]) if len(argv) == 2 else None)
        print(f"ONNX Runtime ({'patched' if len(argv) == 2 else 'as installed'}): the hottest addresses hold "
              f"{s['top']:.1f}% of all samples; {s['zmm']:.1f}% at zmm (AVX-512) instructions, "
              f"{s['ymm']:.1f}% at ymm (AVX/AVX2)")
        return 0
    print("usage: python -m experiments.avx2_proxy patch DEST | verify [DEST] | cpuinfo OUT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
