"""The run's generation cache: every answer is kept (SQLite in the out dir) under its (model, prompt,
record seed, sampling settings), and ``CachedBackend`` replays it, byte for byte, wherever another
system, or a rerun, sends the same prompt for the same record. This removes the one residue paired
sampling leaves (bf16 rounding of a row's logits under different batch shapes) where it matters."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from mdl_repro.pipeline.generation.base import TEMPERATURE, TOP_P, Chat, Generation
from mdl_repro.pipeline.generation.sampling import seed_list


class GenerationCache:
    """Durable generation cache of one run (SQLite in the out dir).

    Key: sha256 of (model id, prompt, record seed, max_new_tokens, temperature, top_p, and the engine
    where it is not torch: ``engine="ctranslate2"``'s answers are never replayed as torch's); the record
    seed is a function of (dataset, qid, run seed), so the key is one per (prompt, record, sampling
    settings). Wherever two systems send the same prompt for the same record (B3 Active = B2, B3
    Silent = B1, Self-RAG's draft = B2, ...) the second gets the first's answer, exactly, and nothing
    is generated twice. Rows are committed per call, so a killed run keeps what it generated.
    """

    def __init__(self, path: str | Path):
        from mdl_jax._io import database_path

        self.path = database_path(path)  # its folder made; a symlink planted at the name refused
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS gen (key TEXT PRIMARY KEY, text TEXT NOT NULL, "
                         "n_tokens INTEGER NOT NULL, seconds REAL NOT NULL, created REAL NOT NULL)")
        self._db.commit()

    @staticmethod
    def key(model_id: str, prompt, seed: int, max_new_tokens: int, temperature: float,
            top_p: float, engine: str = "torch") -> str:
        parts = [model_id, prompt, int(seed), int(max_new_tokens), float(temperature), float(top_p)]
        if engine and engine != "torch":  # torch keys stay what they were: existing caches still replay
            parts.append({"engine": engine})
        blob = json.dumps(parts, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, keys: Sequence[str]) -> dict[str, tuple[str, int]]:
        out = {}
        for k in set(keys):
            row = self._db.execute("SELECT text, n_tokens FROM gen WHERE key = ?", (k,)).fetchone()
            if row is not None:
                out[k] = (row[0], int(row[1]))
        return out

    def put(self, rows: Sequence[tuple[str, str, int, float]]) -> None:
        if rows:
            self._db.executemany("INSERT OR IGNORE INTO gen VALUES (?, ?, ?, ?, ?)",
                                 [(k, t, n, sec, time.time()) for k, t, n, sec in rows])
            self._db.commit()

    def totals(self) -> tuple[int, float]:
        """(tokens, generation seconds) of everything generated into this cache, over all runs."""
        n, sec = self._db.execute("SELECT COALESCE(SUM(n_tokens), 0), COALESCE(SUM(seconds), 0) "
                                  "FROM gen").fetchone()
        return int(n), float(sec)

    def close(self) -> None:
        self._db.close()


class CachedBackend:
    """A backend behind a ``GenerationCache``: same ``generate`` / ``score`` interface; hits come back
    with ``cached=True``, misses are generated together in one call (deduplicated) and stored."""

    def __init__(self, backend, cache: GenerationCache):
        self.backend = backend
        self.cache = cache
        self.hits = self.misses = 0

    def __getattr__(self, name):  # model_id, tokens_generated, seconds, score, calls, ...
        return getattr(self.backend, name)

    def generate(self, prompts: Sequence[Chat], *, seed, max_new_tokens: int | None = None,
                 temperature: float = TEMPERATURE, top_p: float = TOP_P) -> list[Generation]:
        mnt = max_new_tokens or self.backend.max_new_tokens
        seeds = seed_list(seed, len(prompts))
        engine = getattr(self.backend, "engine", "torch")
        engine = engine if isinstance(engine, str) else "torch"
        keys = [GenerationCache.key(self.backend.model_id, p, s, mnt, temperature, top_p, engine)
                for p, s in zip(prompts, seeds)]
        have = self.cache.get(keys)
        todo: dict[str, int] = {}  # key → first index that needs it
        for i, k in enumerate(keys):
            if k not in have and k not in todo:
                todo[k] = i
        fresh: dict[str, Generation] = {}
        if todo:
            idx = list(todo.values())
            t0 = self.backend.seconds
            gens = self.backend.generate([prompts[i] for i in idx], seed=[seeds[i] for i in idx],
                                         max_new_tokens=mnt, temperature=temperature, top_p=top_p)
            per = (self.backend.seconds - t0) / len(idx)
            fresh = dict(zip(todo, gens))
            self.cache.put([(k, g.text, g.n_tokens, per) for k, g in fresh.items()
                            if not g.failed and g.text is not None])
        out, seen = [], set()
        for k in keys:
            if k in have:
                self.hits += 1
                out.append(Generation(have[k][0], have[k][1], cached=True))
            else:
                # A prompt repeated within one call is generated once; its repeats are replays.
                self.misses += k not in seen
                out.append(dataclasses.replace(fresh[k], cached=k in seen))
                seen.add(k)
        return out
