"""The embedding backends on the CPU: torch (sentence-transformers) against ONNX Runtime fp32 and int8
and OpenVINO bfloat16 (skipped, with the reason, where its extra is missing or the CPU has no bfloat16),
on the bundled MiniLM, in one run, interleaved (round r runs every backend once, so a change of the
machine's load hits them alike); figures are medians over the rounds and ratios to torch of the same
round.

    python -m experiments.bench_embed             # 5 rounds, 300 questions per dataset for parity
    python -m experiments.bench_embed --quick     # 2 rounds, 60 questions
    scripts/hold_avx2.sh python -m experiments.bench_embed --backends onnx onnx-int8   # AVX2 code paths

Measured per backend:
  texts/s at batch 1, 7 and 64   the encoder alone (``Embedder.model.encode``) on the first 448 texts of
                                 the timed gate rows (questions, then their memories)
  gate rows/s, uncached          ``MemoryGate.columns`` on (question, store memories) rows of the bundled
                                 data with an empty embedding cache: embedding + signals + decision; the
                                 first 60 rows of each dataset in every run, timed per dataset and over
                                 both (their texts' lengths differ, and so does a backend's gain)
  parity                         cosine of each text's vector with torch's (min, mean) over the bundled
                                 texts; share of gate actions equal to torch's on TruthfulQA + HaluEval
                                 rows (target ≥ 99.5 %, cosine ≥ 0.999)
The targets are printed beside the figures: uncached gate rows/s ≥ 2.5× today's (torch) here, and
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

from experiments import _machine
from mdl_jax.signals.onnx_encoder import BACKENDS  # every backend the Embedder offers

ROOT = Path(__file__).resolve().parents[1]


def cpu_flags() -> dict:
    """The CPU's model name and the ISA flags that decide these timings (``experiments._machine``: under
    ``scripts/hold_avx2.sh`` the name says the figures are the AVX2 proxy's)."""
    keep = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
    return {"model": _machine.cpu_model(), "cores": os.cpu_count(), "flags": _machine.cpu_flags(keep)}


DATASETS = ("truthfulqa", "halueval")
GATE_ROWS = 60  # timed gate rows per dataset, the same in --quick and full runs


def rows_by_dataset(n_questions: int) -> dict[str, list]:
    """(question, store memories) rows of each bundled dataset, its first ``n_questions``."""
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.stores import StoreConfig, build_stores

    data = ROOT.parent / "shared" / "data"
    return {ds: [(s.item.question, s.texts) for s in build_stores(load(ds, data, limit=n_questions), StoreConfig(seed=0))]
            for ds in DATASETS}


def bundled_rows(n_questions: int):
    """Every dataset's rows, TruthfulQA's first."""
    return [r for rows in rows_by_dataset(n_questions).values() for r in rows]


def gate_rows() -> dict[str, list]:
    """The rows the uncached gate is timed on: the first ``GATE_ROWS`` questions of each dataset with the
    stores built from those questions alone. Their own load, whatever ``--questions`` is: a store's
    distractors are drawn from the questions loaded with it, so the first 60 rows of a 300-question load
    are other rows. The two datasets' texts differ in length (TruthfulQA's 12.9 tokens on average,
    HaluEval's knowledge passages far longer), and a backend's gain with them, so a run times both (until
    a full run timed TruthfulQA's rows alone, ``--quick`` both)."""
    return {ds: rows[:GATE_ROWS] for ds, rows in rows_by_dataset(GATE_ROWS).items()}


def time_gate(make_gate, sets: dict[str, list]) -> dict[str, float]:
    """Rows/s of a fresh gate (``make_gate(ds)``: an empty cache) on each set, and over all of them
    (all the rows over the sum of the times)."""
    out, total_t, total_n = {}, 0.0, 0
    for ds, rows in sets.items():
        gate = make_gate(ds)
        t0 = time.perf_counter()
        gate.columns([q for q, _ in rows], [m for _, m in rows])
        dt = time.perf_counter() - t0
        out[ds] = len(rows) / dt
        total_t, total_n = total_t + dt, total_n + len(rows)
    out["all"] = total_n / total_t
    return out


def distinct_texts(rows) -> list[str]:
    """The rows' distinct texts (questions first, then the memories), in first-seen order."""
    return list(dict.fromkeys([q for q, _ in rows] + [t for _, ts in rows for t in ts]))


def run_args(ap: argparse.ArgumentParser, argv, full_rounds: int) -> tuple[argparse.Namespace, int, int]:
    """Adds ``--quick``, ``--rounds`` and ``--questions`` to ``ap`` and parses ``argv``.

    Returns:
        (args, rounds, questions per dataset): ``--quick`` 2 rounds and 60 questions, else ``full_rounds``
        and 300, each unless given. A value below 1 is ``ap.error`` (one line naming the flag, exit 2).
    """
    ap.add_argument("--quick", action="store_true", help="2 rounds, 60 questions per dataset")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--questions", type=int, default=None, help="questions per dataset (parity, gate rows)")
    args = ap.parse_args(argv)
    # "is None", not "or": a 0 given is an error below, not the default
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else full_rounds)
    nq = args.questions if args.questions is not None else (60 if args.quick else 300)
    for name, v in (("--rounds", rounds), ("--questions", nq)):
        if v < 1:
            ap.error(f"{name}: expected a whole number ≥ 1, got {v}")
    return args, rounds, nq


def run_data(n_questions: int) -> tuple[list, list[str], dict[str, list], list[str]]:
    """(parity rows, their distinct texts, the timed gate rows by dataset, the 448 speed texts: the timed
    rows' first texts) for a run on ``n_questions`` per dataset."""
    rows = bundled_rows(n_questions)
    timed = gate_rows()
    return rows, distinct_texts(rows), timed, distinct_texts([r for rs in timed.values() for r in rs])[:448]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS), metavar="BACKEND",
                    help=f"the backends to time (torch always; default: all of {', '.join(BACKENDS)})")
    args, rounds, nq = run_args(ap, argv, full_rounds=5)
    wanted = ["torch", *(b for b in BACKENDS if b in args.backends and b != "torch")]  # torch: the reference

    from mdl_jax.gate.core import MemoryGate
    from mdl_jax.signals.embeddings import Embedder, ModelLoadError

    cpu = cpu_flags()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows, texts, timed, speed_texts = run_data(nq)
    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    try:
        encoders = {}
        for b in wanted:  # load / export once, outside the timings
            e = Embedder(cache_dir=work / "warm", backend=b)
            try:
                e.model.encode(speed_texts[:8])
            except (ImportError, ModelLoadError) as err:  # its extra not installed, or not for this CPU
                print(f"{b}: skipped ({' '.join(str(err).split())[:200]})")
                continue
            encoders[b] = e
        backends = list(encoders)

        speed: dict[str, dict[int, list[float]]] = {b: {bs: [] for bs in (1, 7, 64)} for b in backends}
        gate_rps: dict[str, list[dict[str, float]]] = {b: [] for b in backends}  # per round: {dataset: rows/s, "all": rows/s}
        for r in range(rounds):
            for b in backends:
                enc = encoders[b].model
                for bs in (1, 7, 64):
                    sub = speed_texts[:64] if bs == 1 else speed_texts
                    t0 = time.perf_counter()
                    enc.encode(sub, batch_size=bs)
                    speed[b][bs].append(len(sub) / (time.perf_counter() - t0))
                # uncached: a fresh cache folder per round, backend and dataset (the model stays loaded)
                gate_rps[b].append(time_gate(lambda ds, b=b, r=r: MemoryGate(embedder=Embedder(
                    cache_dir=work / f"cold-{b}-{r}-{ds}", backend=b)), timed))
            print(f"round {r + 1}/{rounds}: gate rows/s " +
                  ", ".join(f"{b} {gate_rps[b][-1]['all']:.1f}" for b in backends), flush=True)

        # parity on every bundled text and every row
        vecs = {b: encoders[b].model.encode(texts, batch_size=64) for b in backends}
        actions = {}
        for b in backends:
            gate = MemoryGate(embedder=encoders[b])
            actions[b] = gate.columns([q for q, _ in rows], [m for _, m in rows])["action"]
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the exported graphs and the runs' embedding caches (~110 MB)

    med = statistics.median
    res: dict = {"cpu": cpu, "rounds": rounds, "n_texts": len(texts), "n_rows": len(rows),
                 "gate_rows": {ds: len(v) for ds, v in timed.items()}, "backends": {}}
    base = {bs: med(speed["torch"][bs]) for bs in (1, 7, 64)}
    keys = [*timed, "all"]

    def g(b, k):  # the rounds' rows/s of backend b on set k
        return np.array([x[k] for x in gate_rps[b]])

    print(f"\n{'backend':10s} " + " ".join(f"{'batch ' + str(bs):>16s}" for bs in (1, 7, 64)) +
          f" {'gate rows/s':>16s} {'min cos':>8s} {'actions =':>9s}")
    for b in backends:
        ratio = {bs: statistics.median(np.array(speed[b][bs]) / np.array(speed["torch"][bs])) for bs in (1, 7, 64)}
        gratio = {k: float(med(g(b, k) / g("torch", k))) for k in keys}
        cos = (vecs[b] * vecs["torch"]).sum(1)
        same = float(np.mean(actions[b] == actions["torch"]))
        res["backends"][b] = {"texts_per_s": {bs: med(speed[b][bs]) for bs in (1, 7, 64)},
                              "ratio_to_torch": ratio, "gate_rows_per_s": float(med(g(b, "all"))),
                              "gate_ratio_to_torch": gratio["all"],
                              "gate_by_dataset": {k: {"rows_per_s": float(med(g(b, k))), "ratio_to_torch": gratio[k]}
                                                  for k in timed},
                              "min_cos": float(cos.min()), "mean_cos": float(cos.mean()), "actions_equal": same}
        print(f"{b:10s} " + " ".join(f"{med(speed[b][bs]):7.0f} ({ratio[bs]:4.2f}x)" for bs in (1, 7, 64)) +
              f" {med(g(b, 'all')):7.1f} ({gratio['all']:4.2f}x) {cos.min():8.5f} {100 * same:8.2f}%")
    print(f"\ngate rows/s by dataset ({', '.join(f'{len(v)} {ds} rows' for ds, v in timed.items())}; "
          "the table's figure is all of them over the sum of the times):")
    for b in backends:
        print(f"  {b:14s} " + ", ".join(f"{k} {med(g(b, k)):6.1f} ({med(g(b, k) / g('torch', k)):4.2f}x)" for k in timed))
    print("\nTargets:")
    for b in backends[1:]:
        r = res["backends"][b]
        print(f"  {b}: uncached gate rows/s ≥ 2.5x torch's: {r['gate_ratio_to_torch']:.2f}x "
              f"({'met' if r['gate_ratio_to_torch'] >= 2.5 else 'NOT met'}); cosine ≥ 0.999: "
              f"{r['min_cos']:.5f} ({'met' if r['min_cos'] >= 0.999 else 'NOT met'}); actions equal ≥ 99.5%: "
              f"{100 * r['actions_equal']:.2f}% ({'met' if r['actions_equal'] >= 0.995 else 'NOT met'})")
    print(f"  (torch here: {med(g('torch', 'all')):.1f} gate rows/s uncached, {base[64]:.0f} texts/s at batch 64)")
    from mdl_jax.signals.embeddings import auto_backend

    pick = auto_backend(Embedder(cache_dir=work).load_path, None, work)  # what the gate's default runs here
    res["auto"] = pick
    if pick in res["backends"] and pick != "torch":
        r = res["backends"][pick]
        ok = r["gate_ratio_to_torch"] >= 2.5 and r["min_cos"] >= 0.999 and r["actions_equal"] >= 0.995
        print(f"  the gate's default (backend 'auto') here is {pick}: {r['gate_ratio_to_torch']:.2f}x, min cosine "
              f"{r['min_cos']:.5f}, {100 * r['actions_equal']:.2f}% of actions equal: target {'met' if ok else 'NOT met'}")
    else:
        print(f"  the gate's default (backend 'auto') here is {pick}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
