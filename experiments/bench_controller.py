"""Controller benchmark: the paper-style NumPy path vs jitted ``decide``, single record and batched,
each engine beside the pure-JAX default.

    python -m experiments.bench_controller [--quick] [--sizes 3600 1000000 10000000]

All measured in one run on the same inputs: (a) the NumPy per-decision reference (tests/reference.py;
the paper reports 40.1 µs per decision), (b) one call of ``decide`` on a single record from Python on
the default engine ("jax") and on every engine that runs here ("native" on the CPU, "pallas" on a
GPU, "auto"), next to a plain ``jit(decide_one)``, (c) batched throughput of ``decide`` at several N
on each engine, next to the default's program without value checks (``validate=False``) and the
plain ``jit(vmap(decide_one))`` form, and next to every ISA variant of the kernel this CPU runs
(``native.decide_variant``: AVX-512 and AVX2 on an AVX-512 CPU), (d) each variant on one core: CPU
time per record at N = 10^6, in cycles of the measured clock, against the FMA bound of the kernel's
arithmetic (``FLOP_PER_RECORD`` below). Throughputs are measured in interleaved rounds (a shared machine is
noisy, ±10-30% from minute to minute) and the median round is reported, the range and the best in
the JSON. Prints the CPU's flags, a table with each target beside its figure, then one JSON object
as the last line.

The AVX2 proxy on an AVX-512 CPU (what an AVX2-only CPU such as a Zen 3 runs; still this CPU's
cores, caches and clock):

    MDL_JAX_NATIVE_ISA=avx2 XLA_FLAGS=--xla_cpu_max_isa=AVX2 python -m experiments.bench_controller

makes the native engine use the AVX2 build and XLA (the pure-JAX engine) emit AVX2 code only. The
"engines beside the default" block prints each engine's time as a ratio to the default's, against
the targets (the default within 1.5× of the fastest engine at N = 10^6 and within 3× for one call
from Python; an engine earns its place at ≥ 2× the default on the work it serves).
``--compare-lib old.so`` also measures another build of the kernel (e.g. an earlier commit's) in
the same rounds; it must read this tree's packed params (1,085 floats since the structured
fusion). ``--compare-rev REV ...`` measures earlier commits whose layout differs: each commit's
``mdl_jax`` is extracted (``git archive``) to a temporary folder and its own ``decide(...,
validate=False)`` (its kernel, built from its own source with its own flags, fed its own params) runs
in fresh processes (on the native engine where the commit has ``engine=``), interleaved round by
round with the same child on this tree, on all cores and
pinned to one. That is the check for "no slower than before" across a change of the params layout
(on AVX-512 no slower than at 83c229c, the commit the issue measured):

    python -m experiments.bench_controller --no-plain-vmap --sizes 1000000 10000000 --compare-rev 83c229c
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax import MDLConfig, decide, decide_one
from mdl_jax.controller import api
from mdl_jax.engines import native
from tests.reference import NumpyMDL

# Floating-point operations per record of the kernel's arithmetic (decide_cpu.cc) with every switch on
# (the default config), an FMA counted as 2, min/max/sub/div/sqrt as 1, integer bit tricks and
# selects not at all: the value encoding 48 × (Gaussian exponent 4 + 2^t 16 + add 1), g_A 19, the
# structured fusion (y = Q_kᵀ v_k 256 FMAs, its 16 + 5 scalings, the ε_c term 16 × 5,
# u = Σ q_i y_i 256 FMAs), tanh 16 × (odd polynomial 12 + exponent 2 + 2^t 16 + 4 for 1 - 2/(e + 1)),
# norms and α 101, read-out 10, Lemma 1 energies 256 × 2 + 16 × 2.
FLOP_PER_RECORD = {"value_encoding": 48 * 21, "g_A": 19, "fusion": 256 * 2 + 21 + 16 * 5 + 256 * 2,
                   "tanh": 16 * 34, "norms_alpha": 101, "readout": 10, "energies": 256 * 2 + 16 * 2}
FMA_UNITS = 2  # FMA pipes per core on the CPUs discussed (Intel Xeon since Skylake-SP Gold, AMD Zen 3 and 4)
FLAGS_SHOWN = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16",
               "avx512_fp16", "amx_tile")


def _fma_width_lanes() -> int:
    """float32 lanes one FMA pipe completes per cycle. AMD's Zen 4 (family 0x19 with AVX-512) runs a
    512-bit FMA as two 256-bit halves on its 256-bit pipes, so there the AVX-512 build's bound is the
    AVX2 build's (8 lanes), not half of it; elsewhere a pipe is as wide as the ISA's register."""
    vendor = family = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
            elif line.startswith("cpu family"):
                family = int(line.split(":", 1)[1])
            if vendor and family is not None:
                break
    except (OSError, ValueError):
        pass
    # family 0x19 is Zen 3 too (no AVX-512: its builds are 8 lanes anyway, and the note is not printed)
    return 8 if (vendor == "AuthenticAMD" and family == 0x19 and "avx512f" in native.cpu_flags()) else 16


def _cpu_model() -> str:
    from experiments._machine import cpu_model

    return cpu_model()


def _one_core(variants: list[str], n: int, rounds: int, min_time: float) -> dict:
    """Each variant's kernel on one thread: CPU seconds per record (process time, so time this
    process was descheduled on a shared machine does not count), interleaved rounds, and the clock
    measured between rounds (dependent adds: one per cycle)."""
    rng = np.random.default_rng(1)
    xs = [jnp.asarray(rng.uniform(size=n).astype(np.float32)) for _ in range(3)]
    cfg = MDLConfig()
    targets = {v: native.load_variant(v)["decide"] for v in variants}
    libs = {v: native.variant_library(v) for v in variants}
    for lib in libs.values():
        lib.MdlClockHz.restype = ctypes.c_double
        lib.MdlClockHz.argtypes = [ctypes.c_int64]
    per: dict = {v: [] for v in variants}
    hz = []
    try:
        for lib in libs.values():
            lib.MdlSetMaxThreads(1)
        def call(v):
            return native.decide_ffi(targets[v], xs[0], xs[1], xs[2], cfg)

        for v in variants:
            jax.block_until_ready(call(v))
        for _ in range(rounds):
            hz.append(next(iter(libs.values())).MdlClockHz(3_000_000))
            for v in variants:
                reps, c0 = 0, time.process_time()
                while True:
                    jax.block_until_ready(call(v))
                    reps += 1
                    if time.process_time() - c0 >= min_time and reps >= 2:
                        break
                per[v].append((time.process_time() - c0) / (n * reps))
    finally:
        for lib in libs.values():
            lib.MdlSetMaxThreads(native.usable_cpus())
    clock = statistics.median(hz)
    flop = sum(FLOP_PER_RECORD.values())
    width = _fma_width_lanes()
    out = {"n": n, "clock_ghz": clock / 1e9, "clock_ghz_range": [min(hz) / 1e9, max(hz) / 1e9],
           "flop_per_record": flop, "fma_pipe_lanes": width}
    for v in variants:
        lanes = native.load_variant(v)["lanes"]
        bound = flop / (FMA_UNITS * 2 * min(lanes, width))
        cyc = [t * clock for t in per[v]]
        out[v] = {"lanes": lanes, "cpu_ns_per_record": statistics.median(per[v]) * 1e9,
                  "cpu_ns_range": [min(per[v]) * 1e9, max(per[v]) * 1e9],
                  "cycles_per_record": statistics.median(cyc), "cycles_range": [min(cyc), max(cyc)],
                  "fma_bound_cycles": bound, "times_fma_bound": statistics.median(cyc) / bound,
                  "times_fma_bound_range": [min(cyc) / bound, max(cyc) / bound]}
    return out


# One child process for --compare-rev: only the public API and names every checkout since the native
# kernel moved to mdl_jax/controller/native.py has had (`native.load`, `decide(..., validate=False)`;
# the module at mdl_jax/engines/native.py and `engine="native"` where the checkout has them), so the
# same text measures this tree and an earlier commit alike; which ISA build it ran is reported
# where the checkout knows (`native.isa`). It reports every mdl_jax module it loaded: an editable
# install's import hook supplies a module the checkout lacks from the installed tree, which the
# parent refuses.
REV_CHILD = r"""
import json, os, statistics, sys, time
# pinned here, before JAX starts (XLA sizes its thread pool from the mask), not by a preexec_fn: the
# parent runs JAX's threads, and fork() from it may deadlock
os.sched_setaffinity(0, [int(c) for c in sys.argv[3].split(",")])
import numpy as np, jax, jax.numpy as jnp
import inspect
import mdl_jax
from mdl_jax import MDLConfig, decide
try:
    from mdl_jax.engines import native
except ImportError:
    from mdl_jax.engines import native
kw = {"engine": "native"} if "engine" in inspect.signature(decide).parameters else {}
sizes, min_time = [int(s) for s in sys.argv[1].split(",")], float(sys.argv[2])
cfg = MDLConfig()
out = {"native": getattr(native, "enabled", lambda: True)() and native.load(),
       "cpus": len(os.sched_getaffinity(0)), "isa": getattr(native, "isa", lambda: "native (one build)")(),
       "modules": sorted({getattr(m, "__file__", None) or "" for k, m in list(sys.modules.items())
                          if k == "mdl_jax" or k.startswith("mdl_jax.")}), "sizes": {}}
rng = np.random.default_rng(0)
for n in sizes if out["native"] else []:
    xs = [jnp.asarray(rng.uniform(size=n).astype(np.float32)) for _ in range(3)]
    fn = lambda: decide(xs[0], xs[1], xs[2], cfg, validate=False, **kw)
    jax.block_until_ready(fn()); jax.block_until_ready(fn())
    ts, c0 = [], time.process_time()
    while sum(ts) < min_time or len(ts) < 3:
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    cpu = time.process_time() - c0
    out["sizes"][str(n)] = {"per_s": n / statistics.median(ts), "best": n / min(ts),
                            "cpu_ns": cpu / (n * len(ts)) * 1e9}
print(json.dumps(out))
"""
# The verdict's margin: builds whose arithmetic is the same measured 0.97-1.00x each other at the median
# of 5 rounds on the 2-core AVX2 VM (rounds 0.85-1.21x), and 0.66-1.04x in --quick runs of
# HEAD against HEAD~3 here, so a median within 5% of 1 is reported as level, not as a result.
LEVEL = 0.95


class CompareRevError(Exception):
    """--compare-rev cannot measure a rev; the message names it and says why (main prints it as one line)."""


def _short(rev: str) -> str:
    return repr(rev if len(rev) <= 80 else rev[:77] + "...")


def _git(*args: str, binary: bool = False):
    root = Path(__file__).resolve().parents[1]
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=not binary).stdout


def _resolve_rev(rev: str) -> str:
    """The full id of the commit ``rev`` names (a tag is peeled); CompareRevError where it names none,
    where git or this repository's history is missing, or where the commit predates
    ``mdl_jax/controller/native.py`` (the child's imports need it, or its later place
    ``mdl_jax/engines/native.py``)."""
    if not rev or rev.startswith("-"):  # never handed to git as an option
        raise CompareRevError(f"--compare-rev {_short(rev)}: expected a commit, a branch or a tag")
    try:
        _git("rev-parse", "--git-dir")
    except OSError as e:
        raise CompareRevError(f"--compare-rev needs git ({e})") from None
    except subprocess.CalledProcessError:
        raise CompareRevError("--compare-rev needs this repository's git history: this copy of "
                              "experiments/ is not in a git checkout") from None
    try:
        sha = _git("rev-parse", "--verify", rev).strip()
        sha = _git("rev-parse", "--verify", sha + "^{commit}").strip()  # a tag peeled; a tree refused
    except subprocess.CalledProcessError as e:
        said = " ".join((e.stderr or "").split())[:200]
        raise CompareRevError(f"--compare-rev {_short(rev)}: not a commit of this repository"
                              + (f" (git: {said})" if said else "")) from None
    for where in ("mdl_jax/engines/native.py", "mdl_jax/controller/native.py"):
        try:
            _git("cat-file", "-e", f"{sha}:{where}")
            return sha
        except subprocess.CalledProcessError:
            continue
    raise CompareRevError(f"--compare-rev {_short(rev)} ({sha[:10]}): predates mdl_jax/controller/native.py, "
                          f"which the measuring child imports; pick a later commit")


def _export_rev(rev: str, dest: Path) -> str:
    """Extract ``mdl_jax`` as committed at ``rev`` into ``dest``; returns the full commit id.

    Raises:
        CompareRevError: ``rev`` is not a commit here, predates the controller's ``native.py``, or its
          tree holds a link that would point out of ``dest`` (tarfile's ``data`` filter refuses it).
    """
    sha = _resolve_rev(rev)
    data = _git("archive", "--format=tar", sha, "mdl_jax", binary=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            try:
                tar.extractall(dest, filter="data")  # 'data': no links or paths out of dest
            except tarfile.FilterError as e:
                raise CompareRevError(f"--compare-rev {_short(rev)} ({sha[:10]}): its mdl_jax holds an entry "
                                      f"that would leave the export folder ({e})") from None
    return sha


def _rev_child(root: Path, label: str, sizes: list[int], min_time: float, cpus: list[int],
               cache: Path | None = None) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if cache is not None:  # an earlier commit's kernel build stays in the run's temporary folder
        env["MDL_JAX_CACHE_DIR"] = str(cache)
    # the checkout first on the path, so its mdl_jax shadows the installed one (checked below)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", REV_CHILD, ",".join(map(str, sizes)), str(min_time),
                           ",".join(map(str, cpus))], capture_output=True, text=True, env=env, cwd=root, check=False)
    why = " ".join(proc.stderr.split())[-600:]
    if proc.returncode != 0:
        raise CompareRevError(f"--compare-rev: the child measuring {label} failed (exit {proc.returncode}): {why}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    stray = [f for f in out["modules"] if not Path(f).resolve().is_relative_to(root.resolve())]
    if stray:
        raise CompareRevError(f"--compare-rev: the child measuring {label} imported {stray[0]}, not its own "
                              f"copy ({len(stray)} module(s) from outside {root}): the measurement would mix trees")
    if not out["native"]:
        raise CompareRevError(f"--compare-rev: the native kernel is off or did not build in the child measuring "
                              f"{label} (MDL_JAX_NATIVE={os.environ.get('MDL_JAX_NATIVE', 'unset')}): nothing to "
                              f"compare. {why}")
    return out


def _against_revs(revs: list[str], sizes: list[int], rounds: int, min_time: float) -> dict:
    """This tree's kernel against each rev's, fresh processes interleaved round by round (the order
    rotates), on all of this process's CPUs at ``sizes`` and pinned to one CPU at N = 10^6. Ratios are
    this tree's speed over the rev's within each round: > 1 is faster. Raises CompareRevError."""
    here = Path(__file__).resolve().parents[1]
    revs = list(dict.fromkeys(revs))  # a rev named twice is measured once
    allowed = sorted(os.sched_getaffinity(0))
    n1 = min(sizes + [1_000_000])
    out: dict = {"revs": {}, "sizes": sizes, "one_core_n": n1, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="mdl-bench-rev-") as tmp:
        trees = {"this tree": here}
        for rev in revs:
            dest = Path(tmp) / f"rev{len(trees)}"
            out["revs"][rev] = {"commit": _export_rev(rev, dest)}
            trees[rev] = dest
        runs: dict = {k: {"all": [], "one": []} for k in trees}
        keys = list(trees)
        for r in range(rounds):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                label = "this tree" if k == "this tree" else f"{_short(k)} ({out['revs'][k]['commit'][:10]})"
                cache = None if k == "this tree" else Path(tmp) / "cache"
                runs[k]["all"].append(_rev_child(trees[k], label, sizes, min_time, allowed, cache))
                runs[k]["one"].append(_rev_child(trees[k], label, [n1], min_time, allowed[:1], cache))
    out["isa"] = {k: runs[k]["all"][0]["isa"] for k in keys}
    for k in keys:
        row = out["revs"].setdefault(k, {})
        for n in map(str, sizes):
            row[n] = [x["sizes"][n]["per_s"] for x in runs[k]["all"]]
        row["one_core_cpu_ns"] = [x["sizes"][str(n1)]["cpu_ns"] for x in runs[k]["one"]]
    mine = out["revs"]["this tree"]
    for rev in revs:
        theirs = out["revs"][rev]
        ratios = {n: [a / b for a, b in zip(mine[n], theirs[n])] for n in map(str, sizes)}
        ratios["one_core"] = [b / a for a, b in zip(mine["one_core_cpu_ns"], theirs["one_core_cpu_ns"])]
        theirs["ratio_rounds"] = ratios
        theirs["ratio_median"] = {k: statistics.median(v) for k, v in ratios.items()}
    return out


def _verdict(rounds: list[float], median: float) -> str:
    """'no slower' read against the noise: every round ≥ 1, the median ≥ 1, the median within LEVEL of 1
    (level: two builds of one source differ that much), or slower."""
    if min(rounds) >= 1:
        return "met in every round"
    if median >= 1:
        return "met at the median"
    if median >= LEVEL:
        return f"level: the median within {1 - LEVEL:.0%}, the noise between builds of the same arithmetic"
    return "NOT met"


def _median_us(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def _throughputs(fns: dict, n: int, rounds: int, min_time: float) -> dict:
    """decisions/s of each fn: interleaved rounds of >= min_time each; (median, best, rounds, CPU ns
    per record of each round) per fn. The CPU time (this process's, all threads) does not count time
    the process waited for a CPU, so on a shared machine its ratios are steadier than wall-clock ones."""
    for fn in fns.values():
        jax.block_until_ready(fn())  # compile + warm
    per: dict = {k: [] for k in fns}
    cpu: dict = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):
        # the order rotates from round to round: at N = 10^7 whichever path ran right after the
        # pure-JAX one (which frees GBs of intermediates) ran up to 2.7× slower than in other places.
        # Rotation alone did not even that out (with 4 paths and 5 rounds the kernel variant followed
        # the pure-JAX path in 3 of them and measured 2.5-3.0× it where decide, the same kernel plus
        # validation, measured 3.3-3.7×), so each path's slot also starts with one untimed call that
        # absorbs what the previous path left behind.
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            fn = fns[k]
            jax.block_until_ready(fn())
            reps, t0, c0 = 0, time.perf_counter(), time.process_time()
            while True:
                jax.block_until_ready(fn())
                reps += 1
                if time.perf_counter() - t0 >= min_time and reps >= 2:
                    break
            per[k].append(n * reps / (time.perf_counter() - t0))
            cpu[k].append((time.process_time() - c0) / (n * reps) * 1e9)
    return {k: (statistics.median(v), max(v), v, cpu[k]) for k, v in per.items()}


def _engines_here(cfg: MDLConfig) -> tuple[list[str], dict[str, str]]:
    """(the engines ``decide`` can run here besides the default: named engines first, then "auto";
    {engine: why it cannot run here} for the others)."""
    out, missing = [], {}
    for name in ("native", "pallas"):
        why = api.engine_module(name).why_not(cfg, ())
        if why is None:
            out.append(name)
        else:
            missing[name] = why
    return out + ["auto"], missing


def _engines_vs_default(res: dict) -> dict:
    """Each engine against the pure-JAX default, printed with the targets: time ratios (engine /
    default: < 1 is faster than the default) for one call from Python, throughput ratios (engine /
    default: > 1 is faster) for batched calls. An engine is worth keeping at ≥ 2× the default on the
    work it serves; the default should be within 1.5× of the fastest engine at N = 10^6 and within
    3× for one call."""
    out: dict = {"single_time_ratio": {}, "batched_speed_ratio": {}}
    print(f"engines beside the default (engine='jax'), on {res['cpu_model']} ({res['cpu_flags_line']}):")
    for e, why in res["engines_unavailable"].items():
        print(f"  {e}: not available: {why}")
    d1 = res["single_call_us_median"]
    for e, us in res["single_engines_us_median"].items():
        out["single_time_ratio"][e] = us / d1
    named = {e: us for e, us in res["single_engines_us_median"].items() if e != "auto"}
    fastest1 = min(named.values(), default=d1)
    print(f"  one call from Python: default {d1:.1f} µs; " + "; ".join(
        f"{e} {us:.1f} µs ({d1 / us:.2f}× the default's speed)" for e, us in res["single_engines_us_median"].items())
          + f"  [default within 3× of the fastest: {d1 / min(fastest1, d1):.2f}× — "
          + ("met" if d1 <= 3 * fastest1 else "NOT met") + "]")
    for n, row in res["batched"].items():
        ratios = {e: row["decide_" + e] / row["decide"] for e in res["engines"]}
        out["batched_speed_ratio"][n] = ratios
        fastest = max([row["decide_" + e] for e in res["engines"] if e != "auto"] + [row["decide"]])
        tgt = ""
        if int(n) == 10**6:
            tgt = (f"  [default within 1.5× of the fastest: {fastest / row['decide']:.2f}× — "
                   + ("met" if fastest <= 1.5 * row["decide"] else "NOT met") + "]")
        print(f"  batched, N={n}: default {row['decide']:.3e} /s; " + "; ".join(
            f"{e} {row['decide_' + e]:.3e} /s ({r:.2f}×)" for e, r in ratios.items()) + tgt)
    for e in [e for e in res["engines"] if e != "auto"]:
        single = d1 / res["single_engines_us_median"][e]
        big: dict = out["batched_speed_ratio"].get(str(10**6)) or next(iter(out["batched_speed_ratio"].values()), {})
        best = max(single, big.get(e, 0.0))
        print(f"  keep {e}? ≥ 2× the default on the work it serves: one call {single:.2f}×, batched "
              f"{big.get(e, float('nan')):.2f}× — " + ("yes" if best >= 2 else "NO: not 2× the default here"))
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (< 30 s)")
    p.add_argument("--sizes", type=int, nargs="*", default=None)
    p.add_argument("--no-plain-vmap", action="store_true",
                   help="skip plain jit(vmap(decide_one)) (slowest path: ~30 s a call at N = 10^7 here)")
    p.add_argument("--compare-lib", nargs="*", default=[],
                   help="other builds of the kernel (.so) to measure in the same rounds, e.g. an earlier commit's")
    p.add_argument("--compare-rev", nargs="+", default=[], metavar="REV",
                   help="earlier commits of this repository whose own decide(validate=False) is measured against "
                        "this tree's in fresh processes, interleaved (works across params layouts)")
    args = p.parse_args(argv)
    if args.compare_rev:  # before anything is measured: a wrong name or a kernel turned off fails at once
        if os.environ.get("MDL_JAX_NATIVE") == "0":
            p.error("--compare-rev compares native kernels, and MDL_JAX_NATIVE=0 turns them off")
        try:
            for rev in args.compare_rev:
                _resolve_rev(rev)
        except CompareRevError as e:
            p.error(str(e))
    sizes = args.sizes or ([3600, 1_000_000] if args.quick else [3600, 1_000_000, 10_000_000])
    min_time, rounds = (0.3, 3) if args.quick else (1.0, 5)
    cfg = MDLConfig()
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(3, 3600)).astype(np.float32)
    t = time.perf_counter()
    native_ok = native.why_not(cfg) is None
    flags = native.cpu_flags()
    res: dict = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                 "cpu_model": _cpu_model(), "cpu_flags": sorted(flags),
                 "cpu_flags_shown": {f: f in flags for f in FLAGS_SHOWN},
                 "cpu_flags_line": " ".join(f for f in FLAGS_SHOWN if f in flags) or "-",
                 "xla_flags": os.environ.get("XLA_FLAGS", ""),
                 "cpus": os.cpu_count(), "usable_cpus": native.usable_cpus(), "backend": jax.default_backend(),
                 "jax": jax.__version__, "native_kernel": native_ok, "native_load_s": time.perf_counter() - t,
                 "native_status": native.status(), "native_isa": native.status().get("isa"),
                 "native_isa_env": os.environ.get(native.ENV_ISA, ""),
                 "cpu_async_dispatch": jax.config.values.get("jax_cpu_enable_async_dispatch")}
    variants = [v for v in native.available_isas() if v != "native" or len(native.available_isas()) == 1]
    for v in list(variants):
        try:
            native.load_variant(v)
        except native.NativeBuildError as e:  # e.g. no compiler: measured without it
            variants.remove(v)
            res.setdefault("variant_errors", {})[v] = str(e)
    res["variants"] = variants
    compare = {}
    for i, path in enumerate(args.compare_lib):
        lib = ctypes.cdll.LoadLibrary(path)
        name = f"compare{i}"
        jax.ffi.register_ffi_target(f"mdl_decide_f32_{name}", jax.ffi.pycapsule(lib.MdlDecideF32), platform="cpu")
        compare[name] = f"mdl_decide_f32_{name}"
    res["compare_libs"] = dict(zip(compare, args.compare_lib))

    # (a) paper-style NumPy, one decision per call
    ref = NumpyMDL(cfg)
    recs = [tuple(float(v) for v in x[:, i]) for i in range(x.shape[1])]
    n_np = 600 if args.quick else 3600
    ts = []
    for m, r, a in recs[:n_np]:
        t = time.perf_counter()
        ref.decide(m, r, a)
        ts.append(time.perf_counter() - t)
    res["numpy_per_decision_us_median"] = statistics.median(ts) * 1e6
    res["numpy_per_decision_us_mean"] = statistics.fmean(ts) * 1e6

    # (b) one decide on a single record (validation + dispatch included), and the references
    m, r, a = recs[0]
    jax.block_until_ready(decide(m, r, a))
    reps = 2000 if args.quick else 10000
    engines, res["engines_unavailable"] = _engines_here(cfg)
    res["engines"] = engines
    single: dict[str, Callable[..., Any]] = {"decide": lambda: jax.block_until_ready(decide(m, r, a))}
    for eng in engines:
        single["decide_" + eng] = lambda eng=eng: jax.block_until_ready(decide(m, r, a, engine=eng))
    plain_one = jax.jit(decide_one)
    args1 = tuple(jnp.float32(v) for v in (m, r, a))
    single["plain_jit"] = lambda: jax.block_until_ready(plain_one(*args1, cfg))
    # a non-default concrete config (the README's decide(M, R, A, cal.config) workflow): the shipped
    # calibrated config, as an MDLConfig and as a file path; and the general path it took before the
    # one-record fast path covered concrete configs (NumPy scalars in still take it)
    from mdl_jax import load_config
    from mdl_repro.pipeline.experiment import SHIPPED

    cal_path = SHIPPED / "smollm2-truthfulqa.json"
    cal = load_config(cal_path)
    nm, nr, na = (np.float64(v) for v in (m, r, a))
    single["decide_calibrated"] = lambda: jax.block_until_ready(decide(m, r, a, cal))
    single["decide_config_file"] = lambda: jax.block_until_ready(decide(m, r, a, cal_path))
    single["decide_calibrated_general"] = lambda: jax.block_until_ready(decide(nm, nr, na, cal))
    trivial = jax.jit(lambda v: v)
    one = jnp.float32(0.5)
    single["trivial_jit"] = lambda: jax.block_until_ready(trivial(one))
    for fn in single.values():
        fn()
    # interleaved: three passes, median of the per-pass medians
    passes: dict[str, list[float]] = {k: [] for k in single}
    for _ in range(3):
        for k, fn in single.items():
            passes[k].append(_median_us(fn, reps // 3))
    res["single_call_us_median"] = statistics.median(passes["decide"])
    res["single_engines_us_median"] = {e: statistics.median(passes["decide_" + e]) for e in engines}
    res["plain_jit_single_us_median"] = statistics.median(passes["plain_jit"])
    res["trivial_jit_dispatch_us_median"] = statistics.median(passes["trivial_jit"])
    for k in ("decide_calibrated", "decide_config_file", "decide_calibrated_general"):
        res[k + "_us_median"] = statistics.median(passes[k])
        res[k + "_ratio_vs_default"] = res[k + "_us_median"] / res["single_call_us_median"]

    # (c) batched throughput
    plain = jax.jit(jax.vmap(decide_one, in_axes=(0, 0, 0, None)))
    res["batched"] = {}
    for n in sizes:
        x0, x1, x2 = (jnp.asarray(rng.uniform(size=n).astype(np.float32)) for _ in range(3))
        xs = (x0, x1, x2)
        fns: dict[str, Callable[..., Any]] = {
            "decide": lambda xs=xs: decide(xs[0], xs[1], xs[2], cfg),
            # the default's compiled program without the value checks: what every ratio is taken against
            "pure_jax_chunked": lambda xs=xs: decide(xs[0], xs[1], xs[2], cfg, validate=False),
        }
        for eng in engines:
            fns["decide_" + eng] = lambda xs=xs, eng=eng: decide(xs[0], xs[1], xs[2], cfg, engine=eng)
        if not args.no_plain_vmap:
            fns["plain_vmap"] = lambda xs=xs: plain(*xs, cfg)
        # the kernel alone (unvalidated), per ISA variant: the same jitted FFI call for each
        targets = {v: native.load_variant(v)["decide"] for v in variants}
        targets.update(compare)
        for v, tg in targets.items():
            fns["kernel_" + v] = lambda xs=xs, tg=tg: native.decide_ffi(tg, xs[0], xs[1], xs[2], cfg)
        got = _throughputs(fns, n, rounds, min_time)
        got["decide_unvalidated"] = got["pure_jax_chunked"]
        row = {k: v[0] for k, v in got.items()}
        row["best"] = {k: v[1] for k, v in got.items()}
        row["rounds"] = {k: v[2] for k, v in got.items()}
        row["cpu_ns_per_record"] = {k: statistics.median(v[3]) for k, v in got.items()}
        row["cpu_ratio_rounds_vs_pure_jax"] = {k: [b / a for a, b in zip(v[3], got["pure_jax_chunked"][3])]
                                               for k, v in got.items() if k.startswith(("decide", "kernel_"))}
        # per round (interleaved): the ratio of two paths measured within the same seconds
        row["ratio_rounds_vs_pure_jax"] = {k: [a / b for a, b in zip(v[2], got["pure_jax_chunked"][2])]
                                           for k, v in got.items() if k.startswith(("decide", "kernel_"))}
        row["ratio_vs_pure_jax"] = row["decide"] / row["pure_jax_chunked"]
        row["ratio_vs_plain_vmap"] = row["decide"] / row["plain_vmap"] if "plain_vmap" in row else float("nan")
        row["ratio_vs_numpy"] = row["decide"] * res["numpy_per_decision_us_mean"] * 1e-6
        res["batched"][str(n)] = row

    # (d) one core per variant, against the FMA bound
    n1 = 1_000_000 if not args.quick else 200_000
    res["one_core"] = _one_core(variants, n1, 3 if args.quick else 5, 0.3 if args.quick else 0.8) if variants else {}

    # (e) this tree's kernel against earlier commits' (their own source, flags and params)
    if args.compare_rev:
        try:
            res["against_revs"] = _against_revs(args.compare_rev, [n for n in sizes if n >= 10**6] or [1_000_000],
                                                3 if args.quick else 5, 0.5 if args.quick else 1.5)
        except CompareRevError as e:
            raise SystemExit(f"bench_controller: error: {e}") from None

    res["ratio_single_vs_numpy"] = res["numpy_per_decision_us_median"] / res["single_call_us_median"]
    res["ratio_single_vs_plain_jit"] = res["plain_jit_single_us_median"] / res["single_call_us_median"]
    res["targets"] = {"batched_per_s": 3e7, "single_call_us": 20.0, "avx2_ratio_vs_pure_jax": 3.0,
                      "avx2_times_fma_bound": 3.0}

    shown = " ".join(f for f in FLAGS_SHOWN if f in flags) or "-"
    print(f"MDL controller benchmark ({res['machine']}, {res['cpus']} CPUs, backend {res['backend']},"
          f" jax {res['jax']}; native kernel: {'on' if native_ok else 'OFF'}, ISA variant of decide: "
          f"{res['native_isa']}{' (forced by ' + native.ENV_ISA + ')' if res['native_isa_env'] else ''})")
    print(f"JAX CPU dispatch: {'asynchronous' if res['cpu_async_dispatch'] else 'synchronous'}")
    print(f"CPU: {res['cpu_model']}; flags: {shown}"
          f"{'; XLA_FLAGS=' + res['xla_flags'] if res['xla_flags'] else ''}")
    print(f"kernel variants measured: {', '.join(variants) or 'none'}")
    print(f"{'path':46s} {'value':>14s}")
    print(f"{'NumPy per decision (median / mean)':46s} {res['numpy_per_decision_us_median']:8.1f} / "
          f"{res['numpy_per_decision_us_mean']:.1f} µs")
    print(f"{'decide, one record (median)':46s} {res['single_call_us_median']:11.1f} µs")
    for k, label in (("decide_calibrated", "decide, one record, calibrated config"),
                     ("decide_config_file", "decide, one record, config file path"),
                     ("decide_calibrated_general", "  the same config, general path (before)")):
        print(f"{label:46s} {res[k + '_us_median']:11.1f} µs  ({res[k + '_ratio_vs_default']:.2f}× default)")
    for eng, us in res["single_engines_us_median"].items():
        print(f"{'decide, one record, engine=' + repr(eng):46s} {us:11.1f} µs  "
              f"({us / res['single_call_us_median']:.2f}× the default's time)")
    print(f"{'plain jit(decide_one), one record (median)':46s} {res['plain_jit_single_us_median']:11.1f} µs")
    print(f"{'trivial jitted call (dispatch floor)':46s} {res['trivial_jit_dispatch_us_median']:11.1f} µs")
    for n, row in res["batched"].items():
        print(f"{'decide, N=' + n:46s} {row['decide']:11.3e} /s  (pure JAX unvalidated"
              f" {row['pure_jax_chunked']:.2e} = {row['ratio_vs_pure_jax']:.1f}×; plain vmap "
              f"{row.get('plain_vmap', float('nan')):.2e} = {row['ratio_vs_plain_vmap']:.1f}×; "
              f"{row['ratio_vs_numpy']:.0f}× NumPy)")
        for k in [k for k in row if k.startswith("kernel_") and k in row["ratio_rounds_vs_pure_jax"]]:
            r = row["ratio_rounds_vs_pure_jax"][k]
            tgt = ("  [target on AVX2 ≥ 3× pure JAX: " + ("met" if min(r) >= 3 else "NOT met in every round")
                   + "]") if k == "kernel_avx2" and int(n) >= 10**6 else ""
            c = row["cpu_ratio_rounds_vs_pure_jax"][k]
            print(f"{'  kernel ' + k[7:] + ' (unvalidated), N=' + n:46s} {row[k]:11.3e} /s  "
                  f"({row[k] / row['pure_jax_chunked']:.2f}× pure JAX; rounds {min(r):.2f}-{max(r):.2f}×; "
                  f"CPU time {row['cpu_ns_per_record'][k]:.0f} ns/record, {min(c):.2f}-{max(c):.2f}× less than "
                  f"pure JAX's {row['cpu_ns_per_record']['pure_jax_chunked']:.0f}){tgt}")
    oc = res["one_core"]
    if oc:
        print(f"one core, kernel alone, N={oc['n']}: clock {oc['clock_ghz']:.2f} GHz "
              f"({oc['clock_ghz_range'][0]:.2f}-{oc['clock_ghz_range'][1]:.2f}); {oc['flop_per_record']} FLOP "
              f"per record, FMA bound = FLOP / ({FMA_UNITS} FMA units × 2 × lanes)"
              + ("; this CPU's FMA pipes are 8 lanes wide (AMD Zen 4 runs a 512-bit FMA as two halves), so the"
                 " 16-lane build's bound is taken at 8 lanes" if oc["fma_pipe_lanes"] == 8 else ""))
        for v in variants:
            o = oc[v]
            tgt = ("  [target ≤ 3× the bound: " + ("met" if o["times_fma_bound_range"][1] <= 3 else
                   "met at the median" if o["times_fma_bound"] <= 3 else "NOT met") + "]") if v == "avx2" else ""
            print(f"{'  ' + v + ' (' + str(o['lanes']) + ' lanes), CPU per record':46s} "
                  f"{o['cpu_ns_per_record']:8.1f} ns = {o['cycles_per_record']:.0f} cycles "
                  f"({o['cycles_range'][0]:.0f}-{o['cycles_range'][1]:.0f}); FMA bound {o['fma_bound_cycles']:.0f}"
                  f" → {o['times_fma_bound']:.2f}× ({o['times_fma_bound_range'][0]:.2f}-"
                  f"{o['times_fma_bound_range'][1]:.2f}×){tgt}")
    print("targets:")
    big = [n for n in res["batched"] if int(n) >= 10**7]
    if big:
        b = res["batched"][big[-1]]
        print(f"  decide ≥ 3×10^7 /s at N={big[-1]}: {b['decide']:.2e} /s "
              f"({'met' if b['decide'] >= 3e7 else 'not met'} here)")
    print(f"  decide, one record ≤ 20 µs: {res['single_call_us_median']:.1f} µs "
          f"({'met' if res['single_call_us_median'] <= 20 else 'not met'} here)")
    for n in [n for n in res["batched"] if int(n) >= 10**6]:
        r = res["batched"][n]["ratio_rounds_vs_pure_jax"]
        if res["native_isa"] == "avx2":
            print(f"  AVX2: decide ≥ 3× pure JAX at N={n} (all cores): {res['batched'][n]['ratio_vs_pure_jax']:.2f}×"
                  f" (rounds {min(r['decide']):.2f}-{max(r['decide']):.2f}×)")
        if "kernel_avx2" in r:
            ratio = res["batched"][n]["kernel_avx2"] / res["batched"][n]["pure_jax_chunked"]
            c = res["batched"][n]["cpu_ratio_rounds_vs_pure_jax"]["kernel_avx2"]
            print(f"  AVX2: kernel ≥ 3× pure JAX at N={n} (all cores): {ratio:.2f}× (rounds "
                  f"{min(r['kernel_avx2']):.2f}-{max(r['kernel_avx2']):.2f}×; in CPU time {min(c):.2f}-{max(c):.2f}×)")
    if oc and "avx2" in oc:
        print(f"  AVX2: one core ≤ 3× the FMA bound: {oc['avx2']['times_fma_bound']:.2f}× "
              f"({oc['avx2']['times_fma_bound_range'][0]:.2f}-{oc['avx2']['times_fma_bound_range'][1]:.2f}×)")
    for name, path in res["compare_libs"].items():
        for n, row in res["batched"].items():
            for v in variants:
                per_round = [a / b for a, b in zip(row["rounds"]["kernel_" + v], row["rounds"]["kernel_" + name])]
                ratio = row["kernel_" + v] / row["kernel_" + name]
                print(f"  kernel {v} against {name} ({path}) at N={n}: {ratio:.2f}× (rounds {min(per_round):.2f}-"
                      f"{max(per_round):.2f}×)")
    ar = res.get("against_revs")
    if ar:
        isa = ar["isa"]["this tree"]
        print(f"this tree's kernel ({isa}) against earlier commits' (each its own decide(validate=False), fresh "
              f"processes, {ar['rounds']} interleaved rounds; > 1× is faster here):")
        for rev in dict.fromkeys(args.compare_rev):
            row = ar["revs"][rev]
            for k, rs in row["ratio_rounds"].items():
                label = f"N={k}, all cores" if k != "one_core" else f"one core, CPU time, N={ar['one_core_n']}"
                tgt = (f"  [target on AVX-512 no slower than {rev}: {_verdict(rs, row['ratio_median'][k])}]"
                       if isa == "avx512" else "")
                print(f"  against {rev} ({row['commit'][:10]}, {ar['isa'][rev]}), {label}: "
                      f"{row['ratio_median'][k]:.2f}× (rounds {min(rs):.2f}-{max(rs):.2f}×){tgt}")
    print("(on an AVX-512 CPU the AVX2 figures are the AVX2 build on these cores: a proxy, not a Zen 3)"
          if "avx512" in variants else "")
    res["engines_vs_default"] = _engines_vs_default(res)
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    # as the command line and the gateway run: JAX's CPU work on the calling thread
    from mdl_jax.runtime import synchronous_cpu_dispatch

    synchronous_cpu_dispatch()
    main()
