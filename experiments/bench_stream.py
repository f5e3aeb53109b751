"""Streaming benchmark: ``sweep_parquet`` over 10^7 and 10^8 records on disk.

    python -m experiments.bench_stream [--quick] [--sizes 1e7 1e8] [--dir /tmp]

For each size N: write N uniform random records (M, R, A float32, adopt bool: ~13 bytes each) to a
Parquet file in row groups of 2^20, written group by group (the writer's memory is flat too); sweep a
small grid (4 configs: g_a ∈ {0.3, 0.5, 0.7, 0.9}) over it in a FRESH process, so each size's peak
RSS (``ru_maxrss``) is its own, after a warm-up sweep of one pass (compilation, not timed; sizes up
to 10^6 take the best of three sweeps, their times being tens of milliseconds); delete the
file. ``--quick``: 10^5 and 10^6 records in passes of 2^16 (2^18, sweep's default, otherwise).

Targets ("time linear, peak memory flat"), printed beside the figures:
  - time per record at the largest N within 0.8-1.25× that at the smallest (linear time);
  - peak RSS at the largest N at most 1.1× that at the smallest (flat memory).
The sweep's own engine choice is used (``engine="auto"``). The machine's load average is printed: on
a shared machine the times are inflated, the ratios less so. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROW_GROUP = 1 << 20
BYTES_PER_RECORD = 13


def write_records(path: Path, n: int, seed: int = 0) -> float:
    """n random records to ``path``, one row group at a time; returns seconds."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = time.perf_counter()
    rng = np.random.default_rng(seed)
    schema = pa.schema([("M", pa.float32()), ("R", pa.float32()), ("A", pa.float32()), ("adopt", pa.bool_())])
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, n, ROW_GROUP):
            m = min(ROW_GROUP, n - start)
            M, R, A = rng.random((3, m), dtype=np.float32)
            w.write_table(pa.table({"M": M, "R": R, "A": A, "adopt": rng.random(m) < 0.5}, schema=schema),
                          row_group_size=ROW_GROUP)
    return time.perf_counter() - t


def child(path: str, record_chunk: int, repeats: int = 1) -> None:
    """One sweep in this (fresh) process, after a warm-up sweep of one pass (the same compiled
    program: every pass has ``record_chunk`` records); prints JSON: seconds, peak RSS, accuracies."""
    import numpy as np

    from mdl_jax import MDLConfig, config_grid
    from mdl_jax.controller.stream import sweep_parquet

    grid = config_grid(MDLConfig(), g_a=[0.3, 0.5, 0.7, 0.9])
    warm = Path(path).with_suffix(".warm.parquet")
    try:
        write_records(warm, record_chunk, seed=1)
        t = time.perf_counter()
        sweep_parquet(warm, grid, record_chunk=record_chunk)
        first = time.perf_counter() - t
    finally:
        warm.unlink(missing_ok=True)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):  # small files: the best of a few (a 10^5 sweep is tens of ms)
        t = time.perf_counter()
        res = sweep_parquet(path, grid, record_chunk=record_chunk)
        times.append(time.perf_counter() - t)
    dt = min(times)
    assert res.accuracy is not None  # the file holds labels
    print(json.dumps({"seconds": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_after_warmup_mb": rss0 / 1024, "warmup_s": first, "records": float(res.total),
                      "accuracy": np.round(res.accuracy, 4).tolist()}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10^5 and 10^6 records")
    ap.add_argument("--sizes", type=float, nargs="+", help="record counts (default 1e7 1e8)")
    ap.add_argument("--dir", default="/tmp", help="where the Parquet files go (deleted after)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--record-chunk", type=int, help="records per pass (default: sweep's 2^18; --quick 2^16)")
    args = ap.parse_args(argv)
    chunk = args.record_chunk or ((1 << 16) if args.quick else (1 << 18))
    if args.child:
        child(args.child, chunk, args.repeats)
        return 0
    sizes = [int(s) for s in (args.sizes or ([1e5, 1e6] if args.quick else [1e7, 1e8]))]
    folder = Path(args.dir)
    need = max(sizes) * BYTES_PER_RECORD * 1.2
    free = shutil.disk_usage(folder).free
    if free < need:
        print(f"bench_stream: {folder} has {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed", file=sys.stderr)
        return 2
    print(f"load average before: {os.getloadavg()}  ({os.cpu_count()} CPUs)")
    rows = []
    for n in sizes:
        path = folder / f"mdl_bench_stream_{n}.parquet"
        try:
            w = write_records(path, n)
            size_mb = path.stat().st_size / 1e6
            p = subprocess.run([sys.executable, "-m", "experiments.bench_stream", "--child", str(path),
                                "--record-chunk", str(chunk), "--repeats", str(3 if n <= 10**6 else 1)],
                               capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
            if p.returncode:
                print(p.stderr, file=sys.stderr)
                return 1
            r = json.loads(p.stdout.strip().splitlines()[-1])
        finally:
            path.unlink(missing_ok=True)
        r.update(n=n, file_mb=size_mb, write_s=w, ns_per_record=r["seconds"] / n * 1e9,
                 load=os.getloadavg()[0])
        rows.append(r)
        print(f"N = {n:.0e}: file {size_mb:,.0f} MB written in {w:.1f} s; sweep of 4 configs {r['seconds']:.1f} s "
              f"= {r['ns_per_record']:.0f} ns/record ({4 * n / r['seconds']:.2e} (config, record) pairs/s); "
              f"peak RSS {r['peak_rss_mb']:.0f} MB (after the warm-up pass {r['rss_after_warmup_mb']:.0f} MB, "
              f"which took {r['warmup_s']:.1f} s with compilation); "
              f"load {r['load']:.1f}", flush=True)
    lo, hi = rows[0], rows[-1]
    t_ratio = hi["ns_per_record"] / lo["ns_per_record"]
    m_ratio = hi["peak_rss_mb"] / lo["peak_rss_mb"]
    print()
    print("| check | measured | target |")
    print("|---|---|---|")
    print(f"| time per record, N = {hi['n']:.0e} vs {lo['n']:.0e} | {hi['ns_per_record']:.0f} vs "
          f"{lo['ns_per_record']:.0f} ns: {t_ratio:.2f}× | 0.8-1.25× (linear): "
          f"{'met' if 0.8 <= t_ratio <= 1.25 else 'NOT met'} |")
    print(f"| peak RSS, N = {hi['n']:.0e} vs {lo['n']:.0e} | {hi['peak_rss_mb']:.0f} vs {lo['peak_rss_mb']:.0f} MB: "
          f"{m_ratio:.2f}× | ≤ 1.1× (flat): {'met' if m_ratio <= 1.1 else 'NOT met'} |")
    print(json.dumps({"rows": rows, "time_ratio": t_ratio, "rss_ratio": m_ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
