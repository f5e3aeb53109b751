"""``mdl-jax score-gates RUN_DIR``: the inputs of the practitioners' gates (analysis/gates.py), scored
once per run and kept in ``RUN_DIR/gate_scores.jsonl`` beside records.jsonl.

One line per scored unit, keyed by (dataset, qid, seed, system) like the records:
  system "B1" / "calibration"  the recorded answer TEACHER-FORCED after the no-memory (B1) prompt
      (``backend.token_logprobs``; no new generation): ``mean_logprob``, ``min_prob`` (min token
      probability), ``max_entropy`` (nats), ``perplexity`` (exp of minus the mean log-prob), ``n_tokens``,
      the per-token ``logprobs`` / ``entropy`` and the scoring ``seconds`` per answer (batch time shared
      out). The calibration records hold B2 answers (the run's calibration generates with memory), so
      their uncertainty is that of the model about that answer WITHOUT memory: the only no-memory
      uncertainty the calibration split offers without new generation (documented in the report).
  system "question" (seed -1)  per question: ``best_cosine`` (the largest cosine between the question and
      a memory of its store, MiniLM as in the pipeline; M is this number clipped at 0) and the
      self-evaluation ``selfeval_yes`` / ``selfeval_no`` (log-likelihood of "Yes" / "No" to "do you need
      external information to answer this question?", by label likelihood as CRAG's grades are), with
      its ``seconds``.

Durable and resumable: lines are appended and flushed per batch; a rerun scores only what is missing
(a torn last line is skipped).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np

SCORES_FILE = "gate_scores.jsonl"
SELF_EVAL = ("Question: {q}\n\nCan you answer this question correctly from your own knowledge, or do "
             "you need external information (documents, memories) to answer it? Do you need external "
             "information? Reply with exactly one word: Yes or No.")
SELF_EVAL_OPTIONS = ("Yes", "No")


def key(r: dict) -> tuple:
    return (r["dataset"], r["qid"], r["seed"], r["system"])


def load_scores(path) -> dict[tuple, dict]:
    """{(dataset, qid, seed, system): line} of a gate_scores.jsonl; {} when the file is absent.
    Torn or foreign lines are skipped (a killed scorer leaves at most one)."""
    p = Path(path)
    out: dict[tuple, dict] = {}
    if not p.is_file():
        return out
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
                out[key(r)] = r
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return out


def summarise(logprobs, entropy) -> dict:
    """The uncertainty features of one answer from its per-token log-probs (T,) and entropies (T,)."""
    lp = np.asarray(logprobs, np.float64)
    ent = np.asarray(entropy, np.float64)
    if lp.size == 0:
        return {"n_tokens": 0, "mean_logprob": None, "min_prob": None, "max_entropy": None,
                "perplexity": None}
    mean = float(lp.mean())
    return {"n_tokens": int(lp.size), "mean_logprob": mean, "min_prob": float(np.exp(lp.min())),
            "max_entropy": float(np.nanmax(ent)) if np.isfinite(ent).any() else None,
            "perplexity": float(math.exp(-mean))}


class _Appender:
    """The gate scores file, appended to and fsynced row batch by row batch (opened without following
    a symbolic link, a regular file only: ``mdl_jax._io.open_append``)."""

    def __init__(self, path: Path):
        from mdl_jax._io import open_append
        from mdl_repro.pipeline.records import end_torn_line

        self.path = path
        end_torn_line(path)  # a killed run's fragment would swallow the first row written now
        self.f = open_append(path, "ab")

    def write(self, rows) -> None:
        from mdl_jax._io import OutputError

        self.f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
        self.f.flush()
        try:
            os.fsync(self.f.fileno())
        except OSError as e:
            raise OutputError(self.path, e) from None

    def close(self) -> None:
        self.f.close()


def _questions(run_dir: Path, data_dir, datasets, store_seed: int):
    """{(dataset, qid): Store} of every question of the run, rebuilt as the pipeline built them."""
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.stores import StoreConfig, build_stores

    out = {}
    for ds in datasets:
        for s in build_stores(load(ds, data_dir), StoreConfig(seed=store_seed)):
            out[(ds, s.item.qid)] = s
    return out


def score_run(run_dir, *, backend=None, embedder=None, data_dir=None, cache_dir=None,
              batch_size: int = 32, progress: bool = True, limit: int | None = None) -> dict:
    """Score what the gates need for every B1 and calibration record and every question of a run;
    append to ``run_dir/gate_scores.jsonl``. Returns counts {"answers", "questions", "seconds"}.

    ``limit``: score at most this many new answers (a quick check); None for all. ``backend`` None:
    the bundled SmolLM2, for a run of that model only (another model's run is a ``RecordsError``).
    """
    from mdl_repro.pipeline.records import load_records

    run_dir = Path(run_dir)
    recs_path = run_dir / "records.jsonl"
    ev, cal = load_records(recs_path)
    return _score_run(run_dir, recs_path, ev, cal, backend=backend, embedder=embedder, data_dir=data_dir,
                      cache_dir=cache_dir, batch_size=batch_size, progress=progress, limit=limit)


def _lock(run_dir: Path):
    """The run folder's lock (``.lock``, the one ``reproduce`` holds while it writes the folder), taken
    or refused with a ``RecordsError`` naming the holder: two scorers would append the same rows."""
    from mdl_repro.pipeline.records import RecordsError, hold_run_lock

    f, holder = hold_run_lock(run_dir)
    if f is None:
        raise RecordsError(f"run_dir: {run_dir} is in use by another run ({holder}); "
                           "wait for it to finish or stop it")
    return f


def _score_run(run_dir: Path, recs_path: Path, ev, cal, *, backend, embedder, data_dir, cache_dir,
               batch_size: int, progress: bool, limit: int | None) -> dict:
    from tqdm.auto import tqdm

    from mdl_repro.pipeline.records import RecordsError, read_run_json
    from mdl_repro.pipeline.systems import chat

    whole = read_run_json(run_dir / "run.json")
    run: dict = whole.get("config") or {}
    model = whole.get("model")
    store_seed = int(run.get("store_seed", 0) or 0)
    data_dir = data_dir or run.get("data_dir")
    path = run_dir / SCORES_FILE
    done = load_scores(path)
    answers = [r for df in (ev[ev["system"] == "B1"], cal) for r in df.to_dict("records")
               if r["ok"] and isinstance(r.get("answer"), str)]
    todo = [r for r in answers if key(r) not in done]
    if limit is not None:
        todo = todo[:limit]
    qkeys = sorted({(r["dataset"], r["qid"]) for df in (ev, cal) for r in df.to_dict("records")},
                   key=lambda k: (k[0], int(k[1])))
    qtodo = [k for k in qkeys if (k[0], k[1], -1, "question") not in done]
    if not todo and not qtodo:
        return {"answers": 0, "questions": 0, "seconds": 0.0}
    from mdl_repro.pipeline.data import DATASETS

    unknown = sorted({k[0] for k in qkeys} - set(DATASETS))
    if unknown:  # the questions and their memories are rebuilt from the data sets: only the paper's
        raise RecordsError(f"{recs_path}: dataset {unknown[0]!r} is not one of the run's data sets "
                           f"(expected {', '.join(DATASETS)}); the gate scores need its questions")
    stores = _questions(run_dir, data_dir, sorted({k[0] for k in qkeys}), store_seed)
    missing = [k for k in qkeys if k not in stores]
    if missing:
        raise RecordsError(f"{recs_path}: question {missing[0]} is not in the dataset files (data_dir "
                           f"{data_dir!r}); the gate scores need the run's questions")
    if backend is None:
        from mdl_repro.pipeline.generation import LocalBackend
        from mdl_repro.pipeline.generation.base import BUNDLED_ID

        if isinstance(model, str) and not model.startswith(BUNDLED_ID):
            # the gates score the answering model's own log-probabilities: another model's would be
            # a different gate, and nothing in a row says which model scored it
            raise RecordsError(f"{run_dir / 'run.json'}: the run's answers are from {model}; score-gates "
                               "scores with the bundled SmolLM2 only (from Python: score_run(run_dir, "
                               "backend=...) with the run's model)")
        backend = LocalBackend(batch_size=batch_size)
    # one writer of the run folder at a time, from here to the end; what another scorer wrote before
    # the lock was taken is read again and not redone
    lock = _lock(run_dir)
    done = load_scores(path)
    todo = [r for r in todo if key(r) not in done]
    qtodo = [k for k in qtodo if (k[0], k[1], -1, "question") not in done]
    t_all = time.perf_counter()
    try:
        out = _Appender(path)
    except BaseException:
        lock.close()
        raise
    try:
        if qtodo:
            if embedder is None:
                from mdl_jax.signals.embeddings import Embedder

                embedder = Embedder(cache_dir=cache_dir)
            st = [stores[k] for k in qtodo]
            q_emb = embedder.embed([s.item.question for s in st], desc="embedding questions")
            texts = sorted({t for s in st for t in s.texts})
            t_emb = dict(zip(texts, embedder.embed(texts, desc="embedding memories")))
            bar = tqdm(total=len(qtodo), desc="self-evaluation", unit="q", disable=not progress)
            for i in range(0, len(qtodo), batch_size):
                idx = list(range(i, min(i + batch_size, len(qtodo))))
                prompts = [[{"role": "user", "content": SELF_EVAL.format(q=st[j].item.question)}]
                           for j in idx]
                t0 = time.perf_counter()
                sc = backend.score(prompts, list(SELF_EVAL_OPTIONS))
                dt = (time.perf_counter() - t0) / len(idx)
                rows = []
                for j, s in zip(idx, sc):
                    ds, qid = qtodo[j]
                    mem = np.stack([t_emb[t] for t in st[j].texts])
                    cos = mem @ q_emb[j] / (np.linalg.norm(mem, axis=1) * np.linalg.norm(q_emb[j]) + 1e-12)
                    ok = s is not None and not isinstance(s, str)
                    rows.append({"dataset": ds, "qid": qid, "seed": -1, "system": "question",
                                 "best_cosine": float(cos.max()),
                                 "selfeval_yes": float(s[0]) if ok else None,
                                 "selfeval_no": float(s[1]) if ok else None, "seconds": round(dt, 5)})
                out.write(rows)
                bar.update(len(rows))
            bar.close()
        bar = tqdm(total=len(todo), desc="teacher-forced B1 scoring", unit="answer", disable=not progress)
        for i in range(0, len(todo), batch_size):
            chunk = todo[i:i + batch_size]
            prompts = [chat(stores[(r["dataset"], r["qid"])].item.question) for r in chunk]
            t0 = time.perf_counter()
            res = backend.token_logprobs(prompts, [r["answer"] for r in chunk])
            dt = (time.perf_counter() - t0) / len(chunk)
            rows = []
            for r, x in zip(chunk, res):
                row = {"dataset": r["dataset"], "qid": r["qid"], "seed": r["seed"], "system": r["system"],
                       "prompt": "B1 (no memory)", "failed": bool(x.get("failed", False)),
                       "error": x.get("error", "")}
                if not row["failed"]:
                    row.update(summarise(x["logprobs"], x["entropy"]))
                    row["logprobs"] = [round(v, 5) for v in x["logprobs"]]
                    row["entropy"] = [round(v, 5) if math.isfinite(v) else None for v in x["entropy"]]
                row["seconds"] = round(dt, 5)
                rows.append(row)
            out.write(rows)
            bar.update(len(rows))
        bar.close()
    finally:
        out.close()
        lock.close()
    return {"answers": len(todo), "questions": len(qtodo), "seconds": time.perf_counter() - t_all,
            "model": getattr(backend, "model_id", "")}


