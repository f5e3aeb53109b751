"""Durable, resumable records: one JSON line per (dataset, question, seed, system).

Records are appended chunk by chunk (one write, flush, fsync), so a run killed at any moment, even by
SIGKILL, loses at most the chunk in flight. ``load`` skips a torn last line and keeps, per key, the
first successful record (a failed LLM call is retried by the next run, which appends the fix).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

KEY = ("dataset", "qid", "seed", "system")


def key(rec: dict) -> tuple:
    return tuple(rec[k] for k in KEY)


class RecordWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A torn last line from a killed run would glue onto our first record: end it first.
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                with open(self.path, "ab") as f:
                    f.write(b"\n")

    def append(self, records: Iterable[dict]) -> None:
        data = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
        if not data:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def load(path: str | Path) -> dict[tuple, dict]:
    """Key → record; successful records win over failed ones, earlier over later."""
    out: dict[tuple, dict] = {}
    p = Path(path)
    if not p.exists():
        return out
    with open(p, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill mid-write; its chunk is redone
            k = key(rec)
            if k not in out or (out[k].get("failed") and not rec.get("failed")):
                out[k] = rec
    return out
