"""The signals table of the pipeline's memory stores: M, R, φ from ``mdl_jax.signals`` (the same code
the memory gate runs), A from the datasets' risk tables, one row per store."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from mdl_jax.pipeline.stores import Store
from mdl_jax.signals.aggregation import memory_signals
from mdl_jax.signals.risk import risk


def compute_signals(stores: Sequence[Store], embedder, *, progress: bool = False,
                    batch: int = 4096) -> "pandas.DataFrame":  # noqa: F821
    """The signals table for ``stores``: one row per store.

    Columns: dataset, qid, category, question, M, R, A, phi, n_relevant, n_records.
    Every unique text (questions and records) is embedded once through ``embedder`` (cached).
    """
    import pandas as pd

    if not stores:
        raise ValueError("stores: expected at least one store")
    sig = memory_signals([s.item.question for s in stores], [s.texts for s in stores], embedder,
                         batch=batch, progress=progress)
    rows = []
    for j, s in enumerate(stores):
        it = s.item
        rows.append(dict(dataset=it.dataset, qid=it.qid, category=it.category,
                         question=it.question, M=float(sig["M"][j]), R=float(sig["R"][j]),
                         A=risk(it.dataset, it.question, it.category), phi=float(sig["phi"][j]),
                         n_relevant=int(sig["n_relevant"][j]), n_records=len(s.records)))
    return pd.DataFrame(rows)


def signal_arrays(table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, R, A) float32 arrays from a signals table, ready for ``mdl_jax.decide``."""
    return tuple(table[c].to_numpy(np.float32) for c in ("M", "R", "A"))


def save_table(table, path: str | Path) -> Path:
    """Write the table as Parquet atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    table.to_parquet(tmp, index=False)
    tmp.replace(path)
    return path
