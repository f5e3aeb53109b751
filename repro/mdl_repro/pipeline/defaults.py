"""Where the controller's deployed defaults come from (paper Section 3.4), recomputable from the data.

The paper takes n_min and n_max from the calibration split: the minimum and maximum of the raw norm
‖v_meta‖ over the calibration questions. ``deployed_norm_range`` does exactly that for the TruthfulQA
calibration split (80 questions, split seed 0, the stores and signals of ``mdl-jax reproduce``) under
the paper's Table 2 settings; no LLM is needed, because the raw norm depends on the signals only.
``MDLConfig``'s defaults are these two numbers, pinned by tests/test_stores.py, which recomputes them.
"""

from __future__ import annotations

import numpy as np

from mdl_repro.pipeline import ENGINE

CALIBRATION_QUESTIONS = 80
SPLIT_SEED = 0


def calibration_signals(dataset: str = "truthfulqa", *, data_dir=None, cache_dir=None,
                        n_calibration: int = CALIBRATION_QUESTIONS, seed: int = SPLIT_SEED, embedder=None):
    """(M, R, A) float32 arrays of a dataset's calibration split, as ``reproduce`` computes them."""
    from mdl_jax.signals.embeddings import Embedder
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.store_signals import compute_signals, signal_arrays
    from mdl_repro.pipeline.stores import StoreConfig, build_stores, split_calibration

    items = load(dataset, data_dir)
    cal, _ = split_calibration(items, min(n_calibration, len(items) // 2), seed)
    by_qid = {s.item.qid: s for s in build_stores(items, StoreConfig(seed=seed))}
    emb = embedder if embedder is not None else Embedder(cache_dir=cache_dir)
    return signal_arrays(compute_signals([by_qid[it.qid] for it in cal], emb))


def deployed_norm_range(**kw) -> tuple[float, float]:
    """(n_min, n_max): min and max of ‖v_meta‖ over the TruthfulQA calibration split, Table 2 settings."""
    from mdl_jax import MDLConfig, decide

    M, R, A = calibration_signals("truthfulqa", **kw)
    norm = np.asarray(decide(M, R, A, MDLConfig(), engine=ENGINE).norm, np.float64)
    return float(norm.min()), float(norm.max())


if __name__ == "__main__":
    print(deployed_norm_range())
