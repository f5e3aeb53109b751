"""The signal wing: from a query and its memory texts to M, R, φ and A (paper Section 3.2).

  embeddings.py    sentence embeddings (the bundled MiniLM or any sentence-transformers model) with an
                   on-disk cache; torch is imported only when a text is actually embedded
                   (its pieces: embedding_models.py, embedding_cache.py)
  onnx_encoder.py  the same model through ONNX Runtime or OpenVINO (its pieces: model_folder.py,
                   onnx_export.py, onnx_runtimes.py)
  conflict.py      φ's pairwise lexical stance-conflict detector
  risk.py          A: the TruthfulQA category table and the HaluEval keyword preset (whole words)
  jax_pass.py      the definition of M, R, φ: padded stores in one batched JAX pass
  aggregation.py   ``memory_signals``: texts to M, R, φ on the engine asked for (the JAX pass by
                   default; the small-store path with its C++ helpers, conflict_native.py and
                   dots_native.py, under "native" and "auto")

Both the benchmark pipeline (``mdl_repro.pipeline``) and the memory gate (``mdl_jax.gate``) import this
wing; it imports the controller's package only, never the pipeline, the gate or the integrations.
"""

from mdl_jax.signals.aggregation import RELEVANCE_THRESHOLD, aggregate, aggregate_one, memory_signals, store_arrays
from mdl_jax.signals.conflict import pair_flags, stance_conflict
from mdl_jax.signals.embeddings import Embedder
from mdl_jax.signals.risk import HIGH_RISK, halueval_risk, truthfulqa_risk

__all__ = [
    "Embedder", "HIGH_RISK", "RELEVANCE_THRESHOLD", "aggregate", "aggregate_one", "halueval_risk",
    "memory_signals", "pair_flags", "stance_conflict", "store_arrays", "truthfulqa_risk",
]
