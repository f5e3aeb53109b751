"""The memory gate's throughput and memory: records/s and peak RSS at 10^4, 10^5 and 10^6 synthetic
queries × 5 memories with cached embeddings, then uncached with the real MiniLM on a smaller set;
time split into embedding / signals / decision.

    python -m experiments.bench_gate            # 10^4, 10^5, 10^6 cached + 200 uncached (a few minutes)
    python -m experiments.bench_gate --quick    # 10^3, 10^4 cached + 40 uncached

Each size runs in its own process (``--child N``), so its peak RSS (``ru_maxrss``) is its own. Rows are
streamed through ``MemoryGate.columns`` in chunks of ``--chunk`` queries, as ``mdl-jax gate`` does;
only per-chunk counts are kept, as a file writer would.

Cached embeddings: 10,000 synthetic query texts and 40,000 memory texts (384-d, MiniLM's width) with
vectors computed once and looked up by text (what the SQLite cache returns, without its I/O); query i
is query text i mod 10,000 with its group's 4 memories (cosines to the query spread over 0.1-0.95,
some stated as the negation of another, so φ fires) plus one memory of another group, every text
suffixed with " #i" so no record repeats another's strings (the look-up strips the suffix). Stages:
  embedding   the look-ups (``embedder.embed``)
  signals     input checks and risk, the lexical conflict flags + padding (Python, per store), the
              batched JAX aggregation of M, R, φ
  decision    ``mdl_jax.decide`` on the chunk's (M, R, A) and the output columns
The decision stage's work is also timed on every engine that runs here beside the pure-JAX default
("jax"; "native" and "auto" on the CPU, "pallas" on a GPU, an engine that cannot run named with its
reason), interleaved in one process, as ratios to the default: the gate itself asks for "auto". The
CPU's model and flags are printed first.
Targets: memory flat from 10^4 to 10^6 (peak RSS ratio ≤ 1.1), time linear (seconds per
record ratio ≤ 1.2: wall time, and apart the process's CPU time, which other jobs' load inflates
little), decision stage ≥ 10^6 queries/s with cached embeddings; ≥ 5×10^4 rows/s cached for
``columns``, ``decide_batch`` (10^5 rows; GateDecision objects) and ``mdl-jax gate`` (5×10^4 JSONL rows
of TruthfulQA stores, texts in the SQLite cache, a run over its first part apart: ``child_cli``). The current RSS after each chunk is
reported too (its max): the peak of every size is set by the setup (imports, compilation, the warm-up
chunks), so growth during the stream shows there first. Prints each target beside its measured figure
with met / NOT met, then a last JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from experiments._machine import cpu_flags, cpu_model

D = 384
FLAGS_SHOWN = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "amx_tile")
N_QUERIES = 10_000
GROUP = 4
ADJ = ("safe", "legal", "healthy", "effective", "real", "true", "possible", "dangerous")


def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


class PrecomputedEmbedder:
    """Vectors computed once, looked up by text: the cached path without SQLite's I/O."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        q = _unit(rng.normal(size=(N_QUERIES, D)))
        # memory j of group k: cos(q_k, m) ≈ a_j, a spread from weakly to strongly relevant
        a = np.array([0.95, 0.8, 0.5, 0.1], np.float32)
        noise = _unit(rng.normal(size=(N_QUERIES, GROUP, D)))
        m = _unit(a[None, :, None] * q[:, None, :] + np.sqrt(1 - a ** 2)[None, :, None] * noise)
        self.queries = [f"Is item {k} {ADJ[k % len(ADJ)]} for people in region {k % 97}?"
                        for k in range(N_QUERIES)]
        self.memories = [[self._memory(k, j) for j in range(GROUP)] for k in range(N_QUERIES)]
        texts = self.queries + [t for g in self.memories for t in g]
        self.index = {t: i for i, t in enumerate(texts)}
        self.vectors = np.concatenate([q, m.reshape(-1, D)])

    @staticmethod
    def _memory(k: int, j: int) -> str:
        adj = ADJ[k % len(ADJ)]
        if j == 1 and k % 3 == 0:  # one in three groups holds a contradiction: φ > 0
            return f"Item {k} is not {adj} for people in region {k % 97}, says source {j}."
        return f"Item {k} is {adj} for people in region {k % 97}, says source {j}."

    def embed(self, texts, desc: str = ""):
        # the key is the text without its " #record" suffix: every record's texts are new strings
        # (nothing downstream can reuse an earlier record's work), their vectors cached
        return self.vectors[[self.index[t.rpartition(" #")[0]] for t in texts]]

    def rows(self, start: int, n: int):
        """Queries start..start+n: (queries, memory lists) with 5 memories each, all texts unique."""
        qs, ms = [], []
        for i in range(start, start + n):
            k = i % N_QUERIES
            other = self.memories[(k * 7919 + 1) % N_QUERIES][i % GROUP]
            qs.append(f"{self.queries[k]} #{i}")
            ms.append([f"{t} #{i}" for t in self.memories[k]] + [f"{other} #{i}"])
        return qs, ms


def _rss_mb() -> float:
    """Peak RSS of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rss_now_mb() -> float:
    """Current RSS (MB): sampled after each chunk, it shows growth the peak would hide behind setup."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:  # not Linux: fall back to the peak
        return _rss_mb()


def child_cached(n: int, chunk: int) -> dict:
    from mdl_jax.gate import MemoryGate

    emb = PrecomputedEmbedder()
    gate = MemoryGate(embedder=emb, risk=lambda q, c: 0.2 + 0.65 * (hash(q) % 3 == 0))
    for m in {min(chunk, n), n % chunk} - {0}:  # compile for the chunk shapes of this stream
        gate.columns(*emb.rows(10 ** 9, m))  # on other records: the timed texts stay unseen
    rss_setup = _rss_mb()
    t: dict = {}
    counts = np.zeros(4, np.int64)
    now = []  # current RSS after each chunk (outside the timed loop's stages, a few µs each)
    cpu0 = time.process_time()  # this process's CPU time (all threads): others' load inflates it little
    t0 = time.perf_counter()
    in_gate = 0.0
    for start in range(0, n, chunk):
        qs, ms = emb.rows(start, min(chunk, n - start))
        t1 = time.perf_counter()
        cols = gate.columns(qs, ms, timings=t)
        in_gate += time.perf_counter() - t1
        counts += np.bincount(cols["action"], minlength=4)
        now.append(_rss_now_mb())
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    # the rate of ``columns`` itself: the loop's time less the synthetic rows' making (f-strings, ~2 µs
    # a row, a stand-in for reading them) and the counting
    return {"n": n, "wall_s": wall, "cpu_s": cpu, "gate_s": in_gate, "records_per_s": n / in_gate,
            "records_per_s_loop": n / wall, "stages_s": t,
            "signals_s": t["checks"] + t["conflict"] + t["aggregation"],
            "decision_per_s": n / t["decision"], "rss_setup_mb": rss_setup, "peak_rss_mb": _rss_mb(),
            "rss_after_first_chunk_mb": now[0], "rss_after_chunks_max_mb": max(now), "rss_end_mb": now[-1],
            "actions": counts.tolist()}


def child_uncached(n: int) -> dict:
    """Real MiniLM, a fresh cache: TruthfulQA questions × 5 of their own and other answers."""
    from mdl_jax.gate import MemoryGate
    from mdl_repro.pipeline.data import load

    items = load("truthfulqa", limit=n + 5)
    qs = [it.question for it in items[:n]]
    ms = [list(it.correct[:2]) + list(it.incorrect[:2]) + [items[i + 5].correct[0]]
          for i, it in enumerate(items[:n])]
    with tempfile.TemporaryDirectory() as cache:
        gate = MemoryGate(cache_dir=cache)
        t0 = time.perf_counter()
        _ = gate.embedder.model  # load the weights outside the timed stages (reported apart)
        load_s = time.perf_counter() - t0
        t: dict = {}
        t0 = time.perf_counter()
        gate.columns(qs, ms, timings=t)
        wall = time.perf_counter() - t0
        n_texts = gate.embedder.n_embedded
    return {"n": n, "wall_s": wall, "records_per_s": n / wall, "stages_s": t, "model_load_s": load_s,
            "texts_embedded": n_texts, "embed_backend": gate.embedder.backend, "signals_s": t["checks"] + t["conflict"] + t["aggregation"],
            "peak_rss_mb": _rss_mb()}


def child_decision(n: int, chunk: int) -> dict:
    """The decision stage alone: n (M, R, A) triples through ``MemoryGate.decide_signals`` in chunks.
    Reports the rate over the total time and over the fastest chunk (the least disturbed by other
    jobs on a shared machine)."""
    from mdl_jax.gate import MemoryGate

    gate = MemoryGate(embedder=lambda t: np.ones((len(t), 2)))
    rng = np.random.default_rng(0)
    M, R, A = (rng.random(chunk, dtype=np.float32) for _ in range(3))
    gate.decide_signals(M, R, A)
    times = []
    for _ in range(0, n, chunk):
        M, R, A = (rng.random(chunk, dtype=np.float32) for _ in range(3))
        t0 = time.perf_counter()
        gate.decide_signals(M, R, A)
        times.append(time.perf_counter() - t0)
    total = len(times) * chunk
    return {"n": total, "chunk": chunk, "per_s_total": total / sum(times),
            "per_s_median_chunk": chunk / float(np.median(times)), "per_s_best_chunk": chunk / min(times)}


def child_engines(n: int, chunk: int, rounds: int = 5) -> dict:
    """The decision stage's work on every engine that runs here beside the default: ``decide`` on
    chunks of ``chunk`` (M, R, A) triples (the gate's padded chunk shape) with the gate's config, n
    records an engine a round, engines interleaved round by round. Each engine's rate is the median
    round's, its ratio to the default the median of the per-round ratios; an engine that cannot run
    here is reported with ``why_not``'s reason. The gate itself calls ``engine="auto"``."""
    from mdl_jax import decide
    from mdl_jax.controller import api
    from mdl_jax.gate import MemoryGate

    cfg = MemoryGate(embedder=lambda t: np.ones((len(t), 2))).config
    rng = np.random.default_rng(0)
    M, R, A = (rng.random(chunk, dtype=np.float32) for _ in range(3))
    missing = {}
    engines = ["jax"]
    for e in ("native", "pallas"):
        why = api.engine_module(e).why_not(cfg, (M, R, A))
        if why is None:
            engines.append(e)
        else:
            missing[e] = why
    engines.append("auto")
    for e in engines:  # compile and warm
        decide(M, R, A, cfg, engine=e)
    per: dict = {e: [] for e in engines}
    calls = max(1, n // chunk)
    for r in range(rounds):
        for e in engines[r % len(engines):] + engines[:r % len(engines)]:
            t0 = time.perf_counter()
            for _ in range(calls):
                np.asarray(decide(M, R, A, cfg, engine=e).action)
            per[e].append(calls * chunk / (time.perf_counter() - t0))
    ratios = {e: float(np.median([a / b for a, b in zip(per[e], per["jax"])])) for e in engines}
    return {"n": calls * chunk, "chunk": chunk, "rounds": rounds, "engines": engines, "unavailable": missing,
            "per_s": {e: float(np.median(v)) for e, v in per.items()}, "per_s_rounds": per,
            "speed_vs_default": ratios}


def engines_line(r: dict) -> str:
    """One line: every engine's decision rate beside the default, as ratios measured in the same run."""
    d = r["per_s"]["jax"]
    parts = [f"default 'jax' {d:,.0f}/s"] + [
        f"{e!r} {r['per_s'][e]:,.0f}/s ({r['speed_vs_default'][e]:.2f}× the default)"
        for e in r["engines"] if e != "jax"] + [f"{e!r}: not available: {why}" for e, why in r["unavailable"].items()]
    return (f"decision stage by engine ({r['n']:,} rows in chunks of {r['chunk']:,}, {r['rounds']} interleaved "
            f"rounds, ratios per round): " + "; ".join(parts))


def child_batch(n: int, chunk: int) -> dict:
    """``MemoryGate.decide_batch`` (one ``GateDecision`` per row) on the cached synthetic rows."""
    from mdl_jax.gate import MemoryGate

    emb = PrecomputedEmbedder()
    gate = MemoryGate(embedder=emb, risk=0.5)
    gate.decide_batch(*emb.rows(10 ** 9, min(chunk, n)))  # compile, on other records
    in_gate = 0.0
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        rows = emb.rows(start, min(chunk, n - start))
        t1 = time.perf_counter()
        gate.decide_batch(*rows)
        in_gate += time.perf_counter() - t1
    wall = time.perf_counter() - t0
    return {"n": n, "wall_s": wall, "gate_s": in_gate, "records_per_s": n / in_gate,
            "records_per_s_loop": n / wall}


def child_cli(n: int) -> dict:
    """``mdl-jax gate`` on n JSONL rows of TruthfulQA stores (its 817 questions × their stores, repeated)
    with every text already in the embedding cache (a first run filled it), timed as a process. The
    stream's rate is (n - C) / (t_n - t_C), C = one part (CHUNK_SIZE rows): the run over one part pays
    what a run pays once, imports, the cache's opening and the decision's compile for a part's shape
    (~0.15 s on the first part, bench_gate's profile), which a run over one row does not all pay; the
    rate over (n - 1) / (t_n - t_1) is reported too, and the whole process's. Each time is the fastest of
    two runs."""
    from mdl_jax.gate.files import CHUNK_SIZE
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.stores import build_stores

    stores = build_stores(load("truthfulqa"))
    with tempfile.TemporaryDirectory() as tmp:
        def write(name, m):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                for i in range(m):
                    s = stores[i % len(stores)]
                    f.write(json.dumps({"query": s.item.question, "memories": list(s.texts)}) + "\n")
            return path

        big, one, part = write("rows.jsonl", n), write("one.jsonl", 1), write("part.jsonl", CHUNK_SIZE)

        def run(path):
            if os.path.exists(path + ".out.parquet"):
                os.unlink(path + ".out.parquet")  # the gate refuses to overwrite its output
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "mdl_jax", "gate", path, "--out", path + ".out.parquet",
                            "--cache-dir", os.path.join(tmp, "cache"), "--no-progress"], check=True,
                           capture_output=True)
            return time.perf_counter() - t0

        fill = run(write("fill.jsonl", len(stores)))  # embeds every text once (MiniLM)
        # each the fastest of two runs: a process's start-up varies by ±0.2 s here, as much as a tenth
        # of the stream's time, and a difference of two single runs showed it (59-114k rows/s)
        t1, tc, tn = (min(run(p), run(p)) for p in (one, part, big))
    # A difference of two process times is a rate only when it stands above their start-up noise
    # (±0.2 s): with --quick's 5,000 rows the part after the first (904 rows) took less than that, and
    # the rate printed was 9×10^11 rows/s. Below MIN_STREAM_S it is None: not resolved at this n.
    def rate(rows, dt):
        return rows / dt if dt >= MIN_STREAM_S else None
    return {"n": n, "chunk": CHUNK_SIZE, "fill_s": fill, "one_row_s": t1, "one_part_s": tc, "wall_s": tn,
            "records_per_s_process": n / tn, "records_per_s_after_one_row": rate(n - 1, tn - t1),
            "records_per_s": rate(n - CHUNK_SIZE, tn - tc)}


MIN_STREAM_S = 0.5  # seconds: 2.5× a process start-up's spread here


def _spawn(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "experiments.bench_gate", *argv], capture_output=True,
                         text=True, env={**os.environ}, check=False)
    if out.returncode:
        sys.exit(f"child {argv} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chunk", type=int, default=4096, help="queries per gate call")
    ap.add_argument("--uncached", type=int, default=None, help="queries for the real-MiniLM run")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--decision-only", action="store_true", help="only the decision stage, 10^6 rows")
    args = ap.parse_args(argv)
    if args.child:
        kind, n = args.child.split(":")
        res = (child_cached(int(n), args.chunk) if kind == "cached" else child_decision(int(n), args.chunk)
               if kind == "decision" else child_batch(int(n), args.chunk) if kind == "batch"
               else child_engines(int(n), args.chunk) if kind == "engines"
               else child_cli(int(n)) if kind == "cli" else child_uncached(int(n)))
        print(json.dumps(res))
        return 0
    print(f"CPU: {cpu_model()}; flags: {' '.join(cpu_flags(FLAGS_SHOWN)) or '-'}", flush=True)
    if args.decision_only:
        eng = _spawn(["--child", "engines:1000000", "--chunk", str(args.chunk)])
        print(engines_line(eng), flush=True)
        r = _spawn(["--child", "decision:1000000", "--chunk", str(args.chunk)])
        print(f"decision stage alone: {r['per_s_total']:,.0f}/s over the total, {r['per_s_median_chunk']:,.0f}/s "
              f"median chunk, {r['per_s_best_chunk']:,.0f}/s best chunk (target ≥ 1,000,000/s)")
        print(json.dumps({"bench": "gate-decision", "load_average": os.getloadavg()[0], "cpu_model": cpu_model(),
                          "cpu_flags": cpu_flags(FLAGS_SHOWN), "engines": eng, **r}))
        return 0
    sizes = [10 ** 3, 10 ** 4] if args.quick else [10 ** 4, 10 ** 5, 10 ** 6]
    n_unc = args.uncached or (40 if args.quick else 200)
    print(f"mdl-jax gate benchmark: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
          "(the machine is shared: absolute rates are inflated by other jobs; ratios in one run hold)",
          flush=True)
    cached = []
    for n in sizes:
        cached.append(_spawn(["--child", f"cached:{n}", "--chunk", str(args.chunk)]))
        r = cached[-1]
        s = r["stages_s"]
        print(f"cached {n:>9,d}: {r['records_per_s']:>9,.0f} rec/s in columns ({r['records_per_s_loop']:,.0f} "
              f"with the synthetic rows' making)  wall {r['wall_s']:7.2f} s  "
              f"embedding {s['embedding']:6.2f}  signals {r['signals_s']:7.2f} (conflict+pad "
              f"{s['conflict']:.2f}, JAX {s['aggregation']:.2f})  decision {s['decision']:.3f} s "
              f"({r['decision_per_s']:,.0f}/s)  peak RSS {r['peak_rss_mb']:.0f} MB "
              f"(after setup {r['rss_setup_mb']:.0f}; current after the chunks ≤ {r['rss_after_chunks_max_mb']:.0f})",
              flush=True)
    unc = _spawn(["--child", f"uncached:{n_unc}"])
    s = unc["stages_s"]
    print(f"uncached {n_unc:>7,d}: {unc['records_per_s']:>9,.1f} rec/s  wall {unc['wall_s']:7.2f} s  "
          f"embedding {s['embedding']:6.2f} ({unc['texts_embedded']} texts)  signals "
          f"{unc['signals_s']:.2f}  decision {s['decision']:.3f} s  (model load {unc['model_load_s']:.1f} s "
          f"apart)  peak RSS {unc['peak_rss_mb']:.0f} MB  embedder backend {unc['embed_backend']} (the "
          f"gate's default 'auto')", flush=True)
    alone = _spawn(["--child", "decision:1000000", "--chunk", str(args.chunk)])
    print(f"decision stage alone (10^6): {alone['per_s_total']:,.0f}/s over the total, "
          f"{alone['per_s_median_chunk']:,.0f}/s median chunk, {alone['per_s_best_chunk']:,.0f}/s best chunk",
          flush=True)
    eng = _spawn(["--child", f"engines:{10 ** 5 if args.quick else 10 ** 6}", "--chunk", str(args.chunk)])
    print(engines_line(eng), flush=True)
    n_rows = sizes[-1] if args.quick else 10 ** 5
    batch = _spawn(["--child", f"batch:{n_rows}", "--chunk", str(args.chunk)])
    print(f"decide_batch {n_rows:>9,d}: {batch['records_per_s']:>9,.0f} rec/s (GateDecision objects; "
          f"{batch['records_per_s_loop']:,.0f} with the synthetic rows' making)", flush=True)
    cli = _spawn(["--child", f"cli:{n_rows // 2}"])
    def _r(x):
        return f"{x:,.0f} rec/s" if x is not None else f"not resolved (< {MIN_STREAM_S} s beyond the shorter run)"
    print(f"mdl-jax gate {cli['n']:>9,d} rows, texts in the SQLite cache: {_r(cli['records_per_s'])} "
          f"streamed after the first part ({_r(cli['records_per_s_after_one_row'])} after one row, "
          f"{cli['records_per_s_process']:,.0f} over the whole process; {cli['one_row_s']:.1f} s for one row, "
          f"{cli['one_part_s']:.1f} s for one part of {cli['chunk']:,})", flush=True)
    lo, hi = cached[0], cached[-1]
    rss_ratio = hi["peak_rss_mb"] / lo["peak_rss_mb"]
    # current RSS after the chunks (max over the stream): growth the setup's peak could hide
    live_ratio = hi["rss_after_chunks_max_mb"] / lo["rss_after_chunks_max_mb"]
    per_rec = [r["wall_s"] / r["n"] for r in cached]
    lin = per_rec[-1] / per_rec[0]
    cpu_rec = [r["cpu_s"] / r["n"] for r in cached]
    lin_cpu = cpu_rec[-1] / cpu_rec[0]
    dec = min(r["decision_per_s"] for r in cached[1:] or cached)
    targets = {"peak_rss_ratio_max": 1.1, "time_per_record_ratio_max": 1.2, "decision_per_s_min": 1e6,
               "cached_rows_per_s_min": 5e4}
    met = {"memory_flat": rss_ratio <= targets["peak_rss_ratio_max"],
           "time_linear": lin <= targets["time_per_record_ratio_max"],
           "time_linear_cpu": lin_cpu <= targets["time_per_record_ratio_max"],
           "decision_1e6_per_s": dec >= targets["decision_per_s_min"],
           "columns_5e4_rows_per_s": hi["records_per_s"] >= targets["cached_rows_per_s_min"],
           "decide_batch_5e4_rows_per_s": batch["records_per_s"] >= targets["cached_rows_per_s_min"],
           "cli_5e4_rows_per_s": (None if cli["records_per_s"] is None
                                  else cli["records_per_s"] >= targets["cached_rows_per_s_min"])}
    span = f"{sizes[0]:.0e} -> {sizes[-1]:.0e}"

    def row(target: str, measured: str, ok: bool | None) -> None:
        print(f"{target:50s} {measured:54s} {'' if ok is None else 'met' if ok else 'NOT met'}")

    print()
    row("target", "measured", None)
    row(f"memory flat {span}: peak RSS ratio ≤ 1.1",
        f"{lo['peak_rss_mb']:.0f} -> {hi['peak_rss_mb']:.0f} MB, ×{rss_ratio:.3f}", met["memory_flat"])
    row("  RSS after the chunks, max (no target)",
        f"{lo['rss_after_chunks_max_mb']:.0f} -> {hi['rss_after_chunks_max_mb']:.0f} MB, ×{live_ratio:.3f}", None)
    row("time linear: s per record ratio ≤ 1.2",
        f"{per_rec[0] * 1e6:.1f} -> {per_rec[-1] * 1e6:.1f} µs per record, ×{lin:.2f}", met["time_linear"])
    row("  the same in CPU time (less sensitive to load)",
        f"{cpu_rec[0] * 1e6:.1f} -> {cpu_rec[-1] * 1e6:.1f} µs per record, ×{lin_cpu:.2f}", met["time_linear_cpu"])
    row("decision stage ≥ 1,000,000 queries/s",
        f"{dec:,.0f} /s (slowest size ≥ {sizes[1 if len(sizes) > 1 else 0]:.0e})", met["decision_1e6_per_s"])
    row("cached rows/s ≥ 50,000: columns",
        f"{hi['records_per_s']:,.0f} /s at {sizes[-1]:.0e}", met["columns_5e4_rows_per_s"])
    row("  decide_batch", f"{batch['records_per_s']:,.0f} /s at {n_rows:.0e}", met["decide_batch_5e4_rows_per_s"])
    row("  mdl-jax gate (SQLite cache, first part apart)",
        f"{cli['records_per_s']:,.0f} /s at {cli['n']:.0e}" if cli["records_per_s"] is not None
        else f"n = {cli['n']:.0e} too small to resolve: run without --quick", met["cli_5e4_rows_per_s"])
    summary = {"bench": "gate", "load_average": os.getloadavg()[0], "chunk": args.chunk,
               "cpu_model": cpu_model(), "cpu_flags": cpu_flags(FLAGS_SHOWN),
               "cached": cached, "uncached": unc, "decision_alone": alone, "engines": eng, "decide_batch": batch, "cli": cli, "peak_rss_ratio": rss_ratio,
               "rss_after_chunks_ratio": live_ratio, "time_per_record_ratio": lin,
               "cpu_time_per_record_ratio": lin_cpu,
               "decision_per_s_min": dec, "targets": targets, "met": met}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
