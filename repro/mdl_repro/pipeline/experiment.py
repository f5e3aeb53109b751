"""The end-to-end hallucination experiment (paper Section 5.2, RQ1): ``mdl-jax reproduce``.

Per dataset: load → memory stores → signals (M, R, A) → calibration on a disjoint split (B2 answers on
the calibration questions give the oracle labels: a hallucination under injected memory means
'reject', a safe answer 'adopt'; then n_min/n_max and θ as in Section 3.4) → every system on the
evaluated questions for every seed → judged records → metrics, tables, figures, REPORT.md.

Work is done in chunks of ``chunk_size`` questions per (dataset, seed, system). Sampling is paired:
each question's generation seed is ``record_seed(dataset, qid, run seed)``, the same for every system
and independent of chunking, and every generated answer is kept in the out dir's generation cache
(``generations.sqlite``), so a prompt that another system already sent for the same record gets
that answer back (B3 Active = B2, Silent = B1, Self-RAG's draft = B2). A chunk's records are written
together (fsync), so a killed run resumes by redoing only missing chunks and ends with exactly the
records an uninterrupted run would have produced. One run at a time per out dir (``.lock``, flock).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from mdl_jax._io import write_text
from mdl_jax.controller.config_file import config_to_dict
from mdl_repro.pipeline import ENGINE
from mdl_repro.pipeline import records as rec_io
from mdl_repro.pipeline import systems as sysm
from mdl_repro.pipeline.generation import CachedBackend, GenerationCache, record_seed
from mdl_repro.pipeline.records import OtherInputs, read_run_json

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
    # Where B3's config comes from: "run" calibrates on this run's calibration split (Section 3.4);
    # "shipped" uses the config calibrated for the bundled model (resources/calibrated/); or a path
    # to a config file (mdl_jax.save_config) used for every dataset.
    calibration: str = "run"


class OutDirInUse(RuntimeError):
    """Another process holds the out dir's lock."""


# What the records of an out dir were made from, beyond their keys (dataset, qid, seed, system): a
# resumed run reuses a record only when these are the same (``check_inputs``).
INPUTS = "inputs.json"


def run_inputs(cfg: RunConfig, backend, embedder, data: dict[str, list]) -> dict:
    """The inputs a record depends on: the model and its generation settings, the embedder, the store
    and split seed, the calibration split's size, where B3's config comes from (a file by its content),
    the chunk size (a chunk is one generation batch) and each dataset's questions (by a digest of their
    items)."""
    engine = getattr(backend, "engine", "torch")
    calibration: str | dict = cfg.calibration
    if cfg.calibration not in ("run", "shipped"):   # the config it holds, not its bytes' formatting
        from mdl_jax import load_config

        text = json.dumps(config_to_dict(load_config(cfg.calibration)), sort_keys=True)
        calibration = {"config file": hashlib.sha256(text.encode()).hexdigest()}
    return {
        "model": backend.model_id, "engine": engine if isinstance(engine, str) else "torch",
        "max_new_tokens": int(backend.max_new_tokens), "embedder": getattr(embedder, "model_id", str(embedder)),
        "split_seed": int(cfg.store_seed), "n_calibration": int(cfg.n_calibration), "calibration": calibration,
        # a chunk's questions are generated as one batch, and batching can move an answer's tokens
        "chunk_size": int(cfg.chunk_size),
        "data": {ds: hashlib.sha256(json.dumps([dataclasses.astuple(i) for i in items],
                                               ensure_ascii=False).encode()).hexdigest()
                 for ds, items in data.items()},
    }


def check_inputs(out: Path, now: dict, has_records: bool) -> None:
    """Refuse (``OtherInputs``, naming what changed) to add to an out dir whose records were made from
    other inputs; else record ``now`` (datasets new to the run are added to what it holds).

    Only what both records name is compared (a version that records more still resumes a run of one
    that recorded less). An out dir with records but no record of its inputs (written before they were
    recorded) is taken as it is, once: its inputs are recorded from this run on. One without records
    is a fresh run, whatever it recorded."""
    path = out / INPUTS
    before = read_json(path) if has_records else None
    if has_records and os.path.lexists(path) and not isinstance(before, dict):
        raise OtherInputs(f"reproduce: --out {str(out)!r}: {INPUTS} is not a record of the inputs its records "
                          "were made from, so they cannot be checked; use another --out, or remove this one "
                          "to start over")
    if isinstance(before, dict):
        changed = [k for k in sorted(set(before) & set(now)) if k != "data" and before[k] != now[k]]
        old_data: dict = before["data"] if isinstance(before.get("data"), dict) else {}
        changed += [f"the {ds} data" for ds in sorted(set(old_data) & set(now["data"]))
                    if old_data[ds] != now["data"][ds]]
        if changed:
            said = "; ".join(f"{k} ({before[k]!r} then, {now[k]!r} now)" if k in now else k for k in changed)
            raise OtherInputs(f"reproduce: --out {str(out)!r} holds records made from other inputs: {said} "
                              "changed; use another --out, or remove this one to start over")
        now = {**now, "data": {**old_data, **now["data"]}}
    elif has_records:
        import warnings

        warnings.warn(f"reproduce: {out} has records but no record of the inputs they were made from "
                      f"(written by an earlier version); they are taken as made from this run's, which "
                      f"{INPUTS} records from now on", RuntimeWarning, stacklevel=2)
    write_text(out / INPUTS, json.dumps(now, indent=2, ensure_ascii=False))


# the files a run makes in its out dir
RUN_FILES = (".lock", "generations.sqlite", "generations.sqlite-wal", "generations.sqlite-shm",
             "records.jsonl", "inputs.json")


def lock_out_dir(out: Path):
    """Hold an exclusive flock on ``out/.lock`` for this process's lifetime (returns the open file).

    The kernel drops a flock when its process dies, however it dies, so a killed run never leaves the
    out dir stuck; two live runs can never append to the same records file."""
    from mdl_repro.pipeline.records import hold_run_lock

    # made again where a refused run that made it removed it (holding its lock) as this one locked
    f, holder = hold_run_lock(out, make_folder=lambda: out.mkdir(parents=True, exist_ok=True))
    if f is None:
        raise OutDirInUse(f"out: {out} is in use by another reproduce run ({holder}); "
                          "wait for it to finish or stop it, or choose another --out")
    return f


def _prompt_hash(prompts) -> str:
    return hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()[:16]


def select_questions(items, n_questions: int, n_calibration: int, seed: int = 0):
    """(calibration items, evaluated items): disjoint; the evaluated ones a seeded sample."""
    from mdl_repro.pipeline.stores import split_calibration

    n_cal = min(n_calibration, len(items) // 2)
    cal, ev = split_calibration(items, n_cal, seed)
    if n_questions < len(ev):
        ev = sorted(random.Random(f"eval:{seed}").sample(ev, n_questions), key=lambda it: it.qid)
    return cal, ev


def _generation_cache(path: Path) -> GenerationCache:
    """The run's generation cache at ``path``; a file there that is not one (a file of the user's of
    that name, a damaged one) is an ``OutputError`` naming it, not sqlite3's traceback."""
    import sqlite3

    from mdl_jax._io import OutputError

    try:
        return GenerationCache(path)
    except sqlite3.DatabaseError as e:
        raise OutputError(path, message=f"{path}: not a run's generation cache (sqlite3: {e}); move it "
                                        "away, or choose another --out") from None


class Experiment:
    def __init__(self, cfg: RunConfig, backend, embedder):
        self.cfg = cfg
        self.backend = backend
        self.embedder = embedder
        self.out = Path(cfg.out)
        self._lock = lock_out_dir(self.out)  # before reading anything another run might be writing
        # the run files absent once the lock is held: a refused run removes only those of them it made,
        # never what a run that held the lock before it left
        self.absent_at_lock = {p.name for p in map(self.out.joinpath, RUN_FILES) if not os.path.lexists(p)}
        self.records_path = self.out / "records.jsonl"
        try:
            self.writer = rec_io.RecordWriter(self.records_path)
            self.done = rec_io.load(self.records_path)
            self.cache = _generation_cache(self.out / "generations.sqlite")
        except BaseException:
            self._lock.close()  # refused (a link planted at a run file): the caller may remove the lock
            raise
        self.gen = CachedBackend(backend, self.cache)
        self.n_written = self.n_failed = 0
        self._bar: Any = None  # the run's progress bar, closed by ``close`` too

    def close(self) -> None:
        if self._bar is not None:
            # a run stopped by an error ends its bar's line here, before the command prints its one
            # error line, which would otherwise follow the bar's text on the same line
            self._bar.close()
        self.cache.close()
        self._lock.close()

    # -- one chunk -------------------------------------------------------------------------------
    def _run_chunk(self, ds, seed, system, k, stores, sig, dec):
        gseed = [record_seed(ds, s.item.qid, seed) for s in stores]  # not the system, not the chunk
        qs = [s.item.question for s in stores]
        t0 = time.perf_counter()
        if system in ("B1", "B2", CALIBRATION):
            res = sysm.run_plain(self.gen, qs, stores, inject=system != "B1", seed=gseed)
        elif system == "B3":
            res = sysm.run_mdl(self.gen, qs, stores, [d["action_code"] for d in dec], seed=gseed)
        elif system == "CRAG":
            res = sysm.run_crag(self.gen, qs, stores, seed=gseed)
        elif system == "SelfRAG":
            res = sysm.run_selfrag(self.gen, qs, stores, seed=gseed)
        else:
            raise ValueError(f"systems: unknown system {system!r}")
        dt = (time.perf_counter() - t0) / max(len(stores), 1)
        from mdl_repro.pipeline.judgement import judge_all

        # Both judges: "paper" (Section 5.1's rule) fills the paper-comparable fields; "ref" (the
        # judge of known accuracy, see judgement.py) goes beside it.
        verdicts = judge_all([r["answer"] if not r["failed"] else None for r in res],
                             [s.item for s in stores], self.embedder)
        out = []
        for s, sg, d, r, j, jr in zip(stores, sig, dec, res, verdicts["paper"], verdicts["ref"]):
            out.append({
                "dataset": ds, "qid": s.item.qid, "seed": seed, "system": system,
                "category": s.item.category, "M": sg["M"], "R": sg["R"], "A": sg["A"], "phi": sg["phi"],
                "action": d["action"] if system == "B3" else None,
                "C": d["C"], "alpha": d["alpha"], "C_final": d["C_final"],
                "prompt_hash": _prompt_hash(r["prompts"]), "answer": r["answer"],
                # True: replayed from the generation cache (another system, or an earlier run, sent
                # this prompt for this record); None: no model call (B3 Opt-Out).
                "answer_cached": bool(r.get("cached")) if r["llm_calls"] else None,
                "hallucinated": None if j is None else j.hallucinated,
                "refusal": None if j is None else j.refusal,
                "sim_correct": None if j is None else round(j.sim_correct, 6),
                "sim_incorrect": None if j is None else round(j.sim_incorrect, 6),
                "hallucinated_ref": None if jr is None else jr.hallucinated,
                "judge_ref_rule": None if jr is None else jr.rule,
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
            self.n_written += len(new)
            self.n_failed += sum(bool(r["failed"]) for r in new)
            for r in new:
                if rec_io.key(r) not in self.done or not r["failed"]:
                    self.done[rec_io.key(r)] = r
            if bar is not None:
                bar.update(len(new))  # only this plan's records, each once

    # -- the whole run ---------------------------------------------------------------------------
    def run(self):
        from tqdm.auto import tqdm

        import mdl_jax
        from mdl_repro.pipeline.data import load
        from mdl_repro.pipeline.store_signals import compute_signals
        from mdl_repro.pipeline.stores import StoreConfig, build_stores

        cfg = self.cfg
        plan, keys, data = [], set(), {}
        for ds in cfg.datasets:
            items = data[ds] = load(ds, cfg.data_dir)
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
            if cfg.calibration == "run":
                keys |= {(ds, s.item.qid, 0, CALIBRATION) for s in cal_st}
            keys |= {(ds, s.item.qid, seed, system) for s in ev_st for seed, system in units}
        check_inputs(self.out, run_inputs(cfg, self.backend, self.embedder, data), bool(self.done))
        # The bar counts this plan's records: those already on disk (a resumed run) start it, records
        # of other plans in the same out dir do not, so it ends at exactly total/total.
        done = sum(1 for k in keys if k in self.done and not self.done[k].get("failed"))
        bar = self._bar = tqdm(total=len(keys), initial=done, desc="reproduce", unit="q", disable=not cfg.progress,
                   smoothing=0.05)
        summary = {"datasets": {}}
        for ds, cal_st, ev_st, units in plan:
            sig_cal = compute_signals(cal_st, self.embedder).to_dict("records")
            sig_ev = compute_signals(ev_st, self.embedder).to_dict("records")
            none = [dict(action=None, action_code=None, C=None, alpha=None, C_final=None)] * len(cal_st)
            calib, adopt, ok = None, np.zeros(0), []
            if cfg.calibration == "run":
                # 1. calibration: B2 on the calibration questions gives the oracle labels
                self._run_unit(ds, 0, CALIBRATION, cal_st, sig_cal, none, bar)
                cal_recs = [self.done[(ds, s.item.qid, 0, CALIBRATION)] for s in cal_st]
                ok = [r for r in cal_recs if not r["failed"]]
                M, R, A = (np.array([r[c] for r in ok], np.float32) for c in ("M", "R", "A"))
                adopt = np.array([0 if r["hallucinated"] else 1 for r in ok], np.int32)
                # A run folder calibrated before ties were broken at the middle of the plateau keeps
                # the rule its B3 records were decided with, so a resume never mixes two configs.
                tie_break = prior_tie_break(self.out / "run.json", ds)
                calib = mdl_jax.calibrate(M, R, A, adopt, tie_break=tie_break) if len(ok) >= 2 else None
                mcfg, source = (calib.config, "calibrated on this run's split") if calib else \
                    (mdl_jax.MDLConfig(), "paper defaults (calibration failed)")
            else:
                mcfg, source = config_for(cfg.calibration, ds)
            # 2. decisions for the evaluated questions (one batched call)
            Me, Re, Ae = (np.array([s[c] for s in sig_ev], np.float32) for c in ("M", "R", "A"))
            d = mdl_jax.decide(Me, Re, Ae, mcfg, engine=ENGINE)
            dec = [dict(action=mdl_jax.Action(int(a)).name, action_code=int(a), C=round(float(c), 6),
                        alpha=round(float(al), 6), C_final=round(float(cf), 6))
                   for a, c, al, cf in zip(d.action, d.C, d.alpha, d.C_final)]
            # 3. every system, every seed
            for seed, system in units:
                self._run_unit(ds, seed, system, ev_st, sig_ev, dec, bar)
            summary["datasets"][ds] = {
                "config_source": source,
                "n_calibration": len(cal_st) if cfg.calibration == "run" else 0, "n_evaluated": len(ev_st),
                "calibration_adopt_rate": float(adopt.mean()) if len(ok) else None,
                "calibration_agreement": calib.best_agreement if calib else None,
                "tie_break": calib.tie_break if calib else None,
                "thresholds": [float(t) for t in mcfg.thresholds],
                "n_min": float(mcfg.n_min), "n_max": float(mcfg.n_max),
                # the whole config B3 decided with: the analyses score the records with it
                "mdl_config": config_to_dict(mcfg),
                "eval_qids": [s.item.qid for s in ev_st],
            }
        bar.close()
        # Generation totals over every run into this out dir (the cache holds each generated answer
        # with its tokens and seconds, including a killed run's), so a resumed rerun keeps the first
        # run's throughput instead of reporting only its own remainder.
        tokens, seconds = self.cache.totals()
        prev = read_run_json(self.out / "run.json")
        if prev and "this_run" not in prev:  # written before the cache existed: add its counts
            tokens += int(prev.get("tokens_generated") or 0)
            seconds += float(prev.get("generation_seconds") or 0.0)
        summary["tokens_generated"] = tokens
        summary["generation_seconds"] = seconds
        summary["tokens_per_s"] = tokens / seconds if seconds else None
        summary["this_run"] = {
            "tokens_generated": self.backend.tokens_generated,
            "generation_seconds": self.backend.seconds,
            "scoring_seconds": getattr(self.backend, "score_seconds", 0.0),
            "answers_replayed_from_cache": self.gen.hits, "answers_generated": self.gen.misses,
            "records_written": self.n_written, "records_failed": self.n_failed,
            "backend_calls": getattr(self.backend, "calls", 0),
            "backend_failed_calls": getattr(self.backend, "failed_calls", 0),
        }
        summary["model"] = self.backend.model_id
        summary["config"] = {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
                             for k, v in dataclasses.asdict(cfg).items()}
        # the confirmatory family is fixed before any analysis reads the records; a rerun keeps the
        # declaration it first wrote
        summary["primary"] = (prev or {}).get("primary") or primary_family()
        write_text(self.out / "run.json", json.dumps(summary, indent=2))
        return summary


PRIMARY_FAMILY = ("truthfulqa: B3 - B2", "truthfulqa: B3 - random abstention", "pooled: MDL - per-dataset constant")


def primary_family(date: str | None = None) -> dict:
    """The primary family a new run declares in its run.json before its analyses: the statistics
    (``mdl_repro.analysis.rigour.PRIMARY_STATISTICS`` reads each name), the judges each is read under,
    the family's α (Holm-adjusted within it), and the TOST equivalence bound for a "no difference"
    reading. Every other comparison of the run's report is exploratory.

    Args:
      date: the declaration's date (ISO); None: today (UTC).

    Returns:
      {"family", "judges", "alpha", "adjust", "p", "equivalence_bound", "declared"}.
    """
    import datetime

    day = date or datetime.datetime.now(datetime.UTC).date().isoformat()
    return {"family": list(PRIMARY_FAMILY), "judges": ["paper", "ref"], "alpha": 0.05, "adjust": "holm",
            "p": "cluster t (difference / cluster SE over questions, G - 1 d.f.)", "equivalence_bound": 0.05,
            "declared": day}


SHIPPED = Path(__file__).parent / "resources" / "calibrated"


def config_for(calibration: str, dataset: str):
    """(MDLConfig, where it came from) for a dataset, when the run does not calibrate itself."""
    from mdl_jax import load_config

    if calibration == "shipped":
        path = SHIPPED / f"smollm2-{dataset}.json"
        return load_config(path), f"shipped for the bundled SmolLM2 ({path.name})"
    return load_config(calibration), f"from the file {calibration}"


def prior_tie_break(run_json: Path, dataset: str) -> str:
    """The tie-break rule a run folder's earlier calibration of ``dataset`` used: "lowest" for a run
    written before the rule was recorded (that was the only rule then), else the recorded one; a new
    run gets the default ("middle")."""
    prev = (read_run_json(run_json).get("datasets") or {}).get(dataset)
    if not isinstance(prev, dict) or prev.get("calibration_agreement") is None:
        return "middle"
    return prev.get("tie_break") or "lowest"


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


