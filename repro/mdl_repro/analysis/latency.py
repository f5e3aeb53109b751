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

import numpy as np

from mdl_repro.timing import summary as _summary
from mdl_repro.timing import time_calls as _time_calls

PAPER_TABLE8 = {  # µs, mean over 100,000 runs (paper); share in %
    "signal aggregation": 98.5, "value encoding": 24.6, "risk modulation + fusion": 8.0,
    "read-out + gating": 11.6, "action mapping": 0.05, "whole decision": 40.1,
    "whole decision median": 41.9, "whole decision p99": 74.5, "total added": 138.7,
    "query embedding": 6800.0, "LLM call": (2.0e6, 4.7e6),
}


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
        z = jnp.einsum("kij,kj->i", W, jnp.stack([g_A * v_wm, v_r, v_a]), precision=d.PRECISION)
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
