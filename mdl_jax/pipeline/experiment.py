"""The end-to-end hallucination experiment (paper Section 5.2, RQ1): ``mdl-jax reproduce``.

Per dataset: load → memory stores → signals (M, R, A) → calibration on a disjoint split (B2 answers on
the calibration questions give the oracle labels: a hallucination under injected memory means
'reject', a safe answer 'adopt'; then n_min/n_max and θ as in Section 3.4) → every system on the
evaluated questions for every seed → judged records → metrics, tables, figures, REPORT.md.

Work is done in chunks of ``chunk_size`` questions per (dataset, seed, system). A chunk's generation
seed depends only on (run seed, dataset, system, chunk index), and its records are written together
(fsync), so a killed run resumes by redoing only missing chunks and ends with exactly the records an
uninterrupted run would have produced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from mdl_jax.pipeline import records as rec_io
from mdl_jax.pipeline import systems as sysm

CALIBRATION = "calibration"


@dataclasses.dataclass
class RunConfig:
    out: Path
    datasets: tuple = ("truthfulqa", "halueval")
    n_questions: int = 20
    seeds: tuple = (0,)
    systems: tuple = ("B1", "B2", "B3", "CRAG", "SelfRAG")
    baseline_datasets: tuple = ("truthfulqa",)  # where CRAG / Self-RAG run (paper Table 5)
    baseline_seeds: int = 2                      # ... and on how many of the seeds
    n_calibration: int = 80
    chunk_size: int = 32
    data_dir: str | None = None
    embed_model: str = "all-MiniLM-L6-v2"
    cache_dir: str | None = None
    store_seed: int = 0
    progress: bool = True


def _gen_seed(*parts) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def _prompt_hash(prompts) -> str:
    return hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()[:16]


def select_questions(items, n_questions: int, n_calibration: int, seed: int = 0):
    """(calibration items, evaluated items): disjoint; the evaluated ones a seeded sample."""
    from mdl_jax.pipeline.stores import split_calibration

    n_cal = min(n_calibration, len(items) // 2)
    cal, ev = split_calibration(items, n_cal, seed)
    if n_questions < len(ev):
        ev = sorted(random.Random(f"eval:{seed}").sample(ev, n_questions), key=lambda it: it.qid)
    return cal, ev


class Experiment:
    def __init__(self, cfg: RunConfig, backend, embedder):
        self.cfg = cfg
        self.backend = backend
        self.embedder = embedder
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.records_path = self.out / "records.jsonl"
        self.writer = rec_io.RecordWriter(self.records_path)
        self.done = rec_io.load(self.records_path)

    # -- one chunk -------------------------------------------------------------------------------
    def _run_chunk(self, ds, seed, system, k, stores, sig, dec):
        gseed = _gen_seed(seed, ds, system, k)
        qs = [s.item.question for s in stores]
        t0 = time.perf_counter()
        if system in ("B1", "B2", CALIBRATION):
            res = sysm.run_plain(self.backend, qs, stores, inject=system != "B1", seed=gseed)
        elif system == "B3":
            res = sysm.run_mdl(self.backend, qs, stores, [d["action_code"] for d in dec], seed=gseed)
        elif system == "CRAG":
            res = sysm.run_crag(self.backend, qs, stores, seed=gseed)
        elif system == "SelfRAG":
            res = sysm.run_selfrag(self.backend, qs, stores, seed=gseed)
        else:
            raise ValueError(f"systems: unknown system {system!r}")
        dt = (time.perf_counter() - t0) / max(len(stores), 1)
        from mdl_jax.pipeline.judgement import judge_many

        judg = judge_many([r["answer"] if not r["failed"] else None for r in res],
                          [s.item.correct for s in stores], [s.item.incorrect for s in stores],
                          self.embedder)
        out = []
        for s, sg, d, r, j in zip(stores, sig, dec, res, judg):
            out.append({
                "dataset": ds, "qid": s.item.qid, "seed": seed, "system": system,
                "category": s.item.category, "M": sg["M"], "R": sg["R"], "A": sg["A"], "phi": sg["phi"],
                "action": d["action"] if system == "B3" else None,
                "C": d["C"], "alpha": d["alpha"], "C_final": d["C_final"],
                "prompt_hash": _prompt_hash(r["prompts"]), "answer": r["answer"],
                "hallucinated": None if j is None else j.hallucinated,
                "refusal": None if j is None else j.refusal,
                "sim_correct": None if j is None else round(j.sim_correct, 6),
                "sim_incorrect": None if j is None else round(j.sim_incorrect, 6),
                "failed": bool(r["failed"]), "error": r["error"], "llm_calls": r["llm_calls"],
                "tokens": r["tokens"], "latency_s": round(dt, 4), "model": self.backend.model_id,
                "extra": r["extra"],
            })
        return out

    def _pending_chunks(self, ds, seed, system, stores):
        size = self.cfg.chunk_size
        for k in range(0, len(stores), size):
            chunk = stores[k:k + size]
            keys = [(ds, s.item.qid, seed, system) for s in chunk]
            missing = [kk for kk in keys if kk not in self.done or self.done[kk].get("failed")]
            if missing:
                yield k // size, k, chunk, set(missing)

    def _run_unit(self, ds, seed, system, stores, sig, dec, bar):
        for k, start, chunk, missing in list(self._pending_chunks(ds, seed, system, stores)):
            recs = self._run_chunk(ds, seed, system, k, chunk, sig[start:start + len(chunk)],
                                   dec[start:start + len(chunk)])
            new = [r for r in recs if rec_io.key(r) in missing]
            self.writer.append(new)
            for r in new:
                if rec_io.key(r) not in self.done or not r["failed"]:
                    self.done[rec_io.key(r)] = r
            if bar is not None:
                bar.update(len(chunk))

    # -- the whole run ---------------------------------------------------------------------------
    def run(self):
        import mdl_jax
        from tqdm.auto import tqdm

        from mdl_jax.pipeline.data import load
        from mdl_jax.pipeline.signals import compute_signals
        from mdl_jax.pipeline.stores import StoreConfig, build_stores

        cfg = self.cfg
        plan, total = [], 0
        for ds in cfg.datasets:
            items = load(ds, cfg.data_dir)
            stores_all = build_stores(items, StoreConfig(seed=cfg.store_seed))
            cal, ev = select_questions(items, cfg.n_questions, cfg.n_calibration, cfg.store_seed)
            by_qid = {s.item.qid: s for s in stores_all}
            cal_st = [by_qid[i.qid] for i in cal]
            ev_st = [by_qid[i.qid] for i in ev]
            units = []
            for si, seed in enumerate(cfg.seeds):
                for system in cfg.systems:
                    if system in ("CRAG", "SelfRAG") and (ds not in cfg.baseline_datasets
                                                          or si >= cfg.baseline_seeds):
                        continue
                    units.append((seed, system))
            plan.append((ds, cal_st, ev_st, units))
            total += len(cal_st) + len(ev_st) * len(units)
        bar = tqdm(total=total, desc="reproduce", unit="q", disable=not cfg.progress, smoothing=0.05)
        bar.update(min(len(self.done), total))  # resumed records count as done for the ETA
        summary = {"datasets": {}}
        for ds, cal_st, ev_st, units in plan:
            sig_cal = compute_signals(cal_st, self.embedder).to_dict("records")
            sig_ev = compute_signals(ev_st, self.embedder).to_dict("records")
            none = [dict(action=None, action_code=None, C=None, alpha=None, C_final=None)] * len(cal_st)
            # 1. calibration: B2 on the calibration questions gives the oracle labels
            self._run_unit(ds, 0, CALIBRATION, cal_st, sig_cal, none, bar)
            cal_recs = [self.done[(ds, s.item.qid, 0, CALIBRATION)] for s in cal_st]
            ok = [r for r in cal_recs if not r["failed"]]
            M, R, A = (np.array([r[c] for r in ok], np.float32) for c in ("M", "R", "A"))
            adopt = np.array([0 if r["hallucinated"] else 1 for r in ok], np.int32)
            calib = mdl_jax.calibrate(M, R, A, adopt) if len(ok) >= 2 else None
            mcfg = calib.config if calib else mdl_jax.MDLConfig()
            # 2. decisions for the evaluated questions (one batched call)
            Me, Re, Ae = (np.array([s[c] for s in sig_ev], np.float32) for c in ("M", "R", "A"))
            d = mdl_jax.decide(Me, Re, Ae, mcfg)
            dec = [dict(action=mdl_jax.Action(int(a)).name, action_code=int(a), C=round(float(c), 6),
                        alpha=round(float(al), 6), C_final=round(float(cf), 6))
                   for a, c, al, cf in zip(d.action, d.C, d.alpha, d.C_final)]
            # 3. every system, every seed
            for seed, system in units:
                self._run_unit(ds, seed, system, ev_st, sig_ev, dec, bar)
            summary["datasets"][ds] = {
                "n_calibration": len(cal_st), "n_evaluated": len(ev_st),
                "calibration_adopt_rate": float(adopt.mean()) if len(ok) else None,
                "calibration_agreement": calib.best_agreement if calib else None,
                "thresholds": [float(t) for t in mcfg.thresholds],
                "n_min": float(mcfg.n_min), "n_max": float(mcfg.n_max),
                "eval_qids": [s.item.qid for s in ev_st],
            }
        bar.close()
        summary["tokens_generated"] = self.backend.tokens_generated
        summary["generation_seconds"] = self.backend.seconds
        summary["tokens_per_s"] = (self.backend.tokens_generated / self.backend.seconds
                                   if self.backend.seconds else None)
        summary["model"] = self.backend.model_id
        summary["config"] = {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
                             for k, v in dataclasses.asdict(cfg).items()}
        (self.out / "run.json").write_text(json.dumps(summary, indent=2))
        return summary


def register(sub, common) -> None:
    p = sub.add_parser("reproduce", help="run the end-to-end hallucination experiment and write a report")
    common(p)
    p.add_argument("--out", default="out/reproduce")
    p.add_argument("--n-questions", type=int, default=20, help="evaluated questions per dataset")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--systems", nargs="+", default=list(sysm.SYSTEMS), choices=list(sysm.SYSTEMS))
    p.add_argument("--baseline-datasets", nargs="+", default=["truthfulqa"],
                   help="datasets on which CRAG and Self-RAG run (paper: TruthfulQA)")
    p.add_argument("--baseline-seeds", type=int, default=2, help="CRAG/Self-RAG run on this many seeds")
    p.add_argument("--n-calibration", type=int, default=80)
    p.add_argument("--chunk-size", type=int, default=32, help="questions per resumable chunk")
    p.add_argument("--backend", choices=["local", "openai"], default="local")
    p.add_argument("--llm", default=None, help="local: HF id or path (default: bundled SmolLM2); "
                                                "openai: the served model name")
    p.add_argument("--batch-size", type=int, default=32, help="local backend generation batch")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="local backend weights/activations: auto (bf16 where "
                                                   "the hardware has it, else float32), float32, bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=150, help="answer length cap (paper: 150)")
    p.set_defaults(func=reproduce_cmd)


def reproduce_cmd(args) -> int:
    from mdl_jax.analysis.report import write_report
    from mdl_jax.pipeline.embeddings import Embedder
    from mdl_jax.pipeline.generation import make_backend

    cfg = RunConfig(out=Path(args.out), datasets=tuple(args.datasets), n_questions=args.n_questions,
                    seeds=tuple(args.seeds), systems=tuple(args.systems),
                    baseline_datasets=tuple(args.baseline_datasets), baseline_seeds=args.baseline_seeds,
                    n_calibration=args.n_calibration, chunk_size=args.chunk_size,
                    data_dir=args.data_dir, embed_model=args.model, cache_dir=args.cache_dir,
                    store_seed=args.seed)
    local = dict(batch_size=args.batch_size, device=args.device, dtype=args.dtype)
    backend = make_backend(args.backend, args.llm, max_new_tokens=args.max_new_tokens,
                           **(local if args.backend == "local" else {}))
    emb = Embedder(args.model, cache_dir=args.cache_dir)
    t0 = time.perf_counter()
    summary = Experiment(cfg, backend, emb).run()
    summary["wall_seconds"] = time.perf_counter() - t0
    report = write_report(cfg.out, summary)
    print(f"wrote {report}", file=sys.stderr)
    return 0
