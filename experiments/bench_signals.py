"""Signal-aggregation benchmark: batched JAX pass vs a paper-style per-store Python/NumPy loop.

    python -m experiments.bench_signals [--quick]

Embeddings are precomputed (as in the paper's Table 8: 98.5 µs per six-record store). Measured in one
run on the same stores of both datasets: (a) the per-store NumPy reference (tests/reference.py),
(b) one jitted batched pass over all stores (amortised µs per store), (c) one jitted call on a single
store. The lexical conflict flags feed both paths and are timed separately (µs per store). Also the
embedding throughput for all TruthfulQA stores (fresh cache) and the cached rerun time.
(d) ``memory_signals`` itself, per engine in interleaved rounds ("jax", the default, against "native"
and "auto"; embeddings read from a table): one query a call, as the gateway and the framework
components call it (median µs), and every store in one call (µs a store); an engine stays where it is
≥ 2× the default on the work it serves.
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import jax
import numpy as np

from mdl_jax.signals.aggregation import (
    RELEVANCE_THRESHOLD,
    aggregate,
    aggregate_one,
    memory_signals,
    native_why_not,
    store_arrays,
)
from mdl_jax.signals.conflict import pair_flags
from mdl_jax.signals.embeddings import Embedder
from mdl_repro.pipeline.data import load
from mdl_repro.pipeline.stores import build_stores
from tests.reference import numpy_store_signals


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="subsets of both datasets (< 60 s)")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    lim_t, lim_h = (200, 1000) if args.quick else (None, None)
    res: dict = {"quick": args.quick}

    tqa = build_stores(load("truthfulqa", args.data_dir, limit=lim_t))
    halu = build_stores(load("halueval", args.data_dir, limit=lim_h))
    stores = tqa + halu
    res["n_stores"] = len(stores)
    res["mean_records_per_store"] = float(np.mean([len(s.records) for s in stores]))

    # Embedding throughput (fresh cache) on all TruthfulQA stores, then a cached rerun.
    with tempfile.TemporaryDirectory() as tmp:
        emb = Embedder(cache_dir=tmp)
        t_texts = [s.item.question for s in tqa] + sorted({t for s in tqa for t in s.texts})
        _ = emb.model  # load once, outside the timing
        t0 = time.perf_counter()
        emb.embed(t_texts)
        dt = time.perf_counter() - t0
        res["embed_texts"] = len(set(t_texts))
        res["embed_texts_per_s"] = len(set(t_texts)) / dt
        t0 = time.perf_counter()
        Embedder(cache_dir=tmp).embed(t_texts)
        res["embed_cached_rerun_s"] = time.perf_counter() - t0
        # the rest of the texts (HaluEval) go through the user cache: embedded once, ever
    emb = Embedder(progress=True)
    q = emb.embed([s.item.question for s in stores], desc="questions")
    texts = sorted({t for s in stores for t in s.texts})
    vecs = dict(zip(texts, emb.embed(texts, desc="memories")))

    # Lexical flags, once per store (shared by both paths).
    t0 = time.perf_counter()
    flags = [pair_flags(s.texts) for s in stores]
    res["lexical_flags_us_per_store"] = (time.perf_counter() - t0) / len(stores) * 1e6

    # (a) paper-style per-store reference
    mems = [np.stack([vecs[t] for t in s.texts]) for s in stores]
    n_ref = min(len(stores), 3000 if args.quick else len(stores))
    t0 = time.perf_counter()
    ref = [numpy_store_signals(q[b], mems[b], flags[b], RELEVANCE_THRESHOLD) for b in range(n_ref)]
    res["numpy_us_per_store"] = (time.perf_counter() - t0) / n_ref * 1e6

    # (b) batched JAX pass over all stores (arrays built once; the pass itself is what is timed)
    arr = store_arrays([s.texts for s in stores], q, vecs, flags)
    dev = [jax.device_put(x) for x in (arr.q, arr.mem, arr.mask, arr.flags)]
    jax.block_until_ready(aggregate(*dev, RELEVANCE_THRESHOLD))
    reps = 3 if args.quick else 10
    t0 = time.perf_counter()
    for _ in range(reps):
        out = jax.block_until_ready(aggregate(*dev, RELEVANCE_THRESHOLD))
    res["jax_batched_us_per_store"] = (time.perf_counter() - t0) / reps / len(stores) * 1e6
    got = np.stack([np.asarray(x) for x in out], 1)[:n_ref]
    res["max_abs_diff_vs_numpy"] = float(np.max(np.abs(got - np.array(ref, dtype=np.float64))))

    # (c) a single store through the jitted one-store function
    one = jax.jit(aggregate_one)
    b = 0
    single = [jax.device_put(x[b]) for x in (arr.q, arr.mem, arr.mask, arr.flags)]
    jax.block_until_ready(one(*single))
    ts = []
    for _ in range(2000):
        t0 = time.perf_counter()
        jax.block_until_ready(one(*single))
        ts.append(time.perf_counter() - t0)
    res["jax_single_store_us_median"] = statistics.median(ts) * 1e6

    res["engines"] = _engines(stores, dict(zip([s.item.question for s in stores], q)) | vecs, args.quick)

    res["ratio_batched_vs_numpy"] = res["numpy_us_per_store"] / res["jax_batched_us_per_store"]
    res["ratio_single_vs_numpy"] = res["numpy_us_per_store"] / res["jax_single_store_us_median"]
    res["targets_us"] = {"batched_per_store": 10.0, "single_store": 50.0, "paper": 98.5}

    print(f"Signal aggregation: {res['n_stores']} stores ({res['mean_records_per_store']:.2f} records "
          "each), embeddings precomputed")
    rows = [
        ("NumPy per store (paper-style)", f"{res['numpy_us_per_store']:.1f} µs/store"),
        ("JAX batched, all stores", f"{res['jax_batched_us_per_store']:.2f} µs/store "
                                    f"({res['ratio_batched_vs_numpy']:.0f}× NumPy)"),
        ("JAX single store (median)", f"{res['jax_single_store_us_median']:.1f} µs"),
        ("lexical conflict flags (both paths)", f"{res['lexical_flags_us_per_store']:.1f} µs/store"),
        ("max |JAX − NumPy| (M, R, φ, n_rel)", f"{res['max_abs_diff_vs_numpy']:.2e}"),
        (f"embedding, {res['embed_texts']} TruthfulQA texts", f"{res['embed_texts_per_s']:.0f} texts/s"),
        ("embedding, cached rerun", f"{res['embed_cached_rerun_s']:.2f} s"),
    ]
    for k, v in rows:
        print(f"{k:40s} {v}")
    eng = res["engines"]
    print(f"\nmemory_signals per engine ({eng['rounds']} interleaved rounds; ratio: the default's time over "
          "the engine's, median of the rounds' ratios)")
    for e, r in eng["by_engine"].items():
        if "why_not" in r:
            print(f"  {e:7s} not available: {r['why_not']}")
            continue
        print(f"  {e:7s} one query {r['one_query_us']:8.1f} µs ({r['one_query_ratio']:.2f}×)   "
              f"all {eng['n_stores']} stores {r['bulk_us_per_store']:6.2f} µs a store ({r['bulk_ratio']:.2f}×)")
    print(json.dumps(res))
    return res


def _engines(stores, table: dict, quick: bool) -> dict:
    """``memory_signals`` per engine, interleaved rounds on the same stores: one query a call (the first
    ``n_one`` stores, median µs a call) and all stores in one call (µs a store)."""
    embedder = type("Table", (), {"embed": lambda self, texts, desc="": np.stack([table[t] for t in texts])})()
    qs, ms = [s.item.question for s in stores], [s.texts for s in stores]
    n_one = 200 if quick else 1000
    rounds = 3 if quick else 5
    engines = ["jax", "native", "auto"]
    why = {"native": native_why_not()}
    run = [e for e in engines if why.get(e) is None]
    times: dict = {e: {"one": [], "bulk": []} for e in run}
    for e in run:  # compile and build outside the timing
        memory_signals(qs[:1], ms[:1], embedder, engine=e)
        memory_signals(qs, ms, embedder, engine=e)
    for _ in range(rounds):
        for e in run:
            ts = []
            for b in range(n_one):
                t0 = time.perf_counter()
                memory_signals(qs[b:b + 1], ms[b:b + 1], embedder, engine=e)
                ts.append(time.perf_counter() - t0)
            times[e]["one"].append(statistics.median(ts) * 1e6)
            t0 = time.perf_counter()
            memory_signals(qs, ms, embedder, engine=e)
            times[e]["bulk"].append((time.perf_counter() - t0) / len(qs) * 1e6)
    out: dict = {"rounds": rounds, "n_one": n_one, "n_stores": len(qs), "by_engine": {}}
    for e in engines:
        if e not in run:
            out["by_engine"][e] = {"why_not": why[e]}
            continue
        t, ref = times[e], times["jax"]
        out["by_engine"][e] = {
            "one_query_us": statistics.median(t["one"]), "bulk_us_per_store": statistics.median(t["bulk"]),
            "one_query_ratio": statistics.median(a / b for a, b in zip(ref["one"], t["one"])),
            "bulk_ratio": statistics.median(a / b for a, b in zip(ref["bulk"], t["bulk"])),
            "rounds_one_us": t["one"], "rounds_bulk_us": t["bulk"]}
    return out


if __name__ == "__main__":
    main()
