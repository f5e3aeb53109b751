"""RQ4, Table 8: per-stage latency of one decision on the REAL recorded signals (paper Section 5.5).

Controller stages (always measured): every pooled record's recorded (M, R, A) goes through each stage
as its own jitted one-record call, single-threaded, timed with ``perf_counter_ns`` around the call and
``block_until_ready``; two passes over all records, the first discarded as warm-up. Each stage gets the
previous stage's real outputs as input, so a stage is timed on exactly the values it sees in a decision.
  value encoding          v(M), v(R), v(1 − A)                              (3 × D = 16)
  risk modulation + fusion g_A, Σ_k W_k v_k (one contraction), tanh
  read-out + gating       C, α, C_final
  action mapping          three threshold comparisons
  whole decision          one jitted ``decide_one`` with the calibrated config closed over (what a
                          deployment with a fixed config compiles); ``mdl_jax.decide(M, R, A, config)``
                          from Python floats (the public call, input checks included: a non-default
                          config takes its general path); and ``decide`` with the default config (its
                          one-record fast path)
A stage timed alone pays one jitted dispatch (measured and reported as the floor: a trivial jitted
call), so the stages sum to more than the whole decision; the paper's NumPy stages have no such floor.

Pipeline stages (``--latency``: they need the models): signal aggregation on the real memory stores of
the run's evaluated questions with the MiniLM embeddings precomputed (the JAX one-store pass, and the
lexical conflict detection beside it), one query embedding (MiniLM, uncached ``encode`` of one
question), and one LLM call (the bundled SmolLM2, a short prompt, 16 new tokens), in the same process.
"""

from __future__ import annotations

import os
import time

import numpy as np

PAPER_TABLE8 = {  # µs, mean over 100,000 runs (paper); share in %
    "signal aggregation": 98.5, "value encoding": 24.6, "risk modulation + fusion": 8.0,
    "read-out + gating": 11.6, "action mapping": 0.05, "whole decision": 40.1,
    "whole decision median": 41.9, "whole decision p99": 74.5, "total added": 138.7,
    "query embedding": 6800.0, "LLM call": (2.0e6, 4.7e6),
}


def _time_calls(fn, args_list, passes: int = 2) -> np.ndarray:
    """µs per call of fn(*args) (block_until_ready), the last pass."""
    import jax

    out = np.zeros(len(args_list))
    for _ in range(passes):
        for i, args in enumerate(args_list):
            t0 = time.perf_counter_ns()
            jax.block_until_ready(fn(*args))
            out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out


def _summary(us: np.ndarray) -> dict:
    return {"median": float(np.median(us)), "p99": float(np.percentile(us, 99)), "mean": float(np.mean(us)),
            "n": int(len(us))}


def controller_stages(M, R, A, cfg, max_records: int | None = None) -> dict:
    """Per-stage latency (µs) of the controller on the given recorded signals."""
    import jax
    import jax.numpy as jnp

    import mdl_jax
    from mdl_jax.controller import decision as d

    M, R, A = (np.asarray(x, np.float32)[:max_records] for x in (M, R, A))

    @jax.jit
    def encode3(m, r, a):
        s_a = 1.0 - a if cfg.risk_inversion else a
        return d.encode(m, cfg), d.encode(r, cfg), d.encode(s_a, cfg)

    @jax.jit
    def fuse(v_wm, v_r, v_a):
        g_A = d.risk_gain(v_a, cfg)
        W = d.weight_matrices(cfg, v_wm.dtype)
        z = jnp.einsum("kij,kj->i", W, jnp.stack([g_A * v_wm, v_r, v_a]), precision=d._HI)
        return jnp.tanh(z + jnp.asarray(cfg.bias, v_wm.dtype))

    @jax.jit
    def readout_gate(v_meta, v_wm):
        C, alpha, _ = d.read_out(v_meta, v_wm, cfg)
        return d.gate(C, alpha, cfg)

    act = jax.jit(lambda cf: d.act(cf, cfg))
    trivial = jax.jit(lambda x: x + 1.0)

    sig = list(zip(*(jnp.asarray(x) for x in (M, R, A))))
    enc = [encode3(*s) for s in sig]
    fused = [fuse(*e) for e in enc]
    cfs = [readout_gate(f, e[0]) for f, e in zip(fused, enc)]
    res = {
        "value encoding": _summary(_time_calls(encode3, sig)),
        "risk modulation + fusion": _summary(_time_calls(fuse, enc)),
        "read-out + gating": _summary(_time_calls(readout_gate, [(f, e[0]) for f, e in zip(fused, enc)])),
        "action mapping": _summary(_time_calls(act, [(c,) for c in cfs])),
        "dispatch floor": _summary(_time_calls(trivial, [(s[0],) for s in sig])),
        "load_average": os.getloadavg()[0], "cpus": os.cpu_count(),
    }
    one = jax.jit(lambda m, r, a: d.decide_one(m, r, a, cfg))  # the config closed over, as a deployment would
    res["whole decision, jitted decide_one"] = _summary(_time_calls(one, sig))
    floats = [(float(m), float(r), float(a)) for m, r, a in zip(M, R, A)]
    res["whole decision"] = _summary(_time_calls(lambda m, r, a: mdl_jax.decide(m, r, a, cfg), floats))
    res["whole decision, default config"] = _summary(_time_calls(lambda m, r, a: mdl_jax.decide(m, r, a),
                                                                 floats))
    return res


def pipeline_stages(records_path, df, data_dir=None, cache_dir=None, n_llm: int = 3) -> dict:
    """Signal aggregation on the run's real stores, one query embedding, one LLM call (µs)."""
    import torch

    # single-threaded, as the paper's benchmark: on a shared machine torch's OpenMP threads spin against
    # other processes and a 16-token call can take 100× longer than on an idle core
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _pipeline_stages(records_path, df, data_dir, cache_dir, n_llm)
    finally:
        torch.set_num_threads(threads)


def _pipeline_stages(records_path, df, data_dir, cache_dir, n_llm):
    import json
    from pathlib import Path

    import jax

    from mdl_jax.signals.conflict import pair_flags
    from mdl_jax.pipeline.data import load
    from mdl_jax.signals.embeddings import Embedder
    from mdl_jax.pipeline.generation import LocalBackend
    from mdl_jax.signals.aggregation import RELEVANCE_THRESHOLD, aggregate_one, store_arrays
    from mdl_jax.pipeline.stores import StoreConfig, build_stores

    run = {}
    rp = Path(records_path).with_name("run.json")
    if rp.is_file():
        run = json.loads(rp.read_text())
    store_seed = (run.get("config") or {}).get("store_seed", 0)
    stores = []
    for ds in sorted(df["dataset"].unique()):
        items = load(ds, data_dir)
        want = set((run.get("datasets", {}).get(ds) or {}).get("eval_qids") or df[df["dataset"] == ds]["qid"])
        stores += [s for s in build_stores(items, StoreConfig(seed=store_seed)) if s.item.qid in want]
    emb = Embedder(cache_dir=cache_dir)
    q_emb = emb.embed([s.item.question for s in stores])
    texts = sorted({t for s in stores for t in s.texts})
    t_emb = dict(zip(texts, emb.embed(texts)))
    flags = []
    lex = np.zeros(len(stores))
    for i, s in enumerate(stores):  # lexical conflict detection, timed per store
        t0 = time.perf_counter_ns()
        flags.append(pair_flags(s.texts))
        lex[i] = (time.perf_counter_ns() - t0) / 1e3
    arr = store_arrays([s.texts for s in stores], q_emb, t_emb, flags)
    one = jax.jit(lambda q, m, k, f: aggregate_one(q, m, k, f, RELEVANCE_THRESHOLD))
    args = [(arr.q[i], arr.mem[i], arr.mask[i], arr.flags[i]) for i in range(len(stores))]
    agg = _time_calls(one, args)
    res = {"signal aggregation (JAX, one store)": _summary(agg), "lexical conflict detection": _summary(lex),
           "n_stores": len(stores), "records_per_store": float(np.mean([len(s.records) for s in stores]))}
    # one query embedding: encode directly (the cache would answer instead of the model)
    model = emb.model
    qs = [s.item.question for s in stores[:30]]
    model.encode(qs[:1], convert_to_numpy=True)  # warm-up
    q_us = []
    for q in qs:
        t0 = time.perf_counter_ns()
        model.encode([q], convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
        q_us.append((time.perf_counter_ns() - t0) / 1e3)
    res["query embedding (MiniLM)"] = _summary(np.array(q_us))
    backend = LocalBackend(batch_size=1, max_new_tokens=16)
    prompt = [{"role": "user", "content": stores[0].item.question}]
    backend.generate([prompt], seed=0)  # warm-up: loads the model
    l_us = []
    for k in range(n_llm):
        t0 = time.perf_counter_ns()
        backend.generate([prompt], seed=k + 1)
        l_us.append((time.perf_counter_ns() - t0) / 1e3)
    res["LLM call (SmolLM2, 16 new tokens)"] = _summary(np.array(l_us))
    res["llm_model"] = backend.model_id
    res["load_average"] = os.getloadavg()[0]
    return res


def table8_md(ctrl: dict, pipe: dict | None, note: str = "") -> str:
    p = PAPER_TABLE8
    stages = [("value encoding", "Gaussian-peak value mapping (3×, D = 16)"),
              ("risk modulation + fusion", "g_A + one (3·16)×16 contraction + tanh"),
              ("read-out + gating", "norm/cosine decoupling + gating"),
              ("action mapping", "threshold comparisons")]
    lines = ["| Computation stage | Median (µs) | p99 (µs) | Mean (µs) | Paper mean (µs) | Note |",
             "|---|---|---|---|---|---|"]
    if pipe:
        a = pipe["signal aggregation (JAX, one store)"]
        lx = pipe["lexical conflict detection"]
        lines.append(f"| Signal aggregation (JAX, one store, embeddings precomputed) | {a['median']:.1f} | "
                     f"{a['p99']:.1f} | {a['mean']:.1f} | {p['signal aggregation']} (with conflict detection) | "
                     f"{pipe['n_stores']} real stores, {pipe['records_per_store']:.2f} records each |")
        lines.append(f"| Lexical conflict detection (Python, per store) | {lx['median']:.1f} | {lx['p99']:.1f} | "
                     f"{lx['mean']:.1f} | (in the row above) | pairwise negation / polarity / antonym flags |")
    else:
        lines.append(f"| Signal aggregation | not measured | | | {p['signal aggregation']} | "
                     "needs the embedding model: run `mdl-jax analyze RECORDS --latency` |")
    for k, note_k in stages:
        s = ctrl[k]
        lines.append(f"| {k[0].upper() + k[1:]} | {s['median']:.1f} | {s['p99']:.1f} | {s['mean']:.1f} | {p[k]} | "
                     f"{note_k}; one jitted call |")
    w, wd, fl = ctrl["whole decision, jitted decide_one"], ctrl["whole decision, default config"], \
        ctrl["dispatch floor"]
    wp = ctrl["whole decision"]
    lines.append(f"| Controller decision only (jitted `decide_one`, calibrated config) | {w['median']:.1f} | "
                 f"{w['p99']:.1f} | {w['mean']:.1f} | {p['whole decision']} (median {p['whole decision median']}, p99 "
                 f"{p['whole decision p99']}) | all five stages in one compiled call |")
    lines.append(f"| Controller decision only (`decide`, calibrated config) | {wp['median']:.1f} | {wp['p99']:.1f} | "
                 f"{wp['mean']:.1f} | – | public call from Python floats; a non-default config takes the general path |")
    lines.append(f"| Controller decision only (`decide`, default config) | {wd['median']:.1f} | {wd['p99']:.1f} | "
                 f"{wd['mean']:.1f} | – | one-record fast path (native kernel where built) |")
    lines.append(f"| Dispatch floor (trivial jitted call) | {fl['median']:.1f} | {fl['p99']:.1f} | {fl['mean']:.1f} | – | "
                 "paid once by every stage row above |")
    if pipe:
        tot = pipe["signal aggregation (JAX, one store)"]["median"] + pipe["lexical conflict detection"]["median"] \
            + w["median"]
        lines.append(f"| Total added latency (aggregation + conflicts + decision, medians) | {tot:.1f} | | | "
                     f"{p['total added']} | |")
        q, llm = pipe["query embedding (MiniLM)"], pipe["LLM call (SmolLM2, 16 new tokens)"]
        lines.append(f"| One query embedding (MiniLM, uncached) | {q['median']:.0f} | {q['p99']:.0f} | {q['mean']:.0f} | "
                     f"{p['query embedding']:.0f} | {q['median'] / tot:.0f}× the added latency |")
        lines.append(f"| One LLM call ({pipe['llm_model']}, short prompt) | {llm['median']:.0f} | – | {llm['mean']:.0f} | "
                     f"2.0–4.7 × 10^6 (API backends) | {llm['median'] / tot:.0f}× the added latency; {llm['n']} calls |")
    else:
        lines.append("| One query embedding / one LLM call | not measured | | | 6800 / 2–4.7 × 10^6 | "
                     "skipped without `--latency` (loads MiniLM and SmolLM2) |")
    n = ctrl["whole decision"]["n"]
    load = f"1-minute load average {ctrl['load_average']:.1f} on {ctrl['cpus']} CPUs during the controller timing"
    if pipe:
        load += f", {pipe['load_average']:.1f} during the pipeline timing (torch single-threaded)"
    lines += ["", f"Measured on the {n} recorded (M, R, A) triples, single record per call, second of two passes; "
              f"{load}. A load above the CPU count means other processes shared the cores: medians hold up, "
              "p99 and the model calls do not. " + note]
    return "\n".join(lines)
