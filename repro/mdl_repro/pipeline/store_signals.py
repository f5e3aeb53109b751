"""The signals table of the pipeline's memory stores: M, R, φ from ``mdl_jax.signals`` (the same code
the memory gate runs), A from the datasets' risk tables, one row per store."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mdl_jax.signals.aggregation import memory_signals
from mdl_jax.signals.risk import risk
from mdl_repro.pipeline.stores import Store

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas


def compute_signals(stores: Sequence[Store], embedder, *, progress: bool = False,
                    batch: int = 4096) -> pandas.DataFrame:
    """The signals table for ``stores``: one row per store.

    Columns: dataset, qid, category, question, M, R, A, phi, n_relevant, n_records.
    Every unique text (questions and records) is embedded once through ``embedder`` (cached).
    """
    import pandas as pd

    if not stores:
        raise ValueError("stores: expected at least one store")
    sig = memory_signals([s.item.question for s in stores], [s.texts for s in stores], embedder,
                         batch=batch, progress=progress,
                         engine="auto")  # the small-store path the committed runs were computed on: same bits
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
    """Write the table as Parquet, whole or not at all (``mdl_jax._io.atomic_open``).

    Raises:
        OutputError: the file cannot be written (a full disk, ...); a file already there is untouched.
    """
    from mdl_jax._io import atomic_open

    path = Path(path)
    with atomic_open(path, "wb") as f:
        table.to_parquet(f, index=False)
    return path


def build_signal_table(datasets, *, data_dir=None, limit=None, model="all-MiniLM-L6-v2",
                       cache_dir=None, seed=0, n_calibration=80, progress=True):
    """Stores + signals for each dataset, with a ``split`` column (calibration / evaluation)."""
    import pandas as pd

    from mdl_jax.signals.embeddings import Embedder
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.store_signals import compute_signals
    from mdl_repro.pipeline.stores import StoreConfig, build_stores, split_calibration

    emb = Embedder(model, cache_dir=cache_dir, progress=progress)
    tables, all_stores = [], {}
    for ds in datasets:
        items = load(ds, data_dir, limit=limit)
        n_cal = min(n_calibration, len(items) // 2)
        cal, _ = split_calibration(items, n_cal, seed)
        cal_ids = {it.qid for it in cal}
        stores = build_stores(items, StoreConfig(seed=seed))
        t = compute_signals(stores, emb, progress=progress)
        t["split"] = ["calibration" if q in cal_ids else "evaluation" for q in t["qid"]]
        tables.append(t)
        all_stores[ds] = stores
    return pd.concat(tables, ignore_index=True), all_stores, emb
