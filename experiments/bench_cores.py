"""Core scaling of ``decide``'s native CPU kernel: one core against all cores, in the same run.

    python -m experiments.bench_cores [--n 10000000] [--rounds 3] [--cores 1 2 4 8 16]

Each measurement is a fresh subprocess pinned to the first c CPUs of this process's affinity mask
(``os.sched_setaffinity`` before JAX starts: XLA sizes its CPU thread pool from that mask, which the
child verifies by reporting the pool size the kernel saw). Core counts are interleaved round by
round, so load from other jobs hits them alike, and the median round is reported. Each child decides
the same uniform (M, R, A) records, N = 10^7 by default, validated (``decide``) and unvalidated
(``validate=False``), median of several calls after a warm-up. The machine's load average (before
and after) is printed beside the figures: on a shared machine the scaling measured is depressed.

Targets: ≥ 1.8× from 1 to 2 cores on a 2-core machine; ≥ 2×10^8 decisions/s at
N = 10^7 on 16 cores (the H200 machine's CPUs). Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, os, resource, statistics, sys, time
import numpy as np, jax, jax.numpy as jnp
from mdl_jax import MDLConfig, decide
from mdl_jax.engines import native
n, reps = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
xs = [jnp.asarray(rng.uniform(size=n).astype(np.float32)) for _ in range(3)]
cfg = MDLConfig()
out = {"cpus": sorted(os.sched_getaffinity(0)), "native": native.load()}
for name, fn in (("validated", lambda: decide(*xs, cfg)), ("unvalidated", lambda: decide(*xs, cfg, validate=False))):
    jax.block_until_ready(fn())
    ts = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out[name] = n / statistics.median(ts)
    out[name + "_best"] = n / min(ts)
    # CPU time per record (all threads) and CPU / wall: how much work extra threads add, and how
    # much of the time they actually ran; both less sensitive to other jobs than throughput
    out[name + "_cpu_ns"] = cpu / (n * reps) * 1e9
    out[name + "_sys_ns"] = (r1.ru_stime - r0.ru_stime) / (n * reps) * 1e9
    out[name + "_parallelism"] = cpu / sum(ts)
# (getattr: the same child measures older checkouts, before these counters existed)
out["threads_used"], out["pool_threads"] = getattr(native, "threads_used", lambda: (0, 0))()
print(json.dumps(out))
"""


def _thp() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return "unknown"


def run_child(cpus: list[int], n: int, reps: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", CHILD, str(n), str(reps)], capture_output=True, text=True,
                          env=env, cwd=root, preexec_fn=lambda: os.sched_setaffinity(0, cpus), check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child on CPUs {cpus} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="records per call (default 10^7)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    p.add_argument("--reps", type=int, default=7, help="timed calls per child (median)")
    p.add_argument("--cores", type=int, nargs="*", default=None,
                   help="core counts to measure (default: 1 and all of this process's CPUs)")
    args = p.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    cores = sorted(set(args.cores or [1, len(allowed)]))
    if any(c < 1 or c > len(allowed) for c in cores):
        raise SystemExit(f"bench_cores: error: --cores must be within 1..{len(allowed)}")
    load_before = os.getloadavg()
    per: dict[int, list[dict]] = {c: [] for c in cores}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for c in (cores if r % 2 == 0 else cores[::-1]):   # alternate the order too
            per[c].append(run_child(allowed[:c], args.n, args.reps))
    load_after = os.getloadavg()
    res: dict = {"n": args.n, "rounds": args.rounds, "reps": args.reps, "cpus_available": len(allowed),
                 "load_before": load_before, "load_after": load_after, "thp": _thp(),
                 "wall_s": time.perf_counter() - t0, "cores": {}}
    for c in cores:
        rows = per[c]
        res["cores"][str(c)] = {
            "validated": statistics.median(x["validated"] for x in rows),
            "unvalidated": statistics.median(x["unvalidated"] for x in rows),
            "unvalidated_best": max(x["unvalidated_best"] for x in rows),
            "cpu_ns_per_record": statistics.median(x["unvalidated_cpu_ns"] for x in rows),
            "sys_ns_per_record": statistics.median(x["unvalidated_sys_ns"] for x in rows),
            "parallelism": statistics.median(x["unvalidated_parallelism"] for x in rows),
            "threads_used": sorted({x["threads_used"] for x in rows}),
            "pool_threads": sorted({x["pool_threads"] for x in rows}),
            "rounds": [x["unvalidated"] for x in rows],
        }
    one = res["cores"][str(cores[0])]
    top = res["cores"][str(cores[-1])]
    res["scaling_unvalidated"] = top["unvalidated"] / one["unvalidated"]
    res["scaling_validated"] = top["validated"] / one["validated"]
    # per-round ratios (the same round's children ran back to back, under the same load)
    res["scaling_per_round"] = [b["unvalidated"] / a["unvalidated"] for a, b in zip(per[cores[0]], per[cores[-1]])]
    # work per record with all cores over work per record with one: 1.0 means the extra threads add
    # no work (no contention, no redundant page zeroing), whatever the load did to the wall time
    res["cpu_efficiency"] = one["cpu_ns_per_record"] / top["cpu_ns_per_record"]
    res["targets"] = {"scaling_1_to_2": 1.8, "per_s_16_cores": 2e8}

    print(f"decide core scaling at N = {args.n:,} ({len(allowed)} CPUs here, THP {res['thp']}; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after; median of {args.rounds} interleaved rounds)")
    print(f"{'cores':>5}  {'validated /s':>13}  {'unvalidated /s':>14}  {'best':>9}  {'CPU ns/rec (OS)':>15}  "
          f"{'CPU/wall':>8}  kernel threads (XLA pool)")
    for c in cores:
        r = res["cores"][str(c)]
        print(f"{c:>5}  {r['validated']:13.3e}  {r['unvalidated']:14.3e}  {r['unvalidated_best']:9.2e}  "
              f"{r['cpu_ns_per_record']:7.1f} ({r['sys_ns_per_record']:4.1f})  {r['parallelism']:8.2f}  "
              f"{r['threads_used']} ({r['pool_threads']})")
    per_round = ", ".join(f"{x:.2f}" for x in res["scaling_per_round"])
    print(f"scaling {cores[0]} → {cores[-1]} cores: {res['scaling_unvalidated']:.2f}× unvalidated, "
          f"{res['scaling_validated']:.2f}× validated (per round: {per_round})")
    print(f"CPU work per record, {cores[0]} vs {cores[-1]} cores: {res['cpu_efficiency']:.2f} (1.00: the extra "
          f"threads add no work; CPU/wall below {cores[-1]} means they were not all running)")
    if cores[-1] == 2 and cores[0] == 1:
        print(f"  target ≥ 1.8× from 1 to 2 cores: {'met' if res['scaling_unvalidated'] >= 1.8 else 'NOT met'}")
    met16 = cores[-1] >= 16 and top["unvalidated"] >= 2e8
    print(f"  target ≥ 2×10^8/s on 16 cores (the H200 machine): here {top['unvalidated']:.2e}/s on "
          f"{cores[-1]} core(s){' (met)' if met16 else '' if cores[-1] < 16 else ' (NOT met)'}")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
