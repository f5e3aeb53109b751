"""Table 8's pipeline stages, timed on the run's real stores and models (``mdl-jax analyze --latency``):
signal aggregation, lexical conflict detection, one MiniLM query embedding and one SmolLM2 call.

This loads models and calls the LLM, so it is experiment work: the command line measures it and hands the
figures to the analyses (``analysis/latency.py`` formats Table 8), which never call a model themselves.
"""

from __future__ import annotations

import os
import time

import numpy as np

from mdl_repro.timing import summary as _summary
from mdl_repro.timing import time_calls as _time_calls


def pipeline_stages(records_path, df, data_dir=None, cache_dir=None, n_llm: int = 3) -> dict:
    """Signal aggregation on the run's real stores, one query embedding, one LLM call (µs)."""
    import torch

    # single-threaded, as the paper's benchmark: on a shared machine torch's OpenMP threads spin against
    # other processes and a 16-token call can take many times longer than on an idle core
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _pipeline_stages(records_path, df, data_dir, cache_dir, n_llm)
    finally:
        torch.set_num_threads(threads)


def _pipeline_stages(records_path, df, data_dir, cache_dir, n_llm):
    from pathlib import Path

    import jax

    from mdl_jax.signals.aggregation import RELEVANCE_THRESHOLD, aggregate_one, store_arrays
    from mdl_jax.signals.conflict import pair_flags
    from mdl_jax.signals.embeddings import Embedder
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.generation import LocalBackend
    from mdl_repro.pipeline.records import read_run_json
    from mdl_repro.pipeline.stores import StoreConfig, build_stores

    run = read_run_json(Path(records_path).with_name("run.json"))
    store_seed = (run.get("config") or {}).get("store_seed", 0)
    stores = []
    for ds in sorted(df["dataset"].unique()):
        items = load(ds, data_dir)
        want = set(((run.get("datasets") or {}).get(ds) or {}).get("eval_qids") or df[df["dataset"] == ds]["qid"])
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
