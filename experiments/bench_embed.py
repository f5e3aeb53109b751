"""The embedding backends on the CPU: torch (sentence-transformers) against ONNX Runtime fp32 and int8
and OpenVINO bfloat16 (skipped, with the reason, where its extra is missing or the CPU has no bfloat16),
on the bundled MiniLM, in one run, interleaved (round r runs every backend once, so a change of the
machine's load hits them alike); figures are medians over the rounds and ratios to torch of the same
round.

    python -m experiments.bench_embed             # 5 rounds, 300 questions per dataset for parity
    python -m experiments.bench_embed --quick     # 2 rounds, 60 questions

Measured per backend:
  texts/s at batch 1, 7 and 64   the encoder alone (``Embedder.model.encode``) on TruthfulQA questions and
                                 reference answers (the texts a gate embeds)
  gate rows/s, uncached          ``MemoryGate.columns`` on (question, store memories) rows of the bundled
                                 data with an empty embedding cache: embedding + signals + decision
  parity                         cosine of each text's vector with torch's (min, mean) over the bundled
                                 texts; share of gate actions equal to torch's on TruthfulQA + HaluEval
                                 rows (target ≥ 99.5 %, cosine ≥ 0.999)
Issue 25's targets are printed beside the figures: uncached gate rows/s ≥ 2.5× today's (torch) here, and
the parity above. The CPU's model name and ISA flags (AVX2 / AVX-512 / AMX / BF16) are printed first:
name them beside any figure you quote. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from mdl_jax.signals.onnx_encoder import BACKENDS  # every backend the Embedder offers

ROOT = Path(__file__).resolve().parents[1]


def cpu_flags() -> dict:
    """The CPU's model name and the ISA flags that decide these timings (Linux /proc/cpuinfo)."""
    name, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "unknown":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    keep = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
    return {"model": name, "cores": os.cpu_count(), "flags": [f for f in keep if f in flags]}


def _rows(n_questions: int):
    from mdl_jax.pipeline.data import load
    from mdl_jax.pipeline.stores import StoreConfig, build_stores

    data = ROOT.parent / "shared" / "data"
    rows = []
    for ds in ("truthfulqa", "halueval"):
        stores = build_stores(load(ds, data, limit=n_questions), StoreConfig(seed=0))
        rows += [(s.item.question, s.texts) for s in stores]
    return rows


def _texts(rows) -> list[str]:
    """The rows' distinct texts (questions first, then the memories), in first-seen order."""
    return list(dict.fromkeys([q for q, _ in rows] + [t for _, ts in rows for t in ts]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds, 60 questions per dataset")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--questions", type=int, default=None, help="questions per dataset (parity, gate rows)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    nq = args.questions or (60 if args.quick else 300)

    from mdl_jax.gate.core import MemoryGate
    from mdl_jax.signals.embeddings import Embedder, ModelLoadError

    cpu = cpu_flags()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = _rows(nq)
    texts = _texts(rows)
    speed_texts = texts[:448]
    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    try:
        encoders = {}
        for b in BACKENDS:  # load / export once, outside the timings
            e = Embedder(cache_dir=work / "warm", backend=b)
            try:
                e.model.encode(speed_texts[:8])
            except (ImportError, ModelLoadError) as err:  # its extra not installed, or not for this CPU
                print(f"{b}: skipped ({' '.join(str(err).split())[:200]})")
                continue
            encoders[b] = e
        backends = list(encoders)

        speed = {b: {bs: [] for bs in (1, 7, 64)} for b in backends}
        gate_rps = {b: [] for b in backends}
        gate_rows = rows[: min(len(rows), 120)]
        for r in range(rounds):
            for b in backends:
                enc = encoders[b].model
                for bs in (1, 7, 64):
                    sub = speed_texts[:64] if bs == 1 else speed_texts
                    t0 = time.perf_counter()
                    enc.encode(sub, batch_size=bs)
                    speed[b][bs].append(len(sub) / (time.perf_counter() - t0))
                # uncached: a fresh cache folder per round and backend (the model stays loaded)
                gate = MemoryGate(embedder=Embedder(cache_dir=work / f"cold-{b}-{r}", backend=b))
                t0 = time.perf_counter()
                gate.columns([q for q, _ in gate_rows], [m for _, m in gate_rows])
                gate_rps[b].append(len(gate_rows) / (time.perf_counter() - t0))
            print(f"round {r + 1}/{rounds}: gate rows/s " +
                  ", ".join(f"{b} {gate_rps[b][-1]:.1f}" for b in backends), flush=True)

        # parity on every bundled text and every row
        vecs = {b: encoders[b].model.encode(texts, batch_size=64) for b in backends}
        actions = {}
        for b in backends:
            gate = MemoryGate(embedder=encoders[b])
            actions[b] = gate.columns([q for q, _ in rows], [m for _, m in rows])["action"]
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the exported graphs and the runs' embedding caches (~110 MB)

    med = statistics.median
    res: dict = {"cpu": cpu, "rounds": rounds, "n_texts": len(texts), "n_rows": len(rows), "backends": {}}
    base = {bs: med(speed["torch"][bs]) for bs in (1, 7, 64)}
    base_gate = med(gate_rps["torch"])
    print(f"\n{'backend':10s} " + " ".join(f"{'batch ' + str(bs):>16s}" for bs in (1, 7, 64)) +
          f" {'gate rows/s':>16s} {'min cos':>8s} {'actions =':>9s}")
    for b in backends:
        ratio = {bs: statistics.median(np.array(speed[b][bs]) / np.array(speed["torch"][bs])) for bs in (1, 7, 64)}
        gratio = statistics.median(np.array(gate_rps[b]) / np.array(gate_rps["torch"]))
        cos = (vecs[b] * vecs["torch"]).sum(1)
        same = float(np.mean(actions[b] == actions["torch"]))
        res["backends"][b] = {"texts_per_s": {bs: med(speed[b][bs]) for bs in (1, 7, 64)},
                              "ratio_to_torch": ratio, "gate_rows_per_s": med(gate_rps[b]),
                              "gate_ratio_to_torch": gratio, "min_cos": float(cos.min()),
                              "mean_cos": float(cos.mean()), "actions_equal": same}
        print(f"{b:10s} " + " ".join(f"{med(speed[b][bs]):7.0f} ({ratio[bs]:4.2f}x)" for bs in (1, 7, 64)) +
              f" {med(gate_rps[b]):7.1f} ({gratio:4.2f}x) {cos.min():8.5f} {100 * same:8.2f}%")
    print("\nTargets (issue 25 §3):")
    for b in backends[1:]:
        r = res["backends"][b]
        print(f"  {b}: uncached gate rows/s ≥ 2.5x torch's: {r['gate_ratio_to_torch']:.2f}x "
              f"({'met' if r['gate_ratio_to_torch'] >= 2.5 else 'NOT met'}); cosine ≥ 0.999: "
              f"{r['min_cos']:.5f} ({'met' if r['min_cos'] >= 0.999 else 'NOT met'}); actions equal ≥ 99.5%: "
              f"{100 * r['actions_equal']:.2f}% ({'met' if r['actions_equal'] >= 0.995 else 'NOT met'})")
    print(f"  (torch here: {base_gate:.1f} gate rows/s uncached, {base[64]:.0f} texts/s at batch 64)")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
